"""CheckpointVault vs torch.save/torch.load on one fp32 state (default 1 GiB = 64 x 16 MiB).

Measures, in one run on the same state and disk:
  * blocking time of CheckpointVault.save() (first/full save, and a steady-state save with 10% of
    tensors changed) vs the time of torch.save (and torch.save + fsync, which is what a durable
    checkpoint costs);
  * bytes written by the incremental save vs a full save;
  * restore time (CheckpointVault.load) vs torch.load.
Prints a table and writes JSON to results/bench_ckpt.json.

  PYTHONPATH=python /usr/bin/python3 bench/ckpt/bench_ckpt.py --dir /tmp/lf_bench_ckpt
"""
import argparse
import json
import os
import shutil
import statistics
import time

import torch

from loongforge.ckpt import CheckpointVault


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/lf_bench_ckpt")
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--tensor-mib", type=int, default=16)
    ap.add_argument("--changed", type=float, default=0.10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_ckpt.json")
    a = ap.parse_args()

    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    g = torch.Generator().manual_seed(0)
    n = a.tensor_mib * (1 << 20) // 4
    state = {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(a.tensors)}
    total = sum(t.numel() * 4 for t in state.values())

    # --- baseline: torch.save (torch.load is timed below, interleaved with vault.load) ---
    pt = os.path.join(a.dir, "state.pt")
    ts, tsf = [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        torch.save(state, pt)
        ts.append(time.perf_counter() - t0)
        fsync_path(pt)
        tsf.append(time.perf_counter() - t0)

    # --- CheckpointVault ---
    vdir = os.path.join(a.dir, "vault")
    v = CheckpointVault(vdir)
    t0 = time.perf_counter()
    v.save(1, state)
    first_block = time.perf_counter() - t0
    v.wait()
    first_total = time.perf_counter() - t0
    full = v.stats()

    k = max(1, int(round(a.changed * a.tensors)))
    inc_block, inc_written, inc_stats = [], [], None
    step = 1
    for r in range(a.repeats):
        for i in range(k):
            state[f"layer{(r * k + i) % a.tensors}.weight"].add_(1e-3)
        step += 1
        t0 = time.perf_counter()
        v.save(step, state)
        inc_block.append(time.perf_counter() - t0)
        v.wait()
        inc_stats = v.stats()
        inc_written.append(inc_stats["bytes_written"])

    # Steady-state full rewrite: every tensor changed, staging memory already warm.
    for t in state.values():
        t.add_(1e-3)
    step += 1
    t0 = time.perf_counter()
    v.save(step, state)
    full_warm_block = time.perf_counter() - t0
    v.wait()

    # Restore vs torch.load, interleaved so both see the same machine load, each into fresh
    # memory (the previous result is freed first).
    rl, tl = [], []
    out = None
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        loaded = torch.load(pt, weights_only=True)
        tl.append(time.perf_counter() - t0)
        del loaded
        out = None
        t0 = time.perf_counter()
        out = v.load(step)
        rl.append(time.perf_counter() - t0)
    assert all(torch.equal(out[k_], state[k_]) for k_ in state)
    os.remove(pt)
    v.close()

    med = statistics.median
    res = {
        "loadavg_1m_at_end": os.getloadavg()[0],
        "state_bytes": total,
        "tensors": a.tensors,
        "torch_save_s": med(ts),
        "torch_save_fsync_s": med(tsf),
        "torch_load_s": med(tl),
        "vault_first_save_blocking_s": first_block,
        "vault_first_save_total_s": first_total,
        "vault_full_save_warm_blocking_s": full_warm_block,
        "vault_incremental_blocking_s": med(inc_block),
        "vault_full_bytes_written": full["bytes_written"],
        "vault_incremental_bytes_written": med(inc_written),
        "changed_tensors": k,
        "vault_restore_s": med(rl),
        "torch_load_all_s": tl,
        "vault_restore_all_s": rl,
        "incremental_stats": inc_stats,
        "first_save_stats": full,
    }
    res["ratio_blocking_incremental_vs_torch_save"] = res["vault_incremental_blocking_s"] / res["torch_save_s"]
    res["ratio_blocking_full_warm_vs_torch_save"] = res["vault_full_save_warm_blocking_s"] / res["torch_save_s"]
    res["ratio_bytes_incremental_vs_full"] = res["vault_incremental_bytes_written"] / res["vault_full_bytes_written"]
    res["ratio_restore_vs_torch_load"] = res["vault_restore_s"] / res["torch_load_s"]

    gib = total / (1 << 30)
    print(f"load average (1 min) at end: {res['loadavg_1m_at_end']:.1f}")
    print(f"state: {a.tensors} fp32 tensors, {gib:.2f} GiB; {k} tensors changed per incremental save")
    print(f"{'measure':48s} {'value':>10s}")
    rows = [
        ("torch.save (page cache, no fsync) s", res["torch_save_s"]),
        ("torch.save + fsync s", res["torch_save_fsync_s"]),
        ("vault save() blocking, first save s", first_block),
        ("vault save() blocking, full rewrite (warm) s", full_warm_block),
        ("vault save() blocking, 10% changed s", res["vault_incremental_blocking_s"]),
        ("  ratio 10%-changed blocking / torch.save", res["ratio_blocking_incremental_vs_torch_save"]),
        ("  ratio full-rewrite blocking / torch.save", res["ratio_blocking_full_warm_vs_torch_save"]),
        ("vault first save total (durable, fsync) s", first_total),
        ("vault bytes written, full MiB", full["bytes_written"] / 2**20),
        ("vault bytes written, 10% changed MiB", res["vault_incremental_bytes_written"] / 2**20),
        ("  ratio incremental / full bytes", res["ratio_bytes_incremental_vs_full"]),
        ("torch.load s", res["torch_load_s"]),
        ("vault load s", res["vault_restore_s"]),
        ("  ratio vault load / torch.load", res["ratio_restore_vs_torch_load"]),
    ]
    for name, val in rows:
        print(f"{name:48s} {val:10.3f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
