"""BabyAI-Text (BALROG/Verlog `BabyAI-MixedTrainLocal-v0`) as a longturn text environment."""

from longturn.envs.babyai.env import BabyAITextEnv
from longturn.envs.babyai.level import TASKS

__all__ = ["BabyAITextEnv", "TASKS"]
