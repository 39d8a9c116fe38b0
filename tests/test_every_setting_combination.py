"""Any context works with any protocol and any estimator: each of the 12 combinations of
`rollout.protocol` × `rollout.context` × `algo.advantage` trains two iterations at toy size and
writes samples every reader takes (the audit's recomputation, every audit subcommand).

Why all of them: each setting is read in one place, so a combination nobody runs can only break
where two of them meet (a collection the estimator picks for a rollout that cannot give it, a
sample shape a reader does not expect). Written out here rather than asked of the code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from longturn.algo.sample_scoring import audit_samples_file
from longturn.audit.cli import main as audit_main
from longturn.params.config import parse_params
from longturn.run.training import run_training
from longturn.tasks.arithmetic import DEMONSTRATION
from longturn.trajectories import SCHEMA_VERSION, read_metadata
from test_training import paths

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 2
N_ENVS, TURNS_PER_ENV, GROUP = 4, 3, 2
MAX_ASSISTANT_TURNS = 3
EXAMPLE_REPLIES = sum(m["role"] == "assistant" for m in DEMONSTRATION)  # the worked example's


def combination_params(model_dir: str, protocol: str, context: str, advantage: str):
    chat = protocol == "chat"
    return parse_params({
        "seed": 5,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": ({"name": "arithmetic", "tasks": ["arithmetic"]} if chat
                else {"tasks": ["goto"], "max_turns": 4}) | {"workers": False,
                                                             "step_timeout_s": None},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 12, "temperature": 1.0}},
        "rollout": {"protocol": protocol, "context": context, "n_envs": N_ENVS,
                    "turns_per_env": TURNS_PER_ENV,
                    "chat": {"tools": str(ROOT / "configs/calculator_tools.yaml"),
                             "interactions": str(ROOT / "configs/revision_interactions.yaml"),
                             "max_assistant_turns": MAX_ASSISTANT_TURNS,
                             "max_tokens": 600} if chat else {}},
        "algo": {"advantage": advantage, "group_size": GROUP},
        "ppo": {"mini_batch_size": 2, "micro_batch_size": 1, "bf16": False, "lora": True},
        "train": {"iterations": ITERATIONS, "checkpoint_every": 1, "keep_checkpoints": 1},
    })


def _check_sample(row, packed: bool) -> None:
    """One sample's token lists agree with its replies: the loss mask is exactly the replies'
    spans, and nothing off the mask has an advantage."""
    n = len(row.response_ids)
    assert len(row.loss_mask) == n
    for column in ("old_logprobs", "ref_logprobs", "token_rewards", "advantages", "returns"):
        assert len(getattr(row, column)) == n, column
    spans = [(int(r["start"]), int(r["end"])) for r in row.replies]
    assert spans and all(0 <= s < e <= n for s, e in spans)
    masked = {i for i, m in enumerate(row.loss_mask) if m}
    assert masked == {i for s, e in spans for i in range(s, e)}
    assert all(a == 0 for i, a in enumerate(row.advantages) if i not in masked)
    if not packed:
        assert len(row.replies) == 1 and spans == [(0, n)]
        return
    # a whole conversation: the context before its first reply is the prompt; the worked
    # example's replies come first in its messages, then the model's; how it ended is on its
    # last reply only
    assert spans[0][0] == 0 and len(row.prompt_ids) > 0 and pd.isna(row.env_index)
    assistant = [m for m in json.loads(row.messages) if m["role"] == "assistant"]
    assert len(assistant) - EXAMPLE_REPLIES == row.assistant_turns == len(row.replies)
    assert [r["turn"] for r in row.replies] == list(range(len(row.replies)))
    *before, last = row.replies
    assert last["termination"] in ("done", "max_assistant_turns", "max_user_turns",
                                   "token_budget")
    assert all(r["termination"] is None for r in before)


@pytest.mark.parametrize("advantage", ["gae", "grpo", "gigpo"])
@pytest.mark.parametrize("context", ["window", "episode"])
@pytest.mark.parametrize("protocol", ["action", "chat"])
def test_the_combination_trains_and_its_samples_read_everywhere(tmp_path, tiny_model_dir,
                                                                 protocol, context, advantage,
                                                                 capsys):
    params = combination_params(tiny_model_dir, protocol, context, advantage)
    history = run_training(params, paths(tmp_path, tiny_model_dir), progress=False)
    assert len(history) == ITERATIONS

    critic = params.algo.estimator.has_critic
    # what the written samples must look like, written out from the settings
    packed = protocol == "chat" and context == "episode"  # a whole conversation per sample
    fixed_turns = critic and not packed  # Verlog's fixed-turn batches, episodes continue
    files = sorted((tmp_path / "trajectories").glob("iteration=*/part-*.parquet"))
    assert len(files) == ITERATIONS
    shown: list[tuple[int, int]] = []  # action protocol: (turn, "Observation:" lines it was given)
    for it, part in enumerate(files):
        meta = read_metadata(part)
        assert meta["schema_version"] == SCHEMA_VERSION
        assert json.loads(meta["algo"])["advantage"] == advantage
        frame = pd.read_parquet(part)
        if fixed_turns:  # exactly n_envs × turns_per_env replies, however long episodes are
            assert sum(len(r) for r in frame["replies"]) == N_ENVS * TURNS_PER_ENV
        else:  # every slot's episode played whole, ended on its last reply
            assert frame["episode_id"].nunique() == N_ENVS
            last = [r[-1] for _, g in frame.groupby("episode_id") for r in g["replies"][-1:]]
            assert all(r["termination"] is not None for r in last)
        if not critic:  # groups of GROUP episodes from one seed
            seeds = frame.groupby("group_id")["episode_seed"].nunique()
            assert len(seeds) == N_ENVS // GROUP and (seeds == 1).all()
        assert (frame["values"].notna() if critic else frame["values"].isna()).all()
        for row in frame.itertuples():
            _check_sample(row, packed)
        if packed:
            assert all(1 <= len(r) <= MAX_ASSISTANT_TURNS for r in frame["replies"])
        # the update trained on the sampled tokens only (context inside a response is out)
        sampled = sum(int(mask.astype(int).sum()) for mask in frame["loss_mask"])
        assert history[it]["n_tokens"] == sampled
        # the scored advantages and returns recompute from the file alone
        assert audit_samples_file(part) < 1e-4
        if protocol == "action":
            assert frame["env_name"].eq("babyai").all()
            actions = [r["action"] for replies in frame["replies"] for r in replies]
            assert all(isinstance(a, str) and a for a in actions)
            shown += [(replies[0]["turn"], text.count("\nObservation:"))
                      for replies, text in zip(frame["replies"], frame["prompt_text"])]
    if protocol == "action":  # what a reply was given: the last history_turns turns, or all
        base = {count for turn, count in shown if turn == 0}  # the worked example's own
        assert len(base) == 1 and max(turn for turn, _ in shown) > params.prompt.history_turns
        window = params.history_window
        assert all(count - min(base) == (turn if window is None else min(turn, window))
                   for turn, count in shown)

    # every audit subcommand reads the run (plain text and JSON)
    run = str(tmp_path / "trajectories")
    episode = pd.read_parquet(files[-1])["episode_id"].iloc[0]
    for argv in (["summary", run, "--json"], ["episodes", run, "--json"],
                 ["show", episode, run, "--no-prompt"], ["gae", run],
                 ["plot", run, "--out", str(tmp_path / "plots")], ["diff", run, run]):
        assert audit_main(argv) == 0, argv
    out = capsys.readouterr().out
    assert episode in out
    assert list((tmp_path / "plots").glob("*.png"))
