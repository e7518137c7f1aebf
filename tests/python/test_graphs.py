"""Static batches, per-microbatch CUDA graphs, the sync-free step and activation checkpointing.

CPU tests cover padding, fallbacks and loss invariance; the capture/replay tests need a CUDA
device and are skipped here with that reason (they run on the GPU machine)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from loongforge import graphs, train  # noqa: E402
from loongforge.models.gr00t import Gr00tPolicy, get_config  # noqa: E402

torch.set_num_threads(1)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graph capture needs a CUDA device")


def _batch(b=2, length=5, cams=2, size=28, horizon=16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, length, dtype=torch.bool)
    mask[0, length - 2:] = False  # one sample shorter than the batch max
    batch = {
        "images": torch.randn(b, cams, 3, size, size, generator=g),
        "tokens": torch.randint(1, 200, (b, length), generator=g) * mask,
        "attention_mask": mask,
        "state": torch.randn(b, 8, generator=g),
        "action": torch.randn(b, horizon, 7, generator=g),
        "action_mask": torch.ones(b, horizon, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in batch.items()}


def _model(device="cpu", seed=0):
    torch.manual_seed(seed)
    return Gr00tPolicy(get_config("tiny", image_size=28)).to(device).train()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.requires_grad and p.grad is not None}


# Guards: bucket parsing rejects bad items by name and sorts/dedups the rest.
def test_parse_buckets():
    assert graphs.parse_buckets("64,32,64") == (32, 64)
    assert graphs.parse_buckets("") == ()
    with pytest.raises(ValueError, match="'x'"):
        graphs.parse_buckets("32,x")
    with pytest.raises(ValueError, match="positive"):
        graphs.parse_buckets("0")


# Guards: padding goes to the smallest bucket that fits, is masked, and longer text is reported.
def test_auto_buckets_hold_the_longest_text_with_bounded_padding():
    # Guards the auto ladder: it must reach the longest text and pad by at most a quarter (powers
    # of two padded the end-to-end data's 49 tokens to 64).
    for longest in range(1, 700):
        b = train.auto_buckets(longest)
        assert b[0] == 16 and b[-1] >= longest and list(b) == sorted(set(b))
        assert all(x % 8 == 0 for x in b)
        if longest > 16:
            assert b[-2] < longest and b[-1] <= max(longest + 7, longest * 1.25 + 8)
    assert train.auto_buckets(49)[-1] == 56


def test_pad_to_bucket_shapes_and_mask():
    batch = _batch(length=5)
    out, b = graphs.pad_to_bucket(batch, (4, 8, 16))
    assert b == 8 and out["tokens"].shape == (2, 8) and out["attention_mask"].shape == (2, 8)
    assert not out["attention_mask"][:, 5:].any() and (out["tokens"][:, 5:] == 0).all()
    assert torch.equal(out["tokens"][:, :5], batch["tokens"])
    same, b = graphs.pad_to_bucket(batch, (2, 3))
    assert b is None and same["tokens"] is batch["tokens"]


# Guards: padding text to a bucket does not change the losses (padded keys are masked).
def test_static_bucket_padding_keeps_the_loss():
    model = _model()
    batch = _batch(length=5)
    noise = model.draw_noise(2, 16, torch.device("cpu"), torch.Generator().manual_seed(3))
    a = model(batch, noise=noise[0], time_u=noise[1])["loss"]
    padded, _ = graphs.pad_to_bucket(batch, (16,))
    b = model(padded, noise=noise[0], time_u=noise[1])["loss"]
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)


# Guards: draw_noise yields exactly the numbers forward() draws from the same generator, so graph
# mode (draws outside the graph) and eager mode train on the same noise.
def test_draw_noise_matches_forward_draws():
    model = _model()
    batch = _batch()
    a = model(batch, generator=torch.Generator().manual_seed(7))["loss"]
    noise = model.draw_noise(2, 16, torch.device("cpu"), torch.Generator().manual_seed(7))
    b = model(batch, noise=noise[0], time_u=noise[1])["loss"]
    assert torch.equal(a, b)


# Guards: selective activation checkpointing gives the same loss and gradients as without.
@pytest.mark.parametrize("mode", ["dit", "llm", "all"])
def test_activation_checkpointing_same_gradients(mode):
    batch = _batch()
    ref = _model()
    noise = ref.draw_noise(2, 16, torch.device("cpu"), torch.Generator().manual_seed(1))
    ref(batch, noise=noise[0], time_u=noise[1])["loss"].backward()
    ck = _model()
    ck.set_activation_checkpointing(mode)
    ck(batch, noise=noise[0], time_u=noise[1])["loss"].backward()
    ga, gb = _grads(ref), _grads(ck)
    assert ga.keys() == gb.keys()
    for n in ga:
        assert torch.allclose(ga[n], gb[n], rtol=1e-4, atol=1e-6), n
    with pytest.raises(ValueError, match="expected one of"):
        ck.set_activation_checkpointing("everything")


# Guards: without CUDA the step runner says why graphs are off and still trains (eager, padded).
def test_cpu_step_runner_runs_eager_with_reason():
    model = _model()
    logs = []
    step = graphs.GraphedStep(model, torch.device("cpu"), token_buckets=(8,), warmup=1,
                              autocast_dtype=None, log=logs.append)
    out = step(_batch(), torch.Generator().manual_seed(0))
    assert torch.isfinite(out["loss"])
    st = step.stats()
    assert not st["enabled"] and "CUDA device" in st["reason"] and st["captures"] == 0
    assert any("running eager" in m for m in logs)


# Guards: a MoE config is captured only without a capacity limit, expert parallelism or the
# padded-bmm fallback; each refusal names its reason (Note [Graphed MoE] in graphs.py).
def test_moe_graph_conditions(monkeypatch):
    from loongforge import moe

    def reason(**over):
        cfg = get_config("n16-moe", **over)
        return graphs.graph_unavailable(type("M", (), {"cfg": cfg})(), torch.device("cuda"), "none")

    assert "capacity limit" in reason(moe_capacity_factor=1.25)
    monkeypatch.setenv("LOONGFORGE_GROUPED_MM", "fallback")
    assert "grouped GEMM" in reason()
    monkeypatch.delenv("LOONGFORGE_GROUPED_MM")
    monkeypatch.setattr(moe, "grouped_mm_backend", lambda *a: "torch")  # as on an H100/H200
    assert reason() is None
    model = Gr00tPolicy(get_config("tiny-moe", image_size=28))
    model.moe_layers()[0].ep = type("EP", (), {"size": 2})()
    assert "expert parallelism" in graphs.graph_unavailable(model, torch.device("cuda"), "none")
    assert "DDP" in graphs.graph_unavailable(_model(), torch.device("cuda"), "ddp")


# ---- on the GPU machine -------------------------------------------------------------------------


def _eager_reference(batch, seed, steps, buckets=()):
    """Losses and grads of `steps` eager microbatches (fp32) with the generator seeded `seed`."""
    return _eager_run([batch] * steps, seed, buckets)


def _eager_run(batches, seed, buckets=()):
    """Losses and grads of eager microbatches of `batches` (fp32), each padded to `buckets`, the
    noise drawn from one generator seeded `seed` (the draws a GraphedStep makes)."""
    model = _model("cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for batch in batches:
        for p in model.parameters():
            p.grad = None
        padded, _ = graphs.pad_to_bucket(batch, buckets)
        noise = model.draw_noise(batch["action"].shape[0], batch["action"].shape[1],
                                 torch.device("cuda"), gen)
        loss = model(padded, noise=noise[0], time_u=noise[1])["loss"]
        loss.backward()
        out.append((loss.detach().clone(), _grads(model)))
    return out


# Guards: capture and replay give the same loss and gradients as eager on fixed inputs (fp32),
# on the warm-up, capture and replay microbatches alike.
@needs_cuda
def test_capture_replay_matches_eager():
    batch = _batch(device="cuda")
    ref = _eager_reference(batch, seed=11, steps=4, buckets=(8,))
    model = _model("cuda")
    step = graphs.GraphedStep(model, torch.device("cuda"), token_buckets=(8,), warmup=1,
                              autocast_dtype=None, log=lambda m: None)
    gen = torch.Generator(device="cuda").manual_seed(11)
    for i in range(4):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        out = step(batch, gen)
        torch.cuda.synchronize()
        loss, grads = ref[i]
        assert torch.allclose(out["loss"], loss, rtol=1e-5, atol=1e-6), (i, out["loss"], loss)
        got = _grads(model)
        for n in grads:
            assert torch.allclose(got[n], grads[n], rtol=1e-4, atol=1e-6), (i, n)
    st = step.stats()
    assert st["captures"] == 1 and st["replays"] == 3 and not st["capture_failures"], st


# Guards "no allocation during replay": once a bucket is captured, a microbatch of it
# (copy into the static inputs, noise drawn into static buffers, replay) allocates nothing from
# torch's caching allocator, the batch being already at the bucket's length.
@needs_cuda
def test_replay_allocates_nothing():
    model = _model("cuda")
    step = graphs.GraphedStep(model, torch.device("cuda"), token_buckets=(5,), warmup=1,
                              autocast_dtype=None, log=lambda m: None)
    batch = _batch(device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(3):  # warm-up, capture, one replay
        step(batch, gen)
    assert step.stats()["replays"] >= 1
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(5):
        step(batch, gen)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert step.stats()["replays"] >= 6


# Guards: random numbers are redrawn for every replay (the same inputs give different losses).
@needs_cuda
def test_rng_differs_across_replays():
    model = _model("cuda")
    step = graphs.GraphedStep(model, torch.device("cuda"), warmup=1, autocast_dtype=None,
                              log=lambda m: None)
    batch = _batch(device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    losses = []
    for _ in range(4):
        losses.append(float(step(batch, gen)["loss"]))
    assert step.stats()["replays"] >= 2
    assert len(set(losses)) == len(losses), losses


# Guards: a batch longer than every bucket runs eager, cleanly, and is reported.
@needs_cuda
def test_shape_outside_buckets_falls_back():
    model = _model("cuda")
    logs = []
    step = graphs.GraphedStep(model, torch.device("cuda"), token_buckets=(4,), warmup=1,
                              autocast_dtype=None, log=logs.append)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(3):
        out = step(_batch(length=6, device="cuda"), gen)
        assert torch.isfinite(out["loss"]).item()
    st = step.stats()
    assert st["captures"] == 0 and any("exceeds the largest token bucket" in r
                                       for r in st["eager_buckets"].values()), st
    assert any("runs eager" in m for m in logs)


# Guards: the trainer with graphs + sync-free steps captures, trains to close losses and has no
# host syncs in steady-state steps (counted by torch's sync debug mode).
@needs_cuda
def test_trainer_graphs_sync_free(tmp_path):
    root = tmp_path / "db"
    try:
        from lf_testdb import make_db
        import lmdb  # noqa: F401 - python3-lmdb present: build with lf_testdb
        db = make_db(str(root), episodes=3, steps=8, width=64, height=48)
    except ImportError:
        from loongforge import packing
        packing.demo_data(str(tmp_path / "raw"), episodes=2, cameras=2, width=64, height=48,
                          steps_min=10, steps_max=14, state_dim=8, action_dim=7)
        packing.pack(str(tmp_path / "raw"), str(root))
        db = str(root)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(train.__file__), "..") + os.pathsep + \
        env.get("PYTHONPATH", "")
    res = {}
    for name, extra in (("eager", ["--cuda-graph", "off", "--sync-free", "off",
                                   "--token-buckets", ""]),
                        ("graph", ["--count-syncs"])):  # loongforge mode's defaults on CUDA
        js = str(tmp_path / f"{name}.json")
        cmd = [sys.executable, "-m", "loongforge.train", "--config", "tiny", "--image-size", "56",
               "--batch-size", "4", "--warmup", "4", "--steps", "10", "--device", "cuda",
               "--data", db, "--mode", "loongforge", "--quiet", "--no-augment",
               "--json-out", js, *extra]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        res[name] = json.load(open(js))
    g = res["graph"]
    # one microbatch a step at world size 1: Note [Gradients in the graph pool]
    assert g["modules"]["cuda_graph"] == "per_microbatch, gradients in the graph pool", g["modules"]
    assert g["modules"]["nexussync"].startswith("off: world size 1"), g["modules"]
    assert g["modules"]["sync_free"].startswith("on") and g["cuda_graph"]["token_buckets"]
    assert g["cuda_graph"]["captures"] >= 1 and g["cuda_graph"]["replays"] >= 1, g["cuda_graph"]
    assert g["figures"]["host_syncs_per_step"] == 0, g["figures"].get("host_sync_sites")
    a = [r["loss"] for r in res["eager"]["loss_curve"]]
    b = [r["loss"] for r in g["loss_curve"]]
    assert len(a) == len(b) == 10
    for x, y in zip(a, b):
        assert abs(x - y) / abs(x) < 0.05, (a, b)  # bf16 autocast; same data, noise and init


# Guards: a fused AdamW step with a non-finite gradient norm is skipped on the device (no NaN
# parameters, no host sync) and recorded; a finite one steps.
@needs_cuda
def test_fused_step_skips_nonfinite_gradients():
    model = _model("cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    params[0].grad[0] = float("inf")
    acc = torch.zeros(6, device="cuda")
    train.optimizer_step(opt, params, 1.0, acc)
    assert acc[5].item() == 1.0
    assert all(torch.equal(a, p) for a, p in zip(before, params))
    for p in params:
        p.grad = torch.ones_like(p)
    acc.zero_()
    train.optimizer_step(opt, params, 1.0, acc)
    assert acc[5].item() == 0.0 and not torch.equal(before[0], params[0])
    assert all(torch.isfinite(p).all() for p in params)


# ---- captures in MemSculptor's graph pool ------------------------------------------------------


def _memsculptor_graph_pool():
    from loongforge.memory import MemSculptor
    if not MemSculptor.available() or not hasattr(torch.cuda, "MemPool"):
        pytest.skip("MemSculptor's allocator library or torch.cuda.MemPool missing")
    ms = MemSculptor(0)
    return ms, ms.graph_pool()


def _graphed_run(batches, seed, mem_pool=None, buckets=(8,)):
    """Loss and grads after each microbatch of `batches`, through a GraphedStep (fp32)."""
    model = _model("cuda")
    step = graphs.GraphedStep(model, torch.device("cuda"), token_buckets=buckets, warmup=1,
                              autocast_dtype=None, log=lambda m: None, mem_pool=mem_pool)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for batch in batches:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        res = step(batch, gen)
        torch.cuda.synchronize()
        out.append((res["loss"].clone(), _grads(model)))
    return out, step


# Guards: replays captured into MemSculptor's graph pool give the same loss and
# gradients, bit for bit, as replays in torch's own graph pool; the segments came from MemSculptor
# and go back to it once the graphs are destroyed.
@needs_cuda
def test_capture_in_memsculptor_pool_is_bitwise_torch_pool():
    ms, pool = _memsculptor_graph_pool()
    batches = [_batch(device="cuda", seed=i % 2) for i in range(5)]
    torch.use_deterministic_algorithms(True, warn_only=True)  # bitwise needs no atomics races
    try:
        ref, ref_step = _graphed_run(batches, seed=21)
        got, step = _graphed_run(batches, seed=21, mem_pool=pool)
    finally:
        torch.use_deterministic_algorithms(False)
    for st in (ref_step.stats(), step.stats()):
        assert st["captures"] == 1 and st["replays"] == 4 and not st["capture_failures"], st
    for i, ((l0, g0), (l1, g1)) in enumerate(zip(ref, got)):
        assert torch.equal(l0, l1), (i, l0, l1)
        assert g0.keys() == g1.keys()
        for n in g0:
            assert torch.equal(g0[n], g1[n]), (i, n)
    assert ms.stats()["peak_allocated_bytes"] > 0, ms.stats()  # the captures' segments
    step.release()
    del pool, step, got
    res = ms.close(graphs_released=True)
    assert res["live_allocations"] == 0, res


def _assert_runs_match(got, ref):
    assert len(got) == len(ref)
    for i, ((loss, grads), (ref_loss, ref_grads)) in enumerate(zip(got, ref)):
        assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6), (i, loss, ref_loss)
        assert grads.keys() == ref_grads.keys()
        for n, g in ref_grads.items():
            assert torch.allclose(grads[n], g, rtol=1e-4, atol=1e-6), (i, n)


# Guards Note [Later buckets]: two bucket graphs sharing MemSculptor's pool, replayed
# back to back, each give the eager loss and gradients of their own batch on the same draws
# (neither overwrites the other's buffers while it runs). "alternate": each bucket gets its
# warm-up microbatch before any capture; "later": the long bucket first appears after the short one
# is captured and is captured at once (no eager warm-up in torch's default pool beside the graph
# pool), so only the first microbatch runs eager.
@needs_cuda
@pytest.mark.parametrize("order,replays", [("alternate", 6), ("later", 5)])
def test_two_bucket_graphs_share_memsculptor_pool(order, replays):
    ms, pool = _memsculptor_graph_pool()
    short, long_ = _batch(length=4, device="cuda", seed=1), _batch(length=7, device="cuda", seed=2)
    batches = [short, long_] * 4 if order == "alternate" else [short, short, long_, short, long_,
                                                                long_]
    got, step = _graphed_run(batches, seed=5, mem_pool=pool, buckets=(5, 8))
    st = step.stats()
    assert st["captures"] == 2 and st["replays"] == replays and not st["capture_failures"], st
    _assert_runs_match(got, _eager_run(batches, seed=5, buckets=(5, 8)))
    step.release()
    del pool, step, got
    assert ms.close(graphs_released=True)["live_allocations"] == 0


# Guards Note [Graphed MoE]: tiny-moe (no capacity limit, torch's grouped GEMM, bf16 autocast) is
# captured, and its replays give eager's losses on the same draws; the per-expert counts read
# after a replay are those of the replayed batch (every assignment counted once per layer).
@needs_cuda
def test_moe_capture_matches_eager():
    from loongforge.moe import grouped_mm_backend
    if grouped_mm_backend() != "torch":
        pytest.skip("torch's grouped GEMM needs sm90+ (the padded-bmm fallback is not graphed)")
    cfg = get_config("tiny-moe", image_size=28)
    batch = _batch(device="cuda")

    def make():
        torch.manual_seed(0)
        return Gr00tPolicy(cfg).to("cuda").train()

    ref_model, model = make(), make()
    gen_ref = torch.Generator(device="cuda").manual_seed(7)
    step = graphs.GraphedStep(model, torch.device("cuda"), token_buckets=(8,), warmup=1,
                              autocast_dtype=torch.bfloat16, log=lambda m: None)
    gen = torch.Generator(device="cuda").manual_seed(7)
    padded, _ = graphs.pad_to_bucket(batch, (8,))
    for i in range(4):
        for m in (ref_model, model):
            for p in m.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        noise = ref_model.draw_noise(2, batch["action"].shape[1], torch.device("cuda"), gen_ref)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            ref = ref_model(padded, noise=noise[0], time_u=noise[1])["loss"]
        ref.backward()
        out = step(batch, gen)
        torch.cuda.synchronize()
        assert torch.allclose(out["loss"], ref.detach(), rtol=1e-3, atol=1e-4), (i, out["loss"], ref)
        counts, dropped = model.expert_load()
        ref_counts, _ = ref_model.expert_load()
        assert torch.equal(counts, ref_counts) and int(dropped) == 0, (i, counts, ref_counts)
    st = step.stats()
    assert st["captures"] == 1 and st["replays"] == 3 and not st["capture_failures"], st


def _steps_with_optimizer(batches, seed, grads_in_pool, mem_pool=None, pad_up=1.0):
    """Trainer-like steps, one microbatch each: zero the gradients as the trainer does (set to
    None until a graph holds them), forward + backward through a GraphedStep (buckets 5 and 8,
    warm-up 1), SGD with momentum. Returns the losses, the parameters after every step, the model
    and the step runner; the runner's keeps_grads before each step is in its .kept list."""
    model = _model("cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    step = graphs.GraphedStep(model, torch.device("cuda"), token_buckets=(5, 8), warmup=1,
                              autocast_dtype=None, log=lambda m: None, mem_pool=mem_pool,
                              grads_in_pool=grads_in_pool, pad_up=pad_up)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    losses, states = [], []
    step.kept = []
    for batch in batches:
        step.kept.append(step.keeps_grads)
        opt.zero_grad(set_to_none=not step.keeps_grads)  # as the trainer's zero_grad
        out = step(batch, gen)
        opt.step()
        losses.append(out["loss"].clone())
        states.append([p.detach().clone() for p in params])
    torch.cuda.synchronize()
    return losses, states, model, step


# Guards Note [Gradients in the graph pool]: with the gradients made by the first capture inside
# MemSculptor's graph pool (sharing blocks with activations), steps with an optimizer between
# microbatches, over two buckets (the later one accumulating into the first one's gradients),
# give the losses and parameters of gradients allocated up front; the gradients lie in the pool's
# segments; release() drops them so that the pool goes back whole.
@needs_cuda
def test_grads_in_pool_train_like_fixed_grads():
    ms, pool = _memsculptor_graph_pool()
    short, long_ = _batch(length=4, device="cuda", seed=1), _batch(length=7, device="cuda", seed=2)
    batches = [short, short, long_, short, long_, long_, short]
    ref_losses, ref_states, _, ref_step = _steps_with_optimizer(batches, 3, grads_in_pool=False)
    losses, states, model, step = _steps_with_optimizer(batches, 3, grads_in_pool=True,
                                                        mem_pool=pool)
    for st in (ref_step.stats(), step.stats()):
        assert st["captures"] == 2 and st["replays"] == 6 and not st["capture_failures"], st
    for i in range(len(batches)):
        assert torch.allclose(losses[i], ref_losses[i], rtol=1e-5, atol=1e-6), (i, losses[i],
                                                                               ref_losses[i])
        for a, b in zip(states[i], ref_states[i]):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), i
    segs = [s for s in torch.cuda.memory_snapshot() if "segment_pool_id" in s]
    if segs:  # torch names each segment's pool: every gradient is in the graph pool's
        in_pool = [(s["address"], s["address"] + s["total_size"]) for s in segs
                   if tuple(s["segment_pool_id"]) == tuple(pool.id)]
        ptrs = [p.grad.data_ptr() for p in model.parameters() if p.grad is not None]
        assert ptrs and all(any(lo <= a < hi for lo, hi in in_pool) for a in ptrs)
    # dropped in the eager warm-up and before the first capture, as tuned PyTorch drops them
    assert step.kept == [False, False] + [True] * 5 and all(ref_step.kept), (step.kept,
                                                                           ref_step.kept)
    step.release()
    assert all(p.grad is None for p in model.parameters())
    del pool, step, losses, states
    assert ms.close(graphs_released=True)["live_allocations"] == 0


# Guards Note [Padding up to a captured bucket]: with the gradients in the pool, a shorter batch
# whose bucket has no graph runs in the captured longer bucket's graph (no second capture, so the
# pool does not grow by the gradients) and trains as the run that captures both buckets with
# fixed gradients: the same losses and parameters (the extra text is masked padding).
@needs_cuda
def test_grads_in_pool_pads_up_to_the_captured_bucket():
    ms, pool = _memsculptor_graph_pool()
    short, long_ = _batch(length=4, device="cuda", seed=1), _batch(length=7, device="cuda", seed=2)
    batches = [long_, long_, short, long_, short, short]
    ref_losses, ref_states, _, ref_step = _steps_with_optimizer(batches, 3, grads_in_pool=False)
    losses, states, model, step = _steps_with_optimizer(batches, 3, grads_in_pool=True,
                                                        mem_pool=pool, pad_up=1.6)
    st = step.stats()
    assert st["captures"] == 1 and st["padded_up"] == 3 and st["replays"] == 5, st
    assert ref_step.stats()["captures"] == 2 and ref_step.stats()["padded_up"] == 0
    for i in range(len(batches)):
        assert torch.allclose(losses[i], ref_losses[i], rtol=1e-5, atol=1e-6), (i, losses[i],
                                                                               ref_losses[i])
        for a, b in zip(states[i], ref_states[i]):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), i
    step.release()
    del pool, step, losses, states
    assert ms.close(graphs_released=True)["live_allocations"] == 0


_FAILED_CAPTURE = r"""
import gc, sys, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from test_graphs import _batch, _model
from loongforge.graphs import GraphedStep

dev = torch.device("cuda")
model = _model(dev)
batch = _batch(b=16, device=dev)


def reads_host(batch, noise=None, time_u=None):  # a host read: refused under capture
    out = model(batch, noise=noise, time_u=time_u)
    if torch.cuda.is_current_stream_capturing():
        float(out["loss"])
    return out


def allocated():
    # cuBLAS keeps a workspace per stream for the process's life (the warm-up's side stream and
    # the capture stream add theirs): dropped here, so that only tensors are compared.
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    return torch.cuda.memory_allocated()


def step(runner_graphs):
    model.zero_grad(set_to_none=True)
    s = GraphedStep(model, dev, runner=reads_host, warmup=1, graphs=runner_graphs,
                    grads_in_pool=True, log=lambda m: None)
    gen = torch.Generator(dev).manual_seed(3)
    losses = []
    for _ in range(2):  # a warm-up microbatch, then the capture (which fails) or eager again
        model.zero_grad(set_to_none=True)
        losses.append(float(s(batch, gen)["loss"]))
    model.zero_grad(set_to_none=True)
    return s, losses, allocated()


# What one forward keeps for backward: the failed capture's share if its tensors were held.
before = allocated()
with torch.autocast("cuda", dtype=torch.bfloat16):
    held = model(batch)
kept = allocated() - before
del held
_, ref, ref_mem = step(False)
s, got, mem = step(True)
st = s.stats()
assert st["captures"] == 0 and len(st["capture_failures"]) == 1, st
assert got == ref, (got, ref)
assert kept > (4 << 20), kept
assert mem - ref_mem < kept // 2, (mem, ref_mem, kept)  # the failed capture's tensors are freed
print("ok")
"""


# Guards a failed capture's fallback (in a fresh process: on torch 2.11 a failed capture leaves the
# default CUDA generator unusable): the microbatch runs eager with the numbers drawn for it, the
# same loss as an eager run, and the failed capture's tensors are freed before it, not held by
# the exception's frames (seen under a memory cap that made the fallback run out too).
@needs_cuda
def test_failed_capture_falls_back_to_eager_and_frees_its_tensors():
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.join(os.path.dirname(graphs.__file__), "..")
    r = subprocess.run([sys.executable, "-c", _FAILED_CAPTURE, here, pkg], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


# Guards capture against compilation: a torch.compile'd function called for the first time (or
# with new guards) inside a capture would compile there, and compiling reads the RNG state and
# syncs, which ends the capture. Under _no_compile_under_capture it runs eager code, is captured
# and replays the right numbers.
@needs_cuda
@pytest.mark.skipif(not hasattr(getattr(torch, "compiler", None), "set_stance"),
                    reason="needs torch.compiler.set_stance (torch >= 2.6)")
def test_compiled_function_first_called_under_capture_is_captured_eager():
    fn = torch.compile(lambda t: torch.sin(t) * 2 + 1, dynamic=False)
    x = torch.randn(1000, device="cuda")
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with graphs._no_compile_under_capture(), torch.cuda.graph(g):
        y = fn(x)
    x.copy_(torch.randn(1000, device="cuda"))
    g.replay()
    torch.testing.assert_close(y, torch.sin(x) * 2 + 1)
