"""The train stage under torchrun with 2 ranks on CPU: a Parquet part per rank, equal weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from test_train_stage import write_params

ROOT = Path(__file__).resolve().parents[1]


def test_train_stage_on_two_ranks(tmp_path, tiny_model_dir):
    params = write_params(tmp_path, tiny_model_dir, iterations=2)
    out = tmp_path / "train"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "components/train.py", "--params", params, "--model-dir", tiny_model_dir,
           "--critic-dir", tiny_model_dir, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for i in range(2):
        parts = sorted((out / f"trajectories/iteration={i:04d}").glob("part-*.parquet"))
        assert [p.name for p in parts] == ["part-00.parquet", "part-01.parquet"]
        slots = [set(pd.read_parquet(p)["env_index"]) for p in parts]
        assert slots == [{0, 1}, {2, 3}]  # each rank steps its own env slots
    ckpt = out / "checkpoints/iteration=0001"
    digests = [(ckpt / f"weights_digest_rank{r}.txt").read_text() for r in range(2)]
    assert digests[0] == digests[1]
    # Rollout metrics count both ranks' turns (2 slots x turns_per_env each).
    turns = pd.read_csv(out / "live/plots/metrics/train/turns.tsv", sep="\t")["turns"].tolist()
    rows = [sum(len(pd.read_parquet(p)) for p in
                (out / f"trajectories/iteration={i:04d}").glob("part-*.parquet")) for i in range(2)]
    assert turns == rows
