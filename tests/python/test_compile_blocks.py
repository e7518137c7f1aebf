"""Note [Compiled blocks]: every block kind that --compile-blocks compiles against its eager
definition, forward and backward, on random shapes under bf16 autocast (GPU, torch.compile); one
compilation serves every layer of a kind."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from loongforge.models.gr00t import (BasicTransformerBlock, Gr00tPolicy, QwenDecoderLayer,
                                     SiglipEncoderLayer, get_config, rope_cos_sin)
from loongforge.trainer.compile import compile_blocks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not hasattr(torch, "compile"),
                                reason="needs a CUDA device and torch.compile")


def _pair(seed: int = 0, backend="inductor"):
    """(eager, compiled) copies of one tiny policy on the GPU, in training mode."""
    torch.manual_seed(seed)
    eager = Gr00tPolicy(get_config("tiny", image_size=56)).cuda().train()
    comp = copy.deepcopy(eager)
    status = compile_blocks(comp, backend=backend)
    return eager, comp, status


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error of a against b, in the Frobenius norm, in fp32."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _blocks(m: Gr00tPolicy, kind: str):
    lm = m.backbone.language_model
    n_frozen = m.cfg.select_layer - m.cfg.tune_top_llm_layers
    return {"siglip": m.backbone.vision_model.encoder.layers[0],
            "qwen_frozen": lm.layers[0],
            "qwen": lm.layers[n_frozen],
            "dit_cross": m.action_head.model.transformer_blocks[0],
            "dit_self": m.action_head.model.transformer_blocks[1],
            "vl_self": m.action_head.vl_self_attention.transformer_blocks[0]}[kind]


def _inputs(m: Gr00tPolicy, kind: str, rng: random.Random):
    """Random inputs of random shapes for one block kind: (args, the input needing a gradient)."""
    cfg, b = m.cfg, rng.randint(2, 5)
    if kind == "siglip":
        x = torch.randn(b, rng.choice((16, 24)), cfg.vit_dim, device="cuda")
        return (x,), None
    if kind.startswith("qwen"):
        n = rng.randint(5, 40)
        x = torch.randn(b, n, cfg.llm_dim, device="cuda", requires_grad=kind == "qwen")
        cos, sin = rope_cos_sin(torch.arange(n, device="cuda"), cfg.llm_head_dim, cfg.rope_theta,
                                torch.float32)
        mask = torch.ones(b, 1, 1, n, dtype=torch.bool, device="cuda")
        mask[0, ..., n - rng.randint(1, 4):] = False  # padded keys in one sample
        return (x, cos, sin, mask), (x if kind == "qwen" else None)
    d, n = cfg.dit_dim, rng.randint(5, 40)
    x = torch.randn(b, 17 if kind.startswith("dit") else n, d, device="cuda", requires_grad=True)
    mask = torch.ones(b, n, dtype=torch.bool, device="cuda")
    mask[-1, n - rng.randint(1, 4):] = False
    if kind == "vl_self":
        return (x, None, None, mask), x
    temb = torch.randn(b, d, device="cuda", requires_grad=True)
    ctx = torch.randn(b, n, d, device="cuda", requires_grad=True) if kind == "dit_cross" else None
    return (x, temb, ctx, mask), x


def _run(block, args, grad_out_seed: int):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = block(*args)
    g = torch.randn(y.shape, generator=torch.Generator("cuda").manual_seed(grad_out_seed),
                    device="cuda", dtype=y.dtype)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    params = [p for p in block.parameters() if p.requires_grad]
    if not leaves and not params:
        return y.detach(), []
    grads = torch.autograd.grad(y, leaves + params, g)
    return y.detach(), list(grads)


# Guards each compiled block kind against its eager definition: outputs, input gradients and
# parameter gradients agree to bf16 rounding, over random batch sizes and sequence lengths (each
# new shape compiles anew: dynamic=False), frozen layers forward only.
@pytest.mark.parametrize("kind", ["siglip", "qwen_frozen", "qwen", "dit_cross", "dit_self",
                                  "vl_self"])
def test_compiled_block_matches_eager(kind):
    eager, comp, _ = _pair()
    be, bc = _blocks(eager, kind), _blocks(comp, kind)
    assert "forward" in vars(bc) and "forward" not in vars(be)  # compiled in place
    rng = random.Random(sum(map(ord, kind)))
    for trial in range(2):
        args, _ = _inputs(eager, kind, rng)
        args_c = tuple(a.detach().clone().requires_grad_(a.requires_grad)
                       if isinstance(a, torch.Tensor) else a for a in args)
        ye, ge = _run(be, args, trial)
        yc, gc_ = _run(bc, args_c, trial)
        assert ye.shape == yc.shape and ye.dtype == yc.dtype
        assert _rel(yc, ye) < 1e-2, (kind, trial, _rel(yc, ye))
        assert len(ge) == len(gc_)
        for i, (a, b) in enumerate(zip(gc_, ge)):
            assert _rel(a, b) < 3e-2, (kind, trial, i, tuple(b.shape), _rel(a, b))


# Guards the whole policy with compiled blocks: loss and every trainable gradient agree with the
# eager policy's under bf16 autocast, and one compilation serves every layer of a kind (far fewer
# graphs than compiled blocks).
def test_compiled_policy_matches_eager_with_one_graph_per_kind():
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    dynamo.reset()  # the block tests above compiled the same code with plain inductor
    counter = CompileCounterWithBackend("inductor")  # counts the graphs handed to inductor
    eager, comp, status = _pair(1, backend=counter)
    n_blocks = sum(isinstance(m, (SiglipEncoderLayer, QwenDecoderLayer, BasicTransformerBlock))
                   for m in comp.modules())
    assert status.startswith("on (") and str(eager.cfg.vit_layers) + " vision" in status, status
    g = torch.Generator().manual_seed(3)
    b, n = 3, 11
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, n - 3:] = False
    batch = {"images": torch.randn(b, 2, 3, 56, 56, generator=g),
             "tokens": torch.randint(1, 200, (b, n), generator=g) * mask,
             "attention_mask": mask, "state": torch.randn(b, 6, generator=g),
             "action": torch.randn(b, 16, 5, generator=g),
             "action_mask": torch.ones(b, 16, dtype=torch.bool)}
    batch = {k: v.cuda() for k, v in batch.items()}
    out = {}
    for name, m in (("eager", eager), ("compiled", comp)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            r = m(batch, generator=torch.Generator("cuda").manual_seed(5))
        r["loss"].backward()
        out[name] = (r["loss"].detach(), [p.grad for p in m.parameters() if p.requires_grad])
    (le, ge), (lc, gc_) = out["eager"], out["compiled"]
    assert abs(float(lc - le)) <= 1e-2 * abs(float(le)), (float(lc), float(le))
    flat_e = torch.cat([x.float().flatten() for x in ge])
    flat_c = torch.cat([x.float().flatten() for x in gc_])
    assert _rel(flat_c, flat_e) < 3e-2, _rel(flat_c, flat_e)
    # One graph per block kind, not one per block, and no graph breaks inside a block: siglip,
    # frozen qwen, trainable qwen twice (the first reads the frozen layers' output, which needs
    # no gradient; the next one's does), dit cross, dit self, vl self-attention and mlp1: 8 for
    # 13 blocks and the projector.
    assert counter.frame_count == 8 < n_blocks, (counter.frame_count, n_blocks)
