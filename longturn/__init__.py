"""longturn: multi-turn PPO for LLM agents on long, variable-length tasks."""

__version__ = "0.1.0"
