"""Note [Optimizer state up front] (trainer/optim.py): AdamW's state made before the first step
trains exactly as AdamW's lazily made state."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from loongforge.memory import init_optimizer_state
from loongforge.trainer.optim import make_optimizer

torch.set_num_threads(1)


def _model(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))
    m[0].bias.requires_grad_(False)  # a frozen parameter gets no state
    return m


def _train(model, opt, steps=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# Guards: the up-front state (made by a zero-gradient, lr-0 step, then zeroed) changes no
# parameter, gives every trainable parameter a zeroed state, restores lr and gradients, and the
# following steps match a fresh optimizer's bit for bit.
@pytest.mark.parametrize("impl", ["auto", "foreach"])
def test_up_front_state_trains_bitwise_like_lazy_state(impl):
    args = SimpleNamespace(lr=1e-2, weight_decay=0.1, adamw=impl)
    ref_model, model = _model(), _model()
    ref_opt = make_optimizer([p for p in ref_model.parameters() if p.requires_grad], args,
                             torch.device("cpu"))
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], args,
                         torch.device("cpu"))
    before = [p.detach().clone() for p in model.parameters()]
    entered = []

    @contextlib.contextmanager
    def persistent():
        entered.append(True)
        yield

    assert init_optimizer_state(opt, persistent) == 3 and entered
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert opt.param_groups[0]["lr"] == 1e-2
    for st in opt.state.values():
        assert st and all(not torch.is_tensor(v) or not v.any() for v in st.values()), st
    ref = _train(ref_model, ref_opt)
    got = _train(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert float(opt.state[model[2].weight]["step"]) == 4.0
