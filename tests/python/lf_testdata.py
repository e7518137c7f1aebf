"""Builds small, real LoongForge datasets in Python (PIL JPEGs, records put one by one) for tests.

Follows the layout of include/loongforge/dataset.h exactly, independently of the packer; records go
through _C.RecordWriter (plain LMDB puts), so no Python LMDB module is needed (the GPU machine's
Python has none).
"""
from __future__ import annotations

import io
from typing import Iterable

import numpy as np
from PIL import Image

from loongforge import _synth


def make_db(path: str, samples: int = 24, cameras: int = 2, width: int = 96, height: int = 72,
            state_dim: int = 6, action_dim: int = 4, horizon: int = 3,
            corrupt: Iterable[int] = ()) -> str:
    corrupt = set(corrupt)
    rng = np.random.default_rng(0)
    from loongforge import _C
    txn = _C.RecordWriter(path, overwrite=True)
    cams = [f"cam{c}" for c in range(cameras)]
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
        _synth.write_arrays(txn, i, state_dim, action_dim, horizon)
    _synth.commit_schema(txn, samples, cams, width, height, state_dim, action_dim, horizon,
                         "tests/python/lf_testdata.py")
    return path
