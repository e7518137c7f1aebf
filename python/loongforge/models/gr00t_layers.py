"""What every part of the GR00T-shaped policy shares: the device argument type, the profile ranges
around each part's forward, softmax attention (SDPA where torch has it) and activation
checkpointing. Nothing here holds parameters."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

Device = Optional[Union[str, torch.device]]

# Profile ranges (the trainer's --profile-modules): None in normal runs, where _part() hands back
# one shared no-op context (no record_function, nothing allocated); the trainer sets a factory
# of named ranges for the profiled steps only.
_PART_RANGES: Optional[Callable[[str], Any]] = None
_NO_RANGE = contextlib.nullcontext()


def set_profile_ranges(factory: Optional[Callable[[str], Any]]) -> None:
    """factory(part) -> a context manager around each model part's forward: "vision" (SigLIP
    tower), "projector" (pixel shuffle + mlp1, vlln + action-head projector), "llm" (token
    embeddings + decoder layers) and "dit" (VL self-attention, state/action encoders, DiT,
    action decoder). None switches the ranges off."""
    global _PART_RANGES
    _PART_RANGES = factory


def _part(name: str) -> Any:
    return _NO_RANGE if _PART_RANGES is None else _PART_RANGES(name)


# ------------------------------------------------------------------------------------------------
# Attention

HAS_SDPA: bool = hasattr(F, "scaled_dot_product_attention")
_force_manual_attention = False


def set_manual_attention(flag: bool) -> None:
    """Force the manual attention path (tests compare it with SDPA where both exist)."""
    global _force_manual_attention
    _force_manual_attention = flag


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: Optional[torch.Tensor] = None, causal: bool = False) -> torch.Tensor:
    """Softmax attention. q [B, H, Lq, D], k/v [B, H, Lk, D]; mask bool, broadcastable to
    [B, H, Lq, Lk], True = attend. Every query row must keep at least one key."""
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        tri = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        mask = tri if mask is None else (mask & tri)
    if HAS_SDPA and not _force_manual_attention:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


# ------------------------------------------------------------------------------------------------
# One autocast cast for sibling layers

_share_casts = False  # the trainer switches it on with --frozen-bf16 (loongforge mode on CUDA)


def set_shared_casts(flag: bool) -> None:
    """Switch shared_autocast_input on or off (process-wide; the trainer sets it per run)."""
    global _share_casts
    _share_casts = flag


def _compiling() -> bool:
    """True while torch.compile traces (constant-folded into the compiled graph)."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling")
                and compiler.is_compiling())


def _autocast_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype autocast gives matmuls on x's device, None when autocast is off there."""
    if x.is_cuda:
        if not torch.is_autocast_enabled():
            return None
        get = getattr(torch, "get_autocast_dtype", None)  # torch >= 2.4; older: the gpu getter
        return get("cuda") if get is not None else torch.get_autocast_gpu_dtype()
    if x.device.type == "cpu" and torch.is_autocast_cpu_enabled():
        return torch.get_autocast_cpu_dtype()
    return None


def shared_autocast_input(x: torch.Tensor, *consumers: nn.Module) -> torch.Tensor:
    """x cast once to autocast's dtype for sibling ``nn.Linear`` layers that read it (q, k and v;
    gate and up). Under autocast each of them would cast the fp32 input itself, the same
    rounding every time, so one cast gives the same bits and saves the others (measured on an H200:
    copies and casts were 17% of n16's kernel time). Only where that holds exactly: x does not
    require grad (the frozen layers: no backward through the cast, whose gradient sums would round
    otherwise), x is fp32, autocast is on, and every consumer is a plain ``nn.Linear`` (an
    Fp8Linear quantizes the fp32 input itself). Otherwise x as it is."""
    if not _share_casts or x.requires_grad or x.dtype != torch.float32 or _compiling():
        return x  # compiled blocks: inductor merges the consumers' casts itself
    dt = _autocast_dtype(x)
    if dt is None or dt == torch.float32 or any(type(m) is not nn.Linear for m in consumers):
        return x
    return x.to(dt)


# ------------------------------------------------------------------------------------------------
# Recomputed norms

# Note [Recomputed norms]. An RMSNorm written as torch ops (x * rsqrt(mean(x^2) + eps), then
# times its weight) leaves autograd holding its fp32 normalized output for the weight's gradient,
# and for q_norm / k_norm an fp32 copy of their bf16 input too: n16 keeps about 5 MB a sample in
# each trainable LLM layer that nothing but these norms needs (measured at batch 72: 1.4 GiB of a
# step that misses a 40 GiB cap). With the switch on, a norm whose output needs a gradient runs
# under non-reentrant checkpointing: autograd keeps only its input (the residual stream, which
# the norm's own backward keeps anyway, or the bf16 q and k) and backward recomputes the norm from
# it with the same ops, so
# every gradient is the same bits. The cost is the norms' forward once more in backward, a few
# elementwise passes. The SwiGLU product silu(gate) * up is recomputed the same way: autograd
# keeps gate and up, not silu(gate) too (bf16, the MLP's width: about 2 MB a sample a layer).
# Off by default; the trainer turns it on in loongforge mode on CUDA
# (--norm-recompute).
_recompute_norms = False


def set_norm_recompute(flag: bool) -> None:
    """Switch Note [Recomputed norms] on or off (process-wide; the trainer sets it per run)."""
    global _recompute_norms
    _recompute_norms = flag


def recomputed(fn: Callable[..., torch.Tensor], module: nn.Module, *xs: torch.Tensor
               ) -> torch.Tensor:
    """fn(*xs), recomputed in backward when the switch is on and a gradient will flow through it
    (Note [Recomputed norms]); else fn(*xs) as it is. ``module``: whose parameters fn reads
    (their gradients count too)."""
    if (_recompute_norms and module.training and torch.is_grad_enabled()
            and (any(x.requires_grad for x in xs)
                 or any(p.requires_grad for p in module.parameters(recurse=False)))):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(fn, *xs, use_reentrant=False, preserve_rng_state=False)
    return fn(*xs)


def _silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


# ------------------------------------------------------------------------------------------------
# Activation checkpointing


def _maybe_checkpoint(module: nn.Module, enabled: bool, *args: Any) -> torch.Tensor:
    """module(*args), recomputed in backward instead of keeping its activations when enabled.
    Non-reentrant and without RNG-state stashing: the blocks draw no random numbers (dropout p=0),
    and stashing the CUDA RNG state is not allowed under CUDA-graph capture."""
    if enabled and module.training and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        return checkpoint(module, *args, use_reentrant=False, preserve_rng_state=False)
    return module(*args)
