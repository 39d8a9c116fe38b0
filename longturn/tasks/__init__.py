"""Tasks for the chat protocol: problems generated in code (no data download), their tools, rewards
and interactions."""
