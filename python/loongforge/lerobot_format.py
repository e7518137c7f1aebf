"""LeRobot's batch contract on DataFusion batches (``DataFusionLoader(..., format="lerobot")``).

A DB packed from a LeRobot dataset stores every frame once with its raw state, raw action,
timestamp, episode and frame index, LeRobot's global ``index`` and task. This module reads those
rows once (``_C.read_frame_table``: a few bytes per frame, no images) and turns each batch of the
C++ loader into the dict ``LeRobotDataset.__getitem__`` gives, batched: the camera frames under
their LeRobot keys, ``observation.state`` and ``action`` raw, ``task``, ``episode_index``,
``frame_index``, ``timestamp``, ``index`` and ``task_index``.

``delta_timestamps`` are resolved as LeRobot resolves them
(lerobot/datasets/lerobot_dataset.py and utils.py): each offset in seconds must lie on the
dataset's fps grid within ``tolerance_s`` (``check_delta_timestamps``), becomes ``round(d * fps)``
frames (``get_delta_indices``), and sample ``idx`` of an episode whose rows are
``[ep_start, ep_end)`` reads rows ``max(ep_start, min(ep_end - 1, idx + k))`` with
``<key>_is_pad = idx + k < ep_start or idx + k >= ep_end`` (``_get_query_indices``). The gather
runs as tensor indexing on the batch's device, so a 50-step action chunk costs no decode time.
Camera keys take offsets too: the other frames are decoded by the loader's map-style path on the
consumer thread (slower than the pipeline; docs/data.md says when to use it).
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from . import _C

# LeRobot's default tolerance_s of LeRobotDataset.
DEFAULT_TOLERANCE_S = 1e-4
_LOW_DIM = ("observation.state", "action")


class LeRobotMeta:
    """What ``LeRobotDataset.meta`` gives a training script, for a DB packed from LeRobot.

    Attributes:
        fps: frames per second of the source dataset.
        camera_keys: the LeRobot keys of the cameras, in the DB's camera order.
        features: the keys a batch of this format has (for ``delta_timestamps``).
        stats: {"observation.state" | "action": {"mean", "std", "min", "max", "q01", "q99"}} as
            float32 tensors (the dataset's meta/stats.json where it had them, else computed
            from the packed rows; ``stats_from`` says which).
        episodes: [{"episode_index", "length"}] in the DB's order; tasks: {task_index: text}.
        info: the source's meta/info.json as packed ({} for DBs packed before it was stored);
        names: {feature: its names} (joint names of state and action); robot_type.
        total_frames, total_episodes: counts of this DB.
    """

    def __init__(self, db: str, schema: Dict[str, Any]) -> None:
        if not str(schema.get("source_format", "")).startswith("lerobot"):
            raise ValueError(f"{db}: format='lerobot' needs a DB packed from a LeRobot dataset "
                             "(loongforge pack --from-lerobot DIR --out DB); this one's source is "
                             f"{schema.get('source', '?')!r}")
        meta = schema.get("source_meta") or {}
        if isinstance(meta, str):
            meta = json.loads(meta)
        self.fps = float(schema["fps"])
        names = meta.get("camera_keys", {})
        self.camera_keys: List[str] = [str(names.get(c, f"observation.images.{c}"))
                                       for c in schema.get("cameras", [])]
        self.stats: Dict[str, Dict[str, torch.Tensor]] = {}
        for key, prefix in (("observation.state", "state"), ("action", "action")):
            self.stats[key] = {stat: torch.tensor(schema[f"{prefix}_{stat}"], dtype=torch.float32)
                               for stat in ("mean", "std", "min", "max", "q01", "q99")
                               if f"{prefix}_{stat}" in schema}
        self.stats_from = str(meta.get("stats_from", ""))
        self.episodes = [{"episode_index": int(e["episode_index"]), "length": int(e["length"])}
                         for e in meta.get("episodes", [])]
        self.tasks = {int(k): str(v) for k, v in meta.get("tasks", {}).items()}
        self.info: Dict[str, Any] = dict(meta.get("info") or {})
        self.names: Dict[str, List[str]] = {k: list(v) for k, v in
                                            (meta.get("feature_names") or {}).items()}
        self.robot_type = self.info.get("robot_type")
        self.total_frames = int(schema["num_samples"])
        self.total_episodes = len(self.episodes)
        self.features = list(_LOW_DIM) + self.camera_keys + [
            "timestamp", "frame_index", "episode_index", "index", "task_index"]


def delta_indices(delta_timestamps: Dict[str, Sequence[float]], meta: LeRobotMeta,
                  tolerance_s: float, db: str) -> Dict[str, List[int]]:
    """LeRobot's check_delta_timestamps + get_delta_indices: {key: frame offsets}, or ValueError
    naming the key and the offset that is not a feature or not on the fps grid."""
    if not isinstance(delta_timestamps, dict):
        raise TypeError(f"delta_timestamps must be a dict of key -> list of seconds, got "
                        f"{type(delta_timestamps).__name__}")
    if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, (int, float)) or \
            not tolerance_s >= 0:
        raise ValueError(f"tolerance_s must be a number >= 0, got {tolerance_s!r}")
    out: Dict[str, List[int]] = {}
    for key, deltas in delta_timestamps.items():
        if key not in _LOW_DIM and key not in meta.camera_keys:
            raise ValueError(f"delta_timestamps: {key!r} is not a feature of {db} that takes "
                             f"offsets (features: {', '.join(list(_LOW_DIM) + meta.camera_keys)})")
        if isinstance(deltas, (str, bytes)) or not hasattr(deltas, "__len__") or not len(deltas):
            raise ValueError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds, "
                             f"got {deltas!r}")
        idx = []
        for d in deltas:
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
                raise ValueError(f"delta_timestamps[{key!r}]: offset {d!r} is not a number of "
                                 "seconds")
            off = abs(d * meta.fps - round(d * meta.fps)) / meta.fps
            if off > tolerance_s:
                raise ValueError(f"delta_timestamps[{key!r}]: offset {d} s is {off:.3g} s off the "
                                 f"{meta.fps:g} fps frame grid of {db} (tolerance_s "
                                 f"{tolerance_s:g})")
            idx.append(int(round(d * meta.fps)))
        out[key] = idx
    return out


class LeRobotContract:
    """Turns the C++ loader's batches of one DB into LeRobot's batches (module docstring)."""

    def __init__(self, db: str, schema: Dict[str, Any], device: torch.device, layout: str,
                 delta_timestamps: Optional[Dict[str, Sequence[float]]],
                 tolerance_s: float) -> None:
        self.db = db
        self.meta = LeRobotMeta(db, schema)
        self.deltas = delta_indices(delta_timestamps or {}, self.meta, tolerance_s, db)
        table = _C.read_frame_table(db)
        self.device = device
        self.layout = layout
        self._cols = {k: torch.from_numpy(np.ascontiguousarray(table[k])).to(device)
                      for k in ("state", "action", "timestamp", "episode_index", "frame_index",
                                "task_index", "index", "episode_first", "episode_length")}
        self._cols["timestamp"] = self._cols["timestamp"].float()  # LeRobot's float32
        self._offsets = {k: torch.tensor(v, dtype=torch.int64, device=device)
                         for k, v in self.deltas.items()}

    def _rows(self, ids: torch.Tensor, key: str):
        """(query rows [B, T], is_pad [B, T]) of `key`'s offsets for sample ids [B] (>= 0)."""
        off = self._offsets[key]
        first = self._cols["episode_first"][ids].unsqueeze(1)
        last = first + self._cols["episode_length"][ids].unsqueeze(1) - 1
        q = ids.unsqueeze(1) + off.unsqueeze(0)
        pad = (q < first) | (q > last)
        return torch.max(torch.min(q, last), first), pad

    def convert(self, batch: Dict[str, Any], frames) -> Dict[str, Any]:
        """LeRobot's dict for the C++ batch `batch` (padding rows, sample_index -1, are zeros);
        `frames(ids)` decodes the camera frames [N, cams, ...] of sample ids [N] (history)."""
        ids_raw = batch["sample_index"].to(self.device).long()
        valid = ids_raw >= 0
        ids = ids_raw.clamp(min=0)
        out: Dict[str, Any] = {}
        images = batch["images"]
        for c, key in enumerate(self.meta.camera_keys):
            if key in self.deltas:
                rows, pad = self._rows(ids, key)
                now = images[:, c]
                stack = torch.empty((rows.shape[0], rows.shape[1]) + tuple(now.shape[1:]),
                                    dtype=now.dtype, device=now.device)
                zero = self._offsets[key] == 0
                other = rows[:, ~zero]
                if other.numel():
                    decoded = frames(other.reshape(-1))[:, c]
                    stack[:, ~zero] = decoded.reshape(other.shape + tuple(now.shape[1:]))
                stack[:, zero] = now.unsqueeze(1)
                out[key] = stack
                out[key + "_is_pad"] = pad | ~valid.unsqueeze(1)
            else:
                out[key] = images[:, c]
        for key, col in (("observation.state", "state"), ("action", "action")):
            table = self._cols[col]
            if key in self.deltas:
                rows, pad = self._rows(ids, key)
                out[key] = table[rows] * valid.view(-1, 1, 1).to(table.dtype)
                out[key + "_is_pad"] = pad | ~valid.unsqueeze(1)
            else:
                out[key] = table[ids] * valid.view(-1, 1).to(table.dtype)
        for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
            col = self._cols[key][ids]
            out[key] = torch.where(valid, col, torch.zeros_like(col))
        out["task"] = list(batch.get("task", [""] * int(ids.shape[0])))
        return out


# GR00T's Normalizer modes (gr00t/data/transform/state_action.py) and the statistics each reads.
GROOT_MODES = {"min_max": ("min", "max"), "q99": ("q01", "q99"), "mean_std": ("mean", "std"),
               "none": ()}


def groot_normalize(x: torch.Tensor, mode: str, stats: Dict[str, torch.Tensor]) -> torch.Tensor:
    """GR00T's per-key normalization of `x` [..., D] with that key's statistics [D]: min_max and
    q99 map [lo, hi] to [-1, 1] (q99 then clips to it; a constant dimension is 0 under min_max
    and left as it is under q99), mean_std is (x - mean) / std (a constant dimension is only
    centred, as the loader's own mean_std does)."""
    if mode == "none":
        return x
    if mode == "mean_std":
        std = stats["std"]
        return (x - stats["mean"]) / torch.where(std > 1e-6, std, torch.ones_like(std))
    lo, hi = stats[GROOT_MODES[mode][0]], stats[GROOT_MODES[mode][1]]
    same = lo == hi
    y = 2 * (x - lo) / torch.where(same, torch.ones_like(hi), hi - lo) - 1
    if mode == "min_max":
        return torch.where(same, torch.zeros_like(y), y)
    return torch.where(same, x, y).clamp(-1, 1)


class GrootContract(LeRobotContract):
    """GR00T's LeRobotSingleDataset step (gr00t/data/dataset.py) from a DB packed with a
    modality.json: ``state.<name>`` / ``action.<name>`` [B, T, D] (slices of the state and action
    vectors), ``video.<name>`` [B, T, ...] (the loader's layout and dtype), and
    ``annotation.<name>`` (list of str), each over its delta indices (frames) with GR00T's
    "first_last" padding (the episode's first or last row stands in for rows beyond it),
    normalized per key as `normalize_modes` says."""

    def __init__(self, db: str, schema: Dict[str, Any], device: torch.device, layout: str,
                 delta_indices: Optional[Dict[str, Sequence[int]]],
                 normalize_modes: Optional[Dict[str, str]]) -> None:
        meta = schema.get("source_meta") or {}
        meta = json.loads(meta) if isinstance(meta, str) else meta
        modality = meta.get("modality")
        if not isinstance(modality, dict):
            raise ValueError(f"{db}: format='groot' needs a DB packed with GR00T's "
                             "meta/modality.json (loongforge pack --from-lerobot DIR, with the "
                             "file in DIR/meta)")
        self.slices: Dict[str, tuple] = {}
        for group in ("state", "action"):
            for name, sl in (modality.get(group) or {}).items():
                self.slices[f"{group}.{name}"] = (group, int(sl["start"]), int(sl["end"]))
        self.videos = [f"video.{c}" for c in schema.get("cameras", [])]
        self.annotations = [f"annotation.{a}" for a in (modality.get("annotation") or {})]
        keys = list(self.slices) + self.videos + self.annotations
        per_key: Dict[str, List[int]] = {}
        for spec_key, idx in (delta_indices or {}).items():
            targets = [k for k in keys if k == spec_key or k.split(".", 1)[0] == spec_key]
            if not targets:
                raise ValueError(f"delta_indices: {spec_key!r} is neither a modality group "
                                 f"(state, action, video, annotation) nor a key of {db} (keys: "
                                 f"{', '.join(keys)})")
            if isinstance(idx, (str, bytes)) or not hasattr(idx, "__len__") or not len(idx) or \
                    any(isinstance(i, bool) or not isinstance(i, int) for i in idx):
                raise ValueError(f"delta_indices[{spec_key!r}] must be a non-empty list of int "
                                 f"frame offsets, got {idx!r}")
            for k in targets:
                per_key[k] = [int(i) for i in idx]
        self.modes: Dict[str, str] = {}
        for k, mode in (normalize_modes or {}).items():
            if k not in self.slices:
                raise ValueError(f"normalize_modes: {k!r} is not a state or action key of {db} "
                                 f"(keys: {', '.join(self.slices)})")
            if mode not in GROOT_MODES:
                raise ValueError(f"normalize_modes[{k!r}]: {mode!r} is not one of "
                                 f"{', '.join(GROOT_MODES)}")
            self.modes[k] = mode
        self.db, self.device, self.layout = db, device, layout
        self.meta = LeRobotMeta(db, schema)
        self.deltas = {k: per_key.get(k, [0]) for k in keys}
        table = _C.read_frame_table(db)
        self._cols = {k: torch.from_numpy(np.ascontiguousarray(table[k])).to(device)
                      for k in ("state", "action", "episode_first", "episode_length")}
        self._offsets = {k: torch.tensor(v, dtype=torch.int64, device=device)
                         for k, v in self.deltas.items()}
        self._stats = {}
        for k, (group, a, b) in self.slices.items():
            full = self.meta.stats["observation.state" if group == "state" else "action"]
            self._stats[k] = {s: v[a:b].to(device) for s, v in full.items()}

    def convert(self, batch: Dict[str, Any], frames) -> Dict[str, Any]:
        ids_raw = batch["sample_index"].to(self.device).long()
        valid = ids_raw >= 0
        ids = ids_raw.clamp(min=0)
        out: Dict[str, Any] = {}
        images = batch["images"]
        for c, key in enumerate(self.videos):
            rows, _ = self._rows(ids, key)
            off = self._offsets[key]
            now = images[:, c]
            stack = now.unsqueeze(1).repeat((1, len(off)) + (1,) * (now.dim() - 1))
            other = rows[:, off != 0]
            if other.numel():
                stack[:, off != 0] = frames(other.reshape(-1))[:, c].reshape(
                    other.shape + tuple(now.shape[1:]))
            out[key] = stack
        for key, (group, a, b) in self.slices.items():
            rows, _ = self._rows(ids, key)
            x = self._cols[group][rows][..., a:b]
            if key in self.modes:
                x = groot_normalize(x, self.modes[key], self._stats[key])
            out[key] = x * valid.view(-1, 1, 1).to(x.dtype)
        texts = list(batch.get("task", [""] * int(ids.shape[0])))
        for key in self.annotations:
            out[key] = texts
        return out


# The loader's `normalize` modes as GR00T's names (the formulas are the same; see
# groot_normalize and the loader's stage 3).
_LOADER_MODES = {"mean_std": "mean_std", "min_max": "min_max", "q01_q99": "q99", "none": "none"}


class HorizonContract:
    """The 'loongforge' format's action chunk at a horizon chosen at load time: ``action``
    [B, H, A] and ``action_mask`` [B, H] gathered from the frame table (rows idx..idx+H-1 of the
    sample's episode, the last row repeated past its end with the mask off, as the packer
    writes chunks) and normalized as the loader's ``normalize`` says. The rest of the batch is
    the loader's own."""

    def __init__(self, db: str, schema: Dict[str, Any], device: torch.device, horizon: int,
                 normalize: str, normalize_state: bool) -> None:
        if isinstance(horizon, bool) or not isinstance(horizon, int) or not 1 <= horizon <= 4096:
            raise ValueError(f"action_horizon must be an int in 1..4096, got {horizon!r}")
        if not str(schema.get("source_format", "")).startswith("lerobot"):
            raise ValueError(f"{db}: action_horizon={horizon} is chosen at load time from the "
                             "per-frame rows of a DB packed from LeRobot (loongforge pack "
                             "--from-lerobot); this DB stores chunks of "
                             f"{schema.get('action_horizon')} steps only: repack it with "
                             f"loongforge pack --horizon {horizon}")
        self.horizon = horizon
        self.mode = _LOADER_MODES[normalize] if normalize_state else "none"
        table = _C.read_frame_table(db)
        self._cols = {k: torch.from_numpy(np.ascontiguousarray(table[k])).to(device)
                      for k in ("action", "episode_first", "episode_length")}
        self._offsets = torch.arange(horizon, dtype=torch.int64, device=device)
        meta = LeRobotMeta(db, schema)
        self._stats = {k: v.to(device) for k, v in meta.stats["action"].items()}
        self.device = device

    def convert(self, batch: Dict[str, Any]) -> None:
        ids_raw = batch["sample_index"].to(self.device).long()
        valid = ids_raw >= 0
        ids = ids_raw.clamp(min=0)
        first = self._cols["episode_first"][ids].unsqueeze(1)
        last = first + self._cols["episode_length"][ids].unsqueeze(1) - 1
        q = ids.unsqueeze(1) + self._offsets.unsqueeze(0)
        mask = (q <= last) & valid.unsqueeze(1)
        action = groot_normalize(self._cols["action"][torch.min(q, last)], self.mode, self._stats)
        batch["action"] = action * valid.view(-1, 1, 1).to(action.dtype)
        batch["action_mask"] = mask
