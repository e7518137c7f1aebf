"""Tests of NexusSync (python/loongforge/comm.py) over real Gloo process groups on 127.0.0.1.

Each multi-process test spawns ranks with torch.multiprocessing; assertions run inside the ranks
and a failing rank fails the test with its traceback.
"""
import copy
import datetime
import json
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from loongforge import comm
from loongforge.comm import NexusSync


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, world, port, timeout_s=30):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


class Tiny(nn.Module):
    """Embedding, residual blocks, 4 experts, a frozen layer, a sometimes-unused layer, a head."""

    def __init__(self, width=32, bad=False):
        super().__init__()
        self.emb = nn.Linear(8, width)
        self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(3)])
        self.unused = nn.Linear(width, width + (1 if bad else 0))
        self.experts = nn.ModuleList([nn.Linear(width, width) for _ in range(4)])
        self.frozen = nn.Linear(width, width)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(width, 4)

    def forward(self, x, use_unused=True):
        h = self.emb(x)
        for b in self.blocks:
            h = h + torch.relu(b(h))
        if use_unused:
            h = h + self.unused(h)[..., :h.shape[-1]]
        h = h + sum(e(h) for e in self.experts) / 4
        return self.head(self.frozen(h))


def _trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _flat_reference(sync, ref_model, world):
    """Per bucket: the reference model's local grads laid out like the bucket, all-reduced, /W."""
    ref = dict(ref_model.named_parameters())
    out = []
    for b in sync.buckets:
        flat = torch.cat([ref[s.name].grad.reshape(-1) if ref[s.name].grad is not None
                          else torch.zeros(s.numel) for s in b.slots])
        dist.all_reduce(flat)
        out.append(flat / world)
    return out


def _suite(rank, world, port):
    _init(rank, world, port)
    torch.manual_seed(0)
    model = Tiny()
    ref_model = copy.deepcopy(model)
    # Cap 0.004 MB: one bucket per layer with DDP's close-after-cap rule (>= 6 buckets).
    ddp_model = nn.parallel.DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=0.004,
                                                    find_unused_parameters=True)
    sync = NexusSync(model, bucket_cap_mb=0.004, first_bucket_mb=0.001)
    assert len(sync.buckets) >= 6, len(sync.buckets)
    torch.manual_seed(100 + rank)
    x = torch.randn(16, 8)
    use_unused = rank % 2 == 0  # odd ranks leave `unused` without a grad: its bucket is late

    # Exactness: bitwise equal to an all-reduce of the same flat buffer, /W.
    model(x, use_unused).square().mean().backward()
    sync.finish()
    ref_model(x, use_unused).square().mean().backward()
    for b, want in zip(sync.buckets, _flat_reference(sync, ref_model, world)):
        assert torch.equal(b.buffer, want), f"bucket {b.index} differs"
    # ... and equal to the float64 mean of every rank's grads (summation-order rounding only).
    for (n, p), (_, q) in zip(_trainable(model), _trainable(ref_model)):
        local = q.grad.double() if q.grad is not None else torch.zeros_like(p, dtype=torch.float64)
        gathered = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        mean = torch.stack(gathered).mean(0)
        err = (p.grad.double() - mean).abs().max() / mean.abs().max().clamp_min(1e-30)
        assert err <= 1e-6, (n, float(err))
    # ... and to DDP (different bucket layout, so different summation order: tolerance).
    ddp_model(x, use_unused).square().mean().backward()
    for (n, p), (_, q) in zip(_trainable(model), _trainable(ddp_model.module)):
        qg = q.grad if q.grad is not None else torch.zeros_like(p)
        assert torch.allclose(p.grad, qg, rtol=1e-6, atol=1e-7), n

    # Views: every trainable .grad lives inside its bucket; frozen params have none.
    for b in sync.buckets:
        base, end = b.buffer.data_ptr(), b.buffer.data_ptr() + b.buffer.numel() * 4
        for s in b.slots:
            assert base <= s.param.grad.data_ptr() < end and s.param.grad._base is not None, s.name
    assert model.frozen.weight.grad is None
    assert all("frozen" not in s.name for b in sync.buckets for s in b.slots)

    # Ordering: same issue order on every rank although readiness order differs (unused param).
    order = sync.stats()["last_step"]["issue_order"]
    orders = [None] * world
    dist.all_gather_object(orders, order)
    assert all(o == orders[0] for o in orders) and order == list(range(len(sync.buckets))), orders
    assert sync.stats()["bucket_bytes"][0] <= 0.001 * 2**20 + 32 * 33 * 4  # small first bucket

    # Accumulation: non-final micro-steps communicate nothing; the result is the summed grads.
    sync.zero_grad()
    ref_model.zero_grad()
    before = sync.stats()["collectives"]
    xs = [torch.randn(16, 8) for _ in range(3)]
    for i, xi in enumerate(xs):
        sync.set_micro_step(is_last=(i == 2))
        model(xi).sum().backward()
        if i < 2:
            sync.finish()  # a no-op on non-final micro-steps
            assert sync.stats()["collectives"] == before
        ref_model(xi).sum().backward()
    sync.finish()
    assert sync.stats()["collectives"] == before + len(sync.buckets)
    for b, want in zip(sync.buckets, _flat_reference(sync, ref_model, world)):
        assert torch.equal(b.buffer, want), f"accumulated bucket {b.index} differs"
    # no_sync() form.
    sync.zero_grad()
    before = sync.stats()["collectives"]
    with sync.no_sync():
        model(xs[0]).sum().backward()
    assert sync.stats()["collectives"] == before
    model(xs[1]).sum().backward()
    sync.finish()
    assert sync.stats()["collectives"] == before + len(sync.buckets)
    sync.close()

    # Top-k + error feedback on the low-load experts: nothing is lost, exactly. Integer-valued
    # grads (loss = sum(p * C)) keep every fp32 sum exact; W is a power of two.
    torch.manual_seed(0)
    moe = Tiny()
    tk = NexusSync(moe, bucket_cap_mb=0.004, first_bucket_mb=0.001,
                   expert_param_filter=r"^experts\.", expert_load=[100, 1, 100, 2],
                   topk_ratio=0.1)
    groups = {s.name: b.group for b in tk.buckets for s in b.slots}
    assert groups["experts.1.weight"] == "expert_low" and groups["experts.0.weight"] == "expert_high"
    assert groups["emb.weight"] == "dense"
    params = _trainable(moe)
    gen = torch.Generator().manual_seed(1000 + rank)
    total = {n: torch.zeros_like(p) for n, p in params}
    synced = {n: torch.zeros_like(p) for n, p in params}
    for step in range(4):
        tk.zero_grad()
        coeffs = {n: torch.randint(-20, 21, p.shape, generator=gen).float() for n, p in params}
        sum((p * coeffs[n]).sum() for n, p in params).backward()
        tk.finish()
        for n, p in params:
            total[n] += coeffs[n]
            synced[n] += p.grad
    for n, p in params:
        res = tk.residual(p)
        local = total[n] - (res if res is not None else 0)
        dist.all_reduce(local)
        assert torch.equal(synced[n], local / world), n
        if groups[n] == "dense":
            assert res is None
    st = tk.stats()
    low = st["bytes_sent"]["expert_low"]
    assert 0 < low < 0.25 * st["bytes_dense_equivalent"]["expert_low"], st
    assert st["bytes_sent"]["dense"] == st["bytes_dense_equivalent"]["dense"]
    tk.close()

    # Plan mismatch: the last rank builds a different model -> a clear error on every rank.
    torch.manual_seed(0)
    other = Tiny(bad=(rank == world - 1))
    try:
        NexusSync(other, bucket_cap_mb=0.004, first_bucket_mb=0.001)
    except RuntimeError as e:
        msg = str(e)
        assert "plans differ" in msg and "unused.bias" in msg and "[33]" in msg, msg
    else:
        raise AssertionError("plan mismatch not detected")
    dist.barrier()
    dist.destroy_process_group()


# Guards exactness, views, ordering, accumulation, frozen/unused params, top-k conservation and
# plan checks at 2 ranks.
def test_suite_2_ranks():
    mp.spawn(_suite, args=(2, _free_port()), nprocs=2, join=True)


# Guards the same at 4 ranks (different Gloo reduction schedule, more late buckets).
def test_suite_4_ranks():
    mp.spawn(_suite, args=(4, _free_port()), nprocs=4, join=True)


def _failure_worker(rank, world, port, mode, out_dir):
    _init(rank, world, port, timeout_s=4)
    torch.manual_seed(0)
    model = Tiny()
    sync = NexusSync(model, bucket_cap_mb=0.005, first_bucket_mb=0.001, timeout_s=4)
    if rank == 1:
        if mode == "exit":
            os._exit(0)  # dies mid-step, without a word to its peers
        deadline = time.time() + 30  # hangs: alive but never joins the collectives
        while time.time() < deadline and not os.path.exists(os.path.join(out_dir, "done")):
            time.sleep(0.1)
        os._exit(0)
    t0 = time.time()
    err = None
    try:
        model(torch.randn(16, 8)).sum().backward()
        sync.finish()
    except RuntimeError as e:
        err = str(e)
    elapsed = time.time() - t0
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"err": err, "elapsed": elapsed}, f)
    open(os.path.join(out_dir, "done"), "w").close()
    os._exit(0)


@pytest.mark.parametrize("mode", ["exit", "hang"])
# Guards failure handling: a dead or hung peer gives a RuntimeError naming the bucket within the
# timeout (4 s), never a hang.
def test_dead_or_hung_rank_raises_within_timeout(tmp_path, mode):
    mp.spawn(_failure_worker, args=(2, _free_port(), mode, str(tmp_path)), nprocs=2, join=True)
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["err"] is not None, "no error raised"
    assert "NexusSync" in res["err"] and "bucket" in res["err"], res["err"]
    assert res["elapsed"] < 10.0, res


# Guards local mode (no torch.distributed): flat buffers, views, no collectives, plain grads.
def test_local_mode_without_process_group():
    assert not dist.is_initialized()
    torch.manual_seed(0)
    model = Tiny()
    ref = copy.deepcopy(model)
    sync = NexusSync(model, bucket_cap_mb=0.005, first_bucket_mb=0.001)
    x = torch.randn(4, 8)
    model(x).sum().backward()
    sync.finish()
    ref(x).sum().backward()
    for (n, p), (_, q) in zip(_trainable(model), _trainable(ref)):
        assert torch.equal(p.grad, q.grad), n
    st = sync.stats()
    assert st["world_size"] == 1 and st["collectives"] == 0 and st["steps"] == 1
    # zero_grad(set_to_none) by an optimizer: grads move back into the buckets on the next step.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    sync.finish()
    b0 = sync.buckets[-1]
    assert b0.slots[0].param.grad.data_ptr() == b0.buffer.data_ptr() + 4 * b0.slots[0].offset
    assert torch.equal(model.emb.weight.grad, ref.emb.weight.grad)


# Guards the Python kernel wrappers: agree with torch.topk, conserve, reject bad input as ValueError.
def test_kernel_wrappers():
    g = torch.randn(10000)
    res = torch.randn(10000)
    acc = res + g
    vals, idx = comm.topk_error_feedback(g, res, 100)
    want = torch.topk(acc.abs(), 100).indices.sort().values
    assert torch.equal(idx.long(), want)
    assert torch.equal(vals, acc[want])
    assert torch.equal(res + torch.zeros(10000).index_put_((idx.long(),), vals), acc)
    vb, ib = comm.topk_error_feedback(g.bfloat16(), torch.zeros(10000), 10, torch.bfloat16)
    assert vb.dtype == torch.bfloat16 and ib.numel() == 10
    dense = torch.zeros(10000)
    comm.scatter_add(torch.cat([vals, vals]), torch.cat([idx, idx]), dense, num_segments=2,
                     scale=0.5, zero_first=True)
    assert torch.equal(dense[want], vals)
    # One call over three segments (the sparse bucket's path) gives the bits of three calls in
    # order, overlapping indices included.
    segs = [(torch.randn(50), torch.randint(0, 200, (50,), dtype=torch.int32)) for _ in range(3)]
    one, three = torch.randn(200), torch.zeros(200)
    comm.scatter_add(torch.cat([v for v, _ in segs]), torch.cat([i for _, i in segs]), one,
                     num_segments=3, scale=1 / 3, zero_first=True)
    for r, (v, i) in enumerate(segs):
        comm.scatter_add(v, i, three, scale=1 / 3, zero_first=(r == 0))
    assert torch.equal(one, three)
    with pytest.raises(ValueError):
        comm.topk_error_feedback(g, torch.zeros(5), 1)
    with pytest.raises(ValueError, match="index 10000"):
        comm.scatter_add(torch.ones(1), torch.tensor([10000], dtype=torch.int32), dense)
    with pytest.raises(ValueError):
        NexusSync(Tiny(), topk_ratio=2.0)


# Guards the bucket planner against drifting from DDP's rule (close a bucket once it reaches the
# cap; only the first bucket is small): boundaries must equal torch's own DDP assignment.
def test_bucket_boundaries_match_ddp():
    torch.manual_seed(0)
    model = Tiny()
    first_mb, cap_mb = 0.001, 0.004
    sync = NexusSync(model, bucket_cap_mb=cap_mb, first_bucket_mb=first_mb)
    rev = list(reversed(_trainable(model)))  # DDP's rebuilt (backward-ready) order
    want, _ = dist._compute_bucket_assignment_by_size(
        [p for _, p in rev], [int(first_mb * 2**20), int(cap_mb * 2**20)], [False] * len(rev))
    want_names = sorted([rev[i][0] for i in idx] for idx in want)
    got_names = sorted([s.name for s in b.slots] for b in sync.buckets)
    assert got_names == want_names, (got_names, want_names)
    assert len(sync.buckets) >= 6
    sync.close()
    # With groups: each group closes its buckets by the same rule, and only bucket 0 is small
    # (the old planner gave every group its own small first bucket).
    torch.manual_seed(0)
    moe = Tiny()
    g = NexusSync(moe, bucket_cap_mb=0.009, first_bucket_mb=0.001,
                  expert_param_filter=r"^experts\.", expert_load=[100, 1, 100, 2])
    cap, first = int(0.009 * 2**20), int(0.001 * 2**20)
    for group in comm.GROUPS:
        bs = [b for b in g.buckets if b.group == group]
        for b in bs[:-1]:  # every closed bucket reached its cap; dropping its last param would not
            limit = first if b.index == 0 else cap
            last = b.slots[-1].numel * 4
            assert b.numel * 4 >= limit and b.numel * 4 - last < limit, (group, b.index, b.numel)
    assert {b.group for b in g.buckets} == set(comm.GROUPS)
    # Each expert group (2 experts, 2 x 4224 B) is one bucket: no small first bucket of its own.
    for group in ("expert_high", "expert_low"):
        assert [b.numel * 4 for b in g.buckets if b.group == group] == [2 * 33 * 32 * 4], group
    g.close()


class SmallMoE(nn.Module):
    """A small MLP with a 4-expert layer mixed by fixed routing weights; experts 2-3 get 5%."""

    def __init__(self, d=64):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.hid = nn.Linear(d, d)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(4)])
        self.register_buffer("route", torch.tensor([0.45, 0.45, 0.05, 0.05]))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + torch.tanh(self.hid(h))
        h = h + sum(w * torch.tanh(e(h)) for w, e in zip(self.route, self.experts))
        return self.head(h)


def _convergence_worker(rank, world, port, ratio, steps, out_dir):
    _init(rank, world, port)
    # Fixed data: a teacher network's outputs on fixed inputs, a different shard per rank.
    torch.manual_seed(123)
    teacher = SmallMoE()
    gen = torch.Generator().manual_seed(7 + rank)
    xs = torch.randn(8, 32, 16, generator=gen)
    with torch.no_grad():
        ys = teacher(xs) + 0.05 * torch.randn(8, 32, 4, generator=gen)
    result = {}
    for name, topk in (("dense", None), ("topk", ratio)):
        torch.manual_seed(0)
        model = SmallMoE()
        sync = NexusSync(model, bucket_cap_mb=0.01, first_bucket_mb=0.002,
                         expert_param_filter=r"^experts\.", expert_load=[100, 100, 5, 5],
                         topk_ratio=topk)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for step in range(steps):
            sync.zero_grad()
            loss = (model(xs[step % 8]) - ys[step % 8]).square().mean()
            loss.backward()
            sync.finish()
            opt.step()
            t = loss.detach().clone()
            dist.all_reduce(t)
            losses.append(float(t) / world)
        st = sync.stats()
        result[name] = {"first": losses[0], "final": sum(losses[-10:]) / 10,
                        "sent_low": st["bytes_sent"]["expert_low"],
                        "dense_low": st["bytes_dense_equivalent"]["expert_low"]}
        sync.close()
    if rank == 0:
        with open(os.path.join(out_dir, "conv.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


# Guards the convergence target: training with top-k (5%) + error feedback on the
# low-load expert group ends within 1% of the dense run's loss (mean of the last 10 steps).
def test_topk_training_within_1pct_of_dense(tmp_path):
    mp.spawn(_convergence_worker, args=(2, _free_port(), 0.05, 150, str(tmp_path)), nprocs=2,
             join=True)
    r = json.loads((tmp_path / "conv.json").read_text())
    dense, topk = r["dense"], r["topk"]
    gap = (topk["final"] - dense["final"]) / dense["final"]
    print(f"dense final {dense['final']:.5f} topk final {topk['final']:.5f} gap {gap:+.4%}")
    assert dense["final"] < 0.3 * dense["first"], dense  # it really trained
    assert topk["sent_low"] < 0.15 * topk["dense_low"], topk  # top-k really sparsified
    assert abs(gap) <= 0.01, f"top-k final loss {gap:+.3%} off the dense run's"
