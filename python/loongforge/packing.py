"""Dataset tools: synthetic demo data, packing episode folders or LeRobot datasets into LMDB,
reading an episode back, inspecting a DB.

Thin wrappers over ``loongforge._C`` (the work runs in C++ with the GIL released). The formats are
described in docs/DATASET.md. Errors arrive as ``ValueError`` (bad input: the message names the
file and line), ``FileNotFoundError`` (missing file/folder/frame), ``FileExistsError`` (output exists).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

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


def pack_lerobot(src: str, out: str, *, episodes: str = "", cameras: Optional[Sequence[str]] = None,
                 size: Optional[Tuple[int, int]] = None, shortest_edge: int = 256,
                 quality: int = 90, modality: str = "", horizon: int = 16,
                 tokenizer: str = "byte-v1", threads: int = 0, overwrite: bool = False,
                 progress: bool = False, max_instruction_bytes: int = 4096,
                 tolerance_s: float = 1e-4) -> Dict[str, Any]:
    """Packs the LeRobot dataset ``src`` (v2.0, v2.1, v3.0) into the LMDB ``out``.

    ``episodes`` selects LeRobot episode indices ("0,3,5-9"); ``cameras`` video keys or names;
    frames are stored as JPEG at ``size`` (width, height) or with the shortest edge
    ``shortest_edge``. ``modality`` is GR00T's modality.json (default: ``src/meta/modality.json``
    when present; "none" ignores it). Every file is checked before the DB becomes visible; bad
    input raises ``ValueError`` / ``FileNotFoundError`` naming the file (and column, row or frame)
    and leaves no DB behind. A build without FFmpeg raises ``RuntimeError`` saying so.
    """
    w, h = size if size is not None else (0, 0)
    return dict(_C.pack_lerobot(src, out, episodes=episodes, cameras=list(cameras or []),
                                width=w, height=h, shortest_edge=shortest_edge, quality=quality,
                                modality=modality, horizon=horizon, tokenizer=tokenizer,
                                threads=threads, overwrite=overwrite, progress=progress,
                                max_instruction_bytes=max_instruction_bytes,
                                tolerance_s=tolerance_s))


def read_episode(db: str, episode_index: int) -> Dict[str, Any]:
    """One episode of a DB packed by :func:`pack_lerobot`, raw (unnormalized).

    Returns ``state`` [T, S] and ``action`` [T, A] (float32 numpy), ``timestamp``,
    ``frame_index``, ``task_index``, ``task`` (the first row's text), ``tasks`` (per row) and
    ``images``: {camera: uint8 [T, H, W, 3]}. ``FileNotFoundError`` for an episode the DB lacks.
    """
    return dict(_C.read_episode(db, episode_index))


def have_video_decoder() -> bool:
    """True when this build can decode video (FFmpeg), as :func:`pack_lerobot` needs."""
    return bool(_C.have_video_decoder())


def inspect_db(db: str, sample: int = 0) -> Dict[str, Any]:
    """Schema, counts, per-modality sizes and sample ``sample`` decoded."""
    return dict(_C.inspect(db, sample))


__all__ = ["demo_data", "pack", "pack_lerobot", "read_episode", "have_video_decoder",
           "inspect_db"]
