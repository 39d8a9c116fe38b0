"""CrafterTextEnv contract: protocol, the 17 actions, sleep handling, reward and termination
bookkeeping, and the real-env worked examples of SPEC_crafter_text.md §9 (5, 6)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import crafter
import numpy as np
import pytest

from longturn.envs.actions import ActionTranslator
from longturn.envs.base import TextEnv
from longturn.envs.crafter import CrafterTextEnv
from longturn.envs.registry import make_env

ACTIONS = ["Noop", "Move West", "Move East", "Move North", "Move South", "Do", "Sleep",
           "Place Stone", "Place Table", "Place Furnace", "Place Plant", "Make Wood Pickaxe",
           "Make Stone Pickaxe", "Make Iron Pickaxe", "Make Wood Sword", "Make Stone Sword",
           "Make Iron Sword"]
STATUS_FULL = "Your status:\n- health: 9/9\n- food: 9/9\n- drink: 9/9\n- energy: 9/9\n\n"


def fresh(seed: int = 3, **kwargs: Any) -> CrafterTextEnv:
    env = CrafterTextEnv(**kwargs)
    env.reset(seed=seed)
    return env


def front(env: CrafterTextEnv) -> tuple[int, int]:
    player = env.unwrapped.player
    return int(player.pos[0] + player.facing[0]), int(player.pos[1] + player.facing[1])


def put_in_front(env: CrafterTextEnv, material: str) -> None:
    """Turn the faced cell into `material` (tests build the situation they need)."""
    world = env.unwrapped._world
    assert world[front(env)][1] is None, "a creature stands in front"
    world[front(env)] = material


def test_follows_text_env_protocol() -> None:
    env = CrafterTextEnv(task="default", seed=0, variant="V")
    assert isinstance(env, TextEnv)
    assert env.name == "crafter" and env.task == "default" and env.variant == "V"
    assert env.actions == ACTIONS and env.default_action == "Noop"
    assert all(v in env.actions for v in env.synonyms.values())
    assert list(env.instructions.actions) == env.actions


def test_translator_built_from_the_env_parses_messy_outputs() -> None:
    env = CrafterTextEnv()
    translator = ActionTranslator(env.actions, env.synonyms, env.default_action)
    outputs = {
        "THINK: a tree is west.\nACTION: Move West.": "Move West",
        "THINK: chop it\nACTION: **chop tree**": "Do",
        "ACTION: do (collect wood)": "Do",
        "ACTION: MAKE_WOOD_PICKAXE": "Make Wood Pickaxe",
        "ACTION: make crafting table\nthen a pickaxe": "Place Table",
        "ACTION: move north 2 steps": "Move North",
        "ACTION: sleep.": "Sleep",
    }
    assert {out: translator.parse(out).action for out in outputs} == outputs
    for invalid in ["ACTION: Drink water", "ACTION: fly", "I go west"]:
        parsed = translator.parse(invalid)
        assert not parsed.valid and parsed.action == "Noop"


def test_builds_through_the_registry_by_name_or_as_a_plugin() -> None:
    env = make_env("longturn.envs.crafter:CrafterTextEnv", "default", seed=1, variant="B")
    assert isinstance(env, CrafterTextEnv) and env.variant == "B"
    assert isinstance(make_env("crafter", "default", seed=1), CrafterTextEnv)


def test_actions_follow_crafter_indices() -> None:
    expected = [a.replace("move_left", "move_west").replace("move_right", "move_east")
                .replace("move_up", "move_north").replace("move_down", "move_south")
                .replace("_", " ").title() for a in crafter.constants.actions]
    assert ACTIONS == expected


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown Crafter task 'survive'"):
        CrafterTextEnv(task="survive")
    with pytest.raises(ValueError, match="variant 'C'"):
        CrafterTextEnv(variant="C")
    env = CrafterTextEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Noop")


def test_example_5_first_turns_of_seed_3() -> None:
    env = CrafterTextEnv()
    _, info = env.reset(seed=3)
    assert info["long_term_context"] == (
        "You see:\n- grass 1 steps to your west\n- tree 6 steps to your south-west\n\n"
        "You face grass at your front.")
    assert info["score"] == 0 and info["turn"] == 0 and info["crafter_step"] == 1  # hidden noop
    obs, reward, terminated, truncated, info = env.step("Move West")
    assert obs.text == (
        STATUS_FULL + "You have nothing in your inventory.\n"
        "You see:\n- grass 1 steps to your west\n- tree 4 steps to your west\n\n"
        "You face grass at your front.")
    assert (reward, terminated, truncated) == (0.0, False, False)
    with pytest.raises(ValueError, match="'move west'.*Noop"):
        env.step("move west")  # the env takes canonical names only; the translator parses


def test_example_6_reward_bookkeeping() -> None:
    env = fresh()
    put_in_front(env, "tree")
    obs, reward, _, _, info = env.step("Do")
    assert reward == 1.0 and info["inventory"]["wood"] == 1
    assert info["newly_unlocked"] == ["collect_wood"] and info["score"] == 1
    assert obs.text.endswith("You face grass at your front.")  # the tree became grass
    put_in_front(env, "tree")
    _, reward, _, _, info = env.step("Do")
    assert reward == 0.0 and info["inventory"]["wood"] == 2 and info["newly_unlocked"] == []
    put_in_front(env, "grass")
    _, reward, _, _, info = env.step("Place Table")
    assert reward == 1.0 and info["achievements"]["place_table"] == 1
    assert info["score"] == 2 and info["progression"] == pytest.approx(2 / 22)
    env.unwrapped.player.health = 8
    _, reward, _, _, info = env.step("Noop")
    assert reward == pytest.approx(-0.1) and info["inventory"]["health"] == 8


def test_two_achievements_on_one_step_give_one() -> None:
    env = fresh()
    put_in_front(env, "tree")
    env.unwrapped.player.sleeping = True  # energy is full: wakes up, then chops
    _, reward, _, _, info = env.step("Do")
    assert info["newly_unlocked"] == ["collect_wood", "wake_up"] and reward == 1.0


def test_place_and_make_actions() -> None:
    env = fresh()
    player = env.unwrapped.player
    player.inventory.update(wood=9, stone=9, coal=9, iron=9, sapling=2)
    placed = [("Place Table", (0, 1), "table"), ("Place Stone", (-1, 0), "stone"),
              ("Place Furnace", (1, 0), "furnace")]
    for action, facing, material in placed:  # around the player, so all stay within reach
        player.facing = facing
        put_in_front(env, "grass")
        env.step(action)
        assert env.unwrapped._world[front(env)][0] == material, action
    player.facing = (0, -1)
    put_in_front(env, "grass")
    _, _, _, _, info = env.step("Place Plant")
    assert info["achievements"]["place_plant"] == 1 and info["inventory"]["sapling"] == 1
    assert info["inventory"]["wood"] == 7 and info["inventory"]["stone"] == 4
    for tool in ["Wood Pickaxe", "Stone Pickaxe", "Iron Pickaxe",
                 "Wood Sword", "Stone Sword", "Iron Sword"]:
        _, _, _, _, info = env.step(f"Make {tool}")
        assert info["inventory"][tool.lower().replace(" ", "_")] == 1, tool
    assert info["score"] == 10  # 3 places + plant + 6 tools


def test_moves_change_position_and_facing() -> None:
    env = fresh()
    for action, step in [("Move West", (-1, 0)), ("Move North", (0, -1)),
                         ("Move East", (1, 0)), ("Move South", (0, 1))]:
        start = env.unwrapped.player.pos.copy()
        env.unwrapped._world[start + np.array(step)] = "grass"
        _, _, _, _, info = env.step(action)
        assert info["player_facing"] == step
        assert info["player_pos"] == tuple(int(v) for v in start + np.array(step)), action


def test_sleep_v_skips_to_waking_up() -> None:
    env = fresh()
    env.unwrapped.player.inventory["energy"] = 3
    obs, reward, _, _, info = env.step("Sleep")
    assert info["sleep_steps"] > 50 and not info["sleeping"]
    assert info["inventory"]["energy"] == 9 and info["newly_unlocked"] == ["wake_up"]
    assert reward == 1.0 and not obs.text.count("You are sleeping")
    assert info["crafter_step"] == 1 + 1 + info["sleep_steps"] and info["turn"] == 1


def test_sleep_b_keeps_the_agent_asleep() -> None:
    env = fresh(variant="B")
    env.unwrapped.player.inventory["energy"] = 3
    obs, _, _, _, info = env.step("Sleep")
    assert info["sleeping"] and info["sleep_steps"] == 0
    assert info["long_term_context"].startswith(
        "You are sleeping, and will not be able take actions until energy is full.\n\n\n\nYou see:")
    position = info["player_pos"]
    _, _, _, _, info = env.step("Move West")  # crafter forces sleep: the move is ignored
    assert info["sleeping"] and info["player_pos"] == position


def test_sleep_with_full_energy_does_nothing() -> None:
    env = fresh()
    _, reward, _, _, info = env.step("Sleep")
    assert not info["sleeping"] and info["sleep_steps"] == 0 and reward == 0.0


def test_death_terminates() -> None:
    env = fresh()
    env.unwrapped.player.health = 0
    obs, reward, terminated, truncated, info = env.step("Noop")
    assert terminated and not truncated and info["dead"] and reward == pytest.approx(-0.9)
    assert info["long_term_context"].startswith("You died.\n\n\n\nYou see:")
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("Noop")


def test_max_steps_truncates_and_crafter_length_terminates() -> None:
    env = fresh(max_steps=3)
    flags = [env.step("Noop")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    env = fresh(length=5)  # the hidden reset noop is crafter step 1
    flags = [env.step("Noop")[2:4] for _ in range(4)]
    assert flags == [(False, False)] * 3 + [(True, False)]


def test_reset_with_the_same_seed_replays() -> None:
    env = CrafterTextEnv(seed=3)
    first = env.reset()[1]["long_term_context"]  # constructor seed, first episode
    env.step("Move West")
    assert env.reset(seed=3)[1]["long_term_context"] == first
    assert env.step("Move West")[4]["long_term_context"].endswith(
        "- tree 4 steps to your west\n\nYou face grass at your front.")


def play(seed: int, turns: int) -> tuple[str, int]:
    """Digest of every observation, reward and flag of `turns` random turns (new episodes after
    deaths), and the latest crafter step reached (past nightfall, where rendering draws RNG)."""
    env, rng, digest, latest = CrafterTextEnv(), np.random.RandomState(5), hashlib.sha256(), 0
    env.reset(seed=seed)
    for _ in range(turns):
        obs, reward, terminated, _, info = env.step(env.actions[rng.randint(17)])
        digest.update(f"{obs.text}|{reward}|{terminated}|{info['sleep_steps']}".encode())
        latest = max(latest, info["crafter_step"])
        if terminated:
            env.reset()
    return digest.hexdigest(), latest


def test_same_seed_and_actions_replay_in_another_process() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from test_crafter_env import play; "
            "print(*play(11, 300))")
    other = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent)],
                             stdout=subprocess.PIPE, text=True)
    here = play(11, 300)  # meanwhile, in this process
    out, _ = other.communicate(timeout=120)
    assert other.returncode == 0
    assert out.split() == [here[0], str(here[1])]
    assert here[1] > 200  # the episodes ran into the night


def test_instructions_list_only_locked_achievements() -> None:
    env = fresh()
    goal = env.instructions.goal
    assert goal.count("\n") == 22 and "\n1. Collect Wood,\n2. Place Table," in goal
    assert goal.endswith("22. Collect Diamond")
    put_in_front(env, "tree")
    env.step("Do")
    goal = env.instructions.goal
    assert "Collect Wood" not in goal and "\n1. Place Table,\n" in goal
    assert goal.endswith("21. Collect Diamond")
    tips = env.instructions.tips
    assert len(tips) == 14 and tips[0].startswith("Tree:") and "Plan" in tips[-1]
    assert "2 wood" in env.instructions.actions["Place Table"]
    assert "4 stone" in env.instructions.actions["Place Furnace"]


def test_optional_image() -> None:
    env = CrafterTextEnv(image=True)
    obs, _ = env.reset(seed=3)
    assert obs.image is not None and obs.image.shape == (256, 256, 3)
    assert env.step("Noop")[0].image.shape == (256, 256, 3)
    assert CrafterTextEnv().reset(seed=3)[0].image is None
