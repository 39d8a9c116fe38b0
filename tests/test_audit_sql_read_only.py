"""`longturn audit sql` reads the run and nothing else (issue 21).

Why: the audit runs SQL a user pastes. These are the probes that used to write files, read any
file, run several statements and try to download an extension; each must now be one line naming
what is not allowed, exit 2, with nothing written. Ordinary analytics must keep working. The run
is written here with pyarrow (no training), so the tests stay in the fast tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longturn.audit.cli import main
from longturn.audit.run_files import open_run
from longturn.audit import sql as audit_sql
from longturn.audit.read_only_sql import lock_down
from longturn.audit.sql import connect

LONGTURN = Path(sys.executable).parent / "longturn"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A train run (2 iterations × 2 ranks) and an eval dir with turns and episodes."""
    root = tmp_path_factory.mktemp("sql_runs")
    train = root / "train"
    for iteration in range(2):
        for rank in range(2):
            folder = train / f"trajectories/iteration={iteration:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({
                "iteration": [iteration] * 3,
                "episode_id": [f"train-r{rank}-e0-{iteration}"] * 2 + [f"train-r{rank}-e1-0"],
                "step": [0, 1, 0],
                "action": ["left", "forward", "forward"],
                "reward": [0.0, 1.0, 0.5],
            }), folder / f"part-{rank:02d}.parquet")
    evaluation = root / "eval"
    evaluation.mkdir()
    pq.write_table(pa.table({"episode_id": ["a", "a", "b"], "step": [0, 1, 0],
                             "reward": [0.0, 1.0, 0.0]}), evaluation / "turns.parquet")
    pq.write_table(pa.table({"episode_id": ["a", "b"], "success": [True, False]}),
                   evaluation / "episodes.parquet")
    (root / "secret.csv").write_text("token\nhunter2\n")
    pq.write_table(pa.table({"token": ["hunter2"]}), root / "other.parquet")
    return train, evaluation


def rows(capsys: pytest.CaptureFixture[str], sql: str, run: Path) -> list[dict]:
    code = main(["sql", sql, str(run), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def refused(capsys: pytest.CaptureFixture[str], sql: str, run: Path) -> str:
    code = main(["sql", sql, str(run)])
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    assert out.out == "" and out.err.count("\n") == 1 and "not allowed" in out.err, out.err
    return out.err


def test_writes_attach_extensions_settings_and_several_statements_are_refused(
        runs, capsys, tmp_path):
    train, _ = runs
    written = tmp_path / "out.csv"
    probes = {
        f"COPY (SELECT * FROM turns) TO '{written}'": "COPY",
        f"SELECT 1; COPY (SELECT 1) TO '{written}'": "2 statements",
        f"ATTACH '{tmp_path / 'x.db'}'; CREATE TABLE x.t AS SELECT 1": "2 statements",
        f"ATTACH '{tmp_path / 'x.db'}'": "ATTACH",
        "CREATE TABLE t AS SELECT * FROM turns": "CREATE",
        f"EXPORT DATABASE '{tmp_path / 'dump'}'": "EXPORT",
        "INSTALL httpfs": "INSTALL/LOAD",
        "LOAD httpfs": "INSTALL/LOAD",
        "SET enable_external_access = true": "SET",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{written}'": "EXPLAIN",
        "PIVOT turns ON action USING count(*)": "IN list",
    }
    for sql, named in probes.items():
        assert named in refused(capsys, sql, train), sql
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, nothing attached
    assert main(["sql", "  ;  ", str(train)]) == 2 and "query is empty" in capsys.readouterr().err


def test_files_outside_the_run_cannot_be_read(runs, capsys):
    train, _ = runs
    root = train.parent
    for sql in (f"SELECT * FROM read_csv('{root / 'secret.csv'}')",
                f"SELECT * FROM read_text('{root / 'secret.csv'}')",
                f"SELECT * FROM read_parquet('{root / 'other.parquet'}')",
                f"SELECT * FROM glob('{root}/*')"):
        err = refused(capsys, sql, train)
        assert "reading files other than the run's Parquet" in err and "hunter2" not in err, sql


def test_the_configuration_is_locked_after_the_views_exist(runs, tmp_path):
    train, _ = runs
    con = connect(open_run(train), tmp_path)
    try:
        with pytest.raises(Exception, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(Exception, match="disabled by configuration"):
            con.execute(f"COPY (SELECT 1) TO '{train.parent / 'direct.csv'}'")
    finally:
        con.close()
    assert not (train.parent / "direct.csv").exists()


def test_a_query_larger_than_memory_spills_to_a_temp_dir_that_is_removed(
        runs, capsys, tmp_path, monkeypatch):
    """DuckDB spills to `.tmp` in the current directory by default: a query must not write there
    (a file named `.tmp` in the way made the default spill fail), and the spill dir must be gone
    after the query."""
    train, _ = runs
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / ".tmp").write_text("the user's own file\n")
    monkeypatch.chdir(cwd)
    spill_dirs = []

    def small_memory(con, readable, spill_dir):  # a 50 MB limit makes a 1.5M-row sort spill
        spill_dirs.append(spill_dir)
        con.execute("SET memory_limit = '50MB'")
        con.execute("SET threads = 1")
        lock_down(con, readable, spill_dir)

    monkeypatch.setattr(audit_sql, "lock_down", small_memory)
    sql = ("SELECT count(*) AS n, max(h) AS top FROM (SELECT md5(i::VARCHAR) AS h "
           "FROM range(1500000) t(i) ORDER BY h)")
    assert rows(capsys, sql, train)[0]["n"] == 1500000
    assert [p.name for p in cwd.iterdir()] == [".tmp"]
    assert (cwd / ".tmp").read_text() == "the user's own file\n"
    assert len(spill_dirs) == 1 and not spill_dirs[0].exists()
    assert spill_dirs[0].parent == Path(tempfile.gettempdir())
    setting = rows(capsys, "SELECT current_setting('temp_directory') AS d", train)[0]["d"]
    assert Path(setting).name.startswith("longturn-audit-sql-") and not Path(setting).exists()


def test_ordinary_analytics_still_work(runs, capsys):
    train, evaluation = runs
    assert rows(capsys, "SELECT iteration, rank, count(*) AS n FROM turns GROUP BY ALL "
                        "ORDER BY ALL", train) == [
        {"iteration": i, "rank": r, "n": 3} for i in (0, 1) for r in (0, 1)]
    running = rows(capsys, "SELECT episode_id, step, sum(reward) OVER (PARTITION BY episode_id "
                           "ORDER BY step) AS so_far FROM turns WHERE rank = 0 AND iteration = 0 "
                           "ORDER BY episode_id, step", train)
    assert [r["so_far"] for r in running] == [0.0, 1.0, 0.5]
    assert rows(capsys, "WITH per AS (SELECT episode_id, sum(reward) AS ret FROM turns "
                        "GROUP BY ALL) SELECT e.success, sum(p.ret) AS ret FROM per p "
                        "JOIN episodes e USING (episode_id) GROUP BY ALL ORDER BY ALL",
                evaluation) == [{"success": False, "ret": 0.0}, {"success": True, "ret": 1.0}]
    assert rows(capsys, "PIVOT turns ON action IN ('left', 'forward') USING count(*) "
                        "GROUP BY iteration ORDER BY iteration", train) == [
        {"iteration": i, "left": 2, "forward": 4} for i in (0, 1)]
    described = rows(capsys, "DESCRIBE turns", train)
    assert [c["column_name"] for c in described][-1] == "rank"
    # the run's own files stay readable by name
    part = train / "trajectories/iteration=0001/part-01.parquet"
    assert rows(capsys, f"SELECT count(*) AS n FROM read_parquet('{part}')", train) == [{"n": 3}]


def test_the_console_script_exits_2_and_downloads_nothing(runs, tmp_path):
    train, _ = runs
    env = {**os.environ, "HOME": str(tmp_path)}  # where DuckDB would put extensions
    proc = subprocess.run([str(LONGTURN), "audit", "sql", "INSTALL httpfs", str(train)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "INSTALL/LOAD (extensions) is not allowed" in proc.stderr
    assert not (tmp_path / ".duckdb").exists()
