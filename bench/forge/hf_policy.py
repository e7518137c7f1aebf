"""A policy nobody here wrote, trained through loongforge.Forge against the same model under
torch.compile(mode="reduce-overhead") and plain eager PyTorch, in one process on one GPU.

The policy is assembled from Hugging Face `transformers` classes by config (no weights are
downloaded): a SigLIP vision tower (frozen), a Qwen3 text model (Llama where this transformers has
no Qwen3) fed the projected image tokens followed by the text tokens, and an MLP action head that
predicts an action chunk from the last hidden state. The text model is configured for training
(use_cache=False: no key/value cache is built). Batches are synthetic and already on the
device, so the figure is the step alone: forward, backward, gradient clipping and AdamW.

Every row starts from the same seed, keeps the frozen tower's weights in bf16 and runs under bf16
autocast with fused AdamW, so the rows differ only in how the step is run:
  eager    the plain loop;
  compile  torch.compile(model, mode="reduce-overhead") (PyTorch's CUDA graphs), the loop as a
           torch user writes it (cudagraph_mark_step_begin before each step);
  forge    Forge(precision="bf16").compile_step(loss_fn): one CUDA graph of forward + backward
           with the modules that hold the layer lists (the SigLIP encoder, the Qwen3 model)
           compiled whole inside it (compile_scope="owner", the attention mask included);
  forge-block  the same with compile_scope="block": each SigLIP and Qwen3 layer compiled alone;
  forge-model  the same with compile_scope="model": the whole policy compiled;
  forge-noblocks  the same with compile_blocks="off": the graph of eager kernels.
Dynamo's caches are reset before each row, so no row reuses another's compiled code.
Step times come from CUDA events around each step after the warm-up steps; the JSON written to
--out holds every row's p50/p95 and the ratios.

    python3 bench/forge/hf_policy.py --out /tmp/out/hf_policy.json [--batch 16] [--steps 60]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def text_model(hidden: int, layers: int, heads: int, vocab: int) -> nn.Module:
    try:
        from transformers import Qwen3Config, Qwen3Model

        cfg = Qwen3Config(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                          head_dim=hidden // heads, vocab_size=vocab, max_position_embeddings=4096, use_cache=False,
                          attn_implementation="sdpa")
        return Qwen3Model(cfg)
    except ImportError:
        from transformers import LlamaConfig, LlamaModel

        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                          vocab_size=vocab, max_position_embeddings=4096, use_cache=False,
                          attn_implementation="sdpa")
        return LlamaModel(cfg)


class HFPolicy(nn.Module):
    def __init__(self, image: int, text_hidden: int, text_layers: int, horizon: int,
                 action_dim: int, vocab: int) -> None:
        super().__init__()
        from transformers import SiglipVisionConfig, SiglipVisionModel

        vcfg = SiglipVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                  num_attention_heads=12, image_size=image, patch_size=16,
                                  attn_implementation="sdpa")
        self.vision = SiglipVisionModel(vcfg)
        self.vision.requires_grad_(False)  # a pretrained tower, frozen as VLA recipes keep it
        self.project = nn.Linear(768, text_hidden)
        self.text = text_model(text_hidden, text_layers, max(1, text_hidden // 64), vocab)
        self.head = nn.Sequential(nn.Linear(text_hidden, 1024), nn.GELU(),
                                  nn.Linear(1024, horizon * action_dim))
        self.horizon, self.action_dim = horizon, action_dim

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, action: torch.Tensor
                ) -> torch.Tensor:
        with torch.no_grad():
            vis = self.vision(pixel_values=images).last_hidden_state
        x = torch.cat([self.project(vis), self.text.get_input_embeddings()(tokens)], 1)
        h = self.text(inputs_embeds=x).last_hidden_state[:, -1]
        pred = self.head(h).view(-1, self.horizon, self.action_dim)
        return (pred.float() - action).pow(2).mean()


def frozen_to_bf16(model: nn.Module) -> None:
    """The frozen tower's linear and conv weights in bf16 (what Forge(precision='bf16') does)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            for p in m.parameters(recurse=False):
                if not p.requires_grad:
                    p.data = p.data.to(torch.bfloat16)


def batches(n: int, batch: int, image: int, text_len: int, horizon: int, action_dim: int,
            vocab: int, device: torch.device) -> List[Dict[str, torch.Tensor]]:
    g = torch.Generator(device="cpu").manual_seed(0)
    return [{"images": torch.randn(batch, 3, image, image, generator=g).to(device),
             "tokens": torch.randint(0, vocab, (batch, text_len), generator=g).to(device),
             "action": torch.randn(batch, horizon, action_dim, generator=g).to(device)}
            for _ in range(n)]


def loss_fn(model: nn.Module, b: Dict[str, torch.Tensor]) -> torch.Tensor:
    return model(b["images"], b["tokens"], b["action"])


def build(a: argparse.Namespace, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return HFPolicy(a.image, a.text_hidden, a.text_layers, a.horizon, a.action_dim, a.vocab)


def profiled(run_step: Callable[[Dict[str, torch.Tensor]], torch.Tensor],
             data: List[Dict[str, torch.Tensor]], steps: int, table: str,
             row: str) -> Dict[str, Any]:
    """Where a row's step time goes: `steps` more steps under torch.profiler (CUPTI), with the
    kernels' own time per step (graph replays included), their count, and the CPU time between
    the step's start and its last kernel's launch. The kernels sorted by time go to `table`."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            run_step(data[i % len(data)])
        t_cpu = time.perf_counter() - t0
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    # A record_function range (the optimizer's "Optimizer.step#AdamW.step") also appears on the
    # device timeline under its CPU name: only the device events that are not a CPU range count.
    events = prof.key_averages()
    cpu_keys = {e.key for e in events if e.device_type == DeviceType.CPU}
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.key not in cpu_keys]

    def own_us(e: Any) -> float:
        v = getattr(e, "self_device_time_total", None)
        return float(v if v is not None else e.self_cuda_time_total)

    kernels.sort(key=own_us, reverse=True)
    busy_us = sum(own_us(e) for e in kernels)
    with open(table, "a") as f:
        f.write(f"== {row}: {steps} steps; kernel time {busy_us / steps / 1e3:.3f} ms per step, "
                f"{sum(e.count for e in kernels) / steps:.0f} kernels per step\n")
        for e in kernels[:40]:
            f.write(f"{own_us(e) / steps / 1e3:9.3f} ms {e.count // steps:5d}x  {e.key[:150]}\n")
    return {"kernel_ms_per_step": busy_us / steps / 1e3,
            "kernels_per_step": sum(e.count for e in kernels) / steps,
            "host_ms_per_step": t_cpu / steps * 1e3, "wall_ms_per_step": wall / steps * 1e3}


def timed(run_step: Callable[[Dict[str, torch.Tensor]], torch.Tensor],
          data: List[Dict[str, torch.Tensor]], a: argparse.Namespace, row: str) -> Dict[str, Any]:
    steps, warmup = a.steps, a.warmup
    times: List[float] = []
    losses: List[float] = []
    t_warm = time.perf_counter()
    for i in range(steps):
        b = data[i % len(data)]
        if i == warmup:
            torch.cuda.synchronize()
            t_warm = time.perf_counter() - t_warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = run_step(b)
        end.record()
        if i >= warmup:
            times.append((start, end))  # type: ignore[arg-type]
        losses.append(loss)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in times]  # type: ignore[attr-defined]
    vals = [float(x) for x in losses]
    prof = {}
    if a.profile:
        os.makedirs(a.profile_dir, exist_ok=True)
        prof = {"profile": profiled(run_step, data, a.profile,
                                    os.path.join(a.profile_dir, "kernels.txt"), row)}
    return {**prof, "p50_ms": statistics.median(ms), "p95_ms": sorted(ms)[int(0.95 * (len(ms) - 1))],
            "warmup_s": t_warm, "first_loss": vals[0], "last_loss": vals[-1],
            "finite": all(math.isfinite(v) for v in vals),
            "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30}


def row_eager(a: argparse.Namespace, device: torch.device, data: List[Dict[str, torch.Tensor]],
              compiled: bool) -> Dict[str, Any]:
    model = build(a, device).to(device).train()
    frozen_to_bf16(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                            fused=True)
    params = [p for p in model.parameters() if p.requires_grad]
    fwd = torch.compile(model, mode="reduce-overhead") if compiled else model

    def step(b: Dict[str, torch.Tensor]) -> torch.Tensor:
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(b["images"], b["tokens"], b["action"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().clone()

    torch.cuda.reset_peak_memory_stats()
    return timed(step, data, a, "compile" if compiled else "eager")


def row_forge(a: argparse.Namespace, device: torch.device,
              data: List[Dict[str, torch.Tensor]], blocks: str, scope: str) -> Dict[str, Any]:
    import loongforge as lf

    model = build(a, device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                            fused=True)
    torch.cuda.reset_peak_memory_stats()
    with lf.Forge(device="cuda", precision="bf16") as forge:
        model, opt = forge.setup(model, opt)
        step = forge.compile_step(loss_fn, clip=1.0, warmup=3, compile_blocks=blocks,
                                  compile_scope=scope)
        out = timed(step, data, a, f"forge-{scope}" if blocks != "off" else "forge-noblocks")
        rep = forge.report()
        out["cuda_graphs"] = rep.get("cuda_graphs")
        out["compiled_blocks"] = rep.get("compiled_blocks")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--text-len", type=int, default=64)
    p.add_argument("--text-hidden", type=int, default=1024)
    p.add_argument("--text-layers", type=int, default=12)
    p.add_argument("--horizon", type=int, default=16)
    p.add_argument("--action-dim", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--profile", type=int, default=0,
                   help="steps profiled after the timed ones (0: none); each row's kernels "
                   "appended to --profile-dir/kernels.txt")
    p.add_argument("--profile-dir", default="hf_policy_profile")
    p.add_argument("--modes",
                   default="eager,compile,forge,forge-block,forge-model,forge-noblocks")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("hf_policy: needs a CUDA device", file=sys.stderr)
        return 2
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("hf_policy: needs the 'transformers' package", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    data = batches(4, a.batch, a.image, a.text_len, a.horizon, a.action_dim, a.vocab, device)
    rows: Dict[str, Any] = {}
    forge_rows = {"forge": ("auto", "owner"), "forge-block": ("auto", "block"),
                  "forge-model": ("auto", "model"), "forge-noblocks": ("off", "block")}
    for mode in a.modes.split(","):
        t0 = time.perf_counter()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()
        if mode in forge_rows:
            rows[mode] = row_forge(a, device, data, *forge_rows[mode])
        elif mode in ("eager", "compile"):
            rows[mode] = row_eager(a, device, data, compiled=mode == "compile")
        else:
            print(f"hf_policy: unknown mode {mode!r} (eager, compile, "
                  f"{', '.join(forge_rows)})", file=sys.stderr)
            return 2
        rows[mode]["row_s"] = time.perf_counter() - t0
        r = rows[mode]
        print(f"{mode:14s} p50 {r['p50_ms']:.1f} ms  p95 {r['p95_ms']:.1f} ms  warm-up "
              f"{r['warmup_s']:.1f} s  loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}  "
              f"peak {r['peak_alloc_gib']:.1f} GiB", flush=True)
        if "profile" in r:
            q = r["profile"]
            print(f"{'':14s} profiled: kernels {q['kernel_ms_per_step']:.2f} ms/step "
                  f"({q['kernels_per_step']:.0f} kernels), host {q['host_ms_per_step']:.2f} ms/step,"
                  f" wall {q['wall_ms_per_step']:.2f} ms/step", flush=True)
        torch.cuda.empty_cache()
    for mode in forge_rows:
        if mode in rows and "compile" in rows:
            key = mode.replace("-", "_") + "_vs_compile"
            rows[key] = rows["compile"]["p50_ms"] / rows[mode]["p50_ms"]
            print(f"{mode} vs torch.compile(reduce-overhead): {rows[key]:.2f}x")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
