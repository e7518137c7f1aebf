#!/usr/bin/env python3
"""Captures REAL allocation traces on a CUDA machine, in MemSculptor's trace format
(``loongforge mem plan|replay`` read them; zstd-compressed ``.trace.zst``).

Two workloads, each captured by two recorders (four child processes, each with its own timeout;
the allocator is chosen before CUDA starts, so every capture runs in a fresh process):

  gr00t  training steps of the GR00T-shaped policy (python/loongforge/models/gr00t.py; config n16
         by default, batch 8, one 224x224 camera, bf16 autocast, fused AdamW): forward + backward
         + optimizer step + zero_grad(set_to_none) per step. The text length changes every step,
         as in the real dataset: per-sample lengths are drawn at random and the batch is padded
         to the next multiple of 32 (the padding bucket is the step's signature "L{len}xB{b}").
         Two warm-up steps first (optimizer state, cuBLAS workspaces), then --steps recorded steps
         in which every bucket appears at least twice.
  moe    one MoE FFN layer of the n16-moe config (16 experts, top-2, dim 1536, hidden 6144), forward
         + backward (+ zero_grad(set_to_none)), with a varying number of tokens per expert: each
         step's input gets a random "topic" direction that skews the router, and the total token
         count cycles through a few values (signature "T{tokens}").

Recorders:
  torch  torch.cuda.memory._record_memory_history (no stack capture) under torch's own allocator,
         one continuous recording; the device trace length after each step gives the step
         boundaries; converted by python/loongforge/_snapshot_import.py (the importer behind
         loongforge.memory.trace_from_snapshot). Also writes the raw snapshot (pickle.gz, not
         for committing) so the conversion can be redone offline.
  ms     MemSculptor's own recording (loongforge.MemSculptor installed as torch's allocator,
         ms.record(steps=N, trace_path=...)); needs a CUDA build (loongforge._C hosts the allocator).

Output in --out: <name>.trace.zst (or .trace when neither loongforge._C nor the zstd tool can
compress), <name>.json (what was captured: steps, signatures, token counts, torch's peak memory,
sizes), capture_summary.json, and a table on stdout. Exit status 1 if a capture failed (the others
still run), 2 without CUDA.

    PYTHONPATH=python python3 bench/memory/capture_traces.py --out results/gpu/traces
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gr00t_workload import PYDIR, REPO, Gr00tWork, MoEWork, build_work, load_by_path  # noqa: E402


def _snapshot_module():
    return load_by_path("_lf_snapshot_import",
                        os.path.join(PYDIR, "loongforge", "_snapshot_import.py"))



def _compress(plain: str, want: str) -> Tuple[str, str]:
    """plain text trace -> want (.trace.zst). Returns (path written, how). Falls back to the zstd
    tool, then to leaving the plain file."""
    try:
        from loongforge import _C
        t = _C.MemTrace.load(plain)
        t.save(want, True)
        os.remove(plain)
        return want, "loongforge._C (zstd -19)"
    except Exception as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}"
    if shutil.which("zstd"):
        r = subprocess.run(["zstd", "-q", "-19", "-f", "--rm", plain, "-o", want],
                           capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            return want, "zstd tool"
        why += f"; zstd tool: {r.stderr.strip()}"
    return plain, f"uncompressed ({why})"


def run_child(args) -> Dict[str, Any]:
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("capture_traces: CUDA is required (torch.cuda.is_available() is False)")
    name = args.name
    out_dir = args.out
    ms = None
    if args.source == "ms":
        from loongforge.memory import MemSculptor
        if not MemSculptor.available():
            from loongforge.memory import _why_unavailable
            raise RuntimeError(f"MemSculptor unavailable: {_why_unavailable()}")
        ms = MemSculptor(0).install()  # before any CUDA allocation
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    cls = Gr00tWork if args.workload == "gr00t" else MoEWork
    t_build = time.perf_counter()
    work = build_work(cls, args, torch, dev, ms)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t_build
    sched = work.schedule(args.warmup + args.steps)
    warm, rec = sched[:args.warmup], sched[args.warmup:]

    def one(item):
        if ms is not None:
            with ms.step(signature=work.signature(item)):
                r = work.step(item)
        else:
            r = work.step(item)
        torch.cuda.synchronize()
        return r

    for item in warm:
        one(item)
    persistent_bytes = (torch.cuda.memory_allocated() if ms is None
                        else ms.stats()["allocated_bytes"])
    plain = os.path.join(out_dir, name + ".trace")
    per_step: List[Dict[str, Any]] = []
    t_rec = time.perf_counter()
    if ms is None:
        torch.cuda.reset_peak_memory_stats()
        hist = torch.cuda.memory._record_memory_history
        try:
            hist(enabled="all", context=None, stacks="python", max_entries=args.max_entries)
        except TypeError:  # older signature
            hist(True, trace_alloc_max_entries=args.max_entries, trace_alloc_record_context=False)
        bounds: List[int] = []
        for item in rec:
            n_before = len(torch.cuda.memory._snapshot()["device_traces"][0])
            bounds.append(n_before)
            r = one(item)
            r["signature"] = work.signature(item)
            per_step.append(r)
        snap = torch.cuda.memory._snapshot()
        try:
            hist(enabled=None)
        except TypeError:
            hist(False)
        entries = snap["device_traces"][0]
        if len(entries) >= args.max_entries:
            raise RuntimeError(f"the device trace hit max_entries={args.max_entries} (ring buffer "
                               "wrapped, step boundaries lost): raise --max-entries")
        rec_s = time.perf_counter() - t_rec
        conv = _snapshot_module()
        # Step 0 starts at entry 0 (anything recorded before its first allocation, such as a
        # late free of a warm-up tensor, is a foreign free in step 0); steps 1.. at their bounds.
        text = conv.snapshot_to_text(snap, 0, bounds[1:], [r["signature"] for r in per_step])
        with open(plain, "w") as f:
            f.write(text)
        with gzip.open(os.path.join(out_dir, name + ".snapshot.pickle.gz"), "wb",
                       compresslevel=6) as f:
            pickle.dump({"device_traces": snap["device_traces"], "step_boundaries": bounds,
                         "signatures": [r["signature"] for r in per_step]}, f)
        memory = {"torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                  "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                  "persistent_allocated_bytes": persistent_bytes,
                  "snapshot_entries": len(entries)}
    else:
        ms.record(steps=len(rec), trace_path=plain)
        ms.reset_peaks()
        for item in rec:
            r = one(item)
            r["signature"] = work.signature(item)
            per_step.append(r)
        rec_s = time.perf_counter() - t_rec
        if not os.path.exists(plain):
            raise RuntimeError(f"MemSculptor wrote no trace to {plain}")
        s = ms.stats()
        memory = {"memsculptor_stats": s, "persistent_allocated_bytes": persistent_bytes,
                  "plans": ms.plans}
    plain_bytes = os.path.getsize(plain)
    path, how = _compress(plain, os.path.join(out_dir, name + ".trace.zst"))
    meta = dict(work.meta)
    meta.update({
        "name": name, "source": args.source, "file": os.path.basename(path),
        "compression": how, "bytes": os.path.getsize(path), "text_bytes": plain_bytes,
        "warmup_steps": args.warmup, "recorded_steps": len(rec), "steps": per_step,
        "build_s": round(build_s, 2), "record_s": round(rec_s, 2), "memory": memory,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(sys.argv),
    })
    try:
        meta["commit"] = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        meta["commit"] = "unknown"
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
    return {"name": name, "file": path, "bytes": meta["bytes"], "text_bytes": plain_bytes,
            "steps": len(rec), "signatures": sorted({r["signature"] for r in per_step}),
            "compression": how, "record_s": meta["record_s"], "build_s": meta["build_s"]}


# ------------------------------------------------------------------------------------------------
# Parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="results/gpu/traces", help="output directory")
    p.add_argument("--workloads", default="gr00t,moe", help="comma list: gr00t, moe")
    p.add_argument("--sources", default="torch,ms", help="comma list: torch, ms")
    p.add_argument("--gr00t-config", default="n16", help="n16 (default), small, tiny, n16-moe")
    p.add_argument("--gr00t-fallback", default="small",
                   help="config retried when the first one fails (empty: none)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--text-buckets", default="64,96,128,160",
                   help="padded text lengths (per-sample lengths vary below each)")
    p.add_argument("--moe-tokens", default="2176,4352,3264", help="tokens per MoE step (B x 17)")
    p.add_argument("--moe-skew", type=float, default=0.5,
                   help="scale of the per-step topic direction that skews routing")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="recorded steps per capture")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-entries", type=int, default=2_000_000)
    p.add_argument("--timeout", type=int, default=90, help="seconds per capture process")
    # child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", choices=["gr00t", "moe"], help=argparse.SUPPRESS)
    p.add_argument("--source", choices=["torch", "ms"], help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    if args.child:
        try:
            r = run_child(args)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - report and fail this capture only
            traceback.print_exc()
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
            return 1
        print(json.dumps(r))
        return 0

    try:
        import torch
    except ImportError:
        print("capture_traces: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"capture_traces: CUDA is required: torch {torch.__version__} sees no CUDA device "
              "(this script captures real GPU traces; run it on the GPU machine)", file=sys.stderr)
        return 2

    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # torch's default allocator for the torch recorder
    rows: List[Dict[str, Any]] = []
    t_all = time.perf_counter()
    for wl in [w for w in args.workloads.split(",") if w]:
        for src in [s for s in args.sources.split(",") if s]:
            configs = [args.gr00t_config]
            if wl == "gr00t" and args.gr00t_fallback and args.gr00t_fallback != args.gr00t_config:
                configs.append(args.gr00t_fallback)
            for cfg in (configs if wl == "gr00t" else [None]):
                name = (f"gr00t_{cfg}_b{args.batch}_varlen.{src}" if wl == "gr00t"
                        else f"moe_n16_layer_varexperts.{src}")
                cmd = [sys.executable, os.path.abspath(__file__), "--child", "--workload", wl,
                       "--source", src, "--name", name, "--out", args.out,
                       "--batch", str(args.batch), "--text-buckets", args.text_buckets,
                       "--moe-tokens", args.moe_tokens, "--moe-skew", str(args.moe_skew),
                       "--warmup", str(args.warmup), "--steps", str(args.steps),
                       "--seed", str(args.seed), "--max-entries", str(args.max_entries),
                       "--gr00t-config", cfg or args.gr00t_config]
                t0 = time.perf_counter()
                log = os.path.join(args.out, name + ".log")
                try:
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                         timeout=args.timeout)
                    rc, stdout, stderr = out.returncode, out.stdout, out.stderr
                except subprocess.TimeoutExpired as e:
                    rc = 124
                    stdout = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                    stderr = ((e.stderr or b"").decode() if isinstance(e.stderr, bytes)
                              else (e.stderr or "")) + f"\ntimed out after {args.timeout} s"
                with open(log, "w") as f:
                    f.write(f"$ {' '.join(cmd)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
                row: Dict[str, Any] = {"workload": wl, "source": src, "name": name, "rc": rc,
                                       "wall_s": round(time.perf_counter() - t0, 1), "log": log}
                last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
                try:
                    row.update(json.loads(last))
                except json.JSONDecodeError:
                    pass
                if rc != 0 and "error" not in row:
                    tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
                    row["error"] = f"rc {rc}: {tail}"
                rows.append(row)
                if rc == 0:
                    break  # the fallback config only when the first failed
    total = time.perf_counter() - t_all
    print(f"\n{'capture':44s} {'rc':>3s} {'steps':>5s} {'size':>9s} {'text':>9s} {'wall':>6s}  note")
    for r in rows:
        note = r.get("error", r.get("compression", ""))
        print(f"{r['name']:44s} {r['rc']:3d} {r.get('steps', 0):5d} "
              f"{r.get('bytes', 0) / 1e6:7.2f}MB {r.get('text_bytes', 0) / 1e6:7.2f}MB "
              f"{r['wall_s']:5.0f}s  {note[:90]}")
    print(f"total {total:.0f} s; traces and logs in {args.out}")
    with open(os.path.join(args.out, "capture_summary.json"), "w") as f:
        json.dump({"args": vars(args), "captures": rows, "total_s": total}, f, indent=1)
    # A workload counts as captured when at least one of its captures (any config) succeeded per
    # source; the gr00t fallback's failed first attempt is not a failure.
    failed = []
    for wl in {r["workload"] for r in rows}:
        for src in {r["source"] for r in rows if r["workload"] == wl}:
            if not any(r["rc"] == 0 for r in rows if r["workload"] == wl and r["source"] == src):
                failed.append(f"{wl}/{src}")
    if failed:
        print(f"capture_traces: failed: {', '.join(sorted(failed))} (see the .log files)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
