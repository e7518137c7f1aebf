"""NexusSync on one GPU (run on the GPU machine; see docs/bench_comm.md).

1. CUDA top-k with error feedback (loongforge) vs torch.topk and torch's error-feedback sequence,
   1e6..1e8 fp32 elements, ratio 1%, CUDA-event timing, median of repeats; the CUDA kernel's
   output is checked against the CPU kernel on the 1e6 case (indices and values equal).
2. Single-GPU NexusSync overhead: world size 1 NCCL group, a transformer-ish model, step time of
   NexusSync (collectives really issued: skip_single_rank=False) vs DDP with the same bucket cap.

Usage: PYTHONPATH=python python3 bench/comm/gpu_bench.py [--out results/bench_comm_gpu.json]
"""
import argparse
import copy
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loongforge import comm  # noqa: E402
from bench_comm import Model, topk_variants  # noqa: E402


def cuda_time(fn, repeats=10):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def kernels(sizes, ratio):
    rows = []
    for n in sizes:
        k = max(1, int(n * ratio))
        g = torch.randn(n, device="cuda")
        res = torch.randn(n, device="cuda") * 0.1
        if n == sizes[0]:  # correctness against the CPU kernel
            rc = res.cpu()
            vc, ic = comm.topk_error_feedback(g.cpu(), rc, k)
            rg = res.clone()
            vg, ig = comm.topk_error_feedback(g, rg, k)
            torch.cuda.synchronize()
            assert torch.equal(ic, ig.cpu()) and torch.equal(vc, vg.cpu()), "CUDA != CPU top-k"
            assert torch.equal(rc, rg.cpu()), "CUDA != CPU residual"
        vals = torch.empty(k, device="cuda")
        idx = torch.empty(k, dtype=torch.int32, device="cuda")

        row = {"n": n, "k": k}
        for name, fn in topk_variants(g, res, k, vals, idx):
            ms = cuda_time(fn)
            row[name + "_ms"] = ms
            row[name + "_GBps"] = n * 4 / (ms / 1e3) / 1e9
        rows.append(row)
        print(f"n={n:>10} k={k:>8}  loongforge {row['loongforge_ms']:8.3f} ms "
              f"({row['loongforge_GBps']:7.1f} GB/s)  torch.topk {row['torch.topk_ms']:8.3f} ms  "
              f"torch EF {row['torch_ef_ms']:8.3f} ms")
    return rows


def overhead(steps, bucket_mb):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    base = Model(d=1024, layers=8).cuda()
    x = torch.randn(8, 256, 32, device="cuda")
    out = {}

    def run(model, before, after):
        ts = []
        for s in range(steps + 5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            before()
            model(x).square().mean().backward()
            after()
            torch.cuda.synchronize()
            if s >= 5:
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=bucket_mb)
    out["ddp_ms"] = run(ddp, lambda: ddp.zero_grad(set_to_none=False), lambda: None)
    m = copy.deepcopy(base)
    sync = comm.NexusSync(m, bucket_cap_mb=bucket_mb, first_bucket_mb=1, skip_single_rank=False)
    out["nexus_ms"] = run(m, sync.zero_grad, sync.finish)
    out["nexus_over_ddp"] = out["nexus_ms"] / out["ddp_ms"]
    out["stats"] = sync.stats()
    print(f"world 1 NCCL: DDP {out['ddp_ms']:.2f} ms/step, NexusSync {out['nexus_ms']:.2f} ms/step "
          f"(ratio {out['nexus_over_ddp']:.3f}, {out['stats']['buckets']} buckets, hook "
          f"{out['stats']['hook']})")
    dist.destroy_process_group()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**6, 10**7, 10**8])
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--out", default="results/bench_comm_gpu.json")
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M"),
              "kernels": kernels(args.sizes, args.ratio),
              "overhead": overhead(args.steps, args.bucket_mb)}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
