#!/usr/bin/env python3
"""Replay report over recorded traces (CPU only): for each trace, `loongforge mem plan` and
`loongforge mem replay` against the issue's targets, side by side with the model of torch's
caching allocator.

Targets (issue 4), per trace:
  plan   the planned peak of every signature's plan (the plan the allocator installs: its
         largest step widened by the steps of the same structure, Note [Envelope plans]) within
         5% of the lower bound: the largest max-live-bytes of the signature's steps;
  frag   fragmentation (1 - peak allocated / peak reserved) of the planned replay <= 3%;
  p50    median allocation latency of the planned replay <= 100 ns (host replay, two clock reads
         per call included).
The caching row is the model of torch's caching allocator (src/memory/caching_model.h) over the
same events. Replay covers what the trace holds: allocations made while recording (activations,
gradients, optimizer temporaries), not the parameters allocated before it.

    python3 bench/memory/replay_traces.py                      # every trace in bench/traces/
    python3 bench/memory/replay_traces.py results/gpu/traces/*.trace.zst --json out.json
    python3 bench/memory/replay_traces.py --synthetic /tmp/syn  # writes synthetic traces first
                                                                # (development only: not real)
Exit status: 0 when every trace was replayed (targets missed are reported, not failures; add
--strict to fail on a missed target), 1 when a trace could not be replayed, 2 when no trace or no
CLI was found.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET_PLAN_OVERHEAD = 0.05
TARGET_FRAG = 0.03
TARGET_P50_NS = 100.0


def find_cli(explicit: Optional[str]) -> Optional[str]:
    cands = [explicit] if explicit else [os.path.join(REPO, "build", "loongforge"),
                                         os.path.join(REPO, "build-gpu", "loongforge"),
                                         shutil.which("loongforge")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def run_cli(cli: str, args: List[str], timeout: int) -> Dict[str, Any]:
    r = subprocess.run([cli] + args, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        msg = (r.stdout + r.stderr).strip().splitlines()
        raise RuntimeError(f"`loongforge {' '.join(args)}` exited {r.returncode}: "
                           f"{msg[-1] if msg else '(no output)'}")
    return json.loads(r.stdout)


def replay_one(cli: str, path: str, segment_mb: int, timeout: int) -> Dict[str, Any]:
    t0 = time.perf_counter()
    plan = run_cli(cli, ["mem", "plan", path, "--json"], timeout)
    replay = run_cli(cli, ["mem", "replay", path, "--json", "--mode", "all",
                           "--segment-mb", str(segment_mb)], timeout)
    modes = {r["mode"]: r for r in replay["results"]}
    # Events before the first step mark (signature "": tensors made outside any step, which the
    # allocator never plans) are no plan of a step.
    sigs = [s for s in plan.get("signatures", []) if s.get("signature", "") not in ("", "-")]
    worst_sig = max(sigs, key=lambda s: s["overhead_vs_steps"]) if sigs else None
    planned = modes.get("planned", {})
    plan_overhead = worst_sig["overhead_vs_steps"] if worst_sig else 0.0
    frag = planned.get("fragmentation", 1.0)
    p50 = planned.get("alloc_latency_ns", {}).get("p50", float("inf"))
    return {
        "trace": path,
        "bytes": os.path.getsize(path),
        "events": plan["events"],
        "steps": len(plan["steps"]),
        "signatures": len(sigs),
        "step_plan_max_overhead": max((s["overhead"] for s in plan["steps"]), default=0.0),
        "plan_overhead": plan_overhead,
        "worst_signature": worst_sig["signature"] if worst_sig else None,
        "plan": plan,
        "replay": modes,
        "targets": {
            "plan_within_5pct": plan_overhead <= TARGET_PLAN_OVERHEAD,
            "frag_le_3pct": frag <= TARGET_FRAG,
            "p50_le_100ns": p50 <= TARGET_P50_NS,
        },
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def print_table(rows: List[Dict[str, Any]]) -> None:
    mib = float(1 << 20)
    print(f"{'trace':40s} {'steps':>5s} {'plan ovh':>8s} {'mode':>11s} {'peak alloc':>11s} "
          f"{'peak resv':>11s} {'frag':>7s} {'p50 ns':>7s} {'hits':>8s} {'miss':>5s}  targets")
    for r in rows:
        name = os.path.basename(r["trace"])[:40]
        if "error" in r:
            print(f"{name:40s} ERROR: {r['error']}")
            continue
        t = r["targets"]
        verdict = " ".join(f"{k}={'ok' if v else 'MISS'}" for k, v in t.items())
        first = True
        for mode in ("planned", "first_sight", "pool", "caching"):
            m = r["replay"].get(mode)
            if m is None:
                continue
            head = (f"{name:40s} {r['steps']:5d} {100 * r['plan_overhead']:7.2f}%" if first
                    else f"{'':40s} {'':5s} {'':8s}")
            print(f"{head} {mode:>11s} {m['peak_allocated_bytes'] / mib:9.1f}M "
                  f"{m['peak_reserved_bytes'] / mib:9.1f}M {100 * m['fragmentation']:6.2f}% "
                  f"{m['alloc_latency_ns']['p50']:7.0f} {m['planned_hits']:8d} "
                  f"{m['planned_misses']:5d}  {verdict if first else ''}")
            first = False


# ------------------------------------------------------------------------------------------------
# Synthetic traces (development and tests only; never commit them to bench/traces/)


def synthetic_trace_text(kind: str, steps: int = 6, seed: int = 0) -> str:
    """A trace in the text format shaped like the real captures: 'gr00t' (layered activations
    whose sizes follow a per-step padding bucket, backward in reverse, gradients freed at the
    step's end, a loss that outlives its step) or 'moe' (16 experts whose buffers follow random
    per-step token counts under one total)."""
    rnd = random.Random(seed)
    lines: List[str] = []
    nid = [1]
    t = [0]

    def alloc(size: int) -> int:
        i = nid[0]
        nid[0] += 1
        t[0] += 100
        lines.append(f"a {i} {size} 0 {t[0]}")
        return i

    def free(i: int) -> None:
        t[0] += 100
        lines.append(f"f {i} 0 {t[0]}")

    carried: Optional[int] = None
    buckets = [64, 96, 128, 160]
    sched = [buckets[i % len(buckets)] for i in range(steps)]
    rnd.shuffle(sched)
    for s in range(steps):
        if kind == "gr00t":
            L = sched[s]
            lines.append(f"s {t[0]} L{L}xB8")
            tok = 8 * (64 + L)
            saved = []
            x = alloc(tok * 2048 * 2)
            for _ in range(6):
                h = alloc(tok * 2048 * 2)
                m = alloc(tok * 6144 * 2)
                tmp = alloc(tok * 16 * 4)
                free(tmp)
                saved += [h, m]
            grads = []
            for h in reversed(saved):
                g = alloc(tok * 2048 * 2)
                free(h)
                grads.append(alloc(2048 * 2048 * 4 // 8))
                free(g)
            free(x)
            for g in grads:
                free(g)
        else:
            total = [2176, 4352][s % 2]
            lines.append(f"s {t[0]} T{total}")
            w = [rnd.random() + 0.2 for _ in range(16)]
            counts = [max(1, int(2 * total * x / sum(w))) for x in w]
            x = alloc(total * 1536 * 2)
            outs = []
            for c in counts:
                r = alloc(c * 8)
                h = alloc(c * 6144 * 2)
                y = alloc(c * 1536 * 2)
                free(r)
                outs.append((c, h, y))
            for c, h, y in reversed(outs):
                gh = alloc(c * 6144 * 2)
                free(y)
                free(h)
                gx = alloc(c * 1536 * 2)
                free(gh)
                free(gx)
            free(x)
        loss = alloc(512)
        if carried is not None:
            free(carried)
        carried = loss
    return "\n".join(lines) + "\n"


def write_synthetic(out_dir: str) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for kind in ("gr00t", "moe"):
        p = os.path.join(out_dir, f"synthetic_{kind}.trace")
        with open(p, "w") as f:
            f.write(synthetic_trace_text(kind))
        paths.append(p)
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", help="trace files (default: bench/traces/*.trace*)")
    ap.add_argument("--cli", help="the loongforge binary (default: build/loongforge, "
                                  "build-gpu/loongforge, or on PATH)")
    ap.add_argument("--json", default="results/replay_traces.json")
    ap.add_argument("--segment-mb", type=int, default=32,
                    help="MemSculptor pool segment size (its default on the GPU, "
                         "LOONGFORGE_MEM_SEGMENT_MB)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per CLI call")
    ap.add_argument("--synthetic", metavar="DIR",
                    help="write synthetic traces into DIR and replay those (development only)")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    args = ap.parse_args(argv)
    cli = find_cli(args.cli)
    if cli is None:
        print("replay_traces: no loongforge binary (build it: cmake --build build), or pass --cli",
              file=sys.stderr)
        return 2
    traces = list(args.traces)
    if args.synthetic:
        traces += write_synthetic(args.synthetic)
    if not traces:
        traces = sorted(p for p in glob.glob(os.path.join(REPO, "bench", "traces", "*.trace*"))
                        if p.endswith((".trace", ".trace.zst")))
    if not traces:
        print("replay_traces: no traces given and none in bench/traces/ (capture them on the GPU "
              "machine with bench/memory/capture_traces.py)", file=sys.stderr)
        return 2
    rows: List[Dict[str, Any]] = []
    for p in traces:
        try:
            rows.append(replay_one(cli, p, args.segment_mb, args.timeout))
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, OSError) as e:
            rows.append({"trace": p, "error": str(e)})
    print_table(rows)
    out = {"cli": cli, "segment_mb": args.segment_mb,
           "targets": {"plan_overhead": TARGET_PLAN_OVERHEAD, "fragmentation": TARGET_FRAG,
                       "p50_ns": TARGET_P50_NS},
           "synthetic": bool(args.synthetic), "traces": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")
    if any("error" in r for r in rows):
        return 1
    if args.strict and not all(all(r["targets"].values()) for r in rows):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
