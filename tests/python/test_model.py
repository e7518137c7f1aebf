"""GR00T-N1.6-shaped policy: shapes, frozen split, flow-matching loss, MoE, sizes, safetensors."""
from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from loongforge.models import gr00t
from loongforge.models.gr00t import (Gr00tPolicy, count_parameters, get_config, load_safetensors,
                                     read_safetensors, save_safetensors)

torch.set_num_threads(1)  # the shared 2-core CI box: one thread avoids OpenMP spinning


def make_batch(b: int = 2, k: int = 2, size: int = 56, length: int = 9, state_dim: int = 6,
               action_dim: int = 5, horizon: int = 16, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, length, dtype=torch.bool)
    mask[0, length - 3:] = False
    amask = torch.ones(b, horizon, dtype=torch.bool)
    amask[1, 10:] = False
    return {"images": torch.randn(b, k, 3, size, size, generator=g),
            "tokens": torch.randint(1, 200, (b, length), generator=g) * mask,
            "attention_mask": mask, "state": torch.randn(b, state_dim, generator=g),
            "action": torch.randn(b, horizon, action_dim, generator=g), "action_mask": amask}


def tiny(**kw) -> Gr00tPolicy:
    torch.manual_seed(0)
    return Gr00tPolicy(get_config("tiny", image_size=56, **kw)).train()


# Guards: the forward path, the vision-token count and the frozen/trainable split.
def test_forward_backward_frozen_split():
    m = tiny()
    batch = make_batch()
    ctx, mask = m.encode(batch)
    cfg = m.cfg
    assert cfg.tokens_per_image == 4  # (56/14)^2 patches, pixel-shuffled 4 -> 1
    assert ctx.shape == (2, 2 * 4 + 9, cfg.dit_dim) and mask.shape == (2, 17)
    out = m(batch, generator=torch.Generator().manual_seed(1))
    assert set(out) == {"loss", "fm_loss"} and torch.isfinite(out["loss"])
    out["loss"].backward()
    frozen = {id(p) for mod in m.frozen_modules() for p in mod.parameters()}
    lm = m.backbone.language_model
    assert len(lm.layers) == cfg.select_layer
    for name, p in m.named_parameters():
        if id(p) in frozen:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None, name
    # Top tune_top_llm_layers layers train, the rest are frozen with the vision tower.
    n_frozen = cfg.select_layer - cfg.tune_top_llm_layers
    assert all(not p.requires_grad for p in lm.layers[n_frozen - 1].parameters())
    assert all(p.requires_grad for p in lm.layers[n_frozen].parameters())
    assert all(not p.requires_grad for p in m.backbone.vision_model.parameters())
    assert not m.backbone.vision_model.training  # frozen parts stay in eval mode
    act = m.get_action(batch, action_dim=5, generator=torch.Generator().manual_seed(0))
    assert act.shape == (2, 16, 5)


# Guards: the loss is the MSE on velocity = action - noise over valid steps and real action dims.
def test_loss_masks_steps_and_padded_dims(monkeypatch):
    m = tiny()
    batch = make_batch()
    pred = torch.randn(2, 16, m.cfg.max_action_dim)
    monkeypatch.setattr(m.action_head, "velocity", lambda *a, **k: pred)
    loss = m(batch, generator=torch.Generator().manual_seed(3))["loss"]
    g = torch.Generator().manual_seed(3)
    noise = torch.randn(2, 16, m.cfg.max_action_dim, generator=g)
    action = torch.nn.functional.pad(batch["action"], (0, m.cfg.max_action_dim - 5))
    err = (pred - (action - noise)) ** 2
    mask = batch["action_mask"][:, :, None].float() * (torch.arange(m.cfg.max_action_dim) < 5)
    assert torch.allclose(loss, (err * mask).sum() / mask.sum(), rtol=1e-5)
    assert float(mask.sum()) == (16 + 10) * 5


# Guards: text padding positions must not leak into the VL context of the real tokens.
def test_padding_tokens_do_not_change_valid_outputs():
    m = tiny().eval()
    batch = make_batch()
    ctx0, _ = m.encode(batch)
    b2 = dict(batch)
    tok = batch["tokens"].clone()
    tok[0, -3:] = 77  # change padded (masked) token ids
    b2["tokens"] = tok
    ctx1, _ = m.encode(b2)
    valid = 8 + 6  # image tokens + sample 0's valid text tokens
    assert torch.allclose(ctx0[0, :valid], ctx1[0, :valid], atol=1e-5)


# Guards: GR00T's time convention: s ~ Beta(1.5, 1), t = (0.999 - s) / 0.999, biased to noise.
def test_sample_time_distribution():
    m = tiny()
    t = m.sample_time(20000, torch.device("cpu"), torch.Generator().manual_seed(0))
    s = 0.999 - 0.999 * t
    assert abs(float(s.mean()) - 1.5 / 2.5) < 0.01  # Beta(1.5, 1) mean 0.6
    assert float(t.max()) <= 1.0 + 1e-6 and float(t.min()) > -0.002


# Guards: the model can fit a fixed batch (loss falls), i.e. gradients reach the right places.
def test_overfit_fixed_batch():
    m = tiny()
    batch = make_batch()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(15):
        out = m(batch, generator=torch.Generator().manual_seed(5))  # fixed noise and t
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(float(out["loss"]))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert min(losses[-3:]) < 0.6 * losses[0], losses


# Guards: n16 is the advertised size (about 3B total, 1.7B trainable), counted on the meta device.
def test_n16_parameter_counts_without_allocating():
    c = count_parameters(get_config("n16"))
    assert 2.8e9 < c["total"] < 3.2e9, c
    assert 1.6e9 < c["trainable"] < 1.8e9, c
    cfg = get_config("n16")
    assert cfg.dit_layers == 32 and cfg.dit_dim == 1536 and cfg.dit_heads == 32
    assert cfg.tokens_per_image == 64 and cfg.action_horizon == 16 and cfg.max_action_dim == 128
    moe = count_parameters(get_config("n16-moe"))
    assert moe["dit"] > 2 * c["dit"] and moe["total"] <= 6.5e9  # 16 quarter-width experts
    m = Gr00tPolicy(get_config("n16-moe"), device="meta")
    assert len(m.moe_layers()) == 32 and m.moe_layers()[0].num_experts == 16


# Guards: top-2 routing (each token to exactly 2 experts, gate-weighted), counts and aux loss.
def test_moe_routing_top2_and_balance_loss():
    torch.manual_seed(0)
    ff = gr00t.MoEFeedForward(16, 2, experts=4, top_k=2)
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = ff(x)
    assert y.shape == x.shape
    assert int(ff.last_expert_counts.sum()) == 15 * 2
    # Reference: dense evaluation of every expert, combined with the renormalized top-2 gates.
    flat = x.reshape(-1, 16)
    probs = torch.softmax(ff.router(flat), -1)
    w, idx = probs.topk(2, -1)
    w = w / w.sum(-1, keepdim=True)
    ref = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        for j in range(2):
            ref[n] += w[n, j] * ff.experts[int(idx[n, j])](flat[n: n + 1])[0]
    assert torch.allclose(y.reshape(-1, 16), ref, atol=1e-5)
    assert torch.equal(ff.last_expert_counts, torch.bincount(idx.flatten(), minlength=4))
    aux = ff.last_aux_loss
    assert torch.isfinite(aux) and float(aux) >= 0.99  # E * sum f*P >= ~1, 1 when balanced
    (y.sum() + aux).backward()
    assert ff.router.weight.grad is not None and ff.router.weight.grad.abs().sum() > 0
    m = tiny(moe_experts=4, moe_top_k=2)
    out = m(make_batch(), generator=torch.Generator().manual_seed(0))
    assert "aux_loss" in out and torch.isfinite(out["loss"])
    counts = m.expert_token_counts()
    assert len(counts) == m.cfg.dit_layers
    assert all(int(c.sum()) == 2 * 2 * 17 for c in counts.values())  # B * (1 + T) tokens, top-2


# Guards: the manual attention fallback honours the boolean mask and causality.
def test_attention_mask_and_causal():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8, generator=g) for _ in range(3))
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])[:, None, None]
    gr00t.set_manual_attention(True)
    try:
        o = gr00t.attention(q, k, v, mask=mask)
        v2 = v.clone()
        v2[0, :, 2:] = 1e3  # masked keys' values must not matter
        assert torch.allclose(o, gr00t.attention(q, k, v2, mask=mask))
        oc = gr00t.attention(q, k, v, causal=True)
        ref = torch.softmax(q[..., :1, :] @ k[..., :1, :].transpose(-1, -2) / 8**0.5, -1) @ v[..., :1, :]
        assert torch.allclose(oc[..., :1, :], ref, atol=1e-6)  # first query sees only key 0
    finally:
        gr00t.set_manual_attention(False)
    if gr00t.HAS_SDPA:  # torch >= 2.0: both paths agree
        gr00t.set_manual_attention(True)
        ref = gr00t.attention(q, k, v, mask=mask, causal=True)
        gr00t.set_manual_attention(False)
        assert torch.allclose(gr00t.attention(q, k, v, mask=mask, causal=True), ref, atol=1e-5)


# Guards: the safetensors parser reads the documented layout (a file written by hand here).
def test_safetensors_reads_hand_written_file(tmp_path):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    da, db = a.numpy().tobytes(), b.view(torch.int16).numpy().tobytes()
    header = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, len(da)]},
              "b": {"dtype": "BF16", "shape": [2], "data_offsets": [len(da), len(da) + len(db)]},
              "__metadata__": {"format": "pt"}}
    h = json.dumps(header).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + da + db)
    t, meta = read_safetensors(str(p))
    assert torch.equal(t["a"], a) and torch.equal(t["b"], b) and meta == {"format": "pt"}
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(h)) + h + da)  # truncated data
    with pytest.raises(ValueError, match="'b'"):
        read_safetensors(str(bad))
    with pytest.raises(ValueError, match="header length"):
        (tmp_path / "c.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
        read_safetensors(str(tmp_path / "c.safetensors"))


# Guards: save -> load round trip into a differently initialised model, with key reporting.
def test_safetensors_round_trip_and_key_report(tmp_path):
    src = tiny()
    sd = {k: v for k, v in src.state_dict().items()}
    sd["extra.weight"] = torch.zeros(3)
    dropped = "action_head.position_embedding.weight"
    del sd[dropped]
    # A GR00T-style name must be mapped back by the prefix table.
    sd["backbone.eagle_model.mlp1.1.weight"] = sd.pop("backbone.mlp1.1.weight")
    path = str(tmp_path / "m.safetensors")
    save_safetensors(sd, path, {"config": "tiny"})
    torch.manual_seed(123)
    dst = Gr00tPolicy(get_config("tiny", image_size=56))
    rep = load_safetensors(dst, path)
    assert rep["missing"] == [dropped] and rep["unexpected"] == ["extra.weight"]
    for k, v in src.state_dict().items():
        if k != dropped:
            assert torch.equal(dst.state_dict()[k], v), k
    with pytest.raises(ValueError, match="missing"):
        load_safetensors(dst, path, strict=True)
    assert os.path.getsize(path) > 4 * sum(p.numel() for p in src.parameters()) * 0.9


# Guards: the text bound the trainer cuts to cannot be configured away:
# a zero or negative max_text_tokens (or vocab_size) is refused with the field named.
def test_config_refuses_nonpositive_text_bounds():
    assert get_config("tiny").max_text_tokens > 0
    with pytest.raises(ValueError, match="max_text_tokens"):
        get_config("tiny", max_text_tokens=0)
    with pytest.raises(ValueError, match="vocab_size"):
        get_config("tiny", vocab_size=0)


# Guards --frozen-bf16: storing the frozen linear/conv weights in bf16 changes nothing under bf16
# autocast (autocast casts them to bf16 on every call anyway), bit for bit, layer by layer here
# (torch's CPU autocast runs LayerNorm in bf16, so the whole model only on the GPU, below); norms
# and embeddings keep fp32, trainable layers are untouched, and the bytes saved are counted.
def test_frozen_linear_bf16_same_layers_under_autocast():
    a, b = tiny(), tiny()
    layers, saved = b.frozen_linear_to(torch.bfloat16)
    pairs = [(sa, sb) for ma, mb in zip(a.frozen_modules(), b.frozen_modules())
             for sa, sb in zip(ma.modules(), mb.modules())
             if type(sa) in (torch.nn.Linear, torch.nn.Conv2d)]
    assert layers == len(pairs) > 0
    assert saved == sum(p.numel() * 2 for sa, _ in pairs for p in sa.parameters())
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert pb.dtype == (torch.bfloat16 if pa.dtype != pb.dtype else pa.dtype), name
        assert pb.dtype == torch.float32 or not pb.requires_grad, name
    assert b.backbone.language_model.embed_tokens.weight.dtype == torch.float32
    assert b.backbone.vision_model.post_layernorm.weight.dtype == torch.float32
    g = torch.Generator().manual_seed(3)
    for sa, sb in pairs:
        shape = ((2, 3, 28, 28) if isinstance(sa, torch.nn.Conv2d) else (5, sa.in_features))
        x = torch.randn(shape, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ya, yb = sa(x), sb(x)
        assert ya.dtype == yb.dtype == torch.bfloat16 and torch.equal(ya, yb)
    assert b.frozen_linear_to(torch.bfloat16) == (layers, 0)  # already bf16: nothing more


# Guards the same on the GPU for the whole model: loss and every gradient bit for bit.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_frozen_linear_bf16_same_model_under_cuda_autocast():
    a, b = tiny().cuda(), tiny().cuda()
    b.frozen_linear_to(torch.bfloat16)
    batch = {k: v.cuda() for k, v in make_batch().items()}
    losses = []
    for m in (a, b):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(batch, generator=torch.Generator("cuda").manual_seed(1))
        out["loss"].backward()
        losses.append(out["loss"].detach())
    assert torch.equal(losses[0], losses[1])
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        if pa.requires_grad:
            assert torch.equal(pa.grad, pb.grad), name


# Guards shared_autocast_input: one cast for sibling linear layers gives each the bits it gets
# from autocast's own cast of the fp32 input, and it stays out of the way wherever that would not
# hold exactly (input needs grad, autocast off, a consumer that is not a plain nn.Linear,
# switched off).
def test_shared_autocast_input_same_bits_and_only_when_exact():
    from loongforge.models import gr00t_layers as L

    torch.manual_seed(4)
    lins = [torch.nn.Linear(24, 16).requires_grad_(False) for _ in range(3)]
    x = torch.randn(5, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert L.shared_autocast_input(x, *lins) is x  # off unless switched on
        L.set_shared_casts(True)
        try:
            xs = L.shared_autocast_input(x, *lins)
            assert xs.dtype == torch.bfloat16
            for lin in lins:
                assert torch.equal(lin(xs), lin(x))
            assert L.shared_autocast_input(x.requires_grad_(True), *lins) is x
            x.requires_grad_(False)
            assert L.shared_autocast_input(x, lins[0], torch.nn.Identity()) is x
        finally:
            L.set_shared_casts(False)
    L.set_shared_casts(True)
    try:
        assert L.shared_autocast_input(x, *lins) is x  # autocast off
    finally:
        L.set_shared_casts(False)


# Guards the same inside the whole model on the GPU: loss and every gradient bit for bit with the
# shared casts on and off.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shared_autocast_input_same_model_on_gpu():
    from loongforge.models import gr00t_layers as L

    m = tiny().cuda()
    batch = {k: v.cuda() for k, v in make_batch().items()}
    runs = []
    for shared in (True, False):
        L.set_shared_casts(shared)
        try:
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(batch, generator=torch.Generator("cuda").manual_seed(1))
            out["loss"].backward()
        finally:
            L.set_shared_casts(False)
        runs.append((out["loss"].detach(), [p.grad.clone() for p in m.parameters()
                                            if p.requires_grad]))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def _grads_with_norm_recompute(m, batch, flag, device="cpu", autocast=None):
    from loongforge.models import gr00t_layers as L

    L.set_norm_recompute(flag)
    try:
        m.zero_grad(set_to_none=True)
        ctx = (torch.autocast(device, dtype=autocast) if autocast is not None
               else torch.autocast(device, enabled=False))
        with ctx:
            out = m(batch, generator=torch.Generator(device).manual_seed(1))
        out["loss"].backward()
    finally:
        L.set_norm_recompute(False)
    return out["loss"].detach(), [p.grad.clone() for p in m.parameters() if p.requires_grad]


# Guards Note [Recomputed norms]: with the trainable RMSNorms recomputed in backward, the loss and
# every gradient are the same bits as without (fp32 here; bf16 autocast in the GPU test below:
# torch 1.13's CPU autocast cannot run the model); the switch is off by default; frozen norms
# (no gradient through them) run as they are.
def test_norm_recompute_same_bits(autocast=None):
    from loongforge.models import gr00t_layers as L

    assert not L._recompute_norms
    m = tiny()
    batch = make_batch()
    a = _grads_with_norm_recompute(m, batch, True, autocast=autocast)
    b = _grads_with_norm_recompute(m, batch, False, autocast=autocast)
    assert torch.equal(a[0], b[0])
    assert len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))
    calls = []
    norm = m.backbone.language_model.layers[0].input_layernorm  # a frozen layer's norm
    L.set_norm_recompute(True)
    try:
        import torch.utils.checkpoint as cp
        real = cp.checkpoint
        cp.checkpoint = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            norm(torch.randn(2, 3, m.cfg.llm_dim))
            assert not calls  # nothing needs a gradient there: no checkpoint
            m.backbone.language_model.layers[-1].input_layernorm(
                torch.randn(2, 3, m.cfg.llm_dim))
            assert calls == [1]
            # in the model: each trainable LLM layer's four norms and SwiGLU, and the final norm
            del calls[:]
            m(batch, generator=torch.Generator().manual_seed(1))
            cfg = m.cfg
            assert len(calls) == cfg.tune_top_llm_layers * ((4 if cfg.qk_norm else 2) + 1) + 1
        finally:
            cp.checkpoint = real
    finally:
        L.set_norm_recompute(False)


# Guards the memory the recompute saves, on the GPU: the trainable LLM layers' forward keeps
# less (their norms' fp32 outputs are not kept), and the gradients are the same bits.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_norm_recompute_keeps_less_on_gpu():
    m = tiny(llm_dim=256, llm_mlp=512).cuda()
    batch = {k: v.cuda() for k, v in make_batch(b=16, length=40).items()}
    kept = {}
    for flag in (False, True):
        from loongforge.models import gr00t_layers as L

        L.set_norm_recompute(flag)
        try:
            m.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(batch, generator=torch.Generator("cuda").manual_seed(1))
            torch.cuda.synchronize()
            kept[flag] = torch.cuda.memory_allocated() - before
            out["loss"].backward()
        finally:
            L.set_norm_recompute(False)
        kept[(flag, "grads")] = [p.grad.clone() for p in m.parameters() if p.requires_grad]
    assert kept[True] < kept[False], kept
    assert all(torch.equal(x, y) for x, y in zip(kept[(True, "grads")], kept[(False, "grads")]))
