"""Crafter (BALROG/Verlog text wrapper on PyPI crafter 1.8.3) as a longturn text environment."""

from longturn.envs.crafter.env import TASKS, CrafterTextEnv

__all__ = ["CrafterTextEnv", "TASKS"]
