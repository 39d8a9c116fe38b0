"""Helper for the trainer tests: synthetic turn rows, and (run as a script under torchrun) one PPO
update per rank on that rank's own rows (as samples of one reply, docs/design.md §4), ending with
a hash of the rank's parameters.

    python -m torch.distributed.run --nproc_per_node 2 tests/two_rank_update.py MODEL_DIR OUT_DIR \
        [ZERO_STAGE] [MINI_BATCH_SIZE]

Rank r trains on ``rank_rows(r)``; advantages are not whitened, so a single process given every
rank's rows in one mini-batch must compute the same gradient (tests/test_two_ranks.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ACTION_TEXT = " THINK: go on. ACTION: forward"


def make_rows(seed: int, tokenizer: Any, n_slots: int = 2, n_steps: int = 3,
              iteration: int = 0, first_slot: int = 0) -> list[dict[str, Any]]:
    """n_slots × n_steps lock-step turn rows like the collector's: random prompts, responses
    with a THINK/ACTION tail, random rewards, some terminations, bootstrap prompts at the end."""
    rng = np.random.default_rng(seed)
    tail = tokenizer.encode(ACTION_TEXT, add_special_tokens=False)
    episode = {slot: 0 for slot in range(n_slots)}
    rows = []
    for step in range(n_steps):
        for slot in range(n_slots):
            last = step == n_steps - 1
            terminated = bool(rng.random() < 0.3)
            row = {
                "iteration": iteration, "env_index": first_slot + slot, "step": step, "turn": step,
                "episode_id": f"s{seed}-e{slot}-{episode[slot]}", "episode_seed": seed,
                "prompt_ids": rng.integers(10, 2000, size=int(rng.integers(3, 9))).tolist(),
                "response_ids": rng.integers(10, 2000, size=int(rng.integers(1, 4))).tolist() + tail,
                "reward": float(rng.normal()), "terminated": terminated, "truncated": False,
                "segment_end": last, "aborted": False,
            }
            if last and not terminated:
                row["bootstrap_prompt_ids"] = rng.integers(10, 2000, size=5).tolist()
            if terminated:
                episode[slot] += 1
            rows.append(row)
    return rows


RANK_SLOTS = 3


def rank_rows(rank: int, tokenizer: Any) -> list[dict[str, Any]]:
    """Rank `rank`'s 6 turns: its own seed and env slots, as the collector assigns them (seeds
    100 and 102 give the two ranks different numbers of response tokens)."""
    return make_rows(100 + 2 * rank, tokenizer, n_slots=RANK_SLOTS, n_steps=2,
                     first_slot=RANK_SLOTS * rank)


def settings(zero_stage: int = 2, mini_batch_size: int = 4) -> Any:
    from trainer_settings import make_settings

    return make_settings(actor_lr=1e-3, critic_lr=1e-3, mini_batch_size=mini_batch_size,
                         micro_batch_size=2, zero_stage=zero_stage, temperature=0.7, seed=3,
                         whiten_advantages=False)


def main(model_dir: str, out_dir: str, zero_stage: int = 2, mini_batch_size: int = 4) -> None:
    from transformers import AutoTokenizer

    from longturn.algo.gae import GAEParams
    from longturn.algo.trainer import PPOTrainer
    from turn_rows import samples_from_turns
    from longturn.trajectories import write_samples

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = PPOTrainer(model_dir, model_dir, settings(zero_stage, mini_batch_size),
                         GAEParams(0.99, 0.95), tokenizer)
    out = Path(out_dir)
    before = trainer.weights_digest()
    samples = trainer.score(samples_from_turns(rank_rows(trainer.rank, tokenizer)))
    part = write_samples(samples, out / f"part-{trainer.rank}.parquet")
    metrics = trainer.update([str(part)])
    after = trainer.weights_digest()
    trainer.export_actor(out / "actor")  # rank 0 writes; collective under ZeRO-3
    result = {"rank": trainer.rank, "world_size": trainer.world_size, "before": before,
              "after": after, "metrics": metrics}
    (out / f"rank{trainer.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:5]))
