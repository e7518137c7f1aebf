"""Multi-process harness for NexusSync: all-reduce sweep, NexusSync vs DDP, kill-one-rank.

Runs the same code on Gloo (CPU processes on 127.0.0.1) and on NCCL (one process per GPU).
See docs/bench_multigpu.md; bench/multigpu.sh picks the mode from the number of GPUs.

    harness.py sweep --world 4 --sizes-mb 1 4 16 64          # bus bandwidth, NexusSync vs torch
    harness.py train --world 4 --d 128 --layers 2 --steps 6  # NexusSync vs DDP on a MoE-ish model
    harness.py kill  --world 4 --timeout-s 20                # SIGKILL one rank mid-step
    harness.py suite --worlds 4 8 --profile cpu              # all three per world, one JSON

Every task prints a table and writes JSON (--out). Ranks are started by this file
(multiprocessing spawn; RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set as torchrun sets
them), each with its stdout/stderr in a log file; the launcher joins them with a deadline and
kills whatever is left, so nothing hangs. (Not launched through torchrun: torchrun tears every
rank down when one dies, which the kill test must not have.)

Timing. Sweep: per size, `reps` blocks of `iters` back-to-back collectives (iters agreed across
ranks from one timed warm-up op), one synchronize per block; a block's time is the slowest
rank's; the figure is the median block. busbw = 2(n-1)/n x bytes / time (nccl-tests' all-reduce
convention). "nexus" is NexusSync.finish() on one flat bucket of that size (issue on the comm
stream, bounded wait, average in place); "torch" is dist.all_reduce on a tensor of that size.
Train: per mode, median step time over ranks' medians; exposed communication measured after
backward (NexusSync: time from the end of backward to the end of finish(), with the compute
stream synchronized first on GPU; DDP: step - local step, as DDP does not expose its wait);
comm_alone = finish() with no backward (the same buckets with nothing to overlap);
overlap = 1 - exposed / comm_alone.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "bench", "comm")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from multiprocessing import connection as mp_connection  # noqa: E402
import torch.nn as nn  # noqa: E402

NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
KILL_EXIT_CODE = 3  # a survivor that caught the error and exited on purpose


# ---- launcher ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _rank_entry(rank: int, world: int, port: int, task: str, a: Dict[str, Any], rundir: str) -> None:
    """Body of one spawned rank: log redirection, env as torchrun sets it, then the task."""
    log = os.open(os.path.join(rundir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    code = _run_rank(task, a, rundir)
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: no interpreter teardown that could block on a dead peer's socket.
    os._exit(code)


def _run_rank(task: str, a: Dict[str, Any], rundir: str) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(a["threads"])
    backend = a["backend"]
    device = torch.device("cpu")
    if backend == "nccl":
        for k, v in NCCL_SAFE_ENV.items():
            os.environ.setdefault(k, v)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if task == "kill":  # wait() then blocks (bounded by the group timeout) and raises
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    out: Dict[str, Any] = {"rank": rank}
    code = 0
    try:
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=a["timeout_s"]))
        out.update(TASKS[task](rank, world, device, a, rundir))
    except KillTestError as e:
        out.update(e.record)
        code = KILL_EXIT_CODE
    except Exception as e:  # reported by the launcher with this rank's log tail
        out["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        code = 1
    with open(os.path.join(rundir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code


def launch(task: str, a: Dict[str, Any], world: int, rundir: Optional[str] = None) -> Dict[str, Any]:
    """Starts `world` ranks of `task`, joins them within a deadline, returns per-rank results.

    Rank logs and results go to `rundir` (default: a new temporary folder, named in the result).
    """
    if a["backend"] == "nccl":
        os.environ.update({k: os.environ.get(k, v) for k, v in NCCL_SAFE_ENV.items()})
    rundir = rundir or tempfile.mkdtemp(prefix=f"lf_multigpu_{task}_")
    ctx = mp.get_context("spawn")
    port = _free_port()
    t0 = time.time()
    procs = [ctx.Process(target=_rank_entry, args=(r, world, port, task, a, rundir), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = t0 + a["deadline_s"]
    exited_at: Dict[int, float] = {}
    by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}
    while len(exited_at) < world and time.time() < deadline:
        live = [s for s, r in by_sentinel.items() if r not in exited_at]
        for s in mp_connection.wait(live, timeout=max(0.0, deadline - time.time())):
            exited_at[by_sentinel[s]] = time.time()
    for p in procs:
        p.join(0.5)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join(10)
    ranks = []
    for r, p in enumerate(procs):
        path = os.path.join(rundir, f"rank{r}.json")
        rec: Dict[str, Any] = {"rank": r}
        if os.path.exists(path):
            with open(path) as f:
                rec = json.load(f)
        rec["exitcode"] = p.exitcode
        rec["hung"] = r in hung
        rec["exited_at"] = exited_at.get(r)
        rec["log_tail"] = _tail(os.path.join(rundir, f"rank{r}.log"))
        ranks.append(rec)
    return {"task": task, "world": world, "backend": a["backend"], "wall_s": time.time() - t0,
            "rundir": rundir, "ranks": ranks}


def _check_ok(res: Dict[str, Any]) -> None:
    bad = [r for r in res["ranks"] if r["exitcode"] != 0 or "error" in r]
    if bad:
        r = bad[0]
        raise SystemExit(f"{res['task']} world {res['world']}: rank {r['rank']} failed "
                         f"(exit {r['exitcode']}, hung {r['hung']}): {r.get('error', '')}\n"
                         f"{r['log_tail']}")


# ---- helpers inside ranks ---------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree_max(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


class _Flat(nn.Module):
    def __init__(self, n: int, device: torch.device) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n, device=device))


# ---- task: all-reduce sweep -------------------------------------------------------------------


def task_sweep(rank: int, world: int, device: torch.device, a: Dict[str, Any],
               rundir: str) -> Dict[str, Any]:
    from loongforge.comm import NexusSync

    rows = []
    for mb in a["sizes_mb"]:
        nbytes = int(mb * 2**20)
        n = nbytes // 4
        x = torch.randn(n, device=device)
        model = _Flat(n, device)
        sync = NexusSync(model, bucket_cap_mb=mb + 1, first_bucket_mb=mb + 1,
                         timeout_s=a["timeout_s"])
        assert len(sync.buckets) == 1
        g = model.w.grad
        # Correctness first: NexusSync averages; every rank contributes rank + 1.
        g.fill_(rank + 1)
        sync.finish()
        _sync(device)
        want = (world + 1) / 2
        got = float(g[0].item()), float(g[-1].item())
        correct = all(abs(v - want) < 1e-5 for v in got)
        g.normal_()

        def torch_op(x: torch.Tensor = x) -> None:
            dist.all_reduce(x)

        ops = {"torch": torch_op, "nexus": sync.finish}
        # One timed warm-up op per implementation; iters agreed so every rank runs the same count.
        one = 0.0
        for fn in ops.values():
            dist.barrier()
            t = time.perf_counter()
            fn()
            _sync(device)
            one = max(one, time.perf_counter() - t)
        one = _agree_max(one, device)
        iters = int(min(a["max_iters"], max(a["min_iters"], a["block_s"] / max(one, 1e-6))))
        times: Dict[str, List[float]] = {k: [] for k in ops}
        for _ in range(a["reps"]):
            for name, fn in ops.items():  # interleaved, so drift hits both alike
                dist.barrier()
                _sync(device)
                t = time.perf_counter()
                for _ in range(iters):
                    fn()
                _sync(device)
                times[name].append((time.perf_counter() - t) / iters)
        rows.append({"mb": mb, "bytes": nbytes, "iters": iters, "times_s": times,
                     "nexus_correct": correct})
        sync.close()
        del x, model, sync, g
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"sweep": rows}


def merge_sweep(res: Dict[str, Any]) -> List[Dict[str, Any]]:
    world = res["world"]
    ranks = [r["sweep"] for r in res["ranks"]]
    out = []
    for i, row in enumerate(ranks[0]):
        m = {"mb": row["mb"], "bytes": row["bytes"], "iters": row["iters"],
             "nexus_correct": all(rk[i]["nexus_correct"] for rk in ranks)}
        for name in ("torch", "nexus"):
            reps = len(row["times_s"][name])
            # A block lasts as long as its slowest rank; then the median over blocks.
            t = statistics.median(max(rk[i]["times_s"][name][j] for rk in ranks)
                                  for j in range(reps))
            m[name + "_ms"] = t * 1e3
            m[name + "_busbw_GBps"] = 2 * (world - 1) / world * row["bytes"] / t / 1e9
        m["nexus_vs_torch"] = m["nexus_busbw_GBps"] / m["torch_busbw_GBps"]
        out.append(m)
    return out


def print_sweep(world: int, backend: str, rows: List[Dict[str, Any]]) -> None:
    print(f"\nall-reduce sweep, world {world} ({backend}); busbw = 2(n-1)/n x bytes / time")
    print(f"{'MB':>6} {'iters':>5} {'torch ms':>9} {'torch GB/s':>10} {'nexus ms':>9} "
          f"{'nexus GB/s':>10} {'ratio':>6} {'correct':>7}")
    for r in rows:
        print(f"{r['mb']:>6g} {r['iters']:>5} {r['torch_ms']:>9.2f} {r['torch_busbw_GBps']:>10.3f} "
              f"{r['nexus_ms']:>9.2f} {r['nexus_busbw_GBps']:>10.3f} {r['nexus_vs_torch']:>6.2f} "
              f"{str(r['nexus_correct']):>7}")


# ---- task: NexusSync vs DDP -------------------------------------------------------------------


def _model(a: Dict[str, Any], device: torch.device) -> nn.Module:
    """--model bench: bench/comm/bench_comm.py's blocks + an expert layer (sizes from --d,
    --layers, --experts). --model gr00t:CONFIG: the trainer's policy (tiny, small, n16, n16-moe),
    fed synthetic batches, so the comparison runs on the trainer's real parameter layout."""
    torch.manual_seed(0)
    if a["model"].startswith("gr00t:"):
        from loongforge.models.gr00t import Gr00tPolicy, get_config

        over = {"image_size": a["image_size"] or None}
        if a["moe_experts"]:
            over["moe_experts"] = a["moe_experts"]
        cfg = get_config(a["model"][6:], **over)
        if device.type == "cuda" and hasattr(torch.device, "__enter__"):
            with device:  # torch >= 2: initialize on the GPU (n16 has 2.9 B parameters)
                return Gr00tPolicy(cfg).train()
        return Gr00tPolicy(cfg).to(device).train()
    from bench_comm import Model

    return Model(d=a["d"], layers=a["layers"], experts=a["experts"]).to(device)


def _num_experts(model: nn.Module) -> int:
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        return int(cfg.moe_experts)
    return len(getattr(model, "experts", []))


def _inputs(a: Dict[str, Any], model: nn.Module, device: torch.device, seed: int) -> List[Any]:
    g = torch.Generator().manual_seed(seed)
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return [torch.randn(a["batch"], a["seq"], 32, generator=g).to(device) for _ in range(4)]
    b, length = a["batch"], a["seq"]
    out = []
    for _ in range(2):
        mask = torch.ones(b, length, dtype=torch.bool)
        mask[0, length * 3 // 4:] = False  # variable text length, as padded batches have
        out.append({k: v.to(device) for k, v in {
            "images": torch.randn(b, 2, 3, cfg.image_size, cfg.image_size, generator=g),
            "tokens": torch.randint(1, cfg.vocab_size, (b, length), generator=g) * mask,
            "attention_mask": mask, "state": torch.randn(b, min(14, cfg.max_state_dim), generator=g),
            "action": torch.randn(b, cfg.action_horizon, min(14, cfg.max_action_dim), generator=g),
            "action_mask": torch.ones(b, cfg.action_horizon, dtype=torch.bool)}.items()})
    return out


def _loss(model: nn.Module, x: Any, step: int, device: torch.device) -> torch.Tensor:
    if not isinstance(x, dict):
        return model(x).square().mean()
    # The policy draws flow-matching noise and time: seed them per step so every mode (and the
    # grads-vs-DDP check) sees the same draw. bf16 autocast on GPU, as the trainer runs.
    gen = torch.Generator(device=device).manual_seed(1000 + step)
    ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
           else contextlib.nullcontext())
    with ctx:
        return model(x, generator=gen)["loss"]


def _ddp_bucket_bytes(ddp: nn.parallel.DistributedDataParallel, bucket_mb: float) -> List[int]:
    """DDP's buckets after its rebuild (first 1 MB, then bucket_mb, in backward order).

    DDP's first iteration uses one bucket, then rebuilds by the order grads became ready; its
    logging data keeps the construction-time sizes, so the rebuild is recomputed here with DDP's
    own assignment function on the parameters in reverse registration order.
    """
    params = [p for p in ddp.module.parameters() if p.requires_grad][::-1]
    first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)
    idx, _ = dist._compute_bucket_assignment_by_size(params, [first, int(bucket_mb * 2**20)])
    return [sum(params[i].numel() * params[i].element_size() for i in b) for b in idx]


def _expert_load(experts: int) -> List[int]:
    # The first half of the experts take most tokens; the second half is the low-load group.
    return [100] * (experts - experts // 2) + [5] * (experts // 2)


def task_train(rank: int, world: int, device: torch.device, a: Dict[str, Any],
               rundir: str) -> Dict[str, Any]:
    from loongforge.comm import NexusSync

    # A fresh model per mode (same seed, same init), freed after it: n16 holds 2.9 B parameters.
    base = _model(a, device)
    experts = _num_experts(base)
    xs = _inputs(a, base, device, 1 + rank)
    results: Dict[str, Any] = {"params": sum(p.numel() for p in base.parameters()),
                               "trainable": sum(p.numel() for p in base.parameters()
                                                if p.requires_grad)}
    del base

    def release() -> None:  # after the caller's `del`: give the freed blocks back
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def timed(name: str, model: nn.Module, zero, finish) -> Dict[str, Any]:
        steps, exposed = [], []
        for s in range(a["warmup"] + a["steps"]):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            zero()
            _loss(model, xs[s % len(xs)], s, device).backward()
            te = time.perf_counter()
            if finish is not None:
                # Compute done (the compute stream only: a device-wide sync would also wait for
                # the comm stream); what follows is communication left exposed.
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()
                te = time.perf_counter()
                finish()
            _sync(device)
            t1 = time.perf_counter()
            if s >= a["warmup"]:
                steps.append(t1 - t0)
                exposed.append(t1 - te)
        r = {"step_ms": statistics.median(steps) * 1e3}
        if finish is not None:
            r["exposed_ms"] = statistics.median(exposed) * 1e3
        results[name] = r
        return r

    local = _model(a, device)
    timed("local", local, local.zero_grad, None)
    del local
    release()
    ddp_kw: Dict[str, Any] = {"device_ids": [device.index]} if device.type == "cuda" else {}
    if experts and a["model"].startswith("gr00t:"):
        ddp_kw["find_unused_parameters"] = True  # top-k routing leaves experts unused (trainer)
    ddp = nn.parallel.DistributedDataParallel(_model(a, device), bucket_cap_mb=a["bucket_mb"],
                                              **ddp_kw)
    timed("ddp", ddp, ddp.zero_grad, None)
    # DDP's own buckets (after its rebuild in the first steps), all-reduced with nothing to
    # overlap: DDP's communication alone, the denominator of its overlap ratio.
    ddp_sizes = _ddp_bucket_bytes(ddp, a["bucket_mb"])
    bufs = [torch.randn(max(1, n // 4), device=device) for n in ddp_sizes]
    alone = []
    for _ in range(a["steps"]):
        dist.barrier()
        _sync(device)
        t = time.perf_counter()
        works = [dist.all_reduce(b, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        _sync(device)
        alone.append(time.perf_counter() - t)
        for b in bufs:
            b.div_(world)
    results["ddp"].update(buckets=len(ddp_sizes), bucket_bytes=ddp_sizes,
                          comm_alone_ms=statistics.median(alone) * 1e3)
    del bufs
    # Reference grads for the NexusSync check: one DDP step on the first input.
    ddp.zero_grad()
    _loss(ddp, xs[0], 0, device).backward()
    ddp_grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                 for p in ddp.module.parameters() if p.requires_grad]
    del ddp
    release()
    loads = _expert_load(experts) if experts else None
    first_ddp_mb = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20) / 2**20
    variants = (  # name, topk ratio, first bucket MB, expert groups
        ("nexus", None, a["first_mb"], True),
        ("nexus_topk", a["topk_ratio"], a["first_mb"], True),
        # DDP's bucket layout (its 1 MB first bucket, one group): the overlap machinery alone.
        ("nexus_ddp_layout", None, first_ddp_mb, False))
    for name, ratio, first_mb, grouped in variants:
        m = _model(a, device)
        grouped = grouped and experts > 0
        sync = NexusSync(m, bucket_cap_mb=a["bucket_mb"], first_bucket_mb=first_mb,
                         expert_param_filter=r"(^|\.)experts\." if grouped else None,
                         expert_load=loads if grouped else None,
                         topk_ratio=ratio, timeout_s=a["timeout_s"])
        if name == "nexus":
            # Same input, same init, same noise: NexusSync's averaged grads must equal DDP's.
            sync.zero_grad()
            _loss(m, xs[0], 0, device).backward()
            sync.finish()
            mine = [p.grad for p in m.parameters() if p.requires_grad]
            results["grad_max_abs_diff_vs_ddp"] = max(
                float((p.float() - q.float()).abs().max()) for p, q in zip(mine, ddp_grads))
            results["grad_max_abs_vs_ddp"] = max(float(q.float().abs().max()) for q in ddp_grads)
            del ddp_grads
        r = timed(name, m, sync.zero_grad, sync.finish)
        st = sync.stats()
        steps = st["steps"]
        r["buckets"] = st["buckets"]
        r["nexus_overlap_ratio"] = st["overlap_ratio"]
        r["bytes_sent_per_step"] = {g: v // steps for g, v in st["bytes_sent"].items()}
        r["bytes_dense_per_step"] = {g: v // steps for g, v in
                                     st["bytes_dense_equivalent"].items()}
        alone = []
        for _ in range(a["steps"]):  # the same buckets' communication with no backward to hide in
            dist.barrier()
            _sync(device)
            t = time.perf_counter()
            sync.finish()
            _sync(device)
            alone.append(time.perf_counter() - t)
        r["comm_alone_ms"] = statistics.median(alone) * 1e3
        sync.close()
        del m, sync
        release()
    results["experts"] = experts
    results["low_load_experts"] = sorted(i for i, v in enumerate(loads or []) if v < 0.5 * (
        sum(loads) / len(loads)))
    return {"train": results}


MODES = ("local", "ddp", "nexus", "nexus_topk", "nexus_ddp_layout")


def merge_train(res: Dict[str, Any]) -> Dict[str, Any]:
    ranks = [r["train"] for r in res["ranks"]]
    out: Dict[str, Any] = {k: ranks[0][k] for k in ("params", "trainable", "experts",
                                                     "low_load_experts", "grad_max_abs_vs_ddp")}
    out["grad_max_abs_diff_vs_ddp"] = max(r["grad_max_abs_diff_vs_ddp"] for r in ranks)
    for mode in MODES:
        m = dict(ranks[0][mode])
        for key in ("step_ms", "exposed_ms", "comm_alone_ms"):
            if key in m:
                m[key] = statistics.median(r[mode][key] for r in ranks)
        out[mode] = m
    loc = out["local"]["step_ms"]
    dense_bytes = sum(out["nexus"]["bytes_dense_per_step"].values())
    out["ddp"]["exposed_ms"] = max(0.0, out["ddp"]["step_ms"] - loc)
    out["ddp"]["bytes_sent_per_step"] = dict(out["nexus"]["bytes_dense_per_step"])
    for mode in MODES[1:]:
        m = out[mode]
        m["exposed_share"] = m["exposed_ms"] / m["step_ms"]
        m["overlap_ratio"] = (max(0.0, 1 - m["exposed_ms"] / m["comm_alone_ms"])
                              if m["comm_alone_ms"] > 0 else None)
    out["dense_bytes_per_step"] = dense_bytes
    return out


def print_train(world: int, backend: str, t: Dict[str, Any], a: Dict[str, Any]) -> None:
    print(f"\nNexusSync vs DDP, world {world} ({backend}), model {a['model']}: "
          f"{t['params'] / 1e6:.2f} M params ({t['trainable'] / 1e6:.2f} M trainable), "
          f"{t['experts']} experts (low-load {t['low_load_experts']}), "
          f"{t['dense_bytes_per_step'] / 2**20:.1f} MiB of gradient, bucket cap {a['bucket_mb']} MB, "
          f"{t['nexus']['buckets']} buckets; grads vs DDP max |diff| "
          f"{t['grad_max_abs_diff_vs_ddp']:.2e} (max |grad| {t['grad_max_abs_vs_ddp']:.2e})")
    print(f"{'mode':<16} {'step ms':>8} {'exposed ms':>10} {'share':>6} {'comm alone':>10} "
          f"{'overlap':>7} {'buckets':>7} {'dense B/step':>12} {'exp_high':>10} {'exp_low':>10}")
    for mode in MODES:
        m = t[mode]
        if mode == "local":
            print(f"{mode:<16} {m['step_ms']:>8.1f}")
            continue
        b = m["bytes_sent_per_step"]
        ov = m["overlap_ratio"]
        print(f"{mode:<16} {m['step_ms']:>8.1f} {m['exposed_ms']:>10.1f} {m['exposed_share']:>6.1%} "
              f"{m['comm_alone_ms']:>10.1f} {(f'{ov:.2f}' if ov is not None else '-'):>7} "
              f"{m['buckets']:>7} {b['dense']:>12} {b['expert_high']:>10} {b['expert_low']:>10}")
    print("ddp exposed = ddp step - local step (DDP does not expose its wait); comm alone = the "
          "mode's own buckets all-reduced with no backward; overlap = 1 - exposed / comm alone")


# ---- task: kill one rank mid-step -------------------------------------------------------------


class KillTestError(Exception):
    def __init__(self, record: Dict[str, Any]) -> None:
        super().__init__(record.get("error", ""))
        self.record = record


def task_kill(rank: int, world: int, device: torch.device, a: Dict[str, Any],
              rundir: str) -> Dict[str, Any]:
    from loongforge.comm import NexusSync

    model = _model(a, device)
    sync = NexusSync(model, bucket_cap_mb=a["bucket_mb"], first_bucket_mb=a["first_mb"],
                     timeout_s=a["timeout_s"])
    victim = world - 1
    x = _inputs(a, model, device, 1 + rank)[0]
    for step in range(a["kill_step"] + 2):
        dist.barrier()
        sync.zero_grad()
        loss = _loss(model, x, step, device)
        if rank == victim and step == a["kill_step"]:
            # Mid-step: forward done, the peers are in backward issuing buckets. Real SIGKILL.
            with open(os.path.join(rundir, "killed_at"), "w") as f:
                f.write(repr(time.time()))
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
            sync.finish()
            _sync(device)
        except Exception as e:  # the behaviour under test: an error, not a hang
            raise KillTestError({"error": f"{type(e).__name__}: {e}", "t_error": time.time(),
                                 "step": step})
    return {"completed_steps": a["kill_step"] + 2}


def merge_kill(res: Dict[str, Any], a: Dict[str, Any]) -> Dict[str, Any]:
    victim = res["world"] - 1
    killed_at = None
    p = os.path.join(res["rundir"], "killed_at")
    if os.path.exists(p):
        with open(p) as f:
            killed_at = float(f.read())
    survivors = []
    for r in res["ranks"]:
        if r["rank"] == victim:
            continue
        err = r.get("error", "")
        if not err and r["exitcode"] not in (0, None):
            # Killed by a watchdog (NCCL async error handling): the message is in the log.
            err = "exit %s; log: %s" % (r["exitcode"], r["log_tail"].strip().splitlines()[-1:])
        t = None
        if killed_at is not None:  # when it caught the error, else when the launcher saw it exit
            t_end = r.get("t_error", r.get("exited_at"))
            t = t_end - killed_at if t_end is not None else None
        survivors.append({
            "rank": r["rank"], "exitcode": r["exitcode"], "hung": r["hung"],
            "seconds_after_kill": t, "error": err[:400],
            "clear": "NexusSync" in err and f"rank {r['rank']}" in err,
        })
    vic = res["ranks"][victim]
    # A survivor's wait starts when it issues its next collective, a little after the kill, and
    # its error is noticed after that: allow a grace on top of the timeout.
    limit = a["timeout_s"] + max(5.0, 0.2 * a["timeout_s"])
    # vic["hung"]: the launcher's own SIGKILL at the deadline must not pass for the victim's.
    ok = (killed_at is not None and vic["exitcode"] == -signal.SIGKILL and not vic["hung"] and
          all(not s["hung"] and s["exitcode"] not in (0, None) and s["error"] for s in survivors)
          and all(s["seconds_after_kill"] is not None and s["seconds_after_kill"] <= limit
                  for s in survivors))
    return {"victim": victim, "victim_exitcode": vic["exitcode"], "killed": killed_at is not None,
            "timeout_s": a["timeout_s"], "limit_s": limit, "survivors": survivors, "pass": ok,
            "all_clear_nexussync_errors": all(s["clear"] for s in survivors)}


def print_kill(world: int, backend: str, k: Dict[str, Any]) -> None:
    print(f"\nkill rank {k['victim']} mid-step, world {world} ({backend}), timeout "
          f"{k['timeout_s']:g}s: {'PASS' if k['pass'] else 'FAIL'} (victim exit "
          f"{k['victim_exitcode']})")
    for s in k["survivors"]:
        t = s["seconds_after_kill"]
        print(f"  rank {s['rank']}: exit {s['exitcode']}, "
              f"{'HUNG' if s['hung'] else (f'{t:.2f}s after kill' if t is not None else 'exited')}"
              f": {s['error'][:150]}")


TASKS = {"sweep": task_sweep, "train": task_train, "kill": task_kill}


# ---- CLI --------------------------------------------------------------------------------------


def _env() -> Dict[str, Any]:
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "?", ""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": commit + ("+dirty" if dirty else ""),
            "host_cpus": os.cpu_count(), "gpus": gpus,
            "gpu_name": torch.cuda.get_device_name(0) if gpus else None,
            "torch": torch.__version__, "loadavg": os.getloadavg(), "argv": sys.argv}


def run_task(task: str, a: Dict[str, Any], world: int) -> Dict[str, Any]:
    res = launch(task, a, world)
    entry: Dict[str, Any] = {"world": world, "backend": a["backend"], "wall_s": res["wall_s"]}
    if task == "kill":
        entry["kill"] = merge_kill(res, a)
        print_kill(world, a["backend"], entry["kill"])
        if entry["kill"]["pass"]:
            shutil.rmtree(res["rundir"], ignore_errors=True)
        else:
            print(f"  rank logs kept in {res['rundir']}")
        return entry
    _check_ok(res)  # exits naming the failed rank; its log stays in rundir
    shutil.rmtree(res["rundir"], ignore_errors=True)
    if task == "sweep":
        entry["sweep"] = merge_sweep(res)
        print_sweep(world, a["backend"], entry["sweep"])
    else:
        entry["train"] = merge_train(res)
        print_train(world, a["backend"], entry["train"], a)
    return entry


PROFILES = {
    # CPU: small sizes and a small model so 4-8 processes on a few cores finish in seconds.
    "cpu": {"sizes_mb": [1, 4, 16, 64], "model": "bench", "image_size": 0, "moe_experts": 0,
            "d": 128, "layers": 2, "experts": 4, "batch": 2,
            "seq": 32, "bucket_mb": 0.5, "first_mb": 0.125, "steps": 8, "warmup": 2,
            "reps": 2, "min_iters": 2, "max_iters": 10, "block_s": 0.5, "threads": 1,
            "timeout_s": 30.0, "deadline_s": 240.0},
    # GPU: 1 MB..1 GB, a ~140 M-param model (540 MB of fp32 gradient) in 25 MB buckets.
    "gpu": {"sizes_mb": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], "model": "bench",
            "image_size": 0, "moe_experts": 0, "d": 1024, "layers": 8,
            "experts": 8, "batch": 8, "seq": 512, "bucket_mb": 25.0, "first_mb": 1.0,
            "steps": 20, "warmup": 5, "reps": 5, "min_iters": 5, "max_iters": 50, "block_s": 0.2,
            "threads": 4, "timeout_s": 60.0, "deadline_s": 540.0},
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", choices=("sweep", "train", "kill", "suite"))
    ap.add_argument("--world", type=int, default=2, help="ranks (sweep/train/kill)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8], help="suite: ranks per run")
    ap.add_argument("--tasks", nargs="+", default=["sweep", "train", "kill"], help="suite: tasks")
    ap.add_argument("--profile", choices=tuple(PROFILES), default=None,
                    help="defaults for the options below (default: gpu if CUDA else cpu)")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                    help="default: nccl with the gpu profile, else gloo")
    for k, v in PROFILES["cpu"].items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, list):
            ap.add_argument(flag, type=float, nargs="+", default=None)
        else:
            ap.add_argument(flag, type=type(v), default=None)
    ap.add_argument("--topk-ratio", type=float, default=0.01)
    ap.add_argument("--kill-step", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file (default results/multigpu/<task>.json)")
    return ap


def resolve(ns: argparse.Namespace) -> Dict[str, Any]:
    profile = ns.profile or ("gpu" if torch.cuda.is_available() else "cpu")
    a = dict(PROFILES[profile])
    for k in a:
        v = getattr(ns, k)
        if v is not None:
            a[k] = v
    a["profile"] = profile
    a["backend"] = ns.backend or ("nccl" if profile == "gpu" else "gloo")
    a["topk_ratio"] = ns.topk_ratio
    a["kill_step"] = ns.kill_step
    return a


def main(argv: Optional[List[str]] = None) -> int:
    ns = build_parser().parse_args(argv)
    a = resolve(ns)
    report = {"env": _env(), "args": a, "runs": []}
    tasks = ns.tasks if ns.task == "suite" else [ns.task]
    worlds = ns.worlds if ns.task == "suite" else [ns.world]
    if a["backend"] == "nccl" and max(worlds) > torch.cuda.device_count():
        raise SystemExit(f"world {max(worlds)} > {torch.cuda.device_count()} GPUs")
    over = max(worlds) > (os.cpu_count() or 1) and a["backend"] == "gloo"
    if over:
        print(f"note: {max(worlds)} processes on {os.cpu_count()} CPU cores (oversubscribed; "
              "times are upper bounds and noisy)")
    failed = False
    for w in worlds:
        for t in tasks:
            e = run_task(t, a, w)
            e["task"] = t
            report["runs"].append(e)
            failed |= t == "kill" and not e["kill"]["pass"]
    out = ns.out or os.path.join(ROOT, "results", "multigpu", f"{ns.task}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
