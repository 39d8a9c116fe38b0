"""Toy-size train loop: Parquet per iteration, GAE audit (in process and by `longturn audit`),
resume without loss or duplicates."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from longturn.algo.sample_scoring import audit_samples_file
from longturn.algo.scoring import GAE_METADATA_KEYS
from longturn.audit.cli import main as audit_main
from longturn.params.config import parse_params
from longturn.run.training import TrainPaths, run_training
from longturn.run.wiring import gae_params
from longturn.trajectories import read_metadata
from reply_rows import read_reply_rows, reply_rows


def toy_params(model_dir: str, iterations: int):
    return parse_params({
        "seed": 3,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": {"tasks": ["goto"], "max_turns": 4},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 5, "temperature": 1.0}},
        "rollout": {"n_envs": 2, "turns_per_env": 3},
        "ppo": {"mini_batch_size": 6, "micro_batch_size": 3, "bf16": False, "lora": True,
                "actor_lr": 1e-3, "critic_lr": 1e-3},
        "train": {"iterations": iterations, "checkpoint_every": 1, "keep_checkpoints": 1},
    })


def paths(root: Path, model_dir: str) -> TrainPaths:
    return TrainPaths(base=Path(model_dir), critic=Path(model_dir),
                      trajectories=root / "trajectories", checkpoints=root / "checkpoints",
                      final=root / "final", live=root / "live", policy=root / "policy")


def responses(root: Path) -> list[list[int]]:
    files = sorted((root / "trajectories").glob("iteration=*/part-*.parquet"))
    return [list(map(list, pd.read_parquet(f)["response_ids"])) for f in files]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, tiny_model_dir) -> tuple[Path, list[dict]]:
    """2 iterations of 2 envs × 3 turns, then the same run asked for a third: (root, history)."""
    root = tmp_path_factory.mktemp("resumed_run")
    p = paths(root, tiny_model_dir)
    history = run_training(toy_params(tiny_model_dir, 2), p, progress=False)
    assert len(history) == 2
    # the same run asked for one more iteration continues instead of starting over
    return root, run_training(toy_params(tiny_model_dir, 3), p, progress=False)


def test_train_writes_audited_iterations_and_resumes(resumed_run, tiny_model_dir):
    tmp_path, history = resumed_run
    assert len(history) == 3
    dirs = sorted(d.name for d in (tmp_path / "trajectories").iterdir())
    assert dirs == ["iteration=0000", "iteration=0001", "iteration=0002"]
    gae = dataclasses.asdict(gae_params(toy_params(tiny_model_dir, 3)))
    for d in dirs:
        part = tmp_path / "trajectories" / d / "part-00.parquet"
        frame = pd.read_parquet(part)
        # window samples: one reply each, spanning the response; each slot's last turn ends a
        # segment
        assert len(frame) == 6 and (frame["replies"].map(len) == 1).all()
        assert reply_rows(frame)["segment_end"].sum() == 2
        assert frame[["old_logprobs", "values", "advantages", "returns"]].notna().all().all()
        # the file records the run's discounts, and its advantages follow from them
        meta = read_metadata(part)
        assert {k: float(meta[k]) for k in GAE_METADATA_KEYS} == pytest.approx(gae)
        assert audit_samples_file(part) < 1e-4
    assert [c.name for c in (tmp_path / "checkpoints").glob("iteration=*")] == ["iteration=0002"]
    curve = pd.read_csv(tmp_path / "live/plots/metrics/train/value_loss.tsv", sep="\t")
    assert list(curve["step"]) == [0, 1, 2]
    for metrics in history:  # where the time went, what the policy did, the optimizer state
        phases = [metrics[f"seconds_{p}"] for p in ("rollout", "scoring", "update", "sync")]
        assert all(s > 0 for s in phases) and "seconds_checkpoint" in metrics
        assert metrics["seconds_per_iteration"] >= sum(phases) + metrics["seconds_checkpoint"]
        assert metrics["turns_per_s"] == pytest.approx(6 / metrics["seconds_per_iteration"])
        mix = {k: v for k, v in metrics.items() if k.startswith("action_mix/")}
        assert "action_mix/go_forward" in mix and sum(mix.values()) == pytest.approx(1.0)
        assert metrics["lr_actor"] > 0 and metrics["epochs_run"] >= 1 and "successes" in metrics
        # engine against trainer, read from the scored samples (the report plots it)
        assert 0 <= metrics["logprob_gap"] < 1e-3
    assert (tmp_path / "live/plots/metrics/train/action_mix/go_forward.tsv").is_file()
    assert (tmp_path / "final/config.json").is_file()


def audit_json(capsys, *args: str):
    """`longturn audit ARGS --json` in process: exit 0 and its JSON."""
    code = audit_main([*args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_longturn_audit_reads_the_real_run(resumed_run, capsys):
    """`longturn audit` summary, gae and episodes on what the train loop wrote (window samples,
    episodes of at most 4 turns spanning iterations of 3), checked against the files."""
    root, _ = resumed_run
    turns = read_reply_rows(sorted(root.glob("trajectories/iteration=*/part-00.parquet")))
    assert len(turns) == 18

    summary = audit_json(capsys, "summary", str(root))
    assert summary["iterations"] == [0, 1, 2] and summary["ranks"] == [0]
    assert summary["tasks"] == ["goto"]
    overall = summary["overall"]
    assert overall["turns"] == overall["samples"] == 18
    assert overall["episodes"] == turns["episode_id"].nunique()
    ended = turns["terminated"] | turns["truncated"] | turns["aborted"]
    assert overall["ended"] == int(ended.sum()) > 0  # max_turns 4 < 9 turns per slot
    assert overall["continues"] == 18 - overall["ended"]
    assert overall["time_limit"] == int((turns["truncated"] & ~turns["success"]).sum())
    assert overall["valid_action_ratio"] == pytest.approx(turns["action_valid"].mean())
    assert overall["mean_reward"] == pytest.approx(turns["reward"].mean())
    assert [r["turns"] for r in summary["per_iteration"]] == [6, 6, 6]

    gae = audit_json(capsys, "gae", str(root))
    assert gae["ok"] and len(gae["files"]) == 3 and gae["worst"]["max_abs_error"] < 1e-4

    episodes = audit_json(capsys, "episodes", str(root))
    by_id = {e["episode_id"]: e for e in episodes}
    assert sorted(by_id) == sorted(turns["episode_id"].unique())
    assert sum(e["length"] for e in episodes) == 18
    for episode_id, group in turns.groupby("episode_id"):
        assert by_id[episode_id]["length"] == len(group)
        assert sorted(group["turn"]) == list(range(len(group)))
        assert by_id[episode_id]["return"] == pytest.approx(group["reward"].sum(), abs=1e-5)
        assert by_id[episode_id]["first_iteration"] == group["iteration"].min()
        assert by_id[episode_id]["last_iteration"] == group["iteration"].max()
    assert any(e["first_iteration"] < e["last_iteration"] for e in episodes)
    first = audit_json(capsys, "episodes", str(root), "--iteration", "0")
    assert {e["episode_id"] for e in first} == set(turns[turns["iteration"] == 0]["episode_id"])


TIMING = {"tokens_per_s", "turns_per_s"}  # and every seconds_* key


def test_same_seed_same_trajectories_and_metrics(tmp_path, tiny_model_dir):
    runs = [run_training(toy_params(tiny_model_dir, 2), paths(tmp_path / name, tiny_model_dir),
                         progress=False) for name in ("a", "b")]
    assert responses(tmp_path / "a") == responses(tmp_path / "b")
    strip = [[{k: v for k, v in m.items() if k not in TIMING and not k.startswith("seconds")}
              for m in run] for run in runs]
    assert json.dumps(strip[0], sort_keys=True) == json.dumps(strip[1], sort_keys=True)  # exact


class StopAfter:
    """A Deadline that allows `n` iterations (the clock is not what this test is about)."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.asked: list[float] = []

    def allows(self, expected_seconds: float) -> bool:
        self.asked.append(expected_seconds)
        self.left -= 1
        return self.left >= 0


def test_the_expected_iteration_time_passes_over_the_profiled_iteration():
    from longturn.run.training import _expected_seconds

    history = [{"seconds_per_iteration": s} for s in (24.0, 125.0, 23.0)]
    assert _expected_seconds([], 1) == 0.0
    assert _expected_seconds(history[:1], 0) == 24.0  # the only one: better than nothing
    assert _expected_seconds(history[:2], 1) == 24.0
    assert _expected_seconds(history[:2], None) == 125.0
    assert _expected_seconds(history, 1) == 23.0


def test_deadline_stops_with_a_checkpoint_and_a_partial_actor_then_resumes(tmp_path,
                                                                           tiny_model_dir):
    from longturn.profiling import PHASES_FILE, TRACE_FILE, IterationProfiler
    from longturn.run.training import PARTIAL_FILE, Deadline

    params = toy_params(tiny_model_dir, 4)
    params.train.checkpoint_every = 3  # the stop must write the checkpoint the schedule would not
    p = paths(tmp_path, tiny_model_dir)
    profiler = IterationProfiler(1, tmp_path / "profile")
    stop = StopAfter(2)
    history = run_training(params, p, progress=False, deadline=stop, profiler=profiler)
    assert len(history) == 2
    # the next iteration is expected to take iteration 0's time, not the profiled one's (its
    # trace export made it 5x longer on an H200, and the deadline stopped training too early)
    assert stop.asked == [0.0, history[0]["seconds_per_iteration"],
                          history[0]["seconds_per_iteration"]]
    assert [c.name for c in (tmp_path / "checkpoints").glob("iteration=*")] == ["iteration=0001"]
    assert json.loads((tmp_path / "final" / PARTIAL_FILE).read_text()) == {
        "iterations_done": 2, "iterations": 4}
    assert (tmp_path / "final/config.json").is_file()
    assert (tmp_path / "profile" / TRACE_FILE).stat().st_size > 0
    phases = json.loads((tmp_path / "profile" / PHASES_FILE).read_text())
    assert phases["iteration"] == 1 and set(phases["seconds"]) >= {"rollout", "update", "sync"}

    # a deadline already past stops before any work (the actor is exported again, as it was)
    history = run_training(params, p, progress=False, deadline=Deadline(0.0))
    assert len(history) == 2 and (tmp_path / "final" / PARTIAL_FILE).is_file()
    # the rerun resumes after iteration 1, finishes, and the final actor is whole again
    history = run_training(params, p, progress=False)
    assert len(history) == 4
    assert sorted(d.name for d in (tmp_path / "trajectories").iterdir()) == [
        f"iteration={i:04d}" for i in range(4)]
    assert not (tmp_path / "final" / PARTIAL_FILE).exists()
