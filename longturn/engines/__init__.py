"""Token-in/token-out generation engines."""
