"""The run's parts put together: ``build`` turns the parsed flags into a ``Session`` (process
group and allocator, model, loader, gradient sync, checkpointer, optimizer, step runner, ...),
which ``loop.train_loop`` runs."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from ..comm import SyncBackend
from ..flops import FlopsPerShape
from ..graphs import GraphedStep, SyncCounter
from ..memory import MemSculptorSession, init_optimizer_state, storage_ptr
from ..models.gr00t import Gr00tConfig, Gr00tPolicy, get_config
from ..train_metrics import ModuleProfiler, Readback, Trace, _safe_metrics
from .checkpoint import Checkpointer
from .cli import check_args
from .compile import compile_blocks, compile_frozen
from .dist import Dist, setup_dist
from .errors import TrainError
from .inputs import TokenGuard, make_loader
from .model import build_model, parse_overrides
from .optim import lr_lambda, make_optimizer
from .plan import Plan, resolve_plan

if TYPE_CHECKING:
    from .loop import StopSignal


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
        from .. import sample_rng

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
class Progress:
    """Where a run is, for the out-of-memory and interrupt lines: "start-up", then "step N"
    (with the bucket graphs captured so far). The caller of loop.run may pass its own to read
    it after a failure."""

    where: str = "start-up"


@dataclasses.dataclass
class Session:
    """Everything ``build`` puts together for ``train_loop``."""

    args: argparse.Namespace
    d: Dist
    cfg: Gr00tConfig
    schema: Dict[str, Any]
    status: Dict[str, str]
    mem: MemSculptorSession
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
    # The process's expandable segments were turned on by this run (turned off at its end).
    expandable_set_by_run: bool = False
    progress: Progress = dataclasses.field(default_factory=lambda: Progress())

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


def _expandable_segments(planned: str, choice: str) -> str:
    """--expandable-segments: turns torch's expandable segments on for this process's allocator
    (before the first CUDA allocation; it applies to segments made afterwards) when the plan
    says "on" (plan._expandable_wanted; anything else is returned as it is), and says so: "on"
    exactly when this call turned them on (the run turns them off again at its end).
    ``choice``: the flag (with "on" a refusal by torch is an error).
    Note [Graphs and MemSculptor]: with them on, CUDA graphs capture into torch's own graph pool,
    whose blocks then merge across what would be segment boundaries; MemSculptor's MemPool (a
    custom allocator) cannot have them."""
    if planned != "on":
        return planned
    if getattr(torch.cuda.memory, "_set_allocator_settings", None) is None:
        return f"off (torch {torch.__version__} cannot set them at run time)"
    try:
        _allocator_settings("expandable_segments:True")
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
    storages = {storage_ptr(t) for t in ts}
    return (f"optimizer state {n / 2**30:.2f} GiB in "
            + ("one allocation" if len(storages) == 1 else f"{len(storages)} blocks"))


def _into_persistent(model: Any, mem: MemSculptorSession, arena: bool = False,
                     status: Optional[Dict[str, str]] = None) -> None:
    """The model's parameters and buffers, from the host or from torch's default pool on the
    device, copied into MemSculptor's persistent pool: with ``arena``, into one planned
    allocation (Note [The persistent arena] in memory.py), else one after another; the default
    pool's blocks are given back. With MemSculptor off they stay where they are."""
    if mem.ms is None:
        return
    ts = list(itertools.chain(model.parameters(), model.buffers()))
    if arena:
        from ..memory import pack_into_arena

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


def _store_frozen_bf16(model: Any, mem: MemSculptorSession, status: Dict[str, str],
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


def load_time_contract(args: argparse.Namespace, schema: Dict[str, Any],
                       overrides: Dict[str, Any]) -> Any:
    """--action-horizon and --tokenizer: the batch contract chosen at load time. Rewrites the
    run's copy of the schema (action_horizon; tokenizer, vocab_size and max_tokens from the
    dataset's task texts) so every later decision reads the contract the loader will give, sets
    the config's vocab_size to the tokenizer's (unless --set gives one), and returns the
    tokenizer for the loader (None without --tokenizer). ValueError naming the flag when the DB
    cannot serve it."""
    lerobot = str(schema.get("source_format", "")).startswith("lerobot")
    if args.action_horizon == int(schema["action_horizon"]):
        args.action_horizon = None  # the packed chunk: nothing to gather
    if args.action_horizon is not None:
        if not lerobot:
            raise ValueError(f"--action-horizon {args.action_horizon}: {args.data} stores chunks "
                             f"of {schema['action_horizon']} steps only (not packed from "
                             f"LeRobot): repack it with loongforge pack --horizon "
                             f"{args.action_horizon}")
        schema["action_horizon"] = args.action_horizon
    if args.tokenizer is None:
        return None
    meta = schema.get("source_meta") or {}
    tasks = list((meta.get("tasks") or {}).values()) if isinstance(meta, dict) else []
    if not lerobot or not tasks:
        raise ValueError(f"--tokenizer: {args.data} lists no task texts in its schema (a DB "
                         "packed from LeRobot does); repack it with loongforge pack --tokenizer")
    from ..text import LoadTimeTokenizer

    tok = LoadTimeTokenizer(args.tokenizer)
    if tok.vocab_size is None:
        raise ValueError(f"--tokenizer {args.tokenizer}: its vocabulary size is unknown")
    overrides.setdefault("vocab_size", tok.vocab_size)
    schema.update(tokenizer=tok.name, vocab_size=tok.vocab_size,
                  max_tokens=max(len(tok.encode(str(t))) for t in tasks))
    return tok


def build(args: argparse.Namespace) -> Session:
    from .loop import StopSignal, resume  # loop.py imports this module

    check_args(args)
    clock = _Clock()
    if args.threads:
        torch.set_num_threads(args.threads)
    from ..trainer_data import read_schema

    try:
        schema = read_schema(args.data)
    except (OSError, ValueError) as e:
        raise TrainError(str(e)) from e
    try:
        overrides = parse_overrides(args.set)
        tokenizer = load_time_contract(args, schema, overrides)
        planned_cfg = get_config(args.config, image_size=args.image_size, **overrides)
    except (ValueError, OSError, ImportError) as e:
        raise TrainError(str(e)) from e
    plan = resolve_plan(args, planned_cfg, schema)
    lf = args.mode == "loongforge"
    on = {m: c.value for m, c in plan.switches.items()}
    status: Dict[str, str] = plan.modules()  # the "modules" line: what the plan decided
    graphs = plan.cuda_graphs.value
    # The cap goes to MemSculptor's backend as it loads (in setup_dist).
    mem = MemSculptorSession(on["memsculptor"], lf, scoped=graphs,
                        limit_mb=plan.memory_cap_mib.value or None)
    expandable = _expandable_segments(plan.expandable_segments.value, args.expandable_segments)
    if expandable != "off":
        status["expandable_segments"] = expandable
    d = setup_dist(plan.device.value, mem.install)
    log = _log(d)
    _memory_history(args.memory_history, d.device)
    clock.mark("process group and allocator")
    if args.memory_cap_gib:
        total = torch.cuda.get_device_properties(d.device).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, args.memory_cap_gib * 2**30 / total), d.device)

    on_device = (contextlib.nullcontext() if args.init_device == "host" or d.device.type == "cpu"
                 else _on_device(d.device))
    try:
        with on_device:
            model = build_model(args.config, args.seed, args.image_size, schema, overrides)
    except ValueError as e:
        raise TrainError(str(e)) from e
    frozen_bf16 = plan.frozen_bf16.value
    from ..models.gr00t_layers import set_norm_recompute, set_shared_casts

    set_shared_casts(frozen_bf16)  # one autocast cast for frozen sibling layers (same bits)
    # Note [Recomputed norms]: the same gradients, less memory
    set_norm_recompute(plan.norm_recompute.value)
    if frozen_bf16 and not args.fp8_frozen:
        # Before the copy to the device (host init): no fp32 weights there to free, no holes
        # left in the persistent pool, half the bytes copied. --fp8-frozen quantizes the fp32
        # weights first (below).
        _store_frozen_bf16(model, mem, status, persistent=False)
    arena = plan.persistent_arena.value and mem.ms is not None
    if args.init_device == "device" and d.device.type == "cuda":
        _into_persistent(model, mem, arena, status)
    clock.mark("model init")
    cfg = model.cfg
    args.image_size = cfg.image_size
    status["memsculptor"] = mem.status
    if arena and args.init_device != "device":  # host init: copied straight into the arena
        _into_persistent(model, mem, arena, status)
    with mem.persistent():  # parameters live apart from the planned activation arena
        model.to(d.device).train()
    clock.mark("model to device")
    cut = plan.text_cut.value  # the loaders' cut for text longer than the model takes
    if cut:  # without it a 100k-character instruction grew the trainer to 21 GB
        log(f"warning: {args.data}: {plan.text_cut.reason}")
    buckets = plan.token_buckets.value
    args.token_pad = plan.token_pad.value  # --compile: padded to one length
    try:
        loader = make_loader(args, d, on["datafusion"], plan.loader_buckets.value, cut,
                             tokenizer=tokenizer)
    except ImportError as e:
        raise TrainError(str(e)) from e
    clock.mark("loader")
    if on["datafusion"] and d.device.type == "cuda":
        backend = _safe_metrics(loader).get("decode_backend")
        if backend:
            status["datafusion"] = f"on (decode: {backend})"
    sync_kind = plan.sync.value
    pool_grads = plan.grads_in_pool.value
    ep = None
    from ..moe import ExpertParallel, check_expert_parallel

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
        ckpt = Checkpointer(plan.checkpoint.value, ckpt_dir, d, run_id,
                            when_busy=args.ckpt_when_busy, log=log, resume=args.resume)
    except OSError as e:  # a read-only or foreign directory: name the flag
        raise TrainError(f"--ckpt-dir {ckpt_dir}: cannot write checkpoints there: "
                         f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")) from e

    if args.fp8_frozen:
        from ..fp8 import Fp8Unsupported, apply_fp8_frozen

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
    blocks = plan.compile_blocks.value
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
    if mem.ms is not None:  # Note [Optimizer state up front] in trainer/optim.py
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
    noise = (SampleNoise(args.seed, cfg.max_action_dim) if plan.noise.value == "per-sample"
             else None)
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
    sync_free = plan.sync_free.value
    readback = Readback(d.device, lag=2 if sync_free else 0,
                        flops_poly=FlopsPerShape(cfg, len(schema["cameras"]),
                                                 int(schema["action_horizon"])).length_polynomial())
    guard = TokenGuard(cfg.vocab_size, cfg.max_text_tokens, args.data, log, deferred=cuda)
    profiler = (ModuleProfiler(start_step + args.warmup, args.profile_modules, d.device, sync_dev)
                if args.profile_modules else None)
    clock.mark("step runner")
    status = Plan.in_line_order(status)
    session = Session(args, d, cfg, schema, status, mem, model, runner, loader, sync, ckpt,
                      params, opt, sched, noise_gen, noise, start_step, counter, sync_dev,
                      autocast, trace, stepper, sync_free, readback, guard, profiler,
                      StopSignal(d, readback.lag, args.mode), clock.phases)
    session.expandable_set_by_run = expandable == "on"
    return session


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
