"""Stage scripts: one per pipeline stage, each a thin layer over the longturn library."""
