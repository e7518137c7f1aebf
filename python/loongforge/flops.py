"""Model FLOPs of a training step of the GR00T-shaped policy, and MFU.

An analytic count of the matrix products (models/gr00t.py), the convention of torch's
``FlopCounterMode`` and of MFU as usually reported:

- a product of an [m, k] and a [k, n] matrix is 2*m*n*k FLOPs (linear layers, the patch
  convolution, attention's Q K^T and P V); norms, activations, softmax, embeddings and the loss
  are not counted;
- backward, for trainable parts only: the weight gradient (2*m*n*k) and the input gradient
  (2*m*n*k) of every linear layer, the latter only where the input requires a gradient (not for
  the first layers fed by the noisy actions, the state or the timestep's sinusoid); 2x forward
  for attention's two products. Frozen parts (the vision tower, mlp1 and the bottom
  select_layer - tune_top_llm_layers language layers, Gr00tPolicy.frozen_modules) run forward
  only, since nothing below them needs a gradient;
- attention counts every (query, key) pair, causal masks included (the kernels compute them),
  grouped-query attention at the query heads' count (keys and values are repeated);
- the text length is the sample's own: padding is not model work, and batches of one run are
  padded differently by each mode (to the batch's longest, a token bucket, the dataset's
  longest), so the trainer counts each sample at its real length
  (:meth:`FlopsPerShape.length_polynomial`); ``count_step_flops`` counts what it is given;
- MoE FFNs count the router and top_k experts per token (the routed token count is fixed:
  tokens x top_k).

MFU = model FLOPs per step / step time / the GPU's dense bf16 peak (:func:`peak_flops`).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

from .models.gr00t import Gr00tConfig

# Dense (no sparsity) bf16 tensor-core peaks per GPU, in FLOP/s, from the vendors' data sheets.
# Matched by substring of torch.cuda.get_device_name(), first match wins (specific names first).
PEAK_BF16: Tuple[Tuple[str, float], ...] = (
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.5e12),
    ("H200", 989.4e12),
    ("H100", 989.4e12),  # SXM
    ("H800", 989.4e12),
    ("H20", 148.0e12),
    ("GB200", 2500.0e12),
    ("B200", 2250.0e12),
    ("A100", 312.0e12),
    ("A800", 312.0e12),
    ("L40S", 362.05e12),
    ("L4", 121.0e12),
)


def peak_flops(device_name: Optional[str], override_tflops: float = 0.0) -> Optional[float]:
    """The dense bf16 peak of one GPU in FLOP/s: ``override_tflops`` * 1e12 when > 0, else the
    table entry for ``device_name``; None (MFU n/a) on a CPU or an unknown GPU."""
    if override_tflops > 0:
        return override_tflops * 1e12
    if not device_name:
        return None
    for key, peak in PEAK_BF16:
        if key.lower() in device_name.lower():
            return peak
    return None


@dataclasses.dataclass
class StepFlops:
    """FLOPs of one micro-batch's forward and backward, by part."""

    forward: float = 0.0
    backward: float = 0.0
    by_part: Dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.forward + self.backward


class _Counter:
    def __init__(self) -> None:
        self.out = StepFlops()

    def add(self, part: str, fwd: float, bwd: float) -> None:
        self.out.forward += fwd
        self.out.backward += bwd
        self.out.by_part[part] = self.out.by_part.get(part, 0.0) + fwd + bwd

    def linear(self, part: str, rows: int, k: int, n: int, trainable: bool,
               input_grad: bool = True) -> None:
        """rows x [k -> n]: forward 2*rows*k*n; backward dW, plus dX when the input needs it."""
        f = 2.0 * rows * k * n
        self.add(part, f, (f + (f if input_grad else 0.0)) if trainable else 0.0)

    def attention(self, part: str, batch_heads: int, lq: int, lk: int, head_dim: int,
                  trainable: bool) -> None:
        """Q K^T and P V: 2 * (2*lq*lk*head_dim) per (sample, head); backward 2x."""
        f = 2.0 * (2.0 * batch_heads * lq * lk * head_dim)
        self.add(part, f, 2.0 * f if trainable else 0.0)


def count_step_flops(cfg: Gr00tConfig, batch: int, cameras: int, text_len: int,
                     horizon: int) -> StepFlops:
    """Forward + backward FLOPs of one training micro-batch: ``batch`` (>= 0) samples of
    ``cameras`` images at cfg.image_size, ``text_len`` (padded) text tokens and ``horizon`` action
    steps, with the freezing of Gr00tPolicy.apply_freeze. by_part: vision, projector (mlp1), llm,
    action_head. ValueError for a negative size or no cameras / action steps."""
    if min(cameras, horizon) <= 0 or min(batch, text_len) < 0:
        raise ValueError(f"FLOP count: batch {batch}, cameras {cameras}, text_len {text_len}, "
                         f"horizon {horizon}: expected positive sizes")
    c = _Counter()
    if batch == 0:  # every sample of the batch was skipped (corrupt policy): nothing runs
        return c.out
    b = batch
    # Vision tower (frozen): patch convolution, then vit_layers pre-norm blocks.
    images = b * cameras
    p, dv = cfg.patches_per_image, cfg.vit_dim
    c.linear("vision", images * p, 3 * cfg.patch_size**2, dv, trainable=False)
    for _ in range(cfg.vit_layers):
        for _ in range(4):  # q, k, v, out
            c.linear("vision", images * p, dv, dv, trainable=False)
        c.attention("vision", images * cfg.vit_heads, p, p, dv // cfg.vit_heads, trainable=False)
        c.linear("vision", images * p, dv, cfg.vit_mlp, trainable=False)
        c.linear("vision", images * p, cfg.vit_mlp, dv, trainable=False)
    # mlp1 (frozen): pixel-shuffled patches -> llm_dim -> llm_dim.
    img_tok = cfg.tokens_per_image
    merged = int(round(dv / cfg.downsample_ratio**2))
    c.linear("projector", images * img_tok, merged, cfg.llm_dim, trainable=False)
    c.linear("projector", images * img_tok, cfg.llm_dim, cfg.llm_dim, trainable=False)
    # Language model: image tokens + text tokens, select_layer layers, the top ones trainable.
    n = cameras * img_tok + text_len
    dl, hd = cfg.llm_dim, cfg.llm_head_dim
    q_dim, kv_dim = cfg.llm_heads * hd, cfg.llm_kv_heads * hd
    n_frozen = cfg.select_layer - cfg.tune_top_llm_layers
    for layer in range(cfg.select_layer):
        tr = layer >= n_frozen
        c.linear("llm", b * n, dl, q_dim, tr)
        c.linear("llm", b * n, dl, kv_dim, tr)
        c.linear("llm", b * n, dl, kv_dim, tr)
        c.attention("llm", b * cfg.llm_heads, n, n, hd, tr)
        c.linear("llm", b * n, q_dim, dl, tr)
        c.linear("llm", b * n, dl, cfg.llm_mlp, tr)  # gate
        c.linear("llm", b * n, dl, cfg.llm_mlp, tr)  # up
        c.linear("llm", b * n, cfg.llm_mlp, dl, tr)  # down
    # Action head (trainable). Context: vlln + projector + vl_self_attention over all n tokens.
    d, heads, dh = cfg.dit_dim, cfg.dit_heads, cfg.dit_head_dim
    inner = heads * dh
    ff = d * cfg.dit_ff_mult
    ah = "action_head"
    c.linear(ah, b * n, dl, d, True)

    def ffn(rows: int) -> None:
        if cfg.moe_experts:
            # Model FLOPs: each token through its top_k experts (padding that a grouped-GEMM
            # fallback adds is implementation work, not counted), plus the shared expert.
            hidden = cfg.moe_expert_hidden or ff
            c.linear(ah, rows, d, cfg.moe_experts, True)  # router
            if cfg.moe_shared_experts:
                c.linear(ah, rows, d, hidden * cfg.moe_shared_experts, True)
                c.linear(ah, rows, hidden * cfg.moe_shared_experts, d, True)
            rows *= cfg.moe_top_k
            c.linear(ah, rows, d, hidden, True)
            c.linear(ah, rows, hidden, d, True)
            return
        c.linear(ah, rows, d, ff, True)
        c.linear(ah, rows, ff, d, True)

    for _ in range(cfg.vl_self_attn_layers):
        for _ in range(3):
            c.linear(ah, b * n, d, inner, True)
        c.attention(ah, b * heads, n, n, dh, True)
        c.linear(ah, b * n, inner, d, True)
        c.linear(ah, b * n, d, ff, True)  # vl_self_attention blocks are always dense
        c.linear(ah, b * n, ff, d, True)
    # State token + action tokens.
    m = 1 + horizon
    c.linear(ah, b, cfg.max_state_dim, cfg.action_hidden, True, input_grad=False)
    c.linear(ah, b, cfg.action_hidden, d, True)
    c.linear(ah, b * horizon, cfg.max_action_dim, d, True, input_grad=False)  # W1
    c.linear(ah, b * horizon, 2 * d, d, True)  # W2
    c.linear(ah, b * horizon, d, d, True)  # W3
    # DiT: timestep encoder, dit_layers AdaLN blocks (even: cross-attention to the context).
    c.linear(ah, b, 256, d, True, input_grad=False)
    c.linear(ah, b, d, d, True)
    for i in range(cfg.dit_layers):
        cross = i % 2 == 0
        lk = n if cross else m
        c.linear(ah, b, d, 2 * d, True)  # AdaLN scale/shift
        c.linear(ah, b * m, d, inner, True)  # q
        c.linear(ah, b * lk, d, inner, True)  # k
        c.linear(ah, b * lk, d, inner, True)  # v
        c.attention(ah, b * heads, m, lk, dh, True)
        c.linear(ah, b * m, inner, d, True)
        ffn(b * m)
    c.linear(ah, b, d, 2 * d, True)  # proj_out_1
    c.linear(ah, b * m, d, cfg.action_hidden, True)  # proj_out_2
    c.linear(ah, b * m, cfg.action_hidden, cfg.action_hidden, True)  # action_decoder
    c.linear(ah, b * m, cfg.action_hidden, cfg.max_action_dim, True)
    return c.out


class FlopsPerShape:
    """count_step_flops memoized per micro-batch shape (batch, text_len): the trainer asks once
    per step, the count runs once per shape."""

    def __init__(self, cfg: Gr00tConfig, cameras: int, horizon: int) -> None:
        self.cfg, self.cameras, self.horizon = cfg, cameras, horizon
        self.cache: Dict[Tuple[int, int], StepFlops] = {}

    def __call__(self, batch: int, text_len: int) -> StepFlops:
        key = (batch, text_len)
        if key not in self.cache:
            self.cache[key] = count_step_flops(self.cfg, batch, self.cameras, text_len,
                                               self.horizon)
        return self.cache[key]

    def length_polynomial(self) -> Tuple[float, float, float]:
        """(c0, c1, c2) with one sample's step FLOPs at text length L = c0 + c1*L + c2*L**2,
        exactly: every count is proportional to the batch and at most quadratic in the text
        length (attention over image + text tokens). A batch's FLOPs at its samples' real
        lengths L_i are then c0*B + c1*sum(L_i) + c2*sum(L_i**2), which the trainer accumulates
        on the device without reading the lengths back (MFU counts no padding)."""
        f0, f1, f2 = (count_step_flops(self.cfg, 1, self.cameras, n, self.horizon).total
                      for n in (0, 1, 2))
        c2 = (f2 - 2.0 * f1 + f0) / 2.0
        return f0, f1 - f0 - c2, c2
