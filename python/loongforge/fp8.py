"""FP8 (e4m3) forward for the frozen encoders' linear layers (``--fp8-frozen``).

The vision tower and the frozen language-model layers run forward only (their parameters are
frozen and no gradient flows into them), so their ``nn.Linear`` layers can be swapped for
``Fp8Linear``: the weight is quantized once per output channel and the activations per token
(row-wise), both e4m3 with scale = amax / 448, and the product runs on Hopper's FP8 tensor cores
through ``torch._scaled_mm`` with a bf16 result:

    y[m, n] = scale_x[m] * scale_w[n] * sum_k q(x)[m, k] * q(w)[n, k]  (+ bias[n])

``fp8_linear_reference`` is the same arithmetic in fp32 (quantize, dequantize, matmul); it runs on
any device, with torch's float8 dtype where torch has one and an exact emulation of e4m3
round-to-nearest-even otherwise (torch < 2.1), so the CPU tests pin the numerics.

Refusals (``Fp8Unsupported``, one line each): no CUDA device, compute capability < 8.9, a torch
without ``float8_e4m3fn`` / ``_scaled_mm``. A layer whose in or out features are not multiples
of 16 (``_scaled_mm``'s rule) keeps its bf16 ``nn.Linear``; ``apply_fp8_frozen`` counts those.

Activation quantization on the GPU is one kernel (``quantize_rows_fused``: the C++ twin of
``quantize_rowwise``, bit for bit, Note [Row-wise e4m3 quantization] in loongforge/compute.h)
instead of seven torch ops (float, abs, amax, clamp, divide, clamp, cast). It is used on CUDA
outside torch.compile tracing, when the build has it; ``LOONGFORGE_FP8_FUSED=0`` keeps the torch
ops (for comparisons).

State dicts do not change: ``Fp8Linear`` keeps the original ``weight`` and ``bias`` parameters
(same names, same tensors) and holds the FP8 copy in non-persistent buffers, re-quantized when
the weight is written (``load_state_dict`` bumps its version counter).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import weakref

import torch
from torch import nn

from . import _C, knobs
from .models.gr00t_layers import _compiling

__all__ = ["E4M3_MAX", "Fp8Unsupported", "Fp8Linear", "apply_fp8_frozen", "check_fp8_support",
           "fp8_linear_reference", "fused_quantize_available", "quantize_rowwise",
           "quantize_rows_fused"]

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
_EPS = 1e-12  # amax floor: an all-zero row gets a tiny scale instead of a division by zero
_ALIGN = 16  # _scaled_mm: K and N multiples of 16


class Fp8Unsupported(RuntimeError):
    """FP8 cannot run here (device, compute capability or torch build); the message says why."""


def check_fp8_support(device: Optional[torch.device] = None) -> None:
    """Raises Fp8Unsupported unless ``device`` (default: the current CUDA device) can run
    row-wise scaled FP8 matmuls: CUDA, compute capability >= 8.9, a torch with float8_e4m3fn
    and _scaled_mm."""
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        raise Fp8Unsupported(f"--fp8-frozen needs a torch with float8_e4m3fn and _scaled_mm "
                             f"(torch >= 2.1); this is torch {torch.__version__}")
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        raise Fp8Unsupported("--fp8-frozen needs a CUDA GPU with FP8 tensor cores (compute "
                             "capability >= 8.9: Ada, Hopper); this run has no CUDA device")
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise Fp8Unsupported(f"--fp8-frozen needs FP8 tensor cores (compute capability >= 8.9); "
                             f"{name} has {cap[0]}.{cap[1]}")


def _round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (|x| <= 448) rounded to the nearest float8_e4m3fn value, ties to even: 3
    mantissa bits, normal exponents from -6, subnormal spacing 2^-9. For torch without float8."""
    _, e = torch.frexp(x.abs().clamp_min(2.0**-6))  # subnormals share 2^-6's spacing
    quantum = torch.pow(2.0, (e - 4).float())  # |x| in [2^(e-1), 2^e): 3 bits below 2^(e-1)
    return torch.round(x / quantum) * quantum  # torch.round: half to even


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3 values (as float8 where torch has it, else fp32 holding e4m3 values)."""
    x = x.clamp(-E4M3_MAX, E4M3_MAX)
    if hasattr(torch, "float8_e4m3fn"):
        return x.to(torch.float8_e4m3fn)
    return _round_e4m3(x)


def quantize_rowwise(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """[R, C] -> (e4m3 [R, C], fp32 scale [R, 1]) with x ~= q * scale and scale = amax / 448
    over each row (per token for activations, per output channel for weights). The scale is
    amax times fp32(1/448), a product on every device: torch's CUDA `t / 448.0` multiplies by
    the reciprocal while its CPU kernel divides (Note [Row-wise e4m3 quantization])."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(_EPS) * (1.0 / E4M3_MAX)
    return _to_e4m3(xf / scale), scale


def fused_quantize_available() -> bool:
    """Whether Fp8Linear quantizes activations with the one-kernel ``quantize_rows_fused``: the
    build has it and LOONGFORGE_FP8_FUSED is not 0."""
    return hasattr(_C, "compute_quantize_rows_e4m3") and knobs.get("LOONGFORGE_FP8_FUSED")


def quantize_rows_fused(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rowwise`` of a contiguous 2-d bf16 or fp32 tensor in one pass (the C++ kernel,
    on x's device and torch's current stream): (uint8 bytes [R, C] of the e4m3 values, fp32
    scale [R, 1]); ``.view(torch.float8_e4m3fn)`` of the bytes is quantize_rowwise's first
    result, bit for bit. ValueError naming the tensor for another dtype or shape."""
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
    _C.compute_quantize_rows_e4m3(x, q, scale.view(-1))
    return q, scale


def fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fp8Linear's arithmetic in fp32: x [..., K] and weight [N, K] quantized row-wise to e4m3,
    dequantized, multiplied in fp32, plus bias. Returns fp32 [..., N]. Any device."""
    xq, xs = quantize_rowwise(x.reshape(-1, x.shape[-1]))
    wq, ws = quantize_rowwise(weight)
    y = (xq.float() * xs) @ (wq.float() * ws).t()
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], weight.shape[0])


# Note [Shared activation quantization]. Sibling layers often read the same activation: q, k
# and v take the same normed input, and so do an MLP's gate and up. Each Fp8Linear quantized it
# again (measured on an H200: 90 of the 168 fp32 quantizations of an n16 step at batch 64 repeated a
# sibling's). The last quantization is kept, keyed by the input tensor itself (identity, not
# address) and its version counter, so a tensor written in place, or a new tensor at a reused
# address, is quantized afresh; the same input gives the same bytes, so sharing them changes
# nothing. A weak reference keeps the key: when the input is freed, its bytes and scales are
# dropped with it (inside a CUDA-graph capture too, where the blocks go back to the graph pool
# as they would have without the cache). Not under torch.compile tracing (the compiled graph
# does its own common-subexpression elimination), nor for inference tensors (no version counter).
class _LastQuantized:
    def __init__(self) -> None:
        self.key: Optional[Tuple[Any, int, bool]] = None  # (weakref to the input, version, fused)
        self.value: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def clear(self) -> None:
        self.key = self.value = None

    def _dropped(self, ref: Any) -> None:  # the input was freed: its quantization goes too
        if self.key is not None and self.key[0] is ref:
            self.clear()

    def get(self, x: torch.Tensor, fused: bool,
            quantize: Callable[[], Tuple[torch.Tensor, torch.Tensor]]
            ) -> Tuple[torch.Tensor, torch.Tensor]:
        try:
            version = x._version
        except RuntimeError:  # an inference tensor: no version counter, nothing to key on
            return quantize()
        k = self.key
        if k is not None and k[0]() is x and k[1] == version and k[2] == fused:
            return self.value  # type: ignore[return-value]
        value = quantize()
        self.key, self.value = (weakref.ref(x, self._dropped), version, fused), value
        return value


_LAST = _LastQuantized()


class Fp8Linear(nn.Module):
    """Forward-only FP8 replacement of a frozen ``nn.Linear`` (same ``weight`` / ``bias``
    parameters and state-dict keys). The output has autocast's dtype under autocast, else the
    input's. ``use_fast_accum``: Hopper's faster FP8 accumulation (as inference stacks use);
    ``emulate``: run ``fp8_linear_reference`` instead of ``_scaled_mm`` (CPU tests)."""

    def __init__(self, linear: nn.Linear, use_fast_accum: bool = True,
                 emulate: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.use_fast_accum, self.emulate = use_fast_accum, emulate
        self.fused = fused_quantize_available()  # activations in one kernel (quantize_rows_fused)
        self.register_buffer("weight_fp8", None, persistent=False)
        self.register_buffer("weight_scale", None, persistent=False)
        self.register_buffer("bias_bf16", None, persistent=False)  # the GEMM's epilogue bias
        self._version = -1  # the weight version weight_fp8 was made from
        self.fuse_bias = True  # bias added in _scaled_mm's epilogue (False: a separate add)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, e4m3 row-wise")

    def _quantized(self) -> Tuple[torch.Tensor, torch.Tensor]:
        # Under torch.compile tracing (compiled blocks, --compile-frozen) the weight's version
        # counter is not read: frozen weights do not change within a run.
        if self.weight_fp8 is not None and _compiling():
            return self.weight_fp8, self.weight_scale  # quantized by the eager first call
        version = self.weight._version
        if self.weight_fp8 is None or version != self._version:
            with torch.no_grad():
                q, s = quantize_rowwise(self.weight.detach())
            self.weight_fp8, self.weight_scale = q, s.reshape(1, -1).contiguous()
            self.bias_bf16 = (None if self.bias is None
                              else self.bias.detach().to(torch.bfloat16).contiguous())
            self._version = version
        return self.weight_fp8, self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            raise RuntimeError("Fp8Linear is forward-only (frozen layers): its input or weight "
                               "requires grad")
        out_dtype = (torch.get_autocast_gpu_dtype() if x.is_cuda and torch.is_autocast_enabled()
                     else x.dtype)
        if self.emulate:
            return fp8_linear_reference(x, self.weight, self.bias).to(out_dtype)
        wq, ws = self._quantized()
        x2 = x.reshape(-1, self.in_features)
        fused = bool(self.fused and x2.is_cuda and x2.dtype in (torch.bfloat16, torch.float32)
                     and x2.is_contiguous())

        def quantize() -> Tuple[torch.Tensor, torch.Tensor]:
            if fused and not _compiling():
                xb, s = quantize_rows_fused(x2)
                return xb.view(torch.float8_e4m3fn), s
            return quantize_rowwise(x2)

        # Note [Shared activation quantization]
        xq, xs = quantize() if _compiling() else _LAST.get(x, fused, quantize)
        # a [M, K] row-major, b [K, N] column-major (the weight's transpose view); bf16 result:
        # row-wise scaling produces bf16 only. The bias is added in the GEMM's epilogue (in
        # fp32, before the bf16 rounding), one kernel instead of two; a torch without a bias on
        # this path gets the separate add, found once in an eager call.
        if self.bias is not None and self.fuse_bias:
            try:
                y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, bias=self.bias_bf16,
                                     out_dtype=torch.bfloat16, use_fast_accum=self.use_fast_accum)
                return y.to(out_dtype).reshape(*x.shape[:-1], self.out_features)
            except RuntimeError:
                if _compiling() or torch.cuda.is_current_stream_capturing():
                    raise
                self.fuse_bias = False
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16,
                             use_fast_accum=self.use_fast_accum)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(out_dtype).reshape(*x.shape[:-1], self.out_features)


def _swap(module: nn.Module, counts: Dict[str, int], skipped: List[str], prefix: str,
          use_fast_accum: bool, emulate: bool) -> None:
    for name, child in list(module.named_children()):
        full = f"{prefix}.{name}" if prefix else name
        if type(child) is nn.Linear:
            if child.in_features % _ALIGN or child.out_features % _ALIGN:
                counts["kept"] += 1
                skipped.append(f"{full} ({child.in_features}x{child.out_features})")
            else:
                setattr(module, name, Fp8Linear(child, use_fast_accum, emulate))
                counts["fp8"] += 1
        else:
            _swap(child, counts, skipped, full, use_fast_accum, emulate)


def apply_fp8_frozen(model: nn.Module, device: Optional[torch.device] = None,
                     use_fast_accum: bool = True, emulate: bool = False) -> Dict[str, object]:
    """Swaps the ``nn.Linear`` layers of ``model.fp8_modules()`` (frozen, forward-only: the
    vision tower and the frozen LLM layers) for Fp8Linear, in place. Checks the device first
    (Fp8Unsupported) unless ``emulate``. Returns {"fp8": swapped, "kept": left in bf16 because
    a dimension is not a multiple of 16, "kept_layers": their names, "fused": activations quantized by the
    one-kernel quantize_rows_fused}. Refuses (ValueError) a
    module with a trainable parameter: FP8 here has no backward."""
    if not emulate:
        check_fp8_support(device)
    counts = {"fp8": 0, "kept": 0}
    skipped: List[str] = []
    for i, m in enumerate(model.fp8_modules()):  # type: ignore[operator]
        if any(p.requires_grad for p in m.parameters()):
            raise ValueError(f"--fp8-frozen: module {type(m).__name__} #{i} has trainable "
                             "parameters; FP8 layers are forward-only")
        _swap(m, counts, skipped, f"{type(m).__name__}#{i}", use_fast_accum, emulate)
    return {"fp8": counts["fp8"], "kept": counts["kept"], "kept_layers": skipped,
            "fused": fused_quantize_available()}
