"""LoongForge: training-acceleration middleware for VLA and multimodal MoE models.

The heavy work lives in the C++ core (``loongforge._C``); this package adapts it to PyTorch.
"""
from __future__ import annotations

from typing import Any, Dict

from . import _C
from ._C import DataLossError, ResourceExhaustedError
from .data import DataFusionLoader

__version__: str = _C.build_info()["version"]


def build_info() -> Dict[str, Any]:
    """Version, git hash, CUDA on/off, GPU architectures, nvJPEG/cuFile/NCCL found or not."""
    return dict(_C.build_info())


__all__ = ["build_info", "DataFusionLoader", "DataLossError", "ResourceExhaustedError", "__version__"]
