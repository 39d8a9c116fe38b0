"""The train stage resumes only its own checkpoints: DVC reruns `train` when the warm critic, the
base model or the tools file changed, and a resume from the old checkpoints would then hand back
the old run's actor as if it were trained anew. More `train.iterations` still continue the run,
and a copy of the same inputs elsewhere (new file times) still resumes."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from longturn.params.config import parse_params
from longturn.run import resume_key as keys
from longturn.run.training import TrainPaths, _guard_persisted


def model(root: Path, head: bytes) -> Path:
    """A model dir: a config, a big weight file (by size only) and a small value head."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "model.safetensors").write_bytes(b"w" * 4096)
    (root / "value_head.safetensors").write_bytes(head)
    return root


def params(iterations: int = 2, estimator: str = "gae", tools: str | None = None):
    p = {"train": {"iterations": iterations}, "algo": {"advantage": estimator}}
    if tools:
        p["rollout"] = {"protocol": "chat", "chat": {"tools": tools}}
    return parse_params(p)


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run whose checkpoints exist (one marker file), and a way to start the stage again."""
    monkeypatch.setattr(keys, "HASHED_UP_TO", 1024)  # the weight file counts as big
    paths = TrainPaths(base=model(tmp_path / "base", b"base"),
                       critic=model(tmp_path / "warm", b"head 1"),
                       trajectories=tmp_path / "trajectories",
                       checkpoints=tmp_path / "checkpoints", final=tmp_path / "final",
                       live=tmp_path / "live", policy=tmp_path / "policy")

    def start(p=None) -> bool:
        """Start the stage's guard; True when the checkpoints were kept."""
        _guard_persisted(p or params(), paths)
        kept = (paths.checkpoints / "iteration=0001").is_dir()
        (paths.checkpoints / "iteration=0001").mkdir(exist_ok=True)
        paths.trajectories.mkdir(exist_ok=True)
        return kept

    start()
    return paths, start


def test_the_same_inputs_resume_and_more_iterations_continue(run) -> None:
    paths, start = run
    assert start() and start(params(iterations=5))


def test_a_new_warm_critic_starts_over_and_says_why(run, caplog) -> None:
    paths, start = run
    (paths.critic / "value_head.safetensors").write_bytes(b"head 2")  # the warm-up ran again
    with caplog.at_level(logging.WARNING):
        assert not start()
    assert "critic changed since the checkpoints" in caplog.text
    assert not paths.trajectories.exists() or not any(paths.trajectories.iterdir())
    assert start()  # the new start is kept in its turn


def test_other_params_or_base_model_start_over(run, caplog) -> None:
    paths, start = run
    with caplog.at_level(logging.WARNING):
        assert not start(params(estimator="grpo"))  # no critic now, other params
    assert "params and critic changed" in caplog.text
    assert start(params(estimator="grpo"))
    (paths.base / "config.json").write_text('{"hidden_size": 16}')
    assert not start(params(estimator="grpo"))


def test_an_edited_tools_file_starts_over(tmp_path, run) -> None:
    paths, start = run
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools: []\n")
    assert not start(params(tools=str(tools)))  # other params
    assert start(params(tools=str(tools)))
    tools.write_text("tools: [] # edited\n")
    assert not start(params(tools=str(tools)))


def test_a_copy_with_new_times_is_the_same_model(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(keys, "HASHED_UP_TO", 1024)
    original = model(tmp_path / "a", b"head")
    copy = shutil.copytree(original, tmp_path / "b", copy_function=shutil.copyfile)
    assert keys.model_identity(original) == keys.model_identity(copy)
    (copy / "model.safetensors").write_bytes(b"v" * 4096)  # a big file: read by size only
    assert keys.model_identity(original) == keys.model_identity(copy)
    (copy / "model.safetensors").write_bytes(b"v" * 4097)
    assert keys.model_identity(original) != keys.model_identity(copy)


def test_a_stamp_of_the_params_alone_still_resumes(run) -> None:
    """Checkpoints stamped before the key had parts (the params digest alone) resume when the
    params match, and start over when they do not."""
    paths, start = run
    stamp = paths.checkpoints / "FINGERPRINT"
    stamp.write_text(keys.params_digest(params()) + "\n")
    assert start()
    stamp.write_text(keys.params_digest(params(estimator="grpo")) + "\n")
    assert not start()
