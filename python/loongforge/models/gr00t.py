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

Files, in the order of the module tree (this one composes them, and every public name they define
is importable from here):
  gr00t_config.py       Gr00tConfig, the named CONFIGS (tiny ... n16-moe), get_config
  gr00t_layers.py       attention, profile ranges around each part, activation checkpointing
  gr00t_backbone.py     SigLIP vision tower, Qwen decoder, EagleBackbone (backbone.*)
  gr00t_dit.py          the DiT and its blocks, the MoE FFN (action_head.model.*)
  gr00t_action_head.py  per-embodiment encoders/decoder, FlowMatchingActionHead (action_head.*)
  safetensors_io.py     safetensors read/write and the GR00T checkpoint loader
  gr00t.py              Gr00tPolicy (freezing, init, losses, sampling), count_parameters
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .gr00t_action_head import (CategorySpecificLinear, CategorySpecificMLP, FlowMatchingActionHead,
                                MultiEmbodimentActionEncoder, SelfAttentionTransformer)
from .gr00t_backbone import (EagleBackbone, QwenAttention, QwenDecoderLayer, QwenMLP, QwenModel,
                             RMSNorm, SiglipAttention, SiglipEmbeddings, SiglipEncoder,
                             SiglipEncoderLayer, SiglipMLP, SiglipVisionModel, apply_rope,
                             pixel_shuffle, rope_cos_sin)
from .gr00t_config import CONFIGS, Gr00tConfig, get_config
from .gr00t_dit import (AdaLayerNorm, BasicTransformerBlock, DiffusersAttention, DiT, FeedForward,
                        GELUProj, MoEFeedForward, TimestepEmbedding, TimestepEncoder, sinusoidal)
from .gr00t_layers import (HAS_SDPA, Device, _part, attention, set_manual_attention,
                           set_profile_ranges)
from .safetensors_io import (GR00T_KEY_PREFIXES, load_safetensors, read_safetensors,
                             save_safetensors)

__all__ = [
    "ACTIVATION_CHECKPOINTING", "CONFIGS", "GR00T_KEY_PREFIXES", "HAS_SDPA", "AdaLayerNorm",
    "BasicTransformerBlock", "CategorySpecificLinear", "CategorySpecificMLP", "DiT", "Device",
    "DiffusersAttention", "EagleBackbone", "FeedForward", "FlowMatchingActionHead", "GELUProj",
    "Gr00tConfig", "Gr00tPolicy", "MoEFeedForward", "MultiEmbodimentActionEncoder", "QwenAttention",
    "QwenDecoderLayer", "QwenMLP", "QwenModel", "RMSNorm", "SelfAttentionTransformer",
    "SiglipAttention", "SiglipEmbeddings", "SiglipEncoder", "SiglipEncoderLayer", "SiglipMLP",
    "SiglipVisionModel", "TimestepEmbedding", "TimestepEncoder", "apply_rope", "attention",
    "count_parameters", "get_config", "load_safetensors", "pixel_shuffle", "read_safetensors",
    "rope_cos_sin", "save_safetensors", "set_manual_attention", "set_profile_ranges", "sinusoidal",
]


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

    def frozen_linear_to(self, dtype: torch.dtype) -> Tuple[int, int]:
        """Stores the weights and biases of the frozen modules' ``nn.Linear`` and ``nn.Conv2d``
        layers in ``dtype`` (in place; --frozen-bf16). Under bf16 autocast those layers run in
        bf16 anyway: autocast casts an fp32 weight on every call (and, inside CUDA graphs, with
        its cast cache off, on every replay), so a bf16 weight gives the same bits, half the
        memory and no cast. Norms and embeddings keep their dtype (autocast runs them in fp32).
        Returns (layers, bytes saved). ValueError for a trainable parameter in those layers."""
        layers, saved = 0, 0
        size = torch.empty((), dtype=dtype).element_size()
        for m in self.frozen_modules():
            for sub in m.modules():
                if type(sub) not in (nn.Linear, nn.Conv2d):  # Fp8Linear and others as they are
                    continue
                for name, p in sub.named_parameters(recurse=False):
                    if p.requires_grad:
                        raise ValueError(f"frozen_linear_to: {type(sub).__name__}.{name} is "
                                         "trainable")
                    if p.dtype != dtype:
                        saved += p.numel() * (p.element_size() - size)
                        p.data = p.data.to(dtype)
                layers += 1
        return layers, saved

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
