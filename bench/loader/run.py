#!/usr/bin/env python3
"""Loader benchmark: DataFusion (C++ CLI and Python iterator) vs torch DataLoader + PIL.

Same packed data, same batch size, our decode threads = DataLoader workers. Prints a table and
writes JSON. Frames default to the issue's setting: 640x480 q90, 2 cameras, batch 32, out 224.

    /usr/bin/python3 bench/loader/run.py --cli build/loongforge [--db DB] [--threads 2]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def sh(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(children: bool = False) -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    t = r.ru_utime + r.ru_stime
    if children:
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        t += c.ru_utime + c.ru_stime
    return t


def time_iter(make_iter, batches: int, warmup: int, epochs: int = 1, set_epoch=None,
              cpu_of_children=False, images_per_batch=1):
    """Consumes batches as fast as possible; returns samples/s, interval stats, cpu/image, RSS."""
    intervals, rss = [], []
    n_samples = 0
    t0 = cpu0 = None
    seen = 0
    for ep in range(epochs):
        if set_epoch:
            set_epoch(ep)
        last = time.perf_counter()
        for i, b in enumerate(make_iter()):
            now = time.perf_counter()
            if seen == warmup:
                t0, cpu0 = now, cpu_s(cpu_of_children)
            elif seen > warmup:
                intervals.append((now - last) * 1e3)
                n_samples += int(b["sample_index"].shape[0])
            last = now
            seen += 1
            del b
            if batches and i + 1 >= batches:
                break
        rss.append(rss_mb())
    wall = time.perf_counter() - t0
    cpu = cpu_s(cpu_of_children) - cpu0
    iv = np.array(intervals)
    return {
        "samples_per_s": n_samples / wall,
        "interval_ms": {"p50": float(np.percentile(iv, 50)), "p99": float(np.percentile(iv, 99)),
                        "mean": float(iv.mean()), "std": float(iv.std())},
        "cpu_ms_per_image": 1e3 * cpu / max(1, n_samples * images_per_batch),
        "rss_mb_per_epoch": rss,
        "batches_timed": len(intervals),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cli", default="build/loongforge")
    ap.add_argument("--db", default=None, help="packed DB; generated if absent")
    ap.add_argument("--work", default="/tmp/lf_bench_loader")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=40, help="per epoch, 0 = whole epoch")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--jitter", action="store_true")
    ap.add_argument("--json-out", default="results/bench_loader.json")
    args = ap.parse_args()

    import torch
    import loongforge
    from loongforge.trainer_data import BaselineLoader

    db = args.db
    if db is None:
        db = os.path.join(args.work, "db")
        if not os.path.exists(os.path.join(db, "data.mdb")):
            raw = os.path.join(args.work, "raw")
            sh([args.cli, "demo-data", "--out", raw, "--episodes", str(args.episodes),
                "--cameras", "2", "--size", args.size])
            sh([args.cli, "pack", "--src", raw, "--out", db, "--overwrite"])
    cams = 2
    torch.set_num_threads(1)
    results = {}

    # 1. C++ only (no Python in the loop).
    cmd = [args.cli, "bench", "loader", "--db", db, "--batch", str(args.batch), "--threads",
           str(args.threads), "--max-batches", str(args.batches), "--epochs", str(args.epochs),
           "--warmup", str(args.warmup), "--json"] + (["--jitter"] if args.jitter else [])
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    results["datafusion_cpp"] = json.loads(out)

    # 2. DataFusionLoader from Python (DLPack -> torch tensors).
    ld = loongforge.DataFusionLoader(db, args.batch, threads=args.threads, color_jitter=args.jitter)
    results["datafusion_python"] = time_iter(lambda: iter(ld), args.batches, args.warmup,
                                             args.epochs, images_per_batch=cams)
    results["datafusion_python"]["stages"] = ld.metrics()["histograms"]
    del ld

    # 3. Baseline: torch DataLoader + PIL + torchvision, workers = our threads.
    bl = BaselineLoader(db, args.batch, workers=args.threads, color_jitter=args.jitter)
    results["torch_dataloader_pil"] = time_iter(lambda: iter(bl), args.batches, args.warmup,
                                                args.epochs, set_epoch=bl.set_epoch,
                                                cpu_of_children=True, images_per_batch=cams)

    ours = results["datafusion_python"]["samples_per_s"]
    base = results["torch_dataloader_pil"]["samples_per_s"]
    results["speedup_vs_dataloader"] = ours / base
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=HERE).stdout.strip()
    except OSError:
        commit = "unknown"
    results["meta"] = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "machine": f"{platform.node()} {os.cpu_count()} cores {platform.processor()}",
                       "commit": commit, "batch": args.batch, "threads": args.threads,
                       "frames": args.size, "cameras": cams, "jitter": args.jitter, "db": db}
    os.makedirs(os.path.dirname(args.json_out) or ".", exist_ok=True)
    with open(args.json_out, "w") as f:
        json.dump(results, f, indent=2)

    c = results["datafusion_cpp"]
    print(f"\nLoader benchmark ({args.size} q90 -> 224, {cams} cams, batch {args.batch}, "
          f"{args.threads} threads/workers, commit {commit})")
    print(f"{'pipeline':28s} {'samples/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} {'std/mean':>9s} {'cpu ms/img':>10s}")
    for name, r in [("DataFusion (C++ CLI)", {"samples_per_s": c["samples_per_s"], "interval_ms": c["interval_ms"],
                                             "cpu_ms_per_image": c["cpu_ms_per_image"]}),
                    ("DataFusionLoader (Python)", results["datafusion_python"]),
                    ("DataLoader + PIL", results["torch_dataloader_pil"])]:
        iv = r["interval_ms"]
        print(f"{name:28s} {r['samples_per_s']:10.1f} {iv['p50']:8.1f} {iv['p99']:8.1f} "
              f"{iv['std'] / iv['mean']:9.1%} {r['cpu_ms_per_image']:10.2f}")
    print(f"speedup DataFusionLoader / DataLoader+PIL: {results['speedup_vs_dataloader']:.2f}x")
    print(f"RSS per epoch (MB): DataFusion {results['datafusion_python']['rss_mb_per_epoch']}")
    print(f"JSON: {args.json_out}")


if __name__ == "__main__":
    main()
