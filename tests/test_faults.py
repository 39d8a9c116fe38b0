"""Faults a user hits on a finished run are named in one line, and finished work is kept.

Probed on a copy of a small finished train run: a damaged newest checkpoint (resume falls back to
the newest intact one), broken model dirs, a kill during the final export, a trajectory file
with a column dropped or renamed, and a full or read-only disk.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components import train, validate_prompts, zero_shot_eval
from components.common import parser, run
from longturn import atomic
from longturn.algo.batches import read_sample_batch
from longturn.run.checkpoints import CheckpointStore, verify
from longturn.errors import ModelDirError, OutputNotWritable, SettingError, TrajectoryFileError
from longturn.run.models import check_model_dir
from longturn.trajectories import read_table
from test_conversation_pipeline import one_reply_sequence_params
from test_pipeline_smoke import toy_params, write_params
from test_train_stage import ROOT, train_cmd
from test_train_stage import write_params as train_params


def stage_lines(err: str, stage: str) -> list[str]:
    """The stage's own lines on stderr (progress bars and logs go there too)."""
    return [line for line in err.splitlines() if line.startswith(f"{stage}:")]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A train stage run of 2 iterations (checkpoint each), as `components/train.py` leaves it."""
    root = tmp_path_factory.mktemp("finished")
    params = train_params(root, tiny_model_dir, iterations=2)
    proc = subprocess.run(train_cmd(params, tiny_model_dir, root / "train"), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def copy_run(finished_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


# --- checkpoints: a manifest, verified newest first ------------------------------------------


class FakeTrainer:
    """What CheckpointStore.write needs of a trainer: files under a dir, a rank, a digest."""

    rank = 0

    def __init__(self, fail: BaseException | None = None):
        self.fail = fail

    def save_checkpoint(self, directory: Path, client_state: dict) -> None:
        (directory / "actor").mkdir(parents=True)
        (directory / "actor/weights.bin").write_bytes(os.urandom(4096))
        if self.fail is not None:
            raise self.fail

    def weights_digest(self) -> str:
        return "0" * 64


def checkpoints(root: Path, iterations: int) -> CheckpointStore:
    store = CheckpointStore(root, keep=3)
    for it in range(iterations):
        store.write(FakeTrainer(), b"collector", it)
        store.commit(it, [{"iteration": it}])
    return store


def test_checkpoint_manifest_lists_every_file(tmp_path):
    store = checkpoints(tmp_path, 1)
    ckpt = store.latest()
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    assert set(manifest) == {"actor/weights.bin", "collector_rank0.pkl", "history.pkl",
                             "weights_digest_rank0.txt"}
    assert manifest["actor/weights.bin"][0] == 4096
    assert "manifest" in (ckpt / "COMPLETE").read_text() and verify(ckpt) is None


@pytest.mark.parametrize("damage, named", [
    (lambda c: (c / "actor/weights.bin").write_bytes(b"x" * 100),
     "actor/weights.bin is 100 bytes, the manifest says 4096"),
    (lambda c: (c / "actor/weights.bin").write_bytes(os.urandom(4096)),
     "actor/weights.bin does not match its sha256"),
    (lambda c: (c / "history.pkl").unlink(), "history.pkl is missing"),
    (lambda c: (c / "MANIFEST.json").write_text("{}"), "MANIFEST.json does not match"),
    (lambda c: (c / "MANIFEST.json").unlink(), "MANIFEST.json is missing"),
])
def test_damaged_newest_checkpoint_falls_back(tmp_path, caplog, damage, named):
    store = checkpoints(tmp_path, 2)
    damage(tmp_path / "iteration=0001")
    with caplog.at_level(logging.WARNING, logger="longturn.run.checkpoints"):
        assert store.latest() == tmp_path / "iteration=0000"
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert f"{tmp_path / 'iteration=0001'} skipped, damaged: {named}" in message


def test_no_intact_checkpoint_starts_over(tmp_path, caplog):
    store = checkpoints(tmp_path, 1)
    (tmp_path / "iteration=0000/history.pkl").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="longturn.run.checkpoints"):
        assert store.latest() is None
    assert "no intact checkpoint" in caplog.text


def test_checkpoint_from_before_manifests_is_accepted(tmp_path):
    store = checkpoints(tmp_path, 1)
    ckpt = tmp_path / "iteration=0000"
    (ckpt / "MANIFEST.json").unlink()
    (ckpt / "COMPLETE").write_text("0\n")  # what the store wrote before manifests
    assert store.latest() == ckpt


def test_resume_skips_a_truncated_checkpoint(finished_run, tiny_model_dir, tmp_path):
    run_dir = copy_run(finished_run, tmp_path)
    out = run_dir / "train"
    damaged = out / "checkpoints/iteration=0001/actor/state/mp_rank_00_model_states.pt"
    size = damaged.stat().st_size
    os.truncate(damaged, 1000)
    params = train_params(run_dir, tiny_model_dir, iterations=3)

    proc = subprocess.run(train_cmd(params, tiny_model_dir, out), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"iteration=0001 skipped, damaged: actor/state/mp_rank_00_model_states.pt is 1000 "
            f"bytes, the manifest says {size}") in proc.stderr
    assert "resuming after iteration 0 " in proc.stderr
    assert sorted(d.name for d in (out / "trajectories").iterdir()) == [
        f"iteration={i:04d}" for i in range(3)]
    steps = pd.read_csv(out / "live/plots/metrics/train/policy_loss.tsv", sep="\t")["step"]
    assert list(steps) == [0, 1, 2]
    assert verify(out / "checkpoints/iteration=0001") is None  # redone and replaced
    check_model_dir(out / "final")


# --- model dirs: one line naming the dir -------------------------------------------------------


def broken_model_dirs(tiny: str, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (dir, what the message must say)."""
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny, truncated)
    os.truncate(truncated / "model.safetensors", 5_000_000)
    empty = tmp_path / "empty"
    empty.mkdir()
    no_config = tmp_path / "no_config"
    shutil.copytree(tiny, no_config)
    (no_config / "config.json").unlink()
    bad_config = tmp_path / "bad_config"
    shutil.copytree(tiny, bad_config)
    (bad_config / "config.json").write_text('{"model_type": "lla')
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(tiny, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    return {
        "truncated": (truncated, f"model dir {truncated}: model.safetensors is truncated: "
                                 "5000000 bytes of the"),
        "missing": (tmp_path / "missing", f"model dir {tmp_path / 'missing'} does not exist"),
        "empty": (empty, f"model dir {empty} is empty"),
        "no_config": (no_config, f"model dir {no_config} has no config.json"),
        "bad_config": (bad_config, f"model dir {bad_config}: config.json is not valid JSON"),
        "no_tokenizer": (no_tokenizer, f"model dir {no_tokenizer} has no tokenizer"),
    }


def test_check_model_dir_names_the_problem(tiny_model_dir, tmp_path):
    assert check_model_dir(tiny_model_dir) == Path(tiny_model_dir)
    for name, (path, says) in broken_model_dirs(tiny_model_dir, tmp_path).items():
        with pytest.raises(ModelDirError) as err:
            check_model_dir(path)
        assert str(err.value).startswith(says), name


@pytest.mark.parametrize("name", ["truncated", "missing", "empty"])
def test_eval_stage_on_a_broken_model_dir_is_one_line(tiny_model_dir, tmp_path, capsys, name):
    path, says = broken_model_dirs(tiny_model_dir, tmp_path)[name]
    params = write_params(tmp_path / "params.yaml", toy_params(tiny_model_dir))
    code = zero_shot_eval.main(["--params", params, "--model-dir", str(path),
                                "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = stage_lines(err, "zero_shot_eval")
    assert len(lines) == 1 and lines[0].startswith(f"zero_shot_eval: error: {says}")
    assert not (tmp_path / "eval").exists()


def test_train_stage_checks_the_critic_dir(tiny_model_dir, tmp_path, capsys):
    params = train_params(tmp_path, tiny_model_dir, iterations=1)
    code = train.main(["--params", params, "--model-dir", tiny_model_dir, "--critic-dir",
                       str(tmp_path / "no_critic"), "--out", str(tmp_path / "train")])
    assert code == 2
    assert stage_lines(capsys.readouterr().err, "train") == [
        f"train: error: model dir {tmp_path / 'no_critic'} does not exist"]
    assert not (tmp_path / "train").exists()


# --- the final export: atomic -------------------------------------------------------------------

KILLED_EXPORT = textwrap.dedent("""
    import os, signal, sys
    from types import SimpleNamespace
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from longturn.algo import trainer

    tiny, out = sys.argv[1], sys.argv[2]
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tokenizer.save_pretrained = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    fake = SimpleNamespace(actor_module=AutoModelForCausalLM.from_pretrained(tiny),
                           settings=SimpleNamespace(zero_stage=0), tokenizer=tokenizer,
                           vision_dir=None)
    trainer.PPOTrainer.export_actor(fake, out)  # killed after the weights, before the tokenizer
""")


def test_sigkill_during_final_export_leaves_no_final(tiny_model_dir, tmp_path):
    final = tmp_path / "train/final"
    proc = subprocess.run([sys.executable, "-c", KILLED_EXPORT, tiny_model_dir, str(final)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    leftovers = list(final.parent.glob(".final.tmp-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").is_file()  # it was killed
    assert not final.exists()  # ... and nothing reads as a model

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from longturn.algo.trainer import PPOTrainer

    fake = SimpleNamespace(actor_module=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           settings=SimpleNamespace(zero_stage=0),
                           tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
                           vision_dir=None)
    PPOTrainer.export_actor(fake, final)  # the next export replaces the leftovers
    check_model_dir(final)
    assert not list(final.parent.glob(".final.tmp-*"))


def test_failed_export_keeps_the_previous_dir(tmp_path):
    final = tmp_path / "final"
    with atomic.atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic.atomic_dir(final) as tmp:
            (tmp / "config.json").write_text('{"half": true}')
            raise RuntimeError("boom")
    assert (final / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["final"]


# --- trajectory Parquet: the file and the column ----------------------------------------------


def damaged_parquet(src: Path, dst: Path, how: str) -> Path:
    table = pq.read_table(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if how == "dropped":
        pq.write_table(table.drop(["old_logprobs"]), dst)
    elif how == "renamed":  # rename_columns drops the file's metadata: put it back
        renamed = table.rename_columns(
            ["advantage" if c == "advantages" else c for c in table.column_names])
        pq.write_table(renamed.replace_schema_metadata(table.schema.metadata), dst)
    else:
        dst.write_bytes(src.read_bytes()[:3000])
    return dst


@pytest.mark.parametrize("how, says", [
    ("dropped", "has no column 'old_logprobs'; column names are a contract"),
    ("renamed", "has no column 'advantages' (it has 'advantage': renamed?)"),
    ("truncated", "is not a readable Parquet file (truncated or damaged?): Parquet magic bytes"),
])
def test_damaged_trajectory_names_file_and_column(finished_run, tmp_path, how, says):
    src = finished_run / "train/trajectories/iteration=0001/part-00.parquet"
    path = damaged_parquet(src, tmp_path / "iteration=0001/part-00.parquet", how)
    with pytest.raises(TrajectoryFileError) as err:
        read_sample_batch([src, path])
    assert str(err.value).startswith(f"{path} {says}") and "\n" not in str(err.value)


def test_evaluation_file_is_not_a_training_batch(finished_run, tmp_path):
    table = pq.read_table(finished_run / "train/trajectories/iteration=0000/part-00.parquet")
    i = table.schema.get_field_index("old_logprobs")
    evaluation = tmp_path / "turns.parquet"  # evaluations leave the training columns null
    pq.write_table(table.set_column(i, "old_logprobs", pa.nulls(len(table), table.field(i).type)),
                   evaluation)
    with pytest.raises(TrajectoryFileError) as err:
        read_sample_batch([evaluation])
    assert str(err.value).startswith(f"{evaluation}: column 'old_logprobs' has nulls")


def test_episode_file_with_a_renamed_column_is_named(tmp_path):
    path = tmp_path / "episodes.parquet"
    pq.write_table(pa.table({"task": ["goto"], "sucess": [True]}), path)
    with pytest.raises(TrajectoryFileError) as err:
        read_table(path, ["task", "success"])
    assert str(err.value).startswith(f"{path} has no column 'success' (it has 'sucess': renamed?)")


def test_replay_of_a_renamed_column_is_one_line(finished_run, tiny_model_dir, tmp_path):
    run_dir = copy_run(finished_run, tmp_path)
    it = run_dir / "train/trajectories/iteration=0001"
    damaged_parquet(it / "part-00.parquet", it / "part-00.parquet", "renamed")
    params = train_params(tmp_path, tiny_model_dir, iterations=2)
    proc = subprocess.run(train_cmd(params, tiny_model_dir, run_dir / "train", "--replay",
                                    str(it)), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert stage_lines(proc.stderr, "train") == [
        f"train: error: {it / 'part-00.parquet'} has no column 'advantages' (it has "
        "'advantage': renamed?); column names are a contract: docs/design.md §4"]


# --- full and read-only disks: one line naming the path, finished outputs kept -----------------


def failing_parquet_writes(monkeypatch, name: str, code: int) -> None:
    """pq.write_table fails with `code` (no file name, as Arrow does) for files called `name`."""
    real = pq.write_table

    def write(table, where, *args, **kwargs):
        if Path(where).name.startswith(f".{name}.tmp-"):
            Path(where).write_bytes(b"PAR1 half")  # a partial temp file, as a full disk leaves
            raise OSError(code, os.strerror(code))
        return real(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", write)


def test_full_disk_keeps_the_finished_evaluation(tiny_model_dir, tmp_path, capsys, monkeypatch):
    params = toy_params(tiny_model_dir)
    params["eval"].update(tasks=["goto"], episodes_per_task=2)
    path = write_params(tmp_path / "params.yaml", params)
    out = tmp_path / "eval"
    failing_parquet_writes(monkeypatch, "turns.parquet", errno.ENOSPC)

    code = zero_shot_eval.main(["--params", path, "--model-dir", tiny_model_dir, "--out", str(out)])

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert stage_lines(err, "zero_shot_eval") == [
        f"zero_shot_eval: error: {out / 'turns.parquet'}: no space left on device; free space or "
        "write elsewhere, then rerun (outputs already written are kept)"]
    assert json.loads((out / "metrics.json").read_text())["overall"]["episodes"] == 2
    assert len(pd.read_parquet(out / "episodes.parquet")) == 2
    # the journal stays until every output is written: a rerun assembles them without playing
    assert sorted(p.name for p in out.iterdir()) == ["episodes.parquet", "metrics.json", "partial",
                                                   "summary.json"]


def _eval_params(model_dir: str, protocol: str) -> dict:
    """Two eval episodes of either protocol at toy size."""
    if protocol == "action":
        params = toy_params(model_dir)
        params["eval"].update(tasks=["goto"], episodes_per_task=2)
        return params
    return one_reply_sequence_params(model_dir)


@pytest.mark.parametrize("protocol", ["action", "chat"])
def test_a_failed_episodes_write_still_writes_the_turns(tiny_model_dir, tmp_path, capsys,
                                                        monkeypatch, protocol):
    """Every output is tried, whichever protocol played: the one write that failed is named,
    the others are on disk, and the journal stays for the rerun."""
    path = write_params(tmp_path / "params.yaml", _eval_params(tiny_model_dir, protocol))
    out = tmp_path / "eval"
    failing_parquet_writes(monkeypatch, "episodes.parquet", errno.ENOSPC)

    code = zero_shot_eval.main(["--params", path, "--model-dir", tiny_model_dir, "--out", str(out)])

    err = capsys.readouterr().err
    assert code == 2 and f"{out / 'episodes.parquet'}: no space left on device" in err
    assert json.loads((out / "metrics.json").read_text())["overall"]["episodes"] == 2
    assert len(pd.read_parquet(out / "turns.parquet")) >= 2
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "partial", "summary.json",
                                                   "turns.parquet"]


def test_read_only_disk_is_one_line_and_no_gate_marker(tiny_model_dir, tmp_path, capsys,
                                                       monkeypatch):
    params = toy_params(tiny_model_dir)
    params["eval"]["tasks"] = ["goto"]
    path = write_params(tmp_path / "params.yaml", params)
    out = tmp_path / "validation"
    failing_parquet_writes(monkeypatch, "samples.parquet", errno.EROFS)

    code = validate_prompts.main(["--params", path, "--model-dir", tiny_model_dir,
                                  "--out", str(out)])

    assert code == 2
    assert stage_lines(capsys.readouterr().err, "validate_prompts") == [
        f"validate_prompts: error: {out / 'samples.parquet'}: read-only file system; write to a "
        "writable place, then rerun (outputs already written are kept)"]
    assert not (out / "passed").exists() and not list(out.iterdir())


def test_full_disk_during_a_checkpoint_keeps_the_last_one(tmp_path, monkeypatch):
    store = checkpoints(tmp_path, 1)
    full = SimpleNamespace(f_flag=0, f_bavail=0, f_frsize=4096)
    monkeypatch.setattr(atomic.os, "statvfs", lambda _: full)
    torch_like = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576")
    with pytest.raises(OutputNotWritable) as err:
        store.write(FakeTrainer(fail=torch_like), b"collector", 1)
    assert str(err.value).startswith(f"{tmp_path / 'iteration=0001.tmp'}: no space left on device")
    assert not (tmp_path / "iteration=0001.tmp").exists()  # the space is given back
    monkeypatch.undo()
    assert store.latest() == tmp_path / "iteration=0000"


def fake_stage(error: BaseException, argv: list[str]) -> int:
    def body(args, params):
        raise error
    p = parser("fake")
    p.add_argument("--out", default="out")
    return run("fake", body, p, argv)


def test_permission_denied_names_the_file(tmp_path, capsys):
    params = write_params(tmp_path / "params.yaml", {})
    denied = OSError(errno.EACCES, "Permission denied", str(tmp_path / "x.json"))
    assert fake_stage(denied, ["--params", params]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fake: error: {tmp_path / 'x.json'}: permission denied; make it accessible to this user "
        "or use another path (outputs already written are kept)")


def test_a_bug_keeps_its_traceback(tmp_path):
    params = write_params(tmp_path / "params.yaml", {})
    with pytest.raises(RuntimeError, match="a real bug"):
        fake_stage(RuntimeError("a real bug"), ["--params", params, "--out", str(tmp_path)])


def test_user_errors_are_one_line_and_a_plain_value_error_is_a_bug(tmp_path, capsys,
                                                                    monkeypatch):
    params = write_params(tmp_path / "params.yaml", {})
    argv = ["--params", params, "--out", str(tmp_path)]
    assert fake_stage(SettingError("env 'nope' is not registered"), argv) == 2
    assert capsys.readouterr().err.strip() == "fake: error: env 'nope' is not registered"
    shape = ValueError("Expected input batch_size (4) to match target batch_size (3)")
    with pytest.raises(ValueError, match="batch_size"):  # torch's kind: a bug, traceback kept
        fake_stage(shape, argv)
    monkeypatch.setenv("LONGTURN_DEBUG", "1")
    with pytest.raises(SettingError):  # debugging: the user error's traceback too
        fake_stage(SettingError("x"), argv)


STAGE_SCRIPTS = sorted(p.stem for p in (ROOT / "components").glob("*.py")
                       if p.stem not in ("__init__", "common", "python_check"))


def test_a_stage_run_by_a_python_without_longturn_says_so_in_one_line():
    """`dvc repro` from a shell whose `python` is not the venv's: `-S` leaves site-packages (the
    project's install, torch) out, as a bare system Python would."""
    assert len(STAGE_SCRIPTS) == 7
    for stage in STAGE_SCRIPTS:
        proc = subprocess.run([sys.executable, "-S", f"components/{stage}.py", "--help"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and proc.stdout == "", (stage, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, stage
        assert f"{sys.executable} has no 'components' module" in proc.stderr
        assert "make repro" in proc.stderr and "source .venv/bin/activate" in proc.stderr
    module = subprocess.run([sys.executable, "-m", "components.prepare_model", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert module.returncode == 0 and "--params" in module.stdout  # as Kubeflow tasks run it
