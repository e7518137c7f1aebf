#!/usr/bin/env python3
"""Summarizes a torch-profiler Chrome trace: CUDA runtime calls by name and thread (what blocks the
host), kernels by stream (busy time, the largest idle gaps of the busiest stream), and for the other
streams the delay from launch to kernel start (queued behind the busy stream?).

  python3 bench/e2e/trace_summary.py trace.json [--top 25]
"""
import argparse
import collections
import json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--streams", type=int, default=8, help="streams listed in the device table")
    a = p.parse_args()
    with open(a.trace) as f:
        ev = json.load(f)["traceEvents"]
    runtime = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e]
    kernels = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    t0 = min(e["ts"] for e in ev if "ts" in e and e.get("ph") == "X")
    t1 = max(e["ts"] + e.get("dur", 0) for e in ev if "ts" in e and e.get("ph") == "X")
    print(f"trace span {(t1 - t0) / 1e3:.1f} ms, {len(runtime)} runtime calls, {len(kernels)} device ops")

    # Host side: runtime calls by (name, thread).
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in runtime:
        k = (e["name"], e.get("tid"))
        agg[k][0] += 1
        agg[k][1] += e["dur"]
        agg[k][2] = max(agg[k][2], e["dur"])
    print(f"\n{'runtime call':38s} {'thread':>10s} {'count':>7s} {'total ms':>10s} {'max ms':>9s}")
    for (name, tid), (n, tot, mx) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{name[:38]:38s} {str(tid)[-10:]:>10s} {n:7d} {tot / 1e3:10.2f} {mx / 1e3:9.2f}")

    # Device side: per stream.
    by_stream = collections.defaultdict(list)
    for e in kernels:
        by_stream[e.get("args", {}).get("stream", -1)].append(e)
    print(f"\n{'stream':>8s} {'ops':>7s} {'busy ms':>9s} {'first ms':>9s} {'last ms':>9s}  top kernels")
    busiest, busiest_t = None, -1.0
    for i, (s, ks) in enumerate(sorted(by_stream.items(), key=lambda kv: -sum(k["dur"] for k in kv[1]))):
        busy = sum(k["dur"] for k in ks)
        if busy > busiest_t:
            busiest, busiest_t = s, busy
        if i >= a.streams:
            continue
        names = collections.Counter()
        for k in ks:
            names[k["name"][:40]] += k["dur"]
        top = ", ".join(f"{n} {d / 1e3:.1f}" for n, d in names.most_common(3))
        print(f"{s:>8} {len(ks):7d} {busy / 1e3:9.2f} {(min(k['ts'] for k in ks) - t0) / 1e3:9.1f} "
              f"{(max(k['ts'] + k['dur'] for k in ks) - t0) / 1e3:9.1f}  {top}")

    ks = sorted(by_stream[busiest], key=lambda k: k["ts"])
    gaps = []
    for x, y in zip(ks, ks[1:]):
        g = y["ts"] - (x["ts"] + x["dur"])
        if g > 0:
            gaps.append((g, x["ts"] - t0, x["name"][:40], y["name"][:40]))
    idle = sum(g[0] for g in gaps)
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
    print(f"\nbusiest stream {busiest}: busy {busiest_t / 1e3:.1f} ms of {span / 1e3:.1f} ms "
          f"({busiest_t / span:.1%}); idle gaps total {idle / 1e3:.1f} ms; largest:")
    for g, at, x, y in sorted(gaps, reverse=True)[:10]:
        print(f"  {g / 1e3:8.2f} ms at {at / 1e3:8.1f} ms  after {x}  before {y}")

    # Launch -> start delay of device ops on the other streams (by correlation id).
    launch = {e.get("args", {}).get("correlation"): e for e in runtime}
    d = []
    for s, ks2 in by_stream.items():
        if s == busiest:
            continue
        for k in ks2:
            r = launch.get(k.get("args", {}).get("correlation"))
            if r is not None:
                d.append((k["ts"] - r["ts"]) / 1e3)
    if d:
        d.sort()
        print(f"\nother streams, launch -> start: {len(d)} ops, p50 {d[len(d) // 2]:.2f} ms, "
              f"p95 {d[int(len(d) * 0.95)]:.2f} ms, p99 {d[int(len(d) * 0.99)]:.2f} ms, max {d[-1]:.2f} ms")


if __name__ == "__main__":
    main()
