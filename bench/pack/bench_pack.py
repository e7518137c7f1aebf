#!/usr/bin/env python3
"""Benchmark of dataset preparation: `loongforge demo-data` + `loongforge pack`, with a plain-Python
packer (json + PIL header check + py-lmdb, single process: what a user would write) as the baseline
on the same episode folder in the same run.

  /usr/bin/python3 bench/pack/bench_pack.py --cli build/loongforge --episodes 33 --json results/bench_pack.json

Prints a table and writes JSON. Default: 33 episodes of 40-80 steps (~2000 samples), 2 cameras,
640x480 JPEG q90.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import struct
import subprocess
import tempfile
import time

import lmdb
from PIL import Image


def run_timed(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu, out


def python_pack(src: str, out: str, horizon: int) -> int:
    """Baseline: the same LMDB layout, written by a straightforward single-process Python loop."""
    env = lmdb.open(out, map_size=1 << 40, subdir=True)
    eps = sorted(e for e in os.listdir(os.path.join(src, "episodes")) if not e.startswith("."))
    sid = 0
    txn = env.begin(write=True)
    for e, ep in enumerate(eps):
        d = os.path.join(src, "episodes", ep)
        cams = sorted(x[4:] for x in os.listdir(d) if x.startswith("cam_"))
        with open(os.path.join(d, "steps.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for t, row in enumerate(rows):
            for c in cams:
                p = os.path.join(d, "cam_" + c, f"{t}.jpg")
                with open(p, "rb") as f:
                    data = f.read()
                with Image.open(p) as im:  # header check, like pack's tjDecompressHeader3
                    assert im.format == "JPEG"
                txn.put(f"{sid:08d}_cam_{c}".encode(), data)
            ids = [1] + [b + 3 for b in row["instruction"].encode()] + [2]
            txn.put(f"{sid:08d}_tokens".encode(), struct.pack(f"<{len(ids)}i", *ids))
            txn.put(f"{sid:08d}_state".encode(), struct.pack(f"<{len(row['state'])}f", *row["state"]))
            chunk, mask = [], []
            for k in range(horizon):
                chunk += rows[min(t + k, len(rows) - 1)]["action"]
                mask.append(1 if t + k < len(rows) else 0)
            txn.put(f"{sid:08d}_action".encode(), struct.pack(f"<{len(chunk)}f", *chunk))
            txn.put(f"{sid:08d}_amask".encode(), bytes(mask))
            txn.put(f"{sid:08d}_meta".encode(), struct.pack("<2i", e, t))
            sid += 1
            if sid % 64 == 0:
                txn.commit()
                txn = env.begin(write=True)
    txn.commit()
    env.sync(True)
    env.close()
    return sid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/loongforge")
    ap.add_argument("--episodes", type=int, default=33)
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--horizon", type=int, default=16)
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp dir, removed after)")
    ap.add_argument("--json", default=None, help="write results here")
    a = ap.parse_args()

    work = a.workdir or tempfile.mkdtemp(prefix="lf_bench_pack_")
    src, db, db_py = (os.path.join(work, x) for x in ("src", "db", "db_py"))
    for p in (src, db, db_py):
        shutil.rmtree(p, ignore_errors=True)
    try:
        gen_wall, gen_cpu, gen_out = run_timed(
            [a.cli, "demo-data", "--quiet", "--out", src, "--episodes", str(a.episodes), "--cameras",
             str(a.cameras), "--size", a.size, "--quality", str(a.quality), "--threads", str(a.threads)])
        pack_wall, pack_cpu, _ = run_timed(
            [a.cli, "pack", "--quiet", "--src", src, "--out", db, "--horizon", str(a.horizon), "--threads",
             str(a.threads)])
        t0 = time.process_time()
        w0 = time.perf_counter()
        n_py = python_pack(src, db_py, a.horizon)
        py_wall, py_cpu = time.perf_counter() - w0, time.process_time() - t0
        info = json.loads(subprocess.run([a.cli, "inspect", "--json", db], check=True, capture_output=True,
                                         text=True).stdout)
        n = info["schema"]["num_samples"]
        frames = sum(m["count"] for k, m in info["modalities"].items() if k.startswith("cam_"))
        jpeg_bytes = sum(m["total_bytes"] for k, m in info["modalities"].items() if k.startswith("cam_"))
        assert n == n_py, (n, n_py)
        res = {
            "machine": platform.node(), "cpus": os.cpu_count(), "loadavg_before": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "episodes": a.episodes, "cameras": a.cameras,
            "size": a.size, "quality": a.quality, "threads": a.threads, "samples": n, "frames": frames,
            "mean_jpeg_kb": jpeg_bytes / frames / 1e3, "db_mb": info["db_file_bytes"] / 1e6,
            "demo_data_s": gen_wall, "demo_data_cpu_s": gen_cpu,
            "pack_s": pack_wall, "pack_cpu_s": pack_cpu,
            "python_pack_s": py_wall, "python_pack_cpu_s": py_cpu,
            "pack_samples_per_s": n / pack_wall, "python_pack_samples_per_s": n / py_wall,
        }
        print(f"{n} samples, {frames} frames {a.size} q{a.quality}, mean JPEG {res['mean_jpeg_kb']:.1f} KB, "
              f"DB {res['db_mb']:.1f} MB, {a.threads} threads, load {res['loadavg_before'][0]:.1f}")
        print(f"{'step':<28}{'wall s':>10}{'cpu s':>10}{'samples/s':>12}")
        print(f"{'demo-data (render+encode)':<28}{gen_wall:>10.2f}{gen_cpu:>10.2f}{n / gen_wall:>12.1f}")
        print(f"{'loongforge pack':<28}{pack_wall:>10.2f}{pack_cpu:>10.2f}{n / pack_wall:>12.1f}")
        print(f"{'python pack (baseline)':<28}{py_wall:>10.2f}{py_cpu:>10.2f}{n / py_wall:>12.1f}")
        print(f"pack speed-up vs python baseline: {py_wall / pack_wall:.2f}x wall")
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(res, f, indent=2)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
