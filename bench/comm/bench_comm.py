"""NexusSync benchmark on the CPU with Gloo (docs/bench_comm.md).

1. Top-k kernel throughput: loongforge C++ top-k with error feedback vs torch (torch.topk alone,
   and torch's full error-feedback sequence), GB/s of fp32 gradient processed.
2. A small transformer-ish model with a MoE layer, W Gloo processes: step time (forward +
   backward + sync) for NexusSync vs torch DDP with the same bucket cap, exposed communication,
   overlap ratio, and bytes sent with top-k off/on for the low-load expert group.

Usage: PYTHONPATH=python python3 bench/comm/bench_comm.py --world 2 4 --steps 12
Prints a table and writes JSON (default results/bench_comm.json).
"""
import argparse
import copy
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from loongforge import comm


def topk_variants(g, res, k, vals, idx):
    """The three compared top-k sequences as (name, fn): ours (error feedback fused), torch.topk
    alone, and torch's error-feedback sequence. Shared by the CPU and the GPU bench."""

    def ours():
        comm.topk_error_feedback(g, res, k, values=vals, indices=idx)

    def torch_topk():
        torch.topk(res.abs(), k, sorted=False)

    def torch_ef():
        res.add_(g)
        i = torch.topk(res.abs(), k, sorted=False).indices
        v = res[i]
        res[i] = 0
        return v

    return (("loongforge", ours), ("torch.topk", torch_topk), ("torch_ef", torch_ef))


def bench_kernels(sizes, ratio, repeats=5):
    rows = []
    torch.set_num_threads(os.cpu_count() or 1)
    for n in sizes:
        k = max(1, int(n * ratio))
        g = torch.randn(n)
        res = torch.randn(n) * 0.1
        vals = torch.empty(k)
        idx = torch.empty(k, dtype=torch.int32)

        row = {"n": n, "k": k}
        for name, fn in topk_variants(g, res, k, vals, idx):
            fn()
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            t = statistics.median(ts)
            row[name + "_ms"] = t * 1e3
            row[name + "_GBps"] = n * 4 / t / 1e9
        rows.append(row)
    return rows


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5, -1) @ v
        x = x + self.proj(a)
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, d=256, layers=4, experts=4):
        super().__init__()
        self.emb = nn.Linear(32, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(),
                                                    nn.Linear(2 * d, d)) for _ in range(experts)])
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        h = h + sum(e(h) for e in self.experts) / len(self.experts)
        return self.head(h)


def _worker(rank, world, port, args, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    base = Model()
    torch.manual_seed(1 + rank)
    xs = [torch.randn(args.batch, args.seq, 32) for _ in range(4)]
    results = {}

    def run(name, model, before, after):
        times, extra = [], []
        for s in range(args.warmup + args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            before()
            model(xs[s % 4]).square().mean().backward()
            e = after()
            t = time.perf_counter() - t0
            if s >= args.warmup:
                times.append(t)
                extra.append(e)
        results[name] = {"step_ms": statistics.median(times) * 1e3, "extra": extra}

    # Local compute only (no communication): the floor for step time.
    local = copy.deepcopy(base)
    run("local", local, lambda: local.zero_grad(), lambda: None)
    # DDP with the same bucket cap.
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=args.bucket_mb)
    run("ddp", ddp, lambda: ddp.zero_grad(), lambda: None)
    # NexusSync dense, then with top-k on the low-load experts (2 of 4 experts low-load).
    for name, ratio in (("nexus", None), ("nexus_topk", args.topk_ratio)):
        m = copy.deepcopy(base)
        sync = comm.NexusSync(m, bucket_cap_mb=args.bucket_mb, first_bucket_mb=args.first_mb,
                              expert_param_filter=r"^experts\.", expert_load=[100, 100, 5, 5],
                              topk_ratio=ratio)

        def after(sync=sync):
            sync.finish()
            ls = sync.stats()["last_step"]
            return (ls["exposed_wait_s"], ls["comm_busy_s"])

        run(name, m, sync.zero_grad, after)
        st = sync.stats()
        r = results[name]
        r["buckets"] = st["buckets"]
        r["exposed_ms"] = statistics.median(e[0] for e in r["extra"]) * 1e3
        r["comm_busy_ms"] = statistics.median(e[1] for e in r["extra"]) * 1e3
        steps = st["steps"]
        r["bytes_sent_per_step"] = {g: v // steps for g, v in st["bytes_sent"].items()}
        r["bytes_dense_per_step"] = {g: v // steps for g, v in st["bytes_dense_equivalent"].items()}
        r["overlap_ratio"] = 1 - r["exposed_ms"] / r["comm_busy_ms"] if r["comm_busy_ms"] else None
        sync.close()
    for r in results.values():
        r.pop("extra")
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def _ws1_worker(rank, port, args, out_path):
    """World size 1 Gloo: DDP vs NexusSync (collectives issued, and the default skip mode).

    The modes run interleaved step by step (rotating which goes first) so load drift on the
    shared machine hits each mode alike; step = zero_grad + forward + backward + sync.
    """
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    base = Model()
    xs = [torch.randn(args.batch, args.seq, 32) for _ in range(4)]
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=args.bucket_mb)
    issue_m, skip_m = copy.deepcopy(base), copy.deepcopy(base)
    # first_bucket_mb = DDP's first bucket (torch's _DEFAULT_FIRST_BUCKET_BYTES, 1 MiB), so the
    # two layouts are the same rule with the same caps.
    first_mb = dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20
    issue = comm.NexusSync(issue_m, bucket_cap_mb=args.bucket_mb, first_bucket_mb=first_mb,
                           skip_single_rank=False)
    skip = comm.NexusSync(skip_m, bucket_cap_mb=args.bucket_mb, first_bucket_mb=first_mb)
    modes = {
        "ddp": (ddp, ddp.zero_grad, lambda: None),
        "nexus_issued": (issue_m, issue.zero_grad, issue.finish),
        "nexus_skip": (skip_m, skip.zero_grad, skip.finish),
    }
    names = list(modes)
    times = {n: [] for n in names}
    for s in range(args.warmup + args.steps):
        order = names[s % 3:] + names[:s % 3]
        for n in order:
            model, before, after = modes[n]
            t0 = time.perf_counter()
            before()
            model(xs[s % 4]).square().mean().backward()
            after()
            t = time.perf_counter() - t0
            if s >= args.warmup:
                times[n].append(t)
    res = {"load_avg": os.getloadavg(), "steps": args.steps,
           "nexus_buckets": issue.stats()["buckets"],
           "nexus_collectives_issued": issue.stats()["collectives"],
           "nexus_collectives_skip": skip.stats()["collectives"]}
    for n in names:
        ts = sorted(times[n])
        res[n] = {"median_ms": statistics.median(ts) * 1e3,
                  "q1_ms": ts[len(ts) // 4] * 1e3, "q3_ms": ts[3 * len(ts) // 4] * 1e3}
    # Paired per-round ratio (same round = same load): median of nexus_t / ddp_t.
    for n in ("nexus_issued", "nexus_skip"):
        res[n]["paired_ratio_vs_ddp"] = statistics.median(
            a / b for a, b in zip(times[n], times["ddp"]))
    issue.close()
    skip.close()
    with open(out_path, "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def bench_ws1(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.spawn(_ws1_worker, args=(port, args, out), nprocs=1, join=True)
        with open(out) as f:
            return json.load(f)


def bench_world(world, args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.spawn(_worker, args=(world, port, args, out), nprocs=world, join=True)
        with open(out) as f:
            per_rank = json.load(f)
    # Report rank medians of each figure (ranks are symmetric).
    merged = {}
    for name in per_rank[0]:
        r0 = dict(per_rank[0][name])
        for key in ("step_ms", "exposed_ms", "comm_busy_ms"):
            if key in r0:
                r0[key] = statistics.median(pr[name][key] for pr in per_rank)
        merged[name] = r0
    return merged


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--bucket-mb", type=float, default=0.5)
    ap.add_argument("--first-mb", type=float, default=0.125)
    ap.add_argument("--topk-ratio", type=float, default=0.01)
    ap.add_argument("--kernel-sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--out", default="results/bench_comm.json")
    ap.add_argument("--ws1", action="store_true",
                    help="only the world-size-1 step time: DDP vs NexusSync (issued / skip)")
    args = ap.parse_args()

    if args.ws1:
        r = bench_ws1(args)
        print(f"world size 1 (Gloo), {r['steps']} steps per mode, interleaved; "
              f"NexusSync {r['nexus_buckets']} buckets; load avg {r['load_avg']}")
        print(f"{'mode':<14} {'median ms':>10} {'q1':>8} {'q3':>8} {'median/ddp':>11} "
              f"{'paired ratio':>13}")
        for n in ("ddp", "nexus_issued", "nexus_skip"):
            x = r[n]
            rel = x["median_ms"] / r["ddp"]["median_ms"]
            pr = x.get("paired_ratio_vs_ddp")
            print(f"{n:<14} {x['median_ms']:>10.1f} {x['q1_ms']:>8.1f} {x['q3_ms']:>8.1f} "
                  f"{rel:>11.4f} {'' if pr is None else f'{pr:.4f}':>13}")
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"ws1": r, "args": vars(args), "torch": torch.__version__}, f, indent=1)
        print(f"wrote {args.out}")
        return 0

    report = {"machine": f"{os.cpu_count()} CPU cores", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args)}
    report["kernels"] = bench_kernels(args.kernel_sizes, args.topk_ratio)
    print(f"top-k with error feedback, ratio {args.topk_ratio} (fp32 GB/s of gradient)")
    print(f"{'n':>10} {'loongforge':>12} {'torch.topk':>12} {'torch EF':>12}")
    for r in report["kernels"]:
        print(f"{r['n']:>10} {r['loongforge_GBps']:>9.2f} GB/s {r['torch.topk_GBps']:>7.2f} GB/s "
              f"{r['torch_ef_GBps']:>7.2f} GB/s")
    report["distributed"] = {}
    for w in args.world:
        res = bench_world(w, args)
        report["distributed"][str(w)] = res
        print(f"\nworld {w} (Gloo), {res['nexus']['buckets']} buckets, bucket cap {args.bucket_mb} MB")
        print(f"{'mode':<12} {'step ms':>8} {'exposed ms':>11} {'comm ms':>8} {'overlap':>8} "
              f"{'bytes/step':>12}")
        for name in ("local", "ddp", "nexus", "nexus_topk"):
            r = res[name]
            if name == "ddp":
                exp = max(0.0, r["step_ms"] - res["local"]["step_ms"])
                print(f"{name:<12} {r['step_ms']:>8.1f} {exp:>9.1f}* {'':>8} {'':>8}")
                continue
            if name == "local":
                print(f"{name:<12} {r['step_ms']:>8.1f}")
                continue
            sent = sum(r["bytes_sent_per_step"].values())
            print(f"{name:<12} {r['step_ms']:>8.1f} {r['exposed_ms']:>11.1f} "
                  f"{r['comm_busy_ms']:>8.1f} {r['overlap_ratio'] or 0:>8.2f} {sent:>12}")
        low = res["nexus_topk"]
        print(f"expert_low bytes/step: top-k off {res['nexus']['bytes_sent_per_step']['expert_low']}"
              f", on {low['bytes_sent_per_step']['expert_low']}")
        print("* DDP exposed = DDP step - local step (DDP does not expose its wait)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
