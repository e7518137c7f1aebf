"""Builds small, real LoongForge datasets in Python (PIL JPEGs, records put one by one) for tests.

Follows the layout of include/loongforge/dataset.h exactly, independently of the packer; records go
through _C.RecordWriter (plain LMDB puts), so no Python LMDB module is needed (the GPU machine's
Python has none).
"""
from __future__ import annotations

import io
import json
from typing import Iterable

import numpy as np
from PIL import Image


def make_db(path: str, samples: int = 24, cameras: int = 2, width: int = 96, height: int = 72,
            state_dim: int = 6, action_dim: int = 4, horizon: int = 3,
            corrupt: Iterable[int] = ()) -> str:
    corrupt = set(corrupt)
    rng = np.random.default_rng(0)
    from loongforge import _C
    txn = _C.RecordWriter(path, overwrite=True)
    cams = [f"cam{c}" for c in range(cameras)]
    states, actions = [], []
    for i in range(samples):
        for c, cam in enumerate(cams):
            yy, xx = np.mgrid[0:height, 0:width]
            img = (127 + 100 * np.sin(xx / (5 + c + i % 3)) * np.cos(yy / 7)
                   + rng.normal(0, 10, (height, width)))[..., None] * np.array([1.0, 0.8, 0.6])
            buf = io.BytesIO()
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
            data = buf.getvalue()
            if i in corrupt:
                data = data[: len(data) // 2]
            txn.put(f"{i:08d}_cam_{cam}", data)
        tok = np.arange(3 + i, 3 + i + (i % 5) + 2, dtype="<i4")
        txn.put(f"{i:08d}_tokens", tok.tobytes())
        st = (np.arange(state_dim) + i).astype("<f4")
        ac = (np.arange(horizon * action_dim) * 0.1 + i).astype("<f4")
        states.append(st)
        actions.append(ac.reshape(horizon, action_dim))
        txn.put(f"{i:08d}_state", st.tobytes())
        txn.put(f"{i:08d}_action", ac.tobytes())
        txn.put(f"{i:08d}_amask", bytes([1] * (horizon - 1) + [i % 2]))
        txn.put(f"{i:08d}_meta", np.array([0, i], "<i4").tobytes())
    S = np.stack(states)
    A = np.concatenate(actions)
    schema = {
        "format_version": 1, "num_samples": samples, "num_episodes": 1, "cameras": cams,
        "image_width": width, "image_height": height, "state_dim": state_dim,
        "action_dim": action_dim, "action_horizon": horizon, "tokenizer": "byte-v1",
        "vocab_size": 259, "max_tokens": 6,
        "state_mean": S.mean(0).tolist(), "state_std": S.std(0).tolist(),
        "state_min": S.min(0).tolist(), "state_max": S.max(0).tolist(),
        "action_mean": A.mean(0).tolist(), "action_std": A.std(0).tolist(),
        "action_min": A.min(0).tolist(), "action_max": A.max(0).tolist(),
        "source": "tests/python/lf_testdata.py",
    }
    txn.commit(json.dumps(schema))
    return path
