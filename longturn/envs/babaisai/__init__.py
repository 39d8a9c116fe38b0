"""BabaIsAI (BALROG/Verlog text version) rebuilt from SPEC_babaisai.md as a longturn text env."""

from longturn.envs.babaisai.env import BabaIsAITextEnv
from longturn.envs.babaisai.levels import TASKS

__all__ = ["BabaIsAITextEnv", "TASKS"]
