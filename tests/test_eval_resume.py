"""Evaluations keep what they played: a stage that dies (here a disk that turns read-only, in the
end-to-end test a SIGKILL) leaves its finished episodes in the journal, and the rerun plays only
the rest and writes the same files as an uninterrupted run."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from flaky_envs import FlakyCorridor
from longturn.params.config import parse_params
from longturn.engines.base import Completion
from longturn.engines.hf import HFEngine
from longturn.errors import OutputNotWritable
from longturn.run.eval_journal import PARTIAL
from longturn.run.evaluation import eval_jobs
from longturn.run.protocol import evaluate, evaluate_model
from longturn.run.models import load_tokenizer
from longturn.rollout.conversation_episodes import play_episode_jobs
from longturn.rollout.conversation_setup import ConversationRun
from reply_rows import replies_of
from settings_from_params import sampling_settings
from test_faults import failing_parquet_writes
from test_pipeline_smoke import ROOT, toy_params, write_params
from test_conversation_pipeline import one_reply_sequence_params

OUTPUTS = ("summary.json", "metrics.json", "episodes.parquet", "turns.parquet")


class SeededEngine:
    """Replies 'left' or 'right' as each prompt's own seed says: an episode's course shows
    whether its draws depend on what shares its lock-step."""

    def __init__(self, tokenizer) -> None:
        self.replies = {a: tokenizer(f"ACTION: {a}", add_special_tokens=False)["input_ids"]
                        for a in ("left", "right")}

    def generate(self, prompts, sampling):
        assert len(sampling.seed) == len(prompts)  # one seed per prompt
        return [Completion(list(self.replies["left" if s % 3 == 0 else "right"]), [0.0], "stop")
                for s in sampling.seed]


def test_a_resumed_queue_plays_the_rest_in_the_same_slots_steps_and_draws(
        smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    name = f"{FlakyCorridor.__module__}:FlakyCorridor"
    params = parse_params({"env": {"name": name, "tasks": ["corridor"], "max_turns": 6,
                                   "workers": False, "step_timeout_s": None,
                                   "kwargs": {"length": 4, "raise_on_reset": [1003]}}})
    jobs = eval_jobs(["corridor"], 9, 1000)

    def play(finished=None, parallel=3):
        ended, turns = [], []

        def on_episode(episode, rows):
            ended.append(episode)
            turns.extend(rows)

        returned, _ = play_episode_jobs(ConversationRun.of_env(params, progress=False),
                                        SeededEngine(tokenizer), tokenizer, jobs, parallel,
                                        sampling_settings(seed=7), progress=False,
                                        finished=finished, on_episode=on_episode)
        assert returned == []  # the samples went to on_episode only
        by_step = pd.DataFrame(replies_of(turns)).sort_values(["step", "env_index"])
        return by_step.reset_index(drop=True), ended

    full, ended = play()
    lengths = {e["episode_id"]: e["length"] for e in ended}
    assert len(set(lengths.values())) > 2 and lengths["eval-corridor-1003"] == 0
    done = {e["episode_id"]: e["length"] for e in ended[:5]}  # what a killed run had journaled
    assert "eval-corridor-1003" in done
    rest, _ = play(done)
    expected = full[~full["episode_id"].isin(done)].reset_index(drop=True)
    pd.testing.assert_frame_equal(rest.drop(columns="observation"),
                                  expected.drop(columns="observation"))
    # an episode's draws are its own: other neighbours and other steps, the same actions
    by_episode = ["episode_id", "turn"]
    paired, _ = play(parallel=2)
    assert not paired["step"].equals(full["step"])
    assert paired.sort_values(by_episode)["action"].tolist() == \
        full.sort_values(by_episode)["action"].tolist()


def test_an_env_is_built_per_slot_and_kept_for_the_next_episode_of_its_task(
        smollm2_tokenizer_dir, monkeypatch):
    """Two slots play a, a, then b, b: an env is built for each slot's first episode of a task
    and reset for its later ones, never built per episode."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    params = parse_params({"env": {"name": f"{FlakyCorridor.__module__}:FlakyCorridor",
                                   "tasks": ["a"], "max_turns": 2, "workers": False,
                                   "step_timeout_s": None, "kwargs": {"length": 4}}})
    built = []
    init = FlakyCorridor.__init__

    def counted(self, task="corridor", **kwargs):
        built.append(task)
        init(self, task, **kwargs)

    monkeypatch.setattr(FlakyCorridor, "__init__", counted)

    def play(tasks, per_task):
        samples, episodes = play_episode_jobs(
            ConversationRun.of_env(params, tasks, progress=False), SeededEngine(tokenizer),
            tokenizer, eval_jobs(tasks, per_task, 1000), 2, sampling_settings(seed=7),
            progress=False)
        return replies_of(samples), episodes

    replies, episodes = play(["a"], 4)
    assert built == ["a", "a"] and len(episodes) == 4  # two slots, each env reset twice
    built.clear()
    replies, episodes = play(["a", "b"], 2)  # a, a, then b, b in the same two slots
    assert built == ["a", "a", "b", "b"]
    assert [e["task"] for e in episodes] == ["a", "a", "b", "b"]
    assert {r["episode_id"].split("-")[1]: r["task"] for r in replies} == {"a": "a", "b": "b"}


def outputs(out: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # the journal is gone
    return (json.loads((out / "metrics.json").read_text()),
            pd.read_parquet(out / "episodes.parquet"), pd.read_parquet(out / "turns.parquet"))


def assert_same_outputs(a: Path, b: Path) -> None:
    (ma, ea, ta), (mb, eb, tb) = outputs(a), outputs(b)
    assert ma == mb
    pd.testing.assert_frame_equal(ea, eb)
    pd.testing.assert_frame_equal(ta, tb)


def evaluate_twice(params, model_dir: str, tmp_path: Path, monkeypatch, caplog) -> None:
    """Uninterrupted into `whole/`; into `resumed/` the disk turns read-only at the journal's
    second part (one line, the first part kept), then the rerun; both must write the same."""
    engine = HFEngine(model_dir, dtype="float32")
    tokenizer = load_tokenizer(model_dir)
    try:
        evaluate(engine, tokenizer, params, tmp_path / "whole", "base", progress=False,
                 model_dir=model_dir)
        with monkeypatch.context() as m:
            failing_parquet_writes(m, "part-00001.turns.parquet", errno.EROFS)
            with pytest.raises(OutputNotWritable, match="part-00001.turns.parquet: read-only"):
                evaluate(engine, tokenizer, params, tmp_path / "resumed", "base",
                         progress=False, model_dir=model_dir)
        assert sorted(p.name for p in (tmp_path / "resumed" / PARTIAL).iterdir()) == [
            "key.json", "part-00000.episodes.parquet", "part-00000.turns.parquet"]
        caplog.set_level(logging.INFO, logger="longturn.run.eval_journal")
        evaluate(engine, tokenizer, params, tmp_path / "resumed", "base", progress=False,
                 model_dir=model_dir)
    finally:
        engine.close()
    assert any("finished episodes kept" in r.getMessage() for r in caplog.records)
    assert_same_outputs(tmp_path / "whole", tmp_path / "resumed")


def test_turn_mode_resumes_after_the_disk_turned_read_only(tiny_model_dir, tmp_path,
                                                         monkeypatch, caplog):
    params = toy_params(tiny_model_dir)
    params["env"].update(workers=False, step_timeout_s=None, max_turns=1)  # 5 generate calls
    params["engine"]["sampling"].update(max_new_tokens=2)
    params["eval"].update(tasks=["goto"], episodes_per_task=4)
    evaluate_twice(parse_params(params), tiny_model_dir, tmp_path, monkeypatch, caplog)


def test_conversation_mode_resumes_after_the_disk_turned_read_only(tiny_model_dir, tmp_path,
                                                             monkeypatch, caplog):
    params = one_reply_sequence_params(tiny_model_dir)  # one reply: 5 generate calls
    params["eval"].update(episodes_per_task=4, parallel_envs=2)  # two chunks, a part each
    evaluate_twice(parse_params(params), tiny_model_dir, tmp_path, monkeypatch, caplog)


def test_sigkill_mid_evaluation_then_rerun_gives_the_uninterrupted_outputs(tiny_model_dir,
                                                                           tmp_path):
    params = toy_params(tiny_model_dir)
    params["eval"].update(episodes_per_task=6)  # 12 episodes, 2 at a time: seconds to kill in
    path = write_params(tmp_path / "params.yaml", params)
    out = tmp_path / "killed"
    cmd = [sys.executable, "components/zero_shot_eval.py", "--params", path,
           "--model-dir", tiny_model_dir, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while not (out / PARTIAL / "part-00001.episodes.parquet").exists():
        assert proc.poll() is None, "the evaluation ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "metrics.json").exists(), "killed too late: the evaluation had finished"
    kept = pd.concat(pd.read_parquet(p) for p in (out / PARTIAL).glob("part-*.episodes.parquet"))
    assert 2 <= len(kept) < 12  # every finished episode readable after the kill

    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"{len(kept)} finished episodes kept" in rerun.stderr
    evaluate_model(tiny_model_dir, parse_params(params), tmp_path / "whole", "base",
                   progress=False)
    assert_same_outputs(tmp_path / "whole", out)


def test_chat_evaluation_plays_each_episode_alike_at_any_width(tiny_model_dir, tmp_path):
    """The built-in chat rollout is evaluated in slots in lock-step, as an env's episodes are:
    each reply seeded by its episode's id and turn, so an episode samples the same however many
    play beside it (played in chunks, a chunk's draws depended on what shared it)."""
    params = one_reply_sequence_params(tiny_model_dir)
    params["engine"]["sampling"].update(max_new_tokens=6)
    params["rollout"]["chat"].update(max_assistant_turns=3, max_user_turns=2)
    params["eval"].update(episodes_per_task=4)
    written = {}
    for width in (1, 3):
        params["eval"].update(parallel_envs=width)
        evaluate_model(tiny_model_dir, parse_params(params), tmp_path / f"w{width}", "base",
                       progress=False)
        _, episodes, samples = outputs(tmp_path / f"w{width}")
        written[width] = episodes, samples.drop(columns=["env_index"])
    assert written[1][0]["length"].sum() > len(written[1][0])  # episodes of several replies
    pd.testing.assert_frame_equal(written[1][0], written[3][0])
    pd.testing.assert_frame_equal(written[1][1], written[3][1])


def test_a_rerun_whose_journal_holds_every_episode_plays_nothing_and_closes_its_run(
        tiny_model_dir, tmp_path, monkeypatch):
    """The stage died while writing its outputs, every episode journaled: the rerun plays no
    episode, writes the outputs, and still lets its run go (tools, interaction)."""
    from longturn.run import evaluation

    params = toy_params(tiny_model_dir)
    params["env"].update(workers=False, step_timeout_s=None, max_turns=1)
    params["engine"]["sampling"].update(max_new_tokens=2)
    params["eval"].update(tasks=["goto"], episodes_per_task=2)
    params = parse_params(params)
    closed: list[ConversationRun] = []
    close = ConversationRun.close

    def counted_close(run: ConversationRun) -> None:
        closed.append(run)
        close(run)

    def full_disk(*args) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def no_episode(*args, **kwargs):
        pytest.fail("an episode was played")

    monkeypatch.setattr(ConversationRun, "close", counted_close)
    engine = HFEngine(tiny_model_dir, dtype="float32")
    tokenizer = load_tokenizer(tiny_model_dir)
    out = tmp_path / "eval"
    try:
        with monkeypatch.context() as m:
            m.setattr(evaluation, "write_outputs", full_disk)
            with pytest.raises(OSError, match="No space"):
                evaluate(engine, tokenizer, params, out, "base", progress=False,
                         model_dir=tiny_model_dir)
        closed.clear()
        with monkeypatch.context() as m:
            m.setattr(engine, "generate", no_episode)
            evaluate(engine, tokenizer, params, out, "base", progress=False,
                     model_dir=tiny_model_dir)
    finally:
        engine.close()
    assert len(closed) == 1  # the plan's own close: no player was made
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
