"""The chat protocol through the train loop on a tiny random model: episodes scored, written as
packed samples (one row per episode holding all its replies), audited, and trained on with GAE (a
critic) and with GRPO (groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from longturn.algo.sample_scoring import audit_samples_file
from longturn.params.config import parse_params
from longturn.tasks.arithmetic import DEMONSTRATION
from longturn.run.training import run_training
from longturn.trajectories import read_metadata
from test_training import paths

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_REPLIES = sum(m["role"] == "assistant" for m in DEMONSTRATION)


def sequence_params(model_dir: str, advantage: str = "gae", iterations: int = 2):
    return parse_params({
        "seed": 5,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": {"name": "arithmetic", "tasks": ["arithmetic"], "workers": False,
                "step_timeout_s": None},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 12, "temperature": 1.0}},
        "rollout": {"protocol": "chat", "context": "episode", "n_envs": 4, "chat": {
            "tools": str(ROOT / "configs/calculator_tools.yaml"),
            "interactions": str(ROOT / "configs/revision_interactions.yaml"),
            "max_assistant_turns": 3, "max_tokens": 600}},
        "algo": {"advantage": advantage, "group_size": 2},
        "ppo": {"mini_batch_size": 2, "micro_batch_size": 1, "bf16": False, "lora": True,
                "actor_lr": 1e-3, "critic_lr": 1e-3},
        "train": {"iterations": iterations, "checkpoint_every": 1, "keep_checkpoints": 1},
    })


@pytest.mark.parametrize("advantage", ["gae", "grpo"])
def test_conversation_training_writes_audited_episodes(tmp_path, tiny_model_dir, advantage):
    history = run_training(sequence_params(tiny_model_dir, advantage), paths(tmp_path, tiny_model_dir),
                           progress=False)
    assert len(history) == 2
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for it in range(2):
        part = tmp_path / "trajectories" / f"iteration={it:04d}" / "part-00.parquet"
        assert read_metadata(part)["schema_version"] == "2"
        frame = pd.read_parquet(part)
        assert len(frame) == 4
        # packed samples: a whole episode per row, no env slot, its conversation kept
        assert frame["env_index"].isna().all() and frame["messages"].notna().all()
        for row in frame.itertuples():
            n = len(row.response_ids)
            for column in ("loss_mask", "old_logprobs", "advantages", "returns", "token_rewards"):
                assert len(getattr(row, column)) == n, column
            # the prompt is the context before the first reply, which starts the response
            assert row.replies[0]["start"] == 0 and len(row.prompt_ids) > 0
            # the loss mask covers exactly the sampled replies
            sampled = [t for t, m in zip(row.response_ids, row.loss_mask) if m]
            replies = [t for r in row.replies for t in row.response_ids[r["start"]:r["end"]]]
            assert sampled == replies and sampled
            assert all(a == 0 for a, m in zip(row.advantages, row.loss_mask) if not m)
            assistant = [m["content"] for m in json.loads(row.messages) if m["role"] == "assistant"]
            # the worked example's replies come first, then the model's
            assert len(assistant) - EXAMPLE_REPLIES == row.assistant_turns == len(row.replies)
            assert [r["turn"] for r in row.replies] == list(range(len(row.replies)))
            # how the episode ended is on its last reply only
            *before, last = row.replies
            assert last["termination"] in ("done", "max_assistant_turns", "max_user_turns",
                                           "token_budget")
            assert all(r["termination"] is None for r in before)
            first = row.replies[0]
            assert tokenizer.decode(row.response_ids[first["start"]:first["end"]])
        assert audit_samples_file(part) < 1e-4
        # the update trained on the sampled tokens only: context inside the response is out
        assert history[it]["n_tokens"] == sum(sum(m) for m in frame["loss_mask"])
        if advantage == "grpo":
            assert frame["values"].isna().all() and frame["group_id"].nunique() == 2
        else:
            assert frame["values"].notna().all()
    if advantage == "gae":  # asked for one more iteration, the run continues where it stopped
        longer = run_training(sequence_params(tiny_model_dir, advantage, iterations=3),
                              paths(tmp_path, tiny_model_dir), progress=False)
        assert len(longer) == 3
        assert json.dumps(longer[:2], sort_keys=True) == json.dumps(history, sort_keys=True)
        assert len(list((tmp_path / "trajectories").glob("iteration=*"))) == 3
    for metrics in history:
        assert metrics["episodes_ended"] == 4 and "termination/done" in metrics
        assert metrics["turns"] == pytest.approx(4 * metrics["episode_length"])
        assert metrics["lr_actor"] > 0 and metrics["n_tokens"] > 0
    assert (tmp_path / "final/config.json").is_file()
