"""Prompt construction and the agent's history window."""
