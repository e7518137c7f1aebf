"""Every size of the GR00T-shaped policy: ``Gr00tConfig``, the named ``CONFIGS`` and ``get_config``.

Configs: ``tiny`` (a step in seconds on 2 CPU cores), ``small``, ``n16`` (about 3B parameters,
about 1.7B trainable), ``n16-moe`` (DiT FFNs -> 16 quarter-width experts, top-2, load-balancing
loss; about 4.9B parameters) and ``tiny-moe`` (its CPU-sized twin). MoE: docs/moe.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict


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
    # warning): bounds activation memory whatever the dataset holds.
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


_TINY = Gr00tConfig(
    name="tiny", vit_dim=128, vit_layers=4, vit_heads=4, vit_mlp=512, vocab_size=512,
    llm_dim=128, llm_heads=4, llm_kv_heads=2, llm_head_dim=32, llm_mlp=384, select_layer=4,
    tune_top_llm_layers=2, vl_self_attn_layers=1, dit_layers=4, dit_heads=4, dit_head_dim=32,
    action_hidden=128, max_state_dim=32, max_action_dim=32, num_embodiments=1, max_seq_len=64)

CONFIGS: Dict[str, Gr00tConfig] = {
    "tiny": _TINY,
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
    "tiny-moe": dataclasses.replace(
        _TINY, name="tiny-moe", image_size=56, vit_layers=2, select_layer=2, tune_top_llm_layers=1,
        moe_experts=8, moe_top_k=2, moe_expert_hidden=128),
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
