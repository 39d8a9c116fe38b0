"""`longturn audit` on window samples (one reply each): a fixed-turn run of two ranks played by a
script (episodes that span iterations, time limits, a success, a failure, invalid actions),
converted with sample_from_turn, scored with the rule training uses (sample_advantages) and
written with write_samples; an evaluation dir and its journal beside it. Every subcommand's
numbers are checked against the rows themselves, damaged inputs as one-line errors, and the real
entry points as subprocesses. No model: the files are what the trainer writes, built by hand."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longturn.algo.gae import GAEParams
from longturn.algo.reply_chains import ADVANTAGE_INPUTS, sample_advantages
from longturn.audit.cli import main
from turn_rows import sample_from_turn
from longturn.run.eval_journal import PARTIAL, EvalJournal
from longturn.trajectories import (SAMPLE_SCHEMA, SCHEMA_VERSION, V1_SCHEMA_VERSION, file_metadata,
                                   rows_table, write_arrow, write_episodes, write_samples)
from longturn.vision.frames import to_png

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GAE = {"gamma_step": 0.9, "lambda_step": 0.95, "gamma_token": 1.0, "lambda_token": 1.0}
ALGO = {"advantage": "gae", "group_size": 1, "norm_std": True, "step_weight": 1.0}
ITERATIONS, SLOTS, TURNS_PER_ENV = 3, 2, 3
# per slot, the episodes it plays in order: (length, how the last turn ends); the last one runs on
SCRIPT = {0: [(4, "time_limit"), (4, "time_limit"), (4, None)],
          1: [(2, "success"), (3, "failure"), (4, "time_limit")]}
PENALTY = 0.1


def _ending(reason: str | None) -> dict[str, Any]:
    return {"terminated": reason in ("success", "failure"), "truncated": reason == "time_limit",
            "success": reason == "success", "aborted": False, "termination": reason}


def play(rank: int, rng: np.random.Generator) -> dict[int, list[dict[str, Any]]]:
    """One rank's turn rows by iteration, in lock-step order (step, then slot), as the collector
    writes them: values, token rewards and next_value filled like scoring does."""
    turns: dict[int, list[dict[str, Any]]] = {i: [] for i in range(ITERATIONS)}
    for slot, episodes in SCRIPT.items():
        played = [(n, t, length, end) for n, (length, end) in enumerate(episodes)
                  for t in range(length)][:ITERATIONS * TURNS_PER_ENV]
        for k, (n, t, length, end) in enumerate(played):
            iteration, step = divmod(k, TURNS_PER_ENV)
            last = t == length - 1 and end is not None
            valid = (t + slot + n) % 3 != 2
            action = "forward" if valid else "left"
            size = 3 + (k % 2)
            env_reward = 1.0 if last and end == "success" else 0.0
            reward = env_reward - (0.0 if valid else PENALTY)
            values = rng.normal(size=size).astype(np.float32)
            token_rewards = rng.normal(scale=0.01, size=size).astype(np.float32)
            token_rewards[-1] += reward
            turns[iteration].append({
                "run_id": "test", "policy_version": f"p{iteration}", "iteration": iteration,
                "env_index": slot, "env_name": "babyai", "task": "goto",
                "episode_id": f"train-r{rank}-e{slot}-{n}",
                "episode_seed": 100 * rank + 10 * slot + n,
                "turn": t, "step": step,
                "prompt_ids": [1, 10 + slot, 20 + t, 30 + n, 40 + rank],
                "response_ids": [200 + k * 4 + j for j in range(size)],
                "prompt_text": f"OBSERVATION r{rank} slot {slot} episode {n} turn {t}",
                "response_text": f"THINK: turn {t} of {n}. ACTION: {'go' if valid else 'jump'}",
                "raw_action": "go" if valid else "jump", "action": action, "action_valid": valid,
                "action_failure": None if valid else "unknown action",
                "env_reward": env_reward, "reward": reward, **_ending(end if last else None),
                "segment_end": step == TURNS_PER_ENV - 1, "finish_reason": "stop",
                "history_dropped": 0, "engine_logprobs": [-0.5] * size,
                "old_logprobs": [-0.5] * size, "ref_logprobs": [-0.5] * size,
                "values": values.tolist(), "token_rewards": token_rewards.tolist(),
                "observation": f"slot {slot} turn {t}",
            })
    for rows in turns.values():
        rows.sort(key=lambda r: (r["step"], r["env_index"]))
        for row in rows:
            after = [r for r in rows if r["env_index"] == row["env_index"]
                     and r["step"] == row["step"] + 1 and r["episode_id"] == row["episode_id"]]
            if row["terminated"]:
                row["next_value"] = 0.0
            elif after:
                row["next_value"] = after[0]["values"][0]
            else:  # cut by the batch or the time limit: the critic's value of what follows
                row["next_value"] = float(rng.normal())
                row["bootstrap_prompt_ids"] = [1, 99]
    return turns


def score(samples: list[dict[str, Any]]) -> None:
    """Advantages and returns as scoring fills them (one rule: algo/reply_chains.py)."""
    columns = {k: [s[k] for s in samples] for k in ADVANTAGE_INPUTS}
    advantages, returns = sample_advantages(columns, GAEParams(**GAE), None)
    for sample, a, r in zip(samples, advantages, returns):
        sample["advantages"] = a.astype(np.float32).tolist()
        sample["returns"] = r.astype(np.float32).tolist()


def write_run(root: Path) -> None:
    rng = np.random.default_rng(3)
    for rank in (0, 1):
        for iteration, rows in play(rank, rng).items():
            samples = [sample_from_turn(r) for r in rows]
            score(samples)
            write_samples(samples, root / f"trajectories/iteration={iteration:04d}/"
                                          f"part-{rank:02d}.parquet",
                          {**GAE, "algo": ALGO, "model": "none", "engine": "hf",
                           "iteration": iteration})


def write_eval(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Three evaluation episodes (a success, a failure, a time limit), unscored; returns the
    samples and the episode rows."""
    samples, episodes = [], []
    for n, (length, end) in enumerate([(2, "success"), (1, "failure"), (3, "time_limit")]):
        rewards = []
        for t in range(length):
            last = t == length - 1
            reward = 1.0 if last and end == "success" else 0.0
            rewards.append(reward)
            samples.append(sample_from_turn({
                "run_id": "eval", "policy_version": "final", "iteration": 0, "env_index": n,
                "env_name": "babyai", "task": "goto", "episode_id": f"eval-goto-{n}",
                "episode_seed": n, "turn": t, "step": t, "prompt_ids": [1, 2, t],
                "response_ids": [5, 6, n], "prompt_text": f"eval {n} {t}",
                "response_text": "THINK: x. ACTION: forward", "action": "forward",
                "action_valid": True, "env_reward": reward, "reward": reward,
                **_ending(end if last else None), "engine_logprobs": [-0.1] * 3}))
        episodes.append({"run_id": "eval", "policy_version": "final", "env_name": "babyai",
                         "task": "goto", "episode_id": f"eval-goto-{n}", "episode_seed": n,
                         "success": end == "success", "return": sum(rewards),
                         "env_return": sum(rewards), "length": length, "valid_actions": length,
                         "valid_action_ratio": 1.0, **{k: v for k, v in _ending(end).items()
                                                       if k != "success"}})
    write_samples(samples, out / "turns.parquet", {"policy_version": "final"})
    write_episodes(episodes, out / "episodes.parquet", {"policy_version": "final"})
    return samples, episodes


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("audit_run")
    write_run(root)
    return root


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit_eval") / "eval"
    write_eval(out)
    return out


def turns_of(run: Path) -> pd.DataFrame:
    """The replies as plain rows (each window sample has one), with the file's rank."""
    rows = []
    for part in sorted(run.glob("trajectories/iteration=*/part-*.parquet")):
        for sample in pq.read_table(part).to_pylist():
            (reply,) = sample["replies"]
            rows.append({**sample, **reply, "rank": int(part.stem.split("-")[1])})
    return pd.DataFrame(rows)


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def audit_json(capsys: pytest.CaptureFixture[str], *args: str):
    code, out, err = audit(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_files_are_window_samples(train_run):
    part = train_run / "trajectories/iteration=0001/part-00.parquet"
    meta = pq.read_schema(part).metadata
    assert meta[b"longturn.schema_version"] == SCHEMA_VERSION.encode()
    assert pq.read_table(part).column("replies").to_pylist()[0][0]["turn"] is not None
    assert len(list(train_run.glob("trajectories/iteration=*/part-*.parquet"))) == 6


def test_summary_matches_the_files(train_run, capsys):
    turns = turns_of(train_run)
    data = audit_json(capsys, "summary", str(train_run))
    assert data["iterations"] == [0, 1, 2] and data["ranks"] == [0, 1] and data["tasks"] == ["goto"]
    overall = data["overall"]
    assert overall["turns"] == overall["samples"] == len(turns) == 36
    assert overall["episodes"] == turns["episode_id"].nunique() == 12
    ended = turns[turns["terminated"] | turns["truncated"] | turns["aborted"]]
    assert overall["ended"] == len(ended) == 10
    assert overall["time_limit"] == int((turns["truncated"] & ~turns["success"]).sum()) == 6
    assert (overall["success"], overall["failure"], overall["successes"]) == (2, 2, 2)
    assert overall["success_rate"] == pytest.approx(2 / 10)
    assert overall["continues"] == len(turns) - len(ended)
    assert overall["valid_action_ratio"] == pytest.approx(turns["action_valid"].mean())
    assert 0 < overall["valid_action_ratio"] < 1
    assert overall["mean_reward"] == pytest.approx(turns["reward"].mean())
    assert "tool_calls" not in overall and data["tokenization_check"] == {}
    assert [r["turns"] for r in data["per_iteration"]] == [12, 12, 12]
    assert [(r["rank"], r["turns"]) for r in data["per_rank"]] == [(0, 18), (1, 18)]
    code, text, _ = audit(capsys, "summary", str(train_run))
    assert code == 0 and "per rank:" in text and "termination reasons (turns)" in text
    assert "success: 2/10 episodes that ended on their own (0.200)" in text
    assert "tool calls" not in text


def test_episodes_table_and_filters(train_run, capsys):
    turns = turns_of(train_run)
    episodes = audit_json(capsys, "episodes", str(train_run))
    assert sorted(e["episode_id"] for e in episodes) == sorted(turns["episode_id"].unique())
    assert sum(e["length"] for e in episodes) == len(turns)
    by_id = {e["episode_id"]: e for e in episodes}
    for episode_id, group in turns.groupby("episode_id"):
        assert by_id[episode_id]["return"] == pytest.approx(group["reward"].sum(), abs=1e-5)
        assert by_id[episode_id]["valid_action_ratio"] == pytest.approx(
            group["action_valid"].mean())
    spanning = by_id["train-r0-e0-0"]  # turns 0-2 in iteration 0, its time limit in 1
    assert (spanning["first_iteration"], spanning["last_iteration"], spanning["length"],
            spanning["ended_by"], spanning["success"]) == (0, 1, 4, "time_limit", False)
    assert (by_id["train-r1-e1-0"]["ended_by"], by_id["train-r1-e1-0"]["success"]) == (
        "success", True)
    assert by_id["train-r0-e0-2"]["ended_by"] == "continues"
    in_first = audit_json(capsys, "episodes", str(train_run), "--iteration", "0")
    assert {e["episode_id"] for e in in_first} == set(turns[turns["iteration"] == 0]["episode_id"])
    long = audit_json(capsys, "episodes", str(train_run), "--min-length", "4")
    assert long and all(e["length"] >= 4 for e in long)
    assert audit_json(capsys, "episodes", str(train_run), "--task", "open") == []
    won = audit_json(capsys, "episodes", str(train_run), "--success", "yes")
    assert sorted(e["episode_id"] for e in won) == ["train-r0-e1-0", "train-r1-e1-0"]
    failed = audit_json(capsys, "episodes", str(train_run), "--success", "no")
    assert len(failed) == len(episodes) - 2
    assert len(audit_json(capsys, "episodes", str(train_run), "--limit", "2")) == 2


def test_show_gives_the_turns_as_the_model_saw_them(train_run, capsys):
    turns = turns_of(train_run)
    episode_id = "train-r0-e0-0"  # spans iterations 0 and 1
    stored = turns[turns["episode_id"] == episode_id].sort_values("turn")
    data = audit_json(capsys, "show", episode_id, str(train_run))
    assert [t["turn"] for t in data["turns"]] == list(stored["turn"]) == [0, 1, 2, 3]
    assert [t["iteration"] for t in data["turns"]] == [0, 0, 0, 1]
    for shown, (_, row) in zip(data["turns"], stored.iterrows()):
        assert shown["prompt"] == row["prompt_text"] and shown["response"] == row["response_text"]
        assert shown["value"] == pytest.approx(row["values"][0])
        assert shown["advantage"] == pytest.approx(row["advantages"][0])
        assert shown["return"] == pytest.approx(row["returns"][0])
        assert shown["reward"] == pytest.approx(row["reward"])
        assert shown["next_value"] == pytest.approx(row["next_value"])
    assert data["turns"][-1]["ended_by"] == "time_limit"
    assert data["turns"][2]["action_valid"] is False
    code, text, _ = audit(capsys, "show", episode_id, str(train_run))
    assert code == 0 and stored["prompt_text"].iloc[-1] in text and "advantage" in text
    assert "invalid (unknown action)" in text and "THINK: turn 0 of 0." in text
    one = audit_json(capsys, "show", episode_id, str(train_run), "--turn", "3")
    assert [t["turn"] for t in one["turns"]] == [3]
    code, text, _ = audit(capsys, "show", episode_id, str(train_run), "--no-prompt")
    assert code == 0 and "OBSERVATION" not in text
    code, _, err = audit(capsys, "show", episode_id, str(train_run), "--turn", "7")
    assert code == 2 and "no turn 7" in err
    code, _, err = audit(capsys, "show", "no-such-episode", str(train_run))
    assert code == 2 and "no-such-episode" in err


def _rewrite(part: Path, column: str, change) -> None:
    """Rewrite one column of a file in place, keeping its metadata (version, GAE parameters)."""
    table = pq.read_table(part)
    values = change(table.column(column).to_pylist())
    field = table.schema.field(column)
    pq.write_table(table.set_column(table.schema.get_field_index(column), field,
                                    pa.array(values, type=field.type)), part)


def test_gae_recomputes_each_file_and_catches_a_tampered_one(train_run, capsys, tmp_path):
    data = audit_json(capsys, "gae", str(train_run))
    assert data["ok"] and len(data["files"]) == 6 and data["worst"]["max_abs_error"] < 1e-5
    assert sorted({(f["iteration"], f["rank"]) for f in data["files"]}) == [
        (i, r) for i in range(3) for r in (0, 1)]
    tampered = tmp_path / "tampered"
    shutil.copytree(train_run / "trajectories", tampered / "trajectories")
    part = tampered / "trajectories/iteration=0001/part-01.parquet"

    def shift(advantages):
        advantages[4] = [a + 0.5 for a in advantages[4]]
        return advantages

    _rewrite(part, "advantages", shift)
    code, out, _ = audit(capsys, "gae", str(tampered))
    assert code == 1 and "MISMATCH" in out and "iteration=0001" in out
    worst = json.loads(audit(capsys, "gae", str(tampered), "--json")[1])["worst"]
    assert (worst["iteration"], worst["rank"]) == (1, 1)
    assert worst["max_abs_error"] == pytest.approx(0.5, abs=1e-5)
    # a changed reward is caught too: the recomputation reads the file's own token rewards
    shutil.copy(train_run / "trajectories/iteration=0001/part-01.parquet", part)
    _rewrite(part, "token_rewards", lambda rows: [[x + 0.3 for x in r] for r in rows])
    assert audit(capsys, "gae", str(tampered))[0] == 1


def test_sql_over_replies_and_samples(train_run, capsys):
    rows = audit_json(capsys, "sql", "SELECT iteration, rank, count(*) AS n, "
                      "sum(len(response_ids)) AS tokens FROM turns GROUP BY ALL ORDER BY ALL",
                      str(train_run))
    turns = turns_of(train_run)
    assert [(r["iteration"], r["rank"], r["n"]) for r in rows] == [
        (i, r, 6) for i in range(3) for r in (0, 1)]
    assert sum(r["tokens"] for r in rows) == sum(len(r) for r in turns["response_ids"])
    mix = audit_json(capsys, "sql", "SELECT action, action_valid, count(*) AS n FROM turns "
                     "GROUP BY ALL ORDER BY ALL", str(train_run))
    assert mix == [{"action": "forward", "action_valid": True,
                    "n": int(turns["action_valid"].sum())},
                   {"action": "left", "action_valid": False,
                    "n": int((~turns["action_valid"]).sum())}]
    first = audit_json(capsys, "sql", "SELECT episode_id, turn, \"values\"[1] AS v FROM turns "
                       "WHERE episode_id = 'train-r1-e1-1' ORDER BY turn", str(train_run))
    stored = turns[turns["episode_id"] == "train-r1-e1-1"].sort_values("turn")
    assert [r["v"] for r in first] == pytest.approx([v[0] for v in stored["values"]])
    assert audit_json(capsys, "sql", "SELECT count(*) AS n, sum(len(replies)) AS r "
                      "FROM samples", str(train_run)) == [{"n": 36, "r": 36}]
    code, _, err = audit(capsys, "sql", "SELECT no_such_column FROM turns", str(train_run))
    assert code == 2 and err.count("\n") == 1 and "no_such_column" in err


def test_plot_writes_pngs(train_run, capsys, tmp_path):
    data = audit_json(capsys, "plot", str(train_run), "--out", str(tmp_path / "plots"))
    names = sorted(Path(p).name for p in data["written"])
    assert names == ["action_mix.png", "advantages.png", "returns.png"] and data["skipped"] == []
    for name in names:
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG_MAGIC


def test_diff_finds_the_first_differing_sample(train_run, capsys, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(train_run / "trajectories", copy / "trajectories")
    data = audit_json(capsys, "diff", str(train_run), str(copy))
    assert data["identical"] and data["files"] == 6 and data["iterations"] == 3
    part = copy / "trajectories/iteration=0001/part-00.parquet"

    def bump(ids):
        ids[2] = ids[2][:1] + [ids[2][1] + 1] + ids[2][2:]
        return ids

    _rewrite(part, "response_ids", bump)
    code, out, _ = audit(capsys, "diff", str(train_run), str(copy), "--json")
    first = json.loads(out)["first_difference"]
    row = pq.read_table(part).to_pylist()[2]
    assert code == 1
    assert (first["iteration"], first["rank"], first["row"], first["column"], first["token"],
            first["episode_id"], first["turn"]) == (
        1, 0, 2, "response_ids", 1, row["episode_id"], row["replies"][0]["turn"])
    shutil.rmtree(copy / "trajectories/iteration=0002")
    code, out, _ = audit(capsys, "diff", str(train_run),
                         str(train_run / "trajectories/iteration=0000"))
    assert code == 1 and "iteration 0, rank 1" not in out and "iteration 1, rank 0: only in" in out


def test_an_evaluation_dir(eval_run, capsys):
    episodes = pd.read_parquet(eval_run / "episodes.parquet")
    data = audit_json(capsys, "summary", str(eval_run))
    assert data["kind"] == "eval" and data["overall"]["turns"] == episodes["length"].sum() == 6
    assert data["overall"]["ended"] == len(episodes) == 3
    assert data["overall"]["successes"] == int(episodes["success"].sum()) == 1
    listed = audit_json(capsys, "episodes", str(eval_run))
    assert {(e["episode_id"], e["length"], e["success"]) for e in listed} == set(
        zip(episodes["episode_id"], episodes["length"], episodes["success"]))
    rows = audit_json(capsys, "sql", "SELECT count(*) AS n FROM episodes", str(eval_run))
    assert rows == [{"n": len(episodes)}]
    joined = audit_json(capsys, "sql", "SELECT e.success, count(*) AS n FROM turns t JOIN "
                        "episodes e USING (episode_id) GROUP BY ALL ORDER BY ALL", str(eval_run))
    assert joined == [{"success": False, "n": 4}, {"success": True, "n": 2}]
    shown = audit_json(capsys, "show", "eval-goto-0", str(eval_run))
    assert [t["value"] for t in shown["turns"]] == [None, None]  # not scored
    plotted = audit_json(capsys, "plot", str(eval_run), "--out", str(eval_run.parent / "p"))
    assert plotted["skipped"] == ["returns.png", "advantages.png"]
    code, _, err = audit(capsys, "gae", str(eval_run))
    assert code == 2 and "turns.parquet" in err and "gamma_step" in err


def test_an_evaluation_episode_whose_reset_failed_is_counted(eval_run, tmp_path, capsys):
    """It has no reply, so no sample: summary and episodes read it from episodes.parquet, as
    the evaluation's metrics count it."""
    out = tmp_path / "eval"
    shutil.copytree(eval_run, out)
    episodes = pd.read_parquet(out / "episodes.parquet")
    never = {**episodes.iloc[0].to_dict(), "episode_id": "eval-goto-9", "length": 0,
             "success": False, "aborted": True, "termination": "env_error"}
    pd.concat([episodes, pd.DataFrame([never])]).to_parquet(out / "episodes.parquet")
    data = audit_json(capsys, "summary", str(out))
    assert data["unstarted"] == {"env_error": 1} and data["overall"]["episodes"] == 3
    code, text, _ = audit(capsys, "summary", str(out))
    assert "1 more never started (reset failed: env_error 1)" in text
    listed = audit_json(capsys, "episodes", str(out))
    assert [(e["length"], e["ended_by"]) for e in listed if e["episode_id"] == "eval-goto-9"] \
        == [(0, "env_error")]
    assert audit_json(capsys, "summary", str(eval_run))["unstarted"] == {}


def test_show_writes_each_turns_frames(tmp_path, capsys):
    """Window samples with image observations: each turn's prompt holds the frames of its
    history window, written as `<episode>-t<turn>-<k>.png`, the bytes as stored."""
    frames = [to_png(np.full((4, 4, 3), 40 * k, dtype=np.uint8)) for k in range(3)]
    samples = [sample_from_turn({
        "episode_id": "eval-goto-0", "task": "goto", "iteration": 0, "env_index": 0,
        "turn": t, "step": t, "prompt_ids": [1, 2, 3], "response_ids": [5, 6],
        "prompt_text": f"see {t}", "response_text": "THINK: x. ACTION: left", "action": "left",
        "action_valid": True, "reward": 0.0, "images": frames[:t + 1],
        "image_starts": list(range(t + 1))}) for t in range(2)]
    write_samples(samples, tmp_path / "eval/turns.parquet", {})
    data = audit_json(capsys, "show", "eval-goto-0", str(tmp_path / "eval"), "--frames",
                      str(tmp_path / "frames"))
    assert [t["images"] for t in data["turns"]] == [1, 2]
    assert [Path(p).name for p in data["frames"]] == [
        "eval-goto-0-t0-0.png", "eval-goto-0-t1-0.png", "eval-goto-0-t1-1.png"]
    assert [Path(p).read_bytes() for p in data["frames"]] == [frames[0], *frames[:2]]
    code, text, _ = audit(capsys, "show", "eval-goto-0", str(tmp_path / "eval"))
    assert code == 0 and "(2 image observation(s) in this prompt)" in text


def test_samples_without_a_task_are_counted(tmp_path, capsys):
    """A gymnasium env has no task name: its samples still count, under task None."""
    samples = [sample_from_turn({"episode_id": "gym-0", "turn": t, "step": t, "env_index": 0,
                                 "response_ids": [5], "reward": 1.0, "action": "0",
                                 "action_valid": True}) for t in range(2)]
    write_samples(samples, tmp_path / "eval/turns.parquet", {})
    data = audit_json(capsys, "summary", str(tmp_path / "eval"))
    assert [(r["task"], r["turns"]) for r in data["per_task"]] == [(None, 2)]


def test_an_evaluation_that_died_is_read_from_its_journal(eval_run, tmp_path, capsys):
    """Killed after two episodes: the audit reads the journal's parts (a part whose episode
    file was never written does not count)."""
    samples = pq.read_table(eval_run / "turns.parquet").to_pylist()
    episodes = pq.read_table(eval_run / "episodes.parquet").to_pylist()
    journal = EvalJournal.open(tmp_path, {"key": "k"}, SAMPLE_SCHEMA,
                               file_metadata({}, version=SCHEMA_VERSION))
    for episode in episodes[:2]:
        journal.add(episode, [s for s in samples if s["episode_id"] == episode["episode_id"]])
    (tmp_path / PARTIAL / "part-00002.turns.parquet").write_bytes(b"killed before its episodes")
    data = audit_json(capsys, "summary", str(tmp_path))
    assert data["kind"] == "eval" and data["files"] == 2
    assert data["overall"]["ended"] == 2
    assert data["overall"]["turns"] == sum(e["length"] for e in episodes[:2])


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_real_entry_points(train_run):
    proc = run_module("longturn.audit", "summary", str(train_run))
    assert proc.returncode == 0, proc.stderr
    assert "iterations: 3 (0..2)" in proc.stdout
    proc = run_module("longturn.cli", "audit", "diff", str(train_run),
                      str(train_run / "trajectories"))
    assert proc.returncode == 0 and proc.stdout.startswith("identical"), proc.stderr
    # the console script `longturn` is longturn.cli:main
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["longturn"] == "longturn.cli:main"


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_damaged_inputs_are_one_named_line(train_run, tmp_path, capsys):
    source = train_run / "trajectories/iteration=0001/part-00.parquet"
    truncated = tmp_path / "truncated"
    shutil.copytree(train_run / "trajectories", truncated / "trajectories")
    bad = truncated / "trajectories/iteration=0001/part-00.parquet"
    bad.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    err = one_line_error(run_module("longturn.audit", "summary", str(truncated)))
    assert str(bad) in err and "truncated" in err
    for args in (["gae", str(truncated)], ["sql", "SELECT 1 FROM turns", str(truncated)],
                 ["diff", str(train_run), str(truncated)], ["plot", str(truncated), "--out",
                                                            str(tmp_path / "p")]):
        code, _, err = audit(capsys, *args)
        assert code == 2 and str(bad) in err, args

    foreign = tmp_path / "foreign"
    shutil.copytree(train_run / "trajectories", foreign / "trajectories")
    part = foreign / "trajectories/iteration=0002/part-00.parquet"
    pq.write_table(pq.read_table(part).drop_columns(["task"]), part)  # metadata kept: v2
    err = one_line_error(run_module("longturn.audit", "episodes", str(foreign)))
    assert str(part) in err and "'task'" in err

    err = one_line_error(run_module("longturn.audit", "summary", str(tmp_path / "missing")))
    assert str(tmp_path / "missing") in err
    (tmp_path / "empty").mkdir()
    err = one_line_error(run_module("longturn.audit", "summary", str(tmp_path / "empty")))
    assert "no sample Parquet files" in err


@pytest.mark.parametrize("command", [
    ["summary"], ["episodes"], ["show", "train-r0-e0-0"], ["gae"], ["sql", "SELECT 1 FROM turns"],
    ["plot", "--out", "PLOTS"], ["diff", "RUN"]])
def test_a_file_of_schema_version_1_is_one_line(tmp_path, capsys, command):
    """Turn rows written as schema version 1 (before one sample schema): every subcommand names
    the file and the version, exit 2, and writes nothing."""
    rows = play(0, np.random.default_rng(0))[0]
    old = write_arrow(rows_table(rows, None), tmp_path / "v1/trajectories/iteration=0000/part-00.parquet",
                      file_metadata(GAE, version=V1_SCHEMA_VERSION))
    args = [a.replace("PLOTS", str(tmp_path / "plots")) for a in command]
    args = [*args[:1], *(a for a in args[1:] if a != "RUN"), str(tmp_path / "v1")]
    if "RUN" in command:
        args.append(str(tmp_path / "v1"))
    code, out, err = audit(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert str(old) in err and "schema version 1" in err and "rerun the stage" in err
    assert not (tmp_path / "plots").exists()
