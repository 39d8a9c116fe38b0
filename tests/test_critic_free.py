"""Critic-free estimators end to end at toy size: the warm-up stage writes only a note, train
loads no critic, plays groups of whole episodes from one seed, writes null values, and the
advantages in its Parquet are recomputed from the file alone; a rerun resumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from longturn.params.config import parse_params
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.run.models import load_tokenizer
from longturn.run.wiring import make_collector
from longturn.algo.sample_scoring import audit_samples_file
from longturn.trajectories import read_metadata
from reply_rows import replies_of

ROOT = Path(__file__).resolve().parents[1]


def _params(model_dir: str, advantage: str, iterations: int = 2) -> dict:
    return {
        "seed": 3,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": {"tasks": ["goto"], "max_turns": 3, "workers": False, "step_timeout_s": None},
        "engine": {"batch_size": 8, "sampling": {"max_new_tokens": 5, "temperature": 1.0}},
        "rollout": {"n_envs": 4, "turns_per_env": 2},
        "algo": {"advantage": advantage, "group_size": 2, "step_weight": 0.5},
        "ppo": {"mini_batch_size": 4, "micro_batch_size": 2, "bf16": False, "lora": True},
        "train": {"iterations": iterations, "checkpoint_every": 1, "keep_checkpoints": 2},
    }


def _grpo_collector(model_dir: str, run_id: str):
    """GRPO params on the tiny model, its tokenizer and engine, and 4 goto slots in groups of 2
    (the train stage's collector)."""
    params = parse_params(_params(model_dir, "grpo"))
    collector = make_collector(params, rank=0, run_id=run_id)
    return params, load_tokenizer(model_dir), make_engine(model_dir, params), collector


def test_groups_start_from_one_seed_and_play_to_the_end(tiny_model_dir) -> None:
    params, tokenizer, engine, collector = _grpo_collector(tiny_model_dir, "t")
    try:
        first = collector.collect(engine, tokenizer, sampling_from_params(params, seed=1), 0,
                                  progress=False)
        second = collector.collect(engine, tokenizer, sampling_from_params(params, seed=1), 1,
                                   progress=False)
    finally:
        collector.close()
        engine.close()
    rows = pd.DataFrame(replies_of(first))
    assert rows["group_id"].nunique() == 2 and rows["episode_id"].nunique() == 4
    for _, group in rows.groupby("group_id"):
        assert group["episode_seed"].nunique() == 1 and group["episode_id"].nunique() == 2
    for _, episode in rows.groupby("episode_id"):
        assert list(episode["turn"]) == list(range(len(episode)))
        last = episode.iloc[-1]
        assert last["segment_end"] and (last["terminated"] or last["truncated"])
        assert not episode.iloc[:-1]["segment_end"].any()
        assert len(episode) <= 3  # env.max_turns
    assert rows["observation"].str.len().min() > 0
    assert {s["episode_seed"] for s in second}.isdisjoint(set(rows["episode_seed"]))


def test_group_size_must_divide_the_slots(tiny_model_dir) -> None:
    raw = _params(tiny_model_dir, "gigpo")
    raw["rollout"]["n_envs"] = 5
    with pytest.raises(ValueError, match="rollout.n_envs .5. must be a multiple"):
        parse_params(raw)
    raw["algo"]["advantage"] = "gae"
    parse_params(raw)  # GAE has no groups


def _stage(script: str, params: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"components/{script}.py", "--params", str(params),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_warmup_and_train_without_a_critic(tmp_path, tiny_model_dir) -> None:
    """The stages' no-critic path, once: it does not depend on which critic-free estimator
    (tests/test_every_setting_combination.py trains each of them with either protocol)."""
    advantage = "grpo"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_params(tiny_model_dir, advantage)))
    warm, batches = tmp_path / "critic/warm", tmp_path / "critic/batches"
    done = _stage("critic_warmup", params, "--model-dir", tiny_model_dir, "--out", str(warm),
                  "--live", str(tmp_path / "critic/live"), "--work", str(batches),
                  "--metrics", str(tmp_path / "critic/metrics.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in warm.iterdir()] == ["NO_CRITIC.md"]  # a note, no model
    assert advantage in (warm / "NO_CRITIC.md").read_text()

    out = tmp_path / "train"
    train = ("--model-dir", tiny_model_dir, "--critic-dir", str(warm), "--out", str(out))
    done = _stage("train", params, *train)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = sorted(out.glob("trajectories/iteration=*/part-00.parquet"))
    assert len(parts) == 2
    for part in parts:
        table = pq.read_table(part).to_pandas()
        replies = [r for rs in pq.read_table(part, columns=["replies"]).column(0).to_pylist()
                   for r in rs]
        assert len(replies) == len(table)  # window turns: a sample of one reply each
        assert table["values"].isna().all() and all(r["next_value"] is None for r in replies)
        assert table["advantages"].notna().all() and table["group_id"].notna().all()
        assert read_metadata(part)["algo"].count(advantage) == 1
        assert audit_samples_file(part) < 1e-5  # recomputed from the file's own columns
    checkpoint = out / "checkpoints/iteration=0001"
    assert (checkpoint / "actor").is_dir() and not (checkpoint / "critic").exists()
    assert (out / "final/config.json").is_file()

    params.write_text(yaml.safe_dump(_params(tiny_model_dir, advantage, iterations=3)))
    done = _stage("train", params, *train)  # resumes after iteration 1
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming after iteration 1" in done.stderr
    assert len(list(out.glob("trajectories/iteration=*/part-00.parquet"))) == 3


def test_group_advantages_reach_the_loss_unwhitened(tiny_model_dir, tmp_path, monkeypatch) -> None:
    """The update uses the stored group advantages as they are (GAE's are whitened)."""
    from dataclasses import replace

    from longturn.algo import ppo_steps
    from longturn.algo.gae import GAEParams
    from longturn.algo.trainer import PPOTrainer
    from longturn.run.models import load_tokenizer
    from longturn.trajectories import write_samples
    from longturn.run.wiring import trainer_settings

    params, tokenizer, engine, collector = _grpo_collector(tiny_model_dir, "w")
    settings = replace(trainer_settings(params), bf16=False)
    try:
        samples = collector.collect(engine, tokenizer, sampling_from_params(params, seed=1), 0,
                                    progress=False)
    finally:
        collector.close()
        engine.close()
    for sample in samples:  # distinct returns: a random policy's are all alike
        sample["replies"][0]["reward"] = float(sample["env_index"])
    trainer = PPOTrainer(tiny_model_dir, None, settings, GAEParams(0.5, 1.0), tokenizer)
    samples = trainer.score(samples)
    path = write_samples(samples, tmp_path / "samples.parquet")
    seen = []
    real = ppo_steps.policy_loss
    monkeypatch.setattr(ppo_steps, "policy_loss", lambda lp, old, adv, mask, *a, **k: (
        seen.append(adv[mask]), real(lp, old, adv, mask, *a, **k))[1])
    trainer.update([str(path)])
    used = np.sort(torch.cat(seen).cpu().numpy())
    stored = np.sort(np.concatenate([s["advantages"] for s in samples]).astype(np.float32))
    # not already whitened (γ 0.5 discounts the ±1 episode advantages back to each turn)
    assert abs(stored.std() - 1) > 0.05 or abs(stored.mean()) > 1e-3
    np.testing.assert_allclose(used, stored, atol=1e-6)
