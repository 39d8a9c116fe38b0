"""BabyAI-Text as a longturn `TextEnv`: MixedTrainLocal levels, described in English, driven by action names.

Mirrors BALROG/Verlog's language wrapper (SPEC_babyai_text.md §5, §8) but keeps rewards raw:
binarisation and format penalties belong to the training code, not the env.
"""

from __future__ import annotations

from typing import Any

from longturn.envs.babyai.describe import describe, observation_text
from longturn.envs.babyai.level import TASKS, MixedTrainLocalLevel
from longturn.envs.base import Instructions, Observation
from longturn.envs.synonyms import load_synonyms
from longturn.errors import SettingError

# Language action -> Verlog description; the index in this order is the minigrid action int.
ACTION_DESCRIPTIONS: dict[str, str] = {
    "turn left": "turn to the left",
    "turn right": "turn to the right",
    "go forward": "take one step forward",
    "pick up": "pick up the object one step in front of you",
    "drop": "drop the object that you are holding",
    "toggle": "manipulate the object one step in front of you",
}

# Made-up but possible observations that show the answer format and how the relative directions in
# an observation map to turns. With a single go-forward example, SmolLM2-135M turned on 4% of
# zero-shot goto turns and reached 4 of 32 goals; with these three (and "go left" read as a turn),
# on 37% and 9 of 32 (32-turn limit).
DEMONSTRATIONS = (
    ("go to the blue box",
     "a wall 3 steps forward\na blue box 2 steps left and 1 step forward",
     "THINK: The blue box is to my left, so I turn left to face it.\nACTION: turn left"),
    ("go to the red ball",
     "a wall 2 steps left\na red ball 3 steps forward",
     "THINK: The red ball is straight ahead, so I go forward.\nACTION: go forward"),
    ("go to the green key",
     "a wall 1 step forward\na green key 2 steps right",
     "THINK: The green key is to my right, so I turn right to face it.\nACTION: turn right"),
)

TIPS: tuple[str, ...] = (
    "Once the desired object you want to interact or pickup in front of you, "
    "you can use the 'toggle' action to interact with it.",
    "It doesn't make sense to repeat the same action over and over if the observation doesn't change.",
)


class BabyAITextEnv:
    """One MixedTrainLocal task kind; observations are the original BabyAI-Text lines."""

    name = "babyai"
    default_action = "go forward"

    def __init__(
        self,
        task: str,
        num_dists: int = 0,
        max_steps: int | None = None,
        image: bool = False,
    ) -> None:
        if task not in TASKS:
            raise SettingError(f"unknown BabyAI task {task!r}; valid tasks: {', '.join(TASKS)}")
        self.task = task
        self.actions: list[str] = list(ACTION_DESCRIPTIONS)
        self.synonyms: dict[str, str] = dict(load_synonyms(__package__))
        self.image = image
        self._level = MixedTrainLocalLevel(task, num_dists=num_dists, max_steps=max_steps)
        self._mission = ""
        self._started = False

    @property
    def unwrapped(self) -> MixedTrainLocalLevel:
        """The minigrid level (for bots, rendering and tests)."""
        return self._level

    @property
    def instructions(self) -> Instructions:
        return Instructions(goal=self._mission, actions=dict(ACTION_DESCRIPTIONS), tips=list(TIPS),
                            demonstrations=DEMONSTRATIONS)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        obs, _ = self._level.reset(seed=seed)
        self._mission = self._level.mission
        self._started = True
        lines = describe(self._level, obs["image"])
        info = {"mission": self._mission, "descriptions": lines, "max_steps": self._level.max_steps}
        return self._observation(lines), info

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if action not in ACTION_DESCRIPTIONS:
            raise ValueError(f"invalid BabyAI action {action!r}; allowed: {self.actions}")
        if not self._started:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, _ = self._level.step(self.actions.index(action))
        lines = describe(self._level, obs["image"])
        info = {
            "success": bool(terminated and reward > 0),
            "descriptions": lines,
            "mission": self._mission,
            "max_steps": self._level.max_steps,
            "step_count": self._level.step_count,
        }
        return self._observation(lines), float(reward), bool(terminated), bool(truncated), info

    def close(self) -> None:
        self._level.close()

    def _observation(self, lines: list[str]) -> Observation:
        image = self._level.get_pov_render(tile_size=16) if self.image else None
        return Observation(text=observation_text(lines), image=image)
