"""MoE: grouped expert GEMMs, counted drops, expert parallelism over Gloo (loongforge.moe)."""
import datetime
import json
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loongforge import moe
from loongforge.models import count_parameters, get_config, gr00t
from loongforge.comm import SyncBackend
from loongforge.trainer.dist import Dist
from loongforge.trainer.model import build_model
from loongforge.trainer.optim import optimizer_step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gmm_case(counts, k=12, n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor(counts, dtype=torch.long)
    x = torch.randn(int(counts.sum()), k, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(len(counts), n, k, generator=g, dtype=torch.float64, requires_grad=True)
    return x, w, counts


# Guards: the no-loop grouped GEMM (fallback path) equals a per-expert loop, forward and backward,
# with empty experts (first, middle, last) and a single token.
@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0, 1, 0], [1], [0, 4, 0], [7, 2, 0]])
def test_grouped_mm_matches_per_expert_loop(counts):
    x, w, c = _gmm_case(counts)
    y = moe.grouped_mm(x, w, c)
    gy = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), gy)
    y_ref = moe.grouped_mm_reference(x, w, c)
    gx_ref, gw_ref = torch.autograd.grad(y_ref, (x, w), gy)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)
    torch.testing.assert_close(gw, gw_ref)
    assert moe.grouped_mm_backend(x, w) == "padded_bmm"  # CPU: the reference fallback


# Guards the grouped GEMM's self-check: when the first grouped_mm call runs under no_grad or
# inference_mode (an evaluation, a benchmark's forward), the check still takes its gradients
# instead of failing and disabling torch's kernel for the process (bench/moe/grouped_gemm.py on
# the H200 measured the fallback that way). torch's kernel is stood in for by the fallback here.
def test_grouped_mm_self_check_runs_under_no_grad(monkeypatch):
    from loongforge import moe
    monkeypatch.setattr(moe, "_torch_gmm", lambda x, w, c: moe._padded_bmm(
        x.float(), w.float(), c).to(x.dtype))
    for mode in (torch.no_grad, torch.inference_mode):
        monkeypatch.setattr(moe, "_gmm_checked", None)
        with mode():
            assert moe._self_check(torch.device("cpu")) is True
        assert moe._gmm_checked is True


# Guards: shapes that cannot be a grouped GEMM are refused with the shapes named.
def test_grouped_mm_refuses_bad_shapes():
    x, w, c = _gmm_case([2, 2])
    with pytest.raises(ValueError, match="grouped_mm"):
        moe.grouped_mm(x, w, c[:1])


# Guards: a capacity limit drops assignments past it and counts every one (never silently).
def test_capacity_drops_are_counted():
    idx = torch.tensor([[0, 1], [0, 2], [0, 1], [0, 3]])  # expert 0 chosen 4 times
    r = moe.route(idx, 4, capacity=2)
    assert r.routed.tolist() == [4, 2, 1, 1]
    assert r.counts.tolist() == [2, 2, 1, 1] and int(r.dropped) == 2
    assert r.order.numel() == 6
    kept_tokens = (r.order[:2] // 2).tolist()
    assert kept_tokens == [0, 1]  # the earliest tokens keep their place
    # The layer reports them; with no limit nothing drops.
    torch.manual_seed(0)
    ff = gr00t.MoEFeedForward(16, 2, experts=4, top_k=2, capacity_factor=0.5)
    y = ff(torch.randn(2, 8, 16))
    assert int(ff.last_dropped) > 0 and torch.isfinite(y).all()
    assert int(ff.last_expert_counts.sum()) == 32  # counts are the demand, drops included
    ff.capacity_factor = 0.0
    ff(torch.randn(2, 8, 16))
    assert int(ff.last_dropped) == 0


# Guards: n16-moe is fine-grained (16 quarter-width experts, top-2) and <= 6.5B parameters,
# counted on the meta device; the shared-expert option stays under the bound too.
def test_n16_moe_fits_parameter_budget():
    cfg = get_config("n16-moe")
    assert cfg.moe_experts == 16 and cfg.moe_top_k == 2
    assert cfg.moe_expert_hidden * 4 == cfg.dit_dim * cfg.dit_ff_mult
    assert count_parameters(cfg)["total"] <= 6.5e9
    assert count_parameters(get_config("n16-moe", moe_shared_experts=1))["total"] <= 6.5e9
    assert count_parameters(cfg)["total"] > count_parameters(get_config("n16"))["total"]


# Guards: bad MoE / expert-parallel configs are refused with the setting named.
def test_bad_configs_refused():
    with pytest.raises(ValueError, match="not divisible by --expert-parallel 3"):
        moe.check_expert_parallel(8, 2, 3, 3)
    with pytest.raises(ValueError, match="moe_top_k 9"):
        moe.check_expert_parallel(8, 9, 1, 1)
    with pytest.raises(ValueError, match="moe_top_k 9"):
        get_config("tiny-moe", moe_top_k=9)
    with pytest.raises(ValueError, match="world size 2 is not divisible"):
        moe.check_expert_parallel(8, 2, 4, 2)
    with pytest.raises(ValueError, match="needs torch.distributed"):
        moe.ExpertParallel(2, 8, 2)


def _global_batch(step: int, b: int = 8):
    g = torch.Generator().manual_seed(100 + step)
    cfg = get_config("tiny-moe")
    length, horizon = 6, 8
    batch = {"images": torch.randn(b, 1, 3, cfg.image_size, cfg.image_size, generator=g),
             "tokens": torch.randint(1, 200, (b, length), generator=g),
             "attention_mask": torch.ones(b, length, dtype=torch.bool),
             "state": torch.randn(b, 6, generator=g),
             "action": torch.randn(b, horizon, 5, generator=g),
             "action_mask": torch.ones(b, horizon, dtype=torch.bool)}
    noise = torch.randn(b, horizon, cfg.max_action_dim, generator=g)
    u = torch.rand(b, generator=g)
    return batch, noise, u


def _ep_worker(rank: int, world: int, ep_size: int, port: int, steps: int, out: str,
               kind: str = "ddp") -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
    model = build_model("tiny-moe", seed=0).train()
    ep = moe.ExpertParallel(ep_size, 8, 2, timeout_s=60) if ep_size > 1 else None
    if ep is not None:
        model.shard_experts(ep)
    sync = SyncBackend(model, Dist(rank, world), kind if world > 1 else "none", ep=ep)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for step in range(steps):
        batch, noise, u = _global_batch(step)
        per = noise.shape[0] // world
        sl = slice(rank * per, (rank + 1) * per)
        sync.zero_grad(opt)
        o = sync.wrapped({k: v[sl] for k, v in batch.items()}, noise=noise[sl], time_u=u[sl])
        o["loss"].backward()
        sync.finish()
        acc = torch.zeros(6)
        acc[0], acc[1], acc[2] = o["loss"].detach(), o["fm_loss"].detach(), o["aux_loss"].detach()
        sync.average_losses(acc)
        optimizer_step(opt, params, 1.0, acc, sync)
        losses.append(float(acc[0]))
    stats = sync.stats()
    sync.close()
    # Every rank's copy of the dense weights and of each expert it holds, to compare across ranks.
    digest = {n: float(p.detach().double().sum()) for n, p in model.named_parameters()}
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"losses": losses, "params": digest,
                   "expert_parallel": stats.get("expert_parallel")}, f)
    if world > 1:
        dist.destroy_process_group()


def _run(world: int, ep_size: int, steps: int, out: str, kind: str = "ddp") -> list:
    port = _free_port()
    if world == 1:
        _ep_worker(0, 1, 1, port, steps, out)
    else:
        mp.start_processes(_ep_worker, args=(world, ep_size, port, steps, out, kind),
                           nprocs=world, start_method="spawn")
    with open(out + ".0") as f:
        return json.load(f)["losses"]


# Guards: tiny-moe with --expert-parallel 4 on 4 processes (Gloo) follows one process holding the
# global batch step for step (fp32, relative 1e-4, 6 steps): all-to-all dispatch, global aux
# fractions, expert-gradient reduction and the global clip norm all exact.
def test_expert_parallel_4_matches_one_process(tmp_path):
    ref = _run(1, 1, 6, str(tmp_path / "one.json"))
    ep4 = _run(4, 4, 6, str(tmp_path / "ep4.json"))
    assert len(ref) == len(ep4) == 6
    for a, b in zip(ref, ep4):
        assert abs(a - b) <= 1e-4 * abs(a), (ref, ep4)
    assert ref[-1] != ref[0]  # it trained


# Guards expert gradients under NexusSync with expert parallelism: 4 ranks in 2 expert-parallel
# groups, so each expert's gradient is reduced by NexusSync over its 2-rank expert-data-parallel
# group (its own bucket, issued during backward) and averaged over all 4 ranks. The loss curve is
# the one process's, and ranks holding the same experts end with the same weights.
def test_expert_parallel_under_nexussync_matches_one_process(tmp_path):
    ref = _run(1, 1, 4, str(tmp_path / "one.json"))
    out = str(tmp_path / "ep2.json")
    got = _run(4, 2, 4, out, kind="nexussync")
    for a, b in zip(ref, got):
        assert abs(a - b) <= 1e-4 * abs(a), (ref, got)
    ranks = []
    for r in range(4):
        with open(f"{out}.{r}") as f:
            ranks.append(json.load(f))
    for r in (1, 2, 3):  # dense weights: everywhere the same
        for n, v in ranks[0]["params"].items():
            if ".experts." not in n:
                assert abs(v - ranks[r]["params"][n]) <= 1e-6 * max(1.0, abs(v)), (r, n)
    # Ranks 0 and 2 hold experts 0..3, ranks 1 and 3 experts 4..7: each pair agrees.
    for a, b in ((0, 2), (1, 3)):
        for n, v in ranks[a]["params"].items():
            assert abs(v - ranks[b]["params"][n]) <= 1e-6 * max(1.0, abs(v)), (a, b, n)
    ep = ranks[0]["expert_parallel"]
    assert ep["expert_sync"]["world_size"] == 2 and ep["expert_grad_bytes"] > 0
    assert set(ep["expert_sync"]["bucket_groups"]) <= {"expert_high", "expert_low"}


def _a2a_worker(rank: int, world: int, port: int, die: bool, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    ep = moe.ExpertParallel(world, 4, 2, timeout_s=3)
    # Round trip: rows sorted by expert go out and come back exactly (identity compute).
    g = torch.Generator().manual_seed(rank)
    counts = torch.randint(0, 4, (4,), generator=g)
    counts[rank] = 0  # an empty expert
    xs = torch.randn(int(counts.sum()), 3, generator=g, requires_grad=True)
    seen = []

    def compute(rows, local_counts):
        seen.append(int(local_counts.sum()))
        return rows * 2.0

    ys = ep.dispatch_compute(xs, counts, compute)
    ys.sum().backward()
    ok = torch.equal(ys, xs * 2.0) and torch.equal(xs.grad, torch.full_like(xs, 2.0))
    result = {"round_trip": ok, "received": seen[0]}
    if die and rank == 1:
        os._exit(0)  # a rank that dies before the next exchange
    if die:
        t0 = time.monotonic()
        try:
            ep.dispatch_compute(xs, counts, compute)
            result["error"] = None
        except RuntimeError as e:
            result["error"] = str(e)
        result["waited_s"] = time.monotonic() - t0
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    if not die:
        dist.destroy_process_group()
    else:
        # A Gloo group that lost a peer with an all-to-all still pending can abort the process
        # in torch's teardown at interpreter exit ("terminate called without an active
        # exception", SIGABRT: one CPU CI run). The error this test checks is written above.
        os._exit(0)


# Guards: the expert-parallel all-to-all round trip is exact (forward and backward, an empty
# expert), and a rank that dies makes its peer fail within the timeout with a clear error.
def test_all_to_all_round_trip_and_dead_rank(tmp_path):
    out = str(tmp_path / "a2a")
    mp.start_processes(_a2a_worker, args=(2, _free_port(), False, out), nprocs=2,
                       start_method="spawn")
    for r in range(2):
        with open(f"{out}.{r}") as f:
            res = json.load(f)
        assert res["round_trip"], res
    ctx = mp.start_processes(_a2a_worker, args=(2, _free_port(), True, out + "d"), nprocs=2,
                             start_method="spawn", join=False)
    while not ctx.join(timeout=30):
        pass
    with open(f"{out}d.0") as f:
        res = json.load(f)
    assert res["error"] and "expert parallel: all-to-all" in res["error"], res
    assert "may have died" in res["error"]


def _tiny_moe_args(tmp_path) -> list:
    """A small DB under tmp_path (packed by loongforge itself: the GPU machine has no
    python3-lmdb for lf_testdb) and the trainer flags of a tiny-moe CPU run on it."""
    from loongforge import packing

    packing.demo_data(str(tmp_path / "raw"), episodes=2, cameras=2, width=64, height=48,
                      steps_min=6, steps_max=8, state_dim=8, action_dim=7)
    db = str(tmp_path / "db")
    packing.pack(str(tmp_path / "raw"), db)
    return ["--config", "tiny-moe", "--data", db, "--batch-size", "2", "--warmup", "1",
            "--workers", "0", "--loader-threads", "1", "--quiet", "--threads", "1",
            "--device", "cpu"]


# Guards: the trainer runs tiny-moe with NexusSync top-k on the low-load expert group, writes
# per-expert token counts and drops into each metrics row, and refuses a bad --expert-parallel.
def test_trainer_tiny_moe_metrics_and_refusals(tmp_path):
    from loongforge import train

    common = _tiny_moe_args(tmp_path) + ["--steps", "2", "--no-vault"]
    rows = str(tmp_path / "m.jsonl")
    out = str(tmp_path / "s.json")
    assert train.main(common + ["--topk-ratio", "0.05", "--metrics-jsonl", rows,
                                "--json-out", out]) == 0
    with open(rows) as f:
        lines = [json.loads(x) for x in f]
    assert all(len(r["expert_tokens"]) == 8 and r["dropped_tokens"] == 0 for r in lines)
    assert all(sum(r["expert_tokens"]) > 0 for r in lines)
    with open(out) as f:
        stats = json.load(f)["nexussync_stats"]
    assert "expert" in json.dumps(stats)
    assert train.main(common + ["--expert-parallel", "3"]) == 2  # 8 experts, and world 1
    assert train.main(common + ["--set", "moe_top_k=9"]) == 2
    assert train.main(common + ["--topk-ratio", "0.05", "--mode", "baseline"]) == 2


def _train_ranks(world: int, argv: list, tmp_path, name: str) -> dict:
    """`python -m loongforge.train argv` on `world` CPU processes (Gloo, as torchrun would set
    them up); returns rank 0's summary JSON."""
    import subprocess
    import sys

    out = str(tmp_path / f"{name}.json")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "python"), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-m", "loongforge.train", *argv,
                               "--json-out", out], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    with open(out) as f:
        return json.load(f)


# Guards: checkpoints under --expert-parallel (Note [Expert-parallel checkpoints] in moe.py).
# Each rank holds other experts under the same local names, so a resume that restored only rank
# 0's state would give rank 1 rank 0's experts and a different loss curve: here a run preempted
# after step 3 and resumed from its step-2 checkpoint continues exactly as the run that was not.
def test_expert_parallel_resume_is_exact(tmp_path):
    base = _tiny_moe_args(tmp_path) + ["--steps", "4", "--ckpt-every", "2",
                                       "--expert-parallel", "2"]
    full = _train_ranks(2, base + ["--ckpt-dir", str(tmp_path / "c1")], tmp_path, "full")
    _train_ranks(2, base + ["--stop-after", "3", "--ckpt-dir", str(tmp_path / "c2")], tmp_path,
                 "part")
    res = _train_ranks(2, base + ["--resume", "--ckpt-dir", str(tmp_path / "c2")], tmp_path,
                       "res")
    a = [r["loss"] for r in full["loss_curve"]][2:]
    b = [r["loss"] for r in res["loss_curve"]]
    assert len(b) == 2 and a == b, (a, b)


# Guards: an expert shard that is missing or holds other experts is refused, naming both layouts,
# and a matching one restores the experts' weights and optimizer state.
def test_expert_shard_round_trip_and_refusals():
    model = build_model("tiny-moe", seed=0)
    ep = moe.ExpertParallel(1, 8, 2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.expert_parameters()[0].grad = torch.ones_like(model.expert_parameters()[0])
    opt.step()
    shard = moe.expert_shard(model, opt, ep)
    shard = {**shard, "model": {k: v.clone() for k, v in shard["model"].items()}}
    w = model.expert_parameters()[0]
    before = w.detach().clone()
    with torch.no_grad():
        w.add_(1.0)
    moe.load_expert_shard(model, opt, ep, shard)
    assert torch.equal(w.detach(), before)
    with pytest.raises(ValueError, match="no expert shard"):
        moe.load_expert_shard(model, opt, ep, None)
    with pytest.raises(ValueError, match=r"holds experts 4\.\.11 of --expert-parallel 2"):
        moe.load_expert_shard(model, opt, ep, {**shard, "first_expert": 4, "expert_parallel": 2})
