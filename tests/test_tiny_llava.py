"""`bench/tiny_model.py --llava` (docs/image-observations.md, "Try it at toy size") reuses a tiny
LLaVA it built and never overwrites another model: the tiny text model and the tiny LLaVA refuse
each other's directories. Runs in process on the builder the vision tests use (fast tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlm_fixtures import TOKENS_PER_IMAGE, build_tiny_llava
from tiny_model import TinyModelError, ensure_tiny_model  # bench/, on sys.path via vlm_fixtures


@pytest.fixture(scope="module")
def llava_dir(smollm2_tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(smollm2_tokenizer_dir, tmp_path_factory.mktemp("tiny_llava") / "m")


def test_a_tiny_llava_is_reused_not_rebuilt(llava_dir: Path):
    config = json.loads((llava_dir / "config.json").read_text())
    assert config["model_type"] == "llava" and config["image_seq_length"] == TOKENS_PER_IMAGE
    assert (llava_dir / "preprocessor_config.json").is_file()
    before = (llava_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(llava_dir, llava=True) == str(llava_dir)
    assert (llava_dir / "model.safetensors").stat().st_mtime_ns == before


def test_the_text_and_vision_tiny_models_refuse_each_others_dirs(llava_dir: Path,
                                                                  tiny_model_dir: str):
    with pytest.raises(TinyModelError, match="not the tiny LLaVA"):
        ensure_tiny_model(Path(tiny_model_dir), llava=True)
    with pytest.raises(TinyModelError, match="not the tiny one"):
        ensure_tiny_model(llava_dir)
