"""A GR00T-N1.6-shaped vision-language-action policy (reference model for LoongForge).

Structure (module names follow the public GR00T / Eagle / SigLIP / Qwen / diffusers code, so a real
checkpoint maps onto this tree with a few prefix rewrites, see ``GR00T_KEY_PREFIXES``):

  images [B, K, 3, H, W] --SigLIP ViT (patch 14)--> patches --pixel shuffle 0.5 + mlp1--> image tokens
  tokens [B, L]          --embed_tokens-------------------------------------------------> text tokens
  [image tokens, text tokens] --Qwen-style decoder truncated to select_layer layers--> VL features
      (bottom layers and the vision tower frozen; top ``tune_top_llm_layers`` trainable)
  VL features --vlln + projector + vl_self_attention--> context for the action head
  state [B, S]   --state_encoder--> 1 token ; noisy actions [B, T, A] --action_encoder(t)--> T tokens
  DiT (AdaLN on the timestep; even blocks cross-attend to the VL context, odd blocks self-attend over
      [state token, action tokens]) --action_decoder--> velocity [B, T, A]
  flow-matching loss: s ~ Beta(1.5, 1), t = (0.999 - s) / 0.999, x_t = t * action + (1 - t) * noise,
      target velocity = action - noise, MSE masked by action mask x action-dim mask (GR00T's exact
      conventions).

Configs: ``tiny`` (a step in seconds on 2 CPU cores), ``small``, ``n16`` (about 3B parameters,
about 1.7B trainable), ``n16-moe`` (DiT FFNs -> 16 quarter-width experts, top-2, load-balancing
loss; about 4.9B parameters) and ``tiny-moe`` (its CPU-sized twin). MoE: docs/moe.md.

One file of about 1,050 lines on purpose: it reads top to bottom as GR00T's module tree (vision,
language, action head, policy), so a real checkpoint's keys can be checked against it in one place.
The safetensors I/O at its end is the place to split first if it grows.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import mmap
import os
import struct
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

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
# Config


@dataclasses.dataclass
class Gr00tConfig:
    """Every size of the policy. Defaults are the full-size (n16) values."""

    name: str = "n16"
    # Vision tower (SigLIP-so400m shaped).
    image_size: int = 224
    patch_size: int = 14
    vit_dim: int = 1152
    vit_layers: int = 27
    vit_heads: int = 16
    vit_mlp: int = 4304
    downsample_ratio: float = 0.5  # Eagle pixel shuffle: 4x fewer image tokens
    # Language backbone (Qwen3-1.7B shaped), truncated to select_layer layers.
    vocab_size: int = 151936
    llm_dim: int = 2048
    llm_heads: int = 16
    llm_kv_heads: int = 8
    llm_head_dim: int = 128
    llm_mlp: int = 6144
    select_layer: int = 16
    tune_top_llm_layers: int = 4
    rope_theta: float = 1_000_000.0
    qk_norm: bool = True
    rms_eps: float = 1e-6
    # Longest instruction the trainer feeds (text tokens per sample; longer text is cut, with a
    # warning): bounds activation memory whatever the dataset holds (issue 21, defect 8).
    max_text_tokens: int = 512
    # Action head.
    vl_self_attn_layers: int = 4
    dit_layers: int = 32
    dit_heads: int = 32
    dit_head_dim: int = 48
    dit_ff_mult: int = 4
    action_hidden: int = 1024  # DiT output dim and state/action MLP hidden size
    max_state_dim: int = 128
    max_action_dim: int = 128
    action_horizon: int = 16
    num_embodiments: int = 32
    max_seq_len: int = 1024  # action-token position embeddings
    num_timestep_buckets: int = 1000
    noise_beta_alpha: float = 1.5
    noise_beta_beta: float = 1.0
    noise_s: float = 0.999
    num_inference_timesteps: int = 4
    # MoE variant of the DiT FFNs (0 experts = dense).
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_aux_weight: float = 0.01
    # Fine-grained experts: inner width of each expert (0 = the dense FFN's dit_dim * dit_ff_mult),
    # shared experts of that width every token passes through (0 or more), and the capacity
    # factor (0 = no limit; otherwise each expert takes ceil(factor * tokens * k / E) assignments
    # per forward and the rest are dropped and counted).
    moe_expert_hidden: int = 0
    moe_shared_experts: int = 0
    moe_capacity_factor: float = 0.0
    init_std: float = 0.02

    @property
    def dit_dim(self) -> int:
        return self.dit_heads * self.dit_head_dim

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_image(self) -> int:
        return int(round(self.patches_per_image * self.downsample_ratio**2))

    def validate(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"config {self.name}: image_size {self.image_size} is not a multiple "
                             f"of patch_size {self.patch_size}")
        grid = self.image_size // self.patch_size
        scale = int(round(1 / self.downsample_ratio))
        if grid % scale:
            raise ValueError(f"config {self.name}: patch grid {grid} not divisible by the pixel "
                             f"shuffle factor {scale}")
        if not 0 <= self.tune_top_llm_layers <= self.select_layer:
            raise ValueError(f"config {self.name}: tune_top_llm_layers {self.tune_top_llm_layers} "
                             f"outside [0, select_layer={self.select_layer}]")
        if self.llm_heads % self.llm_kv_heads:
            raise ValueError(f"config {self.name}: llm_heads must be a multiple of llm_kv_heads")
        if self.max_text_tokens <= 0:
            raise ValueError(f"config {self.name}: max_text_tokens must be positive")
        if self.vocab_size <= 0:
            raise ValueError(f"config {self.name}: vocab_size must be positive")
        if self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ValueError(f"config {self.name}: moe_top_k {self.moe_top_k} must be in "
                             f"[1, moe_experts={self.moe_experts}]")
        if self.moe_expert_hidden < 0 or self.moe_shared_experts < 0:
            raise ValueError(f"config {self.name}: moe_expert_hidden and moe_shared_experts "
                             f"must be >= 0")
        if not self.moe_capacity_factor >= 0:
            raise ValueError(f"config {self.name}: moe_capacity_factor must be >= 0")


CONFIGS: Dict[str, Gr00tConfig] = {
    "tiny": Gr00tConfig(
        name="tiny", vit_dim=128, vit_layers=4, vit_heads=4, vit_mlp=512, vocab_size=512,
        llm_dim=128, llm_heads=4, llm_kv_heads=2, llm_head_dim=32, llm_mlp=384, select_layer=4,
        tune_top_llm_layers=2, vl_self_attn_layers=1, dit_layers=4, dit_heads=4, dit_head_dim=32,
        action_hidden=128, max_state_dim=32, max_action_dim=32, num_embodiments=1,
        max_seq_len=64),
    "small": Gr00tConfig(
        name="small", vit_dim=384, vit_layers=8, vit_heads=6, vit_mlp=1536, vocab_size=4096,
        llm_dim=512, llm_heads=8, llm_kv_heads=4, llm_head_dim=64, llm_mlp=1536, select_layer=8,
        tune_top_llm_layers=4, vl_self_attn_layers=2, dit_layers=8, dit_heads=8, dit_head_dim=64,
        action_hidden=512, max_state_dim=64, max_action_dim=64, num_embodiments=4,
        max_seq_len=256),
    "n16": Gr00tConfig(name="n16"),
    # Fine-grained experts: 16 per DiT FFN, each a quarter of the dense FFN's width (1536), top-2:
    # about half the dense FFN's compute per token, about 4.9B parameters in all (docs/moe.md).
    "n16-moe": Gr00tConfig(name="n16-moe", moe_experts=16, moe_top_k=2, moe_expert_hidden=1536),
    # tiny with 8 quarter-width experts and small images: trains on 2 CPU cores, and splits over
    # 1, 2, 4 or 8 expert-parallel ranks.
    "tiny-moe": Gr00tConfig(
        name="tiny-moe", image_size=56, vit_dim=128, vit_layers=2, vit_heads=4, vit_mlp=512,
        vocab_size=512, llm_dim=128, llm_heads=4, llm_kv_heads=2, llm_head_dim=32, llm_mlp=384,
        select_layer=2, tune_top_llm_layers=1, vl_self_attn_layers=1, dit_layers=4, dit_heads=4,
        dit_head_dim=32, action_hidden=128, max_state_dim=32, max_action_dim=32,
        num_embodiments=1, max_seq_len=64, moe_experts=8, moe_top_k=2, moe_expert_hidden=128),
}


def get_config(name: str, **overrides: Any) -> Gr00tConfig:
    """A copy of the named config with field overrides (e.g. image_size=112)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown config '{name}' (choose from {', '.join(CONFIGS)})")
    fields = {f.name for f in dataclasses.fields(Gr00tConfig)}
    bad = [k for k in overrides if k not in fields]
    if bad:
        raise ValueError(f"unknown config field(s) {bad}")
    cfg = dataclasses.replace(CONFIGS[name], **{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    return cfg


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
# Vision tower: SigLIP-style ViT


class SiglipAttention(nn.Module):
    def __init__(self, dim: int, heads: int, device: Device = None) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, device=device)
        self.k_proj = nn.Linear(dim, dim, device=device)
        self.v_proj = nn.Linear(dim, dim, device=device)
        self.out_proj = nn.Linear(dim, dim, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        o = attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        return self.out_proj(o)


class SiglipMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, device: Device = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, device=device)
        self.fc2 = nn.Linear(hidden, dim, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.vit_dim, eps=1e-6, device=device)
        self.self_attn = SiglipAttention(cfg.vit_dim, cfg.vit_heads, device)
        self.layer_norm2 = nn.LayerNorm(cfg.vit_dim, eps=1e-6, device=device)
        self.mlp = SiglipMLP(cfg.vit_dim, cfg.vit_mlp, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, cfg.vit_dim, cfg.patch_size, cfg.patch_size,
                                         device=device)
        self.position_embedding = nn.Embedding(cfg.patches_per_image, cfg.vit_dim, device=device)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(images).flatten(2).transpose(1, 2)  # [N, P, D]
        return x + self.position_embedding.weight[None]


class SiglipEncoder(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(cfg, device) for _ in range(cfg.vit_layers))


class SiglipVisionModel(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(cfg, device)
        self.encoder = SiglipEncoder(cfg, device)
        self.post_layernorm = nn.LayerNorm(cfg.vit_dim, eps=1e-6, device=device)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(images)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


def pixel_shuffle(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """Eagle's token merge: [N, h*w, C] -> [N, h*w*ratio^2, C/ratio^2] (2x2 neighbours -> 1)."""
    n, p, c = x.shape
    h = w = int(math.isqrt(p))
    s = int(round(1 / ratio))
    x = x.view(n, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (h // s) * (w // s), c * s * s)


# ------------------------------------------------------------------------------------------------
# Language backbone: Qwen-style decoder


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, device: Device = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class QwenAttention(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.llm_heads, cfg.llm_kv_heads, cfg.llm_head_dim
        self.q_proj = nn.Linear(cfg.llm_dim, self.heads * self.head_dim, bias=False, device=device)
        self.k_proj = nn.Linear(cfg.llm_dim, self.kv_heads * self.head_dim, bias=False,
                                device=device)
        self.v_proj = nn.Linear(cfg.llm_dim, self.kv_heads * self.head_dim, bias=False,
                                device=device)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.llm_dim, bias=False, device=device)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_eps, device) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_eps, device) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.heads:  # grouped-query attention
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = attention(q, k, v, mask=mask, causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, n, -1))


class QwenMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, device: Device = None) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False, device=device)
        self.up_proj = nn.Linear(dim, hidden, bias=False, device=device)
        self.down_proj = nn.Linear(hidden, dim, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class QwenDecoderLayer(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.llm_dim, cfg.rms_eps, device)
        self.self_attn = QwenAttention(cfg, device)
        self.post_attention_layernorm = RMSNorm(cfg.llm_dim, cfg.rms_eps, device)
        self.mlp = QwenMLP(cfg.llm_dim, cfg.llm_mlp, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class QwenModel(nn.Module):
    """Decoder truncated to ``select_layer`` layers (GR00T drops the layers above it)."""

    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.llm_dim, device=device)
        self.layers = nn.ModuleList(QwenDecoderLayer(cfg, device) for _ in range(cfg.select_layer))
        self.norm = RMSNorm(cfg.llm_dim, cfg.rms_eps, device)
        self.activation_checkpointing = False  # trainable layers only (frozen ones keep nothing)

    def forward(self, embeds: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        n = embeds.shape[1]
        pos = torch.arange(n, device=embeds.device)
        cos, sin = rope_cos_sin(pos, self.cfg.llm_head_dim, self.cfg.rope_theta, embeds.dtype)
        mask = key_mask[:, None, None, :]
        x = embeds
        for layer in self.layers:
            ckpt = self.activation_checkpointing and any(p.requires_grad for p in layer.parameters())
            x = _maybe_checkpoint(layer, ckpt, x, cos, sin, mask)
        return self.norm(x)


class EagleBackbone(nn.Module):
    """Vision tower + mlp1 projector + truncated language model -> VL features [B, N, llm_dim]."""

    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision_model = SiglipVisionModel(cfg, device)
        merged = int(round(cfg.vit_dim / cfg.downsample_ratio**2))
        self.mlp1 = nn.Sequential(
            nn.LayerNorm(merged, device=device), nn.Linear(merged, cfg.llm_dim, device=device),
            nn.GELU(), nn.Linear(cfg.llm_dim, cfg.llm_dim, device=device))
        self.language_model = QwenModel(cfg, device)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor,
                attention_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        b, k = images.shape[:2]
        with _part("vision"):
            feats = self.vision_model(images.flatten(0, 1))
        with _part("projector"):
            img_tok = self.mlp1(pixel_shuffle(feats, self.cfg.downsample_ratio))
            img_tok = img_tok.reshape(b, k * img_tok.shape[1], -1)
        with _part("llm"):
            txt_tok = self.language_model.embed_tokens(tokens)
            embeds = torch.cat([img_tok.to(txt_tok.dtype), txt_tok], dim=1)
            mask = torch.cat([torch.ones(b, img_tok.shape[1], dtype=torch.bool,
                                         device=tokens.device), attention_mask.bool()], dim=1)
            vl = self.language_model(embeds, mask)
        return vl, mask


# ------------------------------------------------------------------------------------------------
# Action head: DiT with AdaLN, interleaved cross/self attention, optional MoE FFNs


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
        tokens = torch.tensor(float(n), device=flat.device)
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


class CategorySpecificLinear(nn.Module):
    """Per-embodiment linear layer (W [C, in, out], b [C, out]) as in GR00T."""

    def __init__(self, categories: int, in_dim: int, out_dim: int, device: Device = None) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.empty(categories, in_dim, out_dim, device=device))
        self.b = nn.Parameter(torch.zeros(categories, out_dim, device=device))

    def forward(self, x: torch.Tensor, cat_ids: Optional[torch.Tensor]) -> torch.Tensor:
        # GR00T gathers W[cat_ids] per sample (a [B, in, out] copy). cat_ids None means "every
        # sample is embodiment 0" (batches without embodiment ids): one shared matmul, no copy and
        # no host sync. With ids, the gather path is used (checking on the host whether the batch
        # holds one embodiment would cost a device->host sync per layer, and cannot be captured in
        # a CUDA graph).
        if cat_ids is None:
            return torch.matmul(x, self.W[0]) + self.b[0]
        w, b = self.W[cat_ids], self.b[cat_ids]
        return torch.bmm(x, w) + b[:, None]


class CategorySpecificMLP(nn.Module):
    def __init__(self, categories: int, in_dim: int, hidden: int, out_dim: int,
                 device: Device = None) -> None:
        super().__init__()
        self.layer1 = CategorySpecificLinear(categories, in_dim, hidden, device)
        self.layer2 = CategorySpecificLinear(categories, hidden, out_dim, device)

    def forward(self, x: torch.Tensor, cat_ids: Optional[torch.Tensor]) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x, cat_ids)), cat_ids)


class MultiEmbodimentActionEncoder(nn.Module):
    def __init__(self, categories: int, action_dim: int, hidden: int,
                 device: Device = None) -> None:
        super().__init__()
        self.hidden = hidden
        self.W1 = CategorySpecificLinear(categories, action_dim, hidden, device)
        self.W2 = CategorySpecificLinear(categories, 2 * hidden, hidden, device)
        self.W3 = CategorySpecificLinear(categories, hidden, hidden, device)

    def forward(self, actions: torch.Tensor, timesteps: torch.Tensor,
                cat_ids: Optional[torch.Tensor]) -> torch.Tensor:
        b, t, _ = actions.shape
        a = self.W1(actions, cat_ids)
        tau = sinusoidal(timesteps[:, None].expand(b, t), self.hidden, flip_sin_to_cos=False,
                         shift=0.0).to(a.dtype)
        x = F.silu(self.W2(torch.cat([a, tau], dim=-1), cat_ids))
        return self.W3(x, cat_ids)


class SelfAttentionTransformer(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(cfg, cfg.dit_dim, cfg.dit_heads, cfg.dit_head_dim, None,
                                  ada=False, moe=False, device=device)
            for _ in range(cfg.vl_self_attn_layers))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for block in self.transformer_blocks:
            x = block(x, context_mask=mask)
        return x


class FlowMatchingActionHead(nn.Module):
    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        self.cfg = cfg
        d, c = cfg.dit_dim, cfg.num_embodiments
        # Projector from the backbone to the action head.
        self.vlln = nn.LayerNorm(cfg.llm_dim, device=device)
        self.projector = nn.Linear(cfg.llm_dim, d, device=device)
        self.vl_self_attention = SelfAttentionTransformer(cfg, device)
        self.model = DiT(cfg, device)
        self.state_encoder = CategorySpecificMLP(c, cfg.max_state_dim, cfg.action_hidden, d, device)
        self.action_encoder = MultiEmbodimentActionEncoder(c, cfg.max_action_dim, d, device)
        self.action_decoder = CategorySpecificMLP(c, cfg.action_hidden, cfg.action_hidden,
                                                  cfg.max_action_dim, device)
        self.position_embedding = nn.Embedding(cfg.max_seq_len, d, device=device)

    def encode_context(self, vl: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # GR00T runs this without a mask; we mask padded text tokens as keys so that a sample's
        # context does not depend on how far its batch was padded.
        with _part("projector"):
            x = self.projector(self.vlln(vl))
        with _part("dit"):
            return self.vl_self_attention(x, mask)

    def velocity(self, context: torch.Tensor, context_mask: torch.Tensor, state: torch.Tensor,
                 noisy: torch.Tensor, t_disc: torch.Tensor,
                 cat_ids: Optional[torch.Tensor]) -> torch.Tensor:
        state_tok = self.state_encoder(state[:, None], cat_ids)  # [B, 1, D]
        act = self.action_encoder(noisy, t_disc, cat_ids)
        act = act + self.position_embedding.weight[None, : act.shape[1]]
        x = torch.cat([state_tok, act], dim=1)
        out = self.model(x, context, context_mask, t_disc)
        return self.action_decoder(out, cat_ids)[:, -noisy.shape[1]:]


# ------------------------------------------------------------------------------------------------
# The policy


def _maybe_checkpoint(module: nn.Module, enabled: bool, *args: Any) -> torch.Tensor:
    """module(*args), recomputed in backward instead of keeping its activations when enabled.
    Non-reentrant and without RNG-state stashing: the blocks draw no random numbers (dropout p=0),
    and stashing the CUDA RNG state is not allowed under CUDA-graph capture."""
    if enabled and module.training and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        return checkpoint(module, *args, use_reentrant=False, preserve_rng_state=False)
    return module(*args)


ACTIVATION_CHECKPOINTING = ("off", "dit", "llm", "all")


def _pad_last(x: torch.Tensor, size: int, what: str) -> torch.Tensor:
    if x.shape[-1] > size:
        raise ValueError(f"{what} has dim {x.shape[-1]} > the model's maximum {size}")
    return F.pad(x, (0, size - x.shape[-1]))


class Gr00tPolicy(nn.Module):
    """The GR00T-N1.6-shaped policy. ``forward(batch)`` returns the training losses.

    ``batch`` is the DataFusionLoader dict: images float [B, K, 3, H, W] (normalized), tokens int64
    [B, L], attention_mask bool [B, L], state float [B, S], action float [B, T, A], action_mask
    bool [B, T]; optional embodiment_id int64 [B]. S and A are padded here to the configured maxima
    and the padded action dims are masked out of the loss."""

    def __init__(self, cfg: Gr00tConfig, device: Device = None) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.backbone = EagleBackbone(cfg, device)
        self.action_head = FlowMatchingActionHead(cfg, device)
        self.reset_parameters()
        self.apply_freeze()

    # -- parameters --------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random init, deterministic under torch.manual_seed. The backbone follows the HF
        convention (N(0, init_std) weights, zero biases, unit norms); the action head keeps
        PyTorch's default layer init and N(0, 0.02) per-embodiment weights, as GR00T's code does."""
        std = self.cfg.init_std
        for m in self.backbone.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                m.weight.normal_(0.0, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, std)
            elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
        for m in self.action_head.modules():
            if isinstance(m, CategorySpecificLinear):
                m.W.normal_(0.0, 0.02)
                m.b.zero_()
            elif isinstance(m, (nn.Linear, nn.LayerNorm, nn.Embedding)):
                m.reset_parameters()

    def frozen_modules(self) -> List[nn.Module]:
        """Vision tower, mlp1, token embeddings and the bottom LLM layers."""
        lm = self.backbone.language_model
        n_frozen = self.cfg.select_layer - self.cfg.tune_top_llm_layers
        return [self.backbone.vision_model, self.backbone.mlp1, lm.embed_tokens,
                *lm.layers[:n_frozen]]

    def fp8_modules(self) -> List[nn.Module]:
        """The frozen encoder layers that --fp8-frozen runs in FP8 (loongforge.fp8): the vision
        tower and the frozen LLM layers (mlp1 and the embeddings stay as they are)."""
        lm = self.backbone.language_model
        n_frozen = self.cfg.select_layer - self.cfg.tune_top_llm_layers
        return [self.backbone.vision_model, *lm.layers[:n_frozen]]

    def apply_freeze(self) -> None:
        for p in self.parameters():
            p.requires_grad_(True)
        for m in self.frozen_modules():
            for p in m.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True) -> "Gr00tPolicy":
        super().train(mode)
        for m in self.frozen_modules():  # frozen parts always run in eval mode, as in GR00T
            m.eval()
        return self

    def set_activation_checkpointing(self, mode: str) -> None:
        """Selective activation checkpointing: 'off', 'dit' (the 32 DiT blocks), 'llm' (the
        trainable top LLM layers) or 'all' (both). Recomputes those blocks' forward in backward,
        trading about one extra forward of them for their activation memory."""
        if mode not in ACTIVATION_CHECKPOINTING:
            raise ValueError(f"activation checkpointing {mode!r}: expected one of "
                             f"{ACTIVATION_CHECKPOINTING}")
        self.action_head.model.activation_checkpointing = mode in ("dit", "all")
        self.backbone.language_model.activation_checkpointing = mode in ("llm", "all")

    def moe_layers(self) -> List[MoEFeedForward]:
        return [m for m in self.modules() if isinstance(m, MoEFeedForward)]

    def expert_token_counts(self) -> Dict[str, torch.Tensor]:
        """Tokens routed to each expert in the last forward, per MoE layer (name -> int64 [E])."""
        return {n: m.last_expert_counts for n, m in self.named_modules()
                if isinstance(m, MoEFeedForward)}

    def expert_load(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(int64 [E] assignments per expert summed over MoE layers, int64 dropped assignments)
        of the last forward, on the model's device (no host sync)."""
        moe = self.moe_layers()
        counts = torch.stack([m.last_expert_counts for m in moe]).sum(0)
        return counts, torch.stack([m.last_dropped for m in moe]).sum()

    def shard_experts(self, ep: Any) -> None:
        """Expert parallelism: keeps only this rank's experts (loongforge.moe.ExpertParallel)
        in every MoE layer and routes their tokens through ``ep``. Build the full model with
        the same seed on every rank first, so that every expert has the same weights as in a
        one-process run."""
        for m in self.moe_layers():
            m.keep_experts(ep.first_expert, ep.local)
            m.ep = ep

    def expert_parameters(self) -> List[nn.Parameter]:
        """The routed experts' parameters (reduced over the expert-data-parallel group)."""
        return [p for m in self.moe_layers() for p in m.experts.parameters()]

    # -- forward -----------------------------------------------------------------------------
    def encode(self, batch: Mapping[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        vl, mask = self.backbone(batch["images"], batch["tokens"], batch["attention_mask"])
        return self.action_head.encode_context(vl, mask), mask

    def _inputs(self, batch: Mapping[str, torch.Tensor]
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        state = _pad_last(batch["state"].float(), self.cfg.max_state_dim, "state")
        return state, batch.get("embodiment_id")  # None: every sample is embodiment 0

    def draw_noise(self, batch_size: int, horizon: int, device: torch.device,
                   generator: Optional[torch.Generator] = None,
                   out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The step's random numbers, in the order forward() draws them: the flow-matching noise
        [B, horizon, max_action_dim] and the uniform u [B] that sample_time maps to t. A CUDA-graph
        step draws them outside the graph into its static buffers (``out``), so they come from
        the same generator stream as in eager mode and never repeat across replays."""
        shape = (batch_size, horizon, self.cfg.max_action_dim)
        if out is None:
            noise = torch.randn(shape, device=device, generator=generator)
            u = torch.rand(batch_size, device=device, generator=generator)
            return noise, u
        out[0].normal_(generator=generator)
        out[1].uniform_(generator=generator)
        return out

    def sample_time(self, batch_size: int, device: torch.device,
                    generator: Optional[torch.Generator] = None,
                    u: Optional[torch.Tensor] = None) -> torch.Tensor:
        """GR00T: s ~ Beta(alpha, beta), t = (noise_s - s) / noise_s. For Beta(a, 1) the inverse CDF
        is u^(1/a), which lets a torch.Generator drive it (torch.distributions.Beta cannot)."""
        if u is None:
            u = torch.rand(batch_size, device=device, generator=generator)
        if self.cfg.noise_beta_beta == 1.0:
            s = u.pow(1.0 / self.cfg.noise_beta_alpha)
        else:  # general Beta: global RNG (no generator support in torch.distributions)
            s = torch.distributions.Beta(self.cfg.noise_beta_alpha,
                                         self.cfg.noise_beta_beta).sample((batch_size,)).to(device)
        return (self.cfg.noise_s - s) / self.cfg.noise_s

    def forward(self, batch: Mapping[str, torch.Tensor],
                generator: Optional[torch.Generator] = None,
                noise: Optional[torch.Tensor] = None,
                time_u: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        """Training losses. ``noise`` [B, T, max_action_dim] and ``time_u`` [B] (see draw_noise)
        replace the draws from ``generator`` when given (CUDA-graph steps)."""
        cfg = self.cfg
        context, context_mask = self.encode(batch)
        state, cat = self._inputs(batch)
        action = batch["action"].float()
        b, horizon, a_dim = action.shape
        action = _pad_last(action, cfg.max_action_dim, "action")
        dev = action.device
        if noise is None:
            noise = torch.randn(action.shape, device=dev, generator=generator)
        t = self.sample_time(b, dev, generator, u=time_u)
        tt = t[:, None, None]
        noisy = (1 - tt) * noise + tt * action
        velocity = action - noise
        t_disc = (t * cfg.num_timestep_buckets).long()
        with _part("dit"):
            pred = self.action_head.velocity(context, context_mask, state.to(context.dtype),
                                             noisy.to(context.dtype), t_disc, cat)
        mask = batch["action_mask"].bool()[:, :, None].expand(b, horizon, cfg.max_action_dim).clone()
        mask[:, :, a_dim:] = False  # padded action dims carry no loss
        maskf = mask.float()
        fm = ((pred.float() - velocity) ** 2 * maskf).sum() / maskf.sum().clamp_min(1.0)
        out = {"fm_loss": fm}
        moe = self.moe_layers()
        if moe:
            aux = torch.stack([m.last_aux_loss for m in moe]).mean()
            out["aux_loss"] = aux
            out["loss"] = fm + cfg.moe_aux_weight * aux
        else:
            out["loss"] = fm
        return out

    @torch.no_grad()
    def get_action(self, batch: Mapping[str, torch.Tensor], action_dim: Optional[int] = None,
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Euler integration of the learned velocity field over num_inference_timesteps steps."""
        cfg = self.cfg
        context, context_mask = self.encode(batch)
        state, cat = self._inputs(batch)
        b = state.shape[0]
        x = torch.randn(b, cfg.action_horizon, cfg.max_action_dim, device=state.device,
                        generator=generator)
        n = cfg.num_inference_timesteps
        for i in range(n):
            t_disc = torch.full((b,), int(i / n * cfg.num_timestep_buckets), dtype=torch.long,
                                device=state.device)
            v = self.action_head.velocity(context, context_mask, state.to(context.dtype),
                                          x.to(context.dtype), t_disc, cat)
            x = x + v.float() / n
        return x if action_dim is None else x[..., :action_dim]


def count_parameters(cfg_or_model: Union[Gr00tConfig, nn.Module]) -> Dict[str, int]:
    """Total / trainable / frozen parameter counts. Given a config, the model is built on the meta
    device, so nothing is allocated (works for n16 and n16-moe)."""
    model = (Gr00tPolicy(cfg_or_model, device="meta") if isinstance(cfg_or_model, Gr00tConfig)
             else cfg_or_model)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    by_part = {
        "vision": sum(p.numel() for p in model.backbone.vision_model.parameters()),
        "llm": sum(p.numel() for p in model.backbone.language_model.parameters()),
        "dit": sum(p.numel() for p in model.action_head.model.parameters()),
        "action_head": sum(p.numel() for p in model.action_head.parameters()),
    }
    return {"total": total, "trainable": trainable, "frozen": total - trainable, **by_part}


# ------------------------------------------------------------------------------------------------
# safetensors (own parser: u64 LE header length, JSON header, raw little-endian data)

_ST_DTYPES: Dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_ST_NAMES: Dict[torch.dtype, str] = {v: k for k, v in _ST_DTYPES.items()}

# Prefix rewrites from GR00T checkpoint names to this module tree (first match wins).
GR00T_KEY_PREFIXES: Sequence[Tuple[str, str]] = (
    ("backbone.eagle_model.vision_model.vision_model.", "backbone.vision_model."),
    ("backbone.eagle_model.vision_model.", "backbone.vision_model."),
    ("backbone.eagle_model.language_model.model.", "backbone.language_model."),
    ("backbone.eagle_model.mlp1.", "backbone.mlp1."),
)


def read_safetensors(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Reads every tensor of a .safetensors file (copies out of a read-only mmap).
    Raises ValueError naming the file and tensor on a malformed header or out-of-range data."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{path}: not a safetensors file ({size} bytes)")
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > size - 8 or hlen > 100 << 20:
            raise ValueError(f"{path}: header length {hlen} exceeds the file ({size} bytes)")
        try:
            header = json.loads(f.read(hlen).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: header is not valid JSON: {e}") from e
        if not isinstance(header, dict):
            raise ValueError(f"{path}: header is not a JSON object")
        meta = header.pop("__metadata__", {}) or {}
        base = 8 + hlen
        out: Dict[str, torch.Tensor] = {}
        if not header:
            return out, dict(meta)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for name, info in header.items():
                try:
                    dtype = _ST_DTYPES[info["dtype"]]
                    shape = [int(s) for s in info["shape"]]
                    begin, end = (int(o) for o in info["data_offsets"])
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}: tensor '{name}': bad header entry {info!r}") from e
                numel = math.prod(shape)
                elem = torch.empty((), dtype=dtype).element_size()
                if begin < 0 or end < begin or base + end > size or end - begin != numel * elem:
                    raise ValueError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do "
                                     f"not fit {info['dtype']}{shape} in a {size}-byte file")
                raw = bytearray(mm[base + begin: base + end])
                if numel == 0:
                    t = torch.empty(shape, dtype=dtype)
                else:
                    t = torch.frombuffer(raw, dtype=dtype).reshape(shape)
                out[name] = t
    return out, dict(meta)


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: str,
                     metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors (contiguous CPU copies) in the safetensors layout, fsynced."""
    header: Dict[str, Any] = {}
    blobs: List[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _ST_NAMES:
            raise ValueError(f"tensor '{name}': dtype {t.dtype} has no safetensors code")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = dict(metadata)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * ((8 - len(hdr) % 8) % 8)  # keep the data 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _rename(name: str, prefixes: Sequence[Tuple[str, str]]) -> str:
    for old, new in prefixes:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def load_safetensors(model: nn.Module, paths: Union[str, Iterable[str]], *,
                     rename: Optional[Callable[[str], Optional[str]]] = None,
                     prefixes: Sequence[Tuple[str, str]] = GR00T_KEY_PREFIXES,
                     strict: bool = False) -> Dict[str, List[str]]:
    """Loads one or more safetensors files (a path, a list, or a directory of shards) into `model`.

    Names are rewritten by `prefixes` (GR00T -> this tree) and then `rename` (return None to drop a
    key). Returns {'missing': model keys not in the files, 'unexpected': file keys not in the model,
    'mismatched': keys whose shapes differ (not loaded)}. strict=True raises ValueError if any list
    is non-empty. Values are cast to each parameter's dtype and copied to its device."""
    if isinstance(paths, str):
        if os.path.isdir(paths):
            paths = sorted(os.path.join(paths, p) for p in os.listdir(paths)
                           if p.endswith(".safetensors"))
        else:
            paths = [paths]
    own = model.state_dict()
    seen: set = set()
    unexpected: List[str] = []
    mismatched: List[str] = []
    for path in paths:
        tensors, _ = read_safetensors(path)
        for name, t in tensors.items():
            key: Optional[str] = _rename(name, prefixes)
            if rename is not None and key is not None:
                key = rename(key)
            if key is None:
                continue
            if key not in own:
                unexpected.append(name)
                continue
            if tuple(own[key].shape) != tuple(t.shape):
                mismatched.append(f"{name}: file {list(t.shape)} vs model {list(own[key].shape)}")
                continue
            with torch.no_grad():
                own[key].copy_(t.to(own[key].dtype))
            seen.add(key)
    missing = [k for k in own if k not in seen]
    report = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    if strict and (missing or unexpected or mismatched):
        raise ValueError(f"load_safetensors: {len(missing)} missing, {len(unexpected)} "
                         f"unexpected, {len(mismatched)} mismatched keys: "
                         f"{(missing + unexpected + mismatched)[:8]}")
    return report
