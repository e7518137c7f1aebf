"""--fp8-frozen (loongforge.fp8): e4m3 rounding, the fp32 reference, the module swap, the
refusal without FP8 hardware, and (GPU with FP8) _scaled_mm against bf16 and the reference."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from loongforge import fp8  # noqa: E402
from loongforge.models.gr00t import Gr00tPolicy, get_config  # noqa: E402

HAS_FLOAT8 = hasattr(torch, "float8_e4m3fn")
# The stated bound of FP8 (e4m3, row-wise scales) against a higher-precision matmul on random
# normal inputs: 3 mantissa bits give about 2^-4 relative error per element, which the K-long
# sums average down to about 0.03 in Frobenius norm.
REL_BOUND = 0.06


def rel_fro(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def _has_fp8_gpu() -> bool:
    try:
        fp8.check_fp8_support()
        return True
    except fp8.Fp8Unsupported:
        return False


# Guards: the e4m3 emulation (torch < 2.1) rounds to the grid of e4m3 values, ties to even,
# subnormals included: every representable value maps to itself, midpoints go to the even one.
def test_round_e4m3_grid_and_ties():
    grid = []
    for e in range(-6, 9):
        grid += [(1 + m / 8) * 2.0**e for m in range(8)]
    grid += [m * 2.0**-9 for m in range(8)]  # subnormals and zero
    grid = torch.tensor([g for g in grid if g <= fp8.E4M3_MAX])
    assert torch.equal(fp8._round_e4m3(grid), grid)
    assert torch.equal(fp8._round_e4m3(-grid), -grid)
    # Midpoints between 1.0 and 1.125 -> 1.0 (even mantissa), 1.125..1.25 -> 1.25.
    mids = torch.tensor([1.0625, 1.1875, 2.0**-9 * 0.5, 2.0**-9 * 1.5])
    assert torch.equal(fp8._round_e4m3(mids), torch.tensor([1.0, 1.25, 0.0, 2.0**-8]))


# Guards: where torch has float8_e4m3fn, the emulation equals torch's own cast (the reference
# that the CPU tests run on older torch is the same arithmetic as on the GPU).
@pytest.mark.skipif(not HAS_FLOAT8, reason="torch without float8_e4m3fn")
def test_round_e4m3_matches_torch_cast():
    x = torch.randn(4096) * 60
    x = x.clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX)
    assert torch.equal(fp8._round_e4m3(x), x.to(torch.float8_e4m3fn).float())


# Guards: row-wise quantization keeps each row's amax at 448 (scale = amax / 448), so the
# dequantized tensor is within half an e4m3 step of the input.
def test_quantize_rowwise_scale_and_error():
    torch.manual_seed(0)
    x = torch.randn(32, 64) * torch.logspace(-3, 3, 32)[:, None]
    q, s = fp8.quantize_rowwise(x)
    assert s.shape == (32, 1)
    assert torch.allclose(q.float().abs().amax(1), torch.full((32,), fp8.E4M3_MAX))
    deq = q.float() * s
    assert float(((deq - x).abs() / x.abs().amax(1, keepdim=True)).max()) <= 2.0**-4 + 1e-6


# Guards: the fp32 reference of the FP8 linear stays within the stated bound of an fp32 linear
# on random inputs (the bound the GPU test holds _scaled_mm to), and is not exact (it quantizes).
def test_reference_within_bound_of_fp32():
    torch.manual_seed(1)
    x, w, b = torch.randn(3, 40, 256), torch.randn(192, 256) * 0.05, torch.randn(192)
    ref = fp8.fp8_linear_reference(x, w, b)
    exact = torch.nn.functional.linear(x, w, b)
    assert ref.shape == (3, 40, 192)
    err = rel_fro(ref, exact)
    assert 1e-4 < err < REL_BOUND


# Guards: the swap replaces exactly the vision tower's and frozen LLM layers' linears, keeps
# the state-dict keys and values (checkpoints and --resume unchanged) and leaves trainable
# parts alone; the emulated forward stays close to the original model's.
def test_apply_fp8_frozen_swaps_frozen_linears_only():
    torch.manual_seed(0)
    model = Gr00tPolicy(get_config("tiny", image_size=28)).eval()
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    expected = sum(isinstance(m, torch.nn.Linear) for f in model.fp8_modules()
                   for m in f.modules())
    batch = {"images": torch.randn(2, 2, 3, 28, 28), "tokens": torch.randint(0, 100, (2, 6)),
             "attention_mask": torch.ones(2, 6, dtype=torch.bool)}
    with torch.no_grad():
        before = model.backbone(batch["images"], batch["tokens"], batch["attention_mask"])[0]
    r = fp8.apply_fp8_frozen(model, emulate=True)
    assert r["fp8"] + r["kept"] == expected and r["fp8"] > 0
    assert r["kept"] == len(r["kept_layers"])
    swapped = [n for n, m in model.named_modules() if isinstance(m, fp8.Fp8Linear)]
    assert len(swapped) == r["fp8"]
    n_frozen = model.cfg.select_layer - model.cfg.tune_top_llm_layers
    assert all(n.startswith("backbone.vision_model.") or any(
        n.startswith(f"backbone.language_model.layers.{i}.") for i in range(n_frozen))
        for n in swapped)
    after_sd = model.state_dict()
    assert set(after_sd) == set(keys)
    assert all(torch.equal(after_sd[k], v) for k, v in keys.items())
    with torch.no_grad():
        after = model.backbone(batch["images"], batch["tokens"], batch["attention_mask"])[0]
    assert 0 < rel_fro(after, before) < 2 * REL_BOUND  # several FP8 layers in a row


# Guards: FP8 layers are forward-only; a module with a trainable parameter is refused instead
# of silently training through a path without backward.
def test_apply_fp8_frozen_refuses_trainable():
    model = Gr00tPolicy(get_config("tiny", image_size=28))
    model.backbone.vision_model.requires_grad_(True)
    with pytest.raises(ValueError, match="trainable"):
        fp8.apply_fp8_frozen(model, emulate=True)


# Guards: on a machine without FP8 tensor cores (or without CUDA, or an old torch) the check
# refuses with a message that names what is missing.
@pytest.mark.skipif(_has_fp8_gpu(), reason="this machine runs FP8")
def test_check_refuses_without_fp8():
    with pytest.raises(fp8.Fp8Unsupported,
                       match=r"--fp8-frozen needs .*(float8_e4m3fn|CUDA|compute capability)"):
        fp8.check_fp8_support()


@pytest.mark.skipif(not _has_fp8_gpu(), reason="needs a CUDA GPU with FP8 (sm >= 8.9)")
@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("m,k,n", [(64, 256, 512), (1000, 1152, 4304), (17, 2048, 2048)])
def test_scaled_mm_against_bf16_and_reference(m, k, n, fast_accum):
    """Guards: the _scaled_mm path is within the stated bound of a bf16 matmul on random inputs
    and matches the fp32 reference tightly (bf16 output rounding, accumulation order)."""
    torch.manual_seed(m + k + n)
    dev = torch.device("cuda")
    lin = torch.nn.Linear(k, n, device=dev).requires_grad_(False)
    with torch.no_grad():
        lin.weight.mul_(3.0)
    x = torch.randn(m, k, device=dev)
    layer = fp8.Fp8Linear(lin, use_fast_accum=fast_accum)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
        y_bf16 = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert rel_fro(y, y_bf16) < REL_BOUND
    ref = fp8.fp8_linear_reference(x, lin.weight, lin.bias)
    assert rel_fro(y, ref) < 1e-2


# Guards the bias in _scaled_mm's epilogue: taken on this GPU's torch (one kernel), and within
# bf16 rounding of the separate add (the epilogue adds in fp32 before rounding).
@pytest.mark.skipif(not _has_fp8_gpu(), reason="needs a CUDA GPU with FP8 (sm >= 8.9)")
def test_fp8_bias_in_the_gemm_epilogue():
    torch.manual_seed(5)
    lin = torch.nn.Linear(256, 384, device="cuda").requires_grad_(False)
    with torch.no_grad():
        lin.bias.mul_(10.0)
    x = torch.randn(3, 40, 256, device="cuda")
    layer = fp8.Fp8Linear(lin)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        y_fused = layer(x)
        assert layer.fuse_bias and layer.bias_bf16.dtype == torch.bfloat16
        layer.fuse_bias = False
        y_add = layer(x)
    assert y_fused.shape == y_add.shape == (3, 40, 384)
    assert rel_fro(y_fused, y_add) < 1e-2


# Guards Note [Shared activation quantization]: the same input tensor (same version) is quantized
# once for sibling layers; an in-place write, another tensor (even at the same address) or the
# other kernel quantizes afresh; freeing the input drops the cached bytes.
def test_shared_activation_quantization():
    import gc

    cache = fp8._LastQuantized()
    calls = []

    def quantize(t):
        def run():
            calls.append(tuple(t.shape))
            return fp8.quantize_rowwise(t)
        return run

    x = torch.randn(6, 32)
    a = cache.get(x, False, quantize(x))
    assert cache.get(x, False, quantize(x)) is a and len(calls) == 1
    assert cache.get(x, True, quantize(x)) is not a and len(calls) == 2  # the other path
    x.mul_(2.0)  # written in place: its version moves
    b = cache.get(x, True, quantize(x))
    assert len(calls) == 3 and torch.equal(b[1], a[1] * 2)
    y = x.clone()  # equal values, another tensor
    cache.get(y, True, quantize(y))
    assert len(calls) == 4
    del x  # an older input freed: the current entry (y's) stays
    gc.collect()
    assert cache.value is not None
    del y
    gc.collect()
    assert cache.key is None and cache.value is None
    with torch.inference_mode():
        z = torch.randn(2, 16)
    cache.get(z, False, quantize(z))
    cache.get(z, False, quantize(z))
    assert len(calls) == 6 and cache.key is None  # no version counter: never cached


# Guards the sharing inside Fp8Linear on the GPU: three sibling layers on one input quantize it
# once, and give what each gives alone.
@pytest.mark.skipif(not _has_fp8_gpu(), reason="needs a CUDA GPU with FP8 (sm >= 8.9)")
def test_fp8_siblings_quantize_their_input_once(monkeypatch):
    torch.manual_seed(9)
    layers = [fp8.Fp8Linear(torch.nn.Linear(256, 128, device="cuda").requires_grad_(False))
              for _ in range(3)]
    x = torch.randn(64, 256, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        alone = []
        for m in layers:
            fp8._LAST.clear()
            alone.append(m(x))
        fp8._LAST.clear()
        n = {"calls": 0}
        real = fp8.quantize_rows_fused

        def counting(t):
            n["calls"] += 1
            return real(t)

        monkeypatch.setattr(fp8, "quantize_rows_fused", counting)
        shared = [m(x) for m in layers]
    assert n["calls"] == (1 if layers[0].fused else 0)
    assert all(torch.equal(a, b) for a, b in zip(alone, shared))


def _e4m3_values() -> torch.Tensor:
    """The float value of every e4m3fn byte (NaN for 0x7F and 0xFF)."""
    out = []
    for b in range(256):
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m * 2.0**-9
        else:
            v = (1 + m / 8) * 2.0**(e - 7)
        out.append(-v if b & 0x80 else v)
    return torch.tensor(out)


def _rows(r, c, dtype, device="cpu", seed=0):
    """Random rows spread over many binades (each row its own magnitude), one all-zero row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, c, generator=g) * torch.exp2(torch.randint(-20, 20, (r, 1), generator=g))
    x[min(1, r - 1)] = 0
    return x.to(dtype).to(device)


# Guards the one-kernel quantization (Note [Row-wise e4m3 quantization]) on the CPU twin: its
# bytes decode to quantize_rowwise's values and its scales are quantize_rowwise's, exactly, for
# bf16 and fp32 rows; bad tensors are refused by name.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r,c", [(1, 1), (7, 17), (33, 1152)])
def test_fused_quantize_matches_quantize_rowwise_cpu(dtype, r, c):
    x = _rows(r, c, dtype, seed=r * c)
    q, s = fp8.quantize_rows_fused(x)
    ref_q, ref_s = fp8.quantize_rowwise(x)
    assert q.dtype == torch.uint8 and q.shape == (r, c) and s.shape == (r, 1)
    assert torch.equal(s, ref_s)
    assert torch.equal(_e4m3_values()[q.long()], ref_q.float())
    with pytest.raises(ValueError, match="'x'"):
        fp8.quantize_rows_fused(x.to(torch.float64))
    with pytest.raises(ValueError, match="2-d"):
        fp8.quantize_rows_fused(x.reshape(1, r, c))


# Guards the CUDA kernel against torch's own ops on the GPU: the same bytes (float8_e4m3fn) and
# scales, bit for bit, and an Fp8Linear forward with the kernel equal to one with the torch ops.
@pytest.mark.skipif(not _has_fp8_gpu(), reason="needs a CUDA GPU with FP8 (sm >= 8.9)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r,c", [(1, 16), (513, 1152), (4096, 4304), (9, 48)])
def test_fused_quantize_matches_torch_ops_gpu(dtype, r, c):
    x = _rows(r, c, dtype, "cuda", seed=r + c)
    q, s = fp8.quantize_rows_fused(x)
    ref_q, ref_s = fp8.quantize_rowwise(x)
    assert torch.equal(q, ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
    lin = torch.nn.Linear(c, 64, device="cuda").requires_grad_(False)
    layer = fp8.Fp8Linear(lin)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        layer.fused = True
        y_fused = layer(x)
        layer.fused = False
        y_torch = layer(x)
    assert torch.equal(y_fused, y_torch)
