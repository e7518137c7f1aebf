#!/usr/bin/env python3
"""Compares trainer loss curves (the `loss_curve` of `loongforge.train --json-out`) step by step.

    python bench/e2e/compare_curves.py --ref EAGER.json --noise EAGER2.json RUN.json [RUN2.json...]

For each run against the reference: the first non-finite loss, skipped non-finite optimizer steps,
the relative loss difference per step (max, mean, and the mean over the last 50 steps), and the
difference of 10-step means (smooths single-batch noise). The `--noise` run (the reference's
configuration again, same seed) gives the noise floor those figures are judged against: a run
agrees "within noise" when its smoothed difference is at most 2x the floor's plus 1% absolute.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchjson  # noqa: E402


def curve(path: str) -> Tuple[List[float], Dict[str, Any]]:
    with open(path) as f:
        s = json.load(f)
    return [float(r["loss"]) for r in s["loss_curve"]], s


def compare(ref: List[float], run: List[float]) -> Dict[str, Any]:
    n = min(len(ref), len(run))
    bad = [i + 1 for i in range(n) if not math.isfinite(run[i])]
    rel = [abs(run[i] - ref[i]) / max(abs(ref[i]), 1e-12) for i in range(n)
           if math.isfinite(run[i]) and math.isfinite(ref[i])]
    win = []
    for i in range(0, n - 9, 10):
        a, b = ref[i:i + 10], run[i:i + 10]
        if all(map(math.isfinite, a + b)):
            ma, mb = sum(a) / 10, sum(b) / 10
            win.append(abs(mb - ma) / max(abs(ma), 1e-12))
    tail = rel[-50:]
    return {"steps": n, "first_nonfinite_step": bad[0] if bad else None,
            "nonfinite_steps": len(bad),
            "rel_max": max(rel) if rel else float("nan"),
            "rel_mean": sum(rel) / len(rel) if rel else float("nan"),
            "rel_mean_last50": sum(tail) / len(tail) if tail else float("nan"),
            "rel_10step_max": max(win) if win else float("nan"),
            "final_ref": ref[n - 1] if n else float("nan"),
            "final_run": run[n - 1] if n else float("nan")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", required=True)
    p.add_argument("--noise", help="the reference configuration again (noise floor)")
    p.add_argument("runs", nargs="+")
    p.add_argument("--json-out")
    a = p.parse_args()
    ref, _ = curve(a.ref)
    out: Dict[str, Any] = {}
    floor = None
    if a.noise:
        noise, ns = curve(a.noise)
        floor = out["noise_floor"] = compare(ref, noise)
        out["noise_floor"]["skipped_nonfinite_steps"] = ns.get("skipped_nonfinite_steps", 0)
    ok = True
    for path in a.runs:
        run, s = curve(path)
        c = compare(ref, run)
        c["skipped_nonfinite_steps"] = s.get("skipped_nonfinite_steps", 0)
        c["step_ms_p50"] = s.get("figures", {}).get("step_ms_p50")
        if floor is not None:
            c["within_noise"] = (c["first_nonfinite_step"] is None and
                                 c["rel_10step_max"] <= 2 * floor["rel_10step_max"] + 0.01)
            ok &= c["within_noise"]
        out[path] = c
    for name, c in out.items():
        print(f"{name}: steps {c['steps']}, first non-finite {c['first_nonfinite_step']}, "
              f"skipped {c.get('skipped_nonfinite_steps', 0)}, rel diff max {c['rel_max']:.4f} "
              f"mean {c['rel_mean']:.4f} last-50 mean {c['rel_mean_last50']:.4f}, 10-step means "
              f"max {c['rel_10step_max']:.4f}, final {c['final_ref']:.4f} vs {c['final_run']:.4f}"
              + (f", within noise: {c['within_noise']}" if "within_noise" in c else ""))
    if a.json_out:
        benchjson.write(a.json_out, out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
