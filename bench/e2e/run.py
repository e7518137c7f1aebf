#!/usr/bin/env python3
"""End-to-end benchmark: the GR00T-shaped policy trained by each alternative on the same data.

    # on the GPU machine (one H200): n16, one call per batch size, every row in it
    python bench/e2e/run.py --db DB --config n16 --batches 16 --steps 320 --warmup 20 \
        --workers 16 --loader-threads 12 --out results/e2e
    # smoke test on a CPU box
    python bench/e2e/run.py --db DB --config tiny --image-size 112 --batches 8 --steps 20 \
        --warmup 3 --out /tmp/e2e

The rows (--modes), each the trainer (python -m loongforge.train) in one configuration:

- lerobot: LeRobot's own train-script DataLoader settings (huggingface/lerobot 7427f31,
  src/lerobot/scripts/lerobot_train.py: workers collate, pin_memory, persistent workers,
  prefetch 4, a new iterator per epoch through ``cycle()``), frames decoded by PIL in the
  workers, the frozen weights in fp32, a host sync per step (LeRobot reads ``loss.item()``).
  LeRobot decodes video with torchcodec; the GPU machine has no video decoder, so the frames come
  as JPEGs from the same LMDB as every other row's.
- tuned: the same DataLoader with GPU JPEG decode (torchvision, nvJPEG) and crop/resize/jitter
  on the GPU, a sampler that runs across epochs, frozen weights in bf16 (Isaac-GR00T N1.6's
  default), expandable segments, fused AdamW, no host sync per step.
- tuned+graphs: tuned + ``torch.compile(mode="reduce-overhead")`` of the whole model with static
  shapes (PyTorch's own CUDA graphs). Every ratio is stated against this row.
- tuned+compile (optional): tuned + torch.compile in its default mode (no graphs).
- loongforge: every module.

Every row applies GR00T's image transforms (--augment) with an antialiased resize. Each row
starts its first epoch at a batch chosen so that one epoch boundary falls in the middle of its
timed window (--start-batch, as a resumed run would): the table gives the steady state (the timed
steps without the boundary's), and the boundary's cost separately (the time of the
``BOUNDARY_STEPS`` steps from the epoch's first batch beyond as many steady p50 steps). Also per
row: step p50/p95, tokens/GPU/s, data wait (the time the step waits for its batch, read where the
step starts, the same in every mode), warm-up beyond steady steps (compilation, captures), peak
allocated/reserved memory, model FLOPs per step at the samples' real text lengths and MFU.
Writes every run's summary JSON and per-step JSONL plus results.json (commit, command, table).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

REFERENCE = "tuned+graphs"  # the strongest plain-PyTorch row: every ratio is against it
BOUNDARY_STEPS = 5  # steps from an epoch's first batch counted as the boundary's cost
MODES = {  # bench row -> (trainer --mode, extra trainer flags, file tag)
    "lerobot": ("baseline", [], "lerobot"),
    "tuned": ("tuned", [], "tuned"),
    "tuned+graphs": ("tuned", ["--compile", "--compile-mode", "reduce-overhead"],
                     "tuned_graphs"),
    "tuned+compile": ("tuned", ["--compile"], "tuned_compile"),
    "loongforge": ("loongforge", [], "loongforge"),
}
ALIASES = {"baseline": "lerobot"}


def trainer_mode(mode: str) -> tuple:
    """The trainer's --mode and extra flags of a bench row, and its file tag."""
    mode = ALIASES.get(mode, mode)
    if mode not in MODES:
        raise SystemExit(f"unknown mode '{mode}' ({', '.join(MODES)})")
    m, flags, tag = MODES[mode]
    return m, list(flags), tag


def start_batch(batches_per_epoch: int, warmup: int, steps: int) -> int:
    """The first epoch's starting batch that puts its end in the middle of the timed steps
    (0 when an epoch is too short for that: then boundaries fall where they fall)."""
    timed = steps - warmup
    s = batches_per_epoch - (warmup + timed // 2)
    return s if s > 0 else 0


def _percentile(xs: List[float], q: float) -> float:
    if not xs:
        return float("nan")
    ys = sorted(xs)
    k = (len(ys) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def steady(rows: List[Dict[str, Any]], warmup: int, boundary_step: int,
           batches_per_epoch: int) -> Dict[str, Any]:
    """Figures of the timed steps (step > warmup) from the per-step rows: the steady state
    without the BOUNDARY_STEPS steps from each epoch's first batch, and those steps' cost
    beyond as many steady p50 steps, per boundary. boundary_step: the step that reads the
    first batch of the first new epoch (1 + batches_per_epoch - the start batch); the next
    boundaries follow every batches_per_epoch steps."""
    timed = [r for r in rows if r["step"] > warmup and not r.get("skipped_nonfinite")]
    last = timed[-1]["step"] if timed else 0
    starts = list(range(boundary_step, last + 1, batches_per_epoch)) if batches_per_epoch else []
    windows = [[r for r in timed if b <= r["step"] < b + BOUNDARY_STEPS] for b in starts]
    windows = [w for w in windows if w]
    in_window = {r["step"] for w in windows for r in w}
    st = [r for r in timed if r["step"] not in in_window]
    tot = sum(r["step_s"] for r in st)
    step_s = [r["step_s"] for r in st]
    p50 = _percentile(step_s, 50)
    nb = len(windows)
    cost = (sum(r["step_s"] - p50 for w in windows for r in w) / nb) if nb else float("nan")

    def per_s(key: str) -> float:
        return sum(r[key] for r in st) / tot if tot > 0 else float("nan")

    return {"steps": len(st), "tokens_per_gpu_per_s": per_s("tokens"),
            "samples_per_s": per_s("samples"),
            "step_ms_p50": p50 * 1e3, "step_ms_p95": _percentile(step_s, 95) * 1e3,
            "data_wait_share": per_s("data_wait_s"),
            "flops_per_step": sum(r.get("flops", 0.0) for r in st) / len(st) if st
            else float("nan"),
            "boundaries": nb, "boundary_cost_s": cost,
            "boundary_data_wait_s": (sum(r["data_wait_s"] for w in windows for r in w) / nb
                                     if nb else float("nan"))}


def _gib(x: Any) -> str:
    return f"{x / 2**30:.1f}" if isinstance(x, (int, float)) and x == x else "-"


def _ratio(x: float, ref: Any) -> str:
    return f"{x / ref:.2f}x" if ref and ref == ref and x == x else "-"


def table_rows(runs: Dict[str, Dict[str, Any]], peak: Optional[float] = None) -> List[str]:
    """The table of one batch size: per row, the steady state (step p50/p95, tokens/GPU/s and
    its ratios to tuned+graphs, tuned and lerobot, data wait), the epoch boundary's cost, the
    warm-up beyond steady steps, peak allocated / reserved memory (GiB; RSS on a CPU), model
    FLOPs per step and MFU (n/a without a known dense bf16 peak)."""
    out = [f"{'mode':<14}{'step p50':>9}{'p95':>7}{'tok/GPU/s':>11}{'vs t+graphs':>12}"
           f"{'vs tuned':>9}{'vs lerobot':>11}{'data wait':>10}{'boundary':>9}{'warm-up+':>9}"
           f"{'peak alloc/resv':>16}{'TFLOP/step':>11}{'MFU':>7}"]
    st = {m: r.get("steady") or {} for m, r in runs.items()}
    ref = st.get(REFERENCE, {}).get("tokens_per_gpu_per_s")
    tuned = st.get("tuned", {}).get("tokens_per_gpu_per_s")
    lerobot = st.get("lerobot", {}).get("tokens_per_gpu_per_s")
    for m, r in runs.items():
        f, s = r.get("figures", {}), st[m]
        mem = f.get("memory", {})
        if mem.get("kind") == "cuda":
            alloc, resv = mem.get("peak_allocated_bytes"), mem.get("peak_reserved_bytes")
            mem_s = f"{_gib(alloc)}/{_gib(resv)}"
        else:
            mem_s = f"{_gib(mem.get('peak_rss_bytes'))} RSS"
        tok = s.get("tokens_per_gpu_per_s", float("nan"))
        flops = s.get("flops_per_step", float("nan"))
        p50 = s.get("step_ms_p50", float("nan"))
        mfu = flops / (p50 / 1e3) / peak if peak and p50 == p50 and flops == flops else None
        bound = s.get("boundary_cost_s", float("nan"))
        warm = f.get("warmup_excess_s", float("nan"))
        out.append(f"{m:<14}{p50:>7.1f}ms{s.get('step_ms_p95', float('nan')):>5.0f}ms{tok:>11.0f}"
                   f"{_ratio(tok, ref):>12}{_ratio(tok, tuned):>9}{_ratio(tok, lerobot):>11}"
                   f"{s.get('data_wait_share', float('nan')):>10.1%}"
                   f"{f'{bound:.2f}s' if bound == bound else 'n/a':>9}"
                   f"{f'{warm:.0f}s' if warm == warm else '-':>9}{mem_s:>16}"
                   f"{flops / 1e12 if flops == flops else float('nan'):>11.3g}"
                   f"{f'{mfu:.1%}' if mfu is not None else 'n/a':>7}")
    return out


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


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--config", default="n16")
    p.add_argument("--image-size", type=int, default=0)
    p.add_argument("--batches", default="16")
    p.add_argument("--steps", type=int, default=320, help="steps per row, warm-up included")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--workers", type=int, default=16, help="DataLoader workers (torch rows)")
    p.add_argument("--loader-threads", type=int, default=12)
    p.add_argument("--modes", default="lerobot,tuned,tuned+graphs,loongforge")
    p.add_argument("--no-boundary", action="store_true",
                   help="start every row at the epoch's first batch (no --start-batch)")
    p.add_argument("--row-timeout", type=float, default=0.0,
                   help="seconds a row may run (0: no bound); a row past it is reported as such")
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
                   help="load {tag}_b{B}.json already in --out instead of re-running that row")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from loongforge.demo import git_commit, machine
    from loongforge.trainer_data import read_schema

    schema = read_schema(a.db)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    results: Dict[str, Any] = {"machine": machine(), "date": datetime.datetime.now().isoformat(),
                               "commit": git_commit(), "command": shlex.join(sys.argv),
                               "args": vars(a), "num_samples": int(schema["num_samples"]),
                               "runs": {}}
    lines: List[str] = []
    peak = None
    for bs in [int(x) for x in a.batches.split(",")]:
        runs: Dict[str, Dict[str, Any]] = {}
        bpe = int(schema["num_samples"]) // bs
        sb = 0 if a.no_boundary else start_batch(bpe, a.warmup, a.steps)
        for mode in [ALIASES.get(m, m) for m in a.modes.split(",")]:
            tmode, tflags, ttag = trainer_mode(mode)
            tag = f"{ttag}_b{bs}"
            done = os.path.join(a.out, f"{tag}.json")
            jsonl = os.path.join(a.out, f"{tag}.jsonl")
            if not (a.reuse and os.path.exists(done)):
                cmd = [sys.executable, "-m", "loongforge.train", "--config", a.config,
                       "--data", a.db, "--mode", tmode, "--steps", str(a.steps),
                       "--warmup", str(a.warmup), "--batch-size", str(bs),
                       "--workers", str(a.workers), "--loader-threads", str(a.loader_threads),
                       "--ckpt-every", str(a.ckpt_every),
                       "--ckpt-dir", os.path.join(a.out, f"ckpt_{tag}"), "--log-every", "20",
                       "--json-out", done, "--metrics-jsonl", jsonl,
                       "--augment", a.augment, "--peak-tflops", str(a.peak_tflops)]
                if sb:
                    cmd += ["--start-batch", str(sb)]
                if a.image_size:
                    cmd += ["--image-size", str(a.image_size)]
                if a.profile_modules:
                    cmd += ["--profile-modules", str(a.profile_modules)]
                cmd += tflags + a.extra_all.split()
                if mode == "loongforge" and a.extra:
                    cmd += a.extra.split()
                print("$ " + shlex.join(cmd), flush=True)
                try:
                    r = subprocess.run(cmd, env=env, timeout=a.row_timeout or None)
                    rc = r.returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                subprocess.run(["rm", "-rf", os.path.join(a.out, f"ckpt_{tag}")])
                if rc != 0:
                    print(f"row {mode} b{bs} did not finish ({rc})", flush=True)
                    runs[mode] = {"failed": str(rc)}
                    continue
            with open(done) as f:
                runs[mode] = json.load(f)
            rows = read_jsonl(jsonl) if os.path.exists(jsonl) else []
            runs[mode]["steady"] = steady(rows, a.warmup, 1 + bpe - sb, bpe)
            runs[mode]["steady"]["start_batch"] = sb
            if "peak_flops_per_s" in runs[mode].get("figures", {}):
                pk = runs[mode]["figures"]["peak_flops_per_s"]
                peak = pk if pk == pk else peak
        ok = {m: r for m, r in runs.items() if "failed" not in r}
        results["runs"][str(bs)] = {m: ({"failed": r["failed"]} if "failed" in r else
                                        {"figures": r["figures"], "steady": r["steady"],
                                         "status": r.get("status", {})})
                                    for m, r in runs.items()}
        prof = {m: r["module_breakdown"] for m, r in ok.items() if "module_breakdown" in r}
        if prof:
            results.setdefault("module_breakdown", {})[str(bs)] = prof
        lines.append(f"\n{a.config}, batch {bs}, {a.steps} steps per row ({a.warmup} warm-up), "
                     f"{schema['num_samples']} samples ({bpe} batches per epoch, rows start at "
                     f"batch {sb}), augment {a.augment}, ckpt every {a.ckpt_every or 'never'}")
        lines += table_rows(ok, peak)
        lines += [f"{m:<14}did not finish: {r['failed']}" for m, r in runs.items()
                  if "failed" in r]
        lines += breakdown_rows(ok)
    text = "\n".join(lines)
    print(f"\nmachine: {results['machine']}\ndate: {results['date']} commit: {results['commit']}"
          f"\ncommand: {results['command']}" + text)
    results["table"] = text
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
