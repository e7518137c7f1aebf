"""The optimizer and its schedule: AdamW (fused on CUDA), its state made up front, the cosine
schedule with warm-up, and the step that clips and skips non-finite steps (Note [Non-finite
steps]). ``optimizer_step`` and ``grad_norm`` serve ``loongforge.Forge`` as well."""
from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch

from .errors import TrainError

if TYPE_CHECKING:
    from ..comm import SyncBackend


def grad_norm(params: List[torch.nn.Parameter]) -> torch.Tensor:
    """The global L2 norm of the gradients (what clip_grad_norm_ returns), without touching
    them: --clip 0 still needs it to tell a finite step from a non-finite one."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    foreach = getattr(torch, "_foreach_norm", None)
    norms = foreach(grads) if foreach is not None else [torch.linalg.vector_norm(g) for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def optimizer_step(opt: torch.optim.Optimizer, params: List[torch.nn.Parameter], clip: float,
                   acc: torch.Tensor, sync: Optional["SyncBackend"] = None) -> None:
    """Clip (grad norm into acc[4]) and step, unless the step's loss (acc[0]) or gradient norm
    is not finite: then no parameter or optimizer state changes, and acc[5] is 1.

    Note [Non-finite steps]. One step of NaN or inf (an overflow, a bad batch, a far too large
    --lr) must not turn every parameter into NaN and then into the next checkpoint. The norm is
    computed also with --clip 0 (one pass over the gradients). A fused AdamW skips such a step
    on the device, without a host sync (the mechanism torch's GradScaler uses: ``found_inf``,
    a 0-dim tensor it also subtracts from its step counters); other optimizers are skipped on
    the host, which reads the flag (one sync: those runs synchronize every step anyway). The
    trainer counts the skipped steps and stops after --max-nonfinite-steps in a row. Loss and
    norm are the same on every rank (averaged, and computed from reduced gradients), so every
    rank skips the same steps."""
    fused = bool(opt.defaults.get("fused"))
    if sync is not None and sync.ep is not None:  # experts split across ranks: global norm
        from ..moe import clip_grad_norm_

        gn = clip_grad_norm_(sync.ep, params, sync.expert_params, clip or float("inf"))
    elif clip:
        gn = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        gn = grad_norm(params)
    gn = gn.to(acc.device)
    acc[4] = gn
    bad = (~(torch.isfinite(gn) & torch.isfinite(acc[0]))).to(torch.float32)
    acc[5] = bad
    if fused:
        opt.found_inf = bad  # type: ignore[attr-defined]  # read by the fused kernel
        opt.step()
    elif not bool(bad):
        opt.step()


def make_optimizer(params: List[torch.nn.Parameter], args: argparse.Namespace,
                   device: torch.device) -> torch.optim.Optimizer:
    kw: Dict[str, Any] = dict(lr=args.lr, betas=(0.95, 0.999), eps=1e-8,
                              weight_decay=args.weight_decay)
    choice = getattr(args, "adamw", "auto")
    if choice == "fused" and device.type != "cuda":
        raise TrainError("--adamw fused needs a CUDA device")
    if device.type == "cuda" and choice in ("auto", "fused"):
        try:
            return torch.optim.AdamW(params, fused=True, **kw)
        except (TypeError, RuntimeError) as e:
            if choice == "fused":
                raise TrainError(f"--adamw fused: torch {torch.__version__} refused: {e}") from e
    if choice == "foreach":
        kw["foreach"] = True
    return torch.optim.AdamW(params, **kw)


def lr_lambda(total: int, warmup: float, min_ratio: float) -> Callable[[int], float]:
    w = int(warmup * total) if warmup < 1 else int(warmup)

    def f(step: int) -> float:
        if w and step < w:
            return (step + 1) / w
        prog = min(1.0, (step - w) / max(1, total - w))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    return f
