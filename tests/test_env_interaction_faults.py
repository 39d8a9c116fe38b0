"""An env played through the chat protocol (`tasks/env_frames.py`) fails as an env slot does: an
env that raises or hangs aborts its own episode (out of the loss, counted by its reason) while
the others play on, more than `max_retries` failures in a row stop the rollout with one line, and
envs (worker processes with `workers`) are reused by later episodes. Envs come from
`tests/flaky_envs.py`, which a worker process imports too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from longturn.envs.failures import EnvGaveUp
from longturn.params.config import parse_params
from longturn.rollout.collection import FixedTurnBatches, episode_seed
from longturn.rollout.conversation_player import conversation_episodes, conversation_fixed_turns
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.sample_metrics import sample_metrics
from longturn.rollout.samples import samples_from_episodes
from longturn.run.evaluation import conversation_plan, evaluate
from longturn.tasks.env_frames import EnvInteraction, EnvTask
from flaky_envs import FlakyCorridor
from settings_from_params import conversation_settings, sampling_settings
from test_conversation_time_limit import Forward  # `ACTION: forward`, the corridor's `right`

FLAKY = "flaky_envs:FlakyCorridor"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def play(tokenizer, tasks: list[EnvTask], interaction: EnvInteraction, seed: int = 2,
         **limits) -> list[dict]:
    settings = conversation_settings(max_assistant_turns=10, max_user_turns=10,
                                     interaction=interaction, **limits)
    return conversation_rollout(Forward(tokenizer), tokenizer, sampling_settings(max_new_tokens=16),
                                [task.record(seed) for task in tasks], settings)


def test_an_env_that_raises_aborts_its_episode_alone(tokenizer):
    tasks = [EnvTask(FLAKY, "corridor", image=False, kwargs={"raise_on_step": 2}),
             EnvTask(FLAKY, "corridor", image=False)]
    broken, whole = play(tokenizer, tasks, EnvInteraction({}, "env"))

    assert (broken["termination"], broken["aborted"], broken["truncated"],
            broken["assistant_turns"]) == ("env_error", True, False, 2)
    assert (whole["termination"], whole["aborted"], whole["assistant_turns"]) == \
        ("success", False, 6)  # named as an env slot's episode
    samples = samples_from_episodes([broken, whole])
    # the reply whose step raised is out of the loss; the one before acted on an env that
    # answered and trains, as an env slot's turn before a failed step does
    assert [r["aborted"] for r in samples[0]["replies"]] == [False, True]
    assert samples[0]["replies"][-1]["termination"] == "env_error"
    metrics = sample_metrics(samples)
    assert (metrics["episodes_aborted"], metrics["termination/env_error"],
            metrics["termination/success"]) == (1, 1, 1)


def test_failures_of_different_envs_do_not_add_up(tokenizer):
    """Counted per env, as env slots count theirs: three envs failing once each, at once on
    threads, are three aborted episodes, not three failures in a row."""
    tasks = [EnvTask(FLAKY, "corridor", image=False, kwargs={"raise_on_step": 1})] * 3
    played = play(tokenizer, tasks, EnvInteraction({"max_retries": 1}, "env"))
    assert [(r["termination"], r["aborted"]) for r in played] == [("env_error", True)] * 3


def test_an_env_whose_first_step_always_fails_stops_the_stage_as_an_env_slot(tokenizer):
    """Every episode resets, then its first step raises: a reset that works does not clear the
    failures in a row (an env slot's rule, tests/test_env_workers.py), so the slot's 3rd
    episode stops the stage with one line naming the env. They used to be cleared by each
    reset: the slot lost every episode and the stage never stopped."""
    run = ConversationRun({"c": EnvTask(FLAKY, "corridor", image=False,
                                        kwargs={"raise_on_step": 1})},
                          conversation_settings(max_assistant_turns=10, max_user_turns=10,
                                                history_turns=1, interaction=EnvInteraction(
                                                    {"max_retries": 2}, "env")),
                          conversation_rollout)
    with pytest.raises(EnvGaveUp, match=r"env 'flaky' task 'corridor' failed "
                                        r"3 times in a row, the last on seed \d+ \(step, "
                                        r"env_error: .*max_retries is 2"):
        one_batch(run, "c", tokenizer, turns=8)


def test_a_hanging_worker_times_out_and_a_finished_episodes_worker_is_reused(tokenizer, caplog):
    interaction = EnvInteraction({"workers": True, "step_timeout_s": 2.0}, "env")
    hangs = EnvTask(FLAKY, "corridor", image=False, kwargs={"hang_on_step": 2, "hang_s": 30})
    fine = EnvTask(FLAKY, "corridor", image=False)

    hung, whole = play(tokenizer, [hangs, fine], interaction)
    again, = play(tokenizer, [fine], interaction, seed=3)

    assert (hung["termination"], hung["aborted"], hung["assistant_turns"]) == ("timeout", True, 2)
    assert "no answer to step within 2 s (the 'env' interaction's step_timeout_s)" in caplog.text
    assert (whole["termination"], whole["aborted"]) == ("success", False)

    def process(record: dict) -> str:  # each observation names the process that made it
        messages = json.loads(record["messages"])  # system, the task's observation, a reply,
        answer = messages[3]["content"]  # then the interaction's env's first observation
        return answer.split("(process ")[1].split(")")[0]

    assert process(again) == process(whole) != str(os.getpid())  # one worker, two episodes


def one_batch(run: ConversationRun, task: str, tokenizer, turns: int = 3) -> list[dict]:
    """The samples of one fixed-turn batch of `turns` replies in one slot."""
    collector = conversation_fixed_turns(run, [task], n_envs=1, turns_per_env=turns, seed=0)
    try:
        return collector.collect(Forward(tokenizer), tokenizer,
                                 sampling_settings(max_new_tokens=16, seed=0), 0,
                                 {"run_id": "t"}, progress=False)
    finally:
        collector.close()


def test_fixed_turn_batches_start_the_slots_next_episode_after_an_abort(tokenizer):
    """With a critic and a window: the aborted episode's replies carry no bootstrap, and its slot
    plays a new episode within the same batch."""
    run = ConversationRun({"flaky": EnvTask(FLAKY, "corridor", image=False,
                                            kwargs={"raise_on_step": 2})},
                          conversation_settings(max_assistant_turns=10, max_user_turns=10,
                                                history_turns=1,
                                                interaction=EnvInteraction({}, "env")),
                          conversation_rollout)
    samples = one_batch(run, "flaky", tokenizer)
    episodes = list(dict.fromkeys(s["episode_id"] for s in samples))
    assert len(samples) == 3 and len(episodes) == 2
    first, second = ([s for s in samples if s["episode_id"] == e] for e in episodes)
    assert [s["replies"][0]["aborted"] for s in first] == [False, True]  # the failed step's
    assert first[-1]["replies"][0]["termination"] == "env_error"
    assert first[-1]["bootstrap_prompt_ids"] is None
    # the next episode (on the restarted env) runs on; the batch cuts it and bootstraps it
    assert [s["replies"][0]["aborted"] for s in second] == [False]
    assert second[0]["replies"][0]["segment_end"] and second[0]["bootstrap_prompt_ids"]


def test_with_workers_no_env_resets_or_steps_in_this_process(tokenizer):
    """The env behind the interaction opens each episode (its instructions and first
    observation) and says whether it succeeded (its `success`, as an env slot's): with `workers`
    no env resets or steps in the trainer's process, neither for whole episodes nor in
    fixed-turn batches (the task record used to reset one here, and the task to replay every
    reply at the end)."""
    run = ConversationRun({"corridor": EnvTask(FLAKY, "corridor", image=False, kwargs={
                              "length": 2}),
                           "longer": EnvTask(FLAKY, "corridor", image=False)},
                          conversation_settings(max_assistant_turns=3, max_user_turns=10,
                                                history_turns=1, interaction=EnvInteraction(
                                                    {"workers": True}, "env")),
                          conversation_rollout)
    FlakyCorridor.calls_in_this_process = 0
    reached, stopped = run.play(Forward(tokenizer), tokenizer,
                                sampling_settings(max_new_tokens=16),
                                [run.record("corridor", 2), run.record("longer", 2)], ["a", "b"])
    samples = one_batch(run, "corridor", tokenizer)

    assert (reached["termination"], reached["success"]) == ("success", True)
    # three replies walk three of six steps: the turn limit ends it, unsolved
    assert (stopped["termination"], stopped["success"]) == ("max_assistant_turns", False)
    ended = [s["replies"][0] for s in samples if s["replies"][0]["termination"]]
    assert ended and all(reply["success"] for reply in ended)
    assert FlakyCorridor.calls_in_this_process == 0
    assert json.loads(reached["messages"])[1]["content"].startswith("Your goal: reach the end")


def test_a_reset_that_keeps_failing_stops_with_one_line_naming_the_seed(tokenizer):
    """A reset runs in the interaction, retried on a restarted env: a seed whose reset always
    fails stops the stage after `max_retries`, naming it (no traceback out of a task record)."""
    broken = EnvTask(FLAKY, "corridor", image=False, kwargs={"raise_on_reset": [2]})
    with pytest.raises(EnvGaveUp, match=r"failed 2 times in a row, the last on seed 2 \(reset, "
                                        r"env_error: RuntimeError: reset of seed 2 is broken\)"):
        play(tokenizer, [broken], EnvInteraction({"max_retries": 1, "workers": True}, "env"))


@pytest.mark.parametrize("fault, config, reason", [
    ({"raise_on_reset": "SEED"}, {}, "env_error"),
    ({"hang_on_reset": "SEED", "hang_s": 30}, {"workers": True, "step_timeout_s": 1.0}, "timeout"),
])
def test_a_reset_that_fails_in_a_batch_moves_the_slot_to_its_next_episode(tokenizer, fault,
                                                                         config, reason):
    """As an env slot's: the episode whose reset failed never begins, the failure is counted,
    and the slot starts its next episode (next seed) in the same batch."""
    bad = episode_seed(0, 0, 0, 1)  # the slot's second episode
    kwargs = {"length": 2, **{k: [bad] if v == "SEED" else v for k, v in fault.items()}}
    run = ConversationRun({"c": EnvTask(FLAKY, "corridor", image=False, kwargs=kwargs)},
                          conversation_settings(max_assistant_turns=10, max_user_turns=10,
                                                history_turns=1,
                                                interaction=EnvInteraction(config, "env")),
                          conversation_rollout)
    samples = one_batch(run, "c", tokenizer)

    episodes = list(dict.fromkeys(s["episode_id"] for s in samples))
    assert episodes == ["train-r0-e0-0", "train-r0-e0-2"]  # e0-1 never began
    assert samples[-1]["aborted_resets"] == [reason]
    assert sample_metrics(samples)["episodes_aborted"] == 1


# an env task whose reset of seed 1001 always raises (params name it `module:OBJECT`)
RESET_1001_FAILS = EnvTask(FLAKY, "corridor", image=False, kwargs={"raise_on_reset": [1001]})


def test_an_evaluation_job_whose_reset_failed_is_counted_and_the_others_play(tokenizer, tmp_path):
    """As an env slot's evaluation (tests/test_env_workers.py): the job is an aborted row of no
    reply and the evaluation goes on. It used to be retried on the same seed until the env gave
    up, which stopped the evaluation."""
    params = parse_params({
        "env": {"tasks": ["test_env_interaction_faults:RESET_1001_FAILS"], "workers": False,
                "step_timeout_s": None},
        "rollout": {"protocol": "chat", "chat": {
            "interactions": str(ROOT / "configs/env_interactions.yaml")}},
        "eval": {"episodes_per_task": 4, "parallel_envs": 2, "seed": 1000}})
    metrics = evaluate(conversation_plan, Forward(tokenizer), tokenizer, params, tmp_path, "base",
                       progress=False)
    episodes = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode_seed")
    assert episodes["aborted"].to_dict() == {1000: False, 1001: True, 1002: False, 1003: False}
    assert episodes.loc[1001, ["length", "termination"]].tolist() == [0, "env_error"]
    assert set(episodes["env_name"]) == {FLAKY}  # the env the task names, on every row
    overall = metrics["overall"]
    assert (overall["episodes"], overall["aborted_episodes"], overall["termination/env_error"]) \
        == (4, 1, 1)


def test_a_groups_start_that_failed_is_tried_again_and_counted(tokenizer):
    """Critic-free groups share a seed, so a member whose reset failed is tried again on it (as
    an env slot's group member is) and the failure is counted in the batch (`aborted_resets`),
    as env slots count theirs."""
    FlakyCorridor.resets_of_seed.clear()
    run = ConversationRun({"c": EnvTask(FLAKY, "corridor", image=False,
                                        kwargs={"length": 2, "raise_on_first_resets": 1})},
                          conversation_settings(max_assistant_turns=10, max_user_turns=10,
                                                interaction=EnvInteraction({}, "env")),
                          conversation_rollout)
    collector = conversation_episodes(run, ["c"], n_envs=2, group_size=2, seed=0)
    try:
        samples = collector.collect(Forward(tokenizer), tokenizer,
                                    sampling_settings(max_new_tokens=16, seed=0), 0,
                                    {"run_id": "t"}, progress=False)
    finally:
        collector.close()
    assert [s["episode_seed"] for s in samples] == [episode_seed(0, 0, 0, 0)] * 2  # one group
    assert all(s["replies"][-1]["termination"] == "success" for s in samples)
    assert samples[-1]["aborted_resets"] == ["env_error"]
    metrics = sample_metrics(samples)
    assert (metrics["episodes_ended"], metrics["episodes_aborted"]) == (3, 1)


def test_a_start_made_again_on_resume_that_fails_is_counted(tokenizer):
    """A checkpoint keeps the episodes opened but not begun; a resumed run opens them again. One
    whose reset now fails is counted in the next batch (`aborted_resets`), as any failed start
    (it used to be dropped unseen), and its slot starts its next episode."""
    def collector(**faults) -> FixedTurnBatches:
        run = ConversationRun({"c": EnvTask(FLAKY, "corridor", image=False,
                                            kwargs={"length": 2, **faults})},
                              conversation_settings(max_assistant_turns=10, max_user_turns=10,
                                                    history_turns=1,
                                                    interaction=EnvInteraction({}, "env")),
                              conversation_rollout)
        return conversation_fixed_turns(run, ["c"], n_envs=1, turns_per_env=2, seed=0)

    def collect(c: FixedTurnBatches, iteration: int) -> list[dict]:
        return c.collect(Forward(tokenizer), tokenizer, sampling_settings(max_new_tokens=16,
                                                                          seed=0),
                         iteration, {"run_id": "t"}, progress=False)

    first = collector()
    try:
        collect(first, 0)
        (pending,) = [start for start, _ in first.player.pending.values()]  # ended at the last
        state = first.state()
    finally:
        first.close()
    resumed = collector(raise_on_reset=[pending.seed])  # its reset fails from now on
    try:
        resumed.load_state(state)
        samples = collect(resumed, 1)
    finally:
        resumed.close()
    assert samples[-1]["aborted_resets"] == ["env_error"]
    assert pending.episode_id not in {s["episode_id"] for s in samples}
    assert sample_metrics(samples)["episodes_aborted"] == 1
