#!/usr/bin/env python3
"""End-to-end benchmark: the GR00T-shaped policy trained in three modes on the same packed data.

    # on the GPU machine (one H200): n16 at batch 16 and 64, 2 cameras, checkpoint every 50 steps
    python bench/e2e/run.py --db DB --config n16 --batches 16,64 --steps 120 --warmup 20 \
        --workers 16 --loader-threads 12 --out results/e2e
    # smoke test on a CPU box
    python bench/e2e/run.py --db DB --config tiny --image-size 112 --batches 8 --steps 20 \
        --warmup 3 --ckpt-every 10 --out /tmp/e2e

Runs, for each batch size: baseline (LeRobot-style), tuned (tuned PyTorch), tuned+compile (tuned
with torch.compile of the whole model; with --tuned-compile or listed in --modes), loongforge (all
modules), all with GR00T's image transforms (--augment). Prints a table per batch size (step
p50/p95, tokens/GPU/s and its ratios to LeRobot-style, tuned and tuned+compile, data wait,
checkpoint stall and blocking per save, peak allocated/reserved memory, model FLOPs per step, MFU,
and the warm-up's time beyond steady steps: compilation and graph captures, kept out of the timed
figures) and writes every run's summary JSON plus results.json. With --profile-modules N each run
also profiles N steps after warm-up and the per-part step time (data, vision, llm, projector, dit,
backward, optimizer, other; the trainer's module_breakdown) is printed under the table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))


def _gib(x: Any) -> str:
    return f"{x / 2**30:.1f}" if isinstance(x, (int, float)) and x == x else "-"


def _ratio(x: float, ref: Any) -> str:
    return f"{x / ref:.2f}x" if ref and ref == ref else "-"


def table_rows(runs: Dict[str, Dict[str, Any]]) -> List[str]:
    """The table of one batch size (issue 15 item 5): per mode, step p50/p95, tokens/GPU/s and
    its ratios to LeRobot-style (baseline) and tuned, data wait, checkpoint stall and blocking
    time per save, peak allocated / reserved memory (GiB; RSS on a CPU), model FLOPs per step and
    MFU (n/a without a known dense bf16 peak)."""
    out = [f"{'mode':<14}{'step p50':>9}{'p95':>7}{'tok/GPU/s':>11}{'vs base':>8}{'vs tuned':>9}"
           f"{'vs t+comp':>10}{'data wait':>10}{'ckpt':>7}{'block/save':>11}"
           f"{'peak alloc/resv':>16}{'TFLOP/step':>11}{'MFU':>7}{'warm-up+':>9}"]
    fig = {m: r.get("figures", {}) for m, r in runs.items()}
    base = fig.get("baseline", {}).get("tokens_per_gpu_per_s")
    tuned = fig.get("tuned", {}).get("tokens_per_gpu_per_s")
    compiled = fig.get(COMPILED, {}).get("tokens_per_gpu_per_s")
    for m, f in fig.items():
        mem = f.get("memory", {})
        if mem.get("kind") == "cuda":
            peak = f"{_gib(mem.get('peak_allocated_bytes'))}/{_gib(mem.get('peak_reserved_bytes'))}"
        else:
            peak = f"{_gib(mem.get('peak_rss_bytes'))} RSS"
        tok = f["tokens_per_gpu_per_s"]
        block = f.get("ckpt_block_s_mean", float("nan"))
        block_s = f"{block:.3f}s" if block == block else "-"
        flops = f.get("flops_per_step", float("nan"))
        mfu = f.get("mfu", float("nan"))
        warm = f.get("warmup_excess_s", float("nan"))
        out.append(f"{m:<14}{f['step_ms_p50']:>7.0f}ms{f['step_ms_p95']:>5.0f}ms{tok:>11.0f}"
                   f"{_ratio(tok, base):>8}{_ratio(tok, tuned):>9}{_ratio(tok, compiled):>10}"
                   f"{f['data_wait_share']:>10.1%}{f['ckpt_stall_share']:>7.1%}{block_s:>11}"
                   f"{peak:>16}{flops / 1e12 if flops == flops else float('nan'):>11.3g}"
                   f"{f'{mfu:.1%}' if mfu == mfu else 'n/a':>7}"
                   f"{f'{warm:.1f}s' if warm == warm else '-':>9}")
    return out


COMPILED = "tuned+compile"  # tuned mode with --compile: its own row


def trainer_mode(mode: str) -> tuple:
    """The trainer's --mode and extra flags of a bench mode, and its file tag."""
    if mode == COMPILED:
        return "tuned", ["--compile"], "tuned_compile"
    if mode not in ("baseline", "tuned", "loongforge"):
        raise SystemExit(f"unknown mode '{mode}' (baseline, tuned, {COMPILED}, loongforge)")
    return mode, [], mode


def breakdown_rows(runs: Dict[str, Dict[str, Any]]) -> List[str]:
    """Per mode with a profile (--profile-modules): ms per step and share of each part."""
    out = []
    for m, r in runs.items():
        b = r.get("module_breakdown")
        if not b:
            continue
        parts = " | ".join(f"{k} {v['ms']:.1f} ms {v['share']:.0%}" for k, v in b["parts"].items())
        out.append(f"{m:<12}profile of {b['steps']} steps, {b['step_ms']:.1f} ms/step: {parts}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--config", default="n16")
    p.add_argument("--image-size", type=int, default=0)
    p.add_argument("--batches", default="16,64")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--baseline-workers", type=int, default=0,
                   help="LeRobot-style worker count (0: same as --workers)")
    p.add_argument("--loader-threads", type=int, default=12)
    p.add_argument("--modes", default="baseline,tuned,loongforge")
    p.add_argument("--tuned-compile", action="store_true",
                   help=f"add the {COMPILED} row (tuned with torch.compile of the whole model)")
    p.add_argument("--augment", choices=("groot", "none"), default="groot",
                   help="image transforms of every mode (the trainer's --augment)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="dense bf16 peak per GPU for MFU (0: the trainer's table by device name)")
    p.add_argument("--profile-modules", type=int, default=0, metavar="N",
                   help="the trainer's --profile-modules N in every mode (per-part step time)")
    p.add_argument("--extra", default="", help="extra trainer flags for loongforge mode")
    p.add_argument("--extra-all", default="",
                   help="extra trainer flags for every mode (e.g. --init-device device)")
    p.add_argument("--out", default="results/e2e")
    p.add_argument("--reuse", action="store_true",
                   help="load {mode}_b{B}.json already in --out instead of re-running that mode "
                   "(run one mode per call, then print the full table)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from loongforge.demo import git_commit, machine

    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    results: Dict[str, Any] = {"machine": machine(), "date": datetime.datetime.now().isoformat(),
                               "commit": git_commit(), "args": vars(a), "runs": {}}
    lines: List[str] = []
    for bs in [int(x) for x in a.batches.split(",")]:
        runs: Dict[str, Dict[str, Any]] = {}
        modes = a.modes.split(",")
        if a.tuned_compile and COMPILED not in modes:
            modes.insert(modes.index("tuned") + 1 if "tuned" in modes else len(modes), COMPILED)
        for mode in modes:
            tmode, tflags, ttag = trainer_mode(mode)
            tag = f"{ttag}_b{bs}"
            done = os.path.join(a.out, f"{tag}.json")
            if a.reuse and os.path.exists(done):
                with open(done) as f:
                    runs[mode] = json.load(f)
                continue
            workers = a.baseline_workers or a.workers if mode == "baseline" else a.workers
            cmd = [sys.executable, "-m", "loongforge.train", "--config", a.config, "--data", a.db,
                   "--mode", tmode, "--steps", str(a.steps), "--warmup", str(a.warmup),
                   "--batch-size", str(bs), "--workers", str(workers),
                   "--loader-threads", str(a.loader_threads), "--ckpt-every", str(a.ckpt_every),
                   "--ckpt-dir", os.path.join(a.out, f"ckpt_{tag}"), "--log-every", "10",
                   "--json-out", os.path.join(a.out, f"{tag}.json"),
                   "--metrics-jsonl", os.path.join(a.out, f"{tag}.jsonl"),
                   "--trace", os.path.join(a.out, f"{tag}_trace.json"),
                   "--augment", a.augment, "--peak-tflops", str(a.peak_tflops)]
            if a.image_size:
                cmd += ["--image-size", str(a.image_size)]
            if a.profile_modules:
                cmd += ["--profile-modules", str(a.profile_modules)]
            cmd += tflags
            cmd += a.extra_all.split()
            if mode == "loongforge" and a.extra:
                cmd += a.extra.split()
            print("$ " + " ".join(cmd), flush=True)
            r = subprocess.run(cmd, env=env)
            if r.returncode != 0:
                print(f"run {tag} failed (exit {r.returncode})", flush=True)
                continue
            subprocess.run(["rm", "-rf", os.path.join(a.out, f"ckpt_{tag}")])
            with open(os.path.join(a.out, f"{tag}.json")) as f:
                runs[mode] = json.load(f)
        results["runs"][str(bs)] = {m: r["figures"] for m, r in runs.items()}
        prof = {m: r["module_breakdown"] for m, r in runs.items() if "module_breakdown" in r}
        if prof:
            results.setdefault("module_breakdown", {})[str(bs)] = prof
        lines.append(f"\n{a.config}, batch {bs}, {a.steps} steps ({a.warmup} warm-up), ckpt every "
                     f"{a.ckpt_every}, augment {a.augment}")
        lines += table_rows(runs)
        lines += breakdown_rows(runs)
    text = "\n".join(lines)
    print(f"\nmachine: {results['machine']}\ndate: {results['date']} commit: {results['commit']}"
          + text)
    results["table"] = text
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
