#!/usr/bin/env python3
"""Grouped expert GEMM against one dense GEMM of the same FLOPs (issue 18 target: at least 50%).

For n16-moe's expert FFN (16 experts of inner width 1536 on the DiT's width, top-2), per token
count: rows = tokens x top_k routed to the experts with a skewed load (expert e gets a share
proportional to 1 / (e + 1), the ~10x spread measured in n16-moe runs), sorted by expert. Times,
with CUDA events over --iters after --warmup, forward and forward+backward of
  grouped: loongforge.moe.grouped_mm for the up projection [rows, d] x [E, h, d] and the down
           projection [rows, h] x [E, d, h] (its backend printed: torch's grouped GEMM on sm90
           bf16, else the padded-bmm fallback);
  dense:   F.linear with one [h, d] and one [d, h] weight on the same rows: the same FLOPs as one
           GEMM each.
Prints one JSON object: per token count, the two rates in TFLOP/s and their ratio.

  PYTHONPATH=python python3 bench/moe/grouped_gemm.py [--tokens 2176,4352] [--dtype bf16]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from loongforge.models import get_config
from loongforge.moe import grouped_mm, grouped_mm_backend


def skewed_counts(rows: int, experts: int) -> torch.Tensor:
    share = torch.tensor([1.0 / (e + 1) for e in range(experts)])
    counts = torch.floor(share / share.sum() * rows).long()
    counts[0] += rows - int(counts.sum())
    return counts


def timed(fn, warmup: int, iters: int) -> float:
    """Mean seconds per call on the current stream."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="n16-moe")
    ap.add_argument("--tokens", default="544,2176,4352,8704", help="tokens per MoE layer call")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("grouped_gemm.py needs a CUDA device", file=sys.stderr)
        return 2
    cfg = get_config(a.config)
    d, h, experts, k = cfg.dit_dim, cfg.moe_expert_hidden, cfg.moe_experts, cfg.moe_top_k
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w_up = (torch.randn(experts, h, d, device=dev, generator=g) * d ** -0.5).to(dt)
    w_down = (torch.randn(experts, d, h, device=dev, generator=g) * h ** -0.5).to(dt)
    dense_up, dense_down = w_up[0].clone(), w_down[0].clone()
    for p in (w_up, w_down, dense_up, dense_down):
        p.requires_grad_(True)
    out = {"config": a.config, "dim": d, "expert_hidden": h, "experts": experts, "top_k": k,
           "dtype": a.dtype, "backend": grouped_mm_backend(torch.empty(1, d, device=dev, dtype=dt),
                                                           w_up),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for tokens in (int(t) for t in a.tokens.split(",")):
        rows = tokens * k
        counts = skewed_counts(rows, experts).to(dev)
        x = torch.randn(rows, d, device=dev, generator=g).to(dt).requires_grad_(True)
        flops = 2 * 2 * rows * d * h  # up and down projections

        def grouped():
            return grouped_mm(F.gelu(grouped_mm(x, w_up, counts)), w_down, counts)

        def dense():
            return F.linear(F.gelu(F.linear(x, dense_up)), dense_down)

        row = {"tokens": tokens, "rows": rows, "max_expert_rows": int(counts.max())}
        for name, fn in (("grouped", grouped), ("dense", dense)):
            with torch.no_grad():
                s = timed(fn, a.warmup, a.iters)
            row[f"{name}_fwd_tflops"] = flops / s / 1e12
            s = timed(lambda: fn().sum().backward(), a.warmup, a.iters)
            row[f"{name}_fwdbwd_tflops"] = 3 * flops / s / 1e12
        row["fwd_ratio"] = row["grouped_fwd_tflops"] / row["dense_fwd_tflops"]
        row["fwdbwd_ratio"] = row["grouped_fwdbwd_tflops"] / row["dense_fwdbwd_tflops"]
        out["rows"].append(row)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
