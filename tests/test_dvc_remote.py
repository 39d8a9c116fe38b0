"""The DVC remote: the train stage pushing finished iterations and kept checkpoints mid-run, a
failed push only warning, and data pushed from one clone pulled into another and audited there."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import torch_extensions_env
from longturn.audit.cli import main as audit_main
from longturn.run.dvc_remote import (URL_REMOTE, find_repo_root, init_push_repo, pointer_for, pointers,
                                  push_training_outputs, resolve_remote)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env(home: Path) -> dict[str, str]:
    """A scratch HOME: the default remote, ~/longturn-dvc-storage, is private to the test."""
    return {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(ROOT),
            **torch_extensions_env(),
            "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _sh(cwd: Path, home: Path, *cmd: str) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, env=_env(home),
                          timeout=600)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def _dvc(cwd: Path, home: Path, *args: str) -> str:
    return _sh(cwd, home, str(BIN / "dvc"), *args)


def test_find_repo_root_and_pointer_paths(tmp_path):
    (tmp_path / "repo/.dvc").mkdir(parents=True)
    deep = tmp_path / "repo/data/train/trajectories"
    deep.mkdir(parents=True)
    assert find_repo_root(deep) == tmp_path / "repo"
    assert find_repo_root(tmp_path) is None
    source = deep / "iteration=0003"
    assert pointer_for(tmp_path / "repo", source) == (
        tmp_path / "repo/pushed/data/train/trajectories/iteration=0003")


def test_outside_a_dvc_repository_one_warning(tmp_path, caplog):
    (tmp_path / "trajectories/iteration=0000").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="longturn.run.dvc_remote"):
        for iteration in range(3):
            assert push_training_outputs(tmp_path / "trajectories", tmp_path / "checkpoints",
                                         iteration, None) == []
    assert len(caplog.records) == 1 and "not inside a DVC repository" in caplog.text


def test_a_failed_push_warns_naming_the_remote_and_the_command(tmp_path, caplog):
    repo = tmp_path / "repo"
    repo.mkdir()
    _dvc(repo, tmp_path, "init", "--no-scm", "-q")
    part = repo / "data/train/trajectories/iteration=0000/part-00.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"turns")
    with caplog.at_level(logging.WARNING, logger="longturn.run.dvc_remote"):
        pushed = push_training_outputs(repo / "data/train/trajectories",
                                       repo / "data/train/checkpoints", 0, "nowhere")
    assert pushed == []
    assert "'nowhere'" in caplog.text and "add" in caplog.text and "--to-remote" in caplog.text
    assert "training goes on" in caplog.text


def test_a_url_remote_in_a_run_dir_outside_any_checkout(tmp_path, monkeypatch):
    """What a Kubeflow task does: its scratch dir becomes a DVC repo with the project's remotes,
    and `train.remote` as a path (an s3:// URL works the same) receives the data."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    part = work / "trajectories/iteration=0000/part-00.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"turns of iteration 0")
    (work / "checkpoints/iteration=0000").mkdir(parents=True)
    (work / "checkpoints/iteration=0000/COMPLETE").write_text("0\n")
    assert init_push_repo(work, ROOT) == work
    assert "storage" in (work / ".dvc/config").read_text()  # the project's remotes came along
    bucket = tmp_path / "bucket"
    for iteration in (0, 0):  # the second call finds everything pushed
        push_training_outputs(work / "trajectories", work / "checkpoints", iteration, str(bucket))
    assert [p.as_posix() for p in pointers(work)] == [
        "pushed/checkpoints/iteration=0000.dvc", "pushed/trajectories/iteration=0000.dvc"]
    assert URL_REMOTE in (work / ".dvc/config.local").read_text()
    digest = _md5(part)
    assert (bucket / "files/md5" / digest[:2] / digest[2:]).read_bytes() == part.read_bytes()
    assert init_push_repo(work / "trajectories", ROOT) == work  # inside one already


@pytest.mark.parametrize("url, fs_name", [("s3://bucket/longturn", "S3FileSystem"),
                                           ("gs://bucket/longturn", "GSFileSystem")])
def test_object_store_urls_open_with_the_pinned_plugins(tmp_path, monkeypatch, url, fs_name):
    """`train.remote: s3://...` or `gs://...` becomes a remote DVC can open: without dvc-s3 /
    dvc-gs it raises RemoteMissingDepsError here, long before a push. Nothing is contacted."""
    from dvc.repo import Repo

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = init_push_repo(tmp_path / "work", ROOT)
    assert resolve_remote(repo, url) == URL_REMOTE
    with Repo(str(repo)) as dvc_repo:
        remote = dvc_repo.cloud.get_remote(URL_REMOTE)
        assert type(remote.fs).__name__ == fs_name and remote.path == url.split("://", 1)[1]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _train_stage_repo(repo: Path, home: Path, model_dir: str) -> None:
    """A scratch project: the repository's own .dvc/config and .gitignore, and a dvc.yaml whose
    train stage runs components/train.py at toy size with train.push on."""
    repo.mkdir()
    _sh(repo, home, "git", "init", "-q")
    _dvc(repo, home, "init", "-q")
    shutil.copy(ROOT / ".dvc/config", repo / ".dvc/config")
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    params = {
        "seed": 3, "model": {"source": model_dir, "dtype": "float32"},
        "env": {"tasks": ["goto"], "max_turns": 4},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 5}},
        "rollout": {"n_envs": 2, "turns_per_env": 3},
        "ppo": {"mini_batch_size": 6, "micro_batch_size": 3, "bf16": False, "lora": True},
        "train": {"iterations": 2, "checkpoint_every": 1, "keep_checkpoints": 1, "push": True},
    }
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    stage = {"cmd": f"python {ROOT / 'components/train.py'} --params params.yaml --model-dir "
                    f"{model_dir} --critic-dir {model_dir} --out data/train",
             "outs": [{"data/train/trajectories": {"persist": True}},
                      {"data/train/checkpoints": {"persist": True}}, "data/train/final"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}))
    _sh(repo, home, "git", "add", "-A")
    _sh(repo, home, "git", "commit", "-qm", "scratch")


def test_push_from_one_clone_pull_into_another_and_audit(tmp_path, tiny_model_dir, capsys):
    home = tmp_path / "home"  # the default remote is ~/longturn-dvc-storage
    home.mkdir()
    a = tmp_path / "a"
    _train_stage_repo(a, home, tiny_model_dir)
    storage = home / "longturn-dvc-storage"
    assert _dvc(a, home, "remote", "default").strip() == "storage"

    out = _dvc(a, home, "repro")
    assert "Running stage 'train'" in out
    # each iteration sends its own trajectories and the new checkpoint, never earlier ones again
    assert out.count("pushed 2 dirs to the DVC remote") == 2
    pointers = sorted(p.relative_to(a).as_posix() for p in (a / "pushed").rglob("*.dvc"))
    assert pointers == ["pushed/data/train/checkpoints/iteration=0001.dvc",  # 0000 was pruned
                        "pushed/data/train/trajectories/iteration=0000.dvc",
                        "pushed/data/train/trajectories/iteration=0001.dvc"]
    part = a / "data/train/trajectories/iteration=0000/part-00.parquet"
    digest = _md5(part)  # uploaded by the stage itself, before any `dvc push`
    assert (storage / "files/md5" / digest[:2] / digest[2:]).is_file()

    _dvc(a, home, "push")  # what `make push` runs
    _sh(a, home, "git", "add", "-A")
    _sh(a, home, "git", "commit", "-qm", "trained")

    b = tmp_path / "elsewhere/b"  # another parent folder: the default remote is the same
    b.parent.mkdir()
    _sh(tmp_path, home, "git", "clone", "-q", str(a), str(b))
    _dvc(b, home, "pull")  # what `make pull` runs
    for iteration in ("0000", "0001"):
        rel = f"data/train/trajectories/iteration={iteration}/part-00.parquet"
        assert _md5(b / rel) == _md5(a / rel)
        assert _md5(b / "pushed" / rel) == _md5(a / rel)
    assert (b / "pushed/data/train/checkpoints/iteration=0001/COMPLETE").is_file()
    assert _sh(b, home, "git", "status", "--porcelain").strip() == ""  # pulled data is ignored

    audit = [sys.executable, "-m", "longturn.audit"]  # the real entry, on what was pulled
    summary = json.loads(_sh(ROOT, home, *audit, "summary", str(b / "data/train"), "--json"))
    assert summary["iterations"] == [0, 1] and summary["overall"]["turns"] == 12
    assert audit_main(["gae", str(b / "data/train")]) == 0
    assert audit_main(["diff", str(a / "data/train"), str(b / "pushed/data/train")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("identical")
    damaged = tmp_path / "damaged"  # a copy: a pulled file may share its bytes with the cache
    shutil.copytree(b / "data/train/trajectories", damaged / "trajectories")
    part = damaged / "trajectories/iteration=0001/part-00.parquet"
    part.write_bytes(part.read_bytes()[:-100])
    proc = subprocess.run([*audit, "summary", str(damaged)], capture_output=True, text=True,
                          cwd=ROOT, env=_env(home))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and str(part) in proc.stderr


def test_make_push_and_pull_run_the_venv_dvc():
    proc = subprocess.run(["make", "-n", "push", "pull"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert ".venv/bin/dvc push" in lines and ".venv/bin/dvc pull" in lines
