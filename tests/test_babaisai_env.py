"""BabaIsAITextEnv contract: TextEnv protocol, seeds, action names and synonyms, episode ending."""

from __future__ import annotations

import numpy as np
import pytest

from longturn.envs.actions import ActionTranslator
from longturn.envs.babaisai import TASKS, BabaIsAITextEnv
from babaisai_ascii import grid_to_rows
from longturn.envs.base import Instructions, Observation, TextEnv

ACTIONS = ["idle", "up", "right", "down", "left"]


def test_follows_text_env_protocol() -> None:
    env = BabaIsAITextEnv(task="env/goto_win")
    assert isinstance(env, TextEnv)
    assert env.name == "babaisai" and env.task == "env/goto_win"
    assert env.actions == ACTIONS and env.default_action == "idle"
    assert all(v in env.actions for v in env.synonyms.values())
    assert env.synonyms["wait"] == "idle" and env.synonyms["move up"] == "up"
    obs, info = env.reset(seed=0)
    assert isinstance(obs, Observation) and obs.image is None
    assert obs.text.startswith("Active rules:\n") and "\n\nObjects on the map:\n" in obs.text
    assert info["step_count"] == 0 and info["max_steps"] == 100 and info["task"] == env.task
    env.close()


def test_instructions_give_actions_and_eight_tips_but_no_level_goal() -> None:
    instructions = BabaIsAITextEnv("env/make_win").instructions
    assert isinstance(instructions, Instructions)
    assert instructions.actions == {
        "idle": "wait for one step",
        "up": "take one step up",
        "right": "take one step to the right",
        "down": "take one step down",
        "left": "take one step to the left",
    }
    assert len(instructions.tips) == 8 and "Baba Is You" in instructions.goal
    assert any("BABA IS YOU" in tip for tip in instructions.tips)


def test_unknown_task_and_action_are_rejected() -> None:
    with pytest.raises(ValueError, match="valid tasks"):
        BabaIsAITextEnv("env/flag_win")
    env = BabaIsAITextEnv("env/goto_win")
    with pytest.raises(RuntimeError):
        env.step("up")
    env.reset(seed=1)
    with pytest.raises(ValueError, match="allowed"):
        env.step("jump")


@pytest.mark.parametrize("task", TASKS[::4])
def test_seed_reproduces_the_level_and_the_episode(task: str) -> None:
    env_a, env_b = BabaIsAITextEnv(task), BabaIsAITextEnv(task)
    obs_a, _ = env_a.reset(seed=11)
    env_a.reset(seed=12)
    obs_a2, _ = env_a.reset(seed=11)
    obs_b, _ = env_b.reset(seed=11)
    assert obs_a.text == obs_a2.text == obs_b.text
    assert grid_to_rows(env_a.game.grid) == grid_to_rows(env_b.game.grid)
    for name in ["up", "left", "left", "down", "right", "idle", "up"]:
        assert env_a.step(name)[:4] == env_b.step(name)[:4]


def test_seeds_give_different_levels_and_unseeded_resets_continue_the_stream() -> None:
    env = BabaIsAITextEnv("env/two_room-goto_win-distr_obj")
    texts = {env.reset(seed=seed)[0].text for seed in range(10)}
    assert len(texts) == 10
    env.reset(seed=5)
    follow_ups = [env.reset()[0].text for _ in range(2)]
    other = BabaIsAITextEnv("env/two_room-goto_win-distr_obj")
    other.reset(seed=5)
    assert follow_ups == [other.reset()[0].text for _ in range(2)]


def test_step_limit_is_reported_as_termination_like_the_original() -> None:
    env = BabaIsAITextEnv("env/goto_win", max_steps=5)
    env.reset(seed=0)
    results = [env.step("idle") for _ in range(5)]
    assert [r[2] for r in results] == [False] * 4 + [True]
    assert not any(r[3] for r in results) and all(r[1] == 0.0 for r in results)
    assert results[-1][4]["step_limit_reached"] and not results[-1][4]["success"]
    assert results[-1][4]["progression"] == 0.0


def test_step_limit_can_be_reported_as_truncation() -> None:
    env = BabaIsAITextEnv("env/goto_win", max_steps=3, truncation_as_termination=False)
    env.reset(seed=0)
    results = [env.step("idle") for _ in range(3)]
    assert [(r[2], r[3]) for r in results] == [(False, False), (False, False), (False, True)]


def test_without_ruleset_the_text_starts_with_the_objects() -> None:
    env = BabaIsAITextEnv("env/goto_win", add_ruleset=False)
    obs, _ = env.reset(seed=0)
    assert obs.text.startswith("Objects on the map:\n") and "Active rules" not in obs.text


@pytest.mark.parametrize("output,action,valid", [
    ("THINK: the door is to the left.\nACTION: left", "left", True),
    ("ACTION: Up.", "up", True),
    ("Action: **RIGHT**", "right", True),
    ("action: move down", "down", True),
    ("ACTION: go to the left", "left", True),
    ("ACTION: wait", "idle", True),
    ("ACTION: take one step up", "up", True),
    ("ACTION: up\nACTION: down", "down", True),
    ("ACTION: `idle`", "idle", True),
    ("ACTION: jump over the wall", "idle", False),
    ("I would go up", "idle", False),
    ("ACTION:", "idle", False),
])
def test_translator_reads_messy_outputs(output: str, action: str, valid: bool) -> None:
    env = BabaIsAITextEnv("env/goto_win")
    parsed = ActionTranslator(env.actions, env.synonyms, env.default_action).parse(output)
    assert (parsed.action, parsed.valid) == (action, valid)


def test_env_is_reachable_through_the_registry_plugin_path() -> None:
    from longturn.envs.registry import make_env, translator_for

    env = make_env("longturn.envs.babaisai:BabaIsAITextEnv", task="env/make_win", max_steps=50)
    assert isinstance(env, BabaIsAITextEnv) and env.max_steps == 50
    assert translator_for(env).parse("ACTION: west").action == "left"


@pytest.mark.parametrize("task", TASKS[::5])
def test_random_play_keeps_the_contract(task: str) -> None:
    """Random actions never break the env: well-formed text, spec rewards, borders intact."""
    env = BabaIsAITextEnv(task)
    rng = np.random.default_rng(0)
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        borders = sum(row.count("#") for row in grid_to_rows(env.game.grid))
        for _ in range(100):
            obs, reward, terminated, truncated, info = env.step(ACTIONS[int(rng.integers(5))])
            assert "Objects on the map:" in obs.text and not truncated
            assert reward in (0.0, -1.0) or 0.0 < reward < 1.0
            assert sum(row.count("#") for row in grid_to_rows(env.game.grid)) == borders
            if terminated:
                break
