"""`longturn audit` on a real toy training run and a real toy evaluation: every subcommand's
numbers checked against the Parquet files themselves, damaged inputs as one-line errors, and the
real entry points as subprocesses."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from components import zero_shot_eval
from longturn.audit.cli import main
from longturn.params.config import parse_params
from longturn.run.dvc_remote import find_repo_root
from longturn.run.eval_journal import PARTIAL, EvalJournal
from longturn.run.training import TrainPaths, run_training
from longturn.trajectories import TURN_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str):
    """3 iterations of 2 envs × 3 turns (episodes of at most 4 turns span iterations), with
    train.push on in a folder outside any DVC repository; returns (run dir, push warnings)."""
    root = tmp_path_factory.mktemp("audit_run")
    assert find_repo_root(root) is None  # otherwise the push would go somewhere real
    params = parse_params({
        "seed": 3, "model": {"source": tiny_model_dir, "dtype": "float32"},
        "env": {"tasks": ["goto"], "max_turns": 4},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 5, "temperature": 1.0}},
        "rollout": {"n_envs": 2, "turns_per_env": 3},
        "ppo": {"mini_batch_size": 6, "micro_batch_size": 3, "bf16": False, "lora": True},
        "train": {"iterations": 3, "checkpoint_every": 1, "keep_checkpoints": 1, "push": True},
    })
    model = Path(tiny_model_dir)
    paths = TrainPaths(base=model, critic=model, trajectories=root / "trajectories",
                       checkpoints=root / "checkpoints", final=root / "final",
                       live=root / "live", policy=root / "policy")
    handler = _Records()
    logging.getLogger("longturn.run.dvc_remote").addHandler(handler)
    try:
        run_training(params, paths, progress=False)
    finally:
        logging.getLogger("longturn.run.dvc_remote").removeHandler(handler)
    return root, handler.records


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    root = tmp_path_factory.mktemp("audit_eval")
    params = {"seed": 3, "model": {"source": tiny_model_dir, "dtype": "float32"},
              "env": {"tasks": ["goto"], "max_turns": 3},
              "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 5}},
              "eval": {"tasks": ["goto"], "episodes_per_task": 3, "parallel_envs": 3}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    out = root / "eval"
    assert zero_shot_eval.main(["--params", str(root / "params.yaml"), "--model-dir",
                                tiny_model_dir, "--out", str(out)]) == 0
    return out


def turns_of(run: Path) -> pd.DataFrame:
    parts = sorted(run.glob("trajectories/iteration=*/part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def audit_json(capsys: pytest.CaptureFixture[str], *args: str):
    code, out, err = audit(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_push_outside_a_dvc_repository_warns_once_and_training_completes(train_run):
    run, warnings = train_run
    assert len(warnings) == 1 and "not inside a DVC repository" in warnings[0].getMessage()
    assert len(list(run.glob("trajectories/iteration=*/part-00.parquet"))) == 3
    assert not (run / "pushed").exists()


def test_summary_matches_the_files(train_run, capsys):
    run, _ = train_run
    turns = turns_of(run)
    data = audit_json(capsys, "summary", str(run))
    assert data["iterations"] == [0, 1, 2] and data["ranks"] == [0] and data["tasks"] == ["goto"]
    overall = data["overall"]
    assert overall["turns"] == len(turns) == 18
    assert overall["episodes"] == turns["episode_id"].nunique()
    ended = turns[turns["terminated"] | turns["truncated"] | turns["aborted"]]
    assert overall["ended"] == len(ended) > 0  # max_turns 4 < 9 turns per env: time limits
    assert overall["time_limit"] == int((turns["truncated"] & ~turns["success"]).sum())
    assert overall["continues"] == len(turns) - len(ended)
    assert overall["valid_action_ratio"] == pytest.approx(turns["action_valid"].mean())
    assert overall["mean_reward"] == pytest.approx(turns["reward"].mean())
    assert [r["turns"] for r in data["per_iteration"]] == [6, 6, 6]
    assert data["per_rank"][0]["turns"] == 18
    code, text, _ = audit(capsys, "summary", str(run))
    assert code == 0 and "per rank:" in text and "termination reasons" in text


def test_episodes_table_and_filters(train_run, capsys):
    run, _ = train_run
    turns = turns_of(run)
    episodes = audit_json(capsys, "episodes", str(run))
    assert sorted(e["episode_id"] for e in episodes) == sorted(turns["episode_id"].unique())
    assert sum(e["length"] for e in episodes) == len(turns)
    by_id = {e["episode_id"]: e for e in episodes}
    for episode_id, group in turns.groupby("episode_id"):
        assert by_id[episode_id]["return"] == pytest.approx(group["reward"].sum(), abs=1e-5)
    in_first = audit_json(capsys, "episodes", str(run), "--iteration", "0")
    assert {e["episode_id"] for e in in_first} == set(turns[turns["iteration"] == 0]["episode_id"])
    long = audit_json(capsys, "episodes", str(run), "--min-length", "4")
    assert long and all(e["length"] >= 4 for e in long)
    assert audit_json(capsys, "episodes", str(run), "--task", "open") == []
    failed = audit_json(capsys, "episodes", str(run), "--success", "no")
    assert len(failed) == len(episodes) - sum(e["success"] for e in episodes)
    assert len(audit_json(capsys, "episodes", str(run), "--limit", "2")) == 2


def test_show_gives_the_turns_as_the_model_saw_them(train_run, capsys):
    run, _ = train_run
    turns = turns_of(run)
    episode_id = turns[turns["iteration"] == 1]["episode_id"].iloc[0]  # spans iterations 0 and 1
    stored = turns[turns["episode_id"] == episode_id].sort_values("turn")
    data = audit_json(capsys, "show", episode_id, str(run))
    assert [t["turn"] for t in data["turns"]] == list(stored["turn"])
    for shown, (_, row) in zip(data["turns"], stored.iterrows()):
        assert shown["prompt"] == row["prompt_text"] and shown["response"] == row["response_text"]
        assert shown["value"] == pytest.approx(row["values"][0])
        assert shown["advantage"] == pytest.approx(row["advantages"][0])
        assert shown["reward"] == pytest.approx(row["reward"])
    code, text, _ = audit(capsys, "show", episode_id, str(run))
    assert code == 0 and stored["prompt_text"].iloc[-1] in text and "advantage" in text
    code, _, err = audit(capsys, "show", "no-such-episode", str(run))
    assert code == 2 and "no-such-episode" in err


def test_gae_recomputes_each_file_and_catches_a_tampered_one(train_run, capsys, tmp_path):
    run, _ = train_run
    data = audit_json(capsys, "gae", str(run))
    assert data["ok"] and len(data["files"]) == 3 and data["worst"]["max_abs_error"] < 1e-4
    tampered = tmp_path / "tampered"
    shutil.copytree(run / "trajectories", tampered / "trajectories")
    part = tampered / "trajectories/iteration=0001/part-00.parquet"
    table = pq.read_table(part)  # keeps the file's metadata (the GAE parameters)
    advantages = table.column("advantages").to_pylist()
    advantages[4] = [a + 0.5 for a in advantages[4]]
    column = pa.array(advantages, type=table.schema.field("advantages").type)
    pq.write_table(table.set_column(table.schema.get_field_index("advantages"), "advantages",
                                    column), part)
    code, out, _ = audit(capsys, "gae", str(tampered))
    assert code == 1 and "MISMATCH" in out and "iteration=0001" in out


def test_sql_over_the_turns(train_run, capsys):
    run, _ = train_run
    rows = audit_json(capsys, "sql", "SELECT iteration, rank, count(*) AS n, "
                      "sum(len(response_ids)) AS tokens FROM turns GROUP BY ALL ORDER BY 1", str(run))
    turns = turns_of(run)
    assert [(r["iteration"], r["rank"], r["n"]) for r in rows] == [(0, 0, 6), (1, 0, 6), (2, 0, 6)]
    assert sum(r["tokens"] for r in rows) == sum(len(r) for r in turns["response_ids"])
    code, _, err = audit(capsys, "sql", "SELECT no_such_column FROM turns", str(run))
    assert code == 2 and err.count("\n") == 1 and "no_such_column" in err


def test_plot_writes_pngs(train_run, capsys, tmp_path):
    run, _ = train_run
    data = audit_json(capsys, "plot", str(run), "--out", str(tmp_path / "plots"))
    names = sorted(Path(p).name for p in data["written"])
    assert names == ["action_mix.png", "advantages.png", "returns.png"]
    for name in names:
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG_MAGIC


def test_diff_finds_the_first_differing_turn(train_run, capsys, tmp_path):
    run, _ = train_run
    copy = tmp_path / "copy"
    shutil.copytree(run / "trajectories", copy / "trajectories")
    data = audit_json(capsys, "diff", str(run), str(copy))
    assert data["identical"] and data["files"] == 3
    part = copy / "trajectories/iteration=0001/part-00.parquet"
    table = pq.read_table(part)
    ids = table.column("response_ids").to_pylist()
    ids[2] = ids[2][:1] + [ids[2][1] + 1] + ids[2][2:]
    column = pa.array(ids, type=table.schema.field("response_ids").type)
    pq.write_table(table.set_column(table.schema.get_field_index("response_ids"), "response_ids",
                                    column), part)
    code, out, _ = audit(capsys, "diff", str(run), str(copy), "--json")
    first = json.loads(out)["first_difference"]
    assert code == 1
    assert (first["iteration"], first["rank"], first["row"], first["column"], first["token"]) == (
        1, 0, 2, "response_ids", 1)
    shutil.rmtree(copy / "trajectories/iteration=0002")
    code, out, _ = audit(capsys, "diff", str(run), str(run / "trajectories/iteration=0000"))
    assert code == 1 and "iteration 1, rank 0: only in" in out


def test_an_evaluation_dir(eval_run, capsys):
    episodes = pd.read_parquet(eval_run / "episodes.parquet")
    data = audit_json(capsys, "summary", str(eval_run))
    assert data["kind"] == "eval" and data["overall"]["turns"] == episodes["length"].sum()
    assert data["overall"]["ended"] == len(episodes)
    listed = audit_json(capsys, "episodes", str(eval_run))
    assert {(e["episode_id"], e["length"]) for e in listed} == set(
        zip(episodes["episode_id"], episodes["length"]))
    rows = audit_json(capsys, "sql", "SELECT count(*) AS n FROM episodes", str(eval_run))
    assert rows == [{"n": len(episodes)}]
    code, _, err = audit(capsys, "gae", str(eval_run))
    assert code == 2 and "turns.parquet" in err and "gamma_step" in err


def test_an_evaluation_that_died_is_read_from_its_journal(eval_run, tmp_path, capsys):
    """Killed after two episodes: the audit reads the journal's parts (a part whose episode
    file was never written does not count)."""
    turns = pq.read_table(eval_run / "turns.parquet").to_pylist()
    episodes = pq.read_table(eval_run / "episodes.parquet").to_pylist()
    journal = EvalJournal.open(tmp_path, {"key": "k"}, TURN_SCHEMA, {})
    for episode in episodes[:2]:
        journal.add(episode, [t for t in turns if t["episode_id"] == episode["episode_id"]])
    (tmp_path / PARTIAL / "part-00002.turns.parquet").write_bytes(b"killed before its episodes")
    data = audit_json(capsys, "summary", str(tmp_path))
    assert data["kind"] == "eval" and data["files"] == 2
    assert data["overall"]["ended"] == 2
    assert data["overall"]["turns"] == sum(e["length"] for e in episodes[:2])


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_real_entry_points(train_run, tmp_path):
    run, _ = train_run
    proc = run_module("longturn.audit", "summary", str(run))
    assert proc.returncode == 0, proc.stderr
    assert "iterations: 3 (0..2)" in proc.stdout
    proc = run_module("longturn.cli", "audit", "diff", str(run), str(run / "trajectories"))
    assert proc.returncode == 0 and proc.stdout.startswith("identical"), proc.stderr
    # the console script `longturn` is longturn.cli:main
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["longturn"] == "longturn.cli:main"


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_damaged_inputs_are_one_named_line(train_run, tmp_path):
    run, _ = train_run
    source = run / "trajectories/iteration=0001/part-00.parquet"
    truncated = tmp_path / "truncated"
    shutil.copytree(run / "trajectories", truncated / "trajectories")
    bad = truncated / "trajectories/iteration=0001/part-00.parquet"
    bad.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    err = one_line_error(run_module("longturn.audit", "summary", str(truncated)))
    assert str(bad) in err and "truncated" in err
    for args in (["gae", str(truncated)], ["sql", "SELECT 1 FROM turns", str(truncated)],
                 ["diff", str(run), str(truncated)]):
        code = main(args)
        assert code == 2

    foreign = tmp_path / "foreign"
    shutil.copytree(run / "trajectories", foreign / "trajectories")
    part = foreign / "trajectories/iteration=0002/part-00.parquet"
    pq.write_table(pq.read_table(part).drop_columns(["reward"]), part)
    err = one_line_error(run_module("longturn.audit", "episodes", str(foreign)))
    assert str(part) in err and "'reward'" in err

    err = one_line_error(run_module("longturn.audit", "summary", str(tmp_path / "missing")))
    assert str(tmp_path / "missing") in err
    (tmp_path / "empty").mkdir()
    err = one_line_error(run_module("longturn.audit", "summary", str(tmp_path / "empty")))
    assert "no turn Parquet files" in err
