"""loongforge.Forge on real parts (CPU; one GPU test): a user's small CNN+MLP policy trained
through Forge against a plain PyTorch loop with the same seed and data, checkpoint resume against
an uninterrupted run (a packed DB through DataFusionLoader and a plain list of batches), the
non-finite step skip, and misuse raising ForgeError with a message that says what to do."""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import loongforge as lf  # noqa: E402
from lf_testdb import has_datafusion  # noqa: E402

CAMS, IMG, STATE, HORIZON, ACT = 2, 16, 8, 4, 7


class Policy(nn.Module):
    """A small VLA-shaped policy: a frozen conv stem, a trainable CNN over every camera, an MLP
    head over image features and robot state; dropout so that the RNG state matters, a buffer
    (not a parameter) the forward reads, so that buffers matter too."""

    def __init__(self, dropout: float = 0.1, horizon: int = HORIZON, image: int = IMG) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        for p in self.stem.parameters():
            p.requires_grad_(False)
        self.cnn = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.norm = nn.LayerNorm(16 * CAMS + STATE)
        self.head = nn.Sequential(nn.Linear(16 * CAMS + STATE, 64), nn.GELU(),
                                  nn.Dropout(dropout), nn.Linear(64, horizon * ACT))
        self.register_buffer("state_offset", torch.randn(STATE))
        self.horizon = horizon

    def forward(self, images: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        b, c = images.shape[:2]
        f = self.cnn(self.stem(images.flatten(0, 1))).view(b, -1)
        x = self.norm(torch.cat([f, state + self.state_offset], dim=1))
        return self.head(x).view(b, self.horizon, ACT)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    pred = model(batch["images"], batch["state"])
    err = (pred.float() - batch["action"]).pow(2).mean(-1)
    mask = batch["action_mask"].to(err.dtype)
    return (err * mask).sum() / mask.sum().clamp(min=1)


def make_batches(n: int, rows: int = 4, seed: int = 0, image: int = IMG, horizon: int = HORIZON):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append({"images": torch.rand(rows, CAMS, 3, image, image, generator=g),
                    "state": torch.randn(rows, STATE, generator=g),
                    "action": torch.randn(rows, horizon, ACT, generator=g),
                    "action_mask": torch.rand(rows, horizon, generator=g) > 0.2})
    return out


def build(seed: int, **kw):
    torch.manual_seed(seed)
    model = Policy(**kw)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    return model, opt


def plain_loop(batches, seed: int, clip: float):
    model, opt = build(seed)
    torch.manual_seed(1234)  # the training run's RNG (dropout) after init
    losses = []
    for batch in batches:
        loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model


def forge_loop(batches, seed: int, clip: float):
    model, opt = build(seed)
    forge = lf.Forge(device="cpu")
    model, opt = forge.setup(model, opt)
    step = forge.compile_step(loss_fn, clip=clip)
    torch.manual_seed(1234)
    losses = [step(b).item() for b in forge.loader(batches)]
    return losses, model, forge


# Guards the core contract: Forge's one-call step (forward, backward, clip, optimizer, zero_grad)
# trains exactly as the plain loop it replaces.
def test_forge_matches_plain_pytorch_loop():
    batches = make_batches(6)
    ref, ref_model = plain_loop(batches, seed=0, clip=0.5)
    got, model, forge = forge_loop(batches, seed=0, clip=0.5)
    assert len(got) == len(ref) == 6
    for i, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), (i, a, b)
    for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    rep = forge.report()
    assert rep["steps"] == 6 and rep["samples"] == 24 and rep["skipped_nonfinite"] == 0
    assert rep["samples_per_s"] > 0 and 0.0 <= rep["data_wait_fraction"] <= 1.0
    assert rep["peak_memory_bytes"] > 0 and rep["comm_exposed_s"] == 0.0
    assert rep["cuda_graphs"][0]["enabled"] is False  # CPU: eager
    forge.close()


# Guards resume on the plain-iterable path: model, optimizer, loader position and the RNG
# (dropout) come back, so the continued run is bit-identical to the uninterrupted one.
def test_resume_from_list_is_bit_exact(tmp_path):
    batches = make_batches(8, seed=5)
    model, opt = build(0)
    forge = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    forge.setup(model, opt)
    step = forge.compile_step(loss_fn)
    assert forge.load() is None  # a fresh start
    torch.manual_seed(77)
    ref = []
    for i, b in enumerate(forge.loader(batches)):
        ref.append(step(b))
        if i == 3:
            forge.save(4, extra={"epoch": 0, "note": "mid-run"})
    forge.close()

    model2, opt2 = build(1)  # another init: the checkpoint must replace it
    torch.manual_seed(999)   # another RNG state: the checkpoint must restore it
    forge2 = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    forge2.setup(model2, opt2)
    loader = forge2.loader(batches)
    state = forge2.load()
    assert state == {"step": 4, "extra": {"epoch": 0, "note": "mid-run"}}
    step2 = forge2.compile_step(loss_fn)
    got = [step2(b) for b in loader]
    assert len(got) == 4
    for a, b in zip(got, ref[4:]):
        assert torch.equal(a, b), (a, b)
    forge2.close()


def _storages(tensors):
    return {(t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()
            for t in tensors}


def _moments(opt):
    return [v for st in opt.state.values() for k, v in st.items() if k != "step"]


# Guards setup(arena="on"): the parameters and buffers end up in one allocation and AdamW's
# state in another, the run's losses are the plain loop's, and a resumed run copies the
# checkpoint into the same arena tensors and continues bit for bit.
def test_persistent_arena_trains_the_same_and_resumes_in_place(tmp_path):
    batches = make_batches(8, seed=4)
    ref, _ = plain_loop(batches, seed=0, clip=0.5)
    model, opt = build(0)
    forge = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    forge.setup(model, opt, arena="on")
    assert len(_storages(list(model.parameters()) + list(model.buffers()))) == 1
    assert len(_storages(_moments(opt))) == 1 and len(_moments(opt)) == 2 * len(forge._params)
    rep = forge.report()["persistent_arena"]
    assert rep.startswith("on (parameters and buffers") and "optimizer state" in rep, rep
    step = forge.compile_step(loss_fn, clip=0.5)
    torch.manual_seed(1234)
    got = []
    for i, b in enumerate(forge.loader(batches)):
        got.append(step(b).item())
        if i == 3:
            forge.save(4)
    forge.close()
    for i, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), (i, a, b)

    model2, opt2 = build(1)
    forge2 = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    forge2.setup(model2, opt2, arena="on")
    arena_ptrs = _storages(_moments(opt2))
    loader = forge2.loader(batches)
    assert forge2.load()["step"] == 4
    assert _storages(_moments(opt2)) == arena_ptrs  # loaded into the arena, not beside it
    step2 = forge2.compile_step(loss_fn, clip=0.5)
    again = [step2(b).item() for b in loader]
    assert again == got[4:]
    forge2.close()
    with _forge_error(r"arena='sometimes'.*auto, on, off"):
        lf.Forge(device="cpu").setup(*build(0), arena="sometimes")
    sgd_model = Policy()
    sgd = torch.optim.SGD(sgd_model.parameters(), lr=0.1, momentum=0.9)
    f3 = lf.Forge(device="cpu")
    f3.setup(sgd_model, sgd, arena="on")
    assert "SGD's state made by torch" in f3.report()["persistent_arena"]
    f4 = lf.Forge(device="cpu")
    f4.setup(*build(0))
    assert f4.report()["persistent_arena"].startswith("off (the CPU keeps torch's blocks")


# Guards the arena on CUDA, where it is on by default: the graphed step trains on arena views
# (fused AdamW's state among them) with the loss curve of arena="off".
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_persistent_arena_on_cuda_matches_off():
    batches = make_batches(10, rows=8, seed=6)
    off, rep_off, _, _, _ = stack_on_cuda(batches, {"arena": "off"}, fused=True,
                                          compile_blocks="off")
    on, rep_on, _, model, opt = stack_on_cuda(batches, {}, fused=True, compile_blocks="off")
    assert rep_off["persistent_arena"] == "off (arena='off')"
    assert rep_on["persistent_arena"].startswith("on (parameters and buffers"), rep_on
    assert "optimizer state" in rep_on["persistent_arena"] and "in one allocation)" in \
        rep_on["persistent_arena"], rep_on
    assert len(_storages(model.parameters())) == 1 and len(_storages(_moments(opt))) == 1
    assert rep_on["cuda_graphs"][0]["replays"] == 8, rep_on["cuda_graphs"]
    torch.testing.assert_close(on, off, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not has_datafusion(), reason="this build has no DataFusion loader")
def test_datafusion_loader_resume_is_bit_exact(train_db, tmp_path):
    """A packed DB through forge.loader: the resumed run continues mid-epoch at the same batch,
    with the same weights, optimizer state and dropout draws."""
    kw = dict(batch_size=4, image_size=16, seed=3, threads=1)

    def run(ckpt, steps, save_at=None, resume=False, seed=0):
        model, opt = build(seed, horizon=16)
        forge = lf.Forge(device="cpu", ckpt_dir=str(ckpt))
        forge.setup(model, opt)
        loader = forge.loader(train_db, **kw)
        step = forge.compile_step(loss_fn, clip=1.0)
        start = 0
        if resume:
            torch.manual_seed(4321)
            start = forge.load()["step"]
        else:
            torch.manual_seed(11)
        losses = []
        it = iter(loader)
        for n in range(start, steps):
            losses.append(step(next(it)))
            if save_at == n + 1:
                forge.save(n + 1)
        del it
        rep = forge.report()
        forge.close()
        return losses, rep

    # The tiny DB has 24 samples: 6 batches of 4 per epoch, so step 3 is mid-epoch.
    ref, rep = run(tmp_path / "a", 5, save_at=3)
    assert rep["steps"] == 5 and rep["tokens"] > 0 and rep["ckpt_saves"] == 1
    got, _ = run(tmp_path / "a", 5, resume=True, seed=9)
    assert len(got) == 2
    for a, b in zip(got, ref[3:]):
        assert torch.equal(a, b), (a, b)


# Guards Note [Non-finite steps] through Forge: a NaN loss changes no parameter and no optimizer
# state, is counted, and training goes on.
def test_nonfinite_loss_skips_the_step():
    batches = make_batches(3)
    batches[1]["state"][0, 0] = float("nan")
    model, opt = build(0, dropout=0.0)
    forge = lf.Forge(device="cpu")
    forge.setup(model, opt)
    step = forge.compile_step(loss_fn)
    step(batches[0])
    before = [p.detach().clone() for p in model.parameters()]
    steps_before = [opt.state[p]["step"].clone() if torch.is_tensor(opt.state[p]["step"])
                    else opt.state[p]["step"] for p in opt.param_groups[0]["params"]]
    loss = step(batches[1])
    assert not torch.isfinite(loss)
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)
    assert [opt.state[p]["step"] for p in opt.param_groups[0]["params"]] == steps_before
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert torch.isfinite(step(batches[2]))
    assert forge.report()["skipped_nonfinite"] == 1
    forge.close()


# Guards the end of a diverged run: max_nonfinite skipped steps in a row raise NonFiniteError
# naming the count, the weights stay those of the last finite step, and a finite step between
# skipped ones resets the count.
def test_nonfinite_steps_in_a_row_end_the_run():
    batches = make_batches(6)
    for i in (1, 3, 4):
        batches[i]["state"][0, 0] = float("nan")
    model, opt = build(0, dropout=0.0)
    forge = lf.Forge(device="cpu")
    forge.setup(model, opt)
    step = forge.compile_step(loss_fn, max_nonfinite=2)
    for b in batches[:4]:  # finite, skipped, finite, skipped: never two in a row
        step(b)
    last_finite = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(lf.NonFiniteError, match="2 steps in a row"):
        step(batches[4])
    for p, q in zip(model.parameters(), last_finite):
        assert torch.equal(p, q)
    assert forge.report()["skipped_nonfinite"] == 3
    with _forge_error("max_nonfinite"):
        forge.compile_step(loss_fn, max_nonfinite=-1)
    forge.close()


def _forge_error(match: str):
    return pytest.raises(lf.ForgeError, match=match)


def test_misuse_raises_forge_error(tmp_path):
    assert issubclass(lf.ForgeError, ValueError)
    with _forge_error(r"unknown option 'devcie' \(valid: ckpt_dir, device, keep_last, log, "
                      r"precision\)"):
        lf.Forge(devcie="cpu")
    with _forge_error("precision must be one of fp32, bf16"):
        lf.Forge(device="cpu", precision="fp16")
    with _forge_error("device must be one of auto, cpu, cuda"):
        lf.Forge(device="tpu")
    with _forge_error("bf16.*needs CUDA"):
        lf.Forge(device="cpu", precision="bf16")

    forge = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    with _forge_error(r"save\(\) before forge.setup"):
        forge.save(1)
    with _forge_error(r"load\(\) before forge.setup"):
        forge.load()
    with _forge_error(r"compile_step\(\) before forge.setup"):
        forge.compile_step(loss_fn)
    model, opt = build(0)
    with _forge_error("not parameters of the model"):
        forge.setup(model, torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1))
    forge.setup(model, opt)
    with _forge_error(r"setup\(\) was already called"):
        forge.setup(model, opt)
    with _forge_error(r"unknown option 'clipp' \(valid: clip, compile_blocks, compile_scope, "
                      r"graphs, max_graphs, max_nonfinite, warmup\)"):
        forge.compile_step(loss_fn, clipp=1.0)
    with _forge_error("graphs='on'.*needs CUDA"):
        forge.compile_step(loss_fn, graphs="on")
    with _forge_error("clip=-1"):
        forge.compile_step(loss_fn, clip=-1)
    with _forge_error("batch_size and loader options apply to a packed DB path only"):
        forge.loader(make_batches(1), batch_size=4)
    with _forge_error("pass batch_size="):
        forge.loader(str(tmp_path / "db"))
    with _forge_error("'rank' is set by the Forge"):
        forge.loader(str(tmp_path / "db"), batch_size=4, rank=1)
    with _forge_error("every batch must be a dict of tensors"):
        next(iter(forge.loader([torch.zeros(3)])))
    step = forge.compile_step(lambda m, b: m(b["images"], b["state"]))
    with _forge_error("one-element tensor, got a tensor of shape"):
        step(make_batches(1)[0])
    forge.save(2)
    with _forge_error(r"step 2 is already saved.*steps must increase"):
        forge.save(2)
    with _forge_error("extra=.*a dict"):
        forge.save(3, extra=[1])
    with _forge_error(r"extra=.*note: a builtins.object cannot be saved"):
        forge.save(3, extra={"note": object()})
    forge.close()
    with _forge_error(r"after forge.close\(\)"):
        forge.save(4)

    # A new run in a directory that holds another run's checkpoints must resume, not collide.
    other = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    m2, o2 = build(0)
    other.setup(m2, o2)
    with _forge_error(r"already holds checkpoints of a run: call forge.load\(\) first"):
        other.save(10)
    nock = lf.Forge(device="cpu")
    nock.setup(*build(0))
    with _forge_error(r"needs Forge\(ckpt_dir=...\)"):
        nock.save(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_step_matches_eager():
    """compile_step on CUDA captures a graph per batch shape and replays it; its losses are
    eager's within bf16 noise. A loss_fn that reads a value back to the host cannot be captured:
    the step falls back to eager, printed once with the reason, and still trains."""
    batches = make_batches(10, rows=8, seed=2)

    def run(graphs, fn=loss_fn):
        lines = []
        model, opt = build(0, dropout=0.0)
        forge = lf.Forge(device="cuda", precision="bf16", log=lines.append)
        forge.setup(model, opt)
        assert model.stem.weight.dtype == torch.bfloat16  # frozen conv: bf16
        assert model.cnn[0].weight.dtype == torch.float32  # trainable: fp32
        step = forge.compile_step(fn, graphs=graphs, warmup=2)
        losses = torch.stack([step(b) for b in forge.loader(batches)]).float().cpu()
        rep = forge.report()
        forge.close()
        return losses, rep, lines

    eager, rep_e, _ = run("off")
    graphed, rep_g, lines = run("on")
    g = rep_g["cuda_graphs"][0]
    assert g["enabled"] and g["captures"] == 1 and g["replays"] == 8, g
    assert not lines, lines
    assert rep_e["cuda_graphs"][0]["captures"] == 0
    assert torch.isfinite(graphed).all()
    torch.testing.assert_close(graphed, eager, rtol=3e-2, atol=1e-3)

    def syncing_loss(model, batch):
        loss = loss_fn(model, batch)
        if loss.item() < 0:  # a host read: cannot be captured
            raise AssertionError
        return loss

    fell, rep_f, lines = run("on", syncing_loss)
    f = rep_f["cuda_graphs"][0]
    assert not f["enabled"] and f["fallback_reason"] and f["replays"] == 0, f
    assert len(lines) == 1 and "runs eager" in lines[0] and "capture failed" in lines[0], lines
    torch.testing.assert_close(fell, eager, rtol=3e-2, atol=1e-3)
    # The failed capture leaves the device's generator usable outside a graph (Note [A failed
    # capture and the generator]): a draw after it neither raises nor repeats the last one.
    a, b = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
    assert not torch.equal(a, b)


def test_keep_last_prunes_old_checkpoints(tmp_path):
    model, opt = build(0, dropout=0.0)
    with lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"), keep_last=2) as forge:
        forge.setup(model, opt)
        step = forge.compile_step(loss_fn)
        for i, b in enumerate(forge.loader(make_batches(4)), start=1):
            step(b)
            forge.save(i)
        assert forge.report()["ckpt_saves"] == 4
    assert lf.CheckpointVault(str(tmp_path / "ck" / "vault"), read_only=True).steps() == [3, 4]


class _Block(nn.Module):
    """A pre-norm residual MLP block; `experts` nests a second ModuleList inside the block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.experts = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + torch.nn.functional.gelu(self.experts[0](h)) * torch.sigmoid(self.experts[1](h))


class _Stack(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(STATE, width)
        self.layers = nn.ModuleList([_Block(width) for _ in range(depth)])
        self.mixed = nn.ModuleList([nn.Linear(width, width), nn.Identity()])
        self.single = nn.ModuleList([nn.Linear(width, width)])
        self.out = nn.Linear(width, HORIZON * ACT)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        x = self.embed(state)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.single[0](self.mixed[0](x))).view(-1, HORIZON, ACT)


def stack_loss(model: nn.Module, batch) -> torch.Tensor:
    return (model(batch["state"]).float() - batch["action"]).pow(2).mean()


def stack_on_cuda(batches, setup: dict, fused: bool = False, **step_options):
    """A 4-deep _Stack trained on CUDA through Forge for `batches` (warm-up 2, so the rest replay
    the graph): (losses on the host, report, log lines, model, optimizer)."""
    lines = []
    torch.manual_seed(0)
    model = _Stack(width=64, depth=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    forge = lf.Forge(device="cuda", log=lines.append)
    forge.setup(model, opt, **setup)
    step = forge.compile_step(stack_loss, warmup=2, **step_options)
    losses = torch.stack([step(b) for b in forge.loader(batches)]).cpu()
    rep = forge.report()
    forge.close()
    return losses, rep, lines, model, opt


# Guards which modules count as repeated blocks: the elements of a ModuleList of two or more
# modules of one class, outermost first, never a list nested inside a block already taken.
def test_find_blocks_takes_outermost_lists_of_one_class():
    from loongforge.blocks import find_blocks

    names = [n for n, _ in find_blocks(_Stack())]
    assert names == ["layers.0", "layers.1", "layers.2"], names
    assert find_blocks(Policy()) == []


class _Tower(nn.Module):
    """Two block lists at different depths, as a vision tower beside a text model has them."""

    def __init__(self) -> None:
        super().__init__()
        self.vision = nn.Module()
        self.vision.encoder = _Stack()
        self.text = _Stack()


# Guards the units each compile scope takes: the owner of every outermost block list (the model
# itself when the list hangs off it), an owner inside another owner left to the outer one, the
# whole model for "model", and nothing at any scope for a model without block lists.
def test_find_units_by_scope():
    from loongforge.blocks import find_units

    tower = _Tower()
    assert [n for n, _ in find_units(tower, "owner")] == ["vision.encoder", "text"]
    assert find_units(tower, "owner")[0][1] is tower.vision.encoder
    assert [n for n, _ in find_units(_Stack(), "owner")] == [""]
    assert [n for n, _ in find_units(tower, "model")] == [""]
    assert len(find_units(tower, "block")) == 6
    for scope in ("block", "owner", "model"):
        assert find_units(Policy(), scope) == []
    with pytest.raises(ValueError, match="scope 'layer'"):
        find_units(tower, "layer")
    nested = nn.Module()
    nested.outer = _Stack()
    nested.outer.inner = nn.Module()
    nested.outer.inner.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    assert [n for n, _ in find_units(nested, "owner")] == ["outer"]


@pytest.mark.skipif(hasattr(torch, "compile"), reason="torch.compile exists here")
def test_compile_blocks_without_torch_compile_says_why():
    torch.manual_seed(0)
    model = _Stack()
    forge = lf.Forge(device="cpu")
    forge.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    with _forge_error(r"compile_blocks='on'.*no torch.compile"):
        forge.compile_step(stack_loss, compile_blocks="on")
    with _forge_error(r"compile_blocks='sometimes'"):
        forge.compile_step(stack_loss, compile_blocks="sometimes")
    with _forge_error(r"compile_scope='layer'.*block, owner, model"):
        forge.compile_step(stack_loss, compile_scope="layer")
    step = forge.compile_step(stack_loss)
    step(make_batches(1)[0])
    assert forge.report()["compiled_blocks"].startswith("off (torch "), forge.report()
    forge.close()


# Guards that compiling blocks in place changes neither the numbers nor the module afterwards:
# outputs and gradients equal eager's (dynamo's eager backend, so no C++ compiler is needed),
# state_dict keys are unchanged, and restore() gives every block its own forward back.
@pytest.mark.skipif(not hasattr(torch, "compile"), reason="needs torch.compile (torch >= 2)")
def test_compiled_blocks_match_eager_and_restore():
    from loongforge.blocks import CompiledBlocks

    torch.manual_seed(0)
    model = _Stack()
    x = torch.randn(5, STATE)
    want = model(x)
    keys = list(model.state_dict())
    blocks = CompiledBlocks(model, backend="eager")
    assert blocks.kinds() == {"_Block": 3}
    assert all("forward" in m.__dict__ for m in model.layers)
    got = model(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    assert all(p.grad is not None for p in model.layers.parameters())
    assert list(model.state_dict()) == keys
    blocks.restore()
    assert all("forward" not in m.__dict__ for m in model.layers)
    torch.testing.assert_close(model(x), want)


# Guards compiled blocks inside the step's CUDA graph: with inductor's kernels captured, the fp32
# loss curve is the eager step's within fused-kernel rounding, the graph replays, report() says
# which blocks were compiled, and close() gives the blocks their forward back.
@pytest.mark.skipif(not torch.cuda.is_available() or not hasattr(torch, "compile"),
                    reason="needs a CUDA device and torch.compile")
def test_compile_blocks_in_the_cuda_graph_match_eager():
    batches = make_batches(10, rows=8, seed=3)

    def run(blocks, scope="block"):
        losses, rep, lines, model, _ = stack_on_cuda(batches, {}, compile_blocks=blocks,
                                                     compile_scope=scope)
        return losses, rep, lines, model

    eager, rep_e, _, _ = run("off")
    fused, rep_c, lines, model = run("on")
    assert rep_e["compiled_blocks"].startswith("off"), rep_e["compiled_blocks"]
    assert rep_c["compiled_blocks"].startswith("on (4 _Block"), rep_c["compiled_blocks"]
    assert len(lines) == 1 and "compiled blocks on" in lines[0], lines
    g = rep_c["cuda_graphs"][0]
    assert g["enabled"] and g["captures"] == 1 and g["replays"] == 8, g
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5)
    assert all("forward" not in m.__dict__ for m in model.layers)
    whole, rep_o, _, model = run("on", "owner")
    assert rep_o["compiled_blocks"].startswith("on (1 _Stack; scope owner"), rep_o
    g = rep_o["cuda_graphs"][0]
    assert g["enabled"] and g["captures"] == 1 and g["replays"] == 8, g
    torch.testing.assert_close(whole, eager, rtol=1e-4, atol=1e-5)
    assert "forward" not in model.__dict__
