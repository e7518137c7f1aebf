"""Dataset tools: synthetic demo data, packing episode folders into LMDB, inspecting a DB.

Thin wrappers over ``loongforge._C`` (the work runs in C++ with the GIL released). The formats are
described in docs/DATASET.md. Errors arrive as ``ValueError`` (bad input: the message names the
file and line), ``FileNotFoundError`` (missing file/folder/frame), ``FileExistsError`` (output exists).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from . import _C


def demo_data(out: str, episodes: int = 8, cameras: int = 2, width: int = 640, height: int = 480,
              seed: int = 0, *, steps_min: int = 40, steps_max: int = 80, state_dim: int = 14,
              action_dim: int = 14, quality: int = 90, threads: int = 0, overwrite: bool = False,
              progress: bool = False, camera_names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Writes a synthetic robot dataset to ``<out>/episodes``; returns episode/step/frame counts."""
    return dict(_C.demo_data(out, episodes, cameras, width, height, seed, steps_min=steps_min,
                             steps_max=steps_max, state_dim=state_dim, action_dim=action_dim,
                             quality=quality, threads=threads, overwrite=overwrite,
                             progress=progress, camera_names=list(camera_names or [])))


def pack(src: str, out: str, horizon: int = 16, overwrite: bool = False, *,
         tokenizer: str = "byte-v1", threads: int = 0, progress: bool = False,
         max_instruction_bytes: int = 4096) -> Dict[str, Any]:
    """Validates the episode folder ``src`` and packs it into the LMDB ``out``; returns the schema.

    ``overwrite`` replaces only a LoongForge DB at ``out``; any other file or folder there raises
    ``FileExistsError`` and is left as it is. Instructions longer than ``max_instruction_bytes``
    raise ``ValueError`` naming the file and line. A concurrent pack to the same ``out`` raises
    ``RuntimeError``; a full disk raises ``loongforge.ResourceExhaustedError``.
    """
    return dict(_C.pack(src, out, horizon, overwrite, tokenizer=tokenizer, threads=threads,
                        progress=progress, max_instruction_bytes=max_instruction_bytes))


def inspect_db(db: str, sample: int = 0) -> Dict[str, Any]:
    """Schema, counts, per-modality sizes and sample ``sample`` decoded."""
    return dict(_C.inspect(db, sample))


__all__ = ["demo_data", "pack", "inspect_db"]
