"""Reference models trained by LoongForge (GR00T-N1.6-shaped VLA policy)."""
from __future__ import annotations

from .gr00t import (
    CONFIGS,
    Gr00tConfig,
    Gr00tPolicy,
    count_parameters,
    get_config,
    load_safetensors,
    save_safetensors,
)

__all__ = [
    "CONFIGS",
    "Gr00tConfig",
    "Gr00tPolicy",
    "count_parameters",
    "get_config",
    "load_safetensors",
    "save_safetensors",
]
