"""Prints one table from bench/multigpu.sh's results folder (harness JSON + trainer JSON).

    python3 bench/multigpu/summarize.py results/multigpu

Harness files (sweep/train/kill/suite, written by harness.py) give the sweep at 256 MB and
above against the issue's 95% target, NexusSync vs DDP and the kill test. Trainer files
(trainer_<cfg>_w<W>_{nexus,ddp}.json, e2e_n16_<mode>_w<W>.json, written by `python -m
loongforge.train --json-out`) give step time, exposed communication share and tokens/GPU/s;
scaling efficiency = tokens/GPU/s at W GPUs / tokens/GPU/s at 1 GPU, per mode.
"""
import glob
import json
import os
import sys


def harness(paths):
    for p in paths:
        with open(p) as f:
            rep = json.load(f)
        if "runs" not in rep:
            continue
        for run in rep["runs"]:
            w, be = run["world"], run["backend"]
            if "sweep" in run:
                big = [r for r in run["sweep"] if r["mb"] >= 256] or run["sweep"][-1:]
                worst = min(r["nexus_vs_torch"] for r in big)
                sizes = ">= 256 MB" if big and big[0]["mb"] >= 256 else f"{big[0]['mb']:g} MB"
                top = run["sweep"][-1]
                print(f"sweep    w{w} {be}: at {top['mb']:g} MB torch {top['torch_busbw_GBps']:.2f} "
                      f"GB/s, nexus {top['nexus_busbw_GBps']:.2f} GB/s; worst nexus/torch at "
                      f"{sizes}: {worst:.2f} (target >= 0.95); correct "
                      f"{all(r['nexus_correct'] for r in run['sweep'])}")
            if "train" in run:
                t = run["train"]
                parts = []
                for m in ("ddp", "nexus", "nexus_topk", "nexus_ddp_layout"):
                    x = t[m]
                    ov = x["overlap_ratio"]
                    parts.append(f"{m} {x['step_ms']:.1f} ms exp {x['exposed_share']:.0%} "
                                 f"ov {ov if ov is None else round(ov, 2)}")
                low = (t["nexus"]["bytes_sent_per_step"]["expert_low"],
                       t["nexus_topk"]["bytes_sent_per_step"]["expert_low"])
                print(f"train    w{w} {be} {rep['args'].get('model', 'bench')}: local {t['local']['step_ms']:.1f} ms | "
                      + " | ".join(parts) + f" | expert_low B/step {low[0]} -> {low[1]}")
            if "kill" in run:
                k = run["kill"]
                ts = [s["seconds_after_kill"] for s in k["survivors"]]
                ts = [x for x in ts if x is not None]
                print(f"kill     w{w} {be}: {'PASS' if k['pass'] else 'FAIL'}; survivors out "
                      f"{min(ts) if ts else float('nan'):.2f}-{max(ts) if ts else float('nan'):.2f}"
                      f" s after the kill (timeout {k['timeout_s']:g} s); NexusSync-named errors: "
                      f"{k['all_clear_nexussync_errors']}")


def trainer(out):
    rows = {}
    for p in sorted(glob.glob(os.path.join(out, "trainer_*.json")) +
                    glob.glob(os.path.join(out, "e2e_*.json"))):
        with open(p) as f:
            s = json.load(f)
        fig = s["figures"]
        name = os.path.basename(p)[:-5]
        rows[name] = s
        print(f"{name:<34} {s['mode']:<10} w{s['world_size']} step p50 {fig['step_ms_p50']:.0f} ms "
              f"tokens/GPU/s {fig['tokens_per_gpu_per_s']:.0f} exposed comm "
              f"{fig['comm_exposed_share']:.1%} data wait {fig['data_wait_share']:.1%}")
        ns = s.get("nexussync_stats") or {}
        if ns.get("steps"):
            per = {g: v // ns["steps"] for g, v in ns["bytes_sent"].items()}
            print(f"{'':<34} NexusSync: {ns['buckets']} buckets, overlap {ns['overlap_ratio']}, "
                  f"bytes/step {per}")
    e2e = {}
    for name, s in rows.items():
        if name.startswith("e2e_"):
            e2e.setdefault(s["mode"], {})[s["world_size"]] = s["figures"]["tokens_per_gpu_per_s"]
    for mode, by_w in e2e.items():
        if 1 in by_w and len(by_w) > 1:
            w = max(by_w)
            print(f"scaling  {mode}: {by_w[w] / by_w[1]:.1%} (tokens/GPU/s at {w} vs 1 GPU; "
                  "target >= 90% for loongforge)")
    if "baseline" in e2e and "loongforge" in e2e:
        w = max(set(e2e["baseline"]) & set(e2e["loongforge"]))
        print(f"speedup  loongforge / baseline tokens/GPU/s at {w} GPUs: "
              f"{e2e['loongforge'][w] / e2e['baseline'][w]:.2f}x (target >= 2.3x)")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "results/multigpu"
    print("== multigpu summary ==")
    harness(sorted(p for p in glob.glob(os.path.join(out, "*.json"))
                   if not os.path.basename(p).startswith(("trainer_", "e2e_"))))
    trainer(out)


if __name__ == "__main__":
    main()
