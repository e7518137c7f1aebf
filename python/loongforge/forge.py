"""Forge: LoongForge's modules under a user's own model and training loop (docs/adopting.md).

    forge = lf.Forge(device="cuda", precision="bf16", ckpt_dir="ckpt")
    model, optimizer = forge.setup(model, optimizer)
    loader = forge.loader("db", batch_size=64)      # or forge.loader(any iterable of dict batches)
    step = forge.compile_step(loss_fn)              # loss_fn(model, batch) -> loss
    state = forge.load()                            # None on a fresh start
    for batch in loader:
        loss = step(batch)
    forge.save(step_no, extra={"epoch": e})
    forge.report()

What each part reuses:

* Process group and device: ``trainer.dist.setup_dist`` (RANK / WORLD_SIZE / LOCAL_RANK as
  torchrun and ``loongforge launch`` set them; gloo on the CPU, NCCL on CUDA).
* Gradient sync (world size > 1): ``NexusSync`` with ``broadcast_from=0``, so every rank starts
  from rank 0's parameters and buffers (Note [Starting from one rank's weights] in comm.py).
* The step: ``graphs.GraphedStep`` runs forward + backward; on CUDA it captures one CUDA graph per
  batch shape after a few eager warm-up steps and replays it after that. Gradient sync, clipping
  and the optimizer run eager after it, through ``trainer.optim.optimizer_step``, which skips
  a step whose loss or gradient norm is not finite (Note [Non-finite steps] in trainer/optim.py).
* Memory: MemSculptor's persistent arena (``memory.pack_into_arena`` and
  ``memory.init_optimizer_state``): parameters, buffers and Adam/AdamW state in two planned
  allocations (Note [The persistent arena] in memory.py).
* Compiled blocks (CUDA, torch >= 2): each repeated block (the layers an ``nn.ModuleList``
  holds) is compiled in place by ``blocks.CompiledBlocks`` and captured in the step's graph.
* Data: ``DataFusionLoader`` sharded by rank for a packed DB; any other iterable of dict batches
  is moved to the device as it is iterated.
* Checkpoints: ``trainer.checkpoint.Checkpointer`` over ``CheckpointVault``: rank 0 writes the model
  and optimizer; every rank's own state (loader positions, RNG states, ``extra``) is gathered
  into rank 0's commit (Note [One checkpoint per step] in trainer/checkpoint.py).

Misuse raises ``ForgeError`` (a ValueError) saying what to do instead.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from .blocks import SCOPES, CompiledBlocks, find_blocks, unavailable_reason
from .ckpt import _encode_state
from .graphs import GraphedStep
from .memory import state_back_into_place, storage_ptr
from .trainer.checkpoint import Checkpointer, rng_state, set_rng_state
from .trainer.dist import Dist, ranks_from_env, setup_dist
from .trainer.errors import NonFiniteError, TrainError
from .trainer.optim import optimizer_step

__all__ = ["Forge", "ForgeError", "ForgeLoader", "NonFiniteError"]

_PRECISIONS = ("fp32", "bf16")
# Entries of a DataFusion batch that are Python values, not tensors (the task text, one str a row).
_TEXT_KEYS = ("task",)
_DEVICES = ("auto", "cpu", "cuda")
_GRAPHS = ("auto", "on", "off")
# Layers whose frozen weights precision="bf16" stores in bf16. Norms and embeddings keep their
# dtype: autocast runs them in fp32 (what Gr00tPolicy.frozen_linear_to does for --frozen-bf16).
_BF16_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


class ForgeError(ValueError):
    """A misuse of the Forge API (an unknown option, a call out of order): the message says what
    to do instead."""


def _check_options(where: str, given: Mapping[str, Any], valid: Iterable[str]) -> None:
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ForgeError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(u) for u in unknown)} (valid: "
                         f"{', '.join(sorted(valid))})")


class _ForgeGraphedStep(GraphedStep):
    """GraphedStep over a user's loss_fn(model, batch): every tensor of the batch is a graph input
    (its shapes and dtypes key the graph), and no noise is drawn outside the graph (random ops
    inside loss_fn draw from torch's default generator, which CUDA graphs advance per replay)."""

    def __init__(self, model: torch.nn.Module, device: torch.device,
                 loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], **kw: Any) -> None:
        self.loss_fn = loss_fn
        super().__init__(model, device, token_buckets=(), **kw)

    def _step_keys(self, batch: Mapping[str, Any]) -> List[str]:
        return [k for k, v in batch.items() if isinstance(v, torch.Tensor)]

    def _resolve(self, batch: Mapping[str, Any], count: bool = True
                 ) -> Tuple[Dict[str, Any], Optional[int], Tuple[Any, ...]]:
        return dict(batch), None, self._key(batch)

    @staticmethod
    def _describe(key: Tuple[Any, ...]) -> str:
        return ", ".join(f"{k}{list(s)}" for k, s, _ in key) or "(no tensors)"

    def _draw(self, batch: Mapping[str, Any], generator: Optional[torch.Generator],
              out: Any = None) -> Any:
        return ()

    def _forward_backward(self, batch: Mapping[str, Any], noise: Any,
                          loss_scale: float) -> Dict[str, torch.Tensor]:
        with self._autocast():
            loss = self.loss_fn(self.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ForgeError("compile_step: loss_fn(model, batch) must return the loss as a "
                             f"one-element tensor, got {_what(loss)}")
        loss = loss.reshape(())
        (loss if loss_scale == 1.0 else loss * loss_scale).backward()
        return {"loss": loss.detach().reshape(())}


def _auto_on_off(options: Mapping[str, Any], key: str) -> str:
    """compile_step's "auto"/"on"/"off" option `key` (True/False as "on"/"off")."""
    v = options.get(key, "auto")
    v = {True: "on", False: "off"}[v] if isinstance(v, bool) else v
    if v not in _GRAPHS:
        raise ForgeError(f"compile_step({key}={v!r}): one of {', '.join(_GRAPHS)}")
    return v


def _what(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return f"a {type(x).__name__}"


class ForgeLoader:
    """What ``Forge.loader`` returns: iterates its source's batches on the Forge's device, times
    how long the loop waits for them (``Forge.report()['data_wait_fraction']``) and has a resumable
    position (``state_dict``), which ``Forge.save`` / ``Forge.load`` keep.

    A DataFusionLoader keeps its own exact position. Any other iterable's position is the epoch
    and the number of batches handed out in it; a resumed loader skips that many batches of its
    next iteration, which resumes exactly when the iterable yields the same batches in the same
    order every time it is iterated (a list, a seeded sampler)."""

    def __init__(self, forge: "Forge", source: Any, datafusion: bool) -> None:
        self._forge, self.source, self._dfl = forge, source, datafusion
        self._epoch, self._next = 0, 0

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        it = iter(self.source)
        stats = self._forge._stats
        if not self._dfl:
            for _ in range(self._next):  # a resumed position: these batches were trained on
                try:
                    next(it)
                except StopIteration:
                    raise ForgeError(f"the loader's saved position (batch {self._next} of epoch "
                                     f"{self._epoch}) is past the end of its iterable") from None
        while True:
            t0 = time.perf_counter()
            if stats["t_first"] is None:
                stats["t_first"] = t0
            try:
                batch = next(it)
            except StopIteration:
                break
            if not self._dfl:
                batch = self._forge._to_device(batch)
            stats["data_wait_s"] += time.perf_counter() - t0
            if not self._dfl:
                self._next += 1
            yield batch
        if not self._dfl:
            self._epoch, self._next = self._epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (a DataFusionLoader reshuffles by it)."""
        if self._dfl:
            self.source.set_epoch(epoch)
        elif int(epoch) != self._epoch:
            self._epoch, self._next = int(epoch), 0

    def state_dict(self) -> Dict[str, int]:
        """The position: the next batch handed out. Saved after an epoch's last batch (inside
        the loop's body), it is the start of the next epoch."""
        if self._dfl:
            st = dict(self.source.state_dict())
            if st["next_batch"] >= st["batches_per_epoch"]:
                st.update(epoch=st["epoch"] + 1, next_batch=0)
            return st
        epoch, nxt = self._epoch, self._next
        try:
            if nxt >= len(self.source):
                epoch, nxt = epoch + 1, 0
        except TypeError:  # an iterable without len(): the position as it is
            pass
        return {"epoch": epoch, "next_batch": nxt}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._dfl:
            try:
                self.source.load_state_dict(dict(state))
            except (ValueError, KeyError) as e:
                raise ForgeError(f"forge.load(): the loader's saved position does not fit this "
                                 f"loader: {e}") from None
            return
        try:
            self._epoch, self._next = int(state["epoch"]), int(state["next_batch"])
        except (KeyError, TypeError, ValueError) as e:
            raise ForgeError(f"forge.load(): malformed loader position {state!r} ({e})") from None

    def close(self) -> None:
        if self._dfl:
            self.source.close()


class _SyncAdapter:
    """What GraphedStep asks of a trainer's sync (its capture_no_sync): NexusSync's hooks must not
    run while backward is captured (Note [Graphs and NexusSync] in docs/trainer.md)."""

    kind = "nexussync"

    def __init__(self, nexus: Any) -> None:
        self.nexus = nexus

    def capture_no_sync(self) -> Any:
        return self.nexus.no_sync()


class Forge:
    """LoongForge for a user's own model and loop (module docstring, docs/adopting.md).

    Args:
        device: "auto" (CUDA when torch sees a GPU), "cpu" or "cuda" (the GPU of LOCAL_RANK).
        precision: "fp32", or "bf16": forward under bf16 autocast and the frozen linear/conv
            weights stored in bf16 (CUDA only; trainable weights and optimizer state stay fp32).
        ckpt_dir: where save() and load() keep checkpoints (a CheckpointVault in ckpt_dir/vault).
        keep_last: checkpoints kept (0: all).
        log: one-line logger (default: print to stderr, rank 0 only).
    """

    OPTIONS = ("device", "precision", "ckpt_dir", "keep_last", "log")

    def __init__(self, device: str = "auto", precision: str = "fp32",
                 ckpt_dir: Optional[str] = None, **options: Any) -> None:
        _check_options("Forge()", dict(options, device=device, precision=precision,
                                       ckpt_dir=ckpt_dir), self.OPTIONS)
        if device not in _DEVICES:
            raise ForgeError(f"Forge(device={device!r}): device must be one of "
                             f"{', '.join(_DEVICES)}")
        if precision not in _PRECISIONS:
            raise ForgeError(f"Forge(precision={precision!r}): precision must be one of "
                             f"{', '.join(_PRECISIONS)}")
        keep_last = options.get("keep_last", 0)
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ForgeError(f"Forge(keep_last={keep_last!r}): an integer >= 0 (0: keep all)")
        try:
            rank, world, _ = ranks_from_env()
        except ValueError as e:
            raise ForgeError(f"Forge(): RANK / WORLD_SIZE / LOCAL_RANK must be integers ({e})"
                             ) from None
        if world < 1 or not 0 <= rank < world:
            raise ForgeError(f"Forge(): RANK={rank} is not a rank of WORLD_SIZE={world}")
        if precision == "bf16" and (device == "cpu" or (device == "auto"
                                                          and not torch.cuda.is_available())):
            raise ForgeError("Forge(precision='bf16') needs CUDA: bf16 autocast and bf16 frozen "
                             "weights run on the GPU (on the CPU use precision='fp32')")
        try:
            self.dist: Dist = setup_dist(device)
        except TrainError as e:
            raise ForgeError(f"Forge(device={device!r}): {str(e).replace('--device', 'device')}"
                             ) from None
        self.device = self.dist.device
        self.rank, self.world_size = self.dist.rank, self.dist.world
        self.precision = precision
        self.ckpt_dir = None if ckpt_dir is None else str(ckpt_dir)
        self.keep_last = keep_last
        user_log = options.get("log")
        self._log = user_log or (lambda m: print(m, file=sys.stderr, flush=True)
                                 if self.dist.is_main else None)
        self.model: Optional[torch.nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self._nexus: Any = None
        self._params: List[torch.nn.Parameter] = []
        self._loaders: List[ForgeLoader] = []
        self._pending_loader_states: List[Dict[str, Any]] = []
        self._steps: List["_Step"] = []
        self._blocks: Optional[CompiledBlocks] = None
        self._blocks_state = ""
        self._arena_state = ""
        self._ckpt: Optional[Checkpointer] = None
        self._resumed = False
        self._last_saved: Optional[int] = None
        self._closed = False
        self._stats: Dict[str, Any] = {"t_first": None, "t_last": None, "data_wait_s": 0.0,
                                       "comm_exposed_s": 0.0, "ckpt_stall_s": 0.0, "steps": 0,
                                       "samples": 0, "saves": 0}
        if self.device.type == "cuda":
            with contextlib.suppress(RuntimeError):
                torch.cuda.reset_peak_memory_stats(self.device)

    # ---- model ---------------------------------------------------------------------------------

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              arena: str = "auto") -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Moves `model` to the device (in place: the optimizer's parameters stay the same
        objects), stores frozen linear/conv weights in bf16 with precision="bf16", and with world
        size > 1 copies rank 0's parameters and buffers to every rank and puts NexusSync on the
        gradients. Returns the same model and optimizer.

        arena: MemSculptor's persistent arena (Note [The persistent arena] in memory.py): the
        parameters and buffers in one planned allocation, and an Adam/AdamW optimizer's state made
        now in a second one, instead of one allocator block per tensor; the values are the same,
        the device's reserved bytes for them are the bytes they take, and a checkpoint load
        copies into the same tensors. "auto": on CUDA; "on": also on the CPU; "off"."""
        self._check_open("setup")
        if arena not in ("auto", "on", "off"):
            raise ForgeError(f"forge.setup(arena={arena!r}): one of auto, on, off")
        if self.model is not None:
            raise ForgeError("forge.setup() was already called: one Forge trains one model (make "
                             "another Forge for another model)")
        if not isinstance(model, torch.nn.Module):
            raise ForgeError(f"forge.setup(model, optimizer): model must be a torch.nn.Module, "
                             f"got {_what(model)}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ForgeError("forge.setup(model, optimizer): optimizer must be a "
                             f"torch.optim.Optimizer, got {_what(optimizer)}")
        own = {id(p) for p in model.parameters()}
        opt_params = [p for g in optimizer.param_groups for p in g["params"]]
        foreign = [p for p in opt_params if id(p) not in own]
        if foreign:
            raise ForgeError(f"forge.setup(): the optimizer holds {len(foreign)} tensor(s) that "
                             "are not parameters of the model (build the optimizer from "
                             "model.parameters())")
        if self.precision == "bf16":  # before the copy: half the bytes cross to the device
            for m in model.modules():
                if isinstance(m, _BF16_LAYERS):
                    for p in m.parameters(recurse=False):
                        if not p.requires_grad:
                            p.data = p.data.to(torch.bfloat16)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ForgeError("forge.setup(): the model has no trainable parameters")
        use_arena = arena == "on" or (arena == "auto" and self.device.type == "cuda")
        if use_arena:
            self._arena_state = self._into_arena(model, optimizer)
        else:
            self._arena_state = ("off (arena='off')" if arena == "off" else
                                 "off (the CPU keeps torch's blocks; arena='on' packs there too)")
        model.to(self.device)  # what the arena did not take (nothing, when it is on)
        if self.world_size > 1:
            from .comm import NexusSync

            self._nexus = NexusSync(model, broadcast_from=0)
        self.model, self.optimizer = model, optimizer
        return model, optimizer

    def _into_arena(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
        """setup(arena=...): parameters and buffers into one allocation on the device, then an
        Adam/AdamW optimizer's fresh state into another (init_optimizer_state: torch's own first
        step at learning rate 0 checks the layout). Returns the report's description."""
        from .memory import init_optimizer_state, pack_into_arena

        def alloc(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.uint8, device=self.device)

        buf = pack_into_arena(list(model.parameters()) + list(model.buffers()), self.device,
                              alloc)
        parts = [f"parameters and buffers {buf.numel() / 2**20:.1f} MiB in one allocation"]
        groups = optimizer.param_groups
        if optimizer.state:
            parts.append("the optimizer already has state: left where it is")
        elif type(optimizer).__name__ not in ("Adam", "AdamW") or \
                any(g.get("amsgrad") for g in groups):
            parts.append(f"{type(optimizer).__name__}'s state made by torch at its first step "
                         "(the arena lays out Adam/AdamW without amsgrad)")
        else:
            init_optimizer_state(optimizer, contextlib.nullcontext, arena_alloc=alloc)
            ts = [v for st in optimizer.state.values() for v in st.values()
                  if torch.is_tensor(v) and v.device == buf.device and v.dim() > 0]
            n = sum(t.numel() * t.element_size() for t in ts)
            ptrs = {storage_ptr(t) for t in ts}
            parts.append(f"optimizer state {n / 2**20:.1f} MiB in "
                         + ("one allocation" if len(ptrs) == 1 else f"{len(ptrs)} blocks"))
        return "on (" + "; ".join(parts) + ")"

    # ---- data ----------------------------------------------------------------------------------

    def loader(self, source: Any, batch_size: Optional[int] = None, **options: Any) -> ForgeLoader:
        """A packed DB path (str or os.PathLike) -> a DataFusionLoader of this rank's shard
        (rank / world_size from the process group), batches on the device; `options` are
        DataFusionLoader's (loongforge.data.loader_options()). Any other iterable of dict batches
        -> the same batches moved to the device (no sharding: each rank gives its own)."""
        self._check_open("loader")
        if isinstance(source, (str, os.PathLike)):
            if batch_size is None:
                raise ForgeError(f"forge.loader({str(source)!r}): pass batch_size= (samples per "
                                 "batch on each rank)")
            for k in ("rank", "world_size", "device"):
                if k in options:
                    raise ForgeError(f"forge.loader(): {k!r} is set by the Forge (rank "
                                     f"{self.rank} of {self.world_size} on {self.device}); "
                                     "leave it out")
            from .data import DataFusionLoader

            try:
                src = DataFusionLoader(str(source), batch_size, device=self.device,
                                       rank=self.rank, world_size=self.world_size, **options)
            except TypeError as e:
                raise ForgeError(f"forge.loader(): {e}") from None
            wrapped = ForgeLoader(self, src, datafusion=True)
        else:
            if batch_size is not None or options:
                raise ForgeError("forge.loader(iterable): batch_size and loader options apply "
                                 "to a packed DB path only (the iterable's batches are used as "
                                 "they are)")
            if isinstance(source, Mapping) or not hasattr(source, "__iter__"):
                raise ForgeError("forge.loader(source): source must be a packed DB path or an "
                                 f"iterable of dict batches, got {_what(source)}")
            wrapped = ForgeLoader(self, source, datafusion=False)
        i = len(self._loaders)
        self._loaders.append(wrapped)
        if i < len(self._pending_loader_states):  # load() ran before this loader was made
            wrapped.load_state_dict(self._pending_loader_states[i])
        return wrapped

    def _to_device(self, batch: Any) -> Dict[str, Any]:
        if not isinstance(batch, Mapping):
            raise ForgeError(f"forge.loader(iterable): every batch must be a dict of tensors, "
                             f"got {_what(batch)}")
        nb = self.device.type == "cuda"
        return {k: (v.to(self.device, non_blocking=nb) if isinstance(v, torch.Tensor) else v)
                for k, v in batch.items()}

    # ---- the step ------------------------------------------------------------------------------

    STEP_OPTIONS = ("clip", "graphs", "compile_blocks", "compile_scope", "warmup", "max_graphs",
                    "max_nonfinite")

    def compile_step(self, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                     **options: Any) -> "_Step":
        """step(batch) -> loss: forward and backward of loss_fn(model, batch), gradient sync,
        clipping, optimizer.step() and zeroing the gradients, in one call; a step whose loss or
        gradient norm is not finite changes nothing and is counted (report()['skipped_nonfinite']).

        Options: clip (max gradient L2 norm; 0: none), graphs ("auto": CUDA graphs on CUDA, eager
        on the CPU; "on" requires CUDA; "off"), compile_blocks ("auto": on CUDA with torch >= 2,
        torch.compile each repeated block of the model in place, the layers an nn.ModuleList
        holds (Note [Repeated blocks] in blocks.py), so their fused kernels run inside the step's
        graph; "on" requires torch.compile; "off"; the blocks get their forward back at close()),
        compile_scope ("owner", the default: the module holding each block list, compiled whole,
        which also traces the code between the blocks, such as a transformers model's attention
        mask; "block": each block alone, less compile time; "model": the whole model), warmup (eager steps of a batch shape before its
        graph is captured, default 3), max_graphs (batch shapes captured at most, default 8),
        max_nonfinite (after this many skipped steps in a row the step raises NonFiniteError, so a
        diverged run ends instead of skipping forever; default 3, 0: never). The count is read
        without a host sync, so on CUDA the error comes up to a step after the step that reached
        it; the weights are those of the last finite step either way.
        The loss returned is this rank's, a new tensor each step."""
        self._check_open("compile_step")
        _check_options("forge.compile_step()", options, self.STEP_OPTIONS)
        if self.model is None:
            raise ForgeError("forge.compile_step() before forge.setup(model, optimizer): set the "
                             "model up first")
        if not callable(loss_fn):
            raise ForgeError(f"forge.compile_step(loss_fn): loss_fn must be callable "
                             f"(model, batch) -> loss, got {_what(loss_fn)}")
        clip = options.get("clip", 0.0)
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip >= 0:
            raise ForgeError(f"compile_step(clip={clip!r}): a number >= 0 (0: no clipping)")
        graphs = _auto_on_off(options, "graphs")
        if graphs == "on" and self.device.type != "cuda":
            raise ForgeError("compile_step(graphs='on') needs CUDA (on the CPU every step runs "
                             "eager; use graphs='auto')")
        defaults = {"warmup": 3, "max_graphs": 8, "max_nonfinite": 3}
        for k, lo in (("warmup", 1), ("max_graphs", 1), ("max_nonfinite", 0)):
            v = options.get(k, defaults[k])
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ForgeError(f"compile_step({k}={v!r}): an integer >= {lo}")
        scope = options.get("compile_scope", "owner")
        if scope not in SCOPES:
            raise ForgeError(f"compile_step(compile_scope={scope!r}): one of {', '.join(SCOPES)}")
        self._compile_blocks(_auto_on_off(options, "compile_blocks"), scope)
        step = _Step(self, loss_fn, float(clip), graphs != "off" and self.device.type == "cuda",
                     int(options.get("warmup", 3)), int(options.get("max_graphs", 8)),
                     int(options.get("max_nonfinite", 3)))
        self._steps.append(step)
        return step

    def _compile_blocks(self, mode: str, scope: str) -> None:
        """Compiles the model's repeated blocks once per Forge (compile_step's compile_blocks)."""
        if self._blocks is not None:
            return
        if mode == "off":
            self._blocks_state = "off (compile_blocks='off')"
            return
        why = unavailable_reason()
        if not why and mode == "auto" and self.device.type != "cuda":
            why = "the CPU runs eager (compile_blocks='on' compiles there too)"
        if not why and not find_blocks(self.model):  # type: ignore[arg-type]
            why = "the model holds no nn.ModuleList of two or more modules of one class"
        if why:
            if mode == "on":
                raise ForgeError(f"compile_step(compile_blocks='on'): {why}")
            self._blocks_state = f"off ({why})"
            return
        self._blocks = CompiledBlocks(self.model, scope=scope)  # type: ignore[arg-type]
        self._blocks_state = (f"on ({self._blocks.describe()}; scope {scope}; each compiled in a "
                              "batch shape's first warm-up step)")
        self._log(f"[forge] compile_step: compiled blocks {self._blocks_state}")

    # ---- checkpoints ---------------------------------------------------------------------------

    def _checkpointer(self, what: str, resume: bool) -> Checkpointer:
        if self.ckpt_dir is None:
            raise ForgeError(f"forge.{what}() needs Forge(ckpt_dir=...)")
        if self._ckpt is not None:
            return self._ckpt
        run_file = os.path.join(self.ckpt_dir, Checkpointer.RUN_FILE)
        if os.path.exists(run_file):
            try:
                with open(run_file) as f:
                    theirs = json.load(f)  # data only
            except (OSError, ValueError) as e:
                raise ForgeError(f"ckpt_dir {self.ckpt_dir}: unreadable {run_file} ({e}); use "
                                 "another ckpt_dir") from None
            if isinstance(theirs, dict) and theirs.get("mode") == "forge" and \
                    theirs.get("world_size") != self.world_size:
                raise ForgeError(
                    f"ckpt_dir {self.ckpt_dir} holds checkpoints of {theirs.get('world_size')} "
                    f"rank(s); this run has {self.world_size}: resuming with another world size "
                    "is not supported (each rank's loader shard and RNG states are saved per "
                    "rank); use the same number of ranks, or another ckpt_dir")
        if not resume and os.path.isdir(self.ckpt_dir) and \
                Checkpointer._has_checkpoints(self.ckpt_dir):
            raise ForgeError(f"forge.save(): ckpt_dir {self.ckpt_dir} already holds checkpoints "
                             "of a run: call forge.load() first to resume it, or use another "
                             "ckpt_dir")
        try:
            ck = Checkpointer("vault", self.ckpt_dir, self.dist,
                              run_id={"mode": "forge", "world_size": self.world_size},
                              when_busy="wait", log=self._log, resume=True)
        except TrainError as e:
            raise ForgeError(str(e).replace("--ckpt-dir", "ckpt_dir")) from None
        if ck.vault is not None and self.keep_last:
            from .ckpt import CheckpointVault

            ck.vault.close()
            ck.vault = CheckpointVault(os.path.join(self.ckpt_dir, "vault"),
                                       keep_last=self.keep_last)
        self._ckpt = ck
        return ck

    def save(self, step: int, extra: Optional[Dict[str, Any]] = None) -> None:
        """Checkpoints step `step` (an integer greater than every step saved before): the model
        and optimizer (rank 0's: every rank holds the same after sync), and every rank's loader
        positions, RNG states and `extra` (a dict of tensors, numbers, strings, lists and dicts),
        in one atomic commit. Collective: every rank calls it at the same step. The write runs in
        the background; the next save, load() or close() waits for it."""
        self._check_open("save")
        if self.model is None:
            raise ForgeError("forge.save() before forge.setup(model, optimizer): nothing to save "
                             "yet")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ForgeError(f"forge.save(step={step!r}): step must be an integer >= 0")
        if extra is not None and not isinstance(extra, dict):
            raise ForgeError(f"forge.save(extra=...): a dict, got {_what(extra)}")
        try:  # on every rank: the vault (rank 0's) would refuse it on rank 0 alone
            _encode_state(extra or {})
        except TypeError as e:
            raise ForgeError(f"forge.save(extra=...): {str(e).replace('checkpoint state ', '')}"
                             ) from None
        ck = self._checkpointer("save", resume=self._resumed)
        # Checked here, on every rank: the vault (rank 0's) would refuse it only on rank 0.
        if self._last_saved is not None and step <= self._last_saved:
            raise ForgeError(f"forge.save({step}): step {self._last_saved} is already saved in "
                             f"{self.ckpt_dir}; steps must increase")
        t = time.perf_counter()
        assert self.optimizer is not None
        state = {"step": step, "model": self.model.state_dict(),
                 "optimizer": self.optimizer.state_dict(),
                 "loaders": [ld.state_dict() for ld in self._loaders],
                 "rng": rng_state(torch.default_generator),
                 "extra": dict(extra or {})}
        try:
            ck.save(step, state, self.model, self.optimizer)
        except TypeError as e:  # the vault names the key path of what it cannot hold
            raise ForgeError(f"forge.save(): {e}") from None
        self._resumed = True  # this directory is now this run's
        self._last_saved = step
        self._stats["ckpt_stall_s"] += time.perf_counter() - t
        self._stats["saves"] += 1

    def load(self, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """Resumes from the latest checkpoint in ckpt_dir: restores the model, the optimizer, the
        loaders' positions (loaders made later get theirs when forge.loader() makes them) and
        the RNG states. Returns {"step": saved step, "extra": that rank's extra}, or None when
        ckpt_dir holds no checkpoint (a fresh start). Collective. `step` must be None (loading
        an older step is done with CheckpointVault directly)."""
        self._check_open("load")
        if self.model is None:
            raise ForgeError("forge.load() before forge.setup(model, optimizer): set the model "
                             "up first, then load restores it")
        if step is not None:
            raise ForgeError("forge.load(step=...): only the latest checkpoint is resumed")
        ck = self._checkpointer("load", resume=True)
        self._resumed = True
        if ck.vault is not None:
            ck.vault.wait()  # this run's own saves are committed before any rank reads
        if self.world_size > 1:
            dist.barrier()
        try:
            state = ck.latest()
        except TrainError as e:
            raise ForgeError(f"forge.load(): {str(e).replace('--resume: ', '')}") from None
        if state is None:
            return None
        self._last_saved = int(state["step"])
        if "rng" not in state or "loaders" not in state:
            raise ForgeError(f"forge.load(): the latest checkpoint in {self.ckpt_dir} was not "
                             "written by Forge.save")
        assert self.optimizer is not None
        with torch.no_grad():
            self.model.load_state_dict(state["model"])
        before = {p: dict(st) for p, st in self.optimizer.state.items()}
        self.optimizer.load_state_dict(state["optimizer"])
        state_back_into_place(self.optimizer, before)  # state made in the arena stays there
        positions = list(state["loaders"])
        for ld, st in zip(self._loaders, positions):
            ld.load_state_dict(st)
        self._pending_loader_states = positions
        try:
            set_rng_state(state["rng"], torch.default_generator)
        except TrainError as e:
            raise ForgeError(f"forge.load(): {str(e).replace('--resume: ', '')}") from None
        return {"step": int(state["step"]), "extra": state.get("extra", {})}

    # ---- figures -------------------------------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        """Figures so far: steps, samples/s (and tokens/s when batches carry an attention_mask),
        the fraction of the time the loop waited for data, exposed communication (the wait for
        gradient sync after backward), checkpoint stall (time save() blocked), skipped
        non-finite steps, CUDA-graph state, and peak memory (CUDA: torch's peak allocated; CPU:
        the process's peak resident set). Times are host wall-clock between the loop's first
        batch request and the last step's end; reading them synchronizes the device once."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        st = self._stats
        elapsed = (st["t_last"] - st["t_first"]) if st["t_first"] is not None and \
            st["t_last"] is not None else 0.0
        tokens = sum(int(s._tokens.item()) for s in self._steps if s._tokens is not None)
        skipped = sum(int(s._skipped.item()) for s in self._steps if s._skipped is not None)
        out: Dict[str, Any] = {
            "steps": st["steps"], "samples": st["samples"], "elapsed_s": elapsed,
            "samples_per_s": st["samples"] / elapsed if elapsed > 0 else 0.0,
            "data_wait_s": st["data_wait_s"],
            "data_wait_fraction": min(1.0, st["data_wait_s"] / elapsed) if elapsed > 0 else 0.0,
            "comm_exposed_s": st["comm_exposed_s"], "ckpt_stall_s": st["ckpt_stall_s"],
            "ckpt_saves": st["saves"], "skipped_nonfinite": skipped,
            "world_size": self.world_size, "device": str(self.device),
        }
        if any(s._tokens is not None for s in self._steps):
            out["tokens"] = tokens
            out["tokens_per_s"] = tokens / elapsed if elapsed > 0 else 0.0
        if self._steps:
            out["cuda_graphs"] = [s.graph_state() for s in self._steps]
            out["compiled_blocks"] = self._blocks_state
        if self.model is not None:
            out["persistent_arena"] = self._arena_state
        if self.device.type == "cuda":
            out["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
            out["peak_memory_kind"] = "cuda max_memory_allocated"
        else:
            out["peak_memory_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                           ) * 1024
            out["peak_memory_kind"] = "process peak RSS"
        if self._ckpt is not None and self._ckpt.vault is not None:
            self._ckpt._poll()
            out["ckpt_bytes_written"] = self._ckpt.bytes_written
        return out

    # ---- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Waits for the checkpoint writer (a save in flight is committed), stops the loaders'
        threads, removes NexusSync's hooks, releases the CUDA graphs and gives compiled blocks
        their forward back. Idempotent; the Forge cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._ckpt is not None:
            self._ckpt.close()
        for ld in self._loaders:
            ld.close()
        for s in self._steps:
            s.release()
        if self._blocks is not None:
            self._blocks.restore()
        if self._nexus is not None:
            self._nexus.close()
            self._nexus = None

    def __enter__(self) -> "Forge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ForgeError(f"forge.{what}() after forge.close(): make a new Forge")


class _Step:
    """What compile_step returns (Forge.compile_step)."""

    def __init__(self, forge: Forge, loss_fn: Callable[..., torch.Tensor], clip: float,
                 graphs: bool, warmup: int, max_graphs: int, max_nonfinite: int) -> None:
        self.forge, self.loss_fn, self.clip = forge, loss_fn, clip
        self.max_nonfinite = max_nonfinite
        self._fallback: Optional[str] = None
        self._noted_eager = False
        self._messages: List[str] = []
        autocast = torch.bfloat16 if forge.precision == "bf16" else None
        self._runner = _ForgeGraphedStep(
            forge.model, forge.device, loss_fn, warmup=warmup, graphs=graphs,
            sync=_SyncAdapter(forge._nexus) if forge._nexus is not None else None,
            autocast_dtype=autocast, max_graphs=max_graphs, log=self._graph_log,
            # One microbatch a step: without NexusSync's flat buckets the first graph makes the
            # gradients in its pool and assigns them, instead of adding into zeroed gradients
            # held beside it (one kernel and one read of every gradient fewer per step, and no
            # gradients during the forward: Note [Gradients in the graph pool] in graphs.py).
            grads_in_pool=forge._nexus is None)
        self._graphs = graphs
        self._acc = torch.zeros(6, device=forge.device)
        self._skipped: Optional[torch.Tensor] = None
        self._tokens: Optional[torch.Tensor] = None
        # Skipped steps in a row, on the device; read through a pinned copy and an event, so the
        # check adds no host sync (Note [Non-finite steps] in trainer/optim.py).
        self._in_a_row = torch.zeros((), device=forge.device)
        cuda = forge.device.type == "cuda"
        self._in_a_row_host = torch.zeros((), pin_memory=cuda)
        self._in_a_row_event = torch.cuda.Event() if cuda else None
        self._in_a_row_pending = False
        self._steps_done = 0

    def _graph_log(self, msg: str) -> None:
        """GraphedStep's log lines. A failed capture (or graphs unavailable) turns graphs off for
        every later step, printed once with the reason; a batch shape that runs eager for a
        reason of its own (more shapes than max_graphs) is printed once, the others keep their
        graphs."""
        self._messages.append(msg)
        reason = msg.split("runs eager: ", 1)[-1] if "runs eager: " in msg else \
            msg.split("graphs off: ", 1)[-1]
        if "capture failed" in msg or "graphs off" in msg:
            if self._fallback is None:
                self._fallback = reason
                self.forge._log(f"[forge] compile_step: CUDA graphs off, every step runs eager "
                                f"from here on ({reason})")
        elif "runs eager" in msg and not self._noted_eager:
            self._noted_eager = True
            self.forge._log(f"[forge] compile_step: a batch shape runs eager ({reason}); the "
                            "shapes already captured keep their graphs")

    def graph_state(self) -> Dict[str, Any]:
        s = self._runner.stats() if self._runner.model is not None else {}
        return {"enabled": self._graphs and self._fallback is None,
                "captures": s.get("captures", 0), "replays": s.get("replays", 0),
                "fallback_reason": self._fallback or ""}

    def release(self) -> None:
        self._runner.release()

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        f = self.forge
        f._check_open("step")
        if not isinstance(batch, Mapping):
            raise ForgeError(f"step(batch): batch must be a dict, got {_what(batch)}")
        t0 = time.perf_counter()
        st = f._stats
        if st["t_first"] is None:
            st["t_first"] = t0
        model, opt = f.model, f.optimizer
        assert model is not None and opt is not None
        r = self._runner
        if self._fallback is not None or not self._graphs:
            out = r._eager(dict(batch), None, 1.0)
        elif any(not isinstance(v, torch.Tensor) for k, v in batch.items()
                 if k not in _TEXT_KEYS):
            self._graph_log("[cuda-graph] batch runs eager: it holds values that are not "
                            "tensors (a graph replays with the tensors it captured)")
            out = r._eager(dict(batch), None, 1.0)
        else:
            # A DataFusion batch's text ('task') is not a graph input: the graphed loss_fn sees
            # the tensors only (graphs="off" for a loss_fn that reads the text).
            out = r({k: v for k, v in batch.items() if k not in _TEXT_KEYS}, None, 1.0)
            if r.capture_failures and self._fallback is None:
                self._graph_log("[cuda-graph] runs eager: " + r.capture_failures[-1])
        loss = out["loss"].clone()
        acc = self._acc
        acc.zero_()
        acc[0] = loss.float()
        if f._nexus is not None:
            tc = time.perf_counter()
            f._nexus.finish()
            st["comm_exposed_s"] += time.perf_counter() - tc
            # The skip decision must be every rank's (Note [Non-finite steps]): the mean loss.
            dist.all_reduce(acc[:1])
            acc[:1] /= f.world_size
        optimizer_step(opt, f._params, self.clip, acc)
        self._skipped = acc[5].clone() if self._skipped is None else self._skipped + acc[5]
        self._steps_done += 1
        if self.max_nonfinite:
            self._in_a_row.mul_(acc[5]).add_(acc[5])
            self._check_in_a_row()
        if f._nexus is not None:
            f._nexus.zero_grad()
        else:
            opt.zero_grad(set_to_none=not r.keeps_grads)
        st["steps"] += 1
        st["samples"] += _rows(batch)
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            n = mask.sum().to(torch.int64)
            self._tokens = n if self._tokens is None else self._tokens + n
        st["t_last"] = time.perf_counter()
        return loss


    def _check_in_a_row(self) -> None:
        """Raises ForgeError once max_nonfinite skipped steps in a row are seen. On CUDA the
        count read is the newest one whose copy to the host has completed (event.query(), never
        a wait); on the CPU it is this step's."""
        ev = self._in_a_row_event
        if ev is None:
            n, at = int(self._in_a_row.item()), self._steps_done
        else:
            n, at = 0, 0
            if self._in_a_row_pending and ev.query():
                n, at = int(self._in_a_row_host.item()), self._copied_at
                self._in_a_row_pending = False
            if not self._in_a_row_pending:
                self._in_a_row_host.copy_(self._in_a_row, non_blocking=True)
                ev.record()
                self._in_a_row_pending, self._copied_at = True, self._steps_done
        if n >= self.max_nonfinite:
            raise NonFiniteError(
                f"step {at} of this compile_step: {n} steps in a row without a finite loss and "
                f"gradient norm (skipped, no update; max_nonfinite={self.max_nonfinite}): the "
                f"weights are those of the last finite step; a smaller learning rate, or clip=")


def _rows(batch: Mapping[str, Any]) -> int:
    size = getattr(batch, "size", None)
    if isinstance(size, int) and size > 0:  # DataFusionBatch: real rows, padding excluded
        return size
    for v in batch.values():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
    return 0
