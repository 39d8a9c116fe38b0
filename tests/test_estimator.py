"""The Estimator table: the one answer to "is there a critic?", whose names are the
`algo.advantage` choices params accepts, and with the rollout the one answer to "how are batches
collected?" (`params.collection`), read by the collector, the critic dir and the trainer settings
the stages build."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

import pytest

from longturn.errors import SettingError, UserError
from longturn.params.config import AlgoParams, ParamsError, parse_params
from longturn.params.estimator import ESTIMATORS, Collection, Estimator
from longturn.rollout.collection import EpisodeGroups, FixedTurnBatches
from longturn.rollout.conversation_player import ConversationPlayer
from longturn.run.wiring import critic_dir, make_collector, trainer_settings
from longturn.tasks.env_frames import EnvInteraction


def test_the_advantage_choices_are_the_tables_names() -> None:
    assert get_args(AlgoParams.model_fields["advantage"].annotation) == tuple(ESTIMATORS)
    assert all(e.name == name for name, e in ESTIMATORS.items())
    assert all(AlgoParams(advantage=name).estimator is e for name, e in ESTIMATORS.items())
    with pytest.raises(ParamsError, match="algo.advantage"):
        parse_params({"algo": {"advantage": "ppo"}})


def test_gae_has_the_critic_and_the_group_estimators_play_seed_groups() -> None:
    assert {n: e.has_critic for n, e in ESTIMATORS.items()} == {
        "gae": True, "grpo": False, "gigpo": False}
    for e in ESTIMATORS.values():
        collections = {e.collection(cut) for cut in (True, False)}
        # a cut episode's last reply is bootstrapped with V(what comes next): no fixed-turn
        # batches without a critic, whatever the rollout allows
        assert collections == ({Collection.FIXED_TURNS, Collection.WHOLE_EPISODES}
                               if e.has_critic else {Collection.SEED_GROUPS})


def test_named_gives_the_table_entry_and_one_line_naming_an_unknown_value() -> None:
    assert Estimator.named("gigpo") is ESTIMATORS["gigpo"]
    with pytest.raises(SettingError) as raised:
        Estimator.named("ppo")
    message = str(raised.value)
    assert isinstance(raised.value, UserError) and "\n" not in message
    assert "'ppo'" in message and "algo.advantage" in message and "gae, grpo, gigpo" in message
    with pytest.raises(SettingError, match="None"):
        Estimator.named(None)  # type: ignore[arg-type]


def _params(advantage: str, protocol: str = "action"):
    return parse_params({
        "env": ({"name": "arithmetic", "tasks": ["arithmetic"]} if protocol == "chat"
                else {"tasks": ["goto"]}) | {"workers": False, "step_timeout_s": None},
        "rollout": {"protocol": protocol, "n_envs": 4, "turns_per_env": 2},
        "algo": {"advantage": advantage, "group_size": 2},
    })


@pytest.mark.parametrize("advantage, kind, group", [
    ("gae", FixedTurnBatches, None), ("grpo", EpisodeGroups, 2),
    ("gigpo", EpisodeGroups, 2)])
def test_the_action_protocol_collects_as_the_estimator_says(advantage, kind, group) -> None:
    params = _params(advantage)
    collector = make_collector(params, rank=0, run_id="t")
    try:
        # either way the env's episodes are conversations of its interaction (the action prompt
        # in every window), played by lock-steps (no rollout function)
        assert type(collector) is kind and type(collector.player) is ConversationPlayer
        run = collector.player.run
        assert isinstance(run.settings.interaction, EnvInteraction) and run.of_an_env
        assert run.settings.action_prompt is not None
        assert getattr(collector, "group_size", None) == group
    finally:
        collector.close()
    has_critic = ESTIMATORS[advantage].has_critic
    assert trainer_settings(params).estimator is ESTIMATORS[advantage]
    assert trainer_settings(params).has_critic is has_critic
    assert critic_dir(params, Path("warm")) == (Path("warm") if has_critic else None)


@pytest.mark.parametrize("advantage, group", [("grpo", 2), ("gigpo", 2), ("gae", None)])
def test_the_chat_protocol_plays_whole_episodes_grouped_when_the_estimator_plays_groups(
        advantage, group) -> None:
    params = _params(advantage, protocol="chat")
    params.rollout.context = "episode"  # gae: the verl / slime way, whole episodes
    assert params.collection is (Collection.WHOLE_EPISODES if group is None
                                 else Collection.SEED_GROUPS)
    collector = make_collector(params, rank=0, run_id="t")
    assert type(collector) is EpisodeGroups and collector.group_size == group
    assert type(collector.player) is ConversationPlayer


def test_the_chat_protocol_collects_fixed_turn_batches_with_a_critic() -> None:
    """With a history window, as the action protocol does: n_envs episode slots × turns_per_env
    replies, episodes carried over."""
    params = _params("gae", protocol="chat")
    params.rollout.context = "window"
    assert params.collection is Collection.FIXED_TURNS
    collector = make_collector(params, rank=0, run_id="t")
    assert type(collector) is FixedTurnBatches and type(collector.player) is ConversationPlayer
    assert (collector.player.n_slots, collector.turns_per_env) == (params.rollout.n_envs,
                                                                   params.rollout.turns_per_env)


@pytest.mark.parametrize("protocol", ["action", "chat"])
@pytest.mark.parametrize("context", ["window", "episode"])
@pytest.mark.parametrize("advantage", list(ESTIMATORS))
def test_every_protocol_context_and_estimator_make_one_collection(protocol, context, advantage):
    """Any context works with any protocol and any estimator: params hold the three, decide the
    collection once, and the collector plays it with the window the context names."""
    params = _params(advantage, protocol)
    params.rollout.context = context
    # written out, not asked of the code: critic-free plays seed groups; a critic cuts the action
    # protocol and a chat window into fixed-turn batches, and plays a whole-episode chat whole
    if advantage != "gae":
        expected = Collection.SEED_GROUPS
    elif protocol == "action" or context == "window":
        expected = Collection.FIXED_TURNS
    else:
        expected = Collection.WHOLE_EPISODES
    assert params.collection is expected
    collector = make_collector(params, rank=0, run_id="t")
    try:
        kind = FixedTurnBatches if expected is Collection.FIXED_TURNS else EpisodeGroups
        assert type(collector) is kind
        if kind is EpisodeGroups:
            assert collector.group_size == (params.algo.group_size
                                            if expected is Collection.SEED_GROUPS else None)
        player = collector.player
        assert type(player) is ConversationPlayer
        window = player.run.settings.history_turns
        assert params.history_window == (params.prompt.history_turns if context == "window"
                                         else None)
        if protocol == "action" and context == "episode":  # each reply its own sample, shown
            assert window == sys.maxsize  # every past step: a window of the whole episode
        else:
            assert window == params.history_window
    finally:
        collector.close()
