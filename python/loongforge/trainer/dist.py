"""The distributed context: rank, world size and device from the environment torchrun (or
``loongforge launch``) sets, and the process group (gloo on the CPU, NCCL on CUDA). Used by the
trainer and by ``loongforge.Forge``."""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist

from .errors import TrainError


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def ranks_from_env() -> Tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun and ``loongforge launch`` set them (0, 1, 0 when
    unset). ValueError for one that is not an integer."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))


def use_cuda(device_arg: str, cuda_available: Optional[bool] = None) -> bool:
    """Whether --device (auto, cpu or cuda) runs on CUDA; ``cuda_available``: whether torch sees
    a CUDA device (default: ask torch). TrainError for cuda without one, or another value."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if device_arg == "auto":
        return cuda_available
    if device_arg in ("cpu", "cuda"):
        if device_arg == "cuda" and not cuda_available:
            raise TrainError("--device cuda: torch sees no CUDA device")
        return device_arg == "cuda"
    raise TrainError(f"--device must be auto, cpu or cuda, got '{device_arg}'")


def setup_dist(device_arg: str, before_init: Optional[Callable[[torch.device], None]] = None) -> Dist:
    rank, world, local = ranks_from_env()
    cuda = use_cuda(device_arg)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    # Before torch initializes CUDA (set_device does): an allocator can be swapped only before
    # torch's own is initialized (e.g. MemSculptor).
    if before_init is not None:
        before_init(device)
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    return Dist(rank, world, local, device)
