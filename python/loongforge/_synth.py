"""Synthetic packed datasets (camera-like JPEG frames) written through ``_C.RecordWriter``.

For tests and benchmarks on machines without the python ``lmdb`` module or the packer: frames are
smooth colour gradients plus sensor-like noise, encoded by PIL (4:2:0, the default at q90).
"""
from __future__ import annotations

import io
import json
from typing import Iterable, List

import numpy as np
from PIL import Image

from . import _C


def frame(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(1, 6), rng.uniform(1, 6), rng.uniform(0, 6.28)
        img[..., c] = 128 + 90 * np.sin(fx * xx / width * 6.28 + ph) * np.cos(fy * yy / height * 6.28)
    img += rng.normal(0, 4, img.shape)  # ~55 KiB per 640x480 q90 frame, like camera frames
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(arr: np.ndarray, quality: int = 90, progressive: bool = False) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, progressive=progressive)
    return buf.getvalue()


def make_db(path: str, samples: int = 64, cameras: int = 1, width: int = 640, height: int = 480,
            quality: int = 90, unique_frames: int = 0, corrupt: Iterable[int] = (),
            progressive: Iterable[int] = (), state_dim: int = 6, action_dim: int = 4,
            horizon: int = 3, seed: int = 0) -> List[bytes]:
    """Writes a DB at ``path`` (overwriting) and returns the distinct JPEGs it used.

    ``unique_frames`` > 0 reuses that many distinct frames cyclically (fast to build large DBs);
    samples in ``corrupt`` get truncated JPEGs, those in ``progressive`` progressive ones.
    """
    corrupt, progressive = set(corrupt), set(progressive)
    n_unique = unique_frames or samples * cameras
    frames = [jpeg(frame(width, height, seed * 100003 + i), quality) for i in range(n_unique)]
    w = _C.RecordWriter(path, True)
    cams = [f"cam{c}" for c in range(cameras)]
    for i in range(samples):
        for c, cam in enumerate(cams):
            data = frames[(i * cameras + c) % n_unique]
            if i in progressive:
                data = jpeg(frame(width, height, seed * 7 + i), quality, progressive=True)
            if i in corrupt:
                data = data[: len(data) // 2]
            w.put(f"{i:08d}_cam_{cam}", data)
        write_arrays(w, i, state_dim, action_dim, horizon)
    commit_schema(w, samples, cams, width, height, state_dim, action_dim, horizon,
                  "loongforge._synth")
    return frames


def write_arrays(w: "_C.RecordWriter", i: int, state_dim: int, action_dim: int,
                 horizon: int) -> None:
    """Sample i's non-image records: (i % 5) + 2 tokens 3 + (i + j) % 256 (inside the byte
    tokenizer's vocabulary of 259, which the loader checks), state[d] = i + d, action[k] =
    0.1 k + i, the last future step masked on odd samples."""
    tok = (3 + (i + np.arange((i % 5) + 2)) % 256).astype("<i4")
    w.put(f"{i:08d}_tokens", tok.tobytes())
    w.put(f"{i:08d}_state", _state(i, state_dim).tobytes())
    w.put(f"{i:08d}_action", _action(i, action_dim, horizon).tobytes())
    w.put(f"{i:08d}_amask", bytes([1] * (horizon - 1) + [i % 2]))
    w.put(f"{i:08d}_meta", np.array([0, i], "<i4").tobytes())


def _state(i: int, dim: int) -> np.ndarray:
    return (np.arange(dim) + i).astype("<f4")


def _action(i: int, dim: int, horizon: int) -> np.ndarray:
    return (np.arange(horizon * dim) * 0.1 + i).astype("<f4")


def commit_schema(w: "_C.RecordWriter", samples: int, cams: List[str], width: int, height: int,
                  state_dim: int, action_dim: int, horizon: int, source: str) -> None:
    """Writes the schema record (statistics of the arrays write_arrays wrote) and publishes."""
    S = np.stack([_state(i, state_dim) for i in range(samples)])
    A = np.concatenate([_action(i, action_dim, horizon).reshape(horizon, action_dim)
                        for i in range(samples)])
    schema = {
        "format_version": 1, "num_samples": samples, "num_episodes": 1, "cameras": cams,
        "image_width": width, "image_height": height, "state_dim": state_dim,
        "action_dim": action_dim, "action_horizon": horizon, "tokenizer": "byte-v1",
        "vocab_size": 259, "max_tokens": 6,
        "state_mean": S.mean(0).tolist(), "state_std": S.std(0).tolist(),
        "state_min": S.min(0).tolist(), "state_max": S.max(0).tolist(),
        "action_mean": A.mean(0).tolist(), "action_std": A.std(0).tolist(),
        "action_min": A.min(0).tolist(), "action_max": A.max(0).tolist(),
        "source": source,
    }
    w.commit(json.dumps(schema))

