#!/usr/bin/env python3
"""GPU benchmark for MemSculptor: the SAME training loop (the GR00T-shaped policy,
python/loongforge/models/gr00t.py, with variable-length text batches: per-sample lengths drawn at
random, padded to a bucket of 32 that changes every step; forward + backward + fused AdamW step +
zero_grad(set_to_none) under bf16 autocast) under
  torch        torch's default caching allocator,
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
  memsculptor  MemSculptor installed as torch's allocator (parameters and optimizer state in its
               persistent pool, steps planned per padding bucket),
each in its own process (the allocator is chosen before CUDA starts).

Two phases per allocator, each a process with its own timeout:
  loop    --warmup steps (MemSculptor records them and plans each bucket), reset peaks, then
          --steps timed steps at --batch: peak allocated, peak reserved, fragmentation
          (1 - peak allocated / peak reserved), step time p50/p95 (CUDA events).
  search  the largest batch that fits under a cap of --cap-gib reserved bytes:
          torch/expandable: torch.cuda.set_per_process_memory_fraction(cap / device memory);
          memsculptor: LOONGFORGE_MEM_LIMIT_MB=cap (its backend refuses to reserve beyond it).
          A batch "fits" when a probe of --probe-steps steps cycling through the text buckets
          (longest first, then mixed) runs without an out-of-memory error. The batch doubles from
          --search-start until a probe fails, then bisects (at most --max-probes probes). Between
          probes every cache is emptied. Each probe's result is appended to a JSON-lines file as
          it happens, so a process that dies still leaves its answer so far.

Prints a table and writes JSON:
    PYTHONPATH=python python3 bench/memory/gpu_bench.py --all --json results/gpu_bench_memory.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gr00t_workload import PYDIR, Gr00tWork, build_work  # noqa: E402

MODES = ("torch", "expandable", "memsculptor")


def _is_oom(e: BaseException) -> bool:
    import torch
    if isinstance(e, (MemoryError, getattr(torch.cuda, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def _setup(args, cap: bool):
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: CUDA is required (torch.cuda.is_available() is False)")
    ms = None
    if args.mode == "memsculptor":
        import loongforge.memory as lm
        ms = lm.MemSculptor(0).install()  # before any CUDA allocation
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    if cap and ms is None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (args.cap_gib << 30) / total), 0)
    work = build_work(Gr00tWork, args, torch, dev, ms)
    torch.cuda.synchronize()
    return torch, ms, work


def _run_step(torch, ms, work, bucket: int, batch: int) -> None:
    if ms is not None:
        with ms.step(signature=work.signature(bucket, batch)):
            work.step(bucket, batch)
    else:
        work.step(bucket, batch)


def run_loop(args) -> Dict[str, Any]:
    torch, ms, work = _setup(args, cap=False)
    sched = work.schedule(args.warmup + args.steps)
    if ms is not None:
        ms.record(steps=args.warmup)
    for b in sched[:args.warmup]:
        _run_step(torch, ms, work, b, args.batch)
    torch.cuda.synchronize()
    if ms is not None:
        ms.release_cached()
        ms.reset_peaks()
    else:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for b in sched[args.warmup:]:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        _run_step(torch, ms, work, b, args.batch)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    extra: Dict[str, Any] = {}
    if ms is not None:
        s = ms.stats()
        peak_alloc, peak_resv = s["peak_allocated_bytes"], s["peak_reserved_bytes"]
        extra = {"planned_hits": s["planned_hits"], "planned_misses": s["planned_misses"],
                 "pool_allocs": s["pool_allocs"], "first_sight_plans": s["first_sight_plans"],
                 "alloc_p50_ns": s["alloc_latency_ns"]["p50"], "arena_bytes": s["arena_bytes"],
                 "plans": ms.plans}
    else:
        peak_alloc = torch.cuda.max_memory_allocated()
        peak_resv = torch.cuda.max_memory_reserved()
        extra = {"num_alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}
    times.sort()
    return {"phase": "loop", "mode": args.mode, "config": work.cfg.name, "batch": args.batch,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
            "peak_allocated_bytes": peak_alloc, "peak_reserved_bytes": peak_resv,
            "fragmentation": 1 - peak_alloc / peak_resv if peak_resv else 0.0,
            "step_ms_p50": statistics.median(times),
            "step_ms_p95": times[int(0.95 * (len(times) - 1))], "steps": len(times),
            "text_buckets": work.buckets, **extra}


def run_search(args) -> Dict[str, Any]:
    if args.mode == "memsculptor" and not os.environ.get("LOONGFORGE_MEM_LIMIT_MB"):
        raise SystemExit("gpu_bench: the memsculptor search needs LOONGFORGE_MEM_LIMIT_MB "
                         "(the --all driver sets it from --cap-gib)")
    torch, ms, work = _setup(args, cap=True)
    buckets = sorted(work.buckets)
    # Longest first (the worst case fits from the start), then mixed lengths: the caching
    # allocator must then reuse blocks cut for other shapes.
    mixed = [buckets[-1], buckets[0], buckets[len(buckets) // 2], buckets[-1], buckets[1 % len(buckets)],
             buckets[-2 if len(buckets) > 1 else 0]]
    probe = (mixed * ((args.probe_steps + len(mixed) - 1) // len(mixed)))[:args.probe_steps]
    log = args.probe_log
    probes: List[Dict[str, Any]] = []

    def fits(b: int) -> bool:
        t0 = time.perf_counter()
        ok, err = True, ""
        try:
            for L in probe:
                _run_step(torch, ms, work, L, b)
            torch.cuda.synchronize()
        except BaseException as e:  # noqa: BLE001 - OOM is the answer; anything else re-raised
            if not _is_oom(e):
                raise
            ok, err = False, str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        finally:
            work.opt.zero_grad(set_to_none=True)
            gc.collect()
            if ms is not None:
                ms.release_cached()
            else:
                torch.cuda.empty_cache()
        rec = {"batch": b, "fits": ok, "s": round(time.perf_counter() - t0, 2), "error": err}
        if ms is None:
            rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        probes.append(rec)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"mode": args.mode, **rec}) + "\n")
        return ok

    t_start = time.perf_counter()
    lo, hi = 0, None  # lo fits (0 trivially), hi does not
    b = args.search_start
    while len(probes) < args.max_probes and time.perf_counter() - t_start < args.search_budget_s:
        if hi is None:
            if fits(b):
                lo, b = b, b * 2
            else:
                hi = b
        else:
            if hi - lo <= max(1, lo // 16):  # within ~6%: good enough, keeps the probes few
                break
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    return {"phase": "search", "mode": args.mode, "config": work.cfg.name,
            "cap_bytes": args.cap_gib << 30, "largest_batch": lo, "smallest_failing": hi,
            "probe_lengths": probe, "probes": probes,
            "search_s": round(time.perf_counter() - t_start, 1)}


def _child(args, mode: str, phase: str, extra_env: Dict[str, str], timeout: int) -> Dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("LOONGFORGE_MEM_LIMIT_MB", None)
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env.update(extra_env)
    cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--phase", phase,
           "--config", args.config, "--batch", str(args.batch), "--text-buckets", args.text_buckets,
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--seed", str(args.seed),
           "--cap-gib", str(args.cap_gib), "--search-start", str(args.search_start),
           "--max-probes", str(args.max_probes), "--probe-steps", str(args.probe_steps),
           "--search-budget-s", str(args.search_budget_s)]
    if args.probe_log:
        cmd += ["--probe-log", args.probe_log]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, so, se = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as e:
        rc, so = 124, (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or "")
        se = (e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or "")
        se += f"\ntimed out after {timeout} s"
    wall = round(time.perf_counter() - t0, 1)
    last = so.strip().splitlines()[-1] if so.strip() else ""
    try:
        r = json.loads(last)
        if rc == 0:
            r["wall_s"] = wall
            return r
    except json.JSONDecodeError:
        pass
    tail = "\n".join(se.strip().splitlines()[-6:])
    r = {"phase": phase, "mode": mode, "error": f"rc {rc}: {tail}", "wall_s": wall}
    if phase == "search" and args.probe_log and os.path.exists(args.probe_log):
        # The process died: recover the probes it logged.
        with open(args.probe_log) as f:
            probes = [json.loads(l) for l in f if l.strip()]
        ok = [p["batch"] for p in probes if p["mode"] == mode and p["fits"]]
        r["largest_batch_logged"] = max(ok) if ok else 0
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--all", action="store_true", help="every mode and phase, each in a subprocess")
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--phase", choices=["loop", "search"], default="loop")
    p.add_argument("--modes", default=",".join(MODES), help="with --all: which modes")
    p.add_argument("--phases", default="loop,search", help="with --all: which phases")
    p.add_argument("--config", default="small", help="GR00T config (small: quick; n16: full size)")
    p.add_argument("--batch", type=int, default=32, help="loop phase batch size")
    p.add_argument("--text-buckets", default="32,64,96,128,160,192,224,256")
    p.add_argument("--warmup", type=int, default=24, help="loop: warm-up (recorded) steps")
    p.add_argument("--steps", type=int, default=40, help="loop: timed steps")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cap-gib", type=int, default=6, help="search: cap on reserved memory, GiB")
    p.add_argument("--search-start", type=int, default=16)
    p.add_argument("--max-probes", type=int, default=10)
    p.add_argument("--probe-steps", type=int, default=6)
    p.add_argument("--search-budget-s", type=float, default=45.0)
    p.add_argument("--probe-log", default=None, help="JSON lines of every probe (set by --all)")
    p.add_argument("--timeout", type=int, default=75, help="seconds per process")
    p.add_argument("--json", default="results/gpu_bench_memory.json")
    args = p.parse_args()
    if not args.all:
        if args.mode is None:
            p.error("--mode or --all")
        r = run_loop(args) if args.phase == "loop" else run_search(args)
        print(json.dumps(r))
        return 0

    try:
        import torch
        if not torch.cuda.is_available():
            print("gpu_bench: CUDA is required (torch sees no device)", file=sys.stderr)
            return 2
    except ImportError:
        print("gpu_bench: torch is not installed", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    if args.probe_log is None:
        args.probe_log = os.path.splitext(args.json)[0] + ".probes.jsonl"
    if os.path.exists(args.probe_log):
        os.remove(args.probe_log)
    rows: List[Dict[str, Any]] = []
    t0 = time.perf_counter()
    for phase in [x for x in args.phases.split(",") if x]:
        for mode in [m for m in args.modes.split(",") if m]:
            env = {}
            if phase == "search" and mode == "memsculptor":
                env["LOONGFORGE_MEM_LIMIT_MB"] = str(args.cap_gib << 10)
            rows.append(_child(args, mode, phase, env, args.timeout))
    gib = float(1 << 30)
    print(f"\nGR00T config {args.config}, text buckets {args.text_buckets}")
    print(f"{'mode':12s} {'peak alloc':>11s} {'peak resv':>11s} {'frag':>7s} {'step p50':>9s} "
          f"{'step p95':>9s} {'max batch @' + str(args.cap_gib) + 'GiB':>16s}")
    for mode in [m for m in args.modes.split(",") if m]:
        loop = next((r for r in rows if r["mode"] == mode and r["phase"] == "loop"), None)
        srch = next((r for r in rows if r["mode"] == mode and r["phase"] == "search"), None)
        cells = []
        if loop is None:
            cells.append(f"{'-':>11s} {'-':>11s} {'-':>7s} {'-':>9s} {'-':>9s}")
        elif "error" in loop:
            cells.append(f"{'FAILED: ' + loop['error'].splitlines()[-1][:50]:>51s}")
        else:
            cells.append(f"{loop['peak_allocated_bytes'] / gib:9.2f} G "
                         f"{loop['peak_reserved_bytes'] / gib:9.2f} G "
                         f"{100 * loop['fragmentation']:6.2f}% {loop['step_ms_p50']:7.1f}ms "
                         f"{loop['step_ms_p95']:7.1f}ms")
        if srch is None:
            cells.append(f"{'-':>16s}")
        elif "error" in srch:
            cells.append(f"{'FAIL (' + str(srch.get('largest_batch_logged', '?')) + ')':>16s}")
        else:
            cells.append(f"{srch['largest_batch']:16d}")
        print(f"{mode:12s} " + " ".join(cells))
    total = time.perf_counter() - t0
    print(f"total {total:.0f} s")
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "results": rows, "total_s": total}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
