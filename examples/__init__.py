"""Worked examples of bringing your own code (importable as `examples.MODULE:OBJECT`)."""
