"""`sql "SELECT …" RUN_DIR`: DuckDB over the views `samples` (one row per sample, with `rank` from
`part-RR.parquet`), `turns` (one row per reply, as audit/replies.py reads them) and, for an
evaluation dir, `episodes`. Files are checked before DuckDB sees them, so a damaged one (or one of
schema version 1) is named. The views stay views (no copy of a large run); once they exist the
connection is locked down to reading those files only, one SELECT per call (audit/read_only_sql.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.read_only_sql import (SqlNotAllowed, lock_down, quote_literal,
                                        require_one_select)
from longturn.audit.replies import TOKEN_LISTS
from longturn.audit.run_files import Run, require_version, schema_of
from longturn.errors import UserError


class QueryError(UserError):
    """DuckDB rejected the query (syntax, an unknown column or table)."""


def connect(run: Run, spill_dir: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the run's views, able to read those files and nothing else; what
    does not fit in memory spills to `spill_dir`."""
    readable = [f.path for f in run.files]
    for path in readable:  # any Parquet reads; a file that says it is longturn's must be v2
        if b"longturn.schema_version" in (schema_of(path).metadata or {}):
            require_version(path)
    files = ", ".join(quote_literal(path) for path in readable)
    con = duckdb.connect(":memory:")
    con.execute(
        "CREATE VIEW samples AS SELECT * EXCLUDE (filename), "
        "CAST(coalesce(nullif(regexp_extract(filename, 'part-(\\d+)\\.parquet$', 1), ''), '0') "
        f"AS INTEGER) AS rank FROM read_parquet([{files}], filename = true, union_by_name = true, "
        "hive_partitioning = false)")
    con.execute(f"CREATE VIEW turns AS {_turns_select(con)}")
    if run.episodes_file is not None:
        schema_of(run.episodes_file)
        episodes = quote_literal(run.episodes_file)
        con.execute(f"CREATE VIEW episodes AS SELECT * FROM read_parquet({episodes})")
        readable.append(run.episodes_file)
    lock_down(con, readable, spill_dir)
    return con


def _turns_select(con: duckdb.DuckDBPyConnection) -> str:
    """One row per reply of `samples`: its row columns, the reply's fields, each per-token list
    cut to [start:end] (DuckDB lists are 1-based, both ends included), rank last. A Parquet file
    without `replies` (not a sample file) is read one row per row."""
    columns = [row[0] for row in con.execute("DESCRIBE samples").fetchall()]
    if "replies" not in columns:
        return "SELECT * FROM samples"
    cut = [c for c in TOKEN_LISTS if c in columns]
    kept = ", ".join(_quoted(c) for c in ("replies", "rank", *cut))
    slices = "".join(f', s.{_quoted(c)}[r."start" + 1 : r."end"] AS {_quoted(c)}' for c in cut)
    return (f"SELECT s.* EXCLUDE ({kept}), r.*{slices}, s.rank "
            "FROM samples AS s, UNNEST(s.replies) AS u(r)")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def query(run: Run, sql: str) -> Output:
    views = "turns, samples" + (", episodes" if run.episodes_file else "")
    # a fresh spill dir per query, removed after it: no `.tmp` left in the user's directory
    with tempfile.TemporaryDirectory(prefix="longturn-audit-sql-") as spill:
        con = connect(run, Path(spill))
        try:
            require_one_select(con, sql, views)
            frame: pd.DataFrame = con.execute(sql).df()
        except duckdb.Error as err:
            first = str(err).strip().splitlines()[0]
            if isinstance(err, duckdb.PermissionException):  # read_csv, glob, another Parquet
                raise SqlNotAllowed("sql: reading files other than the run's Parquet is not "
                                    f"allowed; read the views {views} ({first})") from None
            raise QueryError(f"sql: {first} (views: {views})") from None
        finally:
            con.close()
    return Output(table(frame), frame)
