"""Tasks for sequence mode: problems generated in code (no data download), their tools, rewards
and interactions."""
