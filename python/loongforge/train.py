"""Fine-tune the GR00T-N1.6-shaped policy on a packed LoongForge DB, in one of three modes.

    python -m loongforge.train --config tiny --data DB --mode {baseline,tuned,loongforge} \
        --steps N --batch-size B [--json-out FILE] [--metrics-jsonl FILE] [--trace FILE] ...

baseline   : LeRobot-style (torch DataLoader + PIL/torchvision in workers, main-process collate,
             synchronous H2D copy, DDP, torch.save checkpoints).
tuned      : tuned PyTorch (workers collate, pinned non-blocking copies, async checkpoints).
loongforge : DataFusionLoader, NexusSync, CheckpointVault, MemSculptor; each can be switched off
             (--no-datafusion, --no-nexussync, --no-vault, --no-memsculptor) for ablations.

All: bf16 autocast on GPU (fp32 on CPU), fused AdamW when available, cosine LR with warmup,
grad clipping, grad accumulation, torchrun-compatible (RANK/WORLD_SIZE/LOCAL_RANK; gloo on CPU,
nccl on GPU). The same seed gives the same model init, data order and noise in every mode.

This file is the command line and the run: ``build`` puts the parts together, ``train_loop``
runs the steps. The parts live in train_backends.py (loader, gradient sync, checkpoints, memory,
optimizer, the token guard) and the figures in train_metrics.py (readback, trace, summary).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Mapping, NoReturn, Optional, Tuple

import torch
import torch.distributed as dist

from . import knobs
from .flops import FlopsPerShape
from .graphs import GraphedStep, SyncCounter, graph_unavailable, parse_buckets
from .models.gr00t import Gr00tConfig, Gr00tPolicy
from .train_backends import (MODULES, Checkpointer, Dist, MemoryPlanner, NonFiniteError,
                             SyncBackend, TokenGuard, TrainError, auto_buckets, build_model,
                             compile_blocks,
                             compile_frozen,
                             init_optimizer_state, lr_lambda, make_loader, make_optimizer,
                             moe_metrics, optimizer_step, parse_overrides, rng_state,
                             set_rng_state, setup_dist)
from .train_metrics import (ModuleProfiler, Readback, Trace, _safe_metrics, add_module_figures,
                            format_summary, summarize)

__all__ = ["build_parser", "run", "main", "build_model", "auto_buckets", "optimizer_step",
           "TrainError"]


# ------------------------------------------------------------------------------------------------
# Arguments

SEED_MAX = 2**32 - 1  # the seed feeds torch's generators (x1000 + rank) and the samplers' uint64
INT_MAX = 2**31 - 1  # counts and sizes: beyond it no run is possible, and C++ takes int32


def _int(low: int, high: int = INT_MAX) -> Callable[[str], int]:
    """argparse type: an integer in [low, high] (argparse names the flag in its error)."""

    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {text}")
        return v

    parse.__name__ = "int"
    return parse


def _float(low: float, high: float = math.inf, low_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in [low, high] ((low, high] with low_open). 1e400 reads as
    inf and is refused like inf and nan."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not (low < v if low_open else low <= v) or v > high:
            hi = "" if high == math.inf else f", {high:g}]"
            lo = f"({low:g}" if low_open else f"[{low:g}"
            rng = f"in {lo}{hi}" if hi else f"{'>' if low_open else '>='} {low:g}"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {text}")
        return v

    parse.__name__ = "float"
    return parse


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, ``loongforge train: error: ...`` (exit 2),
    like every other refusal of the trainer; --help still shows the usage."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        self.exit(2, f"{PROG}: error: {message} (--help lists the flags)\n")


PROG = "loongforge train"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tiny", help="tiny | small | n16 | n16-moe | tiny-moe")
    p.add_argument("--data", required=True, help="packed LoongForge DB (directory with data.mdb)")
    p.add_argument("--mode", choices=("baseline", "lerobot", "tuned", "loongforge"),
                   default="loongforge",
                   help="baseline (also named lerobot): LeRobot's train-script DataLoader "
                   "(workers collate, pinned non-blocking copies, persistent workers, prefetch 4, "
                   "PIL decode), frozen weights in fp32, a host sync per step; tuned: the same "
                   "DataLoader with GPU JPEG decode and a sampler across epochs, frozen weights "
                   "in bf16, expandable segments, fused AdamW, no host sync per step, async "
                   "checkpoints; loongforge: every module")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the whole model with static shapes (text padded to the "
                   "dataset's longest unless --token-pad or token buckets; torch >= 2)")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"),
                   default="default",
                   help="--compile's torch.compile mode (reduce-overhead: PyTorch's own CUDA "
                   "graphs; the flow-matching noise is then drawn outside the compiled model)")
    p.add_argument("--start-batch", type=_int(0), default=0, metavar="N",
                   help="begin the first epoch at its batch N, as a run resumed there would "
                   "(benchmarks: puts an epoch boundary inside the timed window)")
    p.add_argument("--steps", type=_int(1), default=100, help="optimizer steps")
    p.add_argument("--batch-size", type=_int(1), default=8, help="per-rank micro-batch size")
    p.add_argument("--grad-accum", type=_int(1, 1 << 20), default=1,
                   help="micro-batches per optimizer step")
    p.add_argument("--lr", type=_float(0), default=1e-4)
    p.add_argument("--lr-warmup", type=_float(0), default=0.05,
                   help="LR warmup: a fraction of --steps (<1) or a number of steps")
    p.add_argument("--min-lr-ratio", type=_float(0, 1), default=0.0)
    p.add_argument("--weight-decay", type=_float(0), default=1e-5)
    p.add_argument("--clip", type=_float(0), default=1.0, help="grad-norm clip (0 = off)")
    p.add_argument("--max-nonfinite-steps", type=_int(1), default=3, metavar="N",
                   help="a step whose loss or gradient norm is not finite is skipped (no "
                   "update); after N such steps in a row the run stops with an error (exit 1)")
    p.add_argument("--seed", type=_int(0, SEED_MAX), default=0)
    p.add_argument("--noise", choices=("stream", "per-sample"), default="stream",
                   help="where the flow-matching noise and time come from: 'stream', one "
                        "generator per rank; 'per-sample', drawn from (seed, epoch, sample index) "
                        "by loongforge.sample_rng, so a sample's numbers do not depend on the "
                        "world size or the batch it lands in (Note [Noise that belongs to the "
                        "sample])")
    p.add_argument("--image-size", type=_int(1, 1 << 16), default=None,
                   help="override the config's image size")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a model config field, e.g. --set moe_experts=4 (repeatable)")
    p.add_argument("--crop-fraction", type=_float(0, 1, low_open=True), default=0.95)
    p.add_argument("--augment", choices=("groot", "none"), default="groot",
                   help="image transforms in every mode: groot = GR00T N1.6's random crop "
                   "(--crop-fraction) + resize + colour jitter (brightness 0.3, contrast 0.4, "
                   "saturation 0.5, hue 0.08); none = centre crop + resize")
    p.add_argument("--color-jitter", action="store_true",
                   help="(kept for old command lines) the default --augment groot jitters")
    p.add_argument("--no-augment", action="store_true", help="same as --augment none")
    p.add_argument("--peak-tflops", type=_float(0), default=0.0,
                   help="dense bf16 peak of one GPU for MFU (0: from the device name)")
    p.add_argument("--token-pad", type=_int(0, 1 << 20), default=0,
                   help="fixed token length (0: batch max)")
    p.add_argument("--workers", type=_int(0, 1024), default=2,
                   help="DataLoader workers of the baseline and tuned modes")
    p.add_argument("--loader-threads", type=_int(1, 1024), default=2,
                   help="DataFusion decode threads")
    p.add_argument("--prefetch", type=_int(1, 1 << 16), default=4,
                   help="DataFusion batches in flight")
    p.add_argument("--gpu-decode", choices=("auto", "on", "off"), default="auto",
                   help="on CUDA: DataFusion's nvJPEG + fused GPU transform (auto: when built); "
                   "tuned mode: torchvision's GPU decode (auto/on: when torchvision has it)")
    p.add_argument("--threads", type=_int(0, 1 << 16), default=0,
                   help="torch intra-op threads (0: default)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--memory-cap-gib", type=_float(0), default=0.0,
                   help="cap this process's GPU memory at this many GiB: torch's allocator "
                   "(set_per_process_memory_fraction) and MemSculptor's backend (0: no cap; "
                   "bench/memory/max_batch.py)")
    p.add_argument("--init-device", choices=("host", "device"), default="host",
                   help="where the model's parameters are initialised: host (then copied; the "
                        "same numbers on every machine) or device (much faster start-up on a "
                        "GPU; the same numbers in every mode, other numbers than host's)")
    p.add_argument("--memory-history", default="",
                   help="record every GPU allocation with its Python stack from the start and "
                   "dump torch's memory snapshot here at the end (a diagnostic: slower steps; "
                   "bench/memory/peak_breakdown.py reads it)")
    p.add_argument("--warmup", type=_int(0), default=2, help="steps excluded from the timings")
    p.add_argument("--ckpt-every", type=_int(0), default=0,
                   help="checkpoint every K steps (0: never)")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-when-busy", choices=Checkpointer.WHEN_BUSY, default="skip",
                   help="a checkpoint due while the previous one is still being written: skip "
                        "it (logged, counted in the summary) or wait for the writer (stalls)")
    p.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    p.add_argument("--stop-after", type=_int(0), default=0,
                   help="stop after this many steps of the --steps schedule (simulates a preemption)")
    p.add_argument("--json-out", default=None, help="summary JSON (figures + loss curve)")
    p.add_argument("--metrics-jsonl", default=None, help="one JSON line per step")
    p.add_argument("--trace", default=None, help="Chrome-trace JSON of --trace-steps steps")
    p.add_argument("--trace-steps", type=_int(0), default=5)
    p.add_argument("--profile-modules", type=_int(0), default=0, metavar="N",
                   help="after --warmup, profile N steps (torch.profiler) and report the step "
                   "time per part: data, vision, llm, projector, dit, backward, optimizer "
                   "(summary 'module_breakdown'; those steps leave the timed figures; eager: "
                   "not with --cuda-graph per_microbatch, --token-buckets or --compile)")
    p.add_argument("--log-every", type=_int(1), default=1)
    p.add_argument("--quiet", action="store_true")
    m = p.add_argument_group("mixture of experts (docs/moe.md)")
    m.add_argument("--expert-parallel", type=_int(1, 1 << 16), default=1, metavar="N",
                   help="split each MoE layer's experts across N ranks (all-to-all dispatch)")
    m.add_argument("--topk-ratio", type=_float(0, 1, low_open=True), default=None,
                   help="NexusSync: top-k with error feedback on the low-load expert group, "
                        "sending this fraction of its gradients (default: dense)")
    m.add_argument("--ep-timeout", type=_float(0, low_open=True), default=300.0,
                   help="seconds an expert-parallel exchange may wait for a peer")
    g = p.add_argument_group("step scheduling (docs/trainer.md, 'The lean step')")
    g.add_argument("--cuda-graph", choices=("auto", "off", "per_microbatch"), default="auto",
                   help="capture forward+backward per microbatch, one graph per shape bucket "
                        "(auto: per_microbatch in loongforge mode on CUDA, else off)")
    g.add_argument("--graph-warmup", type=_int(0), default=3,
                   help="eager microbatches of the first shape bucket before it is captured "
                        "(later buckets are captured at once, unless --compile-frozen)")
    g.add_argument("--graph-max", type=_int(1, 1 << 16), default=8,
                   help="shape buckets captured at most")
    g.add_argument("--graph-grads", choices=("auto", "fixed"), default="auto",
                   help="where graphed steps keep gradients. auto: made by the first capture "
                        "inside the graph pool, sharing blocks with the activations, when a step "
                        "is one microbatch at world size 1 (docs/trainer.md, Note [Gradients in "
                        "the graph pool]); fixed: allocated once before the first capture")
    g.add_argument("--graph-pad-up", type=_float(1), default=1.25, metavar="R",
                   help="with the gradients in the graph pool: a batch whose bucket has no graph "
                        "yet runs in a captured bucket's graph of at most R times its text "
                        "length instead of a new capture, which would grow the pool by the "
                        "gradients' size (Note [Padding up to a captured bucket]; 1: never)")
    g.add_argument("--token-buckets", default="auto",
                   help="static batches: pad text to the smallest of these lengths, e.g. 32,64,128"
                        " ('' = off; auto: with CUDA graphs, four per octave from 16 up to the "
                        "dataset's longest text)")
    g.add_argument("--sync-free", choices=("auto", "on", "off"), default="auto",
                   help="no host syncs in the step: losses, token counts and step times are read "
                        "back two steps later through pinned memory and CUDA events (auto: on "
                        "in loongforge and tuned modes on CUDA)")
    g.add_argument("--count-syncs", action="store_true",
                   help="count synchronizing CUDA calls per step (torch sync debug mode)")
    g.add_argument("--act-ckpt", choices=("off", "dit", "llm", "all"), default="off",
                   help="selective activation checkpointing")
    g.add_argument("--compile-frozen", action="store_true",
                   help="torch.compile the frozen encoder path (vision tower, frozen LLM layers)")
    g.add_argument("--compile-blocks", choices=("auto", "on", "off"), default="auto",
                   help="torch.compile each dense transformer block (vision, language, DiT) and "
                   "the projector: norms, activations, residual adds and autocast's casts fused "
                   "around the GEMMs, inside the CUDA graphs; one compilation per block kind and "
                   "token bucket, cached on disk (Note [Compiled blocks] in train_backends.py; "
                   "auto: on in loongforge mode on CUDA with torch >= 2.5, static shapes and a dense "
                   "model, unless --compile, --compile-frozen or --act-ckpt)")
    g.add_argument("--fp8-frozen", action="store_true",
                   help="run the frozen encoders' linear layers in FP8 e4m3 (per-channel weights, "
                   "per-token activations, torch._scaled_mm); needs compute capability >= 8.9")
    g.add_argument("--frozen-bf16", choices=("auto", "on", "off"), default="auto",
                   help="store the frozen encoders' linear and conv weights in bf16, which bf16 "
                   "autocast computes with anyway: the same results, half their memory, no cast "
                   "per step (auto: on in loongforge and tuned modes on CUDA; needs CUDA)")
    g.add_argument("--norm-recompute", choices=("auto", "on", "off"), default="auto",
                   help="RMSNorms and SwiGLU products recomputed in backward from their inputs "
                   "instead of keeping their outputs: the same gradients, less activation memory "
                   "(Note [Recomputed norms] in gr00t_layers.py; auto: on in loongforge mode on "
                   "CUDA)")
    g.add_argument("--persistent-arena", choices=("auto", "off"), default="auto",
                   help="MemSculptor lays the parameters, buffers and optimizer state out in two "
                   "planned allocations instead of one block each: the reserved bytes are the "
                   "allocated ones (docs/memory.md, Note [The persistent arena]; auto: on when "
                   "MemSculptor is, without --fp8-frozen or expert parallelism, which replace "
                   "parameters later)")
    g.add_argument("--graph-pool", choices=("auto", "memsculptor", "torch"), default="auto",
                   help="where CUDA-graph captures allocate: MemSculptor's MemPool, or torch's "
                   "own graph pool, which can use expandable segments (auto: torch when "
                   "expandable segments are on, else memsculptor; Note [Graphs and MemSculptor])")
    g.add_argument("--expandable-segments", choices=("auto", "on", "off"), default="auto",
                   help="torch's expandable segments for its pools (the default pool and CUDA "
                   "graphs' pools): freed blocks merge across what would be segment boundaries "
                   "(auto: on in loongforge and tuned modes on CUDA, unless "
                   "PYTORCH_CUDA_ALLOC_CONF sets it)")
    g.add_argument("--adamw", choices=("auto", "fused", "foreach"), default="auto",
                   help="AdamW implementation (auto: fused on CUDA)")
    for m in MODULES:
        p.add_argument(f"--no-{m}", action="store_true", help=f"loongforge mode without {m}")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Flags that cannot work together or values no run can use: one TrainError line each
    (no flag may silently do nothing, and no bad value may end in a
    traceback)."""
    if args.mode == "lerobot":  # the LeRobot-style mode's second name
        args.mode = "baseline"
    if args.steps <= 0 or args.batch_size <= 0 or args.grad_accum <= 0:
        raise TrainError("--steps, --batch-size and --grad-accum must be positive")
    if args.compile_mode != "default" and not args.compile:
        raise TrainError(f"--compile-mode {args.compile_mode} needs --compile")
    if args.start_batch and args.resume:
        raise TrainError("--start-batch sets where a new run begins; --resume begins where the "
                         "checkpoint left off: choose one")
    if not args.lr >= 0:  # also NaN
        raise TrainError(f"--lr must be >= 0, got {args.lr}")
    if args.image_size is not None and args.image_size <= 0:
        raise TrainError(f"--image-size must be positive, got {args.image_size}")
    for flag in ("weight_decay", "clip", "lr_warmup", "min_lr_ratio", "token_pad", "warmup",
                 "ckpt_every", "stop_after", "trace_steps", "workers", "threads", "prefetch",
                 "profile_modules", "memory_cap_gib"):
        v = getattr(args, flag)
        if not v >= 0:
            raise TrainError(f"--{flag.replace('_', '-')} must be >= 0, got {v}")
    if not args.graph_pad_up >= 1.0:
        raise TrainError(f"--graph-pad-up must be >= 1 (1: never pad up), got {args.graph_pad_up}")
    if args.log_every <= 0 or args.loader_threads <= 0:
        raise TrainError("--log-every and --loader-threads must be positive")
    if args.ckpt_every and not args.ckpt_dir:
        raise TrainError("--ckpt-every needs --ckpt-dir (where the checkpoints go)")
    if args.color_jitter and (args.augment == "none" or args.no_augment):
        raise TrainError("--color-jitter contradicts --augment none / --no-augment")
    if not args.peak_tflops >= 0:
        raise TrainError(f"--peak-tflops must be >= 0, got {args.peak_tflops}")
    if args.resume:
        if not args.ckpt_dir:
            raise TrainError("--resume needs --ckpt-dir (the directory to resume from)")
        if not os.path.isdir(args.ckpt_dir):
            raise TrainError(f"--resume: --ckpt-dir {args.ckpt_dir} does not exist")
    if args.expert_parallel < 1 or not args.ep_timeout > 0:
        raise TrainError("--expert-parallel must be >= 1 and --ep-timeout positive")
    if args.topk_ratio is not None and not 0 < args.topk_ratio <= 1:
        raise TrainError(f"--topk-ratio must be in (0, 1], got {args.topk_ratio}")
    if args.profile_modules:
        # Note [Module breakdown] in train_metrics.py: the ranges need an eager step.
        if args.cuda_graph == "per_microbatch":
            raise TrainError("--profile-modules needs eager steps: ranges inside CUDA-graph "
                             "replays do not show; use --cuda-graph off (auto turns it off)")
        if args.token_buckets not in ("auto", ""):
            raise TrainError("--profile-modules times backward on its own; the static-batch "
                             "step runner (--token-buckets) runs forward and backward together: "
                             "leave --token-buckets at auto")
        if args.compile:
            raise TrainError("--profile-modules with --compile: the part ranges would break "
                             "the compiled graph; profile without --compile")
        if args.warmup + args.profile_modules > args.steps:
            raise TrainError(f"--profile-modules {args.profile_modules} needs --steps >= "
                             f"--warmup + {args.profile_modules} (got --steps {args.steps}, "
                             f"--warmup {args.warmup})")
    if args.compile_blocks == "on" and (args.compile or args.compile_frozen):
        raise TrainError("--compile-blocks on compiles the blocks that --compile / "
                         "--compile-frozen would compile again: choose one")
    if not os.path.exists(os.path.join(args.data, "data.mdb")):
        raise TrainError(f"--data {args.data}: no LoongForge dataset there (missing data.mdb); "
                         f"build one with `loongforge pack`")


# ------------------------------------------------------------------------------------------------
# The run


# Note [Noise that belongs to the sample]
# A generator per rank gives a sample noise that depends on which rank it landed on and what that
# rank drew before it: the same run on 1, 2 or 4 ranks then trains on different noise. With
# --noise per-sample the flow-matching noise and time of a sample are drawn from (seed, epoch,
# sample index) (loongforge.sample_rng), like DataFusion's augmentation, so a run with a global
# batch split over N ranks draws what one rank with the whole batch draws. The epoch is the one the
# batch came from (set by the loop as it hands the batch out); padding rows (sample index -1) draw
# sample 0's numbers, which their masks keep out of the loss.
class SampleNoise:
    """(noise [B, horizon, max_action_dim], u [B]) for a batch, as Gr00tPolicy.draw_noise gives
    them, drawn per sample (Note [Noise that belongs to the sample])."""

    def __init__(self, seed: int, action_dim: int) -> None:
        self.seed, self.action_dim, self.epoch = int(seed), int(action_dim), 0

    def __call__(self, batch: Mapping[str, torch.Tensor],
                 out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        from . import sample_rng

        idx = batch["sample_index"].reshape(-1).clamp(min=0)
        horizon = int(batch["action"].shape[1])
        noise = sample_rng.normal(idx, (horizon, self.action_dim), seed=self.seed,
                                  epoch=self.epoch, stream=0)
        u = sample_rng.uniform(idx, (), seed=self.seed, epoch=self.epoch, stream=1)
        if out is None:
            return noise, u
        out[0].copy_(noise)
        out[1].copy_(u)
        return out


@dataclasses.dataclass
class Session:
    """Everything ``build`` puts together for ``train_loop``."""

    args: argparse.Namespace
    d: Dist
    cfg: Gr00tConfig
    schema: Dict[str, Any]
    status: Dict[str, str]
    mem: MemoryPlanner
    model: Gr00tPolicy
    runner: Any
    loader: Any
    sync: SyncBackend
    ckpt: Checkpointer
    params: List[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: Any
    noise_gen: torch.Generator
    noise: Optional["SampleNoise"]
    start_step: int
    counter: SyncCounter
    sync_dev: Callable[[], None]
    autocast: Callable[[], Any]
    trace: Trace
    stepper: Any
    sync_free: bool
    readback: Readback
    guard: TokenGuard
    profiler: Optional[ModuleProfiler]
    stop: "StopSignal"
    startup: Dict[str, float] = dataclasses.field(default_factory=dict)  # _Clock.phases

    def release(self) -> None:
        """Breaks the links that keep the model alive past the run: NexusSync's autograd hooks
        (a cycle through autograd's C++ state) and the step runner's graphs and static buffers.
        After it, dropping the session frees the model, the optimizer and their tensors by
        reference counting alone (Note [Trainer teardown])."""
        if self.stepper is not None:
            self.stepper.release()
        self.sync.close()


class _Clock:
    """Wall seconds of build()'s phases (figures.startup_phases_s): where a run's start-up goes
    before its first step (model init on the host, the copy to the device, the loader's
    start, ...). A phase is the time since the previous mark."""

    def __init__(self) -> None:
        self.phases: Dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        t = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + (t - self._t)
        self._t = t


@contextlib.contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """--init-device device: tensors made inside are made on `device`, in torch's default pool
    (then moved whole into MemSculptor's persistent pool by _into_persistent, once the frozen
    weights are cast: casting there would leave their fp32 blocks as holes)."""
    if not hasattr(device, "__enter__"):  # torch.device as a context: torch >= 2.0
        raise TrainError(f"--init-device device needs torch >= 2.0 (this is {torch.__version__})")
    with torch.device(device):
        yield


def _allocator_settings(conf: str) -> None:
    """torch.cuda.memory._set_allocator_settings, without torch 2.11's FutureWarning about its
    name (the setting is the same)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.cuda.memory._set_allocator_settings(conf)


_EXPANDABLE_BY_RUN = [False]  # turned on by this process's run: turned off again at its end


def _expandable_segments(choice: str, lf: bool, cuda: bool) -> str:
    """--expandable-segments: turns torch's expandable segments on for this process's allocator
    (before the first CUDA allocation; it applies to segments made afterwards) and says so.
    Note [Graphs and MemSculptor]: with them on, CUDA graphs capture into torch's own graph pool,
    whose blocks then merge across what would be segment boundaries; MemSculptor's MemPool (a
    custom allocator) cannot have them."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in conf:
        on = "expandable_segments:true" in conf.replace(" ", "").lower()
        return f"{'on' if on else 'off'} (PYTORCH_CUDA_ALLOC_CONF)"
    want = choice == "on" or (choice == "auto" and lf and cuda)
    if not want:
        return "off"
    if not cuda:
        raise TrainError("--expandable-segments on needs CUDA")
    if getattr(torch.cuda.memory, "_set_allocator_settings", None) is None:
        return f"off (torch {torch.__version__} cannot set them at run time)"
    try:
        _allocator_settings("expandable_segments:True")
        _EXPANDABLE_BY_RUN[0] = True
    except RuntimeError as e:
        if choice == "on":
            raise TrainError(f"--expandable-segments on: torch refused: {e}") from e
        return f"off (torch refused: {str(e).splitlines()[0][:120]})"
    return "on"


def _state_layout(opt: torch.optim.Optimizer) -> str:
    """Where the optimizer's device state lives: one allocation (the arena) or several blocks."""
    ts = [v for st in opt.state.values() for v in st.values()
          if torch.is_tensor(v) and v.device.type == "cuda"]
    if not ts:
        return "no optimizer state on the device"
    n = sum(t.numel() * t.element_size() for t in ts)
    storages = {(t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()
                for t in ts}
    return (f"optimizer state {n / 2**30:.2f} GiB in "
            + ("one allocation" if len(storages) == 1 else f"{len(storages)} blocks"))


def _into_persistent(model: Any, mem: MemoryPlanner, arena: bool = False,
                     status: Optional[Dict[str, str]] = None) -> None:
    """The model's parameters and buffers, from the host or from torch's default pool on the
    device, copied into MemSculptor's persistent pool: with ``arena``, into one planned
    allocation (Note [The persistent arena] in memory.py), else one after another; the default
    pool's blocks are given back. With MemSculptor off they stay where they are."""
    if mem.ms is None:
        return
    ts = list(itertools.chain(model.parameters(), model.buffers()))
    if arena:
        from .memory import pack_into_arena

        buf = pack_into_arena(ts, mem.device, alloc=mem.arena_alloc)
        if status is not None and buf is not None:
            status["persistent_arena"] = (f"on (parameters and buffers {buf.numel() / 2**30:.2f}"
                                          " GiB in one allocation")
    else:
        with mem.persistent(), torch.no_grad():
            for t in ts:
                t.data = t.data.clone()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _store_frozen_bf16(model: Any, mem: MemoryPlanner, status: Dict[str, str],
                       persistent: bool) -> None:
    """--frozen-bf16: the frozen linear/conv weights in bf16 (Gr00tPolicy.frozen_linear_to),
    where the weights are: on the host, in torch's default pool (--init-device device, before
    _into_persistent) or, ``persistent``, in the persistent pool (after the FP8 swap)."""
    with mem.persistent() if persistent else contextlib.nullcontext():
        layers, saved = model.frozen_linear_to(torch.bfloat16)
    status["frozen_bf16"] = (f"on ({layers} frozen linear/conv layers, {saved / 2**30:.2f} GiB "
                             "less; one input cast for sibling layers)")


def _log(d: Dist) -> Callable[[str], None]:
    return (lambda m: print(m, file=sys.stderr, flush=True)) if d.is_main else (lambda m: None)


def text_bound(args: argparse.Namespace, cfg: Gr00tConfig, schema: Dict[str, Any],
               log: Callable[[str], None]) -> int:
    """The loaders' cut for text longer than the model takes (0: none needed). Without it
    a 100k-character instruction grew the trainer to 21 GB."""
    longest = int(schema.get("max_tokens", 0))
    limit = cfg.max_text_tokens
    if args.token_pad > limit:
        raise TrainError(f"--token-pad {args.token_pad} is longer than config {cfg.name}'s "
                         f"max_text_tokens ({limit})")
    if longest <= limit:
        return 0
    log(f"warning: {args.data}: instructions of up to {longest} tokens; the trainer cuts them to "
        f"{limit}, config {cfg.name}'s max_text_tokens (--set max_text_tokens=N to change)")
    return limit


def build(args: argparse.Namespace) -> Session:
    check_args(args)
    clock = _Clock()
    if args.threads:
        torch.set_num_threads(args.threads)
    lf = args.mode == "loongforge"
    # What a tuned PyTorch user sets too: the "auto" choices that are plain torch settings.
    strong = lf or args.mode == "tuned"
    on = {m: lf and not getattr(args, f"no_{m}") for m in MODULES}
    status: Dict[str, str] = {}
    auto_lean = lf and args.device != "cpu" and torch.cuda.is_available()
    graphs = args.cuda_graph == "per_microbatch" or (args.cuda_graph == "auto" and auto_lean
                                                     and not args.profile_modules)
    if args.memory_cap_gib:
        if args.device == "cpu" or not torch.cuda.is_available():
            raise TrainError("--memory-cap-gib caps GPU memory: it needs a CUDA device")
        # Read by MemSculptor's backend when it loads (in setup_dist).
        os.environ["LOONGFORGE_MEM_LIMIT_MB"] = str(int(args.memory_cap_gib * 1024))
    mem = MemoryPlanner(on["memsculptor"], lf, scoped=graphs)
    cuda_run = args.device != "cpu" and torch.cuda.is_available()
    expandable = _expandable_segments(args.expandable_segments, strong, cuda_run)
    if expandable != "off":
        status["expandable_segments"] = expandable
    d = setup_dist(args.device, mem.install)
    log = _log(d)
    if args.frozen_bf16 == "on" and d.device.type != "cuda":
        raise TrainError("--frozen-bf16 on needs CUDA: bf16 autocast runs only there (on the "
                         "CPU the frozen layers compute in fp32)")
    _memory_history(args.memory_history, d.device)
    clock.mark("process group and allocator")
    if args.memory_cap_gib:
        total = torch.cuda.get_device_properties(d.device).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, args.memory_cap_gib * 2**30 / total), d.device)
        status["memory_cap"] = (f"{args.memory_cap_gib:g} GiB (torch's allocator and "
                                "MemSculptor; the loader's and checkpoint staging's own device "
                                "buffers are outside it)")

    from .trainer_data import read_schema

    try:
        schema = read_schema(args.data)
    except (OSError, ValueError) as e:
        raise TrainError(str(e)) from e
    on_device = (contextlib.nullcontext() if args.init_device == "host" or d.device.type == "cpu"
                 else _on_device(d.device))
    try:
        with on_device:
            model = build_model(args.config, args.seed, args.image_size, schema,
                                parse_overrides(args.set))
    except ValueError as e:
        raise TrainError(str(e)) from e
    frozen_bf16 = args.frozen_bf16 == "on" or (args.frozen_bf16 == "auto" and strong
                                               and d.device.type == "cuda")
    from .models.gr00t_layers import set_norm_recompute, set_shared_casts

    set_shared_casts(frozen_bf16)  # one autocast cast for frozen sibling layers (same bits)
    norms = args.norm_recompute == "on" or (args.norm_recompute == "auto" and lf
                                            and d.device.type == "cuda")
    set_norm_recompute(norms)  # Note [Recomputed norms]: the same gradients, less memory
    if norms:
        status["norm_recompute"] = ("on (RMSNorms and SwiGLU recomputed in backward: the same "
                                    "gradients)")
    if frozen_bf16 and not args.fp8_frozen:
        # Before the copy to the device (host init): no fp32 weights there to free, no holes
        # left in the persistent pool, half the bytes copied. --fp8-frozen quantizes the fp32
        # weights first (below).
        _store_frozen_bf16(model, mem, status, persistent=False)
    arena = (args.persistent_arena == "auto" and mem.ms is not None and not args.fp8_frozen
             and args.expert_parallel == 1)
    if args.init_device == "device" and d.device.type == "cuda":
        _into_persistent(model, mem, arena, status)
    clock.mark("model init")
    cfg = model.cfg
    args.image_size = cfg.image_size
    status["memsculptor"] = mem.status
    from .augment import describe

    status["augment"] = describe(args.augment, args.no_augment, args.crop_fraction,
                                 cfg.image_size)
    if arena and args.init_device != "device":  # host init: copied straight into the arena
        _into_persistent(model, mem, arena, status)
    with mem.persistent():  # parameters live apart from the planned activation arena
        model.to(d.device).train()
    clock.mark("model to device")
    cut = text_bound(args, cfg, schema, log)

    # Static batches: token buckets (DataFusion pads to them in its stage 3 when every record
    # fits the largest bucket; otherwise the step runner pads, and longer batches run eager).
    longest = int(schema.get("max_tokens", 0))
    if cut:
        longest = cut
    if args.token_buckets == "auto":
        buckets = auto_buckets(longest or 64) if graphs else ()
    else:
        try:
            buckets = parse_buckets(args.token_buckets)
        except ValueError as e:
            raise TrainError(f"--token-buckets: {e}") from e
    if cut and buckets and buckets[-1] > cut:
        buckets = tuple(b for b in buckets if b < cut) + (cut,)
    loader_buckets = buckets if buckets and longest and longest <= buckets[-1] else ()
    if args.compile and not buckets and not args.token_pad and longest:
        # Note [Static shapes for --compile]: one shape, one compilation
        args.token_pad = min(-(-longest // 8) * 8, cfg.max_text_tokens)
        status["compile"] = (f"whole model, static shapes (text padded to {args.token_pad}, the "
                             "dataset's longest rounded up to 8; --token-pad N to change)")
    if not knobs.get("LOONGFORGE_TRAIN_LOADER_BUCKETS"):
        loader_buckets = ()  # diagnostics: the step runner pads instead of DataFusion
    try:
        loader = make_loader(args, d, on["datafusion"], loader_buckets, cut)
    except ImportError as e:
        raise TrainError(str(e)) from e
    clock.mark("loader")
    status["datafusion"] = "on" if on["datafusion"] else ("off: --no-datafusion" if lf else "off")
    if on["datafusion"] and d.device.type == "cuda":
        backend = _safe_metrics(loader).get("decode_backend")
        if backend:
            status["datafusion"] = f"on (decode: {backend})"
    # NexusSync also runs at world size 1 (flat gradient buckets, no collectives) so that the
    # single-process ablation measures its bookkeeping honestly; not under graphed one-microbatch
    # steps (below).
    sync_kind = "nexussync" if on["nexussync"] else ("ddp" if d.world > 1 else "none")
    status["nexussync"] = ("on" if sync_kind == "nexussync" else
                           "off: --no-nexussync" if lf else "off")
    # Note [Gradients in the graph pool]: NexusSync's flat buckets would hold the gradients for
    # the whole run; at world size 1 they have nothing to reduce.
    pool_grads = (graphs and args.graph_grads == "auto" and d.device.type == "cuda"
                  and d.world == 1 and args.grad_accum == 1 and args.topk_ratio is None
                  and graph_unavailable(model, d.device, "none") is None)
    if pool_grads and sync_kind == "nexussync":
        sync_kind = "none"
        status["nexussync"] = ("off: world size 1, nothing to reduce (graphed steps make the "
                               "gradients in the graph pool; --graph-grads fixed keeps it on)")
    ep = None
    from .moe import ExpertParallel, check_expert_parallel

    try:
        check_expert_parallel(cfg.moe_experts, cfg.moe_top_k, args.expert_parallel, d.world)
        if args.expert_parallel > 1:
            ep = ExpertParallel(args.expert_parallel, cfg.moe_experts, cfg.moe_top_k,
                                timeout_s=args.ep_timeout)
    except ValueError as e:
        raise TrainError(str(e)) from e
    if ep is not None:
        model.shard_experts(ep)  # built whole from the seed: each expert as in one process
        status["expert_parallel"] = (f"{ep.size} x {ep.dp_size} (experts "
                                     f"{ep.first_expert}..{ep.first_expert + ep.local - 1})")
    if args.topk_ratio is not None and sync_kind != "nexussync":
        raise TrainError("--topk-ratio needs NexusSync (loongforge mode)")
    sync = SyncBackend(model, d, sync_kind, ep=ep, topk_ratio=args.topk_ratio)
    # A --ckpt-dir alone is where a signal's checkpoint goes (Note [Stopping on a signal]).
    ckpt_dir = args.ckpt_dir or None
    run_id = {"mode": args.mode, "config": args.config, "set": sorted(args.set),
              "image_size": cfg.image_size, "batch_size": args.batch_size, "world_size": d.world,
              "seed": args.seed}
    if ep is not None:  # Note [Expert-parallel checkpoints] in moe.py
        run_id["expert_parallel"] = ep.size
    try:
        ckpt = Checkpointer("vault" if on["vault"] else ("async" if args.mode == "tuned"
                                                          else "torch"),
                            ckpt_dir, d, run_id, when_busy=args.ckpt_when_busy, log=log,
                            resume=args.resume)
    except OSError as e:  # a read-only or foreign directory: name the flag
        raise TrainError(f"--ckpt-dir {ckpt_dir}: cannot write checkpoints there: "
                         f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")) from e
    status["vault"] = "on" if on["vault"] and ckpt_dir else ("off: no checkpoints" if on["vault"]
                                                             else "off")

    if args.fp8_frozen:
        from .fp8 import Fp8Unsupported, apply_fp8_frozen

        try:
            fp8 = apply_fp8_frozen(model, d.device)
        except Fp8Unsupported as e:
            raise TrainError(str(e)) from e
        status["fp8_frozen"] = (f"on ({fp8['fp8']} linear layers e4m3, {fp8['kept']} kept in "
                                "bf16: a dimension not a multiple of 16; activations quantized "
                                + ("by one kernel)" if fp8["fused"] else "by torch ops)"))
    if frozen_bf16 and args.fp8_frozen:  # the layers FP8 left as nn.Linear, on the device
        _store_frozen_bf16(model, mem, status, persistent=True)
    runner: Any = sync.wrapped if sync.kind == "ddp" else model
    if args.compile:
        if not hasattr(torch, "compile"):
            raise TrainError(f"--compile needs torch >= 2.0 (this is {torch.__version__})")
        # Note [Static shapes for --compile]. With text padded per batch, every new length
        # recompiles the whole model, and from the second one torch compiles it with dynamic
        # shapes; on torch 2.11 that graph's backward failed at its first run in inductor's own
        # code (a workspace view of the wrong size, on an H200). A user of torch.compile pads to one
        # length and compiles once: the trainer pads text to the dataset's longest (above) and
        # asks for static shapes.
        kw = {} if args.compile_mode == "default" else {"mode": args.compile_mode}
        runner = torch.compile(runner, dynamic=False, **kw)
        status.setdefault("compile", "whole model, static shapes" if args.token_pad or buckets
                          else "whole model (text lengths vary: recompiles per length)")
        if kw:
            status["compile"] += f", mode {args.compile_mode}"
    if args.compile_frozen:
        status["compile_frozen"] = compile_frozen(model)
    blocks, why_not = _compile_blocks_wanted(args, lf, d.device,
                                             static=bool(buckets or args.token_pad),
                                             moe=bool(getattr(cfg, "moe_experts", 0)))
    if not blocks and lf and args.compile_blocks == "auto":
        status["compile_blocks"] = f"off: {why_not}"
    if blocks:
        try:
            status["compile_blocks"] = compile_blocks(model)
        except RuntimeError as e:
            raise TrainError(f"--compile-blocks on: {e}") from e
        if "frozen_bf16" in status:  # inside compiled blocks inductor merges the casts itself
            status["frozen_bf16"] = status["frozen_bf16"].replace(
                "one input cast for sibling layers", "sibling layers' input casts merged in the "
                "compiled blocks")
    compiled = args.compile_frozen or bool(blocks)
    if args.act_ckpt != "off":
        model.set_activation_checkpointing(args.act_ckpt)
    params = [p for p in model.parameters() if p.requires_grad]
    with mem.persistent():
        opt = make_optimizer(params, args, d.device)
    if mem.ms is not None:  # Note [Optimizer state up front] in train_backends.py
        init_optimizer_state(opt, mem.persistent, arena_alloc=mem.arena_alloc if arena else None)
        if arena:
            status["persistent_arena"] = status.get("persistent_arena", "on (") + "; " + \
                _state_layout(opt) + ")"
        torch.cuda.empty_cache()  # the temporary zero gradients (MemSculptor is on: CUDA)
    status["adamw"] = ("fused" if opt.defaults.get("fused") else
                       "foreach" if opt.defaults.get("foreach") else "default")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps, args.lr_warmup,
                                                             args.min_lr_ratio))
    noise_gen = torch.Generator(device=d.device)
    noise_gen.manual_seed(args.seed * 1000 + d.rank)
    noise = SampleNoise(args.seed, cfg.max_action_dim) if args.noise == "per-sample" else None
    if noise is not None:
        status["noise"] = "per sample: (seed, epoch, sample index), loongforge.sample_rng"
    clock.mark("sync, checkpointer, optimizer")
    start_step = resume(args, ckpt, model, opt, sched, loader, noise_gen, log, ep)
    if args.start_batch:
        if args.start_batch >= len(loader):
            raise TrainError(f"--start-batch {args.start_batch}: an epoch has {len(loader)} "
                             "batches")
        loader.load_state_dict(dict(loader.state_dict(), next_batch=args.start_batch))
        status["start_batch"] = f"{args.start_batch} of {len(loader)} (epoch 0)"
    clock.mark("resume")

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

    # The step runner: static batches (token buckets) and per-microbatch CUDA graphs.
    stepper: Any = None
    if graphs or buckets:
        stepper = GraphedStep(model, d.device, runner=runner, token_buckets=buckets,
                              warmup=args.graph_warmup, graphs=graphs, sync=sync,
                              autocast_dtype=torch.bfloat16 if cuda else None,
                              max_graphs=args.graph_max, log=log,
                              mem_pool=(mem.graph_pool(args.graph_pool, expandable.startswith("on"))
                                        if graphs else None),
                              # compiled per shape: a new bucket's eager calls compile it
                              warmup_next=args.graph_warmup if compiled else 0,
                              grads_in_pool=pool_grads, pad_up=args.graph_pad_up)
        status["memsculptor"] = mem.status
        status["cuda_graph"] = (("per_microbatch" + (", gradients in the graph pool"
                                                     if stepper.grads_in_pool else ""))
                                if stepper.graphs_on else f"off ({stepper.disabled_reason})")
        status["static_batches"] = f"token buckets {list(buckets)}" if buckets else "off"
        stepper.noise_fn = noise
    want_sync_free = args.sync_free == "on" or (args.sync_free == "auto" and strong)
    sync_free = want_sync_free and cuda
    if args.sync_free == "on" and not cuda:
        status["sync_free"] = "off: needs CUDA (on the CPU every step is synchronous)"
    elif sync_free:
        status["sync_free"] = "on (figures read back 2 steps late)"
    readback = Readback(d.device, lag=2 if sync_free else 0,
                        flops_poly=FlopsPerShape(cfg, len(schema["cameras"]),
                                                 int(schema["action_horizon"])).length_polynomial())
    guard = TokenGuard(cfg.vocab_size, cfg.max_text_tokens, args.data, log, deferred=cuda)
    profiler = (ModuleProfiler(start_step + args.warmup, args.profile_modules, d.device, sync_dev)
                if args.profile_modules else None)
    if profiler is not None and args.cuda_graph == "auto" and auto_lean:
        status["cuda_graph"] = "off (--profile-modules: eager steps)"
    clock.mark("step runner")
    return Session(args, d, cfg, schema, status, mem, model, runner, loader, sync, ckpt, params,
                   opt, sched, noise_gen, noise, start_step, counter, sync_dev, autocast, trace,
                   stepper,
                   sync_free, readback, guard, profiler,
                   StopSignal(d, readback.lag, args.mode), clock.phases)


def _compile_blocks_wanted(args: argparse.Namespace, lf: bool, device: torch.device,
                           static: bool, moe: bool = False) -> Tuple[bool, str]:
    """(whether to compile the blocks, why not). --compile-blocks: on; or auto in loongforge
    mode on CUDA with torch >= 2.5 (where one compilation serves every layer of a kind, Note
    [Compiled blocks]), static shapes (token buckets or --token-pad: otherwise every text length
    would compile anew), a dense model and no other compile flag."""
    if args.compile_blocks != "auto":
        on = args.compile_blocks == "on"
        return on, "" if on else "--compile-blocks off"
    if not lf:
        return False, "auto is on in loongforge mode only"
    if device.type != "cuda":
        return False, "needs CUDA"
    if args.compile or args.compile_frozen:
        return False, "--compile or --compile-frozen compiles instead"
    if not static:
        return False, ("text lengths vary (no token buckets, no --token-pad): each would "
                       "compile anew")
    if getattr(args, "act_ckpt", "off") != "off":
        # checkpointed compiled blocks have not run on a GPU yet: on forces them
        return False, "with --act-ckpt only when asked (--compile-blocks on)"
    if moe:
        # a MoE model's dense blocks compiled around its eager (graphed) MoE layers have not run
        # on a GPU yet: on forces them
        return False, "for MoE models only when asked (--compile-blocks on)"
    try:
        major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    except ValueError:
        return False, f"cannot read torch's version {torch.__version__!r}"
    if (major, minor) < (2, 5):
        return False, f"needs torch >= 2.5 (this is {torch.__version__})"
    return True, ""


def resume(args: argparse.Namespace, ckpt: Checkpointer, model: Gr00tPolicy,
           opt: torch.optim.Optimizer, sched: Any, loader: Any, noise_gen: torch.Generator,
           log: Callable[[str], None], ep: Any = None) -> int:
    """--resume: restores the latest checkpoint and returns its step (0 without --resume, or
    when the directory holds none yet), and says which."""
    if not args.resume:
        return 0
    st = ckpt.latest()
    if st is None:
        log(f"[{args.mode}] --resume: no checkpoint in {args.ckpt_dir} yet; starting at step 1")
        return 0
    step = int(st["step"])
    if step > args.steps:
        raise TrainError(f"--resume: the latest checkpoint in {args.ckpt_dir} is step {step}, "
                         f"past --steps {args.steps} (a larger --steps continues that run)")
    if step == args.steps:
        log(f"[{args.mode}] --resume: the latest checkpoint in {args.ckpt_dir} is step {step}, "
            f"--steps {args.steps}: nothing left to train (a larger --steps continues)")
    try:
        model.load_state_dict(st["model"])
        before = {p: dict(s) for p, s in opt.state.items()}
        opt.load_state_dict(st["optimizer"])
        from .memory import state_back_into_place

        state_back_into_place(opt, before)  # Note [The persistent arena]
        sched.load_state_dict(st["scheduler"])
        loader.load_state_dict(st["loader"])
        if ep is not None:
            from .moe import load_expert_shard

            load_expert_shard(model, opt, ep, st.get("experts"))
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainError(f"--resume: checkpoint step {step} in {args.ckpt_dir} does not fit this "
                         f"run: {first}") from e
    set_rng_state(st["rng"], noise_gen)
    log(f"[{args.mode}] resumed from step {step} of {args.ckpt_dir}")
    apply_changed_flags(args, st.get("flags"), step, opt, sched, log)
    return step


# Note [Flags on --resume]. The flags that shape the saved state (mode, config, --set,
# --image-size, --batch-size, world size, --seed) are in the directory's run.json: a resume that
# differs is refused before it reads anything (Checkpointer, Note [Checkpoint directory
# identity]). The others are the new run's to choose; each checkpoint records them ("flags"),
# and a resume applies and logs every one that changed. The optimizer's and the scheduler's
# state carry the old learning rate and weight decay, so those are written back from the flags
# (the schedule is recomputed at the resumed step when --lr, --lr-warmup, --min-lr-ratio or
# --steps changed).
RESUME_FLAGS = ("steps", "lr", "lr_warmup", "min_lr_ratio", "weight_decay", "clip", "grad_accum",
                "max_nonfinite_steps", "crop_fraction", "augment", "token_pad")
_SCHEDULE_FLAGS = ("steps", "lr", "lr_warmup", "min_lr_ratio")


def saved_flags(args: argparse.Namespace) -> Dict[str, Any]:
    return {k: getattr(args, k) for k in RESUME_FLAGS}


def apply_changed_flags(args: argparse.Namespace, old: Any, step: int,
                        opt: torch.optim.Optimizer, sched: Any,
                        log: Callable[[str], None]) -> List[str]:
    """Writes the flags that changed since the checkpoint into the restored optimizer and
    scheduler, logs each, and returns their names (Note [Flags on --resume])."""
    if not isinstance(old, dict):  # a checkpoint from before flags were recorded
        return []
    changed = [k for k in RESUME_FLAGS if k in old and old[k] != getattr(args, k)]
    for k in changed:
        log(f"[{args.mode}] --resume: --{k.replace('_', '-')} {getattr(args, k)} (the checkpoint's "
            f"run had {old[k]}): applied from step {step + 1}")
    if "weight_decay" in changed:
        for g in opt.param_groups:
            g["weight_decay"] = args.weight_decay
    if any(k in changed for k in _SCHEDULE_FLAGS):
        factor = lr_lambda(args.steps, args.lr_warmup, args.min_lr_ratio)(sched.last_epoch)
        sched.base_lrs = [args.lr for _ in opt.param_groups]
        for g in opt.param_groups:
            g["initial_lr"] = args.lr
            g["lr"] = args.lr * factor
        sched._last_lr = [g["lr"] for g in opt.param_groups]
    return changed


def expert_state(ep: Any, model: Gr00tPolicy, opt: torch.optim.Optimizer) -> Dict[str, Any]:
    """The per-rank "experts" entry of a checkpoint under expert parallelism, else nothing."""
    if ep is None:
        return {}
    from .moe import expert_shard

    return {"experts": expert_shard(model, opt, ep)}


def params_finite(params: List[torch.nn.Parameter], d: Dist) -> bool:
    """Whether every parameter is finite on every rank (one host sync: at checkpoints only)."""
    ok = torch.stack([torch.isfinite(p.detach()).all() for p in params]).all().to(torch.int32)
    if d.world > 1 and dist.is_initialized():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok)


class StopSignal:
    """SIGTERM, SIGUSR1 and a first SIGINT: stop at the next step boundary, checkpoint there when
    there is a --ckpt-dir, wait for that checkpoint to commit, and exit 0 (a scheduler's
    preemption notice, or Ctrl-C). A second SIGINT exits at once (130), saving nothing.

    Note [Stopping on a signal]. The handler only records the signal; the loop polls at each
    step boundary. With several ranks, every rank must stop after the same step (the next save
    and the collectives of the next step need them all), and a signal may reach one rank only:
    each poll all-reduces the ranks' flags (MAX). With --sync-free steps the reduced flag is
    read back ``lag`` polls later through pinned memory, like the step's figures (Readback), so
    that the host does not wait for the step it just queued; every rank reads the same poll's
    result at the same step, so they still agree. Handlers go in only in the main thread (Python
    allows no other) and the previous ones come back when the run ends."""

    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

    def __init__(self, d: Dist, lag: int, mode: str) -> None:
        self.d, self.lag, self.mode = d, lag, mode
        self.name: Optional[str] = None  # the first signal received
        self.step: Optional[int] = None  # the step the run stopped after
        self._old: Dict[int, Any] = {}
        self._pending: "deque[Any]" = deque()
        self.saved: List[int] = []  # the steps whose checkpoint was not skipped
        self._timer: Optional[threading.Timer] = None
        try:
            self.grace_s = knobs.get("LOONGFORGE_SIGNAL_GRACE_S")
        except ValueError as e:
            raise TrainError(f"{e} (a positive number of seconds)") from None
        if not self.grace_s > 0:
            raise TrainError(f"LOONGFORGE_SIGNAL_GRACE_S must be a positive number of seconds, "
                             f"got {self.grace_s:g}")

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.SIGNALS:
            num = getattr(signal, name)
            self._old[num] = signal.signal(num, self._on_signal)

    def restore(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for num, old in self._old.items():
            signal.signal(num, old)
        self._old = {}

    def _on_signal(self, num: int, _frame: Any) -> None:
        name = signal.Signals(num).name
        if self.name is not None and num == signal.SIGINT:
            os.write(2, f"[{self.mode}] second SIGINT: exiting now, nothing more saved\n".encode())
            self._exit(130)
        if self.name is None:
            self.name = name
            if self.d.is_main:
                os.write(2, f"[{self.mode}] signal {name}: stopping at the next step boundary "
                            "(SIGINT again: exit now)\n".encode())
            # A run stuck before its next step boundary (a loader that yields nothing, a hung
            # collective) must still end: after the grace period it exits as the signal would.
            self._timer = threading.Timer(self.grace_s, self._expire, (num, name))
            self._timer.daemon = True
            self._timer.start()

    def reached(self, step: int) -> None:
        """The run stops after `step`: the boundary is reached, the grace period no longer runs
        (writing the checkpoint may take longer than it)."""
        self.step = step
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self, num: int, name: str) -> None:
        os.write(2, f"[{self.mode}] signal {name}: no step boundary within {self.grace_s:g} s "
                    "(LOONGFORGE_SIGNAL_GRACE_S): exiting without a checkpoint\n".encode())
        self._exit(128 + num)

    @staticmethod
    def _exit(code: int) -> None:
        """Exits now. The DataLoader's worker processes go first: left behind, they would print
        their own tracebacks when the connection to this process breaks."""
        import multiprocessing

        for child in multiprocessing.active_children():
            with contextlib.suppress(Exception):
                child.kill()
        os._exit(code)

    def poll(self) -> bool:
        """At a step boundary: whether the run stops after this step (the same on every rank)."""
        local = self.name is not None
        if self.d.world == 1 or not dist.is_initialized():
            return local
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=self.d.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if self.lag == 0 or self.d.device.type != "cuda":
            return bool(flag.item())
        host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._pending.append((host, ev))
        if len(self._pending) <= self.lag:
            return False
        host, ev = self._pending.popleft()
        ev.synchronize()  # recorded `lag` steps ago: long complete
        return bool(host.item())

    def message(self, ckpt: Checkpointer) -> str:
        name = self.name or "on another rank"
        if not ckpt.dir:
            return f"[{self.mode}] signal {name}: no --ckpt-dir: nothing saved, exiting"
        if self.step in ckpt.skipped or self.step not in self.saved:
            return (f"[{self.mode}] signal {name}: step {self.step} not saved (see above), "
                    "exiting")
        return f"[{self.mode}] signal {name}: saved step {self.step}, exiting"


def train_loop(s: Session) -> "tuple[List[Dict[str, Any]], List[Dict[str, Any]], float]":
    """Runs steps start_step .. end; returns the timed rows (after --warmup), every step's
    losses and the wall time."""
    args, d, cfg = s.args, s.d, s.cfg
    loader, sync, ckpt, mem, opt, sched = s.loader, s.sync, s.ckpt, s.mem, s.opt, s.sched
    trace, readback, counter, stepper, guard = s.trace, s.readback, s.counter, s.stepper, s.guard
    model, runner, noise_gen, autocast, start_step = (s.model, s.runner, s.noise_gen, s.autocast,
                                                      s.start_step)
    log = _log(d)
    jsonl = open(args.metrics_jsonl, "w") if args.metrics_jsonl and d.is_main else None
    img_tokens = len(s.schema["cameras"]) * cfg.tokens_per_image
    horizon = int(s.schema["action_horizon"])
    shape_flops = FlopsPerShape(cfg, len(s.schema["cameras"]), horizon)  # counted once per shape

    def batches() -> Iterator[Dict[str, torch.Tensor]]:
        epoch = loader.state_dict()["epoch"]
        while True:
            loader.set_epoch(epoch)
            batches_seen, samples = 0, 0
            for b in loader:
                batches_seen += 1
                # Every sample of the batch was skipped as corrupt (DataFusion's skip policy,
                # batch size 1 or a bad stretch): nothing to train on, the next batch follows.
                if b["tokens"].shape[0] > 0:
                    samples += int(b["tokens"].shape[0])
                    if s.noise is not None:
                        s.noise.epoch = epoch
                    yield b
            if batches_seen and not samples:  # it would loop over empty epochs for ever
                raise TrainError(f"--data {args.data}: epoch {epoch}: every sample was skipped "
                                 f"as corrupt ({batches_seen} batches, none left to train on; "
                                 "the loader's warnings above name them)")
            epoch += 1

    it = batches()
    # LOONGFORGE_MEM_TRACE=PATH keeps the recorded steps' trace (for `loongforge mem replay`),
    # LOONGFORGE_MEM_RECORD_STEPS=N records N steps instead of min(3, warm-up) (diagnosis).
    try:
        rec_steps = knobs.get("LOONGFORGE_MEM_RECORD_STEPS")  # 0: the default below
    except ValueError as e:
        raise TrainError(str(e)) from None
    mem.record(steps=rec_steps or max(1, min(3, args.warmup)),
               trace_path=knobs.get("LOONGFORGE_MEM_TRACE") or None)
    rows: List[Dict[str, Any]] = []
    losses: List[Dict[str, Any]] = []
    t_run = time.perf_counter()
    end_step = min(args.steps, args.stop_after) if args.stop_after else args.steps
    prof = s.profiler
    # Profiled steps (--profile-modules) come right after --warmup and leave the timed figures.
    timed_from = args.warmup + (args.profile_modules if prof is not None else 0)

    nonfinite: List[int] = []  # the steps of the current run of skipped (non-finite) steps

    def finish_row(r: Dict[str, Any]) -> None:
        guard.check_row(r)
        step = r["step"] - 1
        if r.get("skipped_nonfinite"):
            nonfinite.append(r["step"])
        else:
            nonfinite.clear()
        losses.append({k: r[k] for k in ("step", "loss", "fm_loss", "aux_loss", "grad_norm",
                                         "skipped_nonfinite", "step_s") if k in r})
        if step - start_step >= timed_from:
            rows.append(r)
        if jsonl:
            jsonl.write(json.dumps(r) + "\n")
            jsonl.flush()
        if d.is_main and not args.quiet and (step + 1) % args.log_every == 0:
            st = r["step_s"]
            print(f"[{args.mode}] step {step + 1}/{args.steps} loss {r['loss']:.4f} "
                  f"lr {r['lr']:.2e} step {st * 1e3:.0f} ms "
                  f"wait {r['data_wait_s'] / st * 100:.0f}% "
                  f"tok/s {r['tokens'] / st:.0f} samples/s {r['samples'] / st:.1f}"
                  + (" (skipped: loss or gradient not finite)" if nonfinite else ""),
                  file=sys.stderr, flush=True)
        if len(nonfinite) >= args.max_nonfinite_steps:
            raise NonFiniteError(
                f"step {r['step']}: loss {r['loss']:.4g}, gradient norm {r['grad_norm']:.4g}: "
                f"{len(nonfinite)} steps in a row without a finite loss and gradient (steps "
                f"{nonfinite[0]}..{nonfinite[-1]} skipped, no update; --max-nonfinite-steps "
                f"{args.max_nonfinite_steps}); the weights are those of step {nonfinite[0] - 1}"
                + ((f", the newest checkpoint of this run is step {s.stop.saved[-1]}"
                    if s.stop.saved else ", this run took no checkpoint") if ckpt.dir else "")
                + " (a smaller --lr, or --clip)")

    moe = bool(cfg.moe_experts)
    no_range = contextlib.nullcontext()
    stop = s.stop
    saved = stop.saved

    def save(n: int) -> float:
        """Checkpoints step n unless its weights are not finite (Note [Non-finite steps]: a
        skipped step leaves the last finite weights, which are saved; an update that overflowed
        them is not). The state is built only when the save happens, timed in the stall."""
        if not params_finite(s.params, d):
            log(f"[{args.mode}] step {n}: checkpoint not taken: the weights are not finite; "
                "the newest committed checkpoint stays the latest")
            return 0.0
        skipped = len(ckpt.skipped)
        stall = ckpt.save(n, lambda: {
            "step": n, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "loader": loader.state_dict(), "rng": rng_state(noise_gen),
            "config": args.config, "flags": saved_flags(args),
            **expert_state(sync.ep, model, opt)},
            model=model, optimizer=opt)
        if len(ckpt.skipped) == skipped:
            saved.append(n)
        return stall
    stop.install()
    try:
        for step in range(start_step, end_step):
            trace.step = step
            _WHERE[0] = (f"step {step + 1}" + ("" if stepper is None or not stepper.graphs_on else
                                               f", {stepper.captures} bucket graphs captured"))
            part = prof.range if prof is not None and prof.active(step) else (lambda _n: no_range)
            if prof is not None:
                prof.begin_step(step)
            wait = 0.0
            stage, stage_wait = None, -1.0  # the loader stage behind the longest wait
            samples = 0
            known_tokens = 0
            flops = 0.0
            with counter.window() if step - start_step >= timed_from else contextlib.nullcontext():
                acc = readback.begin()  # device: [loss, fm_loss, aux_loss, text tokens, grad norm]
                sync.zero_grad(opt, keep=stepper is not None and stepper.keeps_grads)
                for micro in range(args.grad_accum):
                    t0 = time.perf_counter()
                    with trace.span("data_wait"), part("data"):
                        batch = next(it)
                        dt = time.perf_counter() - t0
                        wait += dt
                        if dt > stage_wait:
                            stage, stage_wait = getattr(batch, "held_by", None), dt
                        batch = guard(batch)
                    b = int(batch["tokens"].shape[0])
                    samples += b
                    known_tokens += b * img_tokens + b * (1 + horizon)
                    last = micro == args.grad_accum - 1
                    sig = f"L{int(batch['tokens'].shape[1])}xB{b}"
                    flops += shape_flops(b, int(batch["tokens"].shape[1])).total
                    sync.set_micro_step(is_last=last)
                    with (contextlib.nullcontext() if last else sync.no_sync()), mem.step(sig):
                        if stepper is not None:
                            with trace.span("forward_backward"):
                                out = stepper(batch, noise_gen, 1.0 / args.grad_accum)
                        else:
                            with trace.span("forward"), autocast():
                                if s.noise is not None:
                                    nz, tu = s.noise(batch)
                                    out = runner(batch, noise=nz, time_u=tu)
                                elif args.compile:
                                    # Drawn outside the compiled model (a generator argument
                                    # breaks its graph), the same stream as eager steps draw.
                                    act = batch["action"]
                                    nz, tu = model.draw_noise(int(act.shape[0]), int(act.shape[1]),
                                                              act.device, noise_gen)
                                    out = runner(batch, noise=nz, time_u=tu)
                                else:
                                    out = runner(batch, generator=noise_gen)
                                loss = out["loss"] / args.grad_accum
                            with trace.span("backward"), part("backward"):
                                loss.backward()
                            del loss
                    readback.add_micro(acc, out, batch["attention_mask"], args.grad_accum, moe)
                    del batch, out
                with trace.span("comm"):
                    sync.finish()
                    sync.average_losses(acc)
                feed = step == start_step + args.warmup or (step + 1) % 100 == 0
                if feed:
                    sync.feed_expert_load(model)  # collective: every rank at the same step
                # Per-expert load in the metrics: each step unless figures are read back late.
                moe_row = moe_metrics(model) if moe and (feed or not s.sync_free) else {}
                with trace.span("optimizer"), part("optimizer"):
                    optimizer_step(opt, s.params, args.clip, acc, sync)
                    sched.step()
                stall = 0.0
                if args.ckpt_every and step == start_step:
                    ckpt.prepare({"model": model.state_dict(), "optimizer": opt.state_dict()})
                if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                    with trace.span("checkpoint"):
                        stall = save(step + 1)
                if not s.sync_free:
                    s.sync_dev()
                if prof is not None:  # before the step's end mark: profiler shutdown in this step
                    prof.end_step(step)
                readback.end(acc, {
                    "step": step + 1, "lr": sched.get_last_lr()[0], "data_wait_s": wait,
                    **({"data_stage": stage} if stage else {}),
                    "comm_exposed_s": sync.exposed_s, "ckpt_stall_s": stall, "samples": samples,
                    "tokens": known_tokens, "flops": flops, **moe_row, **ckpt.row_fields()},
                    clip=True,  # the norm is computed also with --clip 0 (Note [Non-finite steps])
                    moe=moe,
                    flag=guard.flag)
                for r in readback.ready():
                    finish_row(r)
                if stop.poll():
                    stop.reached(step + 1)
                    break
        for r in readback.drain():
            finish_row(r)
        if stop.step is not None and ckpt.dir and stop.step not in saved:
            ckpt.when_busy = "wait"  # this save is the one the signal asked for
            save(stop.step)
    finally:
        if prof is not None:
            prof.finish()  # a run that ended inside the window: ranges off, profiler stopped
        it.close()  # stops the loader's pipeline (DataFusion threads, DataLoader workers) now
        if jsonl:
            jsonl.close()
    return rows, losses, time.perf_counter() - t_run


def _memory_history(path: str, device: Optional[torch.device]) -> None:
    """--memory-history: starts recording (``device``: in build(), once the allocator is set up
    and before the model is placed), or (None) dumps the snapshot and stops."""
    if not path:
        return
    if device is None:
        try:
            torch.cuda.memory._dump_snapshot(path)
        except OSError as e:  # the run's summary still follows
            print(f"loongforge.train: --memory-history: cannot write {path}: {e}",
                  file=sys.stderr)
        torch.cuda.memory._record_memory_history(enabled=None)
        return
    if device.type != "cuda":
        raise TrainError("--memory-history records GPU allocations: it needs a CUDA device")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise TrainError(f"--memory-history {path}: directory {parent} does not exist or is not "
                         "writable")
    try:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    except (RuntimeError, TypeError) as e:  # a global pluggable allocator; an older torch
        raise TrainError(f"--memory-history: torch cannot record this allocator's history: "
                         f"{str(e).splitlines()[0]}") from e


def _cudagraph_skips() -> str:
    """How often inductor ran a compiled graph without its CUDA graph (reduce-overhead), and
    why, from torch's own counters."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return "cudagraph skips unknown (no torch._dynamo counters)"
    n = int(counters["inductor"].get("cudagraph_skips", 0))
    return f"cudagraph skips {n}"


def run(args: argparse.Namespace) -> Dict[str, Any]:
    s = build(args)
    try:
        try:
            rows, losses, total_s = train_loop(s)
        except RuntimeError as e:  # the snapshot of an out-of-memory is the one most wanted
            if "out of memory" in str(e).lower():
                _memory_history(args.memory_history, None)
            if isinstance(e, TrainError):
                # The saves already queued hold finite weights of completed steps: let them
                # commit (a failure here is secondary to the one being reported).
                with contextlib.suppress(Exception):
                    s.ckpt.close()
            raise
        _memory_history(args.memory_history, None)
        if args.trace and s.d.is_main:
            s.trace.write(args.trace)
        s.ckpt.close()  # waits for the writer: a save a signal asked for is committed here
        if s.stop.step is not None:
            _log(s.d)(s.stop.message(s.ckpt))
        if args.compile and args.compile_mode == "reduce-overhead":
            s.status["compile"] += f"; {_cudagraph_skips()}"
        summary = summarize(args, s.d, rows, losses, s.status, s.model, s.loader, s.ckpt,
                            total_s)
        add_module_figures(summary, s.ckpt, s.sync, s.stepper, s.counter, s.mem)
        if s.profiler is not None and s.profiler.result is not None:
            summary["module_breakdown"] = s.profiler.result
        summary["figures"]["startup_s"] = sum(s.startup.values())
        summary["figures"]["startup_phases_s"] = dict(s.startup)
        if s.d.is_main and args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=2)
    finally:
        s.stop.restore()
        s.release()
    # Note [Trainer teardown]. MemSculptor closes after the run's tensors are gone (docs/memory.md,
    # "Shutdown"); whatever it still counts then is reported as a leak. The session is the only
    # owner of the model, the optimizer, the loader, the checkpointer and the step runner, and
    # nothing the summary holds refers to them; once release() has broken NexusSync's hook cycle,
    # dropping the session frees every one of their tensors by reference counting (no garbage
    # collection needed, none relied on: a cycle through autograd's C++ state may be invisible
    # to the collector). tests/python/test_train_teardown.py checks this at the point of close().
    mem = s.mem
    del s
    mem.close()
    if _EXPANDABLE_BY_RUN[0]:  # the setting is the process's: a later run in it starts as before
        _EXPANDABLE_BY_RUN[0] = False
        _allocator_settings("expandable_segments:False")
    return summary


# Where the run is, for the out-of-memory line (bench/memory/max_batch.py keeps it per probe).
_WHERE = ["start-up"]


# Exceptions that are the input's or the environment's fault, not the trainer's: the core's
# Status errors (ValueError: InvalidArgument, FileNotFoundError: NotFound, PermissionError,
# DataLossError, ResourceExhaustedError, TimeoutError: DeadlineExceeded) and the OS's.
_REFUSALS = (TrainError, ValueError, OSError, MemoryError)


def _core_status(e: BaseException) -> bool:
    """A RuntimeError raised by the core for a Status (its text starts with the code's name)."""
    head = str(e).split(":", 1)[0]
    return head in ("Unavailable", "DataLoss", "FailedPrecondition", "Aborted", "Internal",
                    "Unknown", "Cancelled", "Unimplemented")


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    head = first.split(":", 1)[0]
    if isinstance(e, TrainError) or (":" in first and head.isalpha() and head[:1].isupper()):
        return first  # ours, or a Status: "InvalidArgument: ..."
    return f"{type(e).__name__}: {first}"


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: 0 when the run finished (or stopped on a signal, its checkpoint
    saved), 2 when it was refused (a bad flag or input, a directory it may not use), 1 when it
    stopped on non-finite steps, 3 out of memory, 130 on a second SIGINT. Each error is one line
    ``loongforge train: error: ...``; LOONGFORGE_DEBUG=1 shows the traceback as well."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, its line already printed)
        return int(e.code or 0)
    try:
        debug = knobs.get("LOONGFORGE_DEBUG")
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    _WHERE[0] = "start-up"
    try:
        summary = run(args)
    except NonFiniteError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        if debug:
            raise
        return 1
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if "out of memory" in str(e).lower() and not isinstance(e, TrainError):
            first = str(e).strip().splitlines()[0]
            print(f"{PROG}: error: out of memory at --batch-size {args.batch_size} "
                  f"({_WHERE[0]}): {first} "
                  "(a smaller --batch-size, --act-ckpt dit, or more memory)", file=sys.stderr)
            if debug:
                raise
            return 3
        if not (isinstance(e, TrainError) or _core_status(e)):
            raise
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        if debug:
            raise
        return 2
    except _REFUSALS as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        if debug:
            raise
        return 2
    except KeyboardInterrupt:  # SIGINT before the first step: the handlers are not in yet
        print(f"{PROG}: interrupted during {_WHERE[0]}, nothing saved", file=sys.stderr)
        if debug:
            raise
        return 130
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_summary(summary))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
