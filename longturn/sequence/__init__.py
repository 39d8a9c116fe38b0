"""Sequence mode: an episode is one growing token sequence, as verl and slime train chat agents.

The model's sampled tokens are trained (loss mask 1); tool results, env observations and user
feedback are context (loss mask 0). New messages are appended as token deltas of the chat
template (`chat_deltas`), checked against a full re-rendering (`tokenization_check`); tools and
interactions are loaded from YAML (`tools`, `interactions`).
"""
