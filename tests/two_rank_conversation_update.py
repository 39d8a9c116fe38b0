"""Helper for tests/test_conversation_two_ranks.py: conversations per rank where rank 0 holds one
that produced no reply, and (run as a script under torchrun) one PPO update per rank on them
as packed samples (docs/design.md §4).

    python -m torch.distributed.run --nproc_per_node 2 tests/two_rank_conversation_update.py \
        MODEL_DIR OUT_DIR

Each rank writes rank{R}.json: its parameters' digest before and after, and the update's metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def episode(rng: np.random.Generator, episode_id: str, replies: int) -> dict[str, Any]:
    """An episode as the conversation rollout records it: context, then `replies` replies each
    followed by context; with 0 replies its first messages alone filled the token budget."""
    ids, mask, starts, ends = [], [], [], []
    for _ in range(replies):
        ids += rng.integers(10, 2000, size=4).tolist()
        mask += [0] * 4
        starts.append(len(ids))
        ids += rng.integers(10, 2000, size=3).tolist()
        mask += [1] * 3
        ends.append(len(ids))
    ids += rng.integers(10, 2000, size=6 if replies else 12).tolist()
    mask += [0] * (len(ids) - len(mask))
    return {"episode_id": episode_id, "task": "t", "episode_seed": 0, "input_ids": ids,
            "loss_mask": mask, "engine_logprobs": [0.0] * len(ids), "segment_starts": starts,
            "segment_ends": ends, "segment_rewards": rng.normal(size=replies).tolist(),
            "termination": "done" if replies else "token_budget", "truncated": not replies,
            "assistant_turns": replies, "messages": "[]", "metrics": "{}"}


def rank_records(rank: int) -> list[dict[str, Any]]:
    """Two episodes on rank 0, the second with no reply; three on rank 1 (episodes end when they
    end, so ranks hold different numbers of samples)."""
    rng = np.random.default_rng(60 + rank)
    if rank == 0:
        return [episode(rng, "r0-e0", 2), episode(rng, "r0-e1", 0)]
    return [episode(rng, "r1-e0", 2), episode(rng, "r1-e1", 1), episode(rng, "r1-e2", 1)]


def main(model_dir: str, out_dir: str) -> None:
    from transformers import AutoTokenizer

    from longturn.algo.gae import GAEParams
    from longturn.algo.trainer import PPOTrainer
    from longturn.rollout.samples import samples_from_episodes
    from longturn.trajectories import write_samples
    from trainer_settings import make_settings

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = make_settings(actor_lr=1e-3, critic_lr=1e-3, mini_batch_size=2,
                             micro_batch_size=1, zero_stage=2, seed=3)
    trainer = PPOTrainer(model_dir, model_dir, settings, GAEParams(0.99, 0.95), tokenizer)
    out = Path(out_dir)
    before = trainer.weights_digest()
    samples = trainer.score(samples_from_episodes(rank_records(trainer.rank)))
    part = write_samples(samples, out / f"part-{trainer.rank}.parquet")
    metrics = trainer.update([str(part)])
    result = {"rank": trainer.rank, "before": before, "after": trainer.weights_digest(),
              "metrics": metrics}
    (out / f"rank{trainer.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
