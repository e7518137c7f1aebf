#!/usr/bin/env python3
"""The largest batch that trains under a GPU memory cap (issue 16), through the trainer itself.

For each mode: tuned (torch's caching allocator), tuned+expandable (the same with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) and loongforge (MemSculptor, CUDA graphs, the
GPU loader), `python -m loongforge.train --memory-cap-gib CAP` runs --probe-steps steps at a
batch size; a batch fits when the run exits 0, and does not when it exits with the trainer's
out-of-memory error (exit 3). Any other failure stops the search and is reported. The batch
grows from --start (doubling, or by --growth times) until a probe fails, then bisects in steps of --step (8), so the answer is
the largest multiple of --step that trains. No checkpoints (their staging is outside the cap).

    PYTHONPATH=python python3 bench/memory/max_batch.py --db DB --config n16 --cap-gib 40 \\
        --out results/max_batch [--parallel] [--extra=--init-device --extra=device]

--parallel searches the modes side by side, one probe process per mode at a time: the cap is per
process, so three 40 GiB probes fit one 139 GiB H200 (the steps share the GPU, which changes
their speed, not what fits). --extra passes a flag to every probe's trainer (for example
`--init-device device`, which builds the model on the GPU and cuts each probe's start-up).

Prints a table (largest batch per mode, and loongforge's ratio to tuned and to tuned+expandable)
and writes every probe to OUT/max_batch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODES = ("tuned", "tuned+expandable", "loongforge")
OOM_EXIT = 3  # loongforge.train: out of memory


def largest_fitting(fits: Callable[[int], bool], start: int, step: int,
                    limit: int, growth: float = 2.0) -> Tuple[int, Optional[int]]:
    """(largest multiple of `step` up to `limit` for which fits() is True (0: none), the
    smallest one found not to fit or None). Grows from `start` (a positive multiple of `step`)
    by `growth` times, rounded up to `step` and at least one step, until a batch does not fit
    (the last try is `limit` rounded down to `step`), then bisects between the last fit and the
    first failure. Fitting is assumed monotone. A start near the answer and a small growth (say
    1.1) cost fewer probes than doubling."""
    if start <= 0 or start % step:
        raise ValueError(f"start {start} must be a positive multiple of step {step}")
    if growth <= 1.0:
        raise ValueError(f"growth {growth} must be above 1")
    top = limit // step * step
    lo, hi, b = 0, None, min(start, top)
    while hi is None and lo < top:
        if fits(b):
            nxt = max(b + step, -(-int(b * growth) // step) * step)
            lo, b = b, min(nxt, top)
        else:
            hi = b
    if hi is None:
        return lo, None
    while hi - lo > step:
        mid = max(lo + step, (lo + hi) // 2 // step * step)
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def trainer_cmd(a: argparse.Namespace, mode: str, batch: int) -> Tuple[List[str], Dict[str, str]]:
    """The trainer's command line and environment for one probe."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode == "tuned+expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, "-m", "loongforge.train", "--config", a.config, "--data", a.db,
           "--mode", "tuned" if mode.startswith("tuned") else mode, "--batch-size", str(batch),
           "--steps", str(a.probe_steps), "--warmup", str(min(2, a.probe_steps - 1)),
           "--workers", str(a.workers), "--loader-threads", str(a.loader_threads),
           "--memory-cap-gib", str(a.cap_gib), "--log-every", str(a.probe_steps), "--quiet",
           *a.extra]
    return cmd, env


def _mentions_oom(stderr: str) -> bool:
    """An out-of-memory that surfaced as another error (for example inside a CUDA-graph capture,
    whose failure then breaks a later step): counted as not fitting, its stderr kept."""
    return "out of memory" in stderr.lower()


def _device_gib() -> float:
    import torch

    if not torch.cuda.is_available():
        return 0.0
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--config", default="n16")
    p.add_argument("--cap-gib", type=float, default=40.0)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--start", type=int, default=16)
    p.add_argument("--step", type=int, default=8)
    p.add_argument("--growth", type=float, default=2.0,
                   help="each fitting probe's batch times this is the next (at least one step)")
    p.add_argument("--limit", type=int, default=1024, help="largest batch tried")
    p.add_argument("--probe-steps", type=int, default=6)
    p.add_argument("--probe-timeout", type=int, default=300, help="seconds per probe")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="seconds for the whole search (0: none): a probe still running then is "
                        "stopped, and its mode reports the largest batch found to fit so far")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--loader-threads", type=int, default=12)
    p.add_argument("--out", default="results/max_batch")
    p.add_argument("--parallel", action="store_true",
                   help="search the modes side by side (one probe process per mode at a time)")
    p.add_argument("--extra", action="append", default=[],
                   help="a flag passed on to every probe's trainer (repeat for more)")
    a = p.parse_args()
    modes = a.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"unknown mode '{mode}' ({', '.join(MODES)})")
    if a.parallel and a.cap_gib * len(modes) > _device_gib():
        raise SystemExit(f"--parallel: {len(modes)} probes of {a.cap_gib:g} GiB do not fit "
                         f"this GPU's {_device_gib():.0f} GiB side by side")
    os.makedirs(a.out, exist_ok=True)
    result: Dict[str, Any] = {"args": vars(a), "modes": {}}
    lock = threading.Lock()
    deadline = time.monotonic() + a.budget_s if a.budget_s > 0 else None

    def save() -> None:
        with lock, open(os.path.join(a.out, "max_batch.json"), "w") as f:
            json.dump(result, f, indent=1)

    def search(mode: str) -> None:
        probes: List[Dict[str, Any]] = []

        def fits(batch: int) -> bool:
            cmd, env = trainer_cmd(a, mode, batch)
            t0 = time.perf_counter()
            limit = float(a.probe_timeout)
            if deadline is not None:
                limit = min(limit, deadline - time.monotonic())
                if limit <= 0:
                    raise subprocess.TimeoutExpired(cmd, 0)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
            rec = {"batch": batch, "rc": r.returncode, "s": round(time.perf_counter() - t0, 1)}
            oom = r.returncode == OOM_EXIT or (r.returncode != 0 and _mentions_oom(r.stderr))
            if r.returncode != 0:  # the trainer's out-of-memory line names the step and bytes
                rec["stderr_tail"] = r.stderr.strip().splitlines()[-8:]
            probes.append(rec)
            print(f"{mode} batch {batch}: "
                  f"{'fits' if r.returncode == 0 else 'out of memory' if oom else 'failed'}"
                  f" ({rec['s']} s)", flush=True)
            if r.returncode != 0 and not oom:
                raise RuntimeError(f"{mode} at batch {batch} failed (exit {r.returncode}):\n"
                                   + "\n".join(r.stderr.strip().splitlines()[-8:]))
            return r.returncode == 0

        try:
            lo, hi = largest_fitting(fits, a.start, a.step, a.limit, a.growth)
            result["modes"][mode] = {"largest_batch": lo, "smallest_failing": hi,
                                     "probes": probes}
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            why = (f"out of time at batch {probes[-1]['batch'] if probes else '?'}"
                   if isinstance(e, subprocess.TimeoutExpired) else str(e))
            fit = [p["batch"] for p in probes if p["rc"] == 0]
            result["modes"][mode] = {"error": why, "probes": probes,
                                     "largest_fitting_so_far": max(fit) if fit else 0}
        save()

    if a.parallel:
        threads = [threading.Thread(target=search, args=(m,)) for m in modes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result["modes"] = {m: result["modes"][m] for m in modes}  # the order asked for
        save()
    else:
        for mode in modes:
            search(mode)
    print(f"\n{a.config}, cap {a.cap_gib:g} GiB, {a.probe_steps} steps a probe, steps of {a.step}")
    got = {m: r.get("largest_batch") for m, r in result["modes"].items()}
    for m, r in result["modes"].items():
        line = f"{m:<18}{r['largest_batch'] if 'largest_batch' in r else 'error':>8}"
        if "error" in r:
            line += f"  ({r['error'].splitlines()[0]}; fits so far: {r['largest_fitting_so_far']})"
        if m == "loongforge" and got.get(m):
            for ref in ("tuned", "tuned+expandable"):
                if got.get(ref):
                    line += f"  {got[m] / got[ref]:.2f}x {ref}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
