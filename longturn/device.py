"""Which device a rank's models live on: `engine.device` resolved once, the same for every part.

`auto` is the GPU of this rank (`LOCAL_RANK`, as torchrun sets it) when CUDA is available, else
the CPU; `cuda` insists on a GPU and says so when there is none; `cpu` keeps everything on the CPU
even on a GPU machine (DeepSpeed is then told to use its CPU accelerator before it picks CUDA).
The inference engine, scoring, the critic and the DeepSpeed engines all take this one device.
"""

from __future__ import annotations

import os

import torch

from longturn.errors import UserError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


class DeviceError(UserError):
    """The configured device cannot be used on this machine."""


def local_rank() -> int:
    """This process's GPU index among the node's ranks (0 outside a launcher)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def resolve_device(name: str = "auto") -> torch.device:
    """`engine.device` as a torch.device: cuda:LOCAL_RANK or cpu."""
    if name not in DEVICE_CHOICES:
        raise DeviceError(f"engine.device must be one of {', '.join(DEVICE_CHOICES)}, got {name!r}")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError("engine.device is 'cuda' but torch sees no CUDA device on this machine "
                          f"(torch {torch.__version__}); use 'auto' or 'cpu'")
    rank, count = local_rank(), torch.cuda.device_count()
    if rank >= count:
        raise DeviceError(f"LOCAL_RANK {rank} has no GPU: this node has {count}; start at most "
                          f"{count} ranks per node")
    return torch.device("cuda", rank)


def fast_bf16(device: torch.device) -> bool:
    """Does this device multiply in bf16 natively? A GPU that supports bf16, or a CPU with
    AVX512-BF16 or AMX. Elsewhere bf16 matmuls fall back to slow code: on a 2-core AVX2-only
    EPYC a 2048³ product ran at 0.3 GFLOP/s in bf16 against 176 in fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    capability = torch._C._cpu._get_cpu_capability()
    return bool(capability.get("avx512_bf16") or capability.get("amx_bf16"))


def resolve_dtype(name: str, device: torch.device) -> str:
    """`model.dtype`: `auto` is bfloat16 where the device computes it natively, else float32."""
    if name != "auto":
        return name
    return "bfloat16" if fast_bf16(device) else "float32"


def resolve_bf16(setting: bool | str, device: torch.device) -> bool:
    """`ppo.bf16`: `auto` turns bf16 autocast on where the device computes bf16 natively."""
    return fast_bf16(device) if setting == "auto" else bool(setting)


def pin_accelerator(device: torch.device) -> None:
    """Make DeepSpeed place its engines on `device`'s kind (it picks CUDA whenever it can)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        return
    # said, not left to DeepSpeed's detection, which warns in every stage that it found no GPU
    os.environ["DS_ACCELERATOR"] = "cpu"
    if torch.cuda.is_available():  # a CPU run on a GPU machine: DeepSpeed must not pick CUDA
        from deepspeed.accelerator import get_accelerator, set_accelerator

        if get_accelerator().device_name() != "cpu":
            from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

            set_accelerator(CPU_Accelerator())
