"""Note [The persistent arena] (memory.py): parameters, buffers and AdamW's state laid out in two
planned allocations train exactly as the same tensors allocated one by one."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from loongforge.memory import (ARENA_ALIGN, adamw_state_in_arena, arena_layout,
                               init_optimizer_state, pack_into_arena, state_back_into_place)
from loongforge.trainer.optim import make_optimizer

torch.set_num_threads(1)


def _model(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    m[0].bias.requires_grad_(False)  # frozen: packed, but no optimizer state
    m.register_buffer("scale", torch.full((3,), 0.5))
    return m


def _forward(m, x):
    return m(x) * m.scale


def _train(model, opt, steps=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(_forward(model, x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _storage(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _arena_alloc(made):
    def alloc(n):
        made.append(n)
        return torch.full((n,), 0xAB, dtype=torch.uint8)  # garbage: the code must zero/copy
    return alloc


# Guards the layout: back to back, each start aligned, the total covering the last tensor; a
# non-power-of-two alignment is refused.
def test_layout_is_aligned_and_back_to_back():
    ts = [torch.empty(3), torch.empty(200, dtype=torch.bfloat16), torch.empty(()), torch.empty(129)]
    offs = arena_layout(ts)
    assert offs[0] == 0 and all(o % ARENA_ALIGN == 0 for o in offs)
    for t, a, b in zip(ts, offs, offs[1:]):
        assert b - a == -(-t.numel() * t.element_size() // ARENA_ALIGN) * ARENA_ALIGN
    with pytest.raises(ValueError, match="power of two"):
        arena_layout(ts, align=48)


# Guards packing: every parameter and buffer keeps its identity, values, dtype, shape and
# requires_grad, all share one storage, and a model trained after packing ends bit for bit where
# the same model trained unpacked ends.
def test_packed_model_trains_bitwise_like_unpacked():
    ref, m = _model(), _model()
    ids = [id(p) for p in m.parameters()]
    made = []
    arena = pack_into_arena(list(m.parameters()) + list(m.buffers()), torch.device("cpu"),
                            alloc=_arena_alloc(made))
    assert made == [arena.numel()]
    assert [id(p) for p in m.parameters()] == ids
    for a, b in zip(ref.state_dict().values(), m.state_dict().values()):
        assert torch.equal(a, b) and a.dtype == b.dtype
    assert {_storage(t) for t in list(m.parameters()) + list(m.buffers())} == {_storage(arena)}
    assert not m[0].bias.requires_grad and m[0].weight.requires_grad
    args = SimpleNamespace(lr=1e-2, weight_decay=0.1, adamw="auto")
    opts = [make_optimizer([p for p in x.parameters() if p.requires_grad], args,
                           torch.device("cpu")) for x in (ref, m)]
    assert all(torch.equal(a, b) for a, b in zip(_train(ref, opts[0]), _train(m, opts[1])))
    assert {_storage(p) for p in m.parameters()} == {_storage(arena)}  # still in place


# Guards the state arena: the trainer's up-front state made in one allocation (the moments as its
# views, zeroed though the allocation held garbage) trains bit for bit like AdamW's own lazily
# made state, with the same state keys in the same order.
@pytest.mark.parametrize("impl", ["auto", "foreach"])
def test_state_arena_trains_bitwise_like_lazy_state(impl):
    args = SimpleNamespace(lr=1e-2, weight_decay=0.1, adamw=impl)
    ref, m = _model(), _model()
    ref_opt, opt = (make_optimizer([p for p in x.parameters() if p.requires_grad], args,
                                   torch.device("cpu")) for x in (ref, m))
    made = []
    assert init_optimizer_state(opt, contextlib.nullcontext,
                                arena_alloc=_arena_alloc(made)) == 5
    assert len(made) == 1
    moments = [v for st in opt.state.values() for k, v in st.items() if k != "step"]
    assert len(moments) == 10 and len({_storage(v) for v in moments}) == 1
    assert all(not v.any() for st in opt.state.values() for v in st.values())
    ref_state = _train(ref, ref_opt)
    assert all(torch.equal(a, b) for a, b in zip(ref_state, _train(m, opt)))
    assert [list(s) for s in ref_opt.state.values()] == [list(s) for s in opt.state.values()]
    assert len({_storage(v) for st in opt.state.values() for k, v in st.items()
                if k != "step"}) == 1  # the steps wrote into the arena, not new tensors


# Guards resume with the arena: load_state_dict makes new state tensors; they are copied back
# into the arena's, which stay the optimizer's, with the loaded values.
def test_loaded_state_goes_back_into_the_arena():
    args = SimpleNamespace(lr=1e-2, weight_decay=0.1, adamw="auto")
    src = _model()
    src_opt = make_optimizer([p for p in src.parameters() if p.requires_grad], args,
                             torch.device("cpu"))
    _train(src, src_opt, steps=2)
    sd = src_opt.state_dict()
    m = _model()
    opt = make_optimizer([p for p in m.parameters() if p.requires_grad], args, torch.device("cpu"))
    init_optimizer_state(opt, contextlib.nullcontext, arena_alloc=_arena_alloc([]))
    arena_ptr = {_storage(v) for st in opt.state.values() for k, v in st.items() if k != "step"}
    before = {p: dict(s) for p, s in opt.state.items()}
    opt.load_state_dict(sd)
    assert state_back_into_place(opt, before) == 15  # 5 parameters x (step, exp_avg, exp_avg_sq)
    assert {_storage(v) for st in opt.state.values() for k, v in st.items()
            if k != "step"} == arena_ptr
    for (p, st), ref in zip(opt.state.items(), src_opt.state.values()):
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(st[k], ref[k]) and st[k] is before[p][k]


# Guards what the state arena refuses: optimizers whose state it does not know.
def test_state_arena_refuses_other_optimizers():
    m = _model()
    ps = [p for p in m.parameters() if p.requires_grad]
    with pytest.raises(ValueError, match="SGD"):
        adamw_state_in_arena(torch.optim.SGD(ps, lr=0.1), None)
    with pytest.raises(ValueError, match="amsgrad"):
        adamw_state_in_arena(torch.optim.AdamW(ps, amsgrad=True), None)
