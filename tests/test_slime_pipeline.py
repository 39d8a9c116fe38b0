"""Profile `slime` (examples/slime_calculator_generate.py) through the real `dvc exp run` of all
seven stages at toy size: the written samples are the example's own Samples, their trained
tokens exactly what the engine generated, the turns it inserted out of the loss."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from longturn.algo.sample_scoring import audit_samples_file
from test_conversation_pipeline import toy_sequence_params
from test_pipeline_smoke import ROOT, STAGES, _dvc, _git, scratch_repo


def test_dvc_exp_run_of_the_slime_profile(tmp_path, tiny_model_dir):
    params = toy_sequence_params(tiny_model_dir, "slime")
    params["rollout"]["slime_generate"] = "slime_example_recorder:generate"
    repo = scratch_repo(tmp_path, params)
    shutil.copy(ROOT / "tests" / "slime_example_recorder.py", repo)
    _git(repo, "add", "slime_example_recorder.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "recorder")
    out = _dvc(repo, "exp", "run", "-n", "slime")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    lines = (repo / "slime_generated.jsonl").read_text().splitlines()
    played = [json.loads(line) for line in lines]
    by_tokens = {tuple(p["tokens"]): p for p in played}
    part = repo / "data/train/trajectories/iteration=0000/part-00.parquet"
    samples = pd.read_parquet(part)
    assert len(samples) == 2 and audit_samples_file(part) < 1e-4
    for row in samples.itertuples():
        sample = by_tokens[tuple(row.prompt_ids) + tuple(row.response_ids)]
        assert list(row.loss_mask) == sample["loss_mask"]  # the example's own mask
        assert len(row.response_ids) == sample["response_length"]
        trained = [[int(t) for t in row.response_ids[r["start"]:r["end"]]] for r in row.replies]
        assert trained == [ids for ids in sample["outputs"] if ids]  # the engine's, call by call
        assert len(trained) >= 2 and 0 in row.loss_mask  # turns inserted between the replies
    metrics = json.loads((repo / "data/eval/final/metrics.json").read_text())
    assert metrics["overall"]["episodes"] == 2
