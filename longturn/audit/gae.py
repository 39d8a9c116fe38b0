"""`gae RUN_DIR`: recompute every file's advantages and returns from its own columns and the GAE
parameters in its metadata (longturn.algo.scoring.audit_gae, docs/design.md §5; sequence-mode files:
longturn.algo.sequence_scoring.audit_sequence_file); report the worst."""

from __future__ import annotations

import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.run_files import Run, TurnFile, require_columns
from longturn.audit.sequences import gae_columns
from longturn.errors import TrajectoryFileError
from longturn.trajectories import is_sequence_file, read_metadata

# what audit_gae reads; an evaluation file has the columns but no values in them
GAE_COLUMNS = ("values", "token_rewards", "next_value", "env_index", "step", "episode_id",
               "terminated", "aborted", "segment_end", "advantages", "returns")
DEFAULT_TOLERANCE = 1e-4


def _iteration(metadata: dict[str, str], turn_file: TurnFile) -> int | None:
    """From the file's metadata, else from its `iteration=NNNN` folder."""
    value = metadata.get("iteration") or turn_file.path.parent.name.removeprefix("iteration=")
    return int(value) if value.isdigit() else None


def audit_run(run: Run, tolerance: float = DEFAULT_TOLERANCE) -> Output:
    from longturn.algo.scoring import GAE_METADATA_KEYS, audit_gae  # imports torch: only when asked
    from longturn.algo.sequence_scoring import audit_sequence_file

    rows = []
    for turn_file in run.files:
        sequence = is_sequence_file(turn_file.path)  # one row per episode: its own recomputation
        metadata = read_metadata(turn_file.path)
        require_columns(turn_file.path, gae_columns(metadata) if sequence else GAE_COLUMNS)
        for key in GAE_METADATA_KEYS:
            if key not in metadata:
                raise TrajectoryFileError(
                    f"{turn_file.path}: metadata key 'longturn.{key}' is missing: not a scored "
                    "training file (evaluation turns carry no advantages)")
        try:
            error = (audit_sequence_file if sequence else audit_gae)(turn_file.path)
        except (ValueError, TypeError) as err:
            raise TrajectoryFileError(f"{turn_file.path}: cannot recompute GAE: {err}") from None
        rows.append({"iteration": _iteration(metadata, turn_file), "rank": turn_file.rank,
                     "max_abs_error": error, "file": str(turn_file.path)})
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
