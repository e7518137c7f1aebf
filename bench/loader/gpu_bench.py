#!/usr/bin/env python3
"""GPU loader benchmark (issue 7), one process, on the GPU machine.

640x480 q90 frames (1 camera, so img/s = samples/s), batch 256, out 224, in the same run:
  1. DataFusionLoader(device='cuda'): nvJPEG (hardware engine, the default) + fused kernel +
     device stage 3 -> model-ready CUDA batches (one row; a first "cold" row before it shows the
     process's start-up: CUDA, nvJPEG and the engine's first batches); A/B rows of the decode
     lanes (issue 7, Note [Decode lanes] in src/data/nvjpeg_decoder.h): the lanes' nvJPEG calls
     concurrent (decode_stagger=0, the default before Note [Decode turns]) or staggered by half
     a call (0.5) instead of taking turns (1, the default); without lanes (async_decode=False),
     without state reuse (decode_reuse=False), without both (the loader before lanes:
     "pre_lanes"), with 3 lanes (decode_lanes=3);
     static batches (token buckets); bf16/NHWC output; A/B rows with one other throughput switch
     off each (prefault|reserve_slots|stage3_on_device); the default and pre_lanes again last, to
     show run-to-run noise;
  2. nvJPEG decode only (_C.testing.NvJpegDecoder): hardware backend at batch 64 and 256, one batch at a
     time with per-batch state re-initialization (as before lanes) and with state reuse, and with
     2 (3) batches in flight on lane threads, their calls concurrent (stagger 0: the ceiling the
     loader can reach) or taking turns (stagger 1); CUDA backend, auto split;
  3. torchvision.io.decode_jpeg(device='cuda') batched + crop + F.interpolate + normalize;
  4. torch DataLoader + PIL + torchvision transforms with 16 workers (LeRobot-style baseline);
  5. DataFusionLoader on the CPU (libjpeg-turbo, 14 threads) for reference.
For each: img/s, consumer-side batch interval p50/p99 (and p99/p50), the decoder's host ms per
batch (release wait, parse, turn wait, inside nvJPEG), CPU cores busy (this process's getrusage,
which counts DataLoader workers only once they exit, so read the DataLoader row's cores in the
machine column; per thread name from /proc/self/task; the whole machine and its steal time from
/proc/stat), page faults per batch. Prints a table; writes JSON to $OUT/gpu_bench.json (or --out).

    PYTHONPATH=python python3 bench/loader/gpu_bench.py [--out DIR] [--quick]
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import itertools
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def proc_stat():
    """(busy, total, steal) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v), (v[7] if len(v) > 7 else 0)


def set_cuda_schedule(mode: str) -> str:
    """Scheduling flags of device 0's primary context (driver API, before CUDA is used):
    'blocking' makes host waits on the GPU sleep instead of spin. Returns the flags in effect."""
    lib = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        raise RuntimeError("cuInit/cuDeviceGet failed")
    flags = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}[mode]
    fn = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    rc = fn(dev, flags)
    got, active = ctypes.c_uint(), ctypes.c_int()
    lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(got), ctypes.byref(active))
    return f"set {mode} rc={rc}, flags now {got.value:#x} (active={active.value})"


def thread_cpu_ns():
    """{tid: (name, ns on a CPU)} of this process's threads (/proc schedstat)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[tid] = (name, int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return out


class CpuMeter:
    """Cores busy over an interval: this process (all threads; and per thread name), the whole
    machine, and this process's page faults."""

    def __enter__(self):
        r = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.p0 = r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime
        self.f0 = (r.ru_minflt, r.ru_majflt)
        self.th0 = thread_cpu_ns()
        self.s0 = proc_stat()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        r = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter() - self.t0
        th1 = thread_cpu_ns()
        s1 = proc_stat()
        busy, total = s1[0] - self.s0[0], s1[1] - self.s0[1]
        # Time the hypervisor gave this VM's vCPUs to others, in cores (noise on VMs).
        self.steal_cores = (os.cpu_count() or 1) * (s1[2] - self.s0[2]) / max(1, total)
        self.process_cores = (r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime - self.p0) / wall
        self.machine_cores = (os.cpu_count() or 1) * busy / max(1, total)
        self.minflt, self.majflt = r.ru_minflt - self.f0[0], r.ru_majflt - self.f0[1]
        by_name = {}
        for tid, (name, ns) in th1.items():
            d = ns - self.th0.get(tid, (name, 0))[1]
            by_name[name] = by_name.get(name, 0.0) + d / 1e9 / wall
        self.thread_cores = {k: round(v, 3) for k, v in sorted(by_name.items(),
                                                                key=lambda kv: -kv[1]) if v >= 0.01}


def timed(batches_iter, n_batches, warmup, images_of):
    """Consumes warmup + n_batches items; intervals are measured as the consumer sees them."""
    it = iter(batches_iter)
    for _ in range(warmup):
        next(it)
    intervals, images = [], 0
    with CpuMeter() as cpu:
        t0 = last = time.perf_counter()
        for _ in range(n_batches):
            b = next(it)
            images += images_of(b)
            now = time.perf_counter()
            intervals.append((now - last) * 1e3)
            last = now
        wall = last - t0
    iv = np.array(intervals)
    p50, p99 = float(np.percentile(iv, 50)), float(np.percentile(iv, 99))
    return {"img_per_s": images / wall, "batches": n_batches, "interval_p50_ms": p50,
            "interval_p99_ms": p99, "p99_over_p50": p99 / p50 if p50 > 0 else None,
            "interval_std_ms": float(iv.std()), "cores_busy_process": cpu.process_cores,
            "cores_busy_machine": cpu.machine_cores, "cores_by_thread": cpu.thread_cores,
            "minor_faults_per_batch": cpu.minflt / n_batches, "major_faults": cpu.majflt,
            "steal_cores": cpu.steal_cores}


def loop_epochs(ld):
    ep = 0
    while True:
        ld.set_epoch(ep)
        yield from ld
        ep += 1


ROWS = None  # --rows


def run(name, results, fn):
    if ROWS and not ROWS.search(name):
        return
    print(f"--- {name}", flush=True)
    t = time.perf_counter()
    try:
        results[name] = fn()
        results[name]["seconds"] = time.perf_counter() - t
        print(json.dumps(results[name], default=str), flush=True)
    except Exception as e:  # one failing measurement must not lose the others
        traceback.print_exc()
        results[name] = {"error": f"{type(e).__name__}: {e}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT", "results/gpu"))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "lf_gpu_bench"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--batches", type=int, default=96,
                    help="timed batches per row (p99 of 96 intervals is their 2nd largest)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--unique", type=int, default=512, help="distinct frames in the DB")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--baseline-batches", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="small run to check the script")
    ap.add_argument("--rows", default="", help="regex: run only the rows it matches")
    ap.add_argument("--cuda-schedule", default="",
                    choices=["", "auto", "spin", "yield", "blocking"],
                    help="primary context scheduling flags, set before CUDA is used")
    ap.add_argument("--reuse-db", action="store_true", help="keep a DB an earlier run made")
    args = ap.parse_args()
    global ROWS
    ROWS = re.compile(args.rows) if args.rows else None
    sched = set_cuda_schedule(args.cuda_schedule) if args.cuda_schedule else "default"
    if args.quick:
        args.batch, args.batches, args.warmup, args.unique = 32, 4, 1, 32
        args.baseline_batches, args.workers = 2, 2

    import loongforge
    from loongforge import _C, _synth

    w, h = (int(x) for x in args.size.split("x"))
    B = args.batch
    cuda = torch.cuda.is_available()
    gpu_ok, gpu_why = _C.gpu_loader_support(0)
    results = {"meta": {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__, "batch": B, "frames": f"{w}x{h} q{args.quality}",
        "out": 224, "gpu_loader": gpu_ok, "gpu_loader_reason": gpu_why,
        "cuda_schedule": sched}}
    try:
        results["meta"]["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=HERE).stdout.strip()
    except OSError:
        pass

    os.makedirs(args.work, exist_ok=True)
    db = os.path.join(args.work, f"db_{w}x{h}_{B}")
    samples = (args.batches + args.warmup + 1) * B  # one epoch covers a whole measurement
    t = time.perf_counter()
    stamp = os.path.join(args.work, f"db_{w}x{h}_{B}.stamp")
    want = f"{samples} {args.unique} {args.quality}"
    if not (args.reuse_db and os.path.exists(stamp) and open(stamp).read() == want):
        # Written by another process, as `loongforge pack` writes a training DB: a process
        # that has just written 1.6 GB through LMDB read it back slower (lf-fetch used a whole
        # core in some rows; docs/BENCHMARKS.md, "DataFusion, GPU").
        code = ("import sys; from loongforge import _synth; _synth.make_db(sys.argv[1], "
                "samples=int(sys.argv[2]), cameras=1, width=int(sys.argv[3]), "
                "height=int(sys.argv[4]), quality=int(sys.argv[5]), "
                "unique_frames=int(sys.argv[6]))")
        subprocess.run([sys.executable, "-c", code, db, str(samples), str(w), str(h),
                        str(args.quality), str(args.unique)], check=True,
                       env={**os.environ, "PYTHONPATH": os.path.join(HERE, "..", "..", "python")})
        with open(stamp, "w") as f:
            f.write(want)
    # The frames make_db used (deterministic), for the decode-only rows.
    frames = [_synth.jpeg(_synth.frame(w, h, i), args.quality) for i in range(args.unique)]
    print(f"DB: {samples} samples ({args.unique} distinct {w}x{h} q{args.quality} frames, "
          f"{np.mean([len(f) for f in frames]) / 1024:.1f} KiB avg) in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    results["meta"]["samples"] = samples
    n_img = lambda b: int(b["images"].shape[0])  # noqa: E731

    # The loader options of the A/B rows (LoaderOptions fields, docs/data.md "Tuning the GPU
    # loader"); the row records them.
    PRE_LANES = dict(async_decode=False, decode_reuse=False)

    def ours(skip_epoch=False, **kw):
        tuning = {k: v for k, v in kw.items() if k in (
            "async_decode", "decode_lanes", "decode_stagger", "decode_reuse",
            "decode_hw_handle_per_lane", "decode_interleaved", "stage3_on_device",
            "reserve_slots", "prefault")}

        def go():
            t_create = time.perf_counter()
            ld = loongforge.DataFusionLoader(db, B, image_size=224, threads=4, prefetch=4, **kw)
            batches = loop_epochs(ld)
            first = next(batches)
            t_first = time.perf_counter() - t_create
            if skip_epoch:  # time the second epoch: the DB's pages are mapped by then
                for _ in range(len(ld)):
                    first = next(batches)
            r = timed(itertools.chain([first], batches), args.batches, args.warmup, n_img)
            r["first_batch_s"] = t_first  # loader created -> first batch out
            m = ld.metrics()
            hist = m["histograms"]
            dev = m.get("device", {})
            r["decode_host_ms_per_batch"] = dev.get("decode_host_ms_per_batch")
            r["decode_stagger"] = dev.get("decode_stagger")
            r.update(decode_backend=m["decode_backend"], hw_decode=m["hw_decode"],
                     reason=m["reason"], device=m["device"], options=tuning,
                     decode_lanes=(dev.get("decode_lanes") or
                                   (1 if tuning.get("async_decode") is False
                                    else tuning.get("decode_lanes", 2))),
                     pipeline_latency_ms=hist.get("batch_latency_ms"),
                     # Host time per batch on the pipeline threads: if gpu_decode_submit_ms is
                     # close to the batch interval, nvJPEG's call holds lf-collate for the whole
                     # decode and anything else on that thread is serial with the engine.
                     # gpu_decode_wait_ms: lf-collate waiting for a decoded batch (lanes).
                     host_p50_ms={k: hist[k]["p50"] for k in (
                         "fetch_ms", "fetch_slot_ms", "fetch_prefault_ms",
                         "gpu_decode_submit_ms", "gpu_decode_wait_ms", "gpu_kernel_submit_ms",
                         "collate_ms") if k in hist},
                     counters=m.get("counters"))
            ld.close()
            del ld
            return r
        return go

    def dataloader_pil():
        # 16 workers hand back many tensors: passing them as file descriptors ran out of
        # ancillary-data slots on the GPU machine ("received 0 items of ancdata").
        torch.multiprocessing.set_sharing_strategy("file_system")
        from loongforge.trainer_data import BaselineLoader
        bl = BaselineLoader(db, B, workers=args.workers, image_size=224)

        def gen():
            ep = 0
            while True:
                bl.set_epoch(ep)
                for b in bl:
                    yield b
                ep += 1
        return timed(gen(), args.baseline_batches, 2, n_img)

    # CPU baselines first: the DataLoader forks its workers before this process uses the GPU.
    run("dataloader_pil_16_workers", results, dataloader_pil)
    run("datafusion_cpu_14_threads", results, lambda: dict(
        timed(loop_epochs(loongforge.DataFusionLoader(db, B, image_size=224, threads=14,
                                                      prefetch=4)),
              args.baseline_batches * 2, 2, n_img)))

    if cuda and gpu_ok:
        # The default (hardware engine only, hw_decode_ratio=1.0; 2 decode lanes taking turns) is
        # one row, after a cold row with the same settings (the process's first GPU loader).
        # Lane A/B rows are interleaved with the default to expose run-to-run noise.
        run("datafusion_gpu_cold", results, ours(device="cuda"))
        run("datafusion_gpu", results, ours(device="cuda"))
        run("datafusion_gpu_stagger0", results, ours(decode_stagger=0.0, device="cuda"))
        run("datafusion_gpu_stagger05", results, ours(decode_stagger=0.5, device="cuda"))
        # Page faults of the LMDB map (a fresh map per loader): madvise(MADV_POPULATE_READ)
        # instead of a read per page, and the second epoch of one loader (pages mapped).
        run("datafusion_gpu_populate", results, ours(prefault="populate", device="cuda"))
        run("datafusion_gpu_epoch2", results, ours(skip_epoch=True, device="cuda"))
        run("datafusion_gpu_pre_lanes", results, ours(**PRE_LANES, device="cuda"))
        run("datafusion_gpu_no_async_decode", results, ours(async_decode=False, device="cuda"))
        run("datafusion_gpu_no_decode_reuse", results, ours(decode_reuse=False, device="cuda"))
        run("datafusion_gpu_lanes3", results, ours(decode_lanes=3, device="cuda"))
        run("datafusion_gpu_handle_per_lane", results,
            ours(decode_hw_handle_per_lane=True, device="cuda"))
        run("datafusion_gpu_rgbi", results, ours(decode_interleaved=True, device="cuda"))
        # Static batches (issue 9): fixed rows, tokens padded to a bucket (synth: 2..6 tokens).
        run("datafusion_gpu_static_buckets", results,
            ours(device="cuda", token_buckets=[4, 8]))
        run("datafusion_gpu_bf16_nhwc", results,
            ours(device="cuda", dtype=torch.bfloat16, layout="NHWC"))
        # Row names as before the switches became options (no_reserve, no_stage3_device).
        for row, off in (("prefault", dict(prefault="off")),
                         ("reserve", dict(reserve_slots=False)),
                         ("stage3_device", dict(stage3_on_device=False))):
            run(f"datafusion_gpu_no_{row}", results, ours(**off, device="cuda"))
        run("datafusion_gpu_again", results, ours(device="cuda"))
        run("datafusion_gpu_pre_lanes_again", results, ours(**PRE_LANES, device="cuda"))

        def nvjpeg_only(batch, in_flight=1, **kw):
            def go():
                dec = _C.testing.NvJpegDecoder(**{"stagger": 0.0, **kw})
                chunks = [frames[i % len(frames):i % len(frames) + batch]
                          for i in range(0, len(frames) * 4, batch)]
                chunks = [c for c in chunks if len(c) == batch] or [frames[:batch]]

                def gen():
                    i = 0
                    if in_flight <= 1:  # synchronous: decode, wait, next
                        while True:
                            yield dec.decode(chunks[i % len(chunks)])
                            i += 1
                    # Pipelined: `in_flight` batches on the lane threads; collect() waits for
                    # the oldest one's decode to complete, then the next one is queued.
                    for _ in range(in_flight):
                        dec.submit(chunks[i % len(chunks)])
                        i += 1
                    while True:
                        ok = dec.collect()
                        dec.submit(chunks[i % len(chunks)])
                        i += 1
                        yield ok
                n = max(args.batches, 8) * (256 // batch)
                r = timed(gen(), n, args.warmup + 3, lambda ok: ok)
                if in_flight > 1:
                    dec.drain()
                r["info"] = dec.info()
                r["decode_host_ms_per_batch"] = r["info"].get("host_ms_per_batch")
                r["in_flight"] = in_flight
                return r
            return go

        # Before lanes: one batch at a time, states re-initialized before every batch.
        run("nvjpeg_hw_b64_reinit", results, nvjpeg_only(64, hw_ratio=1.0, reuse_state=False))
        run("nvjpeg_hw_b256_reinit", results, nvjpeg_only(B, hw_ratio=1.0, reuse_state=False))
        run("nvjpeg_hw_b64", results, nvjpeg_only(64, hw_ratio=1.0))
        run("nvjpeg_hw_b256", results, nvjpeg_only(B, hw_ratio=1.0))
        # The ceiling of the lanes: states reused, 2 (3) batches in flight.
        run("nvjpeg_hw_b64_inflight2", results,
            nvjpeg_only(64, 2, hw_ratio=1.0, async_=True, lanes=2))
        run("nvjpeg_hw_b256_inflight2", results,
            nvjpeg_only(B, 2, hw_ratio=1.0, async_=True, lanes=2))
        # Taking turns (Note [Decode turns]): one call in nvJPEG at a time, parsing overlapped.
        run("nvjpeg_hw_b256_inflight2_turns", results,
            nvjpeg_only(B, 2, hw_ratio=1.0, async_=True, lanes=2, stagger=1.0))
        run("nvjpeg_hw_b256_inflight3", results,
            nvjpeg_only(B, 3, hw_ratio=1.0, async_=True, lanes=3))
        # Same with one hardware handle per lane (in case nvJPEG serializes per handle).
        run("nvjpeg_hw_b256_inflight2_handles", results,
            nvjpeg_only(B, 2, hw_ratio=1.0, async_=True, lanes=2, hw_handle_per_lane=True))
        # Interleaved RGB output (NVJPEG_OUTPUT_RGBI) instead of planar, one at a time and 2 in
        # flight.
        run("nvjpeg_hw_b256_rgbi", results, nvjpeg_only(B, hw_ratio=1.0, interleaved=True))
        run("nvjpeg_hw_b256_inflight2_rgbi", results,
            nvjpeg_only(B, 2, hw_ratio=1.0, async_=True, lanes=2, interleaved=True))
        run("nvjpeg_cuda_b256", results, nvjpeg_only(B, hw=False))
        run("nvjpeg_auto_b256", results, nvjpeg_only(B, hw_ratio=-1.0))
    else:
        results["datafusion_gpu"] = {"error": f"GPU loader unavailable: {gpu_why}"}

    if cuda:
        def torchvision_gpu():
            import torch.nn.functional as F
            from torchvision.io import decode_jpeg
            datas = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in frames]
            cw, ch = int(w * 0.95), int(h * 0.95)
            x0, y0 = (w - cw) // 2, (h - ch) // 2

            def gen():
                i = 0
                while True:
                    batch = [datas[(i + k) % len(datas)] for k in range(B)]
                    i += B
                    imgs = decode_jpeg(batch, device="cuda")
                    x = torch.stack(imgs)[:, :, y0:y0 + ch, x0:x0 + cw].float()
                    x = F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False)
                    x = (x / 255.0 - 0.5) / 0.5
                    torch.cuda.synchronize()
                    yield x
            return timed(gen(), args.batches, args.warmup, lambda x: int(x.shape[0]))

        run("torchvision_decode_jpeg_cuda", results, torchvision_gpu)

    g = results.get("datafusion_gpu", {})
    # Both default runs must clear the bar ("reliably"), not just one.
    runs = [results[k]["img_per_s"] for k in ("datafusion_gpu", "datafusion_gpu_again")
            if "img_per_s" in results.get(k, {})]
    if "img_per_s" in g:
        defaults = [results[k] for k in ("datafusion_gpu", "datafusion_gpu_again")
                    if "img_per_s" in results.get(k, {})]
        results["targets"] = {
            "no_sample_skipped": all(d.get("counters", {}).get("corrupt_skipped", 0) == 0
                                     for d in defaults),
            "img_per_s>=25000": g["img_per_s"] >= 25000,
            "img_per_s>=25000_every_default_run": bool(runs) and min(runs) >= 25000,
            "cores_busy<=2": g["cores_busy_process"] <= 2.0,
            "cores_busy<=2_every_default_run": all(d["cores_busy_process"] <= 2.0
                                                   for d in defaults),
            "p99<=1.5*p50": (g["p99_over_p50"] or 99) <= 1.5,
            "p99<=1.5*p50_every_default_run": all((d["p99_over_p50"] or 99) <= 1.5
                                                  for d in defaults),
        }
        for k in ("torchvision_decode_jpeg_cuda", "dataloader_pil_16_workers", "nvjpeg_hw_b256",
                  "nvjpeg_hw_b256_inflight2", "datafusion_gpu_pre_lanes"):
            if "img_per_s" in results.get(k, {}):
                results["targets"][f"ratio_vs_{k}"] = g["img_per_s"] / results[k]["img_per_s"]

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_bench.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nGPU loader benchmark: {w}x{h} q{args.quality} -> 224, batch {B}, "
          f"{results['meta'].get('gpu')}, commit {results['meta'].get('commit')}")
    print(f"{'pipeline':32s} {'img/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99/p50':>7s} "
          f"{'cores(proc)':>11s} {'cores(all)':>10s}")
    for k, r in results.items():
        if k in ("meta", "targets") or not isinstance(r, dict):
            continue
        if "img_per_s" not in r:
            print(f"{k:32s} {r.get('error', '?')}")
            continue
        # A row whose loader skipped samples as corrupt measured less work than it claims.
        skipped = r.get("counters", {}).get("corrupt_skipped", 0)
        print(f"{k:32s} {r['img_per_s']:9.0f} {r['interval_p50_ms']:8.2f} "
              f"{r['interval_p99_ms']:8.2f} {r['p99_over_p50'] or 0:7.2f} "
              f"{r['cores_busy_process']:11.2f} {r['cores_busy_machine']:10.2f}"
              + (f"  INVALID: {skipped} samples skipped as corrupt" if skipped else ""))
    for k, r in results.items():
        if isinstance(r, dict) and r.get("host_p50_ms"):
            print(f"  {k:30s} host p50 ms: " +
                  " ".join(f"{n}={v:.2f}" for n, v in r["host_p50_ms"].items()) +
                  (f" first_batch_s={r['first_batch_s']:.2f}" if "first_batch_s" in r else "") +
                  f" slots_grown={(r.get('counters') or {}).get('slots_allocated_on_demand')}")
    for k, r in results.items():
        if isinstance(r, dict) and r.get("cores_by_thread") and k != "dataloader_pil_16_workers":
            top = list(r["cores_by_thread"].items())[:6]
            print(f"  {k:30s} cores by thread: " + " ".join(f"{n}={v:.2f}" for n, v in top) +
                  f" minflt/batch={r.get('minor_faults_per_batch', 0):.0f}")
    for k, r in results.items():
        if isinstance(r, dict) and r.get("decode_host_ms_per_batch"):
            print(f"  {k:30s} decoder ms/batch: " +
                  " ".join(f"{n}={v:.2f}" for n, v in r["decode_host_ms_per_batch"].items()))
    if "datafusion_gpu" in results and "decode_backend" in results["datafusion_gpu"]:
        d = results["datafusion_gpu"]
        print(f"decode: {d['decode_backend']} hw_decode={d['hw_decode']} ({d['reason']}); "
              f"split {d['device']}")
    print("targets:", json.dumps(results.get("targets", {})))
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
