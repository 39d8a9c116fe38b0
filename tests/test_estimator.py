"""The Estimator table: the one answer to "is there a critic?" and "how are batches collected?",
held equal to the `algo.advantage` choices params accepts, and read by the collector, the critic
dir and the trainer settings the stages build."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from longturn.algo.estimator import ESTIMATORS, Collection, Estimator
from longturn.errors import SettingError, UserError
from longturn.params.config import AlgoParams, parse_params
from longturn.rollout.collection import EpisodeGroups, FixedTurnBatches
from longturn.rollout.conversation_player import ConversationPlayer
from longturn.rollout.env_player import EnvPlayer
from longturn.run.wiring import close_collector, critic_dir, make_collector, trainer_settings


def test_the_table_is_the_advantage_choices_params_accepts() -> None:
    choices = get_args(AlgoParams.model_fields["advantage"].annotation)
    assert sorted(ESTIMATORS) == sorted(choices)
    assert all(e.name == name for name, e in ESTIMATORS.items())
    for name, e in ESTIMATORS.items():  # params' group-size check asks the same question
        assert AlgoParams(advantage=name).plays_groups == (e.collection is Collection.SEED_GROUPS)


def test_gae_has_the_critic_and_the_group_estimators_play_seed_groups() -> None:
    assert {n: (e.has_critic, e.collection) for n, e in ESTIMATORS.items()} == {
        "gae": (True, Collection.FIXED_TURNS),
        "grpo": (False, Collection.SEED_GROUPS),
        "gigpo": (False, Collection.SEED_GROUPS),
    }
    # a cut episode's last turn is bootstrapped with V(next observation): no fixed-turn batches
    # without a critic
    assert all(e.has_critic for e in ESTIMATORS.values()
               if e.collection is Collection.FIXED_TURNS)


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
        assert type(collector) is kind and type(collector.player) is EnvPlayer
        assert getattr(collector, "group_size", None) == group
    finally:
        close_collector(collector)
    has_critic = ESTIMATORS[advantage].has_critic
    assert trainer_settings(params).estimator is ESTIMATORS[advantage]
    assert trainer_settings(params).has_critic is has_critic
    assert critic_dir(params, Path("warm")) == (Path("warm") if has_critic else None)


@pytest.mark.parametrize("advantage, group", [("grpo", 2), ("gigpo", 2), ("gae", None)])
def test_the_chat_protocol_plays_whole_episodes_grouped_when_the_estimator_plays_groups(
        advantage, group) -> None:
    params = _params(advantage, protocol="chat")
    params.rollout.context = "episode"  # gae: the verl / slime way, whole episodes
    collector = make_collector(params, rank=0, run_id="t")
    assert type(collector) is EpisodeGroups and collector.group_size == group
    assert type(collector.player) is ConversationPlayer


def test_the_chat_protocol_collects_fixed_turn_batches_with_a_critic() -> None:
    """With a history window, as env slots do: n_envs episode slots × turns_per_env replies,
    episodes carried over."""
    params = _params("gae", protocol="chat")
    params.rollout.context = "window"
    collector = make_collector(params, rank=0, run_id="t")
    assert type(collector) is FixedTurnBatches and type(collector.player) is ConversationPlayer
    assert (collector.player.n_slots, collector.turns_per_env) == (params.rollout.n_envs,
                                                                   params.rollout.turns_per_env)
