"""The chat protocol's settings: the keys validate, tasks resolve by name or import path, a bad
interaction choice or a misbehaving rollout function is named, and training seeds are stable."""

from __future__ import annotations

from pathlib import Path

import pytest

from longturn.params.config import ParamsError, parse_params
from longturn.errors import SettingError
from longturn.rollout.conversation_player import conversation_episodes
from longturn.rollout.conversation_setup import ConversationRun
from longturn.tasks.registry import load_task

ROOT = Path(__file__).resolve().parents[1]
TOOLS = str(ROOT / "configs/calculator_tools.yaml")
INTERACTIONS = str(ROOT / "configs/revision_interactions.yaml")


def params(**sequence):
    return parse_params({"env": {"tasks": ["arithmetic"]},
                         "rollout": {"protocol": "chat", "n_envs": 4, "chat": sequence}})


def test_conversation_keys_are_validated_by_name():
    with pytest.raises(ParamsError, match="rollout.chat.tokenization_check"):
        params(tokenization_check="loose")
    with pytest.raises(ParamsError, match="rollout.chat.max_user_turns"):
        params(max_user_turns=-1)
    with pytest.raises(ParamsError, match="needs rollout.chat.interactions"):
        params(interaction="revise")
    with pytest.raises(ParamsError, match="unknown key 'rollout.chat.tool'"):
        params(tool=TOOLS)
    assert params().rollout.chat.function is None  # the built-in rollout


def test_tasks_by_name_or_import_path():
    assert load_task("arithmetic") is load_task("longturn.tasks.arithmetic:TASK")
    shown = [m["role"] for m in load_task("arithmetic").record(7)["messages"]]
    plain = [m["role"] for m in load_task("arithmetic_plain").record(7)["messages"]]
    assert plain == ["system", "user"]  # the problem alone
    assert shown == ["system", "user", "assistant", "tool", "assistant", "user"]  # worked example
    with pytest.raises(SettingError, match="neither a built-in sequence task"):
        load_task("algebra")
    with pytest.raises(SettingError, match="lacks record, reward, success"):
        load_task("longturn.tasks.arithmetic:make_problem")
    with pytest.raises(SettingError, match="cannot import module"):
        load_task("no_such_module:TASK")


def test_the_interaction_is_picked_by_name():
    run = ConversationRun.from_params(params(tools=TOOLS, interactions=INTERACTIONS), progress=False)
    assert list(run.settings.interaction) == ["revise"]  # the file's, each task picks by name
    one = ConversationRun.from_params(params(interactions=INTERACTIONS, interaction="revise"))
    assert one.settings.interaction.name == "revise"  # named: one for every episode
    assert sorted(run.settings.tools.tools) == ["calculator"]
    with pytest.raises(SettingError, match=r"'ask' is not in .*\['revise'\]"):
        ConversationRun.from_params(params(interactions=INTERACTIONS, interaction="ask"))


def env_params(env=None, **chat):
    """BabyAI goto as a chat task, with the env interaction unless `chat` says otherwise."""
    return parse_params({"env": {"tasks": ["babyai_goto_text"], **(env or {})},
                         "rollout": {"protocol": "chat", "n_envs": 2, "chat": {
                             "interactions": str(ROOT / "configs/env_interactions.yaml"),
                             "interaction": "env", **chat}}})


def test_an_env_task_needs_its_interaction_to_open_it():
    with pytest.raises(SettingError, match=r"env.tasks \['babyai_goto_text'\]: an env task is "
                                           "opened and played by its interaction"):
        ConversationRun.from_params(env_params(interactions=None, interaction=None))
    run = ConversationRun.from_params(env_params({"step_timeout_s": 5}), progress=False)
    assert run.record("babyai_goto_text", 3)["messages"] == []  # no env built here


def test_an_env_interaction_takes_the_runs_env_settings(tmp_path):
    """One setting means one thing for either protocol: env.workers, env.step_timeout_s,
    env.max_retries, env.invalid_action_penalty and env.max_turns reach the env interaction."""
    run = ConversationRun.from_params(env_params({"step_timeout_s": 5, "max_retries": 1,
                                                  "invalid_action_penalty": 0.5}))
    assert run.settings.interaction.config == {"workers": True, "step_timeout_s": 5,
                                               "max_retries": 1, "invalid_action_penalty": 0.5,
                                               "max_turns": None}
    with pytest.raises(SettingError, match=r"env.step_timeout_s \(60\) must be under "
                                           r"rollout.chat.tool_timeout_s \(60\)"):
        ConversationRun.from_params(env_params())
    ConversationRun.from_params(env_params({"workers": False, "step_timeout_s": None}))
    own = tmp_path / "own.yaml"
    own.write_text("interactions:\n  - name: env\n    class: longturn.tasks.env_frames:"
                   "EnvInteraction\n    config: {workers: true}\n")
    with pytest.raises(SettingError, match=r"own.yaml: interaction 'env' sets workers in its "
                                           r"config; its settings are the run's env.workers, "):
        ConversationRun.from_params(env_params({"step_timeout_s": 5}, interactions=str(own)))
    own.write_text(own.read_text().replace("workers: true", "invalid_penalty: 0.2"))  # older name
    with pytest.raises(SettingError, match=r"sets invalid_penalty in its config; .*"
                                           r"env.invalid_action_penalty"):
        ConversationRun.from_params(env_params({"step_timeout_s": 5}, interactions=str(own)))


def short_rollout(engine, tokenizer, sampling, tasks, settings):
    return [{"input_ids": [1]}]


def test_a_misbehaving_rollout_function_is_named():
    run = ConversationRun.from_params(params(function=f"{__name__}:short_rollout"), progress=False)
    records = [run.record("arithmetic", s) for s in (1, 2)]
    with pytest.raises(SettingError, match="1 records for 2 tasks"):
        run.play(None, None, None, records, ["a", "b"])
    with pytest.raises(SettingError, match="record 0 lacks"):
        run.play(None, None, None, records[:1], ["a"])


def test_training_seeds_follow_from_seed_rank_and_iteration():
    run = ConversationRun.from_params(params(), progress=False)
    groups = conversation_episodes(run, ["arithmetic"], 4, 2, seed=3, rank=0)
    starts, ids = groups.starts(iteration=5)
    seeds = [s.seed for s in starts]
    assert seeds[0] == seeds[1] != seeds[2] == seeds[3]  # two groups of two on one seed each
    assert ids[0] == ids[1] != ids[2]
    again, _ = conversation_episodes(run, ["arithmetic"], 4, 2, seed=3, rank=0).starts(5)
    assert [s.seed for s in again] == seeds  # a resumed run plays the same problems
    other, _ = conversation_episodes(run, ["arithmetic"], 4, 2, seed=3, rank=1).starts(5)
    assert not set(s.seed for s in other) & set(seeds)
    single, none = conversation_episodes(run, ["arithmetic"], 4, None, seed=3).starts(5)
    assert len({s.seed for s in single}) == 4 and none == [None] * 4
