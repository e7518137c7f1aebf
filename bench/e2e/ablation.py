#!/usr/bin/env python3
"""Ablation of the lean step (issue 9): one trainer run per switch, switches added cumulatively.

    python bench/e2e/ablation.py --db DB --config n16 --batches 16,64 --steps 30 --warmup 10 \
        --out results/ablation [--rows eager,static,syncfree,graphs,compile,fused]

Rows (each adds its switch to the row before; all in loongforge mode, counting host syncs;
the lean-step switches are forced off in the first rows, since loongforge mode turns them on):
  default   loongforge mode as in the end-to-end table (eager, fused AdamW)
  eager     eager step, foreach AdamW (the ablation's starting point)
  static    + static batches (--token-buckets)
  syncfree  + no host syncs in the step (--sync-free: figures read back 2 steps late)
  graphs    + per-microbatch CUDA graphs (--cuda-graph per_microbatch)
  compile   + torch.compile of the frozen encoder path (--compile-frozen)
  fused     + fused AdamW (--adamw fused)
  lean      stands alone: loongforge mode's defaults on CUDA (all of the above but compile, with
            --token-buckets auto instead of --buckets)
Prints a table per batch size (step p50/p95, tokens/GPU/s, host syncs per steady-state step,
graphs captured, peak memory, speed-up over `eager`) and writes results.json with every summary.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_OFF = ["--cuda-graph", "off", "--sync-free", "off", "--token-buckets", ""]
ROWS: List[Tuple[str, str, List[str]]] = [
    ("default", "loongforge eager, fused AdamW (issue 6 mode)", ["--adamw", "auto", *_OFF]),
    ("eager", "eager, foreach AdamW", ["--adamw", "foreach", *_OFF]),
    ("static", "+ static batches", ["--token-buckets", "{buckets}"]),
    ("syncfree", "+ no host syncs", ["--sync-free", "on"]),
    ("graphs", "+ CUDA graphs", ["--cuda-graph", "per_microbatch"]),
    ("compile", "+ compile (frozen path)", ["--compile-frozen"]),
    ("fused", "+ fused AdamW", ["--adamw", "fused"]),
    ("lean", "loongforge default on CUDA (lean step, auto buckets)", []),
]


def row_args(name: str, buckets: str, selected: Sequence[str] = ()) -> List[str]:
    """Cumulative switches up to `name` ('default' stands alone); rows not in `selected` (when
    given) contribute nothing, so e.g. 'fused' without 'compile' is not compiled."""
    if name == "default":
        return list(ROWS[0][2])
    if name == "lean":  # stands alone: the trainer's own defaults
        return []
    out: List[str] = []
    for n, _, extra in ROWS[1:]:
        if selected and n not in selected and n not in ("eager", name):
            continue
        extra = [a.replace("{buckets}", buckets) for a in extra]
        for i in range(0, len(extra), 2):  # a later choice of a flag replaces the earlier one
            flag = extra[i]
            if flag.startswith("--") and flag in out and i + 1 < len(extra) and \
                    not extra[i + 1].startswith("--"):
                j = out.index(flag)
                del out[j:j + 2]
        out += extra
        if n == name:
            return out
    raise ValueError(f"unknown row {name!r}; rows: {[r[0] for r in ROWS]}")


def compare_losses(results: Dict[str, Any], bs: int) -> None:
    """Loss curves of the eager row and the last lean row over their common steps."""
    runs = results["runs"]
    ref = runs.get(f"eager_b{bs}")
    for other in ("fused", "compile", "graphs"):
        cand = runs.get(f"{other}_b{bs}")
        if cand and "error" not in cand and ref and "error" not in ref:
            break
    else:
        return
    a = [r["loss"] for r in ref["loss_curve"]]
    b = [r["loss"] for r in cand["loss_curve"]]
    n = min(len(a), len(b))
    if n == 0:
        return
    rel = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a[:n], b[:n])]
    tail = max(1, n // 4)
    out = {"rows": ["eager", other], "steps": n, "max_rel_diff": max(rel),
           "mean_rel_diff": sum(rel) / n,
           "last_quarter_mean_loss": [sum(a[n - tail:n]) / tail, sum(b[n - tail:n]) / tail]}
    results.setdefault("loss_compare", {})[f"b{bs}"] = out
    print(f"loss curves eager vs {other}, batch {bs}, {n} steps: max rel diff "
          f"{out['max_rel_diff']:.4%}, mean {out['mean_rel_diff']:.4%}, last-quarter mean loss "
          f"{out['last_quarter_mean_loss'][0]:.4f} vs {out['last_quarter_mean_loss'][1]:.4f}",
          flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--config", default="n16")
    p.add_argument("--batches", default="16,64")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rows", default=",".join(r[0] for r in ROWS))
    p.add_argument("--steps-for", default="",
                   help="ROW=STEPS,... longer runs for some rows (e.g. eager=200,fused=200 for "
                        "the loss-curve comparison)")
    p.add_argument("--batches-for", default="",
                   help="ROW=B1/B2,... batch sizes a row runs at (default: all of --batches)")
    p.add_argument("--buckets", default="64", help="token buckets of the static rows")
    p.add_argument("--loader-threads", type=int, default=12)
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--extra", default="", help="more trainer arguments for every row")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    names = [n for n in a.rows.split(",") if n]
    labels = {n: lab for n, lab, _ in ROWS}
    results: Dict[str, Any] = {"config": a.config, "steps": a.steps, "warmup": a.warmup,
                               "buckets": a.buckets, "runs": {}}
    steps_for = {k: int(v) for k, v in (i.split("=") for i in a.steps_for.split(",") if i)}
    batches_for = {k: [int(b) for b in v.split("/")]
                   for k, v in (i.split("=") for i in a.batches_for.split(",") if i)}
    for bs in [int(x) for x in a.batches.split(",")]:
        table = []
        for name in names:
            if name in batches_for and bs not in batches_for[name]:
                continue
            steps = steps_for.get(name, a.steps)
            js = os.path.join(a.out, f"{name}_b{bs}.json")
            cmd = [sys.executable, "-m", "loongforge.train", "--config", a.config, "--data", a.db,
                   "--mode", "loongforge", "--batch-size", str(bs), "--steps", str(steps),
                   "--warmup", str(a.warmup), "--loader-threads", str(a.loader_threads),
                   "--count-syncs", "--quiet", "--json-out", js,
                   *row_args(name, a.buckets, names), *a.extra.split()]
            t0 = time.time()
            print(f"== b{bs} {name}: {' '.join(cmd[3:])}", flush=True)
            try:
                r = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                   timeout=a.timeout)
                rc, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired as e:
                rc, err = 124, (e.stderr or b"").decode(errors="replace") if isinstance(
                    e.stderr, bytes) else str(e.stderr or "")
            with open(os.path.join(a.out, f"{name}_b{bs}.log"), "w") as f:
                f.write(err)
            if rc != 0:
                print(f"   failed (rc {rc}): {err[-1500:]}", flush=True)
                table.append((name, None))
                results["runs"][f"{name}_b{bs}"] = {"error": err[-3000:], "rc": rc}
                continue
            s = json.load(open(js))
            s["wall_s_process"] = time.time() - t0
            results["runs"][f"{name}_b{bs}"] = s
            table.append((name, s))
            f = s["figures"]
            print(f"   step p50 {f['step_ms_p50']:.1f} ms, tokens/GPU/s "
                  f"{f['tokens_per_gpu_per_s']:.0f}, syncs/step {f.get('host_syncs_per_step')}, "
                  f"{time.time() - t0:.0f} s", flush=True)
        base = next((s for n, s in table if n == "eager" and s), None)
        print(f"\n{a.config}, batch {bs} ({a.steps} steps, {a.warmup} warm-up):")
        print("| row | step p50 | p95 | tokens/GPU/s | host syncs/step | graphs | peak reserved "
              "| vs eager |")
        print("|---|---|---|---|---|---|---|---|")
        for name, s in table:
            if s is None:
                print(f"| {labels[name]} | failed | | | | | | |")
                continue
            f = s["figures"]
            mem = f["memory"].get("peak_reserved_bytes") or 0
            g = s.get("cuda_graph", {})
            speed = (base["figures"]["step_ms_p50"] / f["step_ms_p50"]) if base else float("nan")
            print(f"| {labels[name]} | {f['step_ms_p50']:.1f} ms | {f['step_ms_p95']:.1f} ms | "
                  f"{f['tokens_per_gpu_per_s']:,.0f} | {f.get('host_syncs_per_step', float('nan')):.1f} | "
                  f"{g.get('graphs', 0)} | {mem / 2**30:.1f} GiB | {speed:.2f}× |")
        print(flush=True)
        compare_losses(results, bs)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    bad = [k for k, v in results["runs"].items() if "error" in v]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
