"""The parts of bench/house_parity.py: which code runs (trees), what it runs (cases, runs), and
how two runs' outputs are put side by side (normalize, compare).

Nothing here imports longturn: the tool compares two versions of it, so it may only speak to them
through their stage command lines and read what they write (Parquet, safetensors, YAML).
"""


class ParityError(Exception):
    """The comparison could not be made (a revision, a tree, a stage, a file): exit 2."""
