"""The settings classes the stages pass around have no defaults of their own: every value comes
from the pydantic sections in longturn/params/config.py (the one source of defaults) through one
constructor, or is passed explicitly. A field default here would be a second default that can
drift from params.yaml's, so the classes are checked by introspection."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from pydantic import BaseModel

from longturn.algo.group_advantages import GroupParams
from longturn.agent.prompts import ActionPrompt
from longturn.algo.trainer import TrainerSettings
from longturn.params.config import parse_params
from longturn.engines.base import SamplingParams
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.conversation_rollout import ConversationSettings

SETTINGS_CLASSES = [TrainerSettings, ActionPrompt, SamplingParams,
                    ConversationSettings, GroupParams]


def declared_defaults(cls: type) -> list[str]:
    """The fields of a dataclass or pydantic model that declare a default."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING]
    if issubclass(cls, BaseModel):
        return [name for name, f in cls.model_fields.items() if not f.is_required()]
    raise TypeError(f"{cls.__name__} is neither a dataclass nor a pydantic model: "
                    "teach declared_defaults to read its fields")


def test_the_check_sees_a_default():
    @dataclasses.dataclass
    class WithDefaults:
        a: int
        b: int = 1
        c: list = dataclasses.field(default_factory=list)

    class Model(BaseModel):
        a: int
        b: int = 1

    assert declared_defaults(WithDefaults) == ["b", "c"]
    assert declared_defaults(Model) == ["b"]


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_settings_class_declares_no_default(cls):
    assert declared_defaults(cls) == [], \
        f"{cls.__name__} declares defaults; put them in longturn/params/config.py and build it from there"


# a value unlike each default, so a field read from the wrong key shows
PARAMS = parse_params({
    "prompt": {"history_turns": 3, "history_content": "action",
               "invalid_in_history": "raw_output", "max_prompt_tokens": 512,
               "demonstration": False},
    "env": {"invalid_action_penalty": 0.5, "max_turns": 7, "max_retries": 1},
    "engine": {"sampling": {"max_new_tokens": 9, "temperature": 0.5, "top_p": 0.8, "top_k": 4}},
    "rollout": {"context": "episode",
                "chat": {"max_assistant_turns": 6, "max_user_turns": 0, "max_tokens": 999,
                         "max_tool_response_chars": 77, "tokenization_check": "off"}},
    "algo": {"advantage": "gigpo", "norm_std": False, "step_weight": 0.25},
    "gae": {"gamma_step": 0.9},
})


def test_an_env_s_conversations_take_the_context_prompt_and_env_sections():
    """rollout.context is read once, `Params.history_window`: the window's turns, or None for
    the whole episode (the action protocol's then a window of every past step)."""
    windowed = PARAMS.model_copy(deep=True)
    windowed.rollout.context = "window"
    assert (PARAMS.history_window, windowed.history_window) == (None, 3)
    settings = ConversationRun.of_env(windowed, progress=False).settings
    assert settings.history_turns == 3
    assert ConversationRun.of_env(PARAMS, progress=False).settings.history_turns == sys.maxsize
    # an env's conversations are shown as prompt.* says, their env run as env.* says
    assert settings.action_prompt == ActionPrompt(history_content="action",
                                                  invalid_in_history="raw_output",
                                                  max_prompt_tokens=512, demonstration=False)
    assert {k: settings.interaction.config[k] for k in (
        "invalid_action_penalty", "max_turns", "max_retries")} == {
        "invalid_action_penalty": 0.5, "max_turns": 7, "max_retries": 1}


def test_sampling_comes_from_engine_sampling_with_a_seed_and_an_optional_temperature():
    section = PARAMS.engine.sampling
    assert SamplingParams.from_config(section, seed=5) == SamplingParams(
        max_new_tokens=9, temperature=0.5, top_p=0.8, top_k=4, seed=5)
    greedy = SamplingParams.from_config(section, seed=None, temperature=0.0)  # eval.temperature
    assert (greedy.temperature, greedy.top_k, greedy.seed) == (0.0, 4, None)


def test_conversation_settings_come_from_rollout_chat_and_context_plus_the_loaded_objects():
    def reward(record, messages):
        return 1.0

    settings = ConversationSettings.from_config(
        PARAMS.rollout.chat, history_turns=PARAMS.history_window, tools=None, interaction=None,
        reward_fn=reward, progress=False, action_prompt=ActionPrompt.from_config(PARAMS.prompt))
    assert settings == ConversationSettings(
        max_assistant_turns=6, max_user_turns=0, max_tokens=999, max_tool_response_chars=77,
        tool_timeout_s=60.0, tokenization_check="off", history_turns=None,
        action_prompt=ActionPrompt(history_content="action", invalid_in_history="raw_output",
                                   max_prompt_tokens=512, demonstration=False),
        plain_replies=False, tools=None,
        interaction=None, reward_fn=reward, progress=False, retry_failed_starts=True)


def test_group_params_come_from_the_algo_section_as_metadata_records_it():
    recorded = PARAMS.algo.model_dump()  # what wiring.file_metadata writes
    assert GroupParams.from_algo(recorded, PARAMS.gae.gamma_step) == GroupParams(
        estimator="gigpo", gamma_step=0.9, norm_std=False, step_weight=0.25)
    with pytest.raises(ValueError, match=r"lacks \['norm_std'\]"):
        GroupParams.from_algo({"advantage": "grpo", "step_weight": 1.0}, 1.0)
