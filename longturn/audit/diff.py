"""`diff RUN_A RUN_B`: the first iteration (rank, sample) where the token ids of two runs differ.

Two runs from the same params and seed must store the same token ids sample for sample; where
they first part says which iteration (and rank's rollout) to look at. Whole samples are compared,
not replies: a differing tool result between a packed episode's replies is named by the reply
before it."""

from __future__ import annotations

from typing import Any

from longturn.audit.output import Output
from longturn.audit.run_files import Run, SampleFile, read_file, require_columns

TOKENS = ("prompt_ids", "response_ids")
CONTEXT = ("episode_id", "replies")


def _key(sample_file: SampleFile) -> tuple[int, int]:
    """(iteration, rank) of a file; an evaluation file is iteration 0."""
    name = sample_file.path.parent.name
    iteration = int(name.split("=", 1)[1]) if name.startswith("iteration=") else 0
    return iteration, sample_file.rank


def _turn_at(replies: list[dict[str, Any]] | None, column: str, token: int) -> int | None:
    """The episode turn of the reply holding response token `token`, or of the last reply
    before it (the context after it); the first reply's for a prompt token."""
    if not replies:
        return None
    before = [r for r in replies if r["start"] <= token] if column == "response_ids" else []
    return (before[-1] if before else replies[0])["turn"]


def _compare_files(a: SampleFile, b: SampleFile) -> dict[str, Any] | None:
    """The first differing row of two files, or None when their token ids match."""
    tables = []
    for sample_file in (a, b):
        require_columns(sample_file.path, (*TOKENS, *CONTEXT))
        tables.append(read_file(sample_file.path, [*TOKENS, *CONTEXT]))
    ta, tb = tables
    if ta.num_rows == tb.num_rows and all(ta.column(c).equals(tb.column(c)) for c in TOKENS):
        return None
    rows_a, rows_b = ta.to_pylist(), tb.to_pylist()
    for row, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        for column in TOKENS:
            if ra[column] != rb[column]:
                ids_a, ids_b = ra[column] or [], rb[column] or []
                token = next((k for k, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y),
                             min(len(ids_a), len(ids_b)))
                return {"row": row, "column": column, "episode_id": ra["episode_id"],
                        "turn": _turn_at(ra["replies"], column, token), "token": token,
                        "length_a": len(ids_a), "length_b": len(ids_b)}
    return {"row": min(len(rows_a), len(rows_b)), "column": "rows",
            "rows_a": len(rows_a), "rows_b": len(rows_b)}


def _describe(first: dict[str, Any]) -> str:
    where = f"iteration {first['iteration']}, rank {first['rank']}"
    if first["column"] == "file":
        return f"{where}: only in {first['only_in']}"
    if first["column"] == "rows":
        return (f"{where}: the first {first['row']} samples match, then RUN_A has "
                f"{first['rows_a']} samples and RUN_B {first['rows_b']}")
    return (f"{where}, sample {first['row']} (episode {first['episode_id']}, turn "
            f"{first['turn']}): {first['column']} differ at token {first['token']} (lengths "
            f"{first['length_a']} and {first['length_b']})")


def diff_runs(run_a: Run, run_b: Run) -> Output:
    files_a = {_key(f): f for f in run_a.files}
    files_b = {_key(f): f for f in run_b.files}
    compared = 0
    for key in sorted(files_a.keys() | files_b.keys()):
        iteration, rank = key
        if key not in files_a or key not in files_b:
            only = run_a.root if key in files_a else run_b.root
            first: dict[str, Any] | None = {"column": "file", "only_in": str(only)}
        else:
            first = _compare_files(files_a[key], files_b[key])
            compared += 1
        if first is not None:
            first = {"iteration": iteration, "rank": rank, **first}
            return Output(f"first difference: {_describe(first)}",
                          {"identical": False, "first_difference": first}, status=1)
    iterations = len({k[0] for k in files_a})
    return Output(f"identical: prompt_ids and response_ids match in all {compared} file(s) "
                  f"({iterations} iteration(s))",
                  {"identical": True, "files": compared, "iterations": iterations})
