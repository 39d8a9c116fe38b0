"""BabaIsAI as a longturn `TextEnv`: BALROG/Verlog's 40 tasks, text observations, action names.

Rewards stay raw (SPEC_babaisai.md §4); format penalties and binarisation belong to training code.
When the agent breaks every `... IS YOU` rule, the env resets to a new level of the same task (the
"cleaner port" of BALROG's quirk, §5.4) and prefixes the text with `YOU_LOST_NOTICE`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from longturn.envs.babaisai.describe import observation_text, rule_lines
from longturn.envs.babaisai.game import MAX_STEPS, BabaGame
from longturn.envs.babaisai.instructions import ACTION_DESCRIPTIONS, GOAL, TIPS
from longturn.envs.babaisai.levels import TASKS, generate_level
from longturn.envs.babaisai.placement import Level
from longturn.envs.base import Instructions, Observation
from longturn.envs.synonyms import load_synonyms
from longturn.errors import SettingError

YOU_LOST_NOTICE = "[...] IS YOU rule was broken, environment reset"


class BabaIsAITextEnv:
    """One BabaIsAI task; every reset draws a new level from the env's seeded numpy generator."""

    name = "babaisai"
    default_action = "idle"

    def __init__(
        self, task: str, max_steps: int = MAX_STEPS, add_ruleset: bool = True,
        truncation_as_termination: bool = True,
    ) -> None:
        if task not in TASKS:
            raise SettingError(f"unknown BabaIsAI task {task!r}; valid tasks: {', '.join(TASKS)}")
        self.task = task
        self.actions: list[str] = list(ACTION_DESCRIPTIONS)
        self.synonyms: dict[str, str] = dict(load_synonyms(__package__))
        self.max_steps = max_steps
        self.add_ruleset = add_ruleset
        # the original reports the step limit as `terminated`; False reports it as `truncated`
        self.truncation_as_termination = truncation_as_termination
        self._rng = np.random.default_rng()
        self._level: Level | None = None
        self._game: BabaGame | None = None

    @property
    def instructions(self) -> Instructions:
        return Instructions(goal=GOAL, actions=dict(ACTION_DESCRIPTIONS), tips=list(TIPS))

    @property
    def game(self) -> BabaGame:
        """The running engine (for solvers and tests)."""
        if self._game is None:
            raise RuntimeError("call reset() before using the env")
        return self._game

    @property
    def level(self) -> Level:
        if self._level is None:
            raise RuntimeError("call reset() before using the env")
        return self._level

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        return self.reset_to(generate_level(self.task, self._rng))

    def reset_to(self, level: Level) -> tuple[Observation, dict[str, Any]]:
        """Start an episode on a given level (custom layouts, tests)."""
        self._level = level
        self._game = BabaGame(level.grid.copy(), self.max_steps)
        text = observation_text(self._game.grid, self._game.rules, self.add_ruleset)
        if text is None:
            raise ValueError("the level has no YOU thing: nothing could ever move")
        return Observation(text=text), self._info(won=False, you_lost_reset=False)

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if action not in ACTION_DESCRIPTIONS:
            raise ValueError(f"invalid BabaIsAI action {action!r}; allowed: {self.actions}")
        game = self.game
        outcome = game.step(self.actions.index(action))
        text = observation_text(game.grid, game.rules, self.add_ruleset)
        you_lost = text is None
        if you_lost:  # a new level of the same task from the env's generator, after a notice
            text = YOU_LOST_NOTICE + "\n" + self.reset(seed=None)[0].text
        at_limit = outcome.done and not (outcome.won or outcome.lost)
        terminated = outcome.done and (self.truncation_as_termination or not at_limit)
        truncated = at_limit and not self.truncation_as_termination
        info = self._info(won=outcome.won, you_lost_reset=you_lost)
        info["step_limit_reached"] = at_limit
        # BALROG's score, set when the episode ends: 1.0 for a win
        info["progression"] = 1.0 if outcome.done and outcome.reward > 0 else 0.0
        return Observation(text=text), float(outcome.reward), terminated, truncated, info

    def close(self) -> None:
        self._game = None

    def _info(self, won: bool, you_lost_reset: bool) -> dict[str, Any]:
        game, level = self.game, self.level
        return {
            "task": self.task,
            "success": won,
            "rules": rule_lines(game.rules),
            "target_plan": level.target_plan,
            "win_object": level.win_object,
            "step_count": game.steps,
            "max_steps": game.max_steps,
            "you_lost_reset": you_lost_reset,
        }
