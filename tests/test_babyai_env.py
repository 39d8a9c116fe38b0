"""BabyAITextEnv contract: reproducible seeds, upstream step budgets and rewards, strict action names."""

from __future__ import annotations

import pytest

from longturn.envs.babyai import TASKS, BabyAITextEnv
from longturn.envs.babyai.level import HELD_OUT_SUBSTRINGS
from longturn.envs.base import TextEnv

MAX_STEPS = {"goto": 64, "pickup": 64, "open": 128, "putnext": 128, "pick_up_seq_go_to": 128}


def _layout(env: BabyAITextEnv) -> tuple:
    level = env.unwrapped
    cells = tuple(
        (x, y, c.type, c.color)
        for x in range(level.width)
        for y in range(level.height)
        if (c := level.grid.get(x, y)) is not None
    )
    return tuple(int(v) for v in level.agent_pos), level.agent_dir, cells, level.mission


def test_follows_text_env_protocol() -> None:
    env = BabyAITextEnv("goto")
    assert isinstance(env, TextEnv)
    assert env.name == "babyai" and env.task == "goto"
    assert env.actions == ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
    assert env.default_action == "go forward"
    assert all(v in env.actions for v in env.synonyms.values())
    assert env.synonyms["move forward"] == "go forward" and env.synonyms["use"] == "toggle"


@pytest.mark.parametrize("task", TASKS)
def test_seed_reproduces_layout_and_mission(task: str) -> None:
    env_a, env_b = BabyAITextEnv(task), BabyAITextEnv(task)
    obs_a, info_a = env_a.reset(seed=7)
    first = _layout(env_a)
    env_a.reset(seed=8)
    obs_a2, _ = env_a.reset(seed=7)
    obs_b, info_b = env_b.reset(seed=7)
    assert _layout(env_a) == first == _layout(env_b)
    assert obs_a.text == obs_a2.text == obs_b.text
    assert info_a["mission"] == info_b["mission"] == env_a.instructions.goal


@pytest.mark.parametrize("task", TASKS)
def test_max_steps_and_info(task: str) -> None:
    env = BabyAITextEnv(task)
    obs, info = env.reset(seed=3)
    assert info["max_steps"] == MAX_STEPS[task]
    assert isinstance(info["descriptions"], list) and isinstance(obs.text, str)
    assert env.unwrapped.width == (15 if task == "open" else 8)


@pytest.mark.parametrize("task", TASKS)
def test_missions_avoid_held_out_combinations(task: str) -> None:
    env = BabyAITextEnv(task)
    for seed in range(50):
        _, info = env.reset(seed=seed)
        assert not any(sub in info["mission"] for sub in HELD_OUT_SUBSTRINGS), info["mission"]


def test_mission_shapes() -> None:
    env = BabyAITextEnv("open")
    missions = {env.reset(seed=s)[1]["mission"] for s in range(30)}
    assert "open the door" in missions
    assert missions <= {"open the door"} | {f"open the {c} door" for c in ("yellow", "green", "blue", "purple")}
    env = BabyAITextEnv("pick_up_seq_go_to")
    missions = [env.reset(seed=s)[1]["mission"] for s in range(30)]
    assert any(", then go to " in m for m in missions) and any(" after you pick up " in m for m in missions)


def test_truncation_at_max_steps() -> None:
    env = BabyAITextEnv("goto", max_steps=5)
    env.reset(seed=0)
    results = [env.step("drop") for _ in range(5)]
    assert [r[3] for r in results] == [False] * 4 + [True]
    assert all(r[1] == 0.0 and not r[2] and not r[4]["success"] for r in results)


def test_step_reward_formula() -> None:
    env = BabyAITextEnv("goto")
    env.reset(seed=536)  # agent two cells from the blue ball, facing it
    env.step("turn left")
    env.step("turn right")
    _, reward, terminated, _, info = env.step("go forward")
    assert terminated and info["success"]
    assert reward == pytest.approx(1 - 0.9 * 3 / 64)


def test_bad_action_raises() -> None:
    env = BabyAITextEnv("goto")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="move forward.*turn left"):
        env.step("move forward")


def test_unknown_task_raises() -> None:
    with pytest.raises(ValueError, match="gotox.*pick_up_seq_go_to"):
        BabyAITextEnv("gotox")


def test_instructions() -> None:
    env = BabyAITextEnv("pickup")
    _, info = env.reset(seed=1)
    ins = env.instructions
    assert ins.goal == info["mission"]
    assert list(ins.actions) == env.actions
    assert ins.actions["pick up"] == "pick up the object one step in front of you"
    assert len(ins.tips) == 2 and "'toggle'" in ins.tips[0]


def test_optional_image() -> None:
    env = BabyAITextEnv("goto", image=True)
    obs, _ = env.reset(seed=0)
    assert obs.image is not None and obs.image.shape == (112, 112, 3)
    assert BabyAITextEnv("goto").reset(seed=0)[0].image is None


def test_no_rejection_noise(capsys: pytest.CaptureFixture[str]) -> None:
    env = BabyAITextEnv("putnext", num_dists=8)
    for seed in range(20):
        env.reset(seed=seed)
    assert "rejected" not in capsys.readouterr().out
