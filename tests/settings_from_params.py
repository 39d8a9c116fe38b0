"""Settings objects for tests, built the way the stages build them: from the `Params()` sections
(the one source of defaults; the settings classes have none of their own), then each test's own
overrides. The TrainerSettings counterpart is trainer_settings.make_settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from longturn.params.config import Params
from longturn.engines.base import SamplingParams
from longturn.rollout.conversation_rollout import ConversationSettings


def sampling_settings(**overrides: Any) -> SamplingParams:
    """engine.sampling's defaults, unseeded, then `overrides`."""
    return replace(SamplingParams.from_config(Params().engine.sampling, seed=None), **overrides)


def conversation_settings(**overrides: Any) -> ConversationSettings:
    """rollout.chat's limits, the whole episode as context (the tools profile's), no tools,
    interaction or reward, no progress bar, an env's conversation shown in a window as its own
    messages (`action_prompt` None; a run's shows it as the action prompt of its steps), then
    `overrides`."""
    params = Params()
    base = ConversationSettings.from_config(params.rollout.chat, history_turns=None, tools=None,
                                            interaction=None, reward_fn=None, progress=False,
                                            action_prompt=None)
    return replace(base, **overrides)
