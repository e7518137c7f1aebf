"""Builds a small packed DB with python3-lmdb, following include/loongforge/dataset.h exactly
(keys "{id:08d}_{modality}", little-endian arrays, __schema__ written last)."""
from __future__ import annotations

import io
import json
import os
from typing import Sequence

import numpy as np


def make_db(path: str, episodes: int = 4, steps: int = 10, cameras: Sequence[str] = ("front", "wrist"),
            width: int = 160, height: int = 120, state_dim: int = 8, action_dim: int = 7,
            horizon: int = 16, seed: int = 0) -> str:
    import lmdb
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=1 << 30, subdir=True)
    states, actions, max_tokens, sid = [], [], 0, 0
    yy, xx = np.mgrid[0:height, 0:width]
    with env.begin(write=True) as txn:
        for ep in range(episodes):
            traj = np.cumsum(rng.normal(0, 0.1, size=(steps + horizon, action_dim)), axis=0)
            instr = f"pick the block {ep} and place it in bin {ep % 3}".encode()
            for t in range(steps):
                for ci, cam in enumerate(cameras):
                    # Smooth gradients plus a moving square: real JPEG content, cheap to make.
                    img = np.stack([(xx * 255 // width + 40 * ci) % 256,
                                    (yy * 255 // height + 20 * t) % 256,
                                    np.full_like(xx, (60 * ep) % 256)], axis=-1).astype(np.uint8)
                    x0 = (5 * t + 10 * ci) % (width - 20)
                    img[20:40, x0:x0 + 20] = 255
                    buf = io.BytesIO()
                    Image.fromarray(img).save(buf, format="JPEG", quality=90)
                    txn.put(f"{sid:08d}_cam_{cam}".encode(), buf.getvalue())
                tokens = np.frombuffer(instr, dtype=np.uint8).astype("<i4") + 1
                tokens = tokens[: len(tokens) - (t % 5)]  # variable lengths
                max_tokens = max(max_tokens, len(tokens))
                state = rng.normal(0, 1, size=state_dim).astype("<f4")
                state[-1] = 0.5  # a constant dimension (std 0)
                action = traj[t:t + horizon].astype("<f4")
                amask = np.array([1 if t + h < steps else 0 for h in range(horizon)], np.uint8)
                txn.put(f"{sid:08d}_tokens".encode(), tokens.tobytes())
                txn.put(f"{sid:08d}_state".encode(), state.tobytes())
                txn.put(f"{sid:08d}_action".encode(), action.tobytes())
                txn.put(f"{sid:08d}_amask".encode(), amask.tobytes())
                txn.put(f"{sid:08d}_meta".encode(), np.array([ep, t], "<i4").tobytes())
                states.append(state)
                actions.append(action)
                sid += 1
        s, a = np.stack(states), np.concatenate(actions)
        schema = {
            "format_version": 1, "num_samples": sid, "num_episodes": episodes,
            "cameras": list(cameras), "image_width": width, "image_height": height,
            "state_dim": state_dim, "action_dim": action_dim, "action_horizon": horizon,
            "tokenizer": "byte-v1", "vocab_size": 257, "max_tokens": max_tokens,
            "state_mean": s.mean(0).tolist(), "state_std": s.std(0).tolist(),
            "state_min": s.min(0).tolist(), "state_max": s.max(0).tolist(),
            "action_mean": a.mean(0).tolist(), "action_std": a.std(0).tolist(),
            "action_min": a.min(0).tolist(), "action_max": a.max(0).tolist(),
            "source": "tests/python/lf_testdb.py",
        }
        txn.put(b"__schema__", json.dumps(schema).encode())
    env.sync()
    env.close()
    return path


def tiny_train_db(root) -> str:
    """The trainer tests' small DB under `root` (a pathlib.Path): make_db with python3-lmdb, or,
    where it is missing (the GPU machine), demo episodes packed by loongforge itself."""
    try:
        import lmdb  # noqa: F401
    except ImportError:
        from loongforge import packing
        packing.demo_data(str(root / "raw"), episodes=2, cameras=2, width=64, height=48,
                          steps_min=10, steps_max=14, state_dim=8, action_dim=7)
        packing.pack(str(root / "raw"), str(root / "db"))
        return str(root / "db")
    return make_db(str(root / "db"), episodes=3, steps=8, width=64, height=48)


def has_datafusion() -> bool:
    """True when this build has the DataFusion loader (loongforge.data)."""
    try:
        from loongforge.data import DataFusionLoader  # noqa: F401
        return True
    except ImportError:
        return False


# The trainer tests' common flags: the tiny config on 2 CPU threads' worth of work, in-process on
# the CPU (MemSculptor must be installed before a process's first CUDA allocation, so GPU runs go
# through subprocesses).
TINY_TRAIN_ARGS = ("--config", "tiny", "--image-size", "28", "--batch-size", "4", "--warmup", "1",
                   "--workers", "0", "--loader-threads", "1", "--quiet", "--threads", "1",
                   "--device", "cpu")
