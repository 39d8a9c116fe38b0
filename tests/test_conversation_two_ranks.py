"""The chat protocol on two ranks: an episode that produced no reply stays in its rank's batch as a
fully masked sample, and a rank with fewer samples is padded with fully masked rows
(`TurnBatch.padded_to`), so both ranks run the same schedule and the distributed update runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from longturn.algo.batches import read_sample_batch
from longturn.rollout.samples import samples_from_episodes
from longturn.trajectories import write_samples
from conftest import free_port
from two_rank_conversation_update import rank_records

SCRIPT = Path(__file__).with_name("two_rank_conversation_update.py")
ROOT = Path(__file__).resolve().parents[1]


def scored(samples: list[dict]) -> list[dict]:
    """Training columns as zeros: enough for the batch reader."""
    for s in samples:
        zeros = [0.0] * len(s["response_ids"])
        s.update(old_logprobs=zeros, ref_logprobs=zeros, values=zeros, advantages=zeros,
                 returns=zeros)
    return samples


def test_an_episode_without_a_reply_is_a_fully_masked_row(tmp_path):
    records = rank_records(0)
    samples = scored(samples_from_episodes(records))
    batch = read_sample_batch([write_samples(samples, tmp_path / "part.parquet")])
    assert len(batch) == len(records) == 2
    padded = batch.padded_to(5)
    assert len(padded) == 5 and padded.aborted[2:].all() and padded.n_tokens(range(5)) == \
        batch.n_tokens(range(2))
    assert padded.select([0, 4]).mask[1].sum() == 0 and batch.padded_to(1) is batch
    no_reply = records[1]["input_ids"]
    assert batch.prompt_ids[1] + batch.response_ids[1] == no_reply
    assert batch.aborted[1] and not batch.loss_tokens(1).any() and batch.n_tokens([1]) == 0
    assert batch.n_tokens([0]) == sum(records[0]["loss_mask"])
    assert np.isfinite(np.concatenate(batch.whitened)).all()


def test_two_ranks_update_with_an_episode_without_a_reply_and_unequal_sample_counts(tiny_model_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                           os.environ.get("PYTHONPATH", "")]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # this pytest process may have set them for its own trainer
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(SCRIPT), tiny_model_dir, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["after"] == ranks[1]["after"] != ranks[0]["before"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    # the trained tokens are the replies' alone: rank 0's 6, rank 1's 12, averaged over ranks;
    # the rows that pad rank 0 to 3 count nowhere
    assert ranks[0]["metrics"]["n_tokens"] == (6 + 12) / 2
    assert ranks[0]["metrics"]["n_turns"] == (2 + 3) / 2
