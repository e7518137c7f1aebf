#!/usr/bin/env python3
"""What a batch contract chosen at load time costs: the same LeRobot DB read as format
"loongforge" (the packed chunk), "lerobot" (LeRobot's keys, raw values), "lerobot" with a
50-step action chunk from delta_timestamps, and "loongforge" with action_horizon=50, each for
--batches batches after --warmup; plus the conversion alone (LeRobotContract.convert on one
batch, the frame-table gather) timed over --convert-reps calls.

    PYTHONPATH=python /usr/bin/python3 bench/loader/formats.py [--db DB] [--batch-size 64] \\
        [--device cpu|cuda] [--out results/formats.json]

Without --db it packs the committed LeRobot v2.1 fixture (tests/data/lerobot/v2.1) into a
temporary directory; a real dataset gives the figures that matter (its frames dominate the
decode). Prints one line per row and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from loongforge import packing  # noqa: E402
from loongforge.data import DataFusionLoader  # noqa: E402


def rows(db: str, fps: float, horizon: int):
    chunk = {"action": [k / fps for k in range(horizon)]}
    return [
        ("loongforge (packed chunk)", dict()),
        ("lerobot", dict(format="lerobot")),
        (f"lerobot + {horizon}-step delta_timestamps", dict(format="lerobot",
                                                            delta_timestamps=chunk)),
        (f"loongforge + action_horizon={horizon}", dict(action_horizon=horizon)),
    ]


def time_loader(db: str, batch_size: int, device: str, threads: int, batches: int, warmup: int,
                **kw) -> dict:
    loader = DataFusionLoader(db, batch_size, device=device, threads=threads, shuffle=True,
                              drop_last=False, image_size=(96, 128), **kw)
    per_batch, n, rows_seen = [], 0, 0
    epoch = 0
    t_prev = None
    while n < warmup + batches:
        loader.set_epoch(epoch)
        for batch in loader:
            rows_seen = len(batch["task"])
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            if t_prev is not None and n > warmup:
                per_batch.append((t - t_prev) * 1e3)
            t_prev = t
            n += 1
            if n >= warmup + batches:
                break
        epoch += 1
    loader.close()
    return {"ms_per_batch_p50": statistics.median(per_batch),
            "ms_per_batch_mean": statistics.fmean(per_batch), "batches": len(per_batch),
            "rows_per_batch": rows_seen}


def time_convert(db: str, batch_size: int, device: str, horizon: int, fps: float,
                 reps: int) -> float:
    # One C++ batch wrapped without the contract, converted reps times (static shapes: the
    # batch has batch_size rows even on a DB smaller than that, padding rows gathered too).
    loader = DataFusionLoader(db, batch_size, device=device, threads=1, drop_last=False,
                              static_shapes=True, format="lerobot",
                              delta_timestamps={"action": [k / fps for k in range(horizon)]})
    loader._impl.start(0, 0)
    raw = loader._impl.next()
    base, _ = loader._wrap(raw, non_blocking=False, contract=False)
    contract = loader._contract
    for _ in range(10):
        contract.convert(base, loader._frames)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        contract.convert(base, loader._frames)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    us = (time.perf_counter() - t) / reps * 1e6
    loader._impl.stop()
    loader.close()
    return us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", help="a DB packed from LeRobot (default: the fixture, packed here)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--horizon", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--convert-reps", type=int, default=200)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = None
    db = a.db
    if db is None:
        tmp = tempfile.TemporaryDirectory()
        db = os.path.join(tmp.name, "db")
        packing.pack_lerobot(os.path.join(ROOT, "tests", "data", "lerobot", "v2.1"), db,
                             threads=1, progress=False)
    fps = float(json.loads(__import__("loongforge")._C.RecordReader(db).schema_json)["fps"])
    out = {"db": db, "batch_size": a.batch_size, "device": a.device, "threads": a.threads,
           "machine": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "rows": []}
    base = None
    for name, kw in rows(db, fps, a.horizon):
        r = time_loader(db, a.batch_size, a.device, a.threads, a.batches, a.warmup, **kw)
        base = base or r["ms_per_batch_p50"]
        r.update(name=name, vs_packed=r["ms_per_batch_p50"] / base)
        out["rows"].append(r)
        print(f"{name:42s} {r['ms_per_batch_p50']:8.2f} ms/batch p50 of {r['rows_per_batch']} "
              f"rows ({r['vs_packed']:.2f}x the packed chunk)", flush=True)
    us = time_convert(db, a.batch_size, a.device, a.horizon, fps, a.convert_reps)
    out["convert_us_per_batch"] = us
    print(f"{'conversion alone (lerobot + delta)':42s} {us:8.1f} us per batch of "
          f"{a.batch_size} rows", flush=True)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
