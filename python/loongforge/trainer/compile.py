"""torch.compile of parts of the policy, in place: the frozen encoder path (--compile-frozen)
and every dense transformer block (--compile-blocks, Note [Compiled blocks])."""
from __future__ import annotations

from typing import Any

import torch

from ..blocks import compile_in_place, configure_dynamo
from ..models.gr00t import Gr00tPolicy


def compile_frozen(model: Gr00tPolicy) -> str:
    """torch.compile the frozen encoder path (vision tower, projector, frozen LLM layers) in place
    (their forward methods: parameter names and state_dict keys stay as they are)."""
    if not hasattr(torch, "compile"):
        return f"off: torch {torch.__version__} has no torch.compile"
    n = 0
    for m in model.frozen_modules():
        if isinstance(m, torch.nn.Embedding):
            continue
        m.forward = torch.compile(m.forward, dynamic=False)  # type: ignore[method-assign]
        n += 1
    return f"on ({n} frozen modules)"


# Note [Compiled blocks]. The graphed step is GPU-bound, and its GEMMs already run at 55-64% of
# the bf16 peak (an eager profile of n16 on an H200): what keeps MFU low is everything between them,
# the norms, GELU and SwiGLU, residual adds, AdaLN modulation, RoPE and the casts that bf16 autocast
# puts around every matmul (57-67% of the kernel time). torch.compile fuses those into a few Triton
# kernels per block, forward and backward, and the kernels are captured in the step's CUDA graph
# like any other. It compiles each *block*, not the model: every transformer layer of one kind
# runs the same code, so one compilation serves all of them (torch >= 2.5 lifts a module's
# parameters to graph inputs instead of specializing on them), and a cold start compiles a
# handful of small graphs (a SigLIP layer, a frozen Qwen layer, a trainable one twice: the first
# reads an input that needs no gradient, the others one that does; a cross- and a self-attention
# DiT block, a VL self-attention block, the mlp1 projector: 8) instead of one graph of
# the whole model, whose compilation did not end within 250 s on an H200. Shapes are static
# (dynamic=False): a graph per token bucket, compiled in that bucket's eager warm-up steps before
# its capture (the trainer gives later buckets warm-up steps too). The compilations go to
# inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER), so a
# restart on the same machine reuses them. Numerics: bf16 autocast's, with the fused kernels
# computing in fp32 between the casts eager would round at (inductor's usual rule). MoE blocks
# are left eager (their routing calls LoongForge's own operators).


def compile_blocks(model: Gr00tPolicy, backend: Any = "inductor") -> str:
    """torch.compile every dense transformer block of the policy in place, per block (Note
    [Compiled blocks]): their ``forward`` methods, so parameter names and state_dict keys stay
    as they are. ``backend``: torch.compile's (tests count compilations through a wrapper).
    Returns the status line. RuntimeError without torch.compile."""
    if not hasattr(torch, "compile"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.compile (needs torch >= 2)")
    from ..models.gr00t import (BasicTransformerBlock, MoEFeedForward, QwenDecoderLayer,
                               SiglipEncoderLayer)

    configure_dynamo()
    kinds = {"vision": 0, "language": 0, "action head": 0}
    eager_moe = 0
    for m in model.modules():
        if isinstance(m, SiglipEncoderLayer):
            kind = "vision"
        elif isinstance(m, QwenDecoderLayer):
            kind = "language"
        elif isinstance(m, BasicTransformerBlock):
            if isinstance(m.ff, MoEFeedForward):
                eager_moe += 1
                continue
            kind = "action head"
        else:
            continue
        compile_in_place(m, backend)
        kinds[kind] += 1
    mlp1 = model.backbone.mlp1
    compile_in_place(mlp1, backend)
    done = ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
    return (f"on ({done} blocks and the projector; compiled per token bucket in its warm-up"
            + (f"; {eager_moe} MoE blocks eager" if eager_moe else "") + ")")
