"""Profiles as overlays (configs/profiles/) and params.yaml written from them: every profile
merges and validates into a file with every key, overlays restate nothing, the committed
params.yaml is what its profile writes, config.py is the one source of defaults, and a switch
shows in `dvc params diff`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ruamel.yaml import YAML

from longturn.params.config import Params
from longturn.cli.params import main as params_main
from longturn.params.file import hand_edits, render
from longturn.params.profiles import DEFAULT, EXTENDS, chain, leaves, resolve_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILES_DIR = ROOT / "configs" / "profiles"
PROFILES = sorted(PROFILES_DIR.glob("*.yaml"))
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_each_profile_writes_a_valid_params_file_with_every_key(path):
    written = yaml.safe_load(render(path))

    def present(key: str) -> bool:
        node = written
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True
    missing = [k for k in leaves(Params().model_dump(mode="json")) if not present(k)]
    assert not missing, f"{path.name}: params.yaml would lack {sorted(missing)}"


@pytest.mark.parametrize("path", [p for p in PROFILES if p.name != DEFAULT], ids=lambda p: p.stem)
def test_overlays_set_only_keys_that_change_their_parent(path):
    own = yaml.safe_load(path.read_text())
    own.pop(EXTENDS, None)
    parent = resolve_profile(chain(path)[-2])
    parent_leaves = leaves(parent)
    restated = [k for k, v in leaves(own).items() if parent_leaves.get(k, object()) == v]
    assert not restated, f"{path.name} restates its parent's values: {restated}"


def test_committed_params_yaml_is_what_its_profile_writes():
    assert hand_edits(ROOT / "params.yaml", PROFILES_DIR) is None


def test_default_differs_from_config_py_only_where_a_comment_says_why():
    """config.py holds the defaults; default.yaml may change one only with a comment on its line."""
    tree = YAML().load((PROFILES_DIR / DEFAULT).read_text())
    defaults = leaves(Params().model_dump(mode="json"))
    written = leaves(yaml.safe_load(render(PROFILES_DIR / DEFAULT)))
    changed = [k for k, v in written.items() if defaults.get(k) != v and k != "eval.tasks"]
    assert changed, "the default profile is config.py's defaults: nothing to check"
    uncommented = []
    for key in changed:
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            node = node[part]
        comment = node.ca.items.get(last)
        if not comment or comment[2] is None or "#" not in comment[2].value:
            uncommented.append(key)
    assert not uncommented, f"default.yaml changes config.py's default without a comment: {uncommented}"


def test_switch_refuses_hand_edits_unless_forced(tmp_path, capsys):
    out = tmp_path / "params.yaml"
    args = ["--out", str(out), "--dir", str(PROFILES_DIR)]
    assert params_main(["gpu1", *args]) == 0
    assert yaml.safe_load(out.read_text())["engine"]["device"] == "cuda"
    assert params_main(["--check", *args]) == 0
    out.write_text(out.read_text().replace("n_envs: 128", "n_envs: 64"))
    assert params_main(["--check", *args]) == 1
    assert params_main(["default", *args]) == 2
    assert "hand edits" in capsys.readouterr().err and "n_envs: 64" in out.read_text()
    assert params_main(["default", "--force", *args]) == 0
    assert out.read_text() == render(PROFILES_DIR / DEFAULT)


def test_unknown_profile_names_the_known_ones(tmp_path, capsys):
    assert params_main(["gpu9", "--out", str(tmp_path / "p.yaml"), "--dir", str(PROFILES_DIR)]) == 2
    err = capsys.readouterr().err
    assert "gpu9" in err and "gpu1" in err and "tools" in err


def test_an_overlay_value_that_does_not_validate_names_file_and_key(tmp_path, capsys):
    shutil.copy(PROFILES_DIR / DEFAULT, tmp_path / DEFAULT)
    (tmp_path / "bad.yaml").write_text("rollout:\n  n_envs: 0\n")
    assert params_main(["bad", "--out", str(tmp_path / "p.yaml"), "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "rollout.n_envs" in err


@pytest.mark.parametrize("overlay, key", [
    ("env:\n  tasks: [no-such-task]\n", "env.tasks"),
    ("env:\n  name: no_such_env\n", "env.name"),
])
def test_check_refuses_a_written_profile_whose_names_a_stage_would_refuse(
        tmp_path, capsys, overlay, key):
    shutil.copy(PROFILES_DIR / DEFAULT, tmp_path / DEFAULT)
    (tmp_path / "typo.yaml").write_text(overlay)
    args = ["--out", str(tmp_path / "p.yaml"), "--dir", str(tmp_path)]
    assert params_main(["typo", *args]) == 0  # written: the values validate, the names are unchecked
    capsys.readouterr()
    assert params_main(["typo", "--check", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("longturn params: error: ") and key in err and "\n" not in err
    assert params_main(["default", "--force", *args]) == 0
    assert params_main(["--check", *args]) == 0
    assert "names check out" in capsys.readouterr().out


def test_check_of_a_missing_file_is_one_line(tmp_path, capsys):
    assert params_main(["--check", "--out", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: no such file" in capsys.readouterr().err


def test_dvc_params_diff_shows_the_switch(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def run(*cmd: str) -> str:
        return subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True,
                              text=True).stdout

    run("git", "init", "-q")
    run("dvc", "init", "-q")
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    run("git", "add", "-A")
    run("git", "commit", "-qm", "default")
    assert params_main(["gpu1", "--out", str(tmp_path / "params.yaml"),
                        "--dir", str(PROFILES_DIR)]) == 0
    diff = json.loads(run("dvc", "params", "diff", "--json"))["params.yaml"]
    assert (diff["engine.device"]["old"], diff["engine.device"]["new"]) == ("auto", "cuda")
    assert (diff["rollout.n_envs"]["old"], diff["rollout.n_envs"]["new"]) == (8, 128)
