"""Dataset tools: synthetic demo data, packing episode folders or LeRobot datasets into LMDB,
reading an episode back, inspecting a DB.

Thin wrappers over ``loongforge._C`` (the work runs in C++ with the GIL released). The formats are
described in docs/DATASET.md. Errors arrive as ``ValueError`` (bad input: the message names the
file and line), ``FileNotFoundError`` (missing file/folder/frame), ``FileExistsError`` (output exists).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from . import _C


def demo_data(out: str, *, progress: bool = False, camera_names: Optional[Sequence[str]] = None,
              **options: Any) -> Dict[str, Any]:
    """Writes a synthetic robot dataset to ``<out>/episodes``; returns episode/step/frame counts.

    Keyword options are the C++ ``DemoDataOptions`` fields (``_C.demo_data_options()`` lists
    each with its default: episodes, cameras, width, height, steps_min, steps_max, state_dim,
    action_dim, seed, quality, threads, overwrite). From Python the progress bar is off unless
    asked for."""
    return dict(_C.demo_data(out, progress=progress, camera_names=list(camera_names or []),
                             **options))


def pack(src: str, out: str, *, progress: bool = False, **options: Any) -> Dict[str, Any]:
    """Validates the episode folder ``src`` and packs it into the LMDB ``out``; returns the schema.

    Keyword options are the C++ ``PackOptions`` fields (``_C.pack_options()``: horizon,
    tokenizer, threads, overwrite, max_instruction_bytes, max_frame_pixels, with their defaults).
    ``overwrite`` replaces only a LoongForge DB at ``out``; any other file or folder there raises
    ``FileExistsError`` and is left as it is. Instructions longer than ``max_instruction_bytes``
    raise ``ValueError`` naming the file and line. A concurrent pack to the same ``out`` raises
    ``RuntimeError``; a full disk raises ``loongforge.ResourceExhaustedError``.
    """
    return dict(_C.pack(src, out, progress=progress, **options))


def pack_lerobot(src: str, out: str, *, cameras: Optional[Sequence[str]] = None,
                 size: Optional[Tuple[int, int]] = None, progress: bool = False,
                 **options: Any) -> Dict[str, Any]:
    """Packs the LeRobot dataset ``src`` (v2.0, v2.1, v3.0) into the LMDB ``out``.

    Keyword options are the C++ ``LeRobotPackOptions`` fields (``_C.pack_lerobot_options()``).
    ``episodes`` selects LeRobot episode indices ("0,3,5-9"); ``cameras`` video keys or names;
    frames are stored as JPEG at ``size`` (width, height) or with the shortest edge
    ``shortest_edge``. ``modality`` is GR00T's modality.json (default: ``src/meta/modality.json``
    when present; "none" ignores it). Every file is checked before the DB becomes visible; bad
    input raises ``ValueError`` / ``FileNotFoundError`` naming the file (and column, row or frame)
    and leaves no DB behind. A build without FFmpeg raises ``RuntimeError`` saying so.
    """
    if size is not None:
        if "width" in options or "height" in options:
            raise ValueError("pack_lerobot: give size=(width, height) or width/height, not both")
        options["width"], options["height"] = size
    return dict(_C.pack_lerobot(src, out, cameras=list(cameras or []), progress=progress,
                                **options))


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
