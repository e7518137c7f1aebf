"""Builds small, real LoongForge datasets in Python (PIL JPEGs, records put one by one) for tests.

Follows the layout of include/loongforge/dataset.h exactly, independently of the packer; records go
through _C.RecordWriter (plain LMDB puts), so no Python LMDB module is needed (the GPU machine's
Python has none).

Also what several test modules share beyond datasets: the environment that runs bin/loongforge as
a user would (entry_env), the clean-up of the processes a test starts (killed_at_exit), and the
benches' parquet writer (mini_parquet). loongforge is imported inside the helpers that use it, so
a test of bin/loongforge that imports this module skips, rather than fails to load, where the
package is not built.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from typing import Iterable, Iterator

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = os.path.join(REPO, "bin", "loongforge")


def make_db(path: str, samples: int = 24, cameras: int = 2, width: int = 96, height: int = 72,
            state_dim: int = 6, action_dim: int = 4, horizon: int = 3,
            corrupt: Iterable[int] = ()) -> str:
    corrupt = set(corrupt)
    rng = np.random.default_rng(0)
    from loongforge import _C, _synth
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


def entry_env(**extra) -> dict:
    """The environment for running bin/loongforge (ENTRY) as a user would: PYTHONPATH unset, this
    interpreter, and the first build folder holding a loongforge binary; `extra` goes on top.
    Skips the calling test when no build has the CLI."""
    import pytest

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LOONGFORGE_PYTHON"] = sys.executable
    for build in (os.environ.get("LOONGFORGE_BUILD"), os.path.join(REPO, "build"),
                  os.path.join(REPO, "build-gpu")):
        if build and os.access(os.path.join(build, "loongforge"), os.X_OK):
            env["LOONGFORGE_BUILD"] = build
            break
    else:
        pytest.skip("no built loongforge CLI")
    env.update(extra)
    return env


@contextlib.contextmanager
def killed_at_exit(*procs: subprocess.Popen) -> Iterator[None]:
    """Kills and reaps each of `procs` still running when the block ends, so a test that fails
    while waiting on them leaves no process behind."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def mini_parquet():
    """bench/pack/mini_parquet.py, the benches' parquet writer for machines without pyarrow,
    loaded from its file (bench/pack is no package)."""
    import importlib.util
    path = os.path.join(REPO, "bench", "pack", "mini_parquet.py")
    spec = importlib.util.spec_from_file_location("mini_parquet", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LEROBOT_V21 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "lerobot",
                           "v2.1")


def pack_lerobot_fixture(out: str, src: str = LEROBOT_V21, **options) -> str:
    """The committed LeRobot v2.1 fixture (or `src`, a copy of it) packed into `out` (64x48
    frames, threads=1 unless `options` say otherwise); skips the calling test when the fixture
    or FFmpeg is absent."""
    import pytest

    from loongforge import packing

    if not os.path.isfile(os.path.join(LEROBOT_V21, "meta", "info.json")):
        pytest.skip("LeRobot v2.1 fixture absent (tests/data/lerobot/make_fixtures.py)")
    if not packing.have_video_decoder():
        pytest.skip("this build lacks FFmpeg (pack --from-lerobot cannot decode videos)")
    packing.pack_lerobot(src, out, **{"size": (64, 48), "threads": 1, **options})
    return out
