"""LoongForge: training-acceleration middleware for VLA and multimodal MoE models.

The heavy work lives in the C++ core (``loongforge._C``); this package adapts it to PyTorch.
"""
from __future__ import annotations

from typing import Any, Dict

from . import _cuda_env  # first: sets CUDA_DEVICE_MAX_CONNECTIONS before CUDA starts
from . import _C
from ._C import DataLossError, ResourceExhaustedError
from .data import DataFusionLoader
from . import packing
from . import sample_rng
from .ckpt import CheckpointVault
from .comm import NexusSync
from .forge import Forge, ForgeError, NonFiniteError
from .models import Gr00tConfig, Gr00tPolicy, get_config, load_safetensors
from .memory import MemSculptor, plan_trace, replay_trace, trace_from_snapshot
from .packing import demo_data, inspect_db, pack

__version__: str = _C.build_info()["version"]


def build_info() -> Dict[str, Any]:
    """Version, git hash, CUDA on/off, GPU architectures, nvJPEG/cuFile/NCCL found or not."""
    return dict(_C.build_info())


__all__ = ["build_info", "Gr00tConfig", "Gr00tPolicy", "get_config", "load_safetensors", "demo_data", "pack", "inspect_db", "packing", "sample_rng", "DataFusionLoader", "CheckpointVault", "NexusSync", "Forge", "ForgeError", "NonFiniteError", "MemSculptor", "plan_trace", "replay_trace",
           "trace_from_snapshot", "DataLossError", "ResourceExhaustedError", "__version__"]
