#!/usr/bin/env python3
"""What was live at the peak of a recorded run, by allocation site.

    python -m loongforge.train ... --memory-history /tmp/lf.pickle
    python3 bench/memory/peak_breakdown.py /tmp/tuned.pickle /tmp/lf.pickle [--depth 2] [--json OUT]

For each snapshot (``torch.cuda.memory._dump_snapshot``, recorded with Python stacks): the peak of
live bytes over the recorded allocations and the blocks live at that moment, grouped by their
innermost frames in loongforge's files (``loongforge._snapshot_import.peak_breakdown``); then the
peak of reserved bytes and, per pool, how much of it was free then (``reserved_breakdown``: the
fragmentation, pool by pool).
"""
from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, "..", "..", "python"), os.path.join(_HERE, "..")]
import benchjson  # noqa: E402
from loongforge._snapshot_import import peak_breakdown, reserved_breakdown  # noqa: E402
from loongforge.memory import load_snapshot  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("snapshots", nargs="+", help="pickled snapshots (--memory-history)")
    p.add_argument("--depth", type=int, default=2, help="loongforge frames naming a site")
    p.add_argument("--top", type=int, default=20, help="sites listed (the rest summed)")
    p.add_argument("--json", default="", help="also write the breakdowns here")
    a = p.parse_args()
    out = {}
    failed = 0
    for path in a.snapshots:
        try:
            snap = load_snapshot(path)  # plain data only: a global named in the file is refused
            r = peak_breakdown(snap, depth=a.depth, top=a.top)
            r["reserved"] = reserved_breakdown(snap)
        except (OSError, ValueError, KeyError) as e:
            print(f"peak_breakdown: {path}: {e}", file=sys.stderr)  # the others still reported
            failed += 1
            continue
        out[path] = r
        print(f"{path}: peak {r['peak_bytes'] / 2**30:.2f} GiB live at entry {r['peak_entry']} "
              f"of {r['entries']}")
        for s in r["sites"]:
            print(f"  {s['bytes'] / 2**30:8.3f} GiB {s['blocks']:7d} blocks  {s['site']}")
        rv = r["reserved"]
        print(f"  reserved peak {rv['reserved_peak_bytes'] / 2**30:.2f} GiB at entry {rv['entry']}, "
              f"{rv['allocated_bytes'] / 2**30:.2f} GiB of it allocated; by pool:")
        for q in rv["pools"]:
            print(f"  {q['free'] / 2**30:8.3f} GiB free of {q['reserved'] / 2**30:8.3f} "
                  f"({q['segments']} segments)  pool {q['pool']} stream {q['stream']}")
    if a.json:
        benchjson.write(a.json, out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
