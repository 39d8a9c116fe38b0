"""The audit's SQL sees the run's tables and nothing else: one SELECT, no writes, no other files.

Why: `longturn audit sql` runs text a user pastes (or a script builds), and a plain in-memory
DuckDB reads and writes any file (`COPY … TO`, `read_csv('/any/file')`, `EXPORT`), opens other
databases (`ATTACH`), runs several statements per call and downloads extensions. An audit only
reads, so DuckDB's own switches close all that once the views exist (lock_down), and the
statement check runs on DuckDB's parse of the text (statement count and type), not on strings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import duckdb
from duckdb import StatementType

from longturn.errors import UserError

# What each refused kind of statement would have done, for the one-line error.
_WHAT = {
    StatementType.COPY: "COPY (reads or writes files)",
    StatementType.COPY_DATABASE: "COPY (writes a database)",
    StatementType.EXPORT: "EXPORT (writes files)",
    StatementType.ATTACH: "ATTACH (opens another database)",
    StatementType.DETACH: "DETACH",
    StatementType.LOAD: "INSTALL/LOAD (extensions)",
    StatementType.EXTENSION: "extension statements",
    StatementType.SET: "SET (changes settings)",
    StatementType.VARIABLE_SET: "SET (changes settings)",
    StatementType.EXPLAIN: "EXPLAIN (EXPLAIN ANALYZE runs its statement)",
    StatementType.MULTI: "a statement that runs several (PIVOT without an IN list; name the values: "
                         "PIVOT turns ON col IN (…))",
}


class SqlNotAllowed(UserError):
    """The query asks for more than reading the run: a write, another file or database, an
    extension, a setting, or several statements."""


def quote_literal(path: Path | str) -> str:
    """`path` as a DuckDB string literal."""
    return "'" + str(path).replace("'", "''") + "'"


def lock_down(con: duckdb.DuckDBPyConnection, readable: Iterable[Path], spill_dir: Path) -> None:
    """Call after the views exist: from now on only `readable` files can be read, nothing is
    written, no extension is installed or loaded, and no `SET` can undo this. A query larger than
    memory spills to `spill_dir` (DuckDB's default is `.tmp` in the current directory); it is set
    first, as DuckDB refuses to move it once external access is off."""
    paths = ", ".join(quote_literal(p) for p in readable)
    for setting in (f"SET temp_directory = {quote_literal(spill_dir)}",
                    f"SET allowed_paths = [{paths}]",
                    "SET enable_external_access = false",
                    "SET autoinstall_known_extensions = false",
                    "SET autoload_known_extensions = false",
                    "SET lock_configuration = true"):
        con.execute(setting)


def require_one_select(con: duckdb.DuckDBPyConnection, sql: str, views: str) -> None:
    """Raise SqlNotAllowed unless `sql` parses to exactly one SELECT (CTEs, DESCRIBE, SUMMARIZE,
    PIVOT … IN (…) parse as SELECT too). A syntax error propagates as DuckDB's own error."""
    statements = con.extract_statements(sql)
    allowed = f"the audit's SQL is one read-only SELECT over the views {views}"
    if not statements:
        raise SqlNotAllowed(f"sql: the query is empty; {allowed}")
    if len(statements) > 1:
        raise SqlNotAllowed(f"sql: {len(statements)} statements are not allowed in one call; "
                            f"{allowed}")
    kind = statements[0].type
    if kind != StatementType.SELECT:
        what = _WHAT.get(kind, f"a {kind.name} statement")
        raise SqlNotAllowed(f"sql: {what} is not allowed; {allowed}")
