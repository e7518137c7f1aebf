"""CheckpointVault on a GPU: save() blocking time of a device-resident fp32 state vs torch.save and
vs torch.distributed.checkpoint.async_save, a fine-tune-like incremental save, and restore, for
both snapshot paths side by side (device_staging=on: device arena; off: pinned host staging), and
both segment writers side by side (writer=posix: device staging -> pinned host buffers -> write(2);
writer=cufile: cuFileWrite straight from the device staging arena, GPUDirect Storage or its compat
mode), each on the same device state: save() blocking time, time until durable, bytes, GB/s.

Default state: 100 CUDA tensors x 16M fp32 = 1.6B parameters (6.4 GB). Every figure comes from this
one run on the same state and disk. Prints a table, writes JSON.

  PYTHONPATH=python python3 bench/ckpt/gpu_bench.py --out results/gpu/bench_ckpt_gpu.json
"""
import argparse
import json
import os
import shutil
import socket
import time

import torch

from loongforge.ckpt import CheckpointVault

T_START = time.perf_counter()


def fsync_tree(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def dcp_async_save(state, path, res):
    """Blocking time of DCP async_save (single process); errors are recorded, not raised."""
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        if not hasattr(dcp, "async_save"):
            res["dcp_error"] = "torch.distributed.checkpoint.async_save not available"
            return
        try:
            blocking, fut = timed(lambda: dcp.async_save(state, checkpoint_id=path))
        except Exception as e:  # older torch wants a process group even for one process
            if dist.is_initialized():
                raise
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("gloo", rank=0, world_size=1)
            res["dcp_note"] = f"needed a gloo group of 1 ({type(e).__name__}: {e})"[:300]
            blocking, fut = timed(lambda: dcp.async_save(state, checkpoint_id=path))
        t0 = time.perf_counter()
        returned = blocking
        if hasattr(fut, "upload_completion"):  # AsyncSaveResponse (some torch 2.x modes)
            fut.staging_completion.result()  # safe to mutate the state only from here
            blocking = returned + time.perf_counter() - t0
            res["dcp_note_staging"] = "async_save returned AsyncSaveResponse; blocking includes staging"
            fut = fut.upload_completion
        fut.result()
        fsync_tree(path)
        res["dcp_async_save_blocking_s"] = blocking
        res["dcp_async_save_total_s"] = returned + time.perf_counter() - t0
    except Exception as e:
        res["dcp_error"] = f"{type(e).__name__}: {e}"[:500]


def run_vault(mode, state, names, k, a, r):
    """One vault with device_staging=`mode`: first save, a fine-tune-like save (the last k tensors
    updated on the current stream right before save(), no host sync), a full rewrite with warm
    staging if the time budget allows, and load to CUDA with an exactness check."""
    vdir = os.path.join(a.dir, f"vault_{mode}")
    v = CheckpointVault(vdir, device_staging=mode)
    r["first_save_blocking_s"], _ = timed(lambda: v.save(1, state))
    t0 = time.perf_counter()
    v.wait()
    r["first_save_total_s"] = r["first_save_blocking_s"] + time.perf_counter() - t0
    full = v.stats()
    r["first_save_stats"] = full
    r["full_bytes_written"] = full["bytes_written"]
    r["snapshot_path"] = full["snapshot_path"]
    r["snapshot_reason"] = full["snapshot_reason"]
    for n in names[a.tensors - k:]:
        state[n].add_(1e-3)
    t0 = time.perf_counter()
    v.save(2, state)
    r["finetune_blocking_s"] = time.perf_counter() - t0
    torch.cuda.synchronize()  # the current stream waited for the snapshot copy (device staging)
    r["finetune_stream_done_s"] = time.perf_counter() - t0
    v.wait()
    ft = v.stats()
    r["finetune_stats"] = ft
    r["finetune_snapshot_s"] = ft["snapshot_s"]
    r["finetune_write_s"] = ft["write_s"]
    r["finetune_staged_hash_s"] = ft["staged_hash_s"]
    r["finetune_d2h_s"] = ft["d2h_s"]
    r["finetune_bytes_written"] = ft["bytes_written"]
    r["ratio_finetune_bytes_vs_full"] = ft["bytes_written"] / max(1, full["bytes_written"])
    last = 2
    if time.perf_counter() - T_START < a.budget_s:
        for t in state.values():
            t.add_(1e-3)
        t0 = time.perf_counter()
        v.save(3, state)
        r["full_warm_blocking_s"] = time.perf_counter() - t0
        v.wait()
        r["full_warm_stats"] = v.stats()
        last = 3
    r["load_cuda_s"], out = timed(lambda: v.load(last))
    torch.cuda.synchronize()
    r["restore_exact"] = all(torch.equal(out[n], state[n]) for n in names)
    del out
    v.close()
    shutil.rmtree(vdir, ignore_errors=True)


def run_writer(writer, state, names, k, a, r):
    """One vault with device_staging=on and `writer`: a full save and a fine-tune-like save (the
    last k tensors changed), each timed from save() to durable (wait() returns after fsync of the
    segment, its directory and the manifest)."""
    vdir = os.path.join(a.dir, f"vault_writer_{writer}")
    try:
        v = CheckpointVault(vdir, device_staging="on", writer=writer)
    except Exception as e:  # e.g. "cufile: not built" or "cuFileDriverOpen failed"
        r["error"] = f"{type(e).__name__}: {e}"[:500]
        return
    for phase, step in (("full", 1), ("finetune", 2)):
        if phase == "finetune":
            for n in names[len(names) - k:]:
                state[n].add_(1e-3)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        v.save(step, state)
        blocking = time.perf_counter() - t0
        v.wait()
        total = time.perf_counter() - t0
        st = v.stats()
        r[f"{phase}_blocking_s"] = blocking
        r[f"{phase}_durable_s"] = total
        r[f"{phase}_bytes_written"] = st["bytes_written"]
        r[f"{phase}_gbps"] = st["bytes_written"] / total / 1e9
        r[f"{phase}_write_s"] = st["write_s"]
        r[f"{phase}_cufile_s"] = st["cufile_s"]
        r[f"{phase}_d2h_s"] = st["d2h_s"]
        r[f"{phase}_bytes_cufile"] = st["bytes_cufile"]
        r["writer"] = st["writer"]
        r[f"{phase}_writer_reason"] = st["writer_reason"]
    out = v.load(2)
    torch.cuda.synchronize()
    r["restore_exact"] = all(torch.equal(out[n], state[n]) for n in names)
    del out
    v.close()
    shutil.rmtree(vdir, ignore_errors=True)


def _print_table(title: str, cols: dict, rows) -> None:
    """One row per figure, one column per configuration (floats to 3 decimals, '-' if absent)."""
    names = list(cols)
    print(f"{title:36s}" + "".join(f"{n:>14s}" for n in names))
    for row in rows:
        cells = []
        for n in names:
            v = cols[n].get(row, "-")
            cells.append(f"{v:14.3f}" if isinstance(v, float) else f"{str(v):>14s}")
        print(f"{row:36s}" + "".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/lf_ckpt_gpu")
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--numel", type=int, default=16_000_000)
    ap.add_argument("--changed", type=float, default=0.60, help="share of tensors changed by fine-tuning")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--budget-s", type=float, default=100.0,
                    help="skip the optional full-rewrite saves once this much time has passed")
    ap.add_argument("--out", default="results/gpu/bench_ckpt_gpu.json")
    ap.add_argument("--modes", default="on,off",
                    help="device_staging values to run, comma-separated (on = device arena, "
                    "off = pinned host staging)")
    ap.add_argument("--writers", default="posix,cufile",
                    help="segment writers to compare (device_staging=on), comma-separated; empty = skip")
    ap.add_argument("--writer-tensors", type=int, default=0,
                    help="tensors of the state used for the writer comparison (0 = all; the run "
                    "drops to a quarter of them by itself once --budget-s has passed)")
    a = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(a.numel, generator=g, device=dev) for i in range(a.tensors)}
    total = a.tensors * a.numel * 4
    def dump():  # after every phase, so a timeout still leaves the figures measured so far
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "state_bytes": total,
           "params": a.tensors * a.numel, "tensors": a.tensors}

    if not a.skip_baselines:
        pt = os.path.join(a.dir, "state.pt")
        res["torch_save_s"], _ = timed(lambda: torch.save(state, pt))
        t0 = time.perf_counter()
        fsync_tree(a.dir)
        res["torch_save_fsync_s"] = res["torch_save_s"] + time.perf_counter() - t0
        res["torch_load_cuda_s"], loaded = timed(
            lambda: torch.load(pt, map_location="cuda", weights_only=True))
        del loaded
        os.remove(pt)
        dcp_dir = os.path.join(a.dir, "dcp")
        dcp_async_save(state, dcp_dir, res)
        shutil.rmtree(dcp_dir, ignore_errors=True)
        dump()

    names = list(state)
    k = int(round(a.changed * a.tensors))
    res["changed_tensors"] = k
    # Both snapshot paths on the same state, device staging first (it is the default).
    for mode in a.modes.split(","):
        r = res.setdefault("vault", {}).setdefault(mode, {})
        run_vault(mode, state, names, k, a, r)
        dump()
    # Both segment writers on the same device state (or a subset of it: --writer-tensors).
    writers = [w for w in a.writers.split(",") if w]
    if writers:
        wt = a.writer_tensors or a.tensors
        if not a.writer_tensors and time.perf_counter() - T_START > a.budget_s:
            wt = max(1, a.tensors // 4)
            res["writer_note"] = f"budget passed: writer comparison on {wt} of {a.tensors} tensors"
        wnames = names[:wt]
        wstate = {n: state[n] for n in wnames}
        res["writer_state_bytes"] = sum(t.numel() * t.element_size() for t in wstate.values())
        wk = int(round(a.changed * len(wnames)))
        for w in writers:
            r = res.setdefault("writer", {}).setdefault(w, {})
            try:
                run_writer(w, wstate, wnames, wk, a, r)
            except RuntimeError as e:  # e.g. cuFile refusing the volume: keep the other writer
                r["error"] = str(e).splitlines()[0][:400]
                r["restore_exact"] = False
                print(f"writer={w}: {r['error']}", flush=True)
            dump()
        wres = res["writer"]
        if "full_durable_s" in wres.get("posix", {}) and "full_durable_s" in wres.get("cufile", {}):
            for ph in ("full", "finetune"):
                res[f"ratio_cufile_vs_posix_{ph}_durable_s"] = (
                    wres["cufile"][f"{ph}_durable_s"] / wres["posix"][f"{ph}_durable_s"])
    dev = res["vault"].get("on") or res["vault"].get("auto") or next(iter(res["vault"].values()))
    for key in ("first_save_blocking_s", "first_save_total_s", "finetune_blocking_s",
                "full_warm_blocking_s", "full_bytes_written", "finetune_bytes_written",
                "ratio_finetune_bytes_vs_full", "load_cuda_s", "restore_exact", "snapshot_path"):
        if key in dev:
            res[f"vault_{key}"] = dev[key]
    ok = all(r.get("restore_exact", False) for r in res["vault"].values())
    ok = ok and all(r.get("restore_exact", True) for r in res.get("writer", {}).values())

    if "torch_save_s" in res:
        for key in ("vault_first_save_blocking_s", "vault_full_warm_blocking_s"):
            if key in res:
                res[f"ratio_{key}_vs_torch_save"] = res[key] / res["torch_save_s"]
        res["ratio_finetune_blocking_vs_torch_save"] = res["vault_finetune_blocking_s"] / res["torch_save_s"]
        if "dcp_async_save_blocking_s" in res:
            res["ratio_finetune_blocking_vs_dcp_async"] = (
                res["vault_finetune_blocking_s"] / res["dcp_async_save_blocking_s"])
            if "vault_full_warm_blocking_s" in res:
                res["ratio_full_warm_blocking_vs_dcp_async"] = (
                    res["vault_full_warm_blocking_s"] / res["dcp_async_save_blocking_s"])

    print(f"{res['device']}, torch {res['torch']}: {a.tensors} x {a.numel} fp32 = {total / 1e9:.2f} GB on cuda:0")
    for key, val in res.items():
        if isinstance(val, float):
            print(f"{key:52s} {val:10.3f}")
        elif not isinstance(val, dict):
            print(f"{key:52s} {val}")
    rows = ("snapshot_path", "first_save_blocking_s", "first_save_total_s", "finetune_blocking_s",
            "finetune_snapshot_s", "finetune_write_s", "finetune_staged_hash_s", "finetune_d2h_s",
            "ratio_finetune_bytes_vs_full", "full_warm_blocking_s", "load_cuda_s", "restore_exact")
    modes = list(res["vault"])
    _print_table("vault, device_staging=", res["vault"], rows)
    for m in modes:
        print(f"snapshot_reason[{m}]: {res['vault'][m].get('snapshot_reason', '-')}")
    if res.get("writer"):
        ws = list(res["writer"])
        print(f"\nsegment writers, device_staging=on, {res['writer_state_bytes'] / 1e9:.2f} GB state")
        _print_table("writer=", res["writer"],
                     ("full_blocking_s", "full_durable_s", "full_bytes_written", "full_gbps",
                      "full_cufile_s", "full_d2h_s", "finetune_blocking_s", "finetune_durable_s",
                      "finetune_bytes_written", "finetune_gbps", "restore_exact"))
        for w in ws:
            rw = res["writer"][w]
            print(f"writer[{w}]: {rw.get('error') or rw.get('full_writer_reason', '-')}")
    dump()
    shutil.rmtree(a.dir, ignore_errors=True)
    if not ok:
        raise SystemExit("restore mismatch")


if __name__ == "__main__":
    main()
