"""GR00T's flow-matching action head: the VL projector and self-attention that turn backbone
features into the DiT's context, the per-embodiment state and action encoders and action decoder,
and ``FlowMatchingActionHead.velocity``, which predicts the velocity field the policy's loss and
sampler use (gr00t.py)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .gr00t_config import Gr00tConfig
from .gr00t_dit import BasicTransformerBlock, DiT, sinusoidal
from .gr00t_layers import Device, _part


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
