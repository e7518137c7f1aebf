#!/usr/bin/env python3
"""Top-k on NexusSync's low-load expert group vs dense sync, in a real tiny-moe training loop.

Target (issue 18): over 200 steps of tiny-moe on 4 CPU processes (Gloo), top-k (1-5%) with error
feedback on the low-load group ends within 1% of the dense-sync loss. Both runs see the same
batches, noise and init; the expert grouping comes from the router's measured per-expert counts
(SyncBackend.feed_expert_load, every --feed-every steps). "Ends at" is the trained model's loss on
fixed inputs (the training pool with fixed flow-matching noise and times): the training loss's
last steps swing by several percent with the noise drawn each step. A third run, dense sync with
other noise draws in training, gives the noise floor of that comparison. Prints one JSON object:
the evaluation losses and their relative gap, the noise floor, the training loss's last-20-step
means, and bytes sent per group.

With --seeds N (N >= 2) every configuration is repeated over N noise seeds (from --seed-start): within a seed,
dense and top-k see the same batches, init and noise draws (a paired comparison); across seeds only
the flow-matching noise draws differ. The JSON then also holds, per top-k ratio, the paired relative
gap per seed with its mean, std and standard error, and the floor: the relative eval-loss
difference of every pair of dense runs with different seeds (dense vs dense-with-other-noise; seed
1 is the run that the default's floor uses). Several --topk-ratio values share the dense runs. A
larger per-rank --batch makes the training loss less noisy. --merge summarizes the runs of several
--out files of one setup (seeds run in separate sweeps).

With --init-steps N, every compared run starts from one levelled-off state instead of the seed's
fresh init: tiny-moe first trains N steps with dense sync (same processes, data pool and expert-load
feeding, its own noise draws), and that state (model and AdamW state) is the start of every compared
run (dense, each top-k ratio, dense with other noise), which then trains --steps more steps at
--lr-compare (default --lr) on the pool's next batches. From a fresh init, 200 steps end in the
loss's steep descent, and when that descent starts moves between runs by enough to put dense runs
that differ only in noise draws 5-14% apart; a shared, further-trained start takes that out of the
comparison. --init-cache keeps that state in a file, so that sweeps over other seeds reuse it.
Every run also reports the loss on a held-out pool (drawn like the training pool, other seeds,
fixed noise and times) beside the training-pool evaluation; the summary gives both.

  PYTHONPATH=python python3 bench/moe/topk_vs_dense.py --steps 200 --procs 4 --topk-ratio 0.05
  PYTHONPATH=python python3 bench/moe/topk_vs_dense.py --steps 200 --procs 4 --batch 16 \
      --seeds 3 --topk-ratio 0.05 0.01 --out result.json
  PYTHONPATH=python python3 bench/moe/topk_vs_dense.py --init-steps 400 --steps 200 --procs 4 \
      --lr-compare 3e-4 --seeds 3 --topk-ratio 0.05 0.01 --out result.json
"""
import argparse
import datetime
import json
import math
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loongforge.models import get_config
from loongforge.comm import SyncBackend
from loongforge.trainer.checkpoint import read_state_file, write_state_file
from loongforge.trainer.dist import Dist
from loongforge.trainer.model import build_model
from loongforge.trainer.optim import optimizer_step

# Noise seed of the --init-steps phase's draws (the compared runs use --seed-start.. and eval 1000).
INIT_NOISE_SEED = 500
# Pool seeds: the training pool draws from 1000 + ..., the held-out pool from HELDOUT_POOL + ...
TRAIN_POOL, HELDOUT_POOL = 1000, 10 ** 8


def batch_for(step: int, rank: int, b: int, cfg, noise_seed: int = 0, pool_seed: int = TRAIN_POOL,
              pool: int = 8):
    """Step `step`'s batch of `rank`: its pool's batch step % pool (pool batches per rank)."""
    g = torch.Generator().manual_seed(7919 * step + rank + 104729 * noise_seed)
    length, horizon = 6, 8
    # A small fixed pool of samples, so that the loss falls visibly within 200 steps. Batch k of
    # rank r: seed pool_seed + 31 r + k % 8 + 7919 (k // 8), every (rank, k) its own (rank < 255).
    k = step % pool
    pg = torch.Generator().manual_seed(pool_seed + rank * 31 + k % 8 + 7919 * (k // 8))
    batch = {"images": torch.randn(b, 1, 3, cfg.image_size, cfg.image_size, generator=pg),
             "tokens": torch.randint(1, 200, (b, length), generator=pg),
             "attention_mask": torch.ones(b, length, dtype=torch.bool),
             "state": torch.randn(b, 6, generator=pg),
             "action": torch.randn(b, horizon, 5, generator=pg).tanh(),
             "action_mask": torch.ones(b, horizon, dtype=torch.bool)}
    noise = torch.randn(b, horizon, cfg.max_action_dim, generator=g)
    return batch, noise, torch.rand(b, generator=g)


def _evaluate(model, a, cfg, world, pool_seed):
    """Mean loss on fixed inputs: every rank's pool (pool_seed), noise seed 1000's draws."""
    ev = []
    with torch.no_grad():
        for step in range(8):
            for r in range(world):
                batch, noise, u = batch_for(step, r, a.batch, cfg, noise_seed=1000, pool_seed=pool_seed)
                ev.append(float(model(batch, noise=noise, time_u=u)["loss"]))
    return sum(ev) / len(ev)


def worker(rank, world, port, a, out, init_path=None, save_path=None):
    """One run of a.steps steps. init_path: start from that state (model, optimizer; an --init-steps
    phase's), at lr a.lr_compare, on the pool's batches from step a.init_steps on. save_path: rank 0
    writes the trained state there (the --init-steps phase)."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    cfg = get_config("tiny-moe")
    model = build_model("tiny-moe", seed=0).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr)
    first = 0
    if init_path is not None:
        # Dense sync keeps every rank's model and AdamW state identical: rank 0's is every rank's.
        st = read_state_file(init_path)  # data only: torch.load(weights_only=True) underneath
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        for g in opt.param_groups:
            g["lr"] = a.lr_compare
        first = st["steps"]
    # After the load: NexusSync's buckets hold views of the gradients of these parameters.
    sync = SyncBackend(model, Dist(rank, world), "nexussync", topk_ratio=a.topk_ratio,
                       load_threshold=a.load_threshold)
    losses = []
    t0 = time.perf_counter()
    for i in range(a.steps):
        step = first + i  # the pool's batch and the noise draws continue after the init phase
        batch, noise, u = batch_for(step, rank, a.batch, cfg, a.noise_seed, pool=a.pool)
        sync.zero_grad(opt)
        o = model(batch, noise=noise, time_u=u)
        o["loss"].backward()
        sync.finish()
        acc = torch.zeros(6)
        acc[0] = o["loss"].detach()
        sync.average_losses(acc)
        if i % a.feed_every == 0:
            sync.feed_expert_load(model)
        optimizer_step(opt, params, 1.0, acc, sync)
        losses.append(float(acc[0]))
    # The trained model on fixed data, noise and flow times (the training pool of every rank,
    # eval_seed's draws): the same inputs for every run, so runs compare without the training
    # loss's per-step noise.
    # The held-out pool (drawn the same way, other seeds) tells whether a gap is memorization only.
    wall = time.perf_counter() - t0
    model.eval()
    ev = _evaluate(model, a, cfg, world, TRAIN_POOL)
    ev_held = _evaluate(model, a, cfg, world, HELDOUT_POOL)
    if rank == 0:
        if save_path is not None:
            write_state_file({"model": model.state_dict(), "optimizer": opt.state_dict(),
                              "steps": first + a.steps}, save_path)
        st = sync.stats()
        with open(out, "w") as f:
            json.dump({"losses": losses, "eval_loss": ev, "eval_loss_heldout": ev_held, "wall_s": wall,
                       "bytes_sent": st.get("bytes_sent"), "stats": {k: v for k, v in st.items() if "bytes" in k},
                       "low_load_experts": sorted(sync._nexus._low_experts)}, f)
    dist.destroy_process_group()


def run(a, topk, noise_seed=0, init_path=None, save_path=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = argparse.Namespace(**{**vars(a), "topk_ratio": topk, "noise_seed": noise_seed})
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.start_processes(worker, args=(a.procs, port, a, out, init_path, save_path),
                           nprocs=a.procs, start_method="spawn")
        with open(out) as f:
            return json.load(f)


# What the --init-steps state depends on: a cached state is reused only when all of these match.
INIT_KEYS = ("init_steps", "procs", "batch", "lr", "feed_every", "load_threshold", "pool")


def init_state(a, tmpdir):
    """--init-steps: trains a.init_steps steps with dense sync from the seed's init (noise seed
    INIT_NOISE_SEED) and returns (path of the state file, the phase's record). With --init-cache
    the state is kept in that file (and its record beside it) and reused when INIT_KEYS match."""
    meta = {k: getattr(a, k) for k in INIT_KEYS}
    path = a.init_cache or os.path.join(tmpdir, "init.pt")
    if a.init_cache and os.path.exists(path) and os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            rec = json.load(f)
        if rec.get("meta") == meta:
            return path, dict(rec, reused=True)
        print(f"--init-cache {path}: made with {rec.get('meta')}, not {meta}: training it again",
              file=sys.stderr)
    t = time.perf_counter()
    o = run(argparse.Namespace(**{**vars(a), "steps": a.init_steps}), None,
            noise_seed=INIT_NOISE_SEED, save_path=path)
    rec = {"meta": meta, "noise_seed": INIT_NOISE_SEED, "eval_loss": o["eval_loss"],
           "eval_loss_heldout": o["eval_loss_heldout"], "first_loss": o["losses"][0],
           "train_tail20": _tail(o["losses"]), "run_wall_s": time.perf_counter() - t,
           "train_wall_s": o["wall_s"], "losses": o["losses"]}
    if a.init_cache:
        with open(path + ".json", "w") as f:
            json.dump(rec, f)
    return path, rec


def _mean_std(xs):
    """Mean, sample std (0 for one value) and standard error of the mean."""
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": m, "std": sd, "sem": sd / math.sqrt(len(xs))}


def _tail(losses, n=20):
    n = min(n, len(losses))
    return sum(losses[-n:]) / n


def seeded(a, out_path):
    """--seeds N: dense and each top-k ratio per noise seed (--seed-start .. +N-1), paired within a
    seed. Writes the JSON so far to out_path after each run, so that an interrupted sweep leaves
    its finished runs (--merge summarizes them)."""
    res = {"steps": a.steps, "procs": a.procs, "batch_per_rank": a.batch,
           "global_batch": a.batch * a.procs, "lr": a.lr, "feed_every": a.feed_every,
           "load_threshold": a.load_threshold, "seeds": a.seeds, "seed_start": a.seed_start,
           "topk_ratios": a.topk_ratio, "init_steps": a.init_steps, "lr_compare": a.lr_compare,
           "pool": a.pool,
           "runs": []}

    def dump():
        if out_path:
            with open(out_path, "w") as f:
                json.dump(res, f, indent=1)

    with tempfile.TemporaryDirectory() as d:
        init_path = None
        if a.init_steps:
            init_path, res["init"] = init_state(a, d)
            dump()
        for s in range(a.seed_start, a.seed_start + a.seeds):
            for r in [None] + list(a.topk_ratio):
                _seeded_run(a, res, s, r, init_path)
                dump()
    res.update(summarize(res["runs"]))
    if any("eval_loss_heldout" in x for x in res["runs"]):
        res["heldout"] = summarize(res["runs"], "eval_loss_heldout")
    dump()
    return res


def _seeded_run(a, res, s, r, init_path):
    t = time.perf_counter()
    o = run(a, r, noise_seed=s, init_path=init_path)
    res["runs"].append({"seed": s, "topk_ratio": r, "eval_loss": o["eval_loss"],
                        "eval_loss_heldout": o["eval_loss_heldout"],
                        "train_tail20": _tail(o["losses"]), "first_loss": o["losses"][0],
                        "bytes_sent": o["bytes_sent"], "byte_counters": o["stats"],
                        "low_load_experts": o["low_load_experts"],
                        "train_wall_s": o["wall_s"],
                        "run_wall_s": time.perf_counter() - t, "losses": o["losses"]})


def summarize(runs, key="eval_loss"):
    """Paired gaps per top-k ratio and the dense-vs-dense floor from a list of run records (a
    record per (seed, ratio); ratio None is dense sync). The floor is the relative eval-loss
    difference of every pair of dense runs with different seeds. key: which evaluation
    ("eval_loss": the training pool; "eval_loss_heldout": the held-out pool)."""
    dense = {x["seed"]: x for x in runs if x["topk_ratio"] is None and key in x}
    seeds = sorted(dense)
    out = {}
    if not seeds:
        return out
    ed = {s: dense[s][key] for s in seeds}
    td = {s: dense[s]["train_tail20"] for s in seeds}
    pairs = [(s, q, (ed[q] - ed[s]) / ed[s]) for i, s in enumerate(seeds) for q in seeds[i + 1:]]
    st = _mean_std(list(ed.values()))
    out["dense"] = {"seeds": seeds, "eval_loss": [ed[s] for s in seeds], "eval_loss_stats": st,
                    "train_tail20": [td[s] for s in seeds],
                    "bytes_sent": dense[seeds[0]]["bytes_sent"],
                    "byte_counters": dense[seeds[0]]["byte_counters"],
                    "run_wall_s": [dense[s]["run_wall_s"] for s in seeds]}
    if pairs:
        out["floor"] = {"pairs": [{"seeds": [s, q], "relative_diff": d} for s, q, d in pairs],
                        "abs": _mean_std([abs(d) for _, _, d in pairs]),
                        "max_abs": max(abs(d) for _, _, d in pairs),
                        "dense_eval_cv": st["std"] / st["mean"],
                        "train_tail20_abs": _mean_std(
                            [abs(td[q] - td[s]) / td[s] for s, q, _ in pairs])}
    out["topk"] = []
    for r in sorted({x["topk_ratio"] for x in runs if x["topk_ratio"] is not None}, reverse=True):
        tk = {x["seed"]: x for x in runs if x["topk_ratio"] == r and x["seed"] in dense}
        ss = sorted(tk)
        if not ss:
            continue
        gaps = [(tk[s][key] - ed[s]) / ed[s] for s in ss]
        tgaps = [(tk[s]["train_tail20"] - td[s]) / td[s] for s in ss]
        g = _mean_std(gaps)
        out["topk"].append({
            "ratio": r, "seeds": ss, "eval_loss": [tk[s][key] for s in ss],
            "eval_loss_stats": _mean_std([tk[s][key] for s in ss]),
            "relative_gap": gaps, "relative_gap_stats": g,
            "relative_gap_train_tail20": tgaps, "relative_gap_train_tail20_stats": _mean_std(tgaps),
            # Each seed within 1%, and the mean gap with two standard errors inside 1%.
            "all_seeds_within_1pct": all(abs(x) <= 0.01 for x in gaps),
            "mean_within_1pct_2sem": abs(g["mean"]) + 2 * g["sem"] <= 0.01,
            "bytes_sent": tk[ss[0]]["bytes_sent"], "byte_counters": tk[ss[0]]["byte_counters"],
            "low_load_experts": tk[ss[0]]["low_load_experts"],
            "run_wall_s": [tk[s]["run_wall_s"] for s in ss]})
    return out


def merge(paths, out_path):
    """Summarizes the runs of several --out files of one setup (e.g. seeds 0-2 and 3-5)."""
    keys = ("steps", "procs", "batch_per_rank", "lr", "feed_every", "load_threshold", "init_steps",
            "lr_compare", "pool")
    docs = [json.load(open(p)) for p in paths]
    for d, p in zip(docs, paths):
        if any(d.get(k) != docs[0].get(k) for k in keys):
            raise SystemExit(f"--merge: {p} differs from {paths[0]} in one of {keys}")
    runs = {(x["seed"], x["topk_ratio"]): x for d in docs for x in d["runs"]}
    res = {k: docs[0][k] for k in keys if k in docs[0]}  # files older than a flag lack its key
    res.update(global_batch=res["batch_per_rank"] * res["procs"], merged_from=list(paths),
               runs=[runs[k] for k in sorted(runs, key=lambda k: (k[0], -(k[1] or 0)))])
    res.update(summarize(res["runs"]))
    if any("eval_loss_heldout" in x for x in res["runs"]):
        res["heldout"] = summarize(res["runs"], "eval_loss_heldout")
    if "init" in docs[0]:
        res["init"] = docs[0]["init"]
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--batch", type=int, default=2, help="per-rank batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--topk-ratio", type=float, nargs="+", default=[0.05],
                   help="one or more ratios (several only with --seeds >= 2: they share the dense runs)")
    p.add_argument("--feed-every", type=int, default=10)
    p.add_argument("--load-threshold", type=float, default=1.0,
                   help="low-load: routed count < this x the mean (1.0: the below-mean experts)")
    p.add_argument("--seeds", type=int, default=1,
                   help="noise seeds per configuration (>= 2: paired gaps and floor with mean/std)")
    p.add_argument("--seed-start", type=int, default=0, help="first noise seed of --seeds")
    p.add_argument("--pool", type=int, default=8,
                   help="distinct batches per rank in training (8: memorized within a few hundred"
                        " steps; more than the steps run: every batch new, the loss levels off)")
    p.add_argument("--init-steps", type=int, default=0,
                   help="train this many dense-sync steps first; every compared run starts from that state")
    p.add_argument("--lr-compare", type=float, default=None,
                   help="the compared runs' lr after --init-steps (default: --lr)")
    p.add_argument("--init-cache", default=None, metavar="PT",
                   help="keep the --init-steps state in this file and reuse it when the setup matches")
    p.add_argument("--out", default=None, help="also write the JSON here (updated after each run)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="run nothing: summarize the runs of these --out files (one setup) into --out")
    a = p.parse_args()
    if a.merge:
        res = merge(a.merge, a.out)
        print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
        return 0
    if a.seeds < 1:
        p.error("--seeds must be >= 1")
    if a.pool < 1:
        p.error("--pool must be >= 1")
    if a.init_steps < 0:
        p.error("--init-steps must be >= 0")
    if a.lr_compare is None:
        a.lr_compare = a.lr
    elif not a.init_steps:
        p.error("--lr-compare needs --init-steps")
    if a.seeds >= 2:
        res = seeded(a, a.out)
        print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
        return 0
    if len(a.topk_ratio) != 1:
        p.error("several --topk-ratio values need --seeds >= 2")
    a.topk_ratio = a.topk_ratio[0]
    init = None
    with tempfile.TemporaryDirectory() as d:
        init_path = None
        if a.init_steps:
            init_path, init = init_state(a, d)
        dense = run(a, None, init_path=init_path)
        topk = run(a, a.topk_ratio, init_path=init_path)
        # Noise floor: dense sync again with other flow-matching noise draws in training.
        dense_b = run(a, None, noise_seed=1, init_path=init_path)
    tail = min(20, a.steps)
    fd = sum(dense["losses"][-tail:]) / tail
    ft = sum(topk["losses"][-tail:]) / tail
    ed, et, eb = dense["eval_loss"], topk["eval_loss"], dense_b["eval_loss"]
    res = {
        "steps": a.steps, "batch_per_rank": a.batch, "procs": a.procs, "topk_ratio": a.topk_ratio,
        "first_loss": dense["losses"][0], "final_loss_dense": fd, "final_loss_topk": ft,
        "relative_gap_train_tail": (ft - fd) / fd,
        "eval_loss_dense": ed, "eval_loss_topk": et, "eval_loss_dense_other_noise": eb,
        "relative_gap": (et - ed) / ed, "noise_floor": abs(eb - ed) / ed,
        "within_1pct": abs(et - ed) <= 0.01 * ed,
        "bytes_sent_dense_sync": dense["bytes_sent"], "bytes_sent_topk": topk["bytes_sent"],
        "byte_counters_topk": topk["stats"],
        "low_load_experts": topk["low_load_experts"],
        "wall_s": {"dense": dense["wall_s"], "topk": topk["wall_s"]},
        "train_tail20_dense_other_noise": _tail(dense_b["losses"])}
    if a.init_steps:
        eh, th, bh = dense["eval_loss_heldout"], topk["eval_loss_heldout"], dense_b["eval_loss_heldout"]
        res.update(init_steps=a.init_steps, lr_compare=a.lr_compare,
                   init={k: v for k, v in init.items() if k != "losses"},
                   eval_loss_heldout_dense=eh, eval_loss_heldout_topk=th,
                   eval_loss_heldout_dense_other_noise=bh, relative_gap_heldout=(th - eh) / eh,
                   noise_floor_heldout=abs(bh - eh) / eh)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
