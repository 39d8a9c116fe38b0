"""Two data-parallel ranks (torchrun, gloo, ZeRO-2) with different rows end one update with
identical actor and critic parameters, and both report the same rank-averaged metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from longturn.distributed import free_port

SCRIPT = Path(__file__).with_name("two_rank_update.py")
ROOT = Path(__file__).resolve().parents[1]


def test_two_ranks_end_with_identical_parameters(tiny_model_dir: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # this pytest process may have set them for its own trainer
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(SCRIPT), tiny_model_dir, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["before"] == ranks[1]["before"]
    assert ranks[0]["after"] == ranks[1]["after"] != ranks[0]["before"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    assert ranks[0]["metrics"]["n_turns"] == 6  # each rank trained on its own 6 turns
    assert (tmp_path / "actor" / "config.json").is_file()  # exported once, by rank 0
