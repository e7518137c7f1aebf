"""The action head's transformer: GR00T's cross-attention DiT (AdaLN on the flow-matching
timestep; even blocks cross-attend to the VL context, odd blocks self-attend), its blocks, and the
routed-expert FFN (``MoEFeedForward``) that replaces the dense FFN in the MoE configs
(docs/moe.md). Module and parameter names follow diffusers (to_q/to_k/to_v/to_out.0, ff.net.*)."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .gr00t_config import Gr00tConfig
from .gr00t_layers import Device, _maybe_checkpoint, attention

# ------------------------------------------------------------------------------------------------
# DiT blocks: AdaLN, interleaved cross/self attention, dense or MoE FFNs


class DiffusersAttention(nn.Module):
    """diffusers.Attention shape: to_q/to_k/to_v/to_out.0, optional cross-attention input dim."""

    def __init__(self, dim: int, heads: int, head_dim: int, cross_dim: Optional[int] = None,
                 device: Device = None) -> None:
        super().__init__()
        inner = heads * head_dim
        kv_dim = cross_dim or dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, device=device)
        self.to_k = nn.Linear(kv_dim, inner, device=device)
        self.to_v = nn.Linear(kv_dim, inner, device=device)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim, device=device)])

    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None,
                context_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        ctx = x if context is None else context
        b, n, _ = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.to_k(ctx).view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
        v = self.to_v(ctx).view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
        mask = None if context_mask is None else context_mask[:, None, None, :]
        o = attention(q, k, v, mask=mask).transpose(1, 2).reshape(b, n, -1)
        return self.to_out[0](o)


class GELUProj(nn.Module):
    def __init__(self, dim: int, hidden: int, device: Device = None) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, hidden, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """diffusers FeedForward('gelu-approximate'): net.0.proj, net.1 (dropout), net.2. ``hidden``
    (0: dim * mult) sets the inner width (fine-grained MoE experts are narrower)."""

    def __init__(self, dim: int, mult: int, device: Device = None, hidden: int = 0) -> None:
        super().__init__()
        hidden = hidden or dim * mult
        self.net = nn.Sequential(GELUProj(dim, hidden, device), nn.Dropout(0.0),
                                 nn.Linear(hidden, dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MoEFeedForward(nn.Module):
    """Top-k routed fine-grained experts (each a FeedForward of width ``hidden``), an optional
    shared expert every token passes through, and the Switch/GShard load-balancing loss.

    The experts run as two grouped GEMMs over the tokens sorted by expert (loongforge.moe; no
    Python loop over experts). Each expert keeps its own parameters (``experts.<i>.net...``, the
    diffusers FeedForward layout), so NexusSync can bucket experts by load and checkpoints name
    experts; the forward stacks them into one [E, out, in] weight per GEMM (one copy, the size of
    the bf16 weight copy autocast makes for a dense layer anyway).

    After each forward: ``last_aux_loss`` (scalar, E * sum_e f_e * P_e; 1.0 when perfectly
    balanced), ``last_expert_counts`` (int64 [E], assignments routed to each expert, counting each
    of the top-k choices, before any capacity limit) and ``last_dropped`` (int64 scalar,
    assignments past the capacity limit: they contribute nothing, and are counted).

    Expert parallelism (``shard_experts``): the layer holds experts [first_expert, first_expert +
    len(experts)) of ``num_experts``; tokens travel to them by all-to-all (loongforge.moe)."""

    def __init__(self, dim: int, mult: int, experts: int, top_k: int,
                 device: Device = None, hidden: int = 0, shared: int = 0,
                 capacity_factor: float = 0.0) -> None:
        super().__init__()
        self.num_experts, self.top_k = experts, top_k
        self.hidden = hidden or dim * mult
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(dim, experts, bias=False, device=device)
        self.experts = nn.ModuleList(FeedForward(dim, mult, device, hidden=self.hidden)
                                     for _ in range(experts))
        self.shared_expert: Optional[nn.Module] = (
            FeedForward(dim, mult, device, hidden=self.hidden * shared) if shared else None)
        self.first_expert = 0
        self.ep: Optional[Any] = None  # loongforge.moe.ExpertParallel when sharded
        self.last_aux_loss: Optional[torch.Tensor] = None
        self.register_buffer("last_expert_counts", torch.zeros(experts, dtype=torch.long,
                                                               device=device), persistent=False)
        self.register_buffer("last_dropped", torch.zeros((), dtype=torch.long, device=device),
                             persistent=False)

    def keep_experts(self, first: int, count: int) -> None:
        """Drops every expert outside [first, first + count) (expert parallelism)."""
        self.experts = nn.ModuleList(list(self.experts)[first:first + count])
        self.first_expert = first

    def _run_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The local experts on rows sorted by (local) expert: two grouped GEMMs."""
        from ..moe import _group_ids, grouped_mm

        cdt = xs.dtype
        if xs.is_cuda and torch.is_autocast_enabled():
            cdt = torch.get_autocast_gpu_dtype()  # grouped GEMMs are not autocast ops
        w1 = torch.stack([e.net[0].proj.weight for e in self.experts]).to(cdt)
        b1 = torch.stack([e.net[0].proj.bias for e in self.experts]).to(cdt)
        w2 = torch.stack([e.net[2].weight for e in self.experts]).to(cdt)
        b2 = torch.stack([e.net[2].bias for e in self.experts]).to(cdt)
        gid = _group_ids(counts, xs.shape[0])
        h = F.gelu(grouped_mm(xs.to(cdt), w1, counts) + b1[gid], approximate="tanh")
        return grouped_mm(h, w2, counts) + b2[gid]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..moe import capacity_of, route

        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        n = flat.shape[0]
        probs = torch.softmax(self.router(flat).float(), dim=-1)  # [N, E]
        weights, idx = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        cap = capacity_of(n, self.top_k, self.num_experts, self.capacity_factor)
        r = route(idx, self.num_experts, cap)
        tok = r.order // self.top_k
        xs = flat[tok]
        if self.ep is not None and self.ep.size > 1:
            ys = self.ep.dispatch_compute(xs, r.counts, self._run_experts)
        else:
            ys = self._run_experts(xs, r.counts)
        gate = weights.reshape(-1)[r.order]
        out = torch.zeros(flat.shape, dtype=torch.float32, device=flat.device)
        out = out.index_add(0, tok, ys.float() * gate[:, None])
        if self.shared_expert is not None:
            out = out + self.shared_expert(flat).float()
        routed = r.routed.float()
        tokens = torch.full((), float(n), device=flat.device)  # a fill: no copy from the host
        p_mean = probs.mean(0)
        if self.ep is not None and self.ep.world > 1:
            # Load fractions over the global batch: the mean over ranks of this loss is then the
            # loss of one process holding the whole batch (expert parallelism's equivalence).
            red = self.ep.global_sum(torch.cat([routed, tokens[None]]))
            routed, tokens = red[:-1], red[-1]
        frac = routed / (tokens * self.top_k)
        self.last_aux_loss = self.num_experts * torch.sum(frac * p_mean)
        self.last_expert_counts = r.routed.detach()
        self.last_dropped = r.dropped.detach()
        return out.to(flat.dtype).view(shape)


class AdaLayerNorm(nn.Module):
    """norm(x) * (1 + scale) + shift, (scale, shift) = linear(silu(temb)) (GR00T's AdaLayerNorm)."""

    def __init__(self, dim: int, device: Device = None) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 2, device=device)
        self.norm = nn.LayerNorm(dim, eps=1e-5, elementwise_affine=False, device=device)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=-1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class BasicTransformerBlock(nn.Module):
    """One DiT block: (Ada)LayerNorm -> attention (self, or cross to the VL context) -> FFN/MoE."""

    def __init__(self, cfg: Gr00tConfig, dim: int, heads: int, head_dim: int,
                 cross_dim: Optional[int], ada: bool, moe: bool, device: Device = None) -> None:
        super().__init__()
        self.is_cross = cross_dim is not None
        self.norm1: nn.Module = (AdaLayerNorm(dim, device) if ada
                                 else nn.LayerNorm(dim, device=device))
        self.attn1 = DiffusersAttention(dim, heads, head_dim, cross_dim, device)
        self.norm3 = nn.LayerNorm(dim, device=device, elementwise_affine=not ada)
        self.ff: nn.Module = (MoEFeedForward(dim, cfg.dit_ff_mult, cfg.moe_experts, cfg.moe_top_k,
                                             device, hidden=cfg.moe_expert_hidden,
                                             shared=cfg.moe_shared_experts,
                                             capacity_factor=cfg.moe_capacity_factor) if moe
                              else FeedForward(dim, cfg.dit_ff_mult, device))

    def forward(self, x: torch.Tensor, temb: Optional[torch.Tensor] = None,
                context: Optional[torch.Tensor] = None,
                context_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.norm1(x, temb) if isinstance(self.norm1, AdaLayerNorm) else self.norm1(x)
        if self.is_cross:
            x = x + self.attn1(h, context, context_mask)
        elif context is None and context_mask is not None and not isinstance(self.norm1,
                                                                             AdaLayerNorm):
            x = x + self.attn1(h, None, context_mask)  # VL self-attention: keys masked by padding
        else:
            x = x + self.attn1(h)
        return x + self.ff(self.norm3(x))


def sinusoidal(t: torch.Tensor, dim: int, flip_sin_to_cos: bool = True,
               shift: float = 1.0, max_period: float = 10000.0) -> torch.Tensor:
    """diffusers get_timestep_embedding. t: any shape -> t.shape + [dim]."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(exponent / (half - shift))
    args = t.float()[..., None] * freqs
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[..., half:], emb[..., :half]], dim=-1)
    return emb


class TimestepEmbedding(nn.Module):
    def __init__(self, in_dim: int, dim: int, device: Device = None) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, dim, device=device)
        self.linear_2 = nn.Linear(dim, dim, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TimestepEncoder(nn.Module):
    def __init__(self, dim: int, device: Device = None) -> None:
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(256, dim, device)

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        return self.timestep_embedder(sinusoidal(timesteps, 256))


class DiT(nn.Module):
    """GR00T's cross-attention DiT: even blocks cross-attend to the VL context, odd self-attend."""

    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        d = cfg.dit_dim
        self.timestep_encoder = TimestepEncoder(d, device)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(cfg, d, cfg.dit_heads, cfg.dit_head_dim,
                                  cross_dim=d if i % 2 == 0 else None, ada=True,
                                  moe=cfg.moe_experts > 0, device=device)
            for i in range(cfg.dit_layers))
        self.norm_out = nn.LayerNorm(d, eps=1e-6, elementwise_affine=False, device=device)
        self.activation_checkpointing = False  # Gr00tPolicy.set_activation_checkpointing
        self.proj_out_1 = nn.Linear(d, 2 * d, device=device)
        self.proj_out_2 = nn.Linear(d, cfg.action_hidden, device=device)

    def forward(self, x: torch.Tensor, context: torch.Tensor, context_mask: torch.Tensor,
                timestep: torch.Tensor) -> torch.Tensor:
        temb = self.timestep_encoder(timestep)
        for block in self.transformer_blocks:
            x = _maybe_checkpoint(block, self.activation_checkpointing, x, temb,
                                  context if block.is_cross else None, context_mask)
        shift, scale = self.proj_out_1(F.silu(temb)).chunk(2, dim=-1)
        x = self.norm_out(x) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out_2(x)
