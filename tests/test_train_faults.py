"""Faults while the train stage runs, at toy size: the disk fills or turns read-only in iteration
1 of 2, an env hangs or always fails, a tool plug-in breaks every rule of its contract.

What must hold: a fault the user can fix stops the stage with one line (exit 2) and keeps every
finished iteration, so the rerun resumes; a fault of one episode costs that episode only.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

import longturn.run.training as training
from components import train
from hostile_tools import FAULTS, calling_reply, tools_yaml
from longturn.run.checkpoints import complete_checkpoints, file_sha256, verify
from longturn.rollout.collection import episode_seed
from longturn.params.config import parse_params
from longturn.engines.base import Completion
from longturn.envs.failures import EnvGaveUp
from longturn.tasks.arithmetic import DEMONSTRATION
from longturn.run.training import run_training
from reply_rows import reply_rows
from test_pipeline_smoke import write_params
from test_every_setting_combination import combination_params
from test_training import paths, toy_params

FLAKY = "flaky_envs:FlakyCorridor"
KEPT = "(outputs already written are kept)"


def stage_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("train:")]


def argv(params: str, model_dir: str, out: Path) -> list[str]:
    return ["--params", params, "--model-dir", model_dir, "--critic-dir", model_dir,
            "--out", str(out)]


def train_params(tmp_path: Path, model_dir: str, env: dict | None = None) -> str:
    """Two iterations of the toy run, a checkpoint after each; `env` replaces the env section."""
    params = toy_params(model_dir, 2).model_dump()
    if env is not None:
        params["env"] = env
    return write_params(tmp_path / "params.yaml", params)


def policy_loss_steps(out: Path) -> list[int]:
    return list(pd.read_csv(out / "live/plots/metrics/train/policy_loss.tsv", sep="\t")["step"])


def workers_of_this_process() -> list[int]:
    """Env worker processes this test process started that are still running."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"longturn.envs.worker_main" in cmd and str(os.getpid()).encode() in cmd:
            pids.append(int(entry.name))
    return pids


def assert_iteration_0_kept_then_resumed(out: Path, params: str, model_dir: str, capsys,
                                         caplog) -> None:
    """After a stop in iteration 1: iteration 0 is whole; a rerun resumes after it and ends."""
    assert [c.name for c in complete_checkpoints(out / "checkpoints")] == ["iteration=0000"]
    assert verify(out / "checkpoints/iteration=0000") is None
    first = out / "trajectories/iteration=0000/part-00.parquet"
    assert len(pd.read_parquet(first)) == 6
    digest = file_sha256(first)
    assert policy_loss_steps(out) == [0]
    assert not (out / "final").exists()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="longturn.run.training"):
        assert train.main(argv(params, model_dir, out)) == 0, capsys.readouterr().err[-3000:]
    assert "resuming after iteration 0 " in caplog.text
    assert file_sha256(first) == digest  # not redone
    for it in (0, 1):
        assert len(pd.read_parquet(out / f"trajectories/iteration={it:04d}/part-00.parquet")) == 6
    assert not list(out.rglob(".*.tmp-*")) and not list(out.rglob("*.tmp"))
    assert policy_loss_steps(out) == [0, 1]
    assert (out / "final/config.json").is_file()


# --- the disk: full, then read-only, in the middle of a run ----------------------------------


def disk_full_under(monkeypatch, where: Path) -> None:
    """Parquet writes under `where` fail as on a full disk: a partial temp file, then ENOSPC
    without a file name (as Arrow raises it)."""
    real = pq.write_table

    def write(table, path, *args, **kwargs):
        if Path(path).is_relative_to(where):
            Path(path).write_bytes(b"PAR1 half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(table, path, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", write)


def test_full_disk_in_iteration_1_is_one_line_and_the_rerun_resumes(tiny_model_dir, tmp_path,
                                                                    capsys, caplog, monkeypatch):
    params, out = train_params(tmp_path, tiny_model_dir), tmp_path / "train"
    disk_full_under(monkeypatch, out / "trajectories/iteration=0001")

    code = train.main(argv(params, tiny_model_dir, out))

    err = capsys.readouterr().err
    part = out / "trajectories/iteration=0001/part-00.parquet"
    assert code == 2 and "Traceback" not in err
    assert stage_lines(err) == [f"train: error: {part}: no space left on device; free space or "
                                f"write elsewhere, then rerun {KEPT}"]
    assert not list(part.parent.iterdir())  # the partial temp file is gone
    monkeypatch.undo()  # space freed
    assert_iteration_0_kept_then_resumed(out, params, tiny_model_dir, capsys, caplog)


class ReadOnlyRemount:
    """From `now()` on, the file system under `root` is read-only: statvfs says so, and torch's
    writer fails there with the RuntimeError it raises for a file it cannot open (no errno)."""

    def __init__(self, monkeypatch, root: Path):
        self.root, self.on = root, False
        real_statvfs, real_save = os.statvfs, torch.save

        def statvfs(path):
            stat = real_statvfs(path)
            if self.on and Path(path).is_relative_to(root):
                return SimpleNamespace(f_flag=stat.f_flag | os.ST_RDONLY, f_bavail=stat.f_bavail,
                                       f_frsize=stat.f_frsize)
            return stat

        def save(obj, f, *args, **kwargs):
            if self.on and isinstance(f, (str, Path)) and Path(f).is_relative_to(root):
                raise RuntimeError(f"File {f} cannot be opened.")
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(os, "statvfs", statvfs)
        monkeypatch.setattr(torch, "save", save)

    def now(self) -> None:
        self.on = True


def test_read_only_remount_before_a_checkpoint_is_one_line_and_nothing_is_lost(
        tiny_model_dir, tmp_path, capsys, caplog, monkeypatch):
    """The remount comes after iteration 1's Parquet and update, before its checkpoint."""
    params, out = train_params(tmp_path, tiny_model_dir), tmp_path / "train"
    remount = ReadOnlyRemount(monkeypatch, out)
    real_write = training.score_and_write

    def write_then_remount(trainer, samples, part, metadata, **kwargs):
        written = real_write(trainer, samples, part, metadata, **kwargs)
        if part.parent.name == "iteration=0001":
            remount.now()
        return written

    monkeypatch.setattr(training, "score_and_write", write_then_remount)

    code = train.main(argv(params, tiny_model_dir, out))

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert stage_lines(err) == [
        f"train: error: {out / 'checkpoints/iteration=0001.tmp'}: read-only file system; write "
        f"to a writable place, then rerun {KEPT}"]
    monkeypatch.undo()  # remounted read-write
    assert_iteration_0_kept_then_resumed(out, params, tiny_model_dir, capsys, caplog)


# --- envs: one that hangs costs its episode; one that always fails stops the stage --------


def flaky_env(**kwargs) -> dict:
    return {"name": FLAKY, "tasks": ["corridor"], "kwargs": kwargs, "max_turns": 2,
            "step_timeout_s": 1.0, "max_retries": 1}


def test_a_hanging_reset_aborts_one_episode_and_training_goes_on(tiny_model_dir, tmp_path,
                                                                 capsys, caplog):
    """Slot 0's second episode hangs in reset: counted as a timeout, logged, its seed skipped."""
    seed = toy_params(tiny_model_dir, 2).seed
    hung = episode_seed(seed, 0, 0, 1)
    params = train_params(tmp_path, tiny_model_dir, flaky_env(hang_on_reset=[hung], hang_s=60))
    out = tmp_path / "train"

    with caplog.at_level(logging.WARNING, logger="longturn.envs.failures"):
        code = train.main(argv(params, tiny_model_dir, out))

    assert code == 0, capsys.readouterr().err[-3000:]
    aborts = [r.getMessage() for r in caplog.records if "episode aborted" in r.getMessage()]
    assert len(aborts) == 1
    assert re.match(rf"env flaky/corridor reset failed \(timeout\) on seed {hung} turn \d+, "
                    r"episode aborted: no answer to reset within 1 s", aborts[0])
    timeouts = pd.read_csv(out / "live/plots/metrics/train/termination/timeout.tsv", sep="\t")
    assert timeouts["timeout"].tolist() == [1, 0]
    frames = [pd.read_parquet(out / f"trajectories/iteration={i:04d}/part-00.parquet")
              for i in (0, 1)]
    assert all(len(f) == 6 for f in frames)
    turns = reply_rows(pd.concat(frames, ignore_index=True))  # a window sample: one reply
    assert len(turns) == 12
    assert hung not in set(turns["episode_seed"])  # the hung episode never played a turn
    assert not turns["aborted"].any()  # no turn was cut: only the reset hung
    assert (out / "final/config.json").is_file()


@pytest.mark.parametrize("fault, call, cause", [
    ({"raise_on_reset": "all"}, "reset", r"RuntimeError: reset of seed \d+ is broken"),
    ({"hang_on_reset": "all", "hang_s": 60}, "reset", r"no answer to reset within 1 s"),
    ({"raise_on_step": 1}, "step", r"RuntimeError: step 1 is broken"),  # inside iteration 0
])
def test_an_env_that_always_fails_stops_train_with_one_line(tiny_model_dir, tmp_path, capsys,
                                                            fault, call, cause):
    params = train_params(tmp_path, tiny_model_dir, flaky_env(**fault))
    out = tmp_path / "train"

    code = train.main(argv(params, tiny_model_dir, out))

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = stage_lines(err)
    seeds = {episode_seed(toy_params(tiny_model_dir, 2).seed, 0, slot, n)
             for slot in (0, 1) for n in (0, 1)}
    named = re.match(r"train: error: env 'flaky' task 'corridor' failed 2 times in a row, the "
                     rf"last on seed (\d+) \({call}, \w+: (.*)\); env\.max_retries is 1", line)
    assert named, line
    assert int(named.group(1)) in seeds and re.match(cause, named.group(2)), line
    assert not complete_checkpoints(out / "checkpoints") and not (out / "final").exists()
    assert not list(out.glob("trajectories/*/*.parquet"))
    assert workers_of_this_process() == []  # no env worker outlives the stage


def test_the_train_loop_stops_its_env_workers_when_it_raises(tiny_model_dir, tmp_path):
    """Checked while the caller still holds the exception (its frames hold the collector)."""
    params = toy_params(tiny_model_dir, 1).model_dump()
    params["env"] = flaky_env(raise_on_step=1)
    with pytest.raises(EnvGaveUp) as gave_up:
        run_training(parse_params(params), paths(tmp_path, tiny_model_dir), progress=False)
    assert "step 1 is broken" in str(gave_up.value)
    assert workers_of_this_process() == []


# --- the chat protocol: a tool plug-in that breaks its contract ----------------------------


EXAMPLE_TOOL_RESULTS = sum(m["role"] == "tool" for m in DEMONSTRATION)  # the worked example's
TOOL_MESSAGES = {  # what the model reads for each fault (FAULTS order)
    "raise": "Error: hostile failed: RuntimeError: the hostile tool broke on purpose",
    "flood": "x" * 300 + " …(cut)",  # rollout.chat.max_tool_response_chars: 300
    "not_text": "Error: hostile returned a dict as its text, not a str",
    "not_a_triple": "Error: hostile returned a str, not (text, reward, metrics)",
    "word_reward": "Error: hostile returned the reward 'a lot', not a finite number",
    "nan_reward": "Error: hostile returned the reward nan, not a finite number",
    "list_metrics": "Error: hostile returned metrics of type list, not a mapping",
}


class HostileCaller:
    """The policy of this probe: an episode's first reply calls the hostile tool once per fault,
    every later reply answers. Real token ids, so scoring and the update train on them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompt_ids, sampling):
        out = []
        for ids in prompt_ids:
            called = "the hostile tool broke on purpose" in self.tokenizer.decode(ids)
            text = "ANSWER: 0" if called else calling_reply()
            tokens = self.tokenizer.encode(text, add_special_tokens=False) + [self.im_end]
            out.append(Completion(tokens, [-0.5] * len(tokens), "stop"))
        return out

    def load_weights(self, weights):
        pass

    def close(self):
        pass


def test_conversation_training_survives_a_hostile_tool(tiny_model_dir, tmp_path, caplog,
                                                   monkeypatch):
    tools = tmp_path / "hostile_tools.yaml"
    tools.write_text(tools_yaml())
    params = combination_params(tiny_model_dir, "chat", "episode", "gae")
    params.rollout.n_envs = 2
    params.rollout.chat.tools = str(tools)
    params.rollout.chat.max_tokens = 2048
    params.rollout.chat.max_tool_response_chars = 300
    params.engine.sampling.max_new_tokens = 256
    monkeypatch.setattr(training, "make_engine",
                        lambda model_dir, params: HostileCaller(
                            training.load_tokenizer(Path(model_dir))))

    with caplog.at_level(logging.WARNING, logger="longturn.tasks.tools"):
        history = run_training(params, paths(tmp_path, tiny_model_dir), progress=False)

    assert len(history) == 2
    assert all(math.isfinite(m[k]) for m in history for k in ("policy_loss", "value_loss"))
    for it in (0, 1):
        frame = pd.read_parquet(tmp_path / f"trajectories/iteration={it:04d}/part-00.parquet")
        assert len(frame) == 2
        for row in frame.itertuples():
            results = [m["content"] for m in json.loads(row.messages) if m["role"] == "tool"]
            assert len(results) == EXAMPLE_TOOL_RESULTS + len(FAULTS), results
            assert dict(zip(FAULTS, results[EXAMPLE_TOOL_RESULTS:])) == TOOL_MESSAGES
            assert (row.tool_calls, row.tool_errors) == (len(FAULTS), len(FAULTS) - 1)
            # the raising episode reward counted 0: every reply's reward and token reward finite
            assert all(math.isfinite(r["reward"]) for r in row.replies)
            assert all(math.isfinite(r) for r in row.token_rewards)
            assert row.assistant_turns >= 2  # the episode went on after the tool results
            assert row.tokenization_check == "identical"
    warned = [r.getMessage() for r in caplog.records if r.name == "longturn.tasks.tools"]
    assert len(warned) == 2 * 2 * len(FAULTS)  # each broken call and episode reward, logged
    assert (tmp_path / "final/config.json").is_file()
