"""`gae RUN_DIR`: recompute every file's advantages and returns from its own columns and the
estimator and discounts in its metadata, with the rule scoring used (docs/design.md §5, §5b:
algo/sample_scoring.audit_samples_file), window and packed samples alike; report the worst."""

from __future__ import annotations

import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.run_files import Run, SampleFile, require_columns
from longturn.errors import TrajectoryFileError
from longturn.trajectories import read_metadata

# what the recomputation reads; an evaluation file has the columns but no values in them
GAE_COLUMNS = ("values", "token_rewards", "loss_mask", "replies", "env_index", "episode_id",
               "iteration", "group_id", "advantages", "returns")


def _iteration(metadata: dict[str, str], sample_file: SampleFile) -> int | None:
    """From the file's metadata, else from its `iteration=NNNN` folder."""
    value = metadata.get("iteration") or sample_file.path.parent.name.removeprefix("iteration=")
    return int(value) if value.isdigit() else None


def audit_run(run: Run, tolerance: float) -> Output:
    # import torch only when asked
    from longturn.algo.sample_scoring import audit_samples_file
    from longturn.algo.scoring import GAE_METADATA_KEYS

    rows = []
    for sample_file in run.files:
        require_columns(sample_file.path, GAE_COLUMNS)
        metadata = read_metadata(sample_file.path)
        for key in GAE_METADATA_KEYS:
            if key not in metadata:
                raise TrajectoryFileError(
                    f"{sample_file.path}: metadata key 'longturn.{key}' is missing: not a scored "
                    "training file (evaluation samples carry no advantages)")
        try:
            error = audit_samples_file(sample_file.path)
        except (ValueError, TypeError, KeyError) as err:
            raise TrajectoryFileError(f"{sample_file.path}: cannot recompute advantages: "
                                      f"{err}") from None
        rows.append({"iteration": _iteration(metadata, sample_file), "rank": sample_file.rank,
                     "max_abs_error": error, "file": str(sample_file.path)})
    frame = pd.DataFrame(rows)
    worst = frame.loc[frame["max_abs_error"].idxmax()]
    ok = bool(worst["max_abs_error"] <= tolerance)
    verdict = "OK" if ok else "MISMATCH"
    text = "\n".join([
        table(frame.drop(columns="file").assign(
            max_abs_error=frame["max_abs_error"].map("{:.3g}".format))),
        f"worst |stored − recomputed| over advantages and returns: {worst['max_abs_error']:.3g} "
        f"(iteration {worst['iteration']}, rank {worst['rank']}: {worst['file']}) — {verdict} "
        f"at tolerance {tolerance:g}",
    ])
    data = {"worst": worst.to_dict(), "tolerance": tolerance, "ok": ok, "files": frame}
    return Output(text, data, status=0 if ok else 1)
