"""Fine-tune the GR00T-N1.6-shaped policy on a packed LoongForge DB, in one of two modes.

    python -m loongforge.train --config tiny --data DB --mode {baseline,loongforge} --steps N \
        --batch-size B [--json-out FILE] [--metrics-jsonl FILE] [--trace FILE] ...

baseline   : LeRobot-style (torch DataLoader + PIL/torchvision in workers, main-process collate,
             synchronous H2D copy, DDP, torch.save checkpoints).
loongforge : DataFusionLoader, NexusSync, CheckpointVault, MemSculptor; each can be switched off
             (--no-datafusion, --no-nexussync, --no-vault, --no-memsculptor) for ablations.

Both: bf16 autocast on GPU (fp32 on CPU), fused AdamW when available, cosine LR with warmup,
grad clipping, grad accumulation, torchrun-compatible (RANK/WORLD_SIZE/LOCAL_RANK; gloo on CPU,
nccl on GPU). The same seed gives the same model init, data order and noise in both modes.

Figures (ARCHITECTURE.md, "Figures every benchmark reports"), measured after --warmup steps:
tokens/GPU/s = (VLM input tokens + B x (1 + action_horizon)) / step time / GPUs, where VLM input
tokens = B x cameras x image tokens + the non-padding text tokens; samples/s; step time p50/p95;
the share of step time waiting for data, exposed communication and checkpoint stall; peak memory.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import resource
import sys
import time
from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .graphs import GraphedStep, SyncCounter, parse_buckets
from .models.gr00t import Gr00tConfig, Gr00tPolicy, count_parameters, get_config

MODULES = ("datafusion", "nexussync", "vault", "memsculptor")


class TrainError(RuntimeError):
    """A configuration or environment problem reported to the user in one line."""


# ------------------------------------------------------------------------------------------------
# Arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loongforge.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tiny", help="tiny | small | n16 | n16-moe")
    p.add_argument("--data", required=True, help="packed LoongForge DB (directory with data.mdb)")
    p.add_argument("--mode", choices=("baseline", "tuned", "loongforge"), default="loongforge",
                   help="baseline: LeRobot-style; tuned: tuned PyTorch (workers collate, pinned "
                   "non-blocking copies, persistent workers, async checkpoints); loongforge")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=8, help="per-rank micro-batch size")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-warmup", type=float, default=0.05,
                   help="LR warmup: a fraction of --steps (<1) or a number of steps")
    p.add_argument("--min-lr-ratio", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=1e-5)
    p.add_argument("--clip", type=float, default=1.0, help="grad-norm clip (0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=None, help="override the config's image size")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a model config field, e.g. --set moe_experts=4 (repeatable)")
    p.add_argument("--crop-fraction", type=float, default=0.95)
    p.add_argument("--color-jitter", action="store_true")
    p.add_argument("--no-augment", action="store_true", help="centre crop (deterministic images)")
    p.add_argument("--token-pad", type=int, default=0, help="fixed token length (0: batch max)")
    p.add_argument("--workers", type=int, default=2, help="baseline DataLoader workers")
    p.add_argument("--loader-threads", type=int, default=2, help="DataFusion decode threads")
    p.add_argument("--prefetch", type=int, default=4, help="DataFusion batches in flight")
    p.add_argument("--gpu-decode", choices=("auto", "on", "off"), default="auto",
                   help="DataFusion on CUDA: nvJPEG + fused GPU transform (auto: when built)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the timings")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every K steps (0: never)")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    p.add_argument("--stop-after", type=int, default=0,
                   help="stop after this many steps of the --steps schedule (simulates a preemption)")
    p.add_argument("--json-out", default=None, help="summary JSON (figures + loss curve)")
    p.add_argument("--metrics-jsonl", default=None, help="one JSON line per step")
    p.add_argument("--trace", default=None, help="Chrome-trace JSON of --trace-steps steps")
    p.add_argument("--trace-steps", type=int, default=5)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--quiet", action="store_true")
    g = p.add_argument_group("step scheduling (docs/trainer.md, 'The lean step')")
    g.add_argument("--cuda-graph", choices=("auto", "off", "per_microbatch"), default="auto",
                   help="capture forward+backward per microbatch, one graph per shape bucket "
                        "(auto: per_microbatch in loongforge mode on CUDA, else off)")
    g.add_argument("--graph-warmup", type=int, default=3,
                   help="eager microbatches of a shape bucket before it is captured")
    g.add_argument("--graph-max", type=int, default=8, help="shape buckets captured at most")
    g.add_argument("--token-buckets", default="auto",
                   help="static batches: pad text to the smallest of these lengths, e.g. 32,64,128"
                        " ('' = off; auto: with CUDA graphs, powers of two from 16 up to the "
                        "dataset's longest text)")
    g.add_argument("--sync-free", choices=("auto", "on", "off"), default="auto",
                   help="no host syncs in the step: losses, token counts and step times are read "
                        "back two steps later through pinned memory and CUDA events (auto: on "
                        "in loongforge mode on CUDA)")
    g.add_argument("--count-syncs", action="store_true",
                   help="count synchronizing CUDA calls per step (torch sync debug mode)")
    g.add_argument("--act-ckpt", choices=("off", "dit", "llm", "all"), default="off",
                   help="selective activation checkpointing")
    g.add_argument("--compile-frozen", action="store_true",
                   help="torch.compile the frozen encoder path (vision tower, frozen LLM layers)")
    g.add_argument("--adamw", choices=("auto", "fused", "foreach"), default="auto",
                   help="AdamW implementation (auto: fused on CUDA)")
    for m in MODULES:
        p.add_argument(f"--no-{m}", action="store_true", help=f"loongforge mode without {m}")
    return p


# ------------------------------------------------------------------------------------------------
# Distributed context


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_dist(device_arg: str, before_init: Optional[Callable[[torch.device], None]] = None) -> Dist:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_arg == "auto":
        use_cuda = torch.cuda.is_available()
    elif device_arg in ("cpu", "cuda"):
        use_cuda = device_arg == "cuda"
        if use_cuda and not torch.cuda.is_available():
            raise TrainError("--device cuda: torch sees no CUDA device")
    else:
        raise TrainError(f"--device must be auto, cpu or cuda, got '{device_arg}'")
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    # Before torch initializes CUDA (set_device does): an allocator can be swapped only before
    # torch's own is initialized (e.g. MemSculptor).
    if before_init is not None:
        before_init(device)
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world)
    return Dist(rank, world, local, device)


# ------------------------------------------------------------------------------------------------
# Step timing and trace


class Trace:
    """Chrome-trace (Perfetto) 'X' events of a window of steps."""

    def __init__(self, first_step: int, steps: int, rank: int, sync: Callable[[], None]) -> None:
        self.first, self.last = first_step, first_step + steps - 1
        self.rank, self.sync = rank, sync
        self.events: List[Dict[str, Any]] = []
        self.t0 = time.perf_counter()
        self.step = -1

    def active(self) -> bool:
        return self.first <= self.step <= self.last

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        if not self.active():
            yield
            return
        self.sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.events.append({"name": name, "ph": "X", "pid": self.rank, "tid": 0,
                                "ts": (t - self.t0) * 1e6,
                                "dur": (time.perf_counter() - t) * 1e6,
                                "args": {"step": self.step}})

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)


class Readback:
    """Per-step figures computed on the device and read back ``lag`` steps later.

    Each step accumulates [loss, fm_loss, aux_loss, text tokens, grad norm] in a device tensor
    (no ``float(t)`` per microbatch), copies it into pinned host memory without blocking and
    records a CUDA event. lag 0: the trainer synchronized at the end of the step and the values
    are read at once (step time from host clocks). lag > 0 (--sync-free): a step's values are read
    ``lag`` steps later, when its event has long completed, so the host never waits for work it
    just queued and the GPU queue never drains; step times then come from the events (the GPU's
    timeline)."""

    def __init__(self, device: torch.device, lag: int) -> None:
        self.device, self.lag = device, lag
        self.cuda = device.type == "cuda"
        self.pending: "deque[Any]" = deque()
        self.t_prev = time.perf_counter()
        self.prev_event: Any = None

    def begin(self) -> torch.Tensor:
        # [loss, fm_loss, aux_loss, text tokens, grad norm, optimizer step skipped (non-finite)]
        return torch.zeros(6, device=self.device)

    @staticmethod
    def add_micro(acc: torch.Tensor, out: Dict[str, torch.Tensor], mask: torch.Tensor,
                  accum: int, moe: bool) -> None:
        aux = out["aux_loss"].detach().float() if moe else torch.zeros((), device=acc.device)
        vals = torch.stack([out["loss"].detach().float(), out["fm_loss"].detach().float(), aux,
                            mask.sum().to(acc.device).float() * accum])
        acc[:4] += vals / accum

    def end(self, acc: torch.Tensor, row: Dict[str, Any], clip: bool, moe: bool) -> None:
        ev = None
        if self.cuda:
            host = torch.empty(6, pin_memory=True)
            host.copy_(acc, non_blocking=True)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        else:
            host = acc
        self.pending.append((row, host, ev, time.perf_counter(), clip, moe))

    def ready(self) -> List[Dict[str, Any]]:
        out = []
        while len(self.pending) > self.lag:
            out.append(self._finish(self.pending.popleft()))
        return out

    def drain(self) -> List[Dict[str, Any]]:
        out = []
        while self.pending:
            out.append(self._finish(self.pending.popleft()))
        return out

    def _finish(self, item: Any) -> Dict[str, Any]:
        row, host, ev, t_host, clip, moe = item
        if ev is not None:
            ev.synchronize()  # long complete when lag > 0: the host does not wait here
        loss, fm, aux, text_tokens, gnorm, skipped = host.tolist()
        if self.lag > 0 and ev is not None and self.prev_event is not None:
            step_s = self.prev_event.elapsed_time(ev) / 1e3
        else:
            step_s = t_host - self.t_prev
        self.t_prev, self.prev_event = t_host, ev
        r = dict(row)
        r.update(loss=loss, grad_norm=gnorm if clip else float("nan"), step_s=step_s,
                 skipped_nonfinite=int(skipped),
                 tokens=row["tokens"] + int(round(text_tokens)), fm_loss=fm)
        if moe:
            r["aux_loss"] = aux
        return r


def optimizer_step(opt: torch.optim.Optimizer, params: List[torch.nn.Parameter], clip: float,
                   acc: torch.Tensor) -> None:
    """Clip (grad norm into acc[4]) and step, without host syncs.

    A fused AdamW skips, on the device, a step whose gradient norm is not finite (the mechanism
    torch's GradScaler uses: ``found_inf``), and acc[5] records it: one bf16 overflow must not
    turn every parameter into NaN. Non-fused optimizers cannot skip without a host sync; they
    step as before."""
    fused = bool(opt.defaults.get("fused"))
    if clip:
        gn = torch.nn.utils.clip_grad_norm_(params, clip)
        acc[4] = gn
        if fused:
            # 0-dim like GradScaler's: the optimizer also subtracts it from its step counters.
            bad = (~torch.isfinite(gn)).to(torch.float32)
            opt.found_inf = bad  # type: ignore[attr-defined]  # read by the fused kernel
            acc[5] = bad
    opt.step()


def auto_buckets(longest: int) -> tuple:
    """Token buckets from 16 up to the first that holds `longest` tokens, four per octave and
    multiples of 8 (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, ...): padding to a bucket
    costs at most a quarter of the text, and about an eighth on average. Powers of two cost up to
    a half: on the end-to-end data (text up to 49 tokens) they pad every batch to 64, 8% more step
    time at batch 64. Only buckets that batches actually reach are captured as graphs."""
    out, b = [], 16
    while b < longest:
        out.append(b)
        b += max(8, 1 << max(0, b.bit_length() - 3))
    return tuple(out + [b])


def compile_frozen(model: Gr00tPolicy) -> str:
    """torch.compile the frozen encoder path (vision tower, projector, frozen LLM layers) in place
    (their forward methods: parameter names and state_dict keys stay as they are)."""
    if not hasattr(torch, "compile"):
        return f"off: torch {torch.__version__} has no torch.compile"
    n = 0
    for m in model.frozen_modules():
        if isinstance(m, torch.nn.Embedding):
            continue
        m.forward = torch.compile(m.forward, dynamic=False)  # type: ignore[method-assign]
        n += 1
    return f"on ({n} frozen modules)"


def percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


def peak_memory(device: torch.device) -> Dict[str, Any]:
    if device.type == "cuda":
        try:
            alloc = torch.cuda.max_memory_allocated(device)
            reserved = torch.cuda.max_memory_reserved(device)
        except RuntimeError:  # a pluggable allocator (MemSculptor) keeps its own statistics
            return {"kind": "cuda", "peak_allocated_bytes": float("nan"),
                    "peak_reserved_bytes": float("nan"), "fragmentation": float("nan")}
        return {"kind": "cuda", "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved,
                "fragmentation": 1 - alloc / reserved if reserved else 0.0}
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"kind": "cpu-rss", "peak_rss_bytes": self_kb * 1024,
            "peak_child_rss_bytes": child_kb * 1024}


# ------------------------------------------------------------------------------------------------
# Module adapters (loongforge mode). Each returns (object or None, status line).


def _missing(module: str, flag: str, err: BaseException) -> TrainError:
    return TrainError(f"loongforge mode needs {module}, which is not available in this build "
                      f"({type(err).__name__}: {err}); run with --no-{flag} to switch it off")


def make_loader(args: argparse.Namespace, d: Dist, use_datafusion: bool,
                token_buckets: Sequence[int] = ()) -> Any:
    common = dict(image_size=args.image_size, crop_fraction=args.crop_fraction,
                  color_jitter=args.color_jitter, train=not args.no_augment, seed=args.seed,
                  rank=d.rank, world_size=d.world, shuffle=True, drop_last=True)
    if use_datafusion:
        try:
            from .data import DataFusionLoader
        except ImportError as e:
            raise _missing("DataFusionLoader (loongforge.data)", "datafusion", e) from e
        gpu: Dict[str, Any] = {}
        if d.device.type == "cuda" and args.gpu_decode != "auto":
            gpu["gpu_decode"] = args.gpu_decode == "on"
        if token_buckets:
            gpu["token_buckets"] = list(token_buckets)
        return DataFusionLoader(args.data, args.batch_size, threads=args.loader_threads, **gpu,
                                prefetch=args.prefetch,
                                token_pad=args.token_pad if args.token_pad else "batch_max",
                                device=str(d.device), **common)
    from .trainer_data import BaselineLoader

    return BaselineLoader(args.data, args.batch_size, workers=args.workers,
                          token_pad=args.token_pad or None, device=str(d.device),
                          pin_memory=False, tuned=args.mode == "tuned", **common)


class SyncBackend:
    """How gradients are reduced across ranks: none (world 1), DDP (baseline / --no-nexussync) or
    NexusSync. ``exposed_s`` is the time the step waited for communication after backward."""

    def __init__(self, model: torch.nn.Module, d: Dist, kind: str) -> None:
        self.kind, self.d, self.model, self.exposed_s = kind, d, model, 0.0
        self.wrapped: torch.nn.Module = model
        self.nexus: Any = None
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            moe = getattr(model, "cfg", None) is not None and model.cfg.moe_experts > 0
            self.wrapped = DDP(model, device_ids=[d.device.index] if d.device.type == "cuda"
                               else None, find_unused_parameters=moe)
        elif kind == "nexussync":
            try:
                from .comm import NexusSync
            except ImportError as e:
                raise _missing("NexusSync (loongforge.comm)", "nexussync", e) from e
            moe = getattr(model, "cfg", None) is not None and model.cfg.moe_experts > 0
            # MoE expert weights form their own bucket groups (high/low load by routing counts).
            self.nexus = NexusSync(model, expert_param_filter=r"\.experts\." if moe else None)

    def no_sync(self) -> Any:
        if self.kind == "ddp":
            return self.wrapped.no_sync()
        if self.kind == "nexussync":
            return self.nexus.no_sync()
        return contextlib.nullcontext()

    def zero_grad(self, opt: torch.optim.Optimizer, keep: bool = False) -> None:
        """keep=True zeroes gradients in place (CUDA graphs read and write them at fixed
        addresses); otherwise they are set to None (no memset)."""
        if self.kind == "nexussync":
            self.nexus.zero_grad()  # grads are views into the flat buckets: zero in place
        else:
            opt.zero_grad(set_to_none=not keep)

    def feed_expert_load(self, model: Gr00tPolicy) -> None:
        """Per-expert token counts (summed over MoE layers) -> NexusSync's load grouping."""
        if self.kind != "nexussync" or not model.cfg.moe_experts:
            return
        counts = torch.zeros(model.cfg.moe_experts, dtype=torch.float64)
        for c in model.expert_token_counts().values():
            counts += c.detach().to("cpu", torch.float64)
        self.nexus.set_expert_load(counts.tolist())

    def stats(self) -> Dict[str, Any]:
        return dict(self.nexus.stats()) if self.nexus is not None else {}

    def finish(self) -> None:
        """Waits for this step's gradient reduction (NexusSync); DDP has finished in backward."""
        if self.kind == "nexussync":
            t = time.perf_counter()
            self.nexus.finish()
            self.exposed_s = time.perf_counter() - t
        else:
            self.exposed_s = 0.0


class Checkpointer:
    """torch.save (baseline / --no-vault) or CheckpointVault. ``stall_s``: time training blocked.

    Rank 0 writes the shared state (model, optimizer, scheduler); every rank writes its own small
    state (loader position, RNG) so that a multi-rank resume is exact on every rank."""

    SHARED = ("step", "model", "optimizer", "scheduler", "config")

    def __init__(self, kind: str, directory: Optional[str], d: Dist) -> None:
        self.kind, self.dir, self.d = kind, directory, d
        self.vault: Any = None
        self.pending: Any = None  # async save in flight (tuned mode)
        self.async_impl = ""
        self.stall_s = 0.0
        self.drain_s = 0.0
        self.bytes_written = 0
        if directory:
            os.makedirs(os.path.join(directory, "rank_state"), exist_ok=True)
        if kind == "vault" and directory and d.is_main:
            try:
                from .ckpt import CheckpointVault
            except ImportError as e:
                raise _missing("CheckpointVault (loongforge.ckpt)", "vault", e) from e
            self.vault = CheckpointVault(os.path.join(directory, "vault"))

    def _rank_path(self, step: int) -> str:
        return os.path.join(self.dir, "rank_state", f"rank{self.d.rank:05d}_step_{step:08d}.pt")

    def save(self, step: int, state: Dict[str, Any]) -> float:
        if not self.dir:
            return 0.0
        t = time.perf_counter()
        shared = {k: v for k, v in state.items() if k in self.SHARED or
                  (k.startswith("_") and self.kind == "async")}
        mine = {k: v for k, v in state.items() if k not in self.SHARED and not k.startswith("_")}
        torch.save(mine, self._rank_path(step))  # small: loader position and RNG
        if self.d.is_main:
            if self.kind == "vault":
                self.vault.save(step, shared)  # blocks only for the snapshot
            elif self.kind == "async":
                self._save_async(step, shared)
            else:
                path = os.path.join(self.dir, f"step_{step:08d}.pt")
                torch.save(shared, path + ".tmp")
                os.replace(path + ".tmp", path)
                self.bytes_written += os.path.getsize(path)
        dt = time.perf_counter() - t
        self.stall_s += dt
        return dt

    def _save_async(self, step: int, shared: Dict[str, Any]) -> None:
        """Tuned PyTorch: DCP async_save where torch has it, else a CPU snapshot written by a
        background thread with torch.save. A save waits for the previous one first."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None
        path = os.path.join(self.dir, f"step_{step:08d}")
        try:
            import torch.distributed.checkpoint as dcp

            if hasattr(dcp, "async_save"):
                from torch.distributed.checkpoint.state_dict import get_state_dict

                model, opt = shared["_model_obj"], shared["_opt_obj"]
                msd, osd = get_state_dict(model, opt)
                self.pending = dcp.async_save({"model": msd, "optimizer": osd,
                                               "step": torch.tensor(step)},
                                              checkpoint_id=path + ".dcp")
                self.async_impl = "dcp.async_save"
                return
        except Exception as e:  # DCP unusable here (version, no process group): fall back
            self.async_impl = f"thread torch.save (DCP failed: {type(e).__name__})"
        import concurrent.futures

        snap = {k: v for k, v in shared.items() if not k.startswith("_")}
        snap = _to_cpu(snap)
        if not self.async_impl:
            self.async_impl = "thread torch.save"
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

        def write() -> None:
            torch.save(snap, path + ".pt.tmp")
            os.replace(path + ".pt.tmp", path + ".pt")

        self.pending = pool.submit(write)
        pool.shutdown(wait=False)

    def latest(self) -> Optional[Dict[str, Any]]:
        if not self.dir or not os.path.isdir(self.dir):
            return None
        if self.kind == "vault":
            # Every rank reads the vault (read-only on ranks > 0).
            from .ckpt import CheckpointVault

            v = self.vault or CheckpointVault(os.path.join(self.dir, "vault"), read_only=True)
            step = v.latest()
            shared = v.load(step, map_location="cpu") if step is not None else None
        else:
            if any(f.endswith(".dcp") for f in os.listdir(self.dir)):
                raise TrainError(f"{self.dir} holds DCP checkpoints; --resume reads torch.save "
                                 "checkpoints only (load DCP ones with torch.distributed.checkpoint)")
            files = sorted(f for f in os.listdir(self.dir) if f.startswith("step_") and
                           f.endswith(".pt"))
            shared = (torch.load(os.path.join(self.dir, files[-1]), map_location="cpu",
                                 weights_only=False)
                      if files else None)
        if shared is None:
            return None
        rank_file = self._rank_path(int(shared["step"]))
        if not os.path.exists(rank_file):
            raise TrainError(f"checkpoint step {shared['step']}: missing {rank_file}")
        # Our own files (loader state, RNG states, extras): torch >= 2.6 defaults to weights_only.
        shared.update(torch.load(rank_file, map_location="cpu", weights_only=False))
        return shared

    def close(self) -> None:
        if self.pending is not None:
            t = time.perf_counter()
            self.pending.result()
            self.pending = None
            self.drain_s = time.perf_counter() - t
        if self.vault is not None:
            t = time.perf_counter()
            self.vault.close()  # drains the background writer
            self.drain_s = time.perf_counter() - t
            try:
                self.bytes_written = int(self.vault.stats().get("bytes_written_total",
                                         self.vault.stats().get("bytes_written", 0)))
            except Exception:  # informational
                pass


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class MemoryPlanner:
    """MemSculptor as torch's CUDA allocator (loongforge mode on a GPU), or nothing."""

    def __init__(self, enabled: bool, lf_mode: bool, scoped: bool = False) -> None:
        self.enabled, self.lf_mode, self.scoped = enabled, lf_mode, scoped
        self.ms: Any = None
        self.status = "off: --no-memsculptor" if lf_mode and not enabled else "off"

    def install(self, device: torch.device) -> None:
        if not self.enabled:
            return
        if device.type != "cuda":
            self.status = "off: needs CUDA"
            return
        try:
            from .memory import MemSculptor
        except ImportError as e:
            raise _missing("MemSculptor (loongforge.memory)", "memsculptor", e) from e
        if not MemSculptor.available():
            raise TrainError("MemSculptor is not usable here (allocator library missing or torch "
                             "lacks CUDAPluggableAllocator); run with --no-memsculptor")
        if self.scoped:
            # CUDA graphs: captured steps live in torch's graph pool (fixed addresses, nothing
            # allocated in replay); MemSculptor serves the persistent tensors through a scoped
            # torch.cuda.MemPool (docs/trainer.md, Note [Graphs and MemSculptor]).
            import torch as _t
            if not hasattr(_t.cuda, "MemPool"):
                self.status = (f"off: --cuda-graph needs torch.cuda.MemPool (torch >= 2.5) to "
                               f"scope MemSculptor; torch {_t.__version__} has none")
                return
            self.ms = MemSculptor(device.index or 0)
            self.status = "on (scoped: persistent tensors; CUDA graphs use their own pool)"
            return
        self.ms = MemSculptor(device.index or 0).install()
        self.status = "on"

    def persistent(self) -> Any:
        if self.ms is None:
            return contextlib.nullcontext()
        if not self.scoped:
            return self.ms.persistent()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self.ms.pool())
            stack.enter_context(self.ms.persistent())
        except (RuntimeError, TypeError, AttributeError) as e:  # torch without a usable MemPool
            stack.close()
            self.status = f"off: scoped MemSculptor pool failed ({e})"
            print(f"[memsculptor] {self.status}; tensors use torch's allocator", file=sys.stderr)
            self.ms = None
        return stack

    def record(self, steps: int, trace_path: Optional[str] = None) -> None:
        if self.ms is not None and not self.scoped:
            self.ms.record(steps=steps, trace_path=trace_path)

    def step(self, signature: str) -> Any:
        if self.ms is None or self.scoped:
            return contextlib.nullcontext()
        return self.ms.step(signature)

    def stats(self) -> Optional[Dict[str, Any]]:
        return dict(self.ms.stats()) if self.ms is not None else None


# ------------------------------------------------------------------------------------------------
# Optimizer and schedule


def make_optimizer(params: List[torch.nn.Parameter], args: argparse.Namespace,
                   device: torch.device) -> torch.optim.Optimizer:
    kw: Dict[str, Any] = dict(lr=args.lr, betas=(0.95, 0.999), eps=1e-8,
                              weight_decay=args.weight_decay)
    choice = getattr(args, "adamw", "auto")
    if choice == "fused" and device.type != "cuda":
        raise TrainError("--adamw fused needs a CUDA device")
    if device.type == "cuda" and choice in ("auto", "fused"):
        try:
            return torch.optim.AdamW(params, fused=True, **kw)
        except (TypeError, RuntimeError) as e:
            if choice == "fused":
                raise TrainError(f"--adamw fused: torch {torch.__version__} refused: {e}") from e
    if choice == "foreach":
        kw["foreach"] = True
    return torch.optim.AdamW(params, **kw)


def lr_lambda(total: int, warmup: float, min_ratio: float) -> Callable[[int], float]:
    w = int(warmup * total) if warmup < 1 else int(warmup)

    def f(step: int) -> float:
        if w and step < w:
            return (step + 1) / w
        prog = min(1.0, (step - w) / max(1, total - w))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    return f


def rng_state(gen: torch.Generator) -> Dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
          "python": random.getstate(), "noise": gen.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Dict[str, Any], gen: torch.Generator) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    gen.set_state(st["noise"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


# ------------------------------------------------------------------------------------------------
# The run


def parse_overrides(items: Sequence[str]) -> Dict[str, Any]:
    """'field=value' strings -> typed config overrides (ValueError naming a bad item)."""
    fields = {f.name: f.type for f in dataclasses.fields(Gr00tConfig)}
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with a Gr00tConfig field")
        default = getattr(Gr00tConfig(), key)
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1")
            else:
                out[key] = type(default)(raw)
        except ValueError as e:
            raise ValueError(f"--set {item!r}: {key} takes a {type(default).__name__}") from e
    return out


def build_model(config: str, seed: int, image_size: Optional[int] = None,
                schema: Optional[Dict[str, Any]] = None,
                overrides: Optional[Dict[str, Any]] = None) -> Gr00tPolicy:
    """The policy with a seed-determined init (identical in both modes)."""
    cfg = get_config(config, image_size=image_size, **(overrides or {}))
    if schema is not None:
        if int(schema["state_dim"]) > cfg.max_state_dim or int(schema["action_dim"]) > cfg.max_action_dim:
            raise TrainError(f"dataset state/action dims {schema['state_dim']}/{schema['action_dim']}"
                             f" exceed config {config}'s {cfg.max_state_dim}/{cfg.max_action_dim}")
        if int(schema.get("vocab_size", 0)) > cfg.vocab_size:
            raise TrainError(f"dataset vocab {schema['vocab_size']} exceeds config {config}'s "
                             f"{cfg.vocab_size}")
        if int(schema["action_horizon"]) > cfg.max_seq_len - 1:
            raise TrainError(f"action horizon {schema['action_horizon']} too long for {config}")
    torch.manual_seed(seed)
    return Gr00tPolicy(cfg)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    if args.steps <= 0 or args.batch_size <= 0 or args.grad_accum <= 0:
        raise TrainError("--steps, --batch-size and --grad-accum must be positive")
    if not os.path.exists(os.path.join(args.data, "data.mdb")):
        raise TrainError(f"--data {args.data}: no LoongForge dataset there (missing data.mdb); "
                         f"build one with `loongforge pack`")
    if args.threads:
        torch.set_num_threads(args.threads)
    lf = args.mode == "loongforge"
    on = {m: lf and not getattr(args, f"no_{m}") for m in MODULES}
    status: Dict[str, str] = {}
    auto_lean = lf and args.device != "cpu" and torch.cuda.is_available()
    graphs = args.cuda_graph == "per_microbatch" or (args.cuda_graph == "auto" and auto_lean)
    mem = MemoryPlanner(on["memsculptor"], lf, scoped=graphs)
    d = setup_dist(args.device, mem.install)

    from .trainer_data import read_schema

    try:
        schema = read_schema(args.data)
    except (OSError, ValueError) as e:
        raise TrainError(str(e)) from e
    try:
        model = build_model(args.config, args.seed, args.image_size, schema,
                            parse_overrides(args.set))
    except ValueError as e:
        raise TrainError(str(e)) from e
    cfg = model.cfg
    args.image_size = cfg.image_size
    status["memsculptor"] = mem.status
    with mem.persistent():  # parameters live apart from the planned activation arena
        model.to(d.device).train()

    # Static batches: token buckets (DataFusion pads to them in its stage 3 when every record
    # fits the largest bucket; otherwise the step runner pads, and longer batches run eager).
    if args.token_buckets == "auto":
        buckets = auto_buckets(int(schema.get("max_tokens", 0)) or 64) if graphs else ()
    else:
        try:
            buckets = parse_buckets(args.token_buckets)
        except ValueError as e:
            raise TrainError(f"--token-buckets: {e}") from e
    longest = int(schema.get("max_tokens", 0))
    loader_buckets = buckets if buckets and longest and longest <= buckets[-1] else ()
    if os.environ.get("LOONGFORGE_TRAIN_LOADER_BUCKETS", "1") == "0":
        loader_buckets = ()  # diagnostics: the step runner pads instead of DataFusion
    loader = make_loader(args, d, on["datafusion"], loader_buckets)
    status["datafusion"] = "on" if on["datafusion"] else ("off: --no-datafusion" if lf else "off")
    if on["datafusion"] and d.device.type == "cuda":
        backend = _safe_metrics(loader).get("decode_backend")
        if backend:
            status["datafusion"] = f"on (decode: {backend})"
    # NexusSync also runs at world size 1 (flat gradient buckets, no collectives) so that the
    # single-process ablation measures its bookkeeping honestly.
    sync_kind = "nexussync" if on["nexussync"] else ("ddp" if d.world > 1 else "none")
    status["nexussync"] = ("on" if sync_kind == "nexussync" else
                           "off: --no-nexussync" if lf else "off")
    sync = SyncBackend(model, d, sync_kind)
    ckpt_dir = args.ckpt_dir if args.ckpt_every or args.resume else None
    ckpt = Checkpointer("vault" if on["vault"] else ("async" if args.mode == "tuned" else "torch"),
                        ckpt_dir, d)
    status["vault"] = "on" if on["vault"] and ckpt_dir else ("off: no checkpoints" if on["vault"]
                                                             else "off")

    runner: Any = sync.wrapped if sync.kind == "ddp" else model
    if args.compile:
        if not hasattr(torch, "compile"):
            raise TrainError(f"--compile needs torch >= 2.0 (this is {torch.__version__})")
        runner = torch.compile(runner)
    if args.compile_frozen:
        status["compile_frozen"] = compile_frozen(model)
    if args.act_ckpt != "off":
        model.set_activation_checkpointing(args.act_ckpt)
    params = [p for p in model.parameters() if p.requires_grad]
    with mem.persistent():
        opt = make_optimizer(params, args, d.device)
    status["adamw"] = ("fused" if opt.defaults.get("fused") else
                       "foreach" if opt.defaults.get("foreach") else "default")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps, args.lr_warmup,
                                                             args.min_lr_ratio))
    noise_gen = torch.Generator(device=d.device)
    noise_gen.manual_seed(args.seed * 1000 + d.rank)
    start_step = 0
    if args.resume:
        st = ckpt.latest()
        if st is not None:
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["optimizer"])
            sched.load_state_dict(st["scheduler"])
            loader.load_state_dict(st["loader"])
            set_rng_state(st["rng"], noise_gen)
            start_step = int(st["step"])

    cuda = d.device.type == "cuda"
    counter = SyncCounter(args.count_syncs)

    def sync_dev() -> None:
        if cuda:
            counter.explicit("train.py: torch.cuda.synchronize (step end / trace)")
            torch.cuda.synchronize(d.device)

    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    if cuda:
        with contextlib.suppress(RuntimeError):  # unsupported under a pluggable allocator
            torch.cuda.reset_peak_memory_stats(d.device)
    trace = Trace(start_step + args.warmup, args.trace_steps if args.trace else 0, d.rank, sync_dev)
    jsonl = open(args.metrics_jsonl, "w") if args.metrics_jsonl and d.is_main else None
    img_tokens = len(schema["cameras"]) * cfg.tokens_per_image
    horizon = int(schema["action_horizon"])

    # The step runner: static batches (token buckets) and per-microbatch CUDA graphs.
    stepper: Any = None
    if graphs or buckets:
        log = (lambda m: print(m, file=sys.stderr, flush=True)) if d.is_main else (lambda m: None)
        stepper = GraphedStep(model, d.device, runner=runner, token_buckets=buckets,
                              warmup=args.graph_warmup, graphs=graphs, sync=sync,
                              autocast_dtype=torch.bfloat16 if cuda else None,
                              max_graphs=args.graph_max, log=log)
        status["cuda_graph"] = ("per_microbatch" if stepper.graphs_on else
                                f"off ({stepper.disabled_reason})")
        status["static_batches"] = f"token buckets {list(buckets)}" if buckets else "off"
    want_sync_free = args.sync_free == "on" or (args.sync_free == "auto" and lf)
    sync_free = want_sync_free and cuda
    if args.sync_free == "on" and not cuda:
        status["sync_free"] = "off: needs CUDA (on the CPU every step is synchronous)"
    elif sync_free:
        status["sync_free"] = "on (figures read back 2 steps late)"
    readback = Readback(d.device, lag=2 if sync_free else 0)

    def batches() -> Iterator[Dict[str, torch.Tensor]]:
        epoch = loader.state_dict()["epoch"]
        while True:
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1

    it = batches()
    # LOONGFORGE_MEM_TRACE=PATH keeps the recorded steps' trace (for `loongforge mem replay`),
    # LOONGFORGE_MEM_RECORD_STEPS=N records N steps instead of min(3, warm-up) (diagnosis).
    rec_env = os.environ.get("LOONGFORGE_MEM_RECORD_STEPS", "")
    if rec_env and not (rec_env.isdigit() and int(rec_env) > 0):
        raise TrainError(f"LOONGFORGE_MEM_RECORD_STEPS must be a positive integer, got {rec_env!r}")
    mem.record(steps=int(rec_env) if rec_env else max(1, min(3, args.warmup)),
               trace_path=os.environ.get("LOONGFORGE_MEM_TRACE") or None)
    rows: List[Dict[str, Any]] = []
    losses: List[Dict[str, Any]] = []
    t_run = time.perf_counter()
    end_step = min(args.steps, args.stop_after) if args.stop_after else args.steps

    def finish_row(r: Dict[str, Any]) -> None:
        step = r["step"] - 1
        losses.append({k: r[k] for k in ("step", "loss", "fm_loss", "aux_loss", "grad_norm",
                                         "skipped_nonfinite") if k in r})
        if step - start_step >= args.warmup:
            rows.append(r)
        if jsonl:
            jsonl.write(json.dumps(r) + "\n")
            jsonl.flush()
        if d.is_main and not args.quiet and (step + 1) % args.log_every == 0:
            st = r["step_s"]
            print(f"[{args.mode}] step {step + 1}/{args.steps} loss {r['loss']:.4f} "
                  f"lr {r['lr']:.2e} step {st * 1e3:.0f} ms "
                  f"wait {r['data_wait_s'] / st * 100:.0f}% "
                  f"tok/s {r['tokens'] / st:.0f} samples/s {r['samples'] / st:.1f}",
                  file=sys.stderr, flush=True)

    moe = bool(cfg.moe_experts)
    for step in range(start_step, end_step):
        trace.step = step
        wait = 0.0
        samples = 0
        known_tokens = 0
        with counter.window() if step - start_step >= args.warmup else contextlib.nullcontext():
            acc = readback.begin()  # device: [loss, fm_loss, aux_loss, text tokens, grad norm]
            sync.zero_grad(opt, keep=stepper is not None and stepper.graphs_on)
            for micro in range(args.grad_accum):
                t0 = time.perf_counter()
                with trace.span("data_wait"):
                    batch = next(it)
                wait += time.perf_counter() - t0
                b = int(batch["tokens"].shape[0])
                samples += b
                known_tokens += b * img_tokens + b * (1 + horizon)
                last = micro == args.grad_accum - 1
                sig = f"L{int(batch['tokens'].shape[1])}xB{b}"
                if sync.nexus is not None:
                    sync.nexus.set_micro_step(is_last=last)
                with (contextlib.nullcontext() if last else sync.no_sync()), mem.step(sig):
                    if stepper is not None:
                        with trace.span("forward_backward"):
                            out = stepper(batch, noise_gen, 1.0 / args.grad_accum)
                    else:
                        with trace.span("forward"), autocast():
                            out = runner(batch, generator=noise_gen)
                            loss = out["loss"] / args.grad_accum
                        with trace.span("backward"):
                            loss.backward()
                        del loss
                readback.add_micro(acc, out, batch["attention_mask"], args.grad_accum, moe)
                del batch, out
            with trace.span("comm"):
                sync.finish()
            if step == start_step + args.warmup or (step + 1) % 100 == 0:
                sync.feed_expert_load(model)  # collective: every rank at the same step
            with trace.span("optimizer"):
                optimizer_step(opt, params, args.clip, acc)
                sched.step()
            stall = 0.0
            if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                with trace.span("checkpoint"):
                    stall = ckpt.save(step + 1, {
                        "step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "loader": loader.state_dict(),
                        "rng": rng_state(noise_gen), "config": args.config,
                        "_model_obj": model, "_opt_obj": opt})
            if not sync_free:
                sync_dev()
            readback.end(acc, {
                "step": step + 1, "lr": sched.get_last_lr()[0], "data_wait_s": wait,
                "comm_exposed_s": sync.exposed_s, "ckpt_stall_s": stall, "samples": samples,
                "tokens": known_tokens}, clip=bool(args.clip), moe=moe)
            for r in readback.ready():
                finish_row(r)
    for r in readback.drain():
        finish_row(r)
    total_s = time.perf_counter() - t_run
    it.close()  # stops the loader's pipeline (DataFusion threads, DataLoader workers) now
    if jsonl:
        jsonl.close()
    if args.trace and d.is_main:
        trace.write(args.trace)
    ckpt.close()
    summary = summarize(args, d, rows, losses, status, model, loader, ckpt, total_s)
    if ckpt.async_impl:
        summary["modules"]["async_checkpoint"] = ckpt.async_impl
    if sync.stats():
        summary["nexussync_stats"] = sync.stats()
    if stepper is not None:
        summary["cuda_graph"] = stepper.stats()
    if counter.enabled:
        n = counter.counts
        summary["figures"]["host_syncs_per_step"] = sum(n) / len(n) if n else float("nan")
        summary["figures"]["host_syncs_max"] = max(n) if n else 0
        summary["figures"]["host_sync_sites"] = dict(counter.examples)
    ms_stats = mem.stats()
    if ms_stats is not None:
        m = summary["figures"]["memory"]
        m["memsculptor"] = ms_stats
        pa, pr = ms_stats.get("peak_allocated_bytes"), ms_stats.get("peak_reserved_bytes")
        if mem.scoped:
            # Scoped (torch.cuda.MemPool): torch's caching allocator manages the pool's blocks
            # too, so its counters cover MemSculptor's segments, the CUDA graphs' pool and the
            # rest; MemSculptor's own figures (persistent tensors) stay under "memsculptor".
            m["note"] = "torch's counters (they include the MemSculptor pool's segments)"
        elif pa and pr:  # torch's counters do not see a pluggable allocator
            m.update(peak_allocated_bytes=pa, peak_reserved_bytes=pr, fragmentation=1 - pa / pr)
    if sync.kind == "ddp":
        summary["figures"]["comm_exposed_note"] = (
            "DDP overlaps its all-reduce inside backward; exposed time is not separable here")
    if d.is_main and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


def summarize(args: argparse.Namespace, d: Dist, rows: List[Dict[str, Any]],
              losses: List[Dict[str, Any]], status: Dict[str, str], model: Gr00tPolicy,
              loader: Any, ckpt: Checkpointer, total_s: float) -> Dict[str, Any]:
    step_s = [r["step_s"] for r in rows]
    tot = sum(step_s) or float("nan")
    counts = count_parameters(model)
    fig = {
        "timed_steps": len(rows),
        "tokens_per_gpu_per_s": sum(r["tokens"] for r in rows) / tot if rows else float("nan"),
        "samples_per_s": sum(r["samples"] for r in rows) * d.world / tot if rows else float("nan"),
        "step_ms_p50": percentile(step_s, 50) * 1e3,
        "step_ms_p95": percentile(step_s, 95) * 1e3,
        "data_wait_share": sum(r["data_wait_s"] for r in rows) / tot if rows else float("nan"),
        "comm_exposed_share": sum(r["comm_exposed_s"] for r in rows) / tot if rows else float("nan"),
        "ckpt_stall_share": sum(r["ckpt_stall_s"] for r in rows) / tot if rows else float("nan"),
        "skipped_nonfinite_steps": sum(r.get("skipped_nonfinite", 0) for r in losses),
        "ckpt_stall_s": ckpt.stall_s,
        "ckpt_bytes_written": ckpt.bytes_written,
        "ckpt_drain_s": ckpt.drain_s,
        "memory": peak_memory(d.device),
    }
    return {
        "mode": args.mode, "config": args.config, "image_size": args.image_size,
        "batch_size": args.batch_size, "grad_accum": args.grad_accum, "world_size": d.world,
        "device": str(d.device), "seed": args.seed, "steps": args.steps, "warmup": args.warmup,
        "modules": status, "params": counts, "figures": fig, "wall_s": total_s,
        "loader_metrics": _safe_metrics(loader), "loss_curve": losses,
    }


def _safe_metrics(loader: Any) -> Dict[str, Any]:
    try:
        return dict(loader.metrics())
    except Exception:  # metrics are informational; never fail a finished run for them
        return {}


def format_summary(s: Dict[str, Any]) -> str:
    f = s["figures"]
    mem = f["memory"]
    mem_s = (f"peak alloc {mem['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved "
             f"{mem['peak_reserved_bytes'] / 2**30:.2f} GiB, frag {mem['fragmentation']:.1%}"
             if mem["kind"] == "cuda" else f"peak RSS {mem['peak_rss_bytes'] / 2**20:.0f} MiB")
    lines = [
        f"== {s['mode']} | config {s['config']} @ {s['image_size']}px | batch {s['batch_size']} x "
        f"accum {s['grad_accum']} x world {s['world_size']} | {s['device']} | "
        f"{f['timed_steps']} timed steps",
        "   modules: " + ", ".join(f"{k} {v}" for k, v in s["modules"].items()),
        f"   tokens/GPU/s {f['tokens_per_gpu_per_s']:.1f} | samples/s {f['samples_per_s']:.2f} | "
        f"step p50 {f['step_ms_p50']:.0f} ms p95 {f['step_ms_p95']:.0f} ms",
        f"   data wait {f['data_wait_share']:.1%} | exposed comm {f['comm_exposed_share']:.1%} | "
        f"ckpt stall {f['ckpt_stall_share']:.1%} ({f['ckpt_stall_s']:.2f} s)",
        f"   memory: {mem_s}",
        *([f"   host syncs per steady-state step: {f['host_syncs_per_step']:.2f} "
           f"(max {f['host_syncs_max']})"] if "host_syncs_per_step" in f else []),
        f"   loss: first {s['loss_curve'][0]['loss']:.4f} last {s['loss_curve'][-1]['loss']:.4f}"
        if s["loss_curve"] else "   loss: (no steps)",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(args)
    except TrainError as e:
        print(f"loongforge.train: error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_summary(summary))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
