"""The workloads MemSculptor's GPU scripts share (capture_traces.py, gpu_bench.py): training steps
of the GR00T-shaped policy with variable-length text, and one MoE layer with a variable number of
tokens per expert. Each works under torch's allocator or MemSculptor (the caller wraps steps in
ms.step). Needs torch with CUDA; imports the model by path when loongforge._C is missing."""
from __future__ import annotations

import importlib.util
import os
import random
import sys
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDIR = os.path.join(REPO, "python")


def load_by_path(name: str, path: str):
    """Imports one file of the package without running loongforge/__init__ (which needs _C)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _gr00t_module():
    try:
        from loongforge.models import gr00t  # the normal way
        return gr00t
    except Exception:  # noqa: BLE001 - _C missing: the model file needs only torch
        models = load_by_path("_lf_models",
                              os.path.join(PYDIR, "loongforge", "models", "__init__.py"))
        return models.gr00t


# ------------------------------------------------------------------------------------------------
# Workloads


def _bucket_schedule(buckets: List[int], steps: int, rnd: random.Random) -> List[int]:
    """Every bucket at least twice (when steps allow), shuffled."""
    sched = [buckets[i % len(buckets)] for i in range(steps)]
    rnd.shuffle(sched)
    return sched


class Gr00tWork:
    def __init__(self, args, torch, dev):
        g = _gr00t_module()
        self.torch, self.dev, self.args = torch, dev, args
        self.cfg = g.get_config(getattr(args, "gr00t_config", None) or args.config)
        torch.manual_seed(0)
        self.model = g.Gr00tPolicy(self.cfg, device=dev).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        try:
            self.opt = torch.optim.AdamW(self.params, lr=1e-5, fused=True)
        except (TypeError, RuntimeError):
            self.opt = torch.optim.AdamW(self.params, lr=1e-5)
        self.rnd = random.Random(args.seed)
        self.gen = torch.Generator(device=dev)
        self.gen.manual_seed(args.seed)
        self.buckets = [int(b) for b in str(args.text_buckets).split(",")]
        self.meta: Dict[str, Any] = {
            "workload": "gr00t", "config": self.cfg.name, "batch": args.batch,
            "image_size": self.cfg.image_size, "cameras": 1, "action_horizon": 16,
            "text_buckets": self.buckets, "precision": "bf16 autocast, fp32 params, AdamW",
            "step": "forward + backward + optimizer step + zero_grad(set_to_none)"}

    def init_optimizer_state(self):
        """Optimizer state exists before recording (a zero-gradient step with lr 0 makes it), so
        every recorded step has the same structure."""
        t = self.torch
        lr = [g["lr"] for g in self.opt.param_groups]
        for g in self.opt.param_groups:
            g["lr"] = 0.0
        for p in self.params:
            p.grad = t.zeros_like(p)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for g, v in zip(self.opt.param_groups, lr):
            g["lr"] = v

    def schedule(self, n: int) -> List[int]:
        return _bucket_schedule(self.buckets, n, self.rnd)

    def signature(self, item: int, batch: Optional[int] = None) -> str:
        return f"L{item}xB{batch or self.args.batch}"

    def step(self, bucket: int, batch: Optional[int] = None) -> Dict[str, Any]:
        """One training step at padded text length ``bucket`` (batch defaults to args.batch)."""
        t, b, cfg = self.torch, batch or self.args.batch, self.cfg
        # The batch is made on the device (the same allocations a loader's host-to-device copy
        # makes, without spending the step on host-side random numbers).
        lo = max(1, bucket - 31)
        lens = [self.rnd.randint(lo, bucket) for _ in range(b)]
        lens[0] = bucket  # the longest sample sets the padded length
        dev = self.dev
        mask = t.arange(bucket, device=dev)[None, :] < t.tensor(lens, device=dev)[:, None]
        batch = {
            "images": t.randn(b, 1, 3, cfg.image_size, cfg.image_size, device=dev),
            "tokens": t.randint(0, cfg.vocab_size, (b, bucket), device=dev) * mask,
            "attention_mask": mask,
            "state": t.randn(b, 32, device=dev),
            "action": t.randn(b, 16, 32, device=dev),
            "action_mask": t.ones(b, 16, dtype=t.bool, device=dev),
        }
        with t.autocast(self.dev.type, dtype=t.bfloat16, enabled=self.dev.type == "cuda"):
            out = self.model(batch, generator=self.gen)
        out["loss"].backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        loss = float(out["loss"].detach())
        del batch, out
        return {"text_lengths": lens, "padded_len": bucket, "loss": loss}


class MoEWork:
    def __init__(self, args, torch, dev):
        g = _gr00t_module()
        self.torch, self.dev, self.args = torch, dev, args
        cfg = g.get_config("n16-moe")
        torch.manual_seed(0)
        self.layer = g.MoEFeedForward(cfg.dit_dim, cfg.dit_ff_mult, cfg.moe_experts,
                                      cfg.moe_top_k, device=dev).train()
        self.dim = cfg.dit_dim
        self.rnd = random.Random(args.seed + 1)
        self.tokens = [int(x) for x in args.moe_tokens.split(",")]
        self.meta = {"workload": "moe", "config": "n16-moe DiT FFN", "dim": cfg.dit_dim,
                     "hidden": cfg.dit_dim * cfg.dit_ff_mult, "experts": cfg.moe_experts,
                     "top_k": cfg.moe_top_k, "token_counts": self.tokens,
                     "precision": "bf16 autocast, fp32 params",
                     "step": "forward + backward (+ aux loss) + zero_grad(set_to_none)"}

    def init_optimizer_state(self):
        pass

    def schedule(self, n: int) -> List[int]:
        return _bucket_schedule(self.tokens, n, self.rnd)

    def signature(self, item: int) -> str:
        return f"T{item}"

    def step(self, tokens: int) -> Dict[str, Any]:
        t = self.torch
        topic = t.randn(self.dim) * self.args.moe_skew
        x = (t.randn(tokens, self.dim, device=self.dev) + topic.to(self.dev)).requires_grad_(True)
        with t.autocast(self.dev.type, dtype=t.bfloat16, enabled=self.dev.type == "cuda"):
            y = self.layer(x)
            loss = y.float().square().mean() + 0.01 * self.layer.last_aux_loss
        loss.backward()
        self.layer.zero_grad(set_to_none=True)
        counts = self.layer.last_expert_counts.tolist()
        del x, y, loss
        return {"tokens": tokens, "tokens_per_expert": counts}


def build_work(cls, args, torch, dev, ms=None):
    """Builds the workload `cls` and its optimizer state; with a MemSculptor `ms`, inside its
    persistent region, so that weights and optimizer state stay out of the planned step pool."""
    if ms is None:
        work = cls(args, torch, dev)
        work.init_optimizer_state()
        return work
    with ms.persistent():
        work = cls(args, torch, dev)
        work.init_optimizer_state()
    return work
