"""The trainer's backends: distributed set-up, the input pipeline, gradient sync, checkpoints,
the memory planner and the optimizer, for the baseline, tuned and loongforge modes.

Each adapter hides which implementation runs (torch or the LoongForge module) behind one small
interface, so that ``train.run`` reads the same in every mode; a LoongForge module that is
selected but missing from the build raises a TrainError naming the switch that turns it off.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from .models.gr00t import Gr00tConfig, Gr00tPolicy, get_config

MODULES = ("datafusion", "nexussync", "vault", "memsculptor")


class TrainError(RuntimeError):
    """A configuration or environment problem reported to the user in one line."""


class NonFiniteError(TrainError):
    """The run stopped: --max-nonfinite-steps steps in a row had a non-finite loss or gradient
    (Note [Non-finite steps])."""


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


def grad_norm(params: List[torch.nn.Parameter]) -> torch.Tensor:
    """The global L2 norm of the gradients (what clip_grad_norm_ returns), without touching
    them: --clip 0 still needs it to tell a finite step from a non-finite one."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    foreach = getattr(torch, "_foreach_norm", None)
    norms = foreach(grads) if foreach is not None else [torch.linalg.vector_norm(g) for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def optimizer_step(opt: torch.optim.Optimizer, params: List[torch.nn.Parameter], clip: float,
                   acc: torch.Tensor, sync: Optional["SyncBackend"] = None) -> None:
    """Clip (grad norm into acc[4]) and step, unless the step's loss (acc[0]) or gradient norm
    is not finite: then no parameter or optimizer state changes, and acc[5] is 1.

    Note [Non-finite steps]. One step of NaN or inf (an overflow, a bad batch, a far too large
    --lr) must not turn every parameter into NaN and then into the next checkpoint. The norm is
    computed also with --clip 0 (one pass over the gradients). A fused AdamW skips such a step
    on the device, without a host sync (the mechanism torch's GradScaler uses: ``found_inf``,
    a 0-dim tensor it also subtracts from its step counters); other optimizers are skipped on
    the host, which reads the flag (one sync: those runs synchronize every step anyway). The
    trainer counts the skipped steps and stops after --max-nonfinite-steps in a row. Loss and
    norm are the same on every rank (averaged, and computed from reduced gradients), so every
    rank skips the same steps."""
    fused = bool(opt.defaults.get("fused"))
    if sync is not None and sync.ep is not None:  # experts split across ranks: global norm
        from .moe import clip_grad_norm_

        gn = clip_grad_norm_(sync.ep, params, sync.expert_params, clip or float("inf"))
    elif clip:
        gn = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        gn = grad_norm(params)
    gn = gn.to(acc.device)
    acc[4] = gn
    bad = (~(torch.isfinite(gn) & torch.isfinite(acc[0]))).to(torch.float32)
    acc[5] = bad
    if fused:
        opt.found_inf = bad  # type: ignore[attr-defined]  # read by the fused kernel
        opt.step()
    elif not bool(bad):
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


# Note [Compiled blocks]. The graphed step is GPU-bound, and its GEMMs already run at 55-64% of
# the bf16 peak (an eager profile of n16 on an H200): what keeps MFU low is everything between them,
# the norms, GELU and SwiGLU, residual adds, AdaLN modulation, RoPE and the casts that bf16 autocast
# puts around every matmul (57-67% of the kernel time). torch.compile fuses those into a few Triton
# kernels per block, forward and backward, and the kernels are captured in the step's CUDA graph
# like any other. It compiles each *block*, not the model: every transformer layer of one kind
# runs the same code, so one compilation serves all of them (torch >= 2.5 lifts a module's
# parameters to graph inputs instead of specializing on them), and a cold start compiles a
# handful of small graphs (a SigLIP layer, a frozen Qwen layer, a trainable one twice: the first
# reads an input that needs no gradient, the others one that does; a cross- and a self-attention
# DiT block, a VL self-attention block, the mlp1 projector: 8) instead of one graph of
# the whole model, whose compilation did not end within 250 s on an H200. Shapes are static
# (dynamic=False): a graph per token bucket, compiled in that bucket's eager warm-up steps before
# its capture (the trainer gives later buckets warm-up steps too). The compilations go to
# inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER), so a
# restart on the same machine reuses them. Numerics: bf16 autocast's, with the fused kernels
# computing in fp32 between the casts eager would round at (inductor's usual rule). MoE blocks
# are left eager (their routing calls LoongForge's own operators).
COMPILE_RECOMPILE_LIMIT = 64  # graphs per block kind: kinds x token buckets, with room


def compile_blocks(model: Gr00tPolicy, backend: Any = "inductor") -> str:
    """torch.compile every dense transformer block of the policy in place, per block (Note
    [Compiled blocks]): their ``forward`` methods, so parameter names and state_dict keys stay
    as they are. ``backend``: torch.compile's (tests count compilations through a wrapper).
    Returns the status line. RuntimeError without torch.compile."""
    if not hasattr(torch, "compile"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.compile (needs torch >= 2)")
    import torch._dynamo as dynamo

    from .models.gr00t import (BasicTransformerBlock, MoEFeedForward, QwenDecoderLayer,
                               SiglipEncoderLayer)

    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), COMPILE_RECOMPILE_LIMIT))
    if hasattr(dynamo.config, "inline_inbuilt_nn_modules"):
        dynamo.config.inline_inbuilt_nn_modules = True  # one graph for every layer of a kind
    kinds = {"vision": 0, "language": 0, "action head": 0}
    eager_moe = 0
    for m in model.modules():
        if isinstance(m, SiglipEncoderLayer):
            kind = "vision"
        elif isinstance(m, QwenDecoderLayer):
            kind = "language"
        elif isinstance(m, BasicTransformerBlock):
            if isinstance(m.ff, MoEFeedForward):
                eager_moe += 1
                continue
            kind = "action head"
        else:
            continue
        m.forward = torch.compile(m.forward, dynamic=False,  # type: ignore[method-assign]
                                  backend=backend)
        kinds[kind] += 1
    mlp1 = model.backbone.mlp1
    mlp1.forward = torch.compile(mlp1.forward, dynamic=False,  # type: ignore[method-assign]
                                 backend=backend)
    done = ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
    return (f"on ({done} blocks and the projector; compiled per token bucket in its warm-up"
            + (f"; {eager_moe} MoE blocks eager" if eager_moe else "") + ")")


# ------------------------------------------------------------------------------------------------
# Module adapters (loongforge mode). Each returns (object or None, status line).


def _missing(module: str, flag: str, err: BaseException) -> TrainError:
    return TrainError(f"loongforge mode needs {module}, which is not available in this build "
                      f"({type(err).__name__}: {err}); run with --no-{flag} to switch it off")


def make_loader(args: argparse.Namespace, d: Dist, use_datafusion: bool,
                token_buckets: Sequence[int] = (), max_text_tokens: int = 0) -> Any:
    """The input pipeline. max_text_tokens > 0: the dataset holds longer instructions than the
    model takes, and the loader cuts them to that many tokens as it reads them (token_buckets
    and --token-pad are then at most that long), so its buffers stay bounded."""
    from .augment import loader_flags

    train, jitter = loader_flags(args.augment, args.no_augment)
    common = dict(image_size=args.image_size, crop_fraction=args.crop_fraction,
                  color_jitter=jitter, train=train, seed=args.seed,
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
        token_pad: Any = args.token_pad if args.token_pad else "batch_max"
        if max_text_tokens:
            # DataFusion cuts only to a fixed length: the largest bucket, or a fixed pad.
            gpu["truncate_tokens"] = True
            if not token_buckets and not args.token_pad:
                token_pad = max_text_tokens
        if d.device.type == "cuda":
            # The torch modes' resizes are antialiased (PIL's bilinear, torchvision's
            # antialias=True): the same transform in every mode. DataFusion's CPU loader has no
            # antialias option; the CPU trainer is not a benchmark.
            gpu["antialias"] = True
        return DataFusionLoader(args.data, args.batch_size, threads=args.loader_threads, **gpu,
                                prefetch=args.prefetch, token_pad=token_pad,
                                device=str(d.device), **common)
    from .trainer_data import BaselineLoader

    tuned = args.mode == "tuned"
    return BaselineLoader(args.data, args.batch_size, workers=args.workers,
                          token_pad=args.token_pad or None, device=str(d.device),
                          style="tuned" if tuned else "lerobot",
                          gpu_decode=tuned and args.gpu_decode != "off" and d.device.type == "cuda",
                          max_tokens=max_text_tokens or None, **common)


class TokenGuard:
    """Keeps token ids outside the model's vocabulary, and text longer than it takes, away from
    the model: an id >= vocab_size would index past the embedding table
    (an IndexError, or a device-side assert on CUDA), and unbounded text grows activations
    without bound.

    Text longer than ``max_tokens`` is cut (the loaders already cut what the schema announces;
    this catches records longer than the schema says), with a one-time warning. Ids are checked
    where the batch lives. On the CPU (``deferred=False``) at once: TrainError naming the record.
    On a GPU (``deferred=True``) without a host sync, since the step must not wait: bad ids are
    replaced by 0 (padding) on the device and the first offending sample is recorded in
    ``flag``, which the readback reads with the step's figures and turns into the same
    TrainError (``check_row``) at most two steps later."""

    def __init__(self, vocab_size: int, max_tokens: int, db: str,
                 warn: Callable[[str], None], deferred: bool) -> None:
        self.vocab, self.max_tokens, self.db, self.warn = vocab_size, max_tokens, db, warn
        self.deferred = deferred
        self.warned = False
        self.flag: Optional[torch.Tensor] = None  # device int64: 1 + first bad sample, or 0

    def __call__(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        tokens = batch["tokens"]
        if tokens.shape[1] > self.max_tokens:
            if not self.warned:
                self.warn(f"warning: {self.db}: a batch has {tokens.shape[1]} text tokens, more "
                          f"than the model's {self.max_tokens} (max_text_tokens); text is cut "
                          "to that length (shown once)")
                self.warned = True
            batch = dict(batch, tokens=tokens[:, : self.max_tokens],
                         attention_mask=batch["attention_mask"][:, : self.max_tokens])
            tokens = batch["tokens"]
        bad = (tokens < 0) | (tokens >= self.vocab)
        if not self.deferred:
            if bool(bad.any()):
                row = int(bad.any(1).nonzero()[0])
                self.raise_bad(int(batch["sample_index"][row]), int(tokens[row][bad[row]][0]))
            return batch
        bad_rows = bad.any(1)
        index = batch["sample_index"].to(bad_rows.device, torch.int64, non_blocking=True)
        first = torch.where(bad_rows, index + 1,
                            torch.zeros_like(bad_rows, dtype=torch.int64)).amax()
        self.flag = first if self.flag is None else torch.maximum(self.flag, first)
        return dict(batch, tokens=tokens.masked_fill(bad, 0))

    def check_row(self, row: Dict[str, Any]) -> None:
        """Raises for a readback row whose step saw a bad id (``row['bad_token_sample']``)."""
        sample = row.pop("bad_token_sample", 0)
        if sample > 0:
            self.raise_bad(sample - 1, None)

    def raise_bad(self, sample: int, token: Optional[int]) -> None:
        got = f"token id {token}" if token is not None else "a token id"
        raise TrainError(f"{self.db}: record '{sample:08d}_tokens' (sample {sample}) has {got} "
                         f"outside the model's vocabulary [0, {self.vocab}): the DB does not "
                         "match its schema's tokenizer, or the config's vocab_size is too small")


class SyncBackend:
    """How gradients are reduced across ranks: none (world 1), DDP (baseline / --no-nexussync) or
    NexusSync. ``exposed_s`` is the time the step waited for communication after backward."""

    def __init__(self, model: torch.nn.Module, d: Dist, kind: str, ep: Any = None,
                 topk_ratio: Optional[float] = None, load_threshold: float = 0.5) -> None:
        """ep: loongforge.moe.ExpertParallel when the experts are split across ranks; their
        gradients then stay out of DDP / NexusSync and are reduced over the expert-data-parallel
        group in finish() (Note [Expert gradients] in moe.py). topk_ratio: NexusSync top-k with
        error feedback on the low-load expert group (None: every group dense); an expert is
        low-load when its routed count is under load_threshold x the mean."""
        self.kind, self.d, self.model, self.exposed_s = kind, d, model, 0.0
        self.wrapped: torch.nn.Module = model
        self._nexus: Any = None
        self._closed_stats: Dict[str, Any] = {}  # NexusSync's last figures, after close()
        moe = getattr(model, "cfg", None) is not None and model.cfg.moe_experts > 0
        self.ep = ep if ep is not None and ep.size > 1 else None
        self.expert_params: List[torch.nn.Parameter] = (model.expert_parameters()
                                                        if self.ep is not None else [])
        expert_ids = {id(p) for p in self.expert_params}
        self.expert_bytes = 0  # expert-gradient bytes all-reduced (expert parallelism)
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            if self.ep is not None:
                DDP._set_params_and_buffers_to_ignore_for_model(
                    model, [n for n, p in model.named_parameters() if id(p) in expert_ids])
            self.wrapped = DDP(model, device_ids=[d.device.index] if d.device.type == "cuda"
                               else None, find_unused_parameters=moe)
        elif kind == "nexussync":
            try:
                from .comm import NexusSync
            except ImportError as e:
                raise _missing("NexusSync (loongforge.comm)", "nexussync", e) from e
            # MoE expert weights form their own bucket groups (high/low load by routing counts);
            # with expert parallelism they are not NexusSync's (reduced over their own group).
            self._nexus = NexusSync(
                model, expert_param_filter=r"\.experts\." if moe and self.ep is None else None,
                topk_ratio=topk_ratio, load_threshold=load_threshold,
                param_filter=(lambda n, p: id(p) not in expert_ids) if expert_ids else None)

    def set_micro_step(self, is_last: bool) -> None:
        """Tells NexusSync whether this microbatch's backward ends the step (it reduces then)."""
        if self._nexus is not None:
            self._nexus.set_micro_step(is_last=is_last)

    def capture_no_sync(self) -> Any:
        """The context a CUDA-graph capture of backward runs in (graphs.GraphedStep): NexusSync's
        hooks must not run during capture (Note [Graphs and NexusSync] in docs/trainer.md); DDP
        runs are never captured, and without a sync there is nothing to suspend."""
        return self._nexus.no_sync() if self._nexus is not None else contextlib.nullcontext()

    def no_sync(self) -> Any:
        if self.kind == "ddp":
            return self.wrapped.no_sync()
        if self.kind == "nexussync":
            return self._nexus.no_sync()
        return contextlib.nullcontext()

    def zero_grad(self, opt: torch.optim.Optimizer, keep: bool = False) -> None:
        """keep=True zeroes gradients in place (CUDA graphs read and write them at fixed
        addresses); otherwise they are set to None (no memset)."""
        if self.kind == "nexussync":
            self._nexus.zero_grad()  # grads are views into the flat buckets: zero in place
            for p in self.expert_params:  # not NexusSync's (expert parallelism)
                p.grad = None
        else:
            opt.zero_grad(set_to_none=not keep)

    def feed_expert_load(self, model: Gr00tPolicy) -> None:
        """Per-expert token counts (summed over MoE layers) -> NexusSync's load grouping."""
        if self.kind != "nexussync" or not model.cfg.moe_experts or self.ep is not None:
            return
        counts = torch.zeros(model.cfg.moe_experts, dtype=torch.float64)
        for c in model.expert_token_counts().values():
            counts += c.detach().to("cpu", torch.float64)
        self._nexus.set_expert_load(counts.tolist())

    def stats(self) -> Dict[str, Any]:
        out = (dict(self._nexus.stats()) if self._nexus is not None
               else dict(self._closed_stats))
        if self.ep is not None:
            out["expert_parallel"] = dict(self.ep.describe(), expert_grad_bytes=self.expert_bytes)
        return out

    def finish(self) -> None:
        """Waits for this step's gradient reduction (NexusSync); DDP has finished in backward.
        Expert-parallel expert gradients are reduced here, over their own group."""
        t = time.perf_counter()
        if self.kind == "nexussync":
            self._nexus.finish()
        if self.ep is not None:
            self.expert_bytes += self.ep.reduce_expert_grads(self.expert_params)
        self.exposed_s = time.perf_counter() - t if self.kind == "nexussync" or self.ep else 0.0

    def close(self) -> None:
        """The end of the run: removes NexusSync's autograd hooks and drops the wrapper (DDP or
        NexusSync) with its flat gradient buckets and this backend's reference to the model.
        NexusSync's hooks close a cycle parameter -> hook -> NexusSync -> model -> parameter
        whose hook link lives in autograd's C++ state: the model then outlives the run unless the
        garbage collector finds the cycle (seen as MemSculptor closed with the model's
        parameters live). stats() keeps working; the backend cannot reduce afterwards.
        Idempotent."""
        if self._nexus is not None:
            self._nexus.close()
            self._closed_stats = dict(self._nexus.stats())
            self._nexus = None
        self.wrapped = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        self.expert_params = []

    def average_losses(self, acc: torch.Tensor) -> None:
        """acc[:3] (loss, fm_loss, aux_loss) -> their mean over all ranks, so that rank 0's
        metrics report the run's loss, not its own shard's."""
        if self.d.world > 1:
            dist.all_reduce(acc[:3])
            acc[:3] /= self.d.world


def moe_metrics(model: Gr00tPolicy) -> Dict[str, Any]:
    """Per-expert assignments (summed over MoE layers) and dropped assignments of the last
    forward, for a metrics row (one host read)."""
    counts, dropped = model.expert_load()
    return {"expert_tokens": counts.tolist(), "dropped_tokens": int(dropped)}


class Checkpointer:
    """torch.save (baseline / --no-vault) or CheckpointVault. ``stall_s``: time training blocked.

    Rank 0 writes the shared state (model, optimizer, scheduler) and every rank's own small state
    (loader position, RNG) in one checkpoint per step (Note [One checkpoint per step])."""

    SHARED = ("step", "model", "optimizer", "scheduler", "config")
    RUN_FILE = "run.json"  # which run wrote this directory (Note [Checkpoint directory identity])
    RANK_KEY = "__rank_state__"  # {"rank00000": that rank's own state, ...} inside a checkpoint

    WHEN_BUSY = ("skip", "wait")

    def __init__(self, kind: str, directory: Optional[str], d: Dist,
                 run_id: Optional[Dict[str, Any]] = None, when_busy: str = "skip",
                 log: Optional[Callable[[str], None]] = None, resume: bool = False) -> None:
        if when_busy not in self.WHEN_BUSY:
            raise TrainError(f"--ckpt-when-busy must be skip or wait, got {when_busy!r}")
        self.kind, self.dir, self.d = kind, directory, d
        self.when_busy = when_busy
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.vault: Any = None
        self.pending: Any = None  # async save in flight (tuned mode)
        self.async_impl = ""
        self.stall_s = 0.0
        self.drain_s = 0.0
        self.bytes_written = 0
        # Per committed save: step, bytes_written, durable_s (save() call to commit), blocking_s,
        # wait_s, snapshot_path (Note [When the disk cannot keep up]).
        self.saves: List[Dict[str, Any]] = []
        self.skipped: List[int] = []
        self._queued: Optional[Tuple[int, float]] = None  # (step, time) of the newest vault save
        self._blocking: Dict[int, Dict[str, Any]] = {}  # step -> Save()'s own figures
        self._row: Dict[str, Any] = {}
        self.run_id = dict(run_id or {}, checkpoint=kind)
        self.resume = resume
        if directory:
            self._claim(directory)
        if kind == "vault" and directory and d.is_main:
            try:
                from .ckpt import CheckpointVault
            except ImportError as e:
                raise _missing("CheckpointVault (loongforge.ckpt)", "vault", e) from e
            self.vault = CheckpointVault(os.path.join(directory, "vault"))

    # Note [Checkpoint directory identity]. A checkpoint directory belongs to one kind of run:
    # its mode, checkpoint format, model config and the figures the saved state depends on (batch
    # size and world size fix the loader position, the seed its order). DIR/run.json records them
    # at the first use; a later run that differs stops before it writes anything, naming the
    # fields, so that it neither resumes from state it cannot use (or silently restarts at step
    # 1) nor overwrites that run's rank_state/. Directories from before run.json are identified
    # by their files (vault/, step_*.pt, *.dcp).
    def _claim(self, directory: str) -> None:
        run_file = os.path.join(directory, self.RUN_FILE)
        theirs: Optional[Dict[str, Any]] = None
        if os.path.exists(run_file):
            try:
                with open(run_file) as f:
                    theirs = json.load(f)
            except (OSError, ValueError) as e:
                raise TrainError(f"--ckpt-dir {directory}: unreadable {self.RUN_FILE} ({e}); "
                                 "use another directory") from e
        elif os.path.isdir(directory):
            found = self._formats_in(directory)
            wants = ({"vault"} if self.kind == "vault" else
                     {"torch.save", "DCP"} if self.kind == "async" else {"torch.save"})
            if found - wants:
                raise TrainError(f"--ckpt-dir {directory} holds {' and '.join(sorted(found))} "
                                 f"checkpoints of another run; this run ({self.run_id.get('mode')}"
                                 f" mode) writes {' or '.join(sorted(wants))} checkpoints: use "
                                 "another directory")
        if theirs is not None:
            diff = [k for k in sorted(set(theirs) | set(self.run_id))
                    if theirs.get(k) != self.run_id.get(k)]
            if diff:
                what = ", ".join(f"{k} {theirs.get(k)!r} (this run: {self.run_id.get(k)!r})"
                                 for k in diff)
                raise TrainError(f"--ckpt-dir {directory} belongs to another run: {what}; "
                                 "use another directory")
        # A new run would train until its first save and then collide with the steps there (or
        # mix its checkpoints with theirs): refused before training.
        if not self.resume and os.path.isdir(directory) and self._has_checkpoints(directory):
            raise TrainError(f"--ckpt-dir {directory} already holds checkpoints of a run: pass "
                             "--resume to continue it, or pick another --ckpt-dir")
        if theirs is not None:
            return
        if self.d.is_main:
            os.makedirs(directory, exist_ok=True)
            tmp = f"{run_file}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(self.run_id, f, indent=1, sort_keys=True)
            os.replace(tmp, run_file)

    @staticmethod
    def _has_checkpoints(directory: str) -> bool:
        manifests = os.path.join(directory, "vault", "manifests")
        if os.path.isdir(manifests) and any(n.endswith(".manifest") for n in os.listdir(manifests)):
            return True
        return bool(Checkpointer._formats_in(directory) - {"vault"})

    @staticmethod
    def _formats_in(directory: str) -> set:
        names = os.listdir(directory)
        found = set()
        if "vault" in names:
            found.add("vault")
        if any(n.startswith("step_") and n.endswith(".pt") for n in names):
            found.add("torch.save")
        if any(n.endswith(".dcp") for n in names):
            found.add("DCP")
        return found

    def _rank_path(self, step: int) -> str:
        """Where runs before Note [One checkpoint per step] kept a rank's own state."""
        return os.path.join(self.dir, "rank_state", f"rank{self.d.rank:05d}_step_{step:08d}.pt")

    # Note [One checkpoint per step]
    # A resume needs the shared state and every rank's own state (loader position, RNG states,
    # expert shard) of one step. They are one artefact, so that a committed checkpoint is always
    # complete (a kill between two files cannot leave a step without its rank state): rank 0
    # gathers the ranks' own states (a collective on every requested save) and stores them under
    # RANK_KEY inside the vault commit, or inside the one step_*.pt file (written to a temporary
    # file, fsynced, renamed, the directory fsynced). Both hold data only: the vault's structure
    # is JSON (Note [The checkpoint structure] in ckpt.py) and the .pt files are read with
    # torch.load(weights_only=True).
    def _gather_rank_states(self, mine: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Every rank's own state on rank 0 ({"rank00000": ..., ...}), None on the others."""
        if self.d.world == 1:
            return {f"rank{self.d.rank:05d}": mine}
        import io

        buf = io.BytesIO()
        torch.save(mine, buf)
        raw = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(self.d.device)
        n = torch.tensor([raw.numel()], dtype=torch.int64, device=self.d.device)
        sizes = [torch.zeros_like(n) for _ in range(self.d.world)]
        dist.all_gather(sizes, n)
        width = max(int(x.item()) for x in sizes)
        padded = torch.zeros(width, dtype=torch.uint8, device=self.d.device)
        padded[:raw.numel()] = raw
        parts = [torch.empty_like(padded) for _ in range(self.d.world)]
        dist.all_gather(parts, padded)
        if not self.d.is_main:
            return None
        out = {}
        for r, (part, size) in enumerate(zip(parts, sizes)):
            data = part[:int(size.item())].cpu().numpy().tobytes()
            out[f"rank{r:05d}"] = self._load_data(io.BytesIO(data))
        return out

    @staticmethod
    def _write_atomic(obj: Any, path: str) -> int:
        """torch.save to a temporary file, fsync, rename over `path`, fsync the directory."""
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return os.path.getsize(path)

    @staticmethod
    def _load_data(f: Any) -> Any:
        """torch.load(weights_only=True). torch < 2 refuses floats there ("Unsupported operand
        71", every optimizer's lr); then the same allow-list of torch's weights-only unpickler
        through a pickle.Unpickler whose find_class refuses every other global, so that no file
        can name a function to call."""
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            if "Unsupported operand" not in str(e):
                raise
        import pickle
        import types

        from torch._weights_only_unpickler import _get_allowed_globals

        allowed = _get_allowed_globals()

        class DataUnpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if f"{module}.{name}" in allowed:
                    return allowed[f"{module}.{name}"]
                raise pickle.UnpicklingError(f"global {module}.{name} is not data")

        mod = types.ModuleType("loongforge_data_unpickler")
        mod.Unpickler = DataUnpickler  # type: ignore[attr-defined]
        mod.load = lambda fh, **kw: DataUnpickler(fh, **kw).load()  # type: ignore[attr-defined]
        if hasattr(f, "seek"):
            f.seek(0)
        return torch.load(f, map_location="cpu", pickle_module=mod)

    def _load_pt(self, path: str) -> Any:
        try:
            return self._load_data(path)
        except Exception as e:  # pickle.UnpicklingError, RuntimeError, EOFError, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainError(f"--resume: {path} is not a loongforge checkpoint of data only "
                             f"({type(e).__name__}: {first[:200]})") from None

    # Note [When the disk cannot keep up]
    # A save blocks the step for (Note [When the writer is busy] in src/ckpt/snapshot.cc): the
    # caller's state_dict() calls and this method's small per-rank torch.save; the vault's
    # flattening in Python; waiting for the previous save's write (back-pressure, max_inflight
    # 1: every chunk of a training state changes, so each save writes the whole state, 26 GB for
    # n16 + AdamW, longer at disk speed than 100 steps); and the snapshot itself (device staging:
    # a device-to-device copy; the first save also allocates the arena). The back-pressure is
    # the only part that grows with the cadence, and it is a choice (--ckpt-when-busy):
    #   skip (default): a save requested while the previous one is still being written is not
    #     taken (nothing flattened; with one rank the state is not even built); the log names
    #     the step and how
    #     far behind the writer is, and the summary counts it. The committed checkpoints and the
    #     save in flight are untouched, so a kill loses at most the steps since the newest commit.
    #   wait: today's back-pressure; every requested step is saved, the step stalls meanwhile.
    # With several ranks every rank builds its own state and joins the gather on every
    # requested step (Note [One checkpoint per step]); rank 0 then decides whether to skip.
    # Per save the summary and the metrics rows report bytes written and durable time (save()
    # call to the manifest commit), from the vault's committed stats.
    def save(self, step: int, state: Union[Dict[str, Any], Callable[[], Dict[str, Any]]],
             model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Writes `state` (its SHARED keys on rank 0, the rest on every rank). `state` may be a
        function that builds it: it is then called only when the save happens (not for a skipped
        one), and its time counts in the stall. `model` and `optimizer` are the live objects,
        which DCP's async_save reads (tuned mode). Returns the time it blocked."""
        if not self.dir:
            return 0.0
        t = time.perf_counter()
        # With one rank the skip is decided before the state is built; with more, every rank
        # takes part in the gather first (rank 0 alone sees its writer).
        if (self.d.world == 1 and self.vault is not None and self.when_busy == "skip"
                and self.vault.busy()):
            self._skip(step, t)
            dt = time.perf_counter() - t
            self.stall_s += dt
            return dt
        if callable(state):
            state = state()
        t_state = time.perf_counter()
        shared = {k: v for k, v in state.items() if k in self.SHARED}
        ranks = self._gather_rank_states({k: v for k, v in state.items() if k not in self.SHARED})
        if self.d.is_main:
            shared[self.RANK_KEY] = ranks
        if (self.d.is_main and self.kind == "vault" and self.when_busy == "skip"
                and self.vault.busy()):
            self._skip(step, t)
        elif self.d.is_main:
            if self.kind == "vault":
                t_vault = time.perf_counter()
                # Blocks only for the snapshot, plus (wait) the previous write. Not busy was
                # checked above and only the writer changes it back, so skip never waits here.
                if self.when_busy == "skip" and not self.vault.try_save(step, shared):
                    self._skip(step, t)
                else:
                    if self.when_busy == "wait":
                        self.vault.save(step, shared)
                    self._queued = (step, t)
                    st = self.vault.stats()
                    # Where save() spent its time: building the state (Python), the vault's
                    # flatten and tensor conversion, and the C++ snapshot's phases.
                    self._blocking[step] = {k: st.get(k) for k in (
                        "blocking_s", "wait_s", "prepare_s", "snapshot_s", "stage_s", "hash_s",
                        "copy_s", "staging_allocated", "snapshot_path", "snapshot_reason")}
                    self._blocking[step].update(
                        state_s=t_state - t, vault_call_s=time.perf_counter() - t_vault)
            elif self.kind == "async":
                self._save_async(step, shared, model, optimizer)
            else:
                size = self._write_atomic(shared, os.path.join(self.dir, f"step_{step:08d}.pt"))
                self.bytes_written += size
                self._committed({"step": step, "bytes_written": size,
                                 "durable_s": time.perf_counter() - t})
        dt = time.perf_counter() - t
        self.stall_s += dt
        return dt

    def prepare(self, state: Dict[str, Any]) -> None:
        """Before the first save (after the first optimizer step, so that the optimizer's state
        exists): reserves the vault's device staging for `state`, so that no save allocates its
        arena inside a step (cudaMalloc of the whole state: ~50 ms for n16)."""
        if not self.dir or self.vault is None or not self.d.is_main:
            return
        shared = {k: v for k, v in state.items() if k in self.SHARED}
        nbytes, why = self.vault.reserve_device_staging(shared)
        if nbytes:
            self.log(f"[ckpt] device staging reserved: {nbytes / 2**30:.1f} GiB on the GPU "
                     "(outside torch's allocator; saves copy the state there and return)")
        elif why and self.d.device.type == "cuda":
            self.log(f"[ckpt] no device staging reserved: {why}")

    def _skip(self, step: int, t: float) -> None:
        self.skipped.append(step)
        self._row["ckpt_skipped"] = 1
        q = self._queued
        behind = (f"the writer is still writing step {q[0]} ({step - q[0]} steps, "
                  f"{t - q[1]:.1f} s ago)" if q else "the writer is still busy")
        self.log(f"[ckpt] step {step}: checkpoint skipped, {behind}; the newest committed "
                 f"checkpoint stays the latest (--ckpt-when-busy wait would stall instead)")

    def _committed(self, rec: Dict[str, Any]) -> None:
        self.saves.append(rec)
        self._row.update({"ckpt_committed_step": rec["step"],
                          "ckpt_bytes_written": rec["bytes_written"],
                          "ckpt_durable_s": rec["durable_s"]})

    def _poll(self) -> None:
        """Collects the vault saves committed since the last call (cheap: one locked copy)."""
        if self.vault is None:
            return
        for st in self.vault.committed_stats():
            step = int(st["step"])
            rec = {"step": step, "bytes_written": int(st["bytes_written"]),
                   "durable_s": float(st["durable_s"]), "write_s": float(st["write_s"])}
            rec.update(self._blocking.pop(step, {}))
            self.bytes_written += rec["bytes_written"]
            self._committed(rec)

    def row_fields(self) -> Dict[str, Any]:
        """Checkpoint fields of this step's metrics row: ckpt_skipped (a requested save was
        skipped), and, in the row of the step that saw a save commit, ckpt_committed_step,
        ckpt_bytes_written and ckpt_durable_s."""
        self._poll()
        row, self._row = self._row, {}
        return row

    def figures(self) -> Dict[str, Any]:
        """Summary figures: per committed save (bytes written, durable time), skipped saves."""
        dur = [s["durable_s"] for s in self.saves]
        nbytes = [s["bytes_written"] for s in self.saves]
        paths = sorted({str(s["snapshot_path"]) for s in self.saves if s.get("snapshot_path")})
        return {"ckpt_when_busy": self.when_busy,
                "ckpt_saves_committed": len(self.saves),
                "ckpt_saves_skipped": len(self.skipped),
                "ckpt_skipped_steps": list(self.skipped),
                "ckpt_durable_s_mean": sum(dur) / len(dur) if dur else float("nan"),
                "ckpt_durable_s_max": max(dur) if dur else float("nan"),
                "ckpt_bytes_per_save_mean": sum(nbytes) / len(nbytes) if nbytes else float("nan"),
                "ckpt_snapshot_path": ",".join(paths),
                "ckpt_per_save": list(self.saves)}

    def _save_async(self, step: int, shared: Dict[str, Any], model: torch.nn.Module,
                    opt: torch.optim.Optimizer) -> None:
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

                msd, osd = get_state_dict(model, opt)
                self.pending = dcp.async_save({"model": msd, "optimizer": osd,
                                               "step": torch.tensor(step)},
                                              checkpoint_id=path + ".dcp")
                self.async_impl = "dcp.async_save"
                return
        except Exception as e:  # DCP unusable here (version, no process group): fall back
            self.async_impl = f"thread torch.save (DCP failed: {type(e).__name__})"
        import concurrent.futures

        snap = _to_cpu(shared)
        if not self.async_impl:
            self.async_impl = "thread torch.save"
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

        def write() -> None:
            self._write_atomic(snap, path + ".pt")

        self.pending = pool.submit(write)
        pool.shutdown(wait=False)

    def latest(self) -> Optional[Dict[str, Any]]:
        if not self.dir or not os.path.isdir(self.dir):
            return None
        if self.kind == "vault":
            # Every rank reads the vault (read-only on ranks > 0).
            from . import DataLossError
            from .ckpt import CheckpointVault

            v = self.vault or CheckpointVault(os.path.join(self.dir, "vault"), read_only=True)
            step = v.latest()
            try:
                shared = v.load(step, map_location="cpu") if step is not None else None
            except DataLossError as e:  # names the vault and the step
                raise TrainError(f"--resume: {str(e).strip().splitlines()[0]}") from None
        else:
            if any(f.endswith(".dcp") for f in os.listdir(self.dir)):
                raise TrainError(f"{self.dir} holds DCP checkpoints; --resume reads torch.save "
                                 "checkpoints only (load DCP ones with torch.distributed.checkpoint)")
            files = sorted(f for f in os.listdir(self.dir) if f.startswith("step_") and
                           f.endswith(".pt"))
            where = os.path.join(self.dir, files[-1]) if files else ""
            shared = self._load_pt(where) if files else None
        if shared is None:
            return None
        if not isinstance(shared, dict) or not isinstance(shared.get("step"), int):
            raise TrainError(f"--resume: the latest checkpoint in {self.dir} has no integer "
                             "'step'")
        step = int(shared["step"])
        ranks = shared.pop(self.RANK_KEY, None)
        key = f"rank{self.d.rank:05d}"
        if ranks is None:
            # Written before the rank state moved inside the checkpoint: its own file, read as
            # data only (files whose RNG state holds numpy arrays are refused, naming the file).
            rank_file = self._rank_path(step)
            if not os.path.exists(rank_file):
                raise TrainError(f"--resume: checkpoint step {step} in {self.dir} holds no rank "
                                 f"state and {rank_file} is missing")
            mine = self._load_pt(rank_file)
            where = rank_file
        elif not isinstance(ranks, dict) or not isinstance(ranks.get(key), dict):
            raise TrainError(f"--resume: checkpoint step {step} in {self.dir} holds no state for "
                             f"rank {self.d.rank} (saved by {len(ranks or {})} ranks)")
        else:
            mine = ranks[key]
            where = f"checkpoint step {step} in {self.dir}"
        if not isinstance(mine, dict):
            raise TrainError(f"--resume: {where}: rank {self.d.rank}'s state is a "
                             f"{type(mine).__name__}, not a dict")
        shared.update(mine)
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
            # The saves the drain committed (bytes_written: the sum over committed saves; it was
            # the last save's figure only).
            self._poll()


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
            # CUDA graphs: MemSculptor serves the persistent tensors through a scoped
            # torch.cuda.MemPool, and the captured steps' segments through a second one (fixed
            # addresses, nothing allocated in replay; docs/trainer.md, Note [Graphs and
            # MemSculptor]).
            import torch as _t
            if not hasattr(_t.cuda, "MemPool"):
                self.status = (f"off: --cuda-graph needs torch.cuda.MemPool (torch >= 2.5) to "
                               f"scope MemSculptor; torch {_t.__version__} has none")
                return
            self.ms = MemSculptor(device.index or 0)
            self.status = "on (scoped: persistent tensors and the CUDA graphs' pool)"
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

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.ms.device if self.ms is not None else 0)

    def arena_alloc(self, nbytes: int) -> torch.Tensor:
        """One allocation of ``nbytes`` in the persistent pool (Note [The persistent arena])."""
        with self.persistent():
            return torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)

    def graph_pool(self, which: str = "memsculptor", expandable: bool = False) -> Any:
        """The MemPool CUDA-graph captures allocate from (None: torch's own graph pool).
        ``which``: memsculptor, torch, or auto (torch when ``expandable`` segments are on: they
        apply to torch's pools only; Note [Graphs and MemSculptor])."""
        if which == "auto":
            which = "torch" if expandable else "memsculptor"
        if which == "torch" and self.ms is not None and self.scoped:
            self.status = "on (scoped: persistent tensors; graphs in torch's pool)"
        if self.ms is None or not self.scoped or which == "torch":
            return None
        try:
            return self.ms.graph_pool()
        except (RuntimeError, TypeError, AttributeError) as e:  # torch without a usable MemPool
            self.status = f"on (scoped: persistent tensors; graphs in torch's pool: {e})"
            print(f"[memsculptor] graph pool unavailable ({e}); captures use torch's graph pool",
                  file=sys.stderr)
            return None

    def record(self, steps: int, trace_path: Optional[str] = None) -> None:
        if self.ms is not None and not self.scoped:
            self.ms.record(steps=steps, trace_path=trace_path)

    def step(self, signature: str) -> Any:
        if self.ms is None or self.scoped:
            return contextlib.nullcontext()
        return self.ms.step(signature)

    def stats(self) -> Optional[Dict[str, Any]]:
        return dict(self.ms.stats()) if self.ms is not None else None

    def close(self) -> Optional[Dict[str, Any]]:
        """MemSculptor.close(), once the run dropped its model and optimizer (docs/memory.md,
        "Shutdown"): returns every cached byte, warns only about tensors still held. The step
        runner has destroyed its graphs by then (Session.release), so the memory MemSculptor held
        for them (scoped mode: the graph pool's segments) goes back too."""
        return self.ms.close(graphs_released=self.scoped) if self.ms is not None else None


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


def init_optimizer_state(opt: torch.optim.Optimizer, persistent: Callable[[], Any],
                         arena_alloc: Optional[Callable[[int], torch.Tensor]] = None) -> int:
    """Creates the optimizer's state now, inside ``persistent()`` (MemSculptor's persistent
    pool), instead of at the first step. Returns the number of parameters given state.

    Note [Optimizer state up front]. AdamW creates its moments lazily, at the first ``step()``,
    after a step's activations were allocated and freed, so the moments (8 bytes a trainable
    parameter, 13.7 GB for n16) would share torch's default pool with the activations. Made
    here, before any activation exists, they live in MemSculptor's persistent pool beside the
    parameters, counted there, apart from every step's memory. (Measured on n16 on an H200,
    docs/BENCHMARKS.md: this alone did not lower the run's peak reserved; the gap comes from a
    second bucket's warm-up, see Note [Graphs and MemSculptor].) torch's own initialisation runs
    (a step with zero gradients at learning rate 0 leaves every parameter bit for bit as it
    was), then every state tensor is zeroed, which is exactly AdamW's fresh state (step 0,
    moments 0): the first real step is the same as without this."""
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    if arena_alloc is not None:
        # Note [The persistent arena] in memory.py: the state laid out in one allocation, as
        # AdamW would make it; the step below then uses it (or torch refuses it: its own blocks).
        from .memory import adamw_state_in_arena

        try:
            adamw_state_in_arena(opt, None, arena_alloc)
        except ValueError:
            pass
    saved_grads = [p.grad for p in params]
    saved_lrs = [g["lr"] for g in opt.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)  # temporary: outside the persistent pool
        for g in opt.param_groups:
            g["lr"] = 0.0
        with persistent():
            try:
                opt.step()
            except RuntimeError:
                if arena_alloc is None or not opt.state:
                    raise
                opt.state.clear()  # torch refused the arena's layout: it makes its own
                opt.step()
    finally:
        for p, gr in zip(params, saved_grads):
            p.grad = gr
        for g, lr in zip(opt.param_groups, saved_lrs):
            g["lr"] = lr
    with torch.no_grad():
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    v.zero_()
    return sum(1 for p in params if opt.state.get(p))


def lr_lambda(total: int, warmup: float, min_ratio: float) -> Callable[[int], float]:
    w = int(warmup * total) if warmup < 1 else int(warmup)

    def f(step: int) -> float:
        if w and step < w:
            return (step + 1) / w
        prog = min(1.0, (step - w) / max(1, total - w))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    return f


def rng_state(gen: torch.Generator) -> Dict[str, Any]:
    """The RNG states as tensors, ints and floats only, so that both checkpoint formats hold
    them as data (torch.load(weights_only=True) takes no numpy arrays)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    st = {"torch": torch.get_rng_state(),
          "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
                    "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
          "python": {"version": int(version), "state": torch.tensor(mt, dtype=torch.int64),
                     "gauss_next": gauss_next},
          "noise": gen.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Dict[str, Any], gen: torch.Generator) -> None:
    try:
        n, p = st["numpy"], st["python"]
        torch.set_rng_state(st["torch"])
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), int(n["pos"]),
                             int(n["has_gauss"]), float(n["cached_gaussian"])))
        random.setstate((int(p["version"]), tuple(int(x) for x in p["state"].tolist()),
                         p["gauss_next"]))
        gen.set_state(st["noise"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise TrainError(f"--resume: the checkpoint's RNG state is malformed ({type(e).__name__}:"
                         f" {e})") from None
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


