"""Stage final_eval: the zero-shot evaluation, run on the trained actor (data/eval/final)."""

from __future__ import annotations

import sys

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components import zero_shot_eval


def main(argv=None) -> int:
    defaults = ["--model-dir", "data/train/final", "--out", "data/eval/final",
                "--policy-version", "final"]
    return zero_shot_eval.main(defaults + list(sys.argv[1:] if argv is None else argv),
                               stage="final_eval")


if __name__ == "__main__":
    sys.exit(main())
