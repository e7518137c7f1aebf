"""The policy's vision-language backbone (GR00T's Eagle backbone): a SigLIP-style vision tower, a
Qwen-style decoder truncated to ``select_layer`` layers, and ``EagleBackbone``, which joins them
through the pixel shuffle and the ``mlp1`` projector. Module and parameter names follow the public
SigLIP / Qwen / Eagle code, so a real checkpoint maps onto this tree (safetensors_io)."""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .gr00t_config import Gr00tConfig
from .gr00t_layers import (Device, _maybe_checkpoint, _part, _silu_mul, attention, recomputed,
                           shared_autocast_input)

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
        x = shared_autocast_input(x, self.q_proj, self.k_proj, self.v_proj)
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
        return recomputed(self._norm, self, x)  # Note [Recomputed norms]

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
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
        x = shared_autocast_input(x, self.q_proj, self.k_proj, self.v_proj)
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
        x = shared_autocast_input(x, self.gate_proj, self.up_proj)
        # Note [Recomputed norms]: silu(gate) is not kept for backward when the switch is on
        return self.down_proj(recomputed(_silu_mul, self, self.gate_proj(x), self.up_proj(x)))


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
