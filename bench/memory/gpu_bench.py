"""GPU benchmark for MemSculptor: the same transformer training loop with variable-length batches
under (1) torch's default caching allocator, (2) expandable_segments:True, (3) MemSculptor.

Each mode runs in its own process (the allocator must be chosen before CUDA starts). Reports peak
allocated / reserved, fragmentation = 1 - peak allocated / peak reserved, and step time p50/p95
(CUDA events). Prints a table and writes JSON.

    PYTHONPATH=python python3 bench/memory/gpu_bench.py --all --json results/gpu_bench_memory.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys


def run_mode(args) -> dict:
    import torch
    ms = None
    if args.mode == "memsculptor":
        import loongforge.memory as lm
        ms = lm.MemSculptor(0).install()  # before any CUDA allocation
    torch.manual_seed(0)
    rnd = random.Random(args.seed)
    dev = torch.device("cuda")

    def build():
        layer = torch.nn.TransformerEncoderLayer(args.d, args.heads, 4 * args.d, batch_first=True,
                                                 norm_first=True, dropout=0.0)
        model = torch.nn.TransformerEncoder(layer, args.layers).to(dev, torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, opt

    if ms is not None:
        with ms.persistent():
            model, opt = build()
    else:
        model, opt = build()
    buckets = list(range(args.min_len, args.max_len + 1, args.bucket))
    sched = [rnd.choice(buckets) for _ in range(args.warmup + args.steps)]

    def step(seq):
        x = torch.randn(args.batch, seq, args.d, device=dev, dtype=torch.bfloat16)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if ms is not None:
        ms.record(steps=args.warmup)
    for seq in sched[:args.warmup]:
        if ms is not None:
            with ms.step(signature=f"len{seq}"):
                step(seq)
        else:
            step(seq)
    torch.cuda.synchronize()
    if ms is not None:
        ms.release_cached()
        ms.reset_peaks()
    else:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for seq in sched[args.warmup:]:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        if ms is not None:
            with ms.step(signature=f"len{seq}"):
                step(seq)
        else:
            step(seq)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    if ms is not None:
        s = ms.stats()
        peak_alloc, peak_resv = s["peak_allocated_bytes"], s["peak_reserved_bytes"]
        extra = {"planned_hits": s["planned_hits"], "planned_misses": s["planned_misses"],
                 "alloc_p50_ns": s["alloc_latency_ns"]["p50"], "plans": ms.plans}
    else:
        peak_alloc = torch.cuda.max_memory_allocated()
        peak_resv = torch.cuda.max_memory_reserved()
        extra = {}
    times.sort()
    return {"mode": args.mode, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
            "peak_allocated_bytes": peak_alloc, "peak_reserved_bytes": peak_resv,
            "fragmentation": 1 - peak_alloc / peak_resv if peak_resv else 0.0,
            "step_ms_p50": statistics.median(times),
            "step_ms_p95": times[int(0.95 * (len(times) - 1))], **extra}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["torch", "expandable", "memsculptor"])
    p.add_argument("--all", action="store_true", help="run the three modes, each in a subprocess")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--bucket", type=int, default=64)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="results/gpu_bench_memory.json")
    args = p.parse_args()
    if not args.all:
        if args.mode is None:
            p.error("--mode or --all")
        print(json.dumps(run_mode(args)))
        return
    rows = []
    for mode in ("torch", "expandable", "memsculptor"):
        env = dict(os.environ)
        if mode == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        cmd = [sys.executable, __file__, "--mode", mode] + [
            a for a in sys.argv[1:] if a not in ("--all",)]
        # drop --json for the children
        if "--json" in cmd:
            i = cmd.index("--json")
            del cmd[i:i + 2]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            rows.append({"mode": mode, "error": out.stderr[-2000:]})
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    gib = 1 << 30
    print(f"{'mode':14s} {'peak alloc':>11s} {'peak resv':>11s} {'frag':>7s} {'step p50':>9s} "
          f"{'step p95':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:14s} FAILED: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        print(f"{r['mode']:14s} {r['peak_allocated_bytes'] / gib:9.2f} G {r['peak_reserved_bytes'] / gib:9.2f} G "
              f"{100 * r['fragmentation']:6.2f}% {r['step_ms_p50']:7.1f}ms {r['step_ms_p95']:7.1f}ms")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "results": rows}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
