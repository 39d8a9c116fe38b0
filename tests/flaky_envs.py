"""Plug-in envs for the env-failure tests (`env.name: flaky_envs:FlakyCorridor`): a corridor text
env that raises or hangs where it is told to, and a plain gymnasium corridor for the adapter.

Every observation names the process it was made in, so a test can see a worker being replaced.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from longturn.envs.base import Instructions, Observation


class FlakyCorridor:
    """Walk right to the end of a corridor. `hang_on_step` / `raise_on_step`: the n-th step
    (1-based) this env object takes since it was built hangs for `hang_s` seconds / raises;
    `raise_on_reset` and `hang_on_reset`: seeds whose reset raises / hangs (`"all"`: every seed);
    `raise_on_first_resets`: the first n resets of each seed in this process raise (a restarted
    env is a new object: the count is the class's)."""

    name = "flaky"
    calls_in_this_process = 0  # every FlakyCorridor's resets and steps here (a worker: its own)
    resets_of_seed: dict[int | None, int] = {}  # in this process, for `raise_on_first_resets`
    actions = ["left", "right"]
    default_action = "right"
    synonyms = {"forward": "right", "back": "left"}

    def __init__(self, task: str = "corridor", length: int = 6, hang_on_step: int | None = None,
                 raise_on_step: int | None = None, raise_on_reset: list[int] | str = (),
                 hang_on_reset: list[int] | str = (), hang_s: float = 60.0,
                 raise_on_first_resets: int = 0):
        self.task, self.length, self.hang_s = task, length, hang_s
        self.hang_on_step, self.raise_on_step = hang_on_step, raise_on_step
        self.raise_on_reset, self.hang_on_reset = raise_on_reset, hang_on_reset
        self.raise_on_first_resets = raise_on_first_resets
        self.steps_taken = 0
        self.position = 0

    @property
    def instructions(self) -> Instructions:
        return Instructions(goal="reach the end of the corridor",
                            actions={"left": "step back", "right": "step towards the end"})

    def _obs(self) -> Observation:
        return Observation(f"You are {self.length - self.position} steps from the end "
                           f"(process {os.getpid()}).")

    @staticmethod
    def _hit(rule: list[int] | str, seed: int | None) -> bool:
        return rule == "all" or (seed is not None and seed in rule)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        FlakyCorridor.calls_in_this_process += 1
        resets = FlakyCorridor.resets_of_seed[seed] = FlakyCorridor.resets_of_seed.get(seed, 0) + 1
        if self._hit(self.raise_on_reset, seed) or resets <= self.raise_on_first_resets:
            raise RuntimeError(f"reset of seed {seed} is broken")
        if self._hit(self.hang_on_reset, seed):
            time.sleep(self.hang_s)
        self.position = (seed or 0) % 2
        return self._obs(), {}

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        self.steps_taken += 1
        FlakyCorridor.calls_in_this_process += 1
        if self.steps_taken == self.raise_on_step:
            raise RuntimeError(f"step {self.steps_taken} is broken")
        if self.steps_taken == self.hang_on_step:
            time.sleep(self.hang_s)
        self.position = max(0, self.position + (1 if action == "right" else -1))
        won = self.position >= self.length
        return self._obs(), float(won), won, False, {"success": won}

    def close(self) -> None:
        pass


class GymCorridor(gym.Env):
    """Walk east to the exit of a corridor."""

    metadata = {"render_modes": ["ansi", "rgb_array"]}
    action_names = ["west", "east"]
    action_descriptions = {"west": "one step back", "east": "one step towards the exit"}

    def __init__(self, length: int = 4, render_mode: str | None = None, text_obs: bool = True):
        self.length, self.render_mode, self.text_obs = length, render_mode, text_obs
        self.action_space = spaces.Discrete(2)
        self.observation_space = (spaces.Text(200) if text_obs
                                  else spaces.Box(0, length, shape=(1,), dtype=int))
        self.position = 0

    def _text(self) -> str:
        return f"The exit is {self.length - self.position} steps east."

    def _raw(self) -> Any:
        if self.text_obs:
            return {"text": self._text(), "position": self.position}
        return [self.position]

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(0, 2))
        return self._raw(), {}

    def step(self, action: int):
        self.position = max(0, self.position + (1 if int(action) == 1 else -1))
        done = self.position >= self.length
        return self._raw(), float(done), done, False, {"is_success": done}

    def render(self) -> Any:
        if self.render_mode == "ansi":
            return self._text()
        if self.render_mode == "rgb_array":
            import numpy as np

            frame = np.zeros((4, 4 * self.length, 3), dtype=np.uint8)
            frame[:, 4 * min(self.position, self.length - 1):, 0] = 255
            return frame
        return None


class GymShout(gym.Env):
    """Say the magic word."""

    action_space = spaces.Text(12, charset="abcdefghijklmnopqrstuvwxyz ")
    observation_space = spaces.Text(100)
    goal = "say the magic word"
    default_action = "hello"

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return "A door with a mouth.", {}

    def step(self, action: str):
        won = action == "open sesame"
        return ("The door opens." if won else f"The door heard {action!r}."), float(won), won, \
            False, {"success": won}
