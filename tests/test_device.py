"""engine.device and the `auto` precisions: what they resolve to, and a stage asked for a GPU on a
machine without one stops with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from longturn import device as device_module
from longturn.device import (DeviceError, fast_bf16, resolve_bf16, resolve_device,
                             resolve_dtype)

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_cpu_and_auto_without_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == CPU and resolve_device("auto") == CPU
    with pytest.raises(DeviceError, match="engine.device is 'cuda'"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="must be one of"):
        resolve_device("tpu")


def test_auto_picks_the_local_ranks_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(DeviceError, match="LOCAL_RANK 2 has no GPU"):
        resolve_device("cuda")


@pytest.mark.parametrize("flags,native", [({"avx2": True}, False),
                                          ({"avx512_bf16": True}, True),
                                          ({"amx_bf16": True}, True)])
def test_auto_precision_follows_native_bf16(monkeypatch, flags, native) -> None:
    monkeypatch.setattr(torch._C._cpu, "_get_cpu_capability", lambda: flags)
    assert fast_bf16(CPU) is native
    assert resolve_dtype("auto", CPU) == ("bfloat16" if native else "float32")
    assert resolve_bf16("auto", CPU) is native
    assert resolve_dtype("float32", CPU) == "float32" and resolve_bf16(True, CPU) is True


def test_this_machines_answer_is_its_cpu_flags() -> None:
    flags = open("/proc/cpuinfo").read() if Path("/proc/cpuinfo").is_file() else ""
    expected = " avx512_bf16" in flags or " amx_bf16" in flags
    assert device_module.fast_bf16(CPU) is expected


def test_stage_asking_for_a_gpu_on_a_cpu_machine_is_one_line(tmp_path, tiny_model_dir) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["engine"]["device"] = "cuda"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [sys.executable, "components/zero_shot_eval.py", "--params", str(path),
         "--model-dir", tiny_model_dir, "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "engine.device is 'cuda' but torch sees no CUDA device" in proc.stderr
    assert "Traceback" not in proc.stderr
