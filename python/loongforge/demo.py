"""`make demo`: synthesize a robot dataset, pack it, train the tiny GR00T-shaped policy in both
modes with the same seed and steps, and print the figures side by side.

    python -m loongforge.demo --out DIR --cli build/loongforge [--steps 60] [--batch-size 8]

Writes DIR/raw (episodes), DIR/db (packed LMDB), DIR/{baseline,loongforge}.json (full summaries),
DIR/{baseline,loongforge}.jsonl (per-step metrics), DIR/loongforge_trace.json (Chrome trace),
DIR/loss.png (loss and step time per step, both modes) and DIR/demo.json (the table).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

_MODULES = ("datafusion", "nexussync", "vault", "memsculptor")


def _run(cmd: Sequence[str], what: str, env: Optional[Dict[str, str]] = None) -> None:
    print(f"$ {' '.join(cmd)}", flush=True)
    r = subprocess.run(list(cmd), env=env)
    if r.returncode != 0:
        raise SystemExit(f"loongforge.demo: {what} failed (exit {r.returncode}): {' '.join(cmd)}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    import torch

    gpu = (torch.cuda.get_device_name(0) + " x" + str(torch.cuda.device_count())
           if torch.cuda.is_available() else "no GPU")
    return (f"{platform.node()} | {_cpu_model()} | {os.cpu_count()} cores | {gpu} | "
            f"torch {torch.__version__} | python {platform.python_version()}")


def git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        from . import build_info

        return str(build_info().get("git_hash", "unknown"))
    except Exception:
        return "unknown"


def available_modules() -> Dict[str, str]:
    """Which loongforge-mode modules this build has (missing ones are switched off, and said so)."""
    import importlib

    found: Dict[str, str] = {}
    for mod, (pkg, name) in {"datafusion": (".data", "DataFusionLoader"),
                             "nexussync": (".comm", "NexusSync"),
                             "vault": (".ckpt", "CheckpointVault"),
                             "memsculptor": (".memory", "MemSculptor")}.items():
        try:
            getattr(importlib.import_module(pkg, "loongforge"), name)
            found[mod] = "available"
        except (ImportError, AttributeError) as e:
            found[mod] = f"missing ({type(e).__name__})"
    return found


def _fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if unit == "%":
        return f"{v * 100:.1f}%"
    if unit == "MiB":
        return f"{v / 2**20:.0f} MiB"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"
    return str(v)


def _ratio(a: Any, b: Any, higher_better: bool) -> str:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return ""
    if math.isnan(a) or math.isnan(b) or a == 0 or b == 0:
        return "-"
    r = b / a if higher_better else a / b
    return f"{r:.2f}x"


def table(base: Dict[str, Any], lf: Dict[str, Any]) -> Tuple[str, List[Dict[str, Any]]]:
    fb, fl = base["figures"], lf["figures"]

    def mem(f: Dict[str, Any]) -> Any:
        m = f["memory"]
        return m.get("peak_allocated_bytes", m.get("peak_rss_bytes"))

    rows = [
        ("tokens/GPU/s", fb["tokens_per_gpu_per_s"], fl["tokens_per_gpu_per_s"], "", True),
        ("samples/s", fb["samples_per_s"], fl["samples_per_s"], "", True),
        ("step p50 (ms)", fb["step_ms_p50"], fl["step_ms_p50"], "", False),
        ("step p95 (ms)", fb["step_ms_p95"], fl["step_ms_p95"], "", False),
        ("data-wait share", fb["data_wait_share"], fl["data_wait_share"], "%", None),
        ("exposed comm share", fb["comm_exposed_share"], fl["comm_exposed_share"], "%", None),
        ("checkpoint stall share", fb["ckpt_stall_share"], fl["ckpt_stall_share"], "%", None),
        ("peak memory" + (" (alloc)" if fb["memory"]["kind"] == "cuda" else " (RSS)"),
         mem(fb), mem(fl), "MiB", False),
        ("first loss", base["loss_curve"][0]["loss"], lf["loss_curve"][0]["loss"], "", None),
        ("last loss", base["loss_curve"][-1]["loss"], lf["loss_curve"][-1]["loss"], "", None),
    ]
    out = [f"{'figure':<26}{'baseline':>14}{'loongforge':>14}{'ratio':>10}"]
    data = []
    for name, a, b, unit, hb in rows:
        r = _ratio(a, b, hb) if hb is not None else ""
        out.append(f"{name:<26}{_fmt(a, unit):>14}{_fmt(b, unit):>14}{r:>10}")
        data.append({"figure": name, "baseline": a, "loongforge": b, "ratio": r})
    return "\n".join(out), data


def curve_gap(base: Dict[str, Any], lf: Dict[str, Any]) -> Dict[str, float]:
    """Relative gap between the two loss curves (per step, and of 10-step means)."""
    a = [r["loss"] for r in base["loss_curve"]]
    b = [r["loss"] for r in lf["loss_curve"]]
    n = min(len(a), len(b))
    per = [abs(a[i] - b[i]) / max(abs(a[i]), 1e-12) for i in range(n)]
    w = 10
    means = [abs(sum(a[i:i + w]) - sum(b[i:i + w])) / max(abs(sum(a[i:i + w])), 1e-12)
             for i in range(0, n - w + 1, w)]
    return {"max_rel_gap_per_step": max(per) if per else float("nan"),
            "mean_rel_gap_per_step": sum(per) / n if n else float("nan"),
            "max_rel_gap_10step_mean": max(means) if means else float("nan")}


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """The trainer's per-step records (--metrics-jsonl); [] if the file is missing."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def plot_run(curves: Dict[str, List[Dict[str, Any]]], steps: Dict[str, List[Dict[str, Any]]],
             warmup: int, path: str) -> None:
    """The demo's figure as a PNG: loss per step (left) and step time per step (right), one line
    per mode. `curves` are the summaries' loss_curve lists, `steps` the per-step JSONL records."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on build machines
    import matplotlib.pyplot as plt

    colours = {"baseline": "tab:red", "loongforge": "tab:blue"}
    widths = {"baseline": 2.5, "loongforge": 1.2}  # equal losses must not hide the baseline
    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    for name, c in curves.items():
        ax_loss.plot([r["step"] for r in c], [r["loss"] for r in c], label=name,
                     color=colours.get(name), linewidth=widths.get(name, 1.5))
    ax_loss.set_title("training loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("flow-matching loss")
    for name, rows in steps.items():
        rows = [r for r in rows if "step_s" in r]
        ax_time.plot([r["step"] for r in rows], [r["step_s"] * 1e3 for r in rows], label=name,
                     color=colours.get(name), linewidth=1.5)
        wait = [(r["step"], r["data_wait_s"] * 1e3) for r in rows if "data_wait_s" in r]
        if wait:
            ax_time.plot([w[0] for w in wait], [w[1] for w in wait], label=f"{name}: data wait",
                         color=colours.get(name), linewidth=1, linestyle="--")
    if warmup > 0:
        ax_time.axvspan(0.5, warmup + 0.5, color="0.9", label="warm-up (not timed)")
    ax_time.set_title("step time")
    ax_time.set_xlabel("step")
    ax_time.set_ylabel("milliseconds")
    timed = [r["step_s"] * 1e3 for rows in steps.values() for r in rows
             if "step_s" in r and r.get("step", 0) > warmup]
    # Warm-up steps (allocator recording, graph capture) can take 10x a timed step; clip them so
    # the timed steps stay readable.
    ax_time.set_ylim(0, 1.5 * max(timed) if timed else None)
    for ax in (ax_loss, ax_time):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("LoongForge demo: tiny GR00T-shaped policy, same data and seed in both modes")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loongforge.demo", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="demo_out")
    p.add_argument("--cli", default="build/loongforge", help="the loongforge CLI binary")
    p.add_argument("--db", default=None, help="use this packed DB instead of generating one")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--size", default="320x240")
    p.add_argument("--config", default="tiny")
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--loader-threads", type=int, default=2)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3, help="higher than GR00T's 1e-4 so that the "
                   "short demo shows the loss falling")
    p.add_argument("--threads", type=int, default=0, help="torch threads in each run (0: default)")
    a = p.parse_args(argv)
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    py = sys.executable
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")

    db = a.db
    if db is None:
        if not os.path.exists(a.cli):
            raise SystemExit(f"loongforge.demo: CLI binary {a.cli} not found (build it first: make build)")
        raw, db = os.path.join(a.out, "raw"), os.path.join(a.out, "db")
        for d in (raw, db):
            shutil.rmtree(d, ignore_errors=True)
        _run([a.cli, "demo-data", "--out", raw, "--episodes", str(a.episodes), "--cameras", "2",
              "--size", a.size, "--seed", str(a.seed)], "demo-data")
        _run([a.cli, "pack", "--src", raw, "--out", db], "pack")

    avail = available_modules()
    off = [m for m, s in avail.items() if s != "available"]
    results: Dict[str, Dict[str, Any]] = {}
    for mode in ("baseline", "loongforge"):
        cmd = [py, "-m", "loongforge.train", "--config", a.config, "--data", db, "--mode", mode,
               "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--seed", str(a.seed),
               "--lr", str(a.lr), "--image-size", str(a.image_size), "--warmup", str(a.warmup),
               "--workers", str(a.workers), "--loader-threads", str(a.loader_threads),
               "--ckpt-every", str(a.ckpt_every),
               "--ckpt-dir", os.path.join(a.out, f"ckpt_{mode}"),
               "--json-out", os.path.join(a.out, f"{mode}.json"),
               "--metrics-jsonl", os.path.join(a.out, f"{mode}.jsonl"),
               "--log-every", "10", "--threads", str(a.threads)]
        if mode == "loongforge":
            cmd += ["--trace", os.path.join(a.out, "loongforge_trace.json")]
            cmd += [f"--no-{m}" for m in off]
        shutil.rmtree(os.path.join(a.out, f"ckpt_{mode}"), ignore_errors=True)
        _run(cmd, f"training ({mode})", env)
        with open(os.path.join(a.out, f"{mode}.json")) as f:
            results[mode] = json.load(f)

    base, lf = results["baseline"], results["loongforge"]
    text, rows = table(base, lf)
    gap = curve_gap(base, lf)
    plot_run({"baseline": base["loss_curve"], "loongforge": lf["loss_curve"]},
             {m: read_jsonl(os.path.join(a.out, f"{m}.jsonl")) for m in ("baseline", "loongforge")},
             a.warmup, os.path.join(a.out, "loss.png"))
    header = [
        "LoongForge demo: tiny GR00T-N1.6-shaped policy, same seed, same data, same steps",
        f"machine: {machine()}",
        f"date: {datetime.datetime.now().isoformat(timespec='seconds')} | commit: {git_commit()}",
        f"run: config {a.config} @ {a.image_size}px, batch {a.batch_size}, {a.steps} steps "
        f"({a.warmup} warm-up steps not timed), checkpoint every {a.ckpt_every}, "
        f"{base['world_size']} process(es) on {base['device']}",
        "loongforge modules: " + ", ".join(f"{k} {v}" for k, v in lf["modules"].items()),
        "baseline: torch DataLoader + PIL/torchvision in workers, main-process collate, torch.save",
    ]
    footer = [
        f"loss curves: max per-step relative gap {gap['max_rel_gap_per_step']:.2%}, "
        f"max gap of 10-step means {gap['max_rel_gap_10step_mean']:.2%} "
        "(the modes decode/resize JPEGs with different code, and random crops differ)",
        f"files: {a.out}/loss.png, {a.out}/{{baseline,loongforge}}.json, {a.out}/demo.json",
        f"demo wall time {time.time() - t_start:.0f} s",
    ]
    print("\n" + "\n".join(header) + "\n\n" + text + "\n\n" + "\n".join(footer))
    with open(os.path.join(a.out, "demo.json"), "w") as f:
        json.dump({"machine": machine(), "date": datetime.datetime.now().isoformat(),
                   "commit": git_commit(), "args": vars(a), "table": rows, "loss_gap": gap,
                   "modules": lf["modules"], "available": avail}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
