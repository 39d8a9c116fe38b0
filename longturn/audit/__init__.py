"""Auditing stored trajectories from the command line (`longturn audit`, `python -m
longturn.audit`): summary, episodes, show, gae, sql, plot, diff. One module per subcommand;
run_files finds and checks the Parquet files, so every damaged input is one named line."""
