"""Text environments."""
