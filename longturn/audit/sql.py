"""`sql "SELECT …" RUN_DIR`: DuckDB over the run's turn files.

Views: `turns` (every turn file, with a `rank` column from `part-RR.parquet`) and, for an
evaluation dir, `episodes`. Files are checked before DuckDB sees them, so a damaged one is named.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.run_files import Run, check_run, schema_of
from longturn.errors import UserError


class QueryError(UserError):
    """DuckDB rejected the query (syntax, an unknown column or table)."""


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def connect(run: Run) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the run's views."""
    check_run(run, ())
    files = ", ".join(_quote(f.path) for f in run.files)
    con = duckdb.connect(":memory:")
    con.execute(
        "CREATE VIEW turns AS SELECT * EXCLUDE (filename), "
        "CAST(coalesce(nullif(regexp_extract(filename, 'part-(\\d+)\\.parquet$', 1), ''), '0') "
        f"AS INTEGER) AS rank FROM read_parquet([{files}], filename = true, union_by_name = true, "
        "hive_partitioning = false)")
    if run.episodes_file is not None:
        schema_of(run.episodes_file)
        con.execute(f"CREATE VIEW episodes AS SELECT * FROM read_parquet({_quote(run.episodes_file)})")
    return con


def query(run: Run, sql: str) -> Output:
    con = connect(run)
    try:
        frame: pd.DataFrame = con.execute(sql).df()
    except duckdb.Error as err:
        first = str(err).strip().splitlines()[0]
        raise QueryError(f"sql: {first} (views: turns"
                         + (", episodes" if run.episodes_file else "") + ")") from None
    finally:
        con.close()
    return Output(table(frame), frame)
