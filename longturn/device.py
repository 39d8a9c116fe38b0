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


def pin_accelerator(device: torch.device) -> None:
    """Make DeepSpeed place its engines on `device`'s kind (it picks CUDA whenever it can)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        return
    if torch.cuda.is_available():  # a CPU run on a GPU machine: DeepSpeed must not pick CUDA
        os.environ["DS_ACCELERATOR"] = "cpu"
        from deepspeed.accelerator import get_accelerator, set_accelerator

        if get_accelerator().device_name() != "cpu":
            from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

            set_accelerator(CPU_Accelerator())
