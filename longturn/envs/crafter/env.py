"""Crafter as a longturn `TextEnv`: the BALROG/Verlog text wrapper on a reproducible crafter 1.8.3.

Mirrors the reference wrappers (SPEC_crafter_text.md §1, §3, §6, §7) but keeps rewards raw:
format penalties belong to the training code. Variant "V" (Verlog, default) skips the sleeping
turns with random actions; variant "B" (BALROG main) lets the agent act while asleep.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from longturn.envs.base import Instructions, Observation
from longturn.envs.crafter.describe import (
    VARIANTS, Frame, compose_observation, long_term_context, short_term_context,
)
from longturn.envs.crafter.game import ReproducibleCrafter
from longturn.envs.crafter.instructions import crafter_instructions
from longturn.envs.crafter.vocabulary import ACHIEVEMENTS, ACTIONS, DEFAULT_ACTION
from longturn.envs.synonyms import load_synonyms
from longturn.errors import SettingError

TASKS = ("default",)


class CrafterTextEnv:
    """Crafter's open world in English; one episode lasts until death (or crafter's 10000 steps).

    `seed` is the world seed of the first `reset()` without a seed; `reset(seed=s)` builds the
    world `crafter.Env(seed=s)` builds first, and seeds the sleep loop's random actions, so an
    episode replays exactly from its seed and actions, in any process. `max_steps` (agent turns)
    optionally truncates episodes like BALROG's evaluation budget (2000 there)."""

    name = "crafter"
    default_action = DEFAULT_ACTION

    def __init__(
        self,
        task: str = "default",
        seed: int | None = None,
        variant: str = "V",
        max_steps: int | None = None,
        image: bool = False,
        length: int = 10000,
    ) -> None:
        if task not in TASKS:
            raise SettingError(f"unknown Crafter task {task!r}; valid tasks: {', '.join(TASKS)}")
        if variant not in VARIANTS:
            raise SettingError(f"unknown Crafter text variant {variant!r}; valid: {VARIANTS}")
        self.task = task
        self.variant = variant
        self.max_steps = max_steps
        self.image = image
        self.actions: list[str] = list(ACTIONS)
        self.synonyms: dict[str, str] = dict(load_synonyms(__package__))
        # the reference wrappers' construction (SPEC §1; `length` is crafter's default): 256x256
        # frames matter, as rendering after nightfall draws from the world RNG
        self._game = ReproducibleCrafter(area=(64, 64), view=(9, 9), size=(256, 256), reward=True,
                                         length=length, seed=seed)
        self._sleep_rng = np.random.RandomState(0)
        self._achievements: dict[str, int] | None = None
        self._turns = 0
        self._over = True

    @property
    def unwrapped(self) -> Any:
        """The crafter game (for tests and audits)."""
        return self._game

    @property
    def instructions(self) -> Instructions:
        return crafter_instructions(self._achievements)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """A new world, then one hidden `Noop` step whose reward is dropped (as the originals)."""
        if seed is not None:
            self._game.reseed(seed)
        self._game.reset()
        world_seed = hash((self._game.base_seed, self._game.episode)) % (2**31 - 1)
        self._sleep_rng = np.random.RandomState(world_seed)
        _, _, _, crafter_info = self._game.step(ACTIONS.index(DEFAULT_ACTION))
        self._achievements, self._turns, self._over = None, 0, False
        observation, info = self._observe(crafter_info, newly_unlocked=[], sleep_steps=0)
        info.update(seed=self._game.base_seed, episode=self._game.episode, world_seed=world_seed)
        return observation, info

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if action not in ACTIONS:
            raise ValueError(f"invalid Crafter action {action!r}; allowed: {self.actions}")
        if self._over:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        before = dict(self._game.player.achievements)
        _, reward, done, crafter_info = self._game.step(ACTIONS.index(action))
        sleep_steps = 0
        while self.variant == "V" and self._game.player.sleeping:
            # Verlog: sleeping turns are skipped with random actions; only the last reward counts
            _, reward, done, crafter_info = self._game.step(int(self._sleep_rng.randint(0, 17)))
            sleep_steps += 1
        self._turns += 1
        self._achievements = dict(crafter_info["achievements"])
        newly = [name for name in ACHIEVEMENTS
                 if before[name] == 0 and self._achievements[name] > 0]
        terminated = bool(done)
        truncated = (not terminated and self.max_steps is not None
                     and self._turns >= self.max_steps)
        self._over = terminated or truncated
        observation, info = self._observe(crafter_info, newly_unlocked=newly,
                                          sleep_steps=sleep_steps)
        return observation, float(reward), terminated, truncated, info

    def close(self) -> None:
        self._over = True

    def _observe(
        self, crafter_info: dict[str, Any], newly_unlocked: list[str], sleep_steps: int,
    ) -> tuple[Observation, dict[str, Any]]:
        """Text (and optional frame) of the current state, plus what an auditor wants to know.

        The 256x256 render happens every time, as in the reference wrappers: after nightfall it
        draws from the world RNG, so skipping it would change the game."""
        frame_image = self._game.render()
        player = self._game.player
        frame = Frame(
            semantic=crafter_info["semantic"],
            player_pos=(int(crafter_info["player_pos"][0]), int(crafter_info["player_pos"][1])),
            facing=(int(player.facing[0]), int(player.facing[1])),
            inventory=crafter_info["inventory"],
            sleeping=bool(player.sleeping),
            dead=bool(player.health <= 0),
        )
        achievements = dict(crafter_info["achievements"])
        # BALROG's score: how many achievements have been unlocked at least once (0..22)
        score = (sum(1 for count in achievements.values() if count > 0)
                 if self._achievements is not None else 0)
        long_term = long_term_context(frame, self.variant)
        short_term = short_term_context(frame.inventory)
        info = {
            "long_term_context": long_term,
            "short_term_context": short_term,
            "inventory": dict(crafter_info["inventory"]),
            "achievements": achievements,
            "newly_unlocked": newly_unlocked,
            "score": score,
            "progression": score / len(ACHIEVEMENTS),
            "sleeping": frame.sleeping,
            "dead": frame.dead,
            "player_pos": frame.player_pos,
            "player_facing": frame.facing,
            "sleep_steps": sleep_steps,
            "turn": self._turns,
            "crafter_step": self._game.step_count,
            "max_steps": self.max_steps,
            "variant": self.variant,
        }
        text = compose_observation(short_term, long_term)  # computed once, for info and text
        return Observation(text=text, image=frame_image if self.image else None), info
