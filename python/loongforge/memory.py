"""MemSculptor: planned GPU memory for training steps, plugged into torch.

Two surfaces:

* Analysis (any machine, no CUDA needed): build a :class:`Trace` by hand or from torch's memory
  snapshot (:func:`trace_from_snapshot`), then :func:`plan_trace` (offsets, peak vs lower bound)
  and :func:`replay_trace` (fragmentation and latency of MemSculptor's allocator on host memory).
* The allocator (CUDA): :class:`MemSculptor` makes the extension module ``loongforge._C``, which
  hosts it, torch's allocator through ``torch.cuda.memory.CUDAPluggableAllocator`` (globally, before any CUDA allocation) or scoped
  through ``torch.cuda.MemPool`` (torch >= 2.5), records the first N steps, plans them, and serves
  matching steps from the planned arena.

See docs/memory.md.
"""
from __future__ import annotations

import contextlib
import gc
import os
import pickle
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from . import _C
from . import _snapshot_import
from .trainer.errors import TrainError

Trace = _C.MemTrace

# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------

def trace_from_snapshot(snapshot: Dict[str, Any], device: int = 0,
                        step_boundaries: Optional[Sequence[int]] = None,
                        signatures: Optional[Sequence[str]] = None) -> "Trace":
    """Converts ``torch.cuda.memory._snapshot()`` (recorded with ``_record_memory_history``) into a
    Trace.

    Uses ``snapshot["device_traces"][device]``: ``alloc`` starts an allocation, ``free_requested``
    ends it (the program freed it; ``free_completed`` only says the caching allocator's events
    passed, so it ends an allocation only when no ``free_requested`` came first). Segment events,
    ``snapshot`` and ``oom`` entries are skipped. Frees of addresses allocated before recording
    began count as foreign frees.

    ``step_boundaries``: indices into that device trace where a new step begins (the whole trace is
    one step when omitted); ``signatures``: one shape signature per step. Times are nanoseconds
    from the first timed entry. The same conversion without the compiled module:
    ``loongforge._snapshot_import.snapshot_to_text``.

    Raises ValueError naming the entry for a malformed trace (missing key, unknown device).
    """
    trace = Trace()
    for ev in _snapshot_import.snapshot_events(snapshot, device, step_boundaries, signatures):
        if ev[0] == "a":
            trace.add_alloc(ev[1], ev[2], ev[3], ev[4])
        elif ev[0] == "f":
            trace.add_free(ev[1], ev[2], ev[3])
        else:
            trace.mark_step(ev[2], ev[1])
    return trace


class _DataOnlyUnpickler(pickle.Unpickler):
    """torch writes memory snapshots as pickles of plain dicts, lists, strings and numbers. A
    pickle can name any global to call while loading; this one refuses every global, so a
    snapshot file can only ever build data."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names the global {module}.{name} (a memory snapshot "
                                     "holds plain data only; refused, it could run code)")


def load_snapshot(path: str) -> Dict[str, Any]:
    """Loads a snapshot written by ``torch.cuda.memory._dump_snapshot(path)`` (a pickle of plain
    data, read without resolving any global: ValueError naming the file otherwise)."""
    with open(path, "rb") as f:
        try:
            snap = _DataOnlyUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
                KeyError, AttributeError, MemoryError, RecursionError) as e:
            raise ValueError(f"memory snapshot {path}: not loadable: {e}") from None
    if not isinstance(snap, dict):
        raise ValueError(f"memory snapshot {path}: holds a {type(snap).__name__}, not a dict")
    return snap


def snapshot_reserved_bytes(snapshot: Dict[str, Any], device: int = 0) -> int:
    """Bytes torch's caching allocator had reserved (sum of segment sizes) at snapshot time."""
    return sum(int(s.get("total_size", 0)) for s in snapshot.get("segments", [])
               if int(s.get("device", 0)) == device)


def plan_trace(trace: "Trace", with_layout: bool = False) -> Dict[str, Any]:
    """Plans every step of ``trace``.

    Returns ``{"steps": [per-step dict], "peak_bytes": max plan peak, "lower_bound_bytes": max
    lower bound, "overhead": (peak - bound) / bound}``. A per-step dict has signature, algorithm
    (the better of greedy_by_size / greedy_by_breadth), allocations, planned (those freed within
    the step), peak_bytes, lower_bound_bytes, other_peak_bytes, overhead, and with ``with_layout``
    the offsets/sizes/begin/end lists for drawing the layout.
    """
    steps = _C.mem_plan_trace(trace, with_layout)
    peak = max((s["peak_bytes"] for s in steps), default=0)
    bound = max((s["lower_bound_bytes"] for s in steps), default=0)
    return {"steps": steps, "peak_bytes": peak, "lower_bound_bytes": bound,
            "overhead": (peak - bound) / bound if bound else 0.0}


def replay_trace(trace: "Trace", planned: bool = True, capacity_bytes: int = 1 << 36,
                 segment_bytes: int = 32 << 20, mode: Optional[str] = None,
                 max_plans: int = 64) -> Dict[str, Any]:
    """Replays ``trace`` through MemSculptor's allocator over host memory (no GPU needed) and
    returns its stats (peak allocated/reserved, fragmentation, planned hits/misses, latency).

    ``mode``: ``"pool"`` (no plans), ``"planned"`` (each signature planned from its largest step
    in the whole trace first) or ``"first_sight"`` (online: each signature planned from its first step,
    as the allocator does for signatures it did not record). When omitted, ``planned`` picks
    ``"planned"`` or ``"pool"``. Raises ValueError for an unknown mode or a malformed trace.
    """
    if mode is None:
        mode = "planned" if planned else "pool"
    return _C.mem_replay(trace, mode, capacity_bytes, segment_bytes, max_plans)


# ---------------------------------------------------------------------------------------------
# The CUDA allocator
# ---------------------------------------------------------------------------------------------

def _plugin() -> Any:
    """The torch allocator's control functions, hosted by _C (None in a build without CUDA)."""
    return getattr(_C, "torch_allocator", None)


def _why_unavailable() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} reports no CUDA device (torch.cuda.is_available() is False)"
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return f"torch {torch.__version__} has no torch.cuda.memory.CUDAPluggableAllocator (need >= 2.0)"
    if _plugin() is None:
        return (f"{_C.__file__} was built without CUDA (the allocator is compiled into it only "
                "when nvcc is found)")
    return None


class MemSculptor:
    """MemSculptor as torch's CUDA allocator.

    Typical use::

        ms = loongforge.MemSculptor()
        ms.install()                       # first thing: before any CUDA tensor exists
        with ms.persistent():
            model = Model().cuda(); opt = ...
        ms.record(steps=3)                 # record the next 3 steps, then plan them
        for batch in loader:
            with ms.step(signature=f"len{batch.padded_len}"):
                loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
        print(ms.stats())
        del model, opt                     # drop the run's tensors, then
        ms.close()                         # return every byte; reports only a real leak

    Out of memory inside ``step()`` raises ``torch.cuda.OutOfMemoryError`` whose text names the
    step's signature and the bytes asked for; the step is abandoned (not planned, not recorded)
    and a following step with a smaller batch runs (docs/memory.md, "Out of memory").

    Thread rules: ``step``/``record`` are called from the training thread; allocations may come
    from any thread (autograd's backward thread included). Allocations made while a stream is
    capturing a CUDA graph are served from the persistent pool and held until
    :meth:`release_graph_memory` (they are never planned): safe, not frugal.
    """

    def __init__(self, device: int = 0, limit_mb: Optional[int] = None) -> None:
        """``limit_mb``: the most device memory the backend reserves, MiB, in place of
        LOONGFORGE_MEM_LIMIT_MB (None: the variable's, or no cap)."""
        self.device = device
        self.limit_mb = None if limit_mb is None else int(limit_mb)
        self._lib: Any = None  # _C.torch_allocator once loaded
        self._allocator = None
        self._pool = None
        self._record_left = 0
        self._trace_path: Optional[str] = None
        self._hook: Optional["StepHook"] = None  # the attached optimizer hook, if any
        self.plans: List[Dict[str, Any]] = []

    @staticmethod
    def available() -> bool:
        """True when torch has CUDA and the pluggable allocator, and the library was built."""
        return _why_unavailable() is None

    def _require(self) -> None:
        why = _why_unavailable()
        if why is not None:
            raise RuntimeError(f"MemSculptor needs CUDA and torch's CUDAPluggableAllocator: {why}. "
                               "The planner and replay (loongforge.plan_trace, replay_trace) work "
                               "without CUDA.")

    def _load(self):
        import torch
        if self._allocator is None:
            # dlopen of the loaded module's own path returns that module: torch allocates through
            # the same per-device allocators the control functions below reach.
            self._allocator = torch.cuda.memory.CUDAPluggableAllocator(
                os.path.abspath(_C.__file__), "lf_alloc", "lf_free")
            apply_limit(self.device, self.limit_mb)
            self._lib = _plugin()
        return self._allocator

    def install(self) -> "MemSculptor":
        """Makes MemSculptor torch's CUDA allocator for the whole process. Must run before any CUDA
        allocation (torch refuses to switch allocators afterwards)."""
        self._require()
        import torch
        alloc = self._load()
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError("MemSculptor.install() must run before the first CUDA allocation "
                               f"(torch said: {e}); use MemSculptor.pool() for a scoped install "
                               "on torch >= 2.5") from None
        return self

    @contextlib.contextmanager
    def pool(self) -> Iterator["MemSculptor"]:
        """Scoped install: allocations inside the block come from MemSculptor (torch >= 2.5)."""
        self._require()
        import torch
        if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
            raise RuntimeError(f"MemSculptor.pool() needs torch.cuda.MemPool (torch >= 2.5); "
                               f"torch {torch.__version__} has none: use install() instead")
        alloc = self._load()
        if self._pool is None:
            self._pool = torch.cuda.MemPool(alloc.allocator())  # the _cuda_CUDAAllocator handle
        with torch.cuda.use_mem_pool(self._pool):
            yield self

    def graph_pool(self) -> Any:
        """A new ``torch.cuda.MemPool`` whose segments come from MemSculptor, for CUDA-graph
        captures: ``torch.cuda.graph(g, pool=ms.graph_pool().id)`` (GraphedStep's ``mem_pool``).
        torch's caching allocator places the captured step's blocks inside the segments and
        reuses a block freed earlier in the same capture; MemSculptor serves each segment from its
        persistent pool and holds it for the graphs' life (Note [Graph capture] in
        src/memory/torch_allocator.cc). Keep the pool alive as long as its graphs."""
        self._require()
        import torch
        if not hasattr(torch.cuda, "MemPool"):
            raise RuntimeError(f"MemSculptor.graph_pool() needs torch.cuda.MemPool (torch >= 2.5); "
                               f"torch {torch.__version__} has none")
        return torch.cuda.MemPool(self._load().allocator())

    def _err(self) -> str:
        return self._lib.last_error()

    @contextlib.contextmanager
    def persistent(self) -> Iterator[None]:
        """Allocations inside the block (parameters, optimizer state, expert weights) go to the
        persistent pool, apart from activations."""
        self._require()
        self._load()
        self._lib.set_persistent(True)
        try:
            yield
        finally:
            self._lib.set_persistent(False)

    def record(self, steps: int = 3, trace_path: Optional[str] = None) -> None:
        """Records the next ``steps`` steps; after the last one, plans each signature's last
        recorded step. ``trace_path`` also writes the trace as text (for ``plan_trace`` later)."""
        if steps < 1:
            raise ValueError(f"record(steps={steps}): need at least one step")
        self._require()
        self._load()
        self._record_left = steps
        self._trace_path = trace_path
        self._lib.start_recording(self.device)

    @contextlib.contextmanager
    def step(self, signature: str = "") -> Iterator[None]:
        """One training step with shape signature ``signature`` (e.g. the padding bucket)."""
        if self._hook is not None:
            raise RuntimeError("MemSculptor.step(): steps are marked by the optimizer hook of "
                               "attach(); remove() it first")
        self._begin_step(signature)
        try:
            yield
        except BaseException as e:
            # A step cut short is neither planned nor recorded (Note [Out of memory in a step]).
            self._abandon_step()
            oom = _as_out_of_memory(e)
            if oom is not e:
                raise oom from e
            raise
        self._end_step()

    # The step marks. Everything that marks steps (step(), the optimizer hook of attach())
    # goes through these, so both produce the same begin/end sequence for the allocator.
    def _begin_step(self, signature: str) -> None:
        self._require()
        self._load()
        try:
            self._lib.begin_step(self.device, signature)
        except MemoryError as e:  # the planned arena did not fit: names the step and the bytes
            raise _oom_error_type()(str(e)) from None
        except RuntimeError as e:
            raise RuntimeError(f"MemSculptor step '{signature}': {e}") from None

    def _abandon_step(self) -> None:
        self._lib.abandon_step(self.device)

    def _end_step(self) -> None:
        import torch
        if not self._lib.end_step(self.device):
            return  # abandoned (it ran out of memory): not a recorded step
        if self._record_left > 0:
            self._record_left -= 1
            if self._record_left == 0:
                torch.cuda.synchronize(self.device)
                try:
                    self.plans = self._lib.stop_recording_and_plan(self.device,
                                                                   self._trace_path or "")
                except (RuntimeError, ValueError, OSError) as e:
                    raise RuntimeError(f"MemSculptor planning failed: {e}") from None

    def attach(self, optimizer: Any, signature: Any = "", model: Any = None) -> "StepHook":
        """Marks steps from ``optimizer.step()``, so a training loop needs no ``step()`` blocks.

        One step is everything between two optimizer steps: with gradient accumulation, all the
        micro-batches before ``optimizer.step()`` are one step, and a step skipped by a
        ``GradScaler`` (inf/NaN gradients) extends the current step. A step ends right after
        ``optimizer.step()`` returns (``register_step_post_hook`` on torch >= 2.0; on older torch
        the instance's ``step`` is wrapped).

        Where the next step begins:

        * without ``model``: right away, when the previous one ends (the first at ``attach``).
          ``signature`` is a string, or a callable with no arguments called at that moment; it
          cannot see the coming batch, so it suits fixed shapes or a sampler that knows its next
          bucket.
        * with ``model`` (an ``nn.Module``): at the first ``model(...)`` call after the previous
          step ended. ``signature`` may then be a callable that receives the forward's positional
          arguments (a tuple) and returns the step's signature, e.g.
          ``lambda args: f"len{args[0].shape[1]}"``. Work between ``optimizer.step()`` and the
          next forward (loading, host-to-device copies) falls outside any step.

        Returns a :class:`StepHook`; its ``remove()`` ends the open step (if any) and detaches
        both hooks. Thread rules as for :meth:`step`: the optimizer and the model run on the
        training thread.
        """
        if self._hook is not None:
            raise RuntimeError("MemSculptor.attach(): already attached to an optimizer; "
                               "remove() that hook first")
        self._hook = StepHook(self, optimizer, signature, model)
        return self._hook

    def stats(self) -> Dict[str, Any]:
        """allocated/reserved/peak bytes, fragmentation (1 - peak allocated / peak reserved),
        largest free block, planned hits/misses, allocation latency (ns)."""
        self._require()
        self._load()
        try:
            return self._lib.stats(self.device)
        except RuntimeError as e:
            raise RuntimeError(f"MemSculptor stats: {e}") from None

    def reset_peaks(self) -> None:
        self._require()
        self._load()
        self._lib.reset_peaks(self.device)

    def release_cached(self) -> None:
        """Returns fully free segments (and an idle arena) to CUDA."""
        self._require()
        self._load()
        self._lib.release_cached(self.device)

    def close(self, graphs_released: bool = False) -> Dict[str, Any]:
        """The orderly end (docs/memory.md, "Shutdown"): call it after dropping the model, the
        optimizer and every other CUDA tensor of the run.

        Detaches an attached optimizer hook, collects garbage, lets torch give back what it caches
        from MemSculptor (the scoped pool's segments, cuBLAS workspaces), then ends any open step
        and returns every cached byte to CUDA. Returns ``{"live_allocations": n, "live_bytes": b,
        "message": text}``; ``n > 0`` is a leak (tensors the caller still holds, or graphs not
        yet released with :meth:`release_graph_memory`), also logged as a warning naming the
        largest. The allocator stays usable (tensors still live can be freed; new allocations
        reserve anew). Without it nothing is reported at exit: the allocator lives as long as
        the process, so tensors freed during interpreter shutdown are freed safely.
        ``graphs_released=True`` says every CUDA graph captured into MemSculptor's memory is
        destroyed: the memory held for them is returned too (:meth:`release_graph_memory`).
        Idempotent; a no-op when the allocator was never loaded.
        """
        if self._hook is not None:
            self._hook.remove()
        self._record_left = 0
        if self._lib is None:
            return {"live_allocations": 0, "live_bytes": 0, "message": ""}
        import torch
        # Scoped install: torch's pool caches our blocks until the pool is released and emptied.
        self._pool = None
        gc.collect()
        torch.cuda.synchronize(self.device)
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        if graphs_released:
            self._lib.release_graph_memory(self.device)
        try:
            n = self._lib.close(self.device)
        except RuntimeError as e:
            raise RuntimeError(f"MemSculptor close: {e}") from None
        live_bytes = self.stats()["allocated_bytes"] if n else 0
        return {"live_allocations": n, "live_bytes": live_bytes, "message": self._err() if n else ""}

    def release_graph_memory(self) -> None:
        """Frees memory held for CUDA graphs captured earlier. Call only after destroying them."""
        self._require()
        self._load()
        self._lib.release_graph_memory(self.device)


def _oom_error_type() -> type:
    """torch.cuda.OutOfMemoryError (a RuntimeError; torch >= 1.13), else RuntimeError."""
    try:
        import torch
    except ImportError:
        return RuntimeError
    return getattr(torch.cuda, "OutOfMemoryError", RuntimeError)


def _as_out_of_memory(e: BaseException) -> BaseException:
    """torch turns lf_alloc's exhaustion into a plain RuntimeError (a plug-in cannot raise
    torch's own type); inside a step it becomes torch.cuda.OutOfMemoryError with the same text, so
    ``except torch.cuda.OutOfMemoryError`` works as with torch's allocator. Others: ``e``."""
    oom = _oom_error_type()
    if (isinstance(e, RuntimeError) and not isinstance(e, oom)
            and "out of memory (MemSculptor" in str(e)):
        return oom(str(e))
    return e


class StepHook:
    """Marks MemSculptor steps from an optimizer's steps; made by :meth:`MemSculptor.attach`.

    ``steps`` counts the steps ended so far; ``remove()`` ends the open step and detaches.
    Usable as a context manager (``with ms.attach(opt): ...`` removes at exit).
    """

    def __init__(self, sculptor: MemSculptor, optimizer: Any, signature: Any, model: Any) -> None:
        if not hasattr(optimizer, "step") or not callable(optimizer.step):
            raise TypeError(f"MemSculptor.attach: {type(optimizer).__name__} has no step() method")
        if not (isinstance(signature, str) or callable(signature)):
            raise TypeError("MemSculptor.attach: signature must be a string or a callable, not "
                            f"{type(signature).__name__}")
        self._ms = sculptor
        self._signature = signature
        self._optimizer = optimizer
        self._open = False
        self._removed = False
        self._handles: List[Any] = []
        self._wrapper = None
        self._model_hooked = model is not None
        self.steps = 0
        if hasattr(optimizer, "register_step_post_hook"):  # torch >= 2.0
            self._handles.append(optimizer.register_step_post_hook(
                lambda opt, args, kwargs: self._on_optimizer_step()))
        else:
            # torch < 2.0: wrap this instance's step. The wrapper checks _removed instead of being
            # unwound, because something (an LR scheduler) may have wrapped it in turn since.
            inner = optimizer.step

            def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
                out = inner(*args, **kwargs)
                if not self._removed:
                    self._on_optimizer_step()
                return out

            # A bound method, as LR schedulers expect when they wrap step() in turn.
            self._wrapper = types.MethodType(step, optimizer)
            optimizer.step = self._wrapper
        if model is not None:
            self._handles.append(model.register_forward_pre_hook(
                lambda module, args: self._on_forward(args)))
        else:
            try:
                self._begin(())
            except BaseException:
                self.remove()  # no half-attached hook when the first mark fails (no CUDA)
                raise

    def _begin(self, args: tuple) -> None:
        if callable(self._signature):
            sig = self._signature(args) if self._model_hooked else self._signature()
            if not isinstance(sig, str):
                raise TypeError(f"MemSculptor.attach: the signature callable returned "
                                f"{type(sig).__name__}, not str")
        else:
            sig = self._signature
        self._ms._begin_step(sig)
        self._open = True

    def _on_forward(self, args: tuple) -> None:
        if not self._open and not self._removed:
            self._begin(args)

    def _on_optimizer_step(self) -> None:
        if self._open:
            self._open = False
            self.steps += 1
            self._ms._end_step()
        if not self._model_hooked:
            self._begin(())

    def remove(self) -> None:
        """Ends the open step (if any) and detaches from the optimizer and the model. Idempotent."""
        if self._removed:
            return
        self._removed = True
        if self._ms._hook is self:
            self._ms._hook = None
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._wrapper is not None and self._optimizer.__dict__.get("step") is self._wrapper:
            del self._optimizer.step
        if self._open:
            self._open = False
            self.steps += 1
            self._ms._end_step()

    def __enter__(self) -> "StepHook":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


__all__ = ["MemSculptor", "StepHook", "Trace", "trace_from_snapshot", "load_snapshot",
           "snapshot_reserved_bytes", "plan_trace", "replay_trace"]


# ---------------------------------------------------------------------------------------------
# The persistent arena
# ---------------------------------------------------------------------------------------------

# Note [The persistent arena]. Parameters, buffers and optimizer state live for the whole run and
# are known before the first step: their sizes are the plan. Allocated one by one (torch's
# caching allocator, even inside MemSculptor's pool) they are rounded and split into segments
# whose tails no other tensor fits: an H200 measured 0.50 GiB free of n16's 22.7 GiB persistent pool
# at the reserved peak (1.5 points of the run's fragmentation). The arena gives them one
# allocation, laid out back to back (ARENA_ALIGN bytes apart at most), and rebinds each tensor's
# ``.data`` to its view: every tensor keeps its identity (the optimizer's, NexusSync's and the
# checkpoint's references stay valid), the bytes are the same, and the reserved bytes are the
# allocated ones. Two arenas are made, not one, so that no moment holds a tensor twice: the
# model's (filled from wherever the model is, host or device) and the optimizer's (its state
# made directly in the arena, zero, as AdamW's first step would make it).
ARENA_ALIGN = 512  # torch's own block rounding; enough for every vectorised kernel


def storage_ptr(t: Any) -> int:
    """The address of the allocation behind tensor `t` (its storage's, not its own offset): two
    tensors in one arena give the same value."""
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def arena_layout(tensors: Sequence[Any], align: int = ARENA_ALIGN) -> List[int]:
    """Byte offsets of ``tensors`` laid out back to back, each aligned to ``align``; the last
    element is the total size. Shared tensors (the same object twice) must be deduplicated by
    the caller."""
    if align <= 0 or align & (align - 1):
        raise ValueError(f"arena alignment {align} is not a power of two")
    offs, cur = [], 0
    for t in tensors:
        offs.append(cur)
        cur += (t.numel() * t.element_size() + align - 1) // align * align
    offs.append(cur)
    return offs


def _arena_view(arena: Any, off: int, like: Any) -> Any:
    n = like.numel() * like.element_size()
    return arena[off:off + n].view(like.dtype).view(like.shape)


def _unique(tensors: Any) -> List[Any]:
    seen, out = set(), []
    for t in tensors:
        if t is None or id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        out.append(t)
    return out


def pack_into_arena(tensors: Sequence[Any], device: Any, alloc: Any = None) -> Any:
    """Moves ``tensors`` (parameters, buffers: anything whose ``.data`` may be rebound) into one
    new uint8 allocation on ``device``, in order, each aligned to ARENA_ALIGN: copies each
    tensor's data into its view, then rebinds ``t.data`` to the view (identity, dtype, shape,
    requires_grad and values kept). ``alloc(nbytes)`` makes the arena (default: torch.empty on
    ``device``; the trainer passes one inside MemSculptor's persistent pool). A tensor on
    ``device`` is freed as soon as it is copied, so the peak is the arena plus the largest one.
    Returns the arena (None when there is nothing to pack). Non-contiguous tensors are packed
    contiguous. Note [The persistent arena]."""
    import torch

    ts = _unique(tensors)
    if not ts:
        return None
    offs = arena_layout(ts)
    arena = (alloc(offs[-1]) if alloc is not None
             else torch.empty(offs[-1], dtype=torch.uint8, device=device))
    with torch.no_grad():
        for t, off in zip(ts, offs):
            v = _arena_view(arena, off, t)
            v.copy_(t.data)
            t.data = v
    return arena


def adamw_state_in_arena(opt: Any, device: Any, alloc: Any = None) -> Any:
    """Gives each trainable parameter of the AdamW ``opt`` its fresh state (step 0, moments 0)
    as views of one new allocation (``alloc(nbytes)``, as in :func:`pack_into_arena`), in the
    layout torch's AdamW makes it: ``step`` a 0-d float32 tensor on the parameter's device when
    the optimizer is fused or capturable (on the host otherwise, outside the arena), the moments
    shaped like the parameter. Parameters that already have state are left alone. Returns the
    arena (None when nothing was given state). The caller checks the layout by running one step
    (``init_optimizer_state``: torch then uses these tensors, or refuses them)."""
    import torch

    if type(opt).__name__ not in ("AdamW", "Adam"):
        raise ValueError(f"the optimizer state arena knows AdamW's state, not "
                         f"{type(opt).__name__}'s")
    todo, moments = [], []
    for g in opt.param_groups:
        if g.get("amsgrad"):
            raise ValueError("the optimizer state arena does not lay out amsgrad's state")
        on_dev = bool(g.get("fused") or g.get("capturable"))
        for p in g["params"]:
            if p.requires_grad and not opt.state.get(p):
                todo.append((p, on_dev))
                moments += [p, p]
    if not todo:
        return None
    step = torch.empty((), dtype=torch.float32)  # a layout template only
    steps = [step for _, on_dev in todo if on_dev]
    layout = moments + steps
    offs = arena_layout(layout)
    arena = (alloc(offs[-1]) if alloc is not None
             else torch.empty(offs[-1], dtype=torch.uint8, device=device))
    arena.zero_()
    k = len(moments)
    for i, (p, on_dev) in enumerate(todo):
        if on_dev:  # torch's key order: step, exp_avg, exp_avg_sq
            st = {"step": _arena_view(arena, offs[k], steps[k - len(moments)])}
            k += 1
        else:
            st = {"step": torch.tensor(0.0, dtype=torch.float32)}
        st["exp_avg"] = _arena_view(arena, offs[2 * i], p)
        st["exp_avg_sq"] = _arena_view(arena, offs[2 * i + 1], p)
        opt.state[p] = st
    return arena


def init_optimizer_state(opt: Any, persistent: Callable[[], Any],
                         arena_alloc: Optional[Callable[[int], Any]] = None) -> int:
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
        # Note [The persistent arena]: the state laid out in one allocation, as AdamW would make
        # it; the step below then uses it (or torch refuses it: its own blocks).
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


def state_back_into_place(opt: Any, before: Dict[Any, Dict[str, Any]]) -> int:
    """After ``opt.load_state_dict`` (which makes new state tensors), copies each loaded state
    tensor into the tensor it replaced, when that one has the same shape, dtype and device, and
    puts it back: state made in the arena stays there (Note [The persistent arena]) instead of
    being dropped for a second copy. ``before``: ``{param: dict(opt.state[param])}`` taken before
    the load. Returns the number of tensors put back."""
    import torch

    n = 0
    with torch.no_grad():
        for p, old in before.items():
            st = opt.state.get(p)
            if not st:
                continue
            for k, v in list(st.items()):
                o = old.get(k)
                if (torch.is_tensor(o) and torch.is_tensor(v) and o is not v
                        and o.shape == v.shape and o.dtype == v.dtype and o.device == v.device):
                    o.copy_(v)
                    st[k] = o
                    n += 1
    return n


# ------------------------------------------------------------------------------------------------
# A run's MemSculptor (the trainer's): torch's allocator, or nothing


def apply_limit(device: int, limit_mb: Optional[int]) -> None:
    """Gives the torch allocator the cap on what `device` reserves (MiB; None: leave
    LOONGFORGE_MEM_LIMIT_MB's), before the device's first allocation. ValueError with the
    allocator's reason when it refuses (out of range, or the device already set up); RuntimeError
    in a build without CUDA."""
    if limit_mb is None:
        return
    plugin = _plugin()
    if plugin is None:
        raise RuntimeError(f"a memory cap needs MemSculptor's CUDA allocator: {_why_unavailable()}")
    try:
        plugin.set_limit_mb(int(device), int(limit_mb))
    except RuntimeError as e:
        raise ValueError(str(e)) from None


class MemSculptorSession:
    """One run's MemSculptor: torch's CUDA allocator (loongforge mode on a GPU), or nothing, from
    install to close."""

    def __init__(self, enabled: bool, lf_mode: bool, scoped: bool = False,
                 limit_mb: Optional[int] = None) -> None:
        """limit_mb: MemSculptor's cap on reserved memory, MiB (--memory-cap-gib; None: none
        but LOONGFORGE_MEM_LIMIT_MB's)."""
        self.enabled, self.lf_mode, self.scoped = enabled, lf_mode, scoped
        self.limit_mb = limit_mb
        self.ms: Any = None
        self.status = "off: --no-memsculptor" if lf_mode and not enabled else "off"

    def install(self, device: torch.device) -> None:
        if not self.enabled:
            return
        if device.type != "cuda":
            self.status = "off: needs CUDA"
            return
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
            self.ms = MemSculptor(device.index or 0, limit_mb=self.limit_mb)
            self.status = "on (scoped: persistent tensors and the CUDA graphs' pool)"
            return
        self.ms = MemSculptor(device.index or 0, limit_mb=self.limit_mb).install()
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
