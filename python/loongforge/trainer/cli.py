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

This module is the command line: the flags (``build_parser``), the checks that refuse what no
run can do (``check_args``) and ``main``, which maps each failure to its exit status. The run
itself is ``loop.run``: ``session.build`` puts the parts together, ``loop.train_loop`` runs the
steps.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable, List, NoReturn, Optional

import torch.distributed as dist

from .. import knobs
from ..train_metrics import format_summary
from .checkpoint import Checkpointer
from .errors import NonFiniteError, TrainError
from .plan import MODULES


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
    p.add_argument("--action-horizon", type=_int(1, 4096), default=None, metavar="H",
                   help="action chunk length chosen at load time (loongforge mode, a DB packed "
                   "from LeRobot): the loader gathers H steps from the stored per-frame rows; "
                   "default: the chunk the DB was packed with")
    p.add_argument("--tokenizer", default=None, metavar="SPEC",
                   help="tokenize the task text at load time (loongforge mode, a DB packed from "
                   "LeRobot): a built-in tokenizer's name (byte-v1) or a Hugging Face "
                   "tokenizer.json (needs the tokenizers package); the model's vocab_size "
                   "becomes the tokenizer's; default: the ids packed with the DB")
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
                        "(later buckets are captured at once, except when the blocks are "
                        "compiled per shape, --compile-blocks (auto: on in loongforge mode on "
                        "CUDA) or --compile-frozen: then a new bucket first runs this many eager "
                        "microbatches, which compile it)")
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
                   "token bucket, cached on disk (Note [Compiled blocks] in trainer/compile.py; "
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
    if (args.action_horizon is not None or args.tokenizer is not None) and \
            args.mode != "loongforge":
        raise TrainError("--action-horizon and --tokenizer are chosen at load time by DataFusion "
                         f"(--mode loongforge); the {args.mode} loader reads the packed chunks and "
                         "ids (repack with loongforge pack --horizon / --tokenizer)")
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
    from . import loop  # here: loop.py imports session.py, which imports check_args from here

    progress = loop.Progress()
    try:
        summary = loop.run(args, progress)
    except NonFiniteError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        if debug:
            raise
        return 1
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if "out of memory" in str(e).lower() and not isinstance(e, TrainError):
            first = str(e).strip().splitlines()[0]
            print(f"{PROG}: error: out of memory at --batch-size {args.batch_size} "
                  f"({progress.where}): {first} "
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
        print(f"{PROG}: interrupted during {progress.where}, nothing saved", file=sys.stderr)
        if debug:
            raise
        return 130
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_summary(summary))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
