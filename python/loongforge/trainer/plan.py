"""What a run will do, decided before any of it is built.

``resolve_plan`` turns the flags (and the machine: CUDA or not, the world size, the dataset's
schema and the model's config) into a ``Plan``: every "auto" the trainer resolves, each as a
``Choice`` with the reason it came out that way. ``session.build`` reads the plan and decides
nothing itself; the run's "modules" line starts as ``Plan.modules()``, and build adds what only
the build can know (how many layers a cast touched, whether torch accepted a setting, ...).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Dict, Optional, Tuple

import torch

from .. import knobs
from ..graphs import graph_unavailable, parse_buckets
from .dist import ranks_from_env, use_cuda
from .errors import TrainError


MODULES = ("datafusion", "nexussync", "vault", "memsculptor")


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


@dataclasses.dataclass(frozen=True)
class Choice:
    """One decision of the plan: its value and why (a flag, or what "auto" found)."""

    value: Any
    reason: str


class _ConfigOnly:
    """The model as graph_unavailable sees it before it is built: its config (a model built
    whole from its config, its experts not yet split across ranks)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg


def _flag(name: str, value: Any) -> str:
    return f"--{name.replace('_', '-')} {value}"


@dataclasses.dataclass
class Plan:
    """Every choice ``build`` makes from the flags and the machine, made once, with its reason
    (``resolve_plan``)."""

    mode: str
    switches: Dict[str, Choice]         # datafusion, nexussync, vault, memsculptor: on or off
    device: Choice                      # "cuda" or "cpu"
    cuda_graphs: Choice                 # per-microbatch CUDA graphs
    memory_cap_mib: Choice              # the MemSculptor and torch allocator cap (0: none)
    expandable_segments: Choice         # "on", "off", or what PYTORCH_CUDA_ALLOC_CONF set
    frozen_bf16: Choice
    norm_recompute: Choice
    persistent_arena: Choice            # wanted: it takes effect when MemSculptor is on
    text_cut: Choice                    # text cut to this many tokens (0: no cut)
    token_buckets: Choice               # the step runner's static shapes ((): none)
    loader_buckets: Choice              # the buckets DataFusion pads to itself ((): none)
    token_pad: Choice                   # --token-pad, or what --compile pads to
    sync: Choice                        # "nexussync", "ddp" or "none"
    grads_in_pool: Choice               # graphed steps make the gradients in the graph pool
    checkpoint: Choice                  # "vault", "async" or "torch"
    compile_blocks: Choice
    sync_free: Choice
    noise: Choice                       # "stream" or "per-sample"
    _modules_line: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.value == "cuda"

    def choices(self) -> Dict[str, Choice]:
        """Every choice by name (the LoongForge modules' switches as switch:NAME)."""
        out = {f"switch:{k}": v for k, v in self.switches.items()}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Choice):
                out[f.name] = v
        return out

    def modules(self) -> Dict[str, str]:
        """The "modules" line as the plan has it: the entries that the choices alone decide
        (build updates some with what it finds, and adds the rest)."""
        return dict(self._modules_line)

    # The order of the modules line: the order in which the trainer meets the parts (allocator,
    # model, loader, sync, checkpoints, compilation, optimizer, step runner).
    LINE_ORDER = ("expandable_segments", "memory_cap", "norm_recompute", "frozen_bf16",
                  "memsculptor", "augment", "persistent_arena", "compile", "datafusion",
                  "nexussync", "expert_parallel", "vault", "fp8_frozen", "compile_frozen",
                  "compile_blocks", "adamw", "noise", "start_batch", "cuda_graph",
                  "static_batches", "sync_free")

    @classmethod
    def in_line_order(cls, line: Dict[str, str]) -> Dict[str, str]:
        """``line``'s entries in LINE_ORDER, any others after them as they came."""
        known = [k for k in cls.LINE_ORDER if k in line]
        return {k: line[k] for k in known + [k for k in line if k not in cls.LINE_ORDER]}


def resolve_plan(args: argparse.Namespace, cfg: Any, schema: Dict[str, Any],
                 cuda_available: Optional[bool] = None, world: Optional[int] = None) -> Plan:
    """The plan for a run of ``args`` (checked by cli.check_args) on a model of config ``cfg``
    over a dataset of ``schema``. ``cuda_available``: whether torch sees a CUDA device (default:
    ask torch); ``world``: the world size (default: WORLD_SIZE). Raises TrainError for a flag
    the machine cannot honour, in the order build met them: --memory-cap-gib,
    --expandable-segments on, --device, --frozen-bf16 on, --token-pad, --token-buckets."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if world is None:
        world = ranks_from_env()[1]
    mode = args.mode
    lf = mode == "loongforge"
    # What a tuned PyTorch user sets too: the "auto" choices that are plain torch settings.
    strong = lf or mode == "tuned"
    line: Dict[str, str] = {}
    switches = {}
    for m in MODULES:
        if not lf:
            switches[m] = Choice(False, f"{mode} mode runs torch's own")
        elif getattr(args, f"no_{m}"):
            switches[m] = Choice(False, f"--no-{m}")
        else:
            switches[m] = Choice(True, "loongforge mode")
    cuda_run = args.device != "cpu" and cuda_available
    auto_lean = lf and cuda_run
    if args.cuda_graph != "auto":
        graphs = Choice(args.cuda_graph == "per_microbatch", _flag("cuda_graph", args.cuda_graph))
    elif auto_lean and not args.profile_modules:
        graphs = Choice(True, "auto: loongforge mode on CUDA")
    elif auto_lean:
        graphs = Choice(False, "auto, but --profile-modules times eager steps")
    else:
        graphs = Choice(False, "auto: on in loongforge mode on CUDA only")
    if args.memory_cap_gib:
        if args.device == "cpu" or not cuda_available:
            raise TrainError("--memory-cap-gib caps GPU memory: it needs a CUDA device")
        cap = Choice(int(args.memory_cap_gib * 1024), _flag("memory_cap_gib",
                                                            f"{args.memory_cap_gib:g}"))
    else:
        cap = Choice(0, "no --memory-cap-gib")
    expandable = _expandable_wanted(args.expandable_segments, strong, cuda_run)
    if expandable.value != "off":
        line["expandable_segments"] = expandable.value
    if args.memory_cap_gib:
        line["memory_cap"] = (f"{args.memory_cap_gib:g} GiB (torch's allocator and "
                              "MemSculptor; the loader's and checkpoint staging's own device "
                              "buffers are outside it)")
    cuda = use_cuda(args.device, cuda_available)  # the errors setup_dist would raise
    device = Choice("cuda" if cuda else "cpu",
                    _flag("device", args.device) if args.device != "auto" else
                    f"auto: torch sees {'a' if cuda else 'no'} CUDA device")
    if args.frozen_bf16 == "on" and not cuda:
        raise TrainError("--frozen-bf16 on needs CUDA: bf16 autocast runs only there (on the "
                         "CPU the frozen layers compute in fp32)")
    if args.frozen_bf16 != "auto":
        frozen_bf16 = Choice(args.frozen_bf16 == "on", _flag("frozen_bf16", args.frozen_bf16))
    else:
        frozen_bf16 = Choice(strong and cuda, "auto: on in loongforge and tuned modes on CUDA")
    if args.norm_recompute != "auto":
        norms = Choice(args.norm_recompute == "on", _flag("norm_recompute", args.norm_recompute))
    else:
        norms = Choice(lf and cuda, "auto: on in loongforge mode on CUDA")
    if norms.value:
        line["norm_recompute"] = ("on (RMSNorms and SwiGLU recomputed in backward: the same "
                                  "gradients)")
    if args.persistent_arena != "auto":
        arena = Choice(False, "--persistent-arena off")
    elif not (switches["memsculptor"].value and cuda):
        arena = Choice(False, "auto: MemSculptor is off")
    elif args.fp8_frozen or args.expert_parallel != 1:
        arena = Choice(False, "auto: --fp8-frozen and expert parallelism replace parameters "
                              "after they are placed")
    else:
        arena = Choice(True, "auto: MemSculptor is on")
    mem_line = ("off: --no-memsculptor" if lf and not switches["memsculptor"].value else
                "off: needs CUDA" if switches["memsculptor"].value and not cuda else
                "on" if switches["memsculptor"].value else "off")
    line["memsculptor"] = mem_line
    from ..augment import describe

    line["augment"] = describe(args.augment, args.no_augment, args.crop_fraction, cfg.image_size)

    longest = int(schema.get("max_tokens", 0))
    limit = cfg.max_text_tokens
    if args.token_pad > limit:
        raise TrainError(f"--token-pad {args.token_pad} is longer than config {cfg.name}'s "
                         f"max_text_tokens ({limit})")
    if longest <= limit:
        cut = Choice(0, f"the dataset's longest text ({longest} tokens) fits config {cfg.name}'s "
                        f"max_text_tokens ({limit})")
    else:
        cut = Choice(limit, f"instructions of up to {longest} tokens; the trainer cuts them to "
                            f"{limit}, config {cfg.name}'s max_text_tokens (--set "
                            "max_text_tokens=N to change)")
    # Static batches: token buckets (DataFusion pads to them in its stage 3 when every record
    # fits the largest bucket; otherwise the step runner pads, and longer batches run eager).
    if cut.value:
        longest = cut.value
    if args.token_buckets == "auto":
        buckets: Tuple[int, ...] = auto_buckets(longest or 64) if graphs.value else ()
        why = ("auto: four per octave up to the dataset's longest text, with CUDA graphs"
               if graphs.value else "auto: none without CUDA graphs")
    else:
        try:
            buckets = parse_buckets(args.token_buckets)
        except ValueError as e:
            raise TrainError(f"--token-buckets: {e}") from e
        why = f"--token-buckets {args.token_buckets!r}"
    if cut.value and buckets and buckets[-1] > cut.value:
        buckets = tuple(b for b in buckets if b < cut.value) + (cut.value,)
        why += f", the largest cut to {cut.value} tokens"
    token_buckets = Choice(buckets, why)
    loader_pads = knobs.get("LOONGFORGE_TRAIN_LOADER_BUCKETS")
    if not (buckets and longest and longest <= buckets[-1]):
        loader_buckets = Choice((), "the step runner pads: no buckets" if not buckets else
                                "the step runner pads: records longer than the largest bucket")
    elif not loader_pads:
        # diagnostics: the step runner pads instead of DataFusion
        loader_buckets = Choice((), "LOONGFORGE_TRAIN_LOADER_BUCKETS=0: the step runner pads")
    else:
        loader_buckets = Choice(buckets, "every record fits the largest bucket")
    if args.compile and not buckets and not args.token_pad and longest:
        # Note [Static shapes for --compile]: one shape, one compilation
        pad = min(-(-longest // 8) * 8, cfg.max_text_tokens)
        token_pad = Choice(pad, "--compile: the dataset's longest text rounded up to 8")
        line["compile"] = (f"whole model, static shapes (text padded to {pad}, the "
                           "dataset's longest rounded up to 8; --token-pad N to change)")
    else:
        token_pad = Choice(args.token_pad, _flag("token_pad", args.token_pad) if args.token_pad
                           else "0: each batch's longest text")
    line["datafusion"] = ("on" if switches["datafusion"].value else
                          "off: --no-datafusion" if lf else "off")
    # NexusSync also runs at world size 1 (flat gradient buckets, no collectives) so that the
    # single-process ablation measures its bookkeeping honestly; not under graphed one-microbatch
    # steps (below).
    if switches["nexussync"].value:
        sync = Choice("nexussync", "loongforge mode")
    elif world > 1:
        sync = Choice("ddp", f"world size {world}" + (", --no-nexussync" if lf else ""))
    else:
        sync = Choice("none", "world size 1" + (", --no-nexussync" if lf else ""))
    line["nexussync"] = ("on" if sync.value == "nexussync" else
                         "off: --no-nexussync" if lf else "off")
    # Note [Gradients in the graph pool]: NexusSync's flat buckets would hold the gradients for
    # the whole run; at world size 1 they have nothing to reduce.
    blocker = graph_unavailable(_ConfigOnly(cfg), torch.device("cuda" if cuda else "cpu"),
                                "none") if graphs.value else "no CUDA graphs"
    if not graphs.value or args.graph_grads != "auto":
        pool = Choice(False, "no CUDA graphs" if not graphs.value else "--graph-grads fixed")
    elif not cuda or world != 1 or args.grad_accum != 1 or args.topk_ratio is not None:
        pool = Choice(False, "auto: only for one microbatch a step at world size 1 on CUDA, "
                             "without --topk-ratio")
    elif blocker is not None:
        pool = Choice(False, f"auto: {blocker}")
    else:
        pool = Choice(True, "auto: graphed one-microbatch steps at world size 1")
    if pool.value and sync.value == "nexussync":
        sync = Choice("none", "world size 1, nothing to reduce: the gradients live in the graph "
                              "pool")
        line["nexussync"] = ("off: world size 1, nothing to reduce (graphed steps make the "
                             "gradients in the graph pool; --graph-grads fixed keeps it on)")
    if switches["vault"].value:
        ckpt = Choice("vault", "loongforge mode")
    elif mode == "tuned":
        ckpt = Choice("async", "tuned mode")
    else:
        ckpt = Choice("torch", f"{mode} mode" if not lf else "--no-vault")
    line["vault"] = ("on" if switches["vault"].value and args.ckpt_dir else
                     "off: no checkpoints" if switches["vault"].value else "off")
    blocks, why_not = _compile_blocks_wanted(args, lf, torch.device("cuda" if cuda else "cpu"),
                                             static=bool(buckets or token_pad.value),
                                             moe=bool(getattr(cfg, "moe_experts", 0)))
    compile_blocks = Choice(blocks, "--compile-blocks on" if blocks and args.compile_blocks == "on"
                            else "auto: loongforge mode on CUDA, static shapes" if blocks
                            else why_not)
    if not blocks and lf and args.compile_blocks == "auto":
        line["compile_blocks"] = f"off: {why_not}"
    if args.noise == "per-sample":
        noise = Choice("per-sample", "--noise per-sample")
        line["noise"] = "per sample: (seed, epoch, sample index), loongforge.sample_rng"
    else:
        noise = Choice("stream", "--noise stream: one generator per rank")
    if args.profile_modules and args.cuda_graph == "auto" and auto_lean:
        line["cuda_graph"] = "off (--profile-modules: eager steps)"
    want_sync_free = args.sync_free == "on" or (args.sync_free == "auto" and strong)
    if args.sync_free == "on" and not cuda:
        sync_free = Choice(False, "--sync-free on, but it needs CUDA")
        line["sync_free"] = "off: needs CUDA (on the CPU every step is synchronous)"
    elif want_sync_free and cuda:
        sync_free = Choice(True, _flag("sync_free", "on") if args.sync_free == "on" else
                           "auto: on in loongforge and tuned modes on CUDA")
        line["sync_free"] = "on (figures read back 2 steps late)"
    else:
        sync_free = Choice(False, "--sync-free off" if args.sync_free == "off" else
                           "auto: on in loongforge and tuned modes on CUDA only")
    return Plan(mode=mode, switches=switches, device=device, cuda_graphs=graphs,
                memory_cap_mib=cap, expandable_segments=expandable, frozen_bf16=frozen_bf16,
                norm_recompute=norms, persistent_arena=arena, text_cut=cut,
                token_buckets=token_buckets, loader_buckets=loader_buckets, token_pad=token_pad,
                sync=sync, grads_in_pool=pool, checkpoint=ckpt, compile_blocks=compile_blocks,
                sync_free=sync_free, noise=noise, _modules_line=line)



def _expandable_wanted(choice: str, strong: bool, cuda: bool) -> Choice:
    """--expandable-segments: whether the run turns torch's expandable segments on. A value
    PYTORCH_CUDA_ALLOC_CONF sets is kept ("on (PYTORCH_CUDA_ALLOC_CONF)", or off), and the run
    then sets nothing (session._expandable_segments applies "on")."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in conf:
        on = "expandable_segments:true" in conf.replace(" ", "").lower()
        return Choice(f"{'on' if on else 'off'} (PYTORCH_CUDA_ALLOC_CONF)",
                      "PYTORCH_CUDA_ALLOC_CONF sets expandable_segments")
    want = choice == "on" or (choice == "auto" and strong and cuda)
    if not want:
        return Choice("off", _flag("expandable_segments", choice) if choice != "auto" else
                      "auto: on in loongforge and tuned modes on CUDA only")
    if not cuda:
        raise TrainError("--expandable-segments on needs CUDA")
    return Choice("on", "--expandable-segments on" if choice == "on" else
                  "auto: loongforge or tuned mode on CUDA")
