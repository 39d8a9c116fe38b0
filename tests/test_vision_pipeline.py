"""Profile `vision` through the real `dvc exp run` of all seven stages, on a tiny random LLaVA
built from a config (no real vision-language model ships): the base stage splits it, every stage
plays BabyAI with frames, training writes packed samples holding the frames it trained on."""

from __future__ import annotations

import json

import pandas as pd

from longturn.algo.sample_scoring import audit_samples_file
from longturn.vision.frames import from_png
from test_pipeline_smoke import STAGES, _dvc, scratch_repo
from test_conversation_pipeline import toy_sequence_params
from vlm_fixtures import TOKENS_PER_IMAGE, build_tiny_llava


def toy_vision_params(llava_dir: str) -> dict:
    params = toy_sequence_params(llava_dir, "vision")
    params["rollout"]["chat"].update(max_assistant_turns=2, max_user_turns=2, max_tokens=1200)
    return params


def test_dvc_exp_run_of_the_vision_profile(tmp_path, smollm2_tokenizer_dir):
    llava = build_tiny_llava(smollm2_tokenizer_dir, tmp_path / "llava")
    repo = scratch_repo(tmp_path, toy_vision_params(str(llava)))
    out = _dvc(repo, "exp", "run", "-n", "vision")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    assert (repo / "data/models/base/vision/config.json").is_file()
    # the validation report folds each frame's placeholder run
    assert f"<image ×{TOKENS_PER_IMAGE}>" in (repo / "data/validation/report.md").read_text()
    for side in ("zero_shot", "final"):
        metrics = json.loads((repo / f"data/eval/{side}/metrics.json").read_text())
        assert set(metrics["tasks"]) == {"babyai_goto_frames"}
        assert metrics["overall"]["episodes"] == 2
        # frames counted by image_starts: the evaluation does not copy their bytes to Python
        frames = pd.read_parquet(repo / f"data/eval/{side}/turns.parquet")["images"].map(len)
        assert frames.sum() >= 2 and metrics["overall"]["images_per_episode"] == frames.sum() / 2
    part = repo / "data/train/trajectories/iteration=0000/part-00.parquet"
    assert audit_samples_file(part) < 1e-4
    for row in pd.read_parquet(part).itertuples():
        assert len(row.images) == len(row.image_starts) >= 1
        assert from_png(row.images[0]).shape == (112, 112, 3)
        # image_starts index prompt_ids + response_ids; the prompt is context (loss mask 0)
        mask = [0] * len(row.prompt_ids) + list(row.loss_mask)
        for start in row.image_starts:
            assert start + TOKENS_PER_IMAGE <= len(mask)
            assert not any(mask[start:start + TOKENS_PER_IMAGE])
    assert (repo / "data/train/final/vision/config.json").is_file()
    assert "babyai_goto_frames" in (repo / "data/report/report.md").read_text()
