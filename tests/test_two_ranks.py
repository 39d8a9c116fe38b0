"""Two data-parallel ranks (torchrun, gloo, ZeRO-2) with different rows end one update with
identical actor and critic parameters, and both report the same rank-averaged metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port
from two_rank_update import rank_rows, settings

SCRIPT = Path(__file__).with_name("two_rank_update.py")
ROOT = Path(__file__).resolve().parents[1]


def _run_two_ranks(model_dir: str, out: Path, *args: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # this pytest process may have set them for its own trainer
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(SCRIPT), model_dir, str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_ranks_end_with_identical_parameters(tiny_model_dir: str, tmp_path: Path) -> None:
    ranks = _run_two_ranks(tiny_model_dir, tmp_path)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["before"] == ranks[1]["before"]
    assert ranks[0]["after"] == ranks[1]["after"] != ranks[0]["before"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    assert ranks[0]["metrics"]["n_turns"] == 6  # each rank trained on its own 6 turns
    assert (tmp_path / "actor" / "config.json").is_file()  # exported once, by rank 0


def test_two_ranks_train_on_the_global_token_mean(tiny_model_dir: str, tmp_path: Path) -> None:
    """One step over both ranks' turns (their response lengths differ) has the gradient of the
    token mean over all of them: the same grad norms and losses as one process given every row."""
    from transformers import AutoTokenizer

    from longturn.algo.gae import GAEParams
    from longturn.algo.trainer import PPOTrainer
    from turn_rows import samples_from_turns
    from longturn.trajectories import write_samples

    ranks = _run_two_ranks(tiny_model_dir, tmp_path / "ranks", "2", "6")  # one step per rank
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokens = [sum(len(r["response_ids"]) for r in rank_rows(k, tokenizer)) for k in (0, 1)]
    assert tokens[0] != tokens[1]  # a mean of per-rank means would weigh tokens unequally
    trainer = PPOTrainer(tiny_model_dir, tiny_model_dir, settings(2, 12), GAEParams(0.99, 0.95),
                         tokenizer)
    samples = trainer.score(samples_from_turns(rank_rows(0, tokenizer) + rank_rows(1, tokenizer)))
    single = trainer.update([str(write_samples(samples, tmp_path / "all.parquet"))])
    assert single["n_turns"] == 12
    for key in ("grad_norm_actor", "grad_norm_critic", "policy_loss", "value_loss"):
        assert ranks[0]["metrics"][key] == pytest.approx(single[key], rel=1e-4, abs=1e-7), key
