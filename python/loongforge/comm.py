"""NexusSync: bucketed gradient synchronization overlapped with backward.

A drop-in replacement for DDP's gradient path (see docs/comm.md):

    sync = NexusSync(model, process_group=None, bucket_cap_mb=25, first_bucket_mb=1)
    for micro, batch in enumerate(batches):
        sync.set_micro_step(is_last=(micro == accum - 1))
        loss(model(batch)).backward()
    sync.finish()            # waits only for what is still in flight, grads are averaged
    optimizer.step(); sync.zero_grad()

* Every trainable parameter's ``.grad`` is a view into a flat per-bucket buffer, so nothing is
  copied to communicate. Buckets are planned like DDP's (rebuilt) buckets: in reverse
  registration order (= roughly backward order), a bucket closes once it reaches its cap, and
  only the first bucket is small (``first_bucket_mb``, then ``bucket_cap_mb``); and by group:
  ``dense``, ``expert_high`` and ``expert_low`` (MoE experts split by measured routing load).
  Frozen parameters get no bucket.
* Autograd hooks (``register_post_accumulate_grad_hook`` on torch >= 2.1, the AccumulateGrad
  node hook before) mark parameters ready; a bucket's collective is issued as soon as its last
  gradient is ready, strictly in bucket order (a bucket ready early is held until the ones before
  it are issued), so every rank issues the same collectives in the same order.
* Dense buckets: averaged all-reduce (fp32, or bf16 with ``reduce_dtype=torch.bfloat16``).
  Sparse groups (``sparse_groups``, default the low-load experts) with ``topk_ratio``: top-k with
  error feedback in C++/CUDA (``loongforge._C``), values+indices exchanged by all_gather and
  scatter-added (averaged) back into the bucket.
* Collectives run on torch.distributed (Gloo on CPU, NCCL on GPU). On Gloo every wait is
  bounded by ``timeout_s``; a failed or timed-out collective raises RuntimeError naming the
  bucket. On NCCL a wait only orders the current stream after the collective (the host does not
  block), so the bound is the process group's timeout, enforced by NCCL's watchdog.
  Bucket plans are compared across ranks at setup (hash all_gather); a mismatch raises
  RuntimeError naming the first difference.
* Without torch.distributed initialized (and no group given), NexusSync creates no group and only
  manages the flat buffers (and top-k for sparse groups): finish() is then local.
* ``broadcast_from=R`` copies rank R's parameters and buffers to every rank at setup, as DDP's
  constructor does (Note [Starting from one rank's weights]).
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple,
                    Union)

import torch
import torch.distributed as dist

from . import _C

if TYPE_CHECKING:
    from .models.gr00t import Gr00tPolicy
    from .trainer.dist import Dist

__all__ = ["NexusSync", "topk_error_feedback", "scatter_add", "broadcast_module_state", "GROUPS"]

GROUPS = ("dense", "expert_high", "expert_low")
_HAS_POST_ACC_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


# ---- kernels ----------------------------------------------------------------------------------
# Thin shapes over loongforge._C: the C++ entry points (include/loongforge/comm.h) validate
# dtypes, sizes, contiguity and devices and raise ValueError naming the tensor; CUDA tensors run
# on the current stream of their device.


def topk_error_feedback(
    grad: Optional[torch.Tensor],
    residual: torch.Tensor,
    k: int,
    value_dtype: torch.dtype = torch.float32,
    values: Optional[torch.Tensor] = None,
    indices: Optional[torch.Tensor] = None,
    num_threads: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """residual += grad; take the k largest |residual| (ties: lower index) out of the residual.

    Returns (values, int32 indices), indices ascending; after the call
    values + residual == old residual + grad exactly (element-wise; bf16 values leave their
    rounding error in the residual). ``residual`` is a contiguous float32 tensor; ``grad`` (or
    None) a contiguous float32/bfloat16 tensor with as many elements on the same device. CUDA
    tensors run the CUDA kernel on the current stream. ``values``/``indices`` may be given to write
    into (min(k, residual.numel()) elements each, contiguous).
    """
    k = max(0, min(int(k), residual.numel()))
    if values is None:
        values = torch.empty(k, dtype=value_dtype, device=residual.device)
    if indices is None:
        indices = torch.empty(k, dtype=torch.int32, device=residual.device)
    _C.comm_topk_error_feedback(grad, residual, k, values, indices, num_threads)
    return values, indices


def scatter_add(values: torch.Tensor, indices: torch.Tensor, dense: torch.Tensor,
                num_segments: int = 1, scale: float = 1.0, zero_first: bool = False,
                num_threads: int = 0) -> torch.Tensor:
    """dense[indices] += scale * values, segment by segment (one segment per rank), in order.

    values/indices hold num_segments * segment_len elements, contiguous, on dense's device.
    Raises ValueError on an index outside dense (CPU; the CUDA kernel skips such indices).
    """
    _C.comm_scatter_add(values, indices, dense, num_segments, float(scale), bool(zero_first),
                        num_threads)
    return dense


# ---- planning ---------------------------------------------------------------------------------


@dataclass
class _Slot:
    name: str
    param: torch.nn.Parameter
    offset: int
    numel: int


@dataclass
class _Bucket:
    index: int
    group: str
    dtype: torch.dtype
    device: torch.device
    slots: List[_Slot] = field(default_factory=list)
    numel: int = 0
    buffer: Optional[torch.Tensor] = None
    residual: Optional[torch.Tensor] = None  # sparse buckets: fp32 error-feedback residual
    sparse: bool = False
    k: int = 0
    pending: int = 0
    # per step
    work: Any = None
    tmp: Optional[torch.Tensor] = None       # bf16 reduction copy, or gathered packed top-k
    issued_at: float = 0.0
    done_at: float = 0.0
    tracked: bool = False

    def describe(self) -> List[Any]:
        return [self.index, self.group, str(self.dtype), self.device.type,
                [(s.name, list(s.param.shape)) for s in self.slots], self.numel]


class NexusSync:
    """Bucketed, overlapped, optionally sparsified gradient synchronization (module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        process_group: Optional[Any] = None,
        bucket_cap_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        expert_param_filter: Union[None, str, Callable[[str, torch.nn.Parameter], bool]] = None,
        topk_ratio: Optional[float] = None,
        sparse_groups: Sequence[str] = ("expert_low",),
        expert_index_fn: Optional[Callable[[str], int]] = None,
        expert_load: Optional[Sequence[float]] = None,
        load_threshold: float = 0.5,
        reduce_dtype: Optional[torch.dtype] = None,
        topk_value_dtype: Optional[torch.dtype] = None,
        comm_stream_priority: int = -1,
        timeout_s: float = 300.0,
        check_plan: bool = True,
        skip_single_rank: bool = True,
        param_filter: Optional[Callable[[str, torch.nn.Parameter], bool]] = None,
        broadcast_from: Optional[int] = None,
        average_over: Optional[int] = None,
    ) -> None:
        """
        Args:
          model: its parameters with requires_grad are synchronized (registration order).
          process_group: torch.distributed group; None = the default group if initialized, else
            no group at all (local mode).
          bucket_cap_mb / first_bucket_mb: bucket byte caps; a bucket closes once it reaches its
            cap (DDP's rule). Only the first bucket (per dtype/device) uses first_bucket_mb, so
            communication starts early in backward.
          expert_param_filter: which params are MoE experts: a regex searched in the param name, or
            a callable (name, param) -> bool. None: no experts.
          topk_ratio: fraction of each sparse bucket's elements sent per step (None: all dense).
          sparse_groups: groups that use top-k when topk_ratio is set.
          expert_index_fn: name -> expert id (default: the number after "experts." / "expert.").
          expert_load / load_threshold: per-expert token counts; an expert is low-load when its
            load < load_threshold * mean load. Without loads every expert is high-load (exact).
          reduce_dtype: None (the grad dtype) or torch.bfloat16 (reduce dense buckets in bf16).
          topk_value_dtype: dtype of sent top-k values (default: the grad dtype).
          comm_stream_priority: CUDA priority of the stream collectives are issued from (lower is
            higher priority).
          timeout_s: bound on every wait in finish() on Gloo (on NCCL: the process group's
            timeout); errors name the bucket.
          check_plan: compare bucket plans across ranks at setup.
          skip_single_rank: at world size 1, skip the (identity) all-reduce.
          param_filter: (name, param) -> bool, which trainable params this NexusSync owns
            (None: all); expert-parallel experts are reduced over their own group instead.
          broadcast_from: a rank of the group whose parameters and buffers (every one of the
            model's, trainable or not) are copied to the other ranks before anything else; None:
            none (Note [Starting from one rank's weights]).
          average_over: what the reduced sums are divided by (None: the group's size, DDP's
            mean). Expert-parallel experts are reduced over their expert-data-parallel group but
            averaged over the whole world (Note [Expert gradients] in moe.py).
        """
        if bucket_cap_mb <= 0 or first_bucket_mb <= 0:
            raise ValueError("bucket_cap_mb and first_bucket_mb must be positive")
        if topk_ratio is not None and not 0.0 < topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio must be in (0, 1], got {topk_ratio}")
        for g in sparse_groups:
            if g not in GROUPS:
                raise ValueError(f"unknown group {g!r} in sparse_groups (groups: {GROUPS})")
        if average_over is not None and (isinstance(average_over, bool) or
                                         not isinstance(average_over, int) or average_over < 1):
            raise ValueError(f"average_over must be a positive int, got {average_over!r}")
        if reduce_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError("reduce_dtype must be None, torch.float32 or torch.bfloat16")
        self._model = model
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self._pg = process_group
        self._world = dist.get_world_size(process_group) if process_group is not None else 1
        self._rank = dist.get_rank(process_group) if process_group is not None else 0
        self._divisor = average_over if average_over is not None else self._world
        self._bucket_cap = int(bucket_cap_mb * 2**20)
        self._first_cap = int(first_bucket_mb * 2**20)
        self._topk_ratio = topk_ratio
        self._sparse_groups = tuple(sparse_groups)
        self._reduce_dtype = reduce_dtype
        self._topk_value_dtype = topk_value_dtype
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._timeout_s = timeout_s
        self._check_plan = check_plan
        self._skip_single = skip_single_rank
        self._load_threshold = load_threshold
        if isinstance(expert_param_filter, str):
            pat = re.compile(expert_param_filter)
            self._is_expert = lambda name, p: pat.search(name) is not None
        else:
            self._is_expert = expert_param_filter or (lambda name, p: False)
        self._expert_index_fn = expert_index_fn or _default_expert_index
        self._low_experts: set = set()

        if broadcast_from is not None:
            broadcast_module_state(model, broadcast_from, process_group)
        self._named = [(n, p) for n, p in model.named_parameters()
                       if p.requires_grad and (param_filter is None or param_filter(n, p))]
        if not self._named:
            raise ValueError("NexusSync: the model has no trainable parameters")
        self._lock = threading.Lock()
        self._comm_stream = None
        if any(p.is_cuda for _, p in self._named):
            self._comm_stream = torch.cuda.Stream(priority=comm_stream_priority)
        self._hook_handles: List[Any] = []
        self._sync_enabled = True
        self._micro_last = True
        self._stats = _Stats()
        self._reset_step()
        if expert_load is not None:
            self._low_experts = self._split_experts(expert_load, reduce=False)
        self._build()
        self._install_hooks()

    # ---- public API ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def buckets(self) -> List[_Bucket]:
        return self._buckets

    def set_micro_step(self, is_last: bool) -> None:
        """Gradient accumulation: non-final micro-steps (is_last=False) communicate nothing."""
        self._micro_last = bool(is_last)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally and communicate nothing (like DDP.no_sync)."""
        prev = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = prev

    def zero_grad(self) -> None:
        """Zeroes every bucket (one fill per bucket); use instead of optimizer.zero_grad()."""
        for b in self._buckets:
            b.buffer.zero_()
        for b in self._buckets:
            for s in b.slots:  # re-point grads an optimizer may have set to None
                if s.param.grad is None or s.param.grad.data_ptr() != b.buffer[s.offset:].data_ptr():
                    s.param.grad = b.buffer[s.offset:s.offset + s.numel].view_as(s.param)

    def residual(self, param: torch.nn.Parameter) -> Optional[torch.Tensor]:
        """The error-feedback residual of a parameter in a sparse bucket (a view), else None."""
        for b in self._buckets:
            if b.residual is None:
                continue
            for s in b.slots:
                if s.param is param:
                    return b.residual[s.offset:s.offset + s.numel].view_as(param)
        return None

    def set_expert_load(self, counts: Sequence[float]) -> None:
        """Feeds per-expert token counts; re-splits experts into high/low load and replans.

        Collective: call on every rank at the same point, between steps. Counts are summed
        across ranks first, so every rank computes the same split.
        """
        low = self._split_experts(counts, reduce=True)
        if low != self._low_experts:
            self._low_experts = low
            self._build()

    def finish(self) -> None:
        """Completes this step's synchronization; afterwards .grad hold the averaged gradients.

        Issues the buckets not yet issued (parameters unused in this backward), waits only for
        what is still in flight (each wait bounded by timeout_s) and averages. After a non-final
        micro-step (or inside no_sync) it does nothing.
        """
        if not self._step_syncs():
            self._stats.skipped_micro_steps += 1
            self._reset_step()
            return
        t0 = time.perf_counter()
        with self._lock:
            self._issue_ready(force=True)
        wait_s = 0.0
        try:
            for b in self._buckets:
                tw = time.perf_counter()
                self._wait(b)
                wait_s += time.perf_counter() - tw
                self._post(b)
        finally:
            for b in self._buckets:
                b.work = None
                b.tmp = None
        if self._comm_stream is not None:
            torch.cuda.current_stream().wait_stream(self._comm_stream)
        t1 = time.perf_counter()
        self._stats.end_step(self, t0, t1, wait_s)
        self._reset_step()

    def stats(self) -> Dict[str, Any]:
        """Counters: bytes sent per group, collectives, exposed wait, overlap, issue times."""
        return self._stats.as_dict(self)

    def close(self) -> None:
        """Removes the autograd hooks (grads stay views into the buckets)."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []

    # ---- planning -----------------------------------------------------------------------------

    def _group_of(self, name: str, p: torch.nn.Parameter) -> str:
        if not self._is_expert(name, p):
            return "dense"
        return "expert_low" if self._expert_index_fn(name) in self._low_experts else "expert_high"

    def _split_experts(self, counts: Sequence[float], reduce: bool) -> set:
        c = torch.as_tensor(counts, dtype=torch.float64).flatten().clone()
        if reduce and self._pg is not None and self._world > 1:
            dev = torch.device("cuda", torch.cuda.current_device()) if self._comm_stream else "cpu"
            ct = c.to(dev)
            dist.all_reduce(ct, group=self._pg)
            c = ct.cpu()
        if c.numel() == 0:
            return set()
        mean = float(c.mean())
        return {i for i, v in enumerate(c.tolist()) if v < self._load_threshold * mean}

    def _plan(self) -> List[_Bucket]:
        # DDP's rule (torch's compute_bucket_assignment_by_size, on DDP's rebuilt backward order):
        # walking parameters in reverse registration order, a parameter joins the open bucket of
        # its (group, dtype, device), and a bucket closes once it has reached its cap. Only the
        # first bucket of each (dtype, device) -- the first bucket overall for a one-dtype model --
        # has the small cap; every later bucket, of any group, has bucket_cap.
        buckets: List[_Bucket] = []
        open_by_key: Dict[Tuple[str, torch.dtype, torch.device], _Bucket] = {}
        cap_of: Dict[int, int] = {}
        first_given: set = set()
        for name, p in reversed(self._named):
            group = self._group_of(name, p)
            key = (group, p.dtype, p.device)
            b = open_by_key.get(key)
            if b is None:
                b = _Bucket(index=len(buckets), group=group, dtype=p.dtype, device=p.device)
                first = (p.dtype, p.device) not in first_given
                first_given.add((p.dtype, p.device))
                cap_of[b.index] = self._first_cap if first else self._bucket_cap
                buckets.append(b)
                open_by_key[key] = b
            b.slots.append(_Slot(name, p, b.numel, p.numel()))
            b.numel += p.numel()
            if b.numel * p.element_size() >= cap_of[b.index]:
                del open_by_key[key]
        for b in buckets:
            if b.numel >= 2**31:
                raise ValueError(f"bucket {b.index} holds {b.numel} elements (>= 2^31); lower "
                                 "bucket_cap_mb")
            b.sparse = self._topk_ratio is not None and b.group in self._sparse_groups
            if b.sparse:
                # The kernel decides which dtypes it takes: ask it now, on an empty buffer,
                # rather than at the first step.
                empty_residual = torch.empty(0, dtype=torch.float32, device=b.device)
                try:
                    topk_error_feedback(torch.empty(0, dtype=b.dtype, device=b.device),
                                        empty_residual, 0)
                except ValueError as e:
                    raise ValueError(f"sparse group {b.group}: {e}") from e
                b.k = max(1, int(math.ceil(self._topk_ratio * b.numel)))
        return buckets

    def _build(self) -> None:
        old = getattr(self, "_buckets", [])
        old_res = {}
        for b in old:
            if b.residual is not None:
                for s in b.slots:
                    old_res[id(s.param)] = b.residual[s.offset:s.offset + s.numel]
        buckets = self._plan()
        if self._check_plan:
            self._verify_plan(buckets)
        for b in buckets:
            b.buffer = torch.zeros(b.numel, dtype=b.dtype, device=b.device)
            if b.sparse:
                b.residual = torch.zeros(b.numel, dtype=torch.float32, device=b.device)
            for s in b.slots:
                view = b.buffer[s.offset:s.offset + s.numel].view_as(s.param)
                if s.param.grad is not None:
                    view.copy_(s.param.grad)
                s.param.grad = view
                if b.residual is not None and id(s.param) in old_res:
                    b.residual[s.offset:s.offset + s.numel].copy_(old_res[id(s.param)])
        self._buckets = buckets
        self._reset_step()

    def _verify_plan(self, buckets: List[_Bucket]) -> None:
        if self._pg is None or self._world == 1:
            return
        plan = [b.describe() + [b.sparse, b.k] for b in buckets]
        digest = hashlib.sha256(repr(plan).encode()).digest()
        h = torch.tensor([int.from_bytes(digest[:7], "little")], dtype=torch.int64)
        if self._comm_stream is not None:
            h = h.cuda()
        hs = [torch.zeros_like(h) for _ in range(self._world)]
        try:
            dist.all_gather(hs, h, group=self._pg)
        except RuntimeError as e:
            raise RuntimeError(f"NexusSync: bucket plan check failed on rank {self._rank}: {e}")
        if all(int(x) == int(hs[0]) for x in hs):
            return
        plans: List[Any] = [None] * self._world
        dist.all_gather_object(plans, plan, group=self._pg)
        for r, other in enumerate(plans):
            if other == plans[0]:
                continue
            raise RuntimeError(
                f"NexusSync: bucket plans differ between rank 0 and rank {r}: "
                f"{_first_difference(plans[0], other)} (every rank must build the same model "
                "with the same bucket options)")
        raise RuntimeError("NexusSync: bucket plan hashes differ across ranks")

    # ---- readiness ----------------------------------------------------------------------------

    def _install_hooks(self) -> None:
        self._slot_of: Dict[int, Tuple[_Bucket, _Slot]] = {}
        self._acc_nodes = []
        for name, p in self._named:
            if _HAS_POST_ACC_HOOK:
                h = p.register_post_accumulate_grad_hook(lambda param, pid=id(p): self._ready(pid))
            else:
                # torch < 2.1: the AccumulateGrad node's post-hook runs after the grad is added.
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                self._acc_nodes.append(node)  # keep alive, or the hook is lost
                h = node.register_hook(lambda gi, go, pid=id(p): self._ready(pid))
            self._hook_handles.append(h)

    def _step_syncs(self) -> bool:
        return self._sync_enabled and self._micro_last

    def _reset_step(self) -> None:
        self._ready_ids: set = set()
        self._next_issue = 0
        self._step_t0: Optional[float] = None
        for b in getattr(self, "_buckets", []):
            b.pending = len(b.slots)

    def _ready(self, pid: int) -> None:
        if not self._step_syncs():
            return
        with self._lock:
            if self._step_t0 is None:
                self._step_t0 = time.perf_counter()
            b, s = self._find(pid)
            if pid in self._ready_ids:
                raise RuntimeError(
                    f"NexusSync: gradient of {s.name} produced twice in one step; use no_sync() or "
                    "set_micro_step(False) for all but the last micro-step")
            self._ready_ids.add(pid)
            view = b.buffer[s.offset:s.offset + s.numel]
            g = s.param.grad
            if g is None or g.data_ptr() != view.data_ptr():
                # The grad was replaced (e.g. zero_grad(set_to_none=True)): move it into the bucket.
                if g is not None:
                    view.copy_(g.reshape(-1))
                else:
                    view.zero_()
                s.param.grad = view.view_as(s.param)
                self._stats.grad_copies += 1
            b.pending -= 1
            self._issue_ready(force=False)

    def _find(self, pid: int) -> Tuple[_Bucket, _Slot]:
        cache = getattr(self, "_find_cache", None)
        if cache is None or cache[0] is not self._buckets:
            m = {id(s.param): (b, s) for b in self._buckets for s in b.slots}
            cache = (self._buckets, m)
            self._find_cache = cache
        return cache[1][pid]

    def _issue_ready(self, force: bool) -> None:
        # In bucket order: a bucket ready before its predecessors waits for them (same order on
        # every rank, so collectives match).
        while self._next_issue < len(self._buckets):
            b = self._buckets[self._next_issue]
            if b.pending > 0 and not force:
                return
            self._issue(b)
            self._next_issue += 1

    # ---- collectives --------------------------------------------------------------------------

    def _issue(self, b: _Bucket) -> None:
        b.issued_at = time.perf_counter()
        b.done_at = 0.0
        b.tracked = False
        if not b.sparse and not self._communicates():
            # Nothing to send (world size 1): no stream hand-off either (one event record and
            # wait per bucket would cost host time in every step for nothing).
            self._stats.issue_order.append(b.index)
            self._stats.issue_times[b.index] = b.issued_at
            return
        stream_ctx = contextlib.nullcontext()
        if self._comm_stream is not None and b.device.type == "cuda":
            self._comm_stream.wait_stream(torch.cuda.current_stream(b.device))
            stream_ctx = torch.cuda.stream(self._comm_stream)
        try:
            with stream_ctx:
                if b.sparse:
                    self._issue_sparse(b)
                else:
                    self._issue_dense(b)
        except RuntimeError as e:
            raise RuntimeError(
                f"NexusSync: issuing the collective for bucket {b.index} ({b.group}, {b.numel} "
                f"elements) failed on rank {self._rank} of {self._world} (a peer died, hung or "
                f"diverged): {e}") from e
        self._stats.issue_order.append(b.index)
        self._stats.issue_times[b.index] = b.issued_at

    def _communicates(self) -> bool:
        return self._pg is not None and not (self._world == 1 and self._skip_single)

    def _issue_dense(self, b: _Bucket) -> None:
        if not self._communicates():
            return
        t = b.buffer
        if self._reduce_dtype is not None and self._reduce_dtype != b.dtype:
            b.tmp = t.to(self._reduce_dtype)
            t = b.tmp
        b.work = dist.all_reduce(t, group=self._pg, async_op=True)
        self._stats.add(b.group, t.numel() * t.element_size(), b.buffer.numel() * b.buffer.element_size())
        self._track(b)

    def _issue_sparse(self, b: _Bucket) -> None:
        vdtype = self._topk_value_dtype or b.dtype
        vsize = torch.tensor([], dtype=vdtype).element_size()
        nbytes = b.k * (4 + vsize)
        packed = torch.empty(nbytes, dtype=torch.uint8, device=b.device)
        idx = packed[:4 * b.k].view(torch.int32)
        vals = packed[4 * b.k:].view(vdtype)
        topk_error_feedback(b.buffer, b.residual, b.k, vdtype, values=vals, indices=idx)
        if not self._communicates() or self._world == 1:
            b.tmp = packed.view(1, nbytes)
            return
        out = torch.empty(self._world, nbytes, dtype=torch.uint8, device=b.device)
        b.tmp = out
        b.work = dist.all_gather(list(out.unbind(0)), packed, group=self._pg, async_op=True)
        self._stats.add(b.group, nbytes, b.buffer.numel() * b.buffer.element_size())
        self._track(b)

    def _track(self, b: _Bucket) -> None:
        self._stats.collectives += 1
        b.tracked = True
        try:
            fut = b.work.get_future()
        except (AttributeError, RuntimeError):
            return

        def done(_f: Any, b: _Bucket = b) -> None:
            b.done_at = time.perf_counter()

        fut.then(done)

    def _wait(self, b: _Bucket) -> None:
        if b.work is None:
            return
        try:
            ok = b.work.wait(self._timeout) if b.device.type == "cpu" else b.work.wait()
        except RuntimeError as e:
            raise RuntimeError(
                f"NexusSync: collective for bucket {b.index} ({b.group}, {b.numel} elements) "
                f"failed on rank {self._rank} of {self._world} (a peer died, hung or diverged; "
                f"timeout {self._timeout_s:g}s): {e}") from e
        if ok is False:
            raise RuntimeError(
                f"NexusSync: collective for bucket {b.index} ({b.group}) did not finish within "
                f"{self._timeout_s:g}s on rank {self._rank}")
        if not b.done_at:
            b.done_at = time.perf_counter()

    def _post(self, b: _Bucket) -> None:
        if b.sparse:
            if b.tmp is None:
                return
            vdtype = self._topk_value_dtype or b.dtype
            world = b.tmp.shape[0]
            # Each rank's row is [indices | values]; the kernel takes every rank's indices, then
            # every rank's values, contiguous, and adds them segment by segment in rank order
            # (the same sums, bit for bit, as one call per rank, in one launch).
            idx = b.tmp[:, :4 * b.k].contiguous().view(torch.int32).view(-1)
            vals = b.tmp[:, 4 * b.k:].contiguous().view(vdtype).view(-1)
            scatter_add(vals, idx, b.buffer, num_segments=world, scale=1.0 / self._divisor,
                        zero_first=True)
            return
        if b.work is None:
            # Nothing was sent (world size 1): the local gradient is the sum; divide only when
            # the mean is over more ranks than this group has.
            if self._divisor != 1:
                b.buffer.div_(self._divisor)
            return
        if b.tmp is not None:
            b.buffer.copy_(b.tmp)
        b.buffer.div_(self._divisor)


# Note [Starting from one rank's weights]
# Averaging gradients keeps replicas equal only if they start equal. Ranks that initialise their
# model with different seeds (or load different files, or whose buffers such as BatchNorm's running
# statistics differ) would otherwise each apply the same averaged update to different weights and
# drift apart silently. DDP's constructor broadcasts rank 0's parameters and buffers for that
# reason; broadcast_from does the same, once, when NexusSync is built (DDP's broadcast_buffers also
# re-sends buffers before every forward; here buffers a forward updates stay per rank, as with
# broadcast_buffers=False). Tensors are sent in one flat message per (device, dtype), written back
# in place, so parameter identities (what the optimizer holds) do not change.
def broadcast_module_state(model: torch.nn.Module, src: int = 0,
                           group: Optional[Any] = None) -> int:
    """Copies rank `src`'s (a rank of `group`) parameters and buffers into every rank's `model`,
    in place. Returns the bytes broadcast (0 without torch.distributed or at world size 1)."""
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return 0
        group = dist.group.WORLD
    world = dist.get_world_size(group)
    if not 0 <= src < world:
        raise ValueError(f"broadcast_from={src} is not a rank of the group (world size {world})")
    if world == 1:
        return 0
    if group is dist.group.WORLD:
        global_src = src
    else:
        get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
        global_src = get(group, src)
    tensors = list(model.parameters()) + list(model.buffers())
    by_kind: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    seen: set = set()
    for t in tensors:
        if id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        by_kind.setdefault((t.device, t.dtype), []).append(t)
    sent = 0
    # The same order on every rank: the model's own order, grouped by (device, dtype).
    for (device, dtype), ts in by_kind.items():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        try:
            dist.broadcast(flat, src=global_src, group=group)
        except RuntimeError as e:
            raise RuntimeError(f"NexusSync: broadcasting rank {src}'s {dtype} tensors on {device} "
                               f"failed: {e}") from e
        offset = 0
        with torch.no_grad():
            for t in ts:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n
        sent += flat.numel() * flat.element_size()
    return sent


class _Stats:
    def __init__(self) -> None:
        self.steps = 0
        self.skipped_micro_steps = 0
        self.collectives = 0
        self.grad_copies = 0
        self.bytes_sent = {g: 0 for g in GROUPS}
        self.bytes_dense = {g: 0 for g in GROUPS}
        self.exposed_wait_s_total = 0.0
        self.finish_s_total = 0.0
        self.comm_busy_s_total = 0.0
        self.last: Dict[str, Any] = {}
        self.issue_order: List[int] = []
        self.issue_times: Dict[int, float] = {}

    def add(self, group: str, sent: int, dense: int) -> None:
        self.bytes_sent[group] += sent
        self.bytes_dense[group] += dense

    def end_step(self, sync: NexusSync, t0: float, t1: float, wait_s: float) -> None:
        self.steps += 1
        start = sync._step_t0 if sync._step_t0 is not None else t0
        intervals = sorted((b.issued_at, b.done_at or t1) for b in sync._buckets
                           if b.tracked)
        busy, cur_s, cur_e = 0.0, None, None
        for s, e in intervals:  # union of in-flight intervals = time communication was running
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            busy += cur_e - cur_s
        communicated = sync._communicates()
        self.exposed_wait_s_total += wait_s
        self.finish_s_total += t1 - t0
        self.comm_busy_s_total += busy
        self.last = {
            "issue_order": list(self.issue_order),
            "issue_times_s": [round(self.issue_times.get(b.index, t0) - start, 6)
                              for b in sync._buckets],
            "exposed_wait_s": wait_s,
            "finish_s": t1 - t0,
            "comm_busy_s": busy,
            "overlap_ratio": (max(0.0, 1.0 - wait_s / busy) if busy > 0 and communicated
                              else None),
        }
        self.issue_order = []
        self.issue_times = {}

    def as_dict(self, sync: NexusSync) -> Dict[str, Any]:
        return {
            "world_size": sync._world,
            "buckets": len(sync._buckets),
            "bucket_groups": [b.group for b in sync._buckets],
            "bucket_bytes": [b.numel * b.buffer.element_size() for b in sync._buckets],
            "steps": self.steps,
            "skipped_micro_steps": self.skipped_micro_steps,
            "collectives": self.collectives,
            "bytes_sent": dict(self.bytes_sent),
            "bytes_dense_equivalent": dict(self.bytes_dense),
            "exposed_wait_s_total": self.exposed_wait_s_total,
            "finish_s_total": self.finish_s_total,
            "comm_busy_s_total": self.comm_busy_s_total,
            "overlap_ratio": (max(0.0, 1.0 - self.exposed_wait_s_total / self.comm_busy_s_total)
                              if self.comm_busy_s_total > 0 else None),
            "grad_copies": self.grad_copies,
            "hook": "post_accumulate_grad" if _HAS_POST_ACC_HOOK else "accumulate_grad_node",
            "last_step": dict(self.last),
        }


def _default_expert_index(name: str) -> int:
    m = re.search(r"experts?\.(\d+)\.", name)
    if m is None:
        raise ValueError(f"cannot find the expert index in parameter name {name!r}; pass "
                         "expert_index_fn")
    return int(m.group(1))


def _first_difference(a: List[Any], b: List[Any]) -> str:
    fields = ["index", "group", "dtype", "device", "params", "numel", "sparse", "k"]
    for i in range(min(len(a), len(b))):
        for f, x, y in zip(fields, a[i], b[i]):
            if x == y:
                continue
            if f == "params":
                for j in range(min(len(x), len(y))):
                    if x[j] != y[j]:
                        return f"bucket {i} param {j}: {x[j]} vs {y[j]}"
                return f"bucket {i}: {len(x)} vs {len(y)} params"
            return f"bucket {i} {f}: {x} vs {y}"
    return f"{len(a)} vs {len(b)} buckets"


# ------------------------------------------------------------------------------------------------
# The trainer's gradient sync: NexusSync, DDP or none behind one interface


class SyncBackend:
    """How gradients are reduced across ranks: none (world 1), DDP (baseline / --no-nexussync) or
    NexusSync. ``exposed_s`` is the time the step waited for communication after backward."""

    def __init__(self, model: torch.nn.Module, d: Dist, kind: str, ep: Any = None,
                 topk_ratio: Optional[float] = None, load_threshold: float = 0.5) -> None:
        """ep: loongforge.moe.ExpertParallel when the experts are split across ranks; their
        gradients are then reduced over the expert-data-parallel group and averaged over the
        world (Note [Expert gradients] in moe.py): under NexusSync by a second NexusSync on that
        group (its own buckets, issued during backward as they fill, top-k with error feedback
        on its low-load experts like the dense one's), under DDP in finish(). topk_ratio: NexusSync top-k with
        error feedback on the low-load expert group (None: every group dense); an expert is
        low-load when its routed count is under load_threshold x the mean."""
        self.kind, self.d, self.model, self.exposed_s = kind, d, model, 0.0
        self.wrapped: torch.nn.Module = model
        self._nexus: Any = None
        self._expert_nexus: Any = None  # expert parallelism under NexusSync
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
            # MoE expert weights form their own bucket groups (high/low load by routing counts);
            # with expert parallelism they are not NexusSync's (reduced over their own group).
            self._nexus = NexusSync(
                model, expert_param_filter=r"\.experts\." if moe and self.ep is None else None,
                topk_ratio=topk_ratio, load_threshold=load_threshold,
                param_filter=(lambda n, p: id(p) not in expert_ids) if expert_ids else None)
            if self.ep is not None:
                self._expert_nexus = NexusSync(
                    model, process_group=ep.dp_group, expert_param_filter=r"\.experts\.",
                    topk_ratio=topk_ratio, load_threshold=load_threshold,
                    timeout_s=ep.timeout_s, average_over=d.world,
                    param_filter=lambda n, p: id(p) in expert_ids)

    def set_micro_step(self, is_last: bool) -> None:
        """Tells NexusSync whether this microbatch's backward ends the step (it reduces then)."""
        for n in (self._nexus, self._expert_nexus):
            if n is not None:
                n.set_micro_step(is_last=is_last)

    def capture_no_sync(self) -> Any:
        """The context a CUDA-graph capture of backward runs in (graphs.GraphedStep): NexusSync's
        hooks must not run during capture (Note [Graphs and NexusSync] in docs/trainer.md); DDP
        runs are never captured, and without a sync there is nothing to suspend."""
        return self._nexus_contexts("no_sync") if self._nexus is not None \
            else contextlib.nullcontext()

    def _nexus_contexts(self, name: str) -> Any:
        stack = contextlib.ExitStack()
        for n in (self._nexus, self._expert_nexus):
            if n is not None:
                stack.enter_context(getattr(n, name)())
        return stack

    def no_sync(self) -> Any:
        if self.kind == "ddp":
            return self.wrapped.no_sync()
        if self.kind == "nexussync":
            return self._nexus_contexts("no_sync")
        return contextlib.nullcontext()

    def zero_grad(self, opt: torch.optim.Optimizer, keep: bool = False) -> None:
        """keep=True zeroes gradients in place (CUDA graphs read and write them at fixed
        addresses); otherwise they are set to None (no memset)."""
        if self.kind == "nexussync":
            self._nexus.zero_grad()  # grads are views into the flat buckets: zero in place
            if self._expert_nexus is not None:
                self._expert_nexus.zero_grad()
        else:
            opt.zero_grad(set_to_none=not keep)

    def feed_expert_load(self, model: Gr00tPolicy) -> None:
        """Per-expert token counts (summed over MoE layers) -> NexusSync's load grouping."""
        if self.kind != "nexussync" or not model.cfg.moe_experts:
            return
        counts = torch.zeros(model.cfg.moe_experts, dtype=torch.float64)
        for c in model.expert_token_counts().values():
            counts += c.detach().to("cpu", torch.float64)
        if self.ep is None:
            self._nexus.set_expert_load(counts.tolist())
        else:  # this rank's experts, under their local indices (summed over their group)
            first = self.ep.first_expert
            self._expert_nexus.set_expert_load(counts[first:first + self.ep.local].tolist())

    def stats(self) -> Dict[str, Any]:
        out = (dict(self._nexus.stats()) if self._nexus is not None
               else dict(self._closed_stats))
        if self.ep is not None:
            expert = dict(self.ep.describe(), expert_grad_bytes=self.expert_bytes)
            es = (self._expert_nexus.stats() if self._expert_nexus is not None
                  else getattr(self, "_closed_expert_stats", None))
            if es is not None:
                expert.update(expert_grad_bytes=sum(es["bytes_sent"].values()),
                              expert_sync=es)
            out["expert_parallel"] = expert
        return out

    def finish(self) -> None:
        """Waits for this step's gradient reduction (NexusSync); DDP has finished in backward.
        Expert-parallel expert gradients are reduced here, over their own group."""
        t = time.perf_counter()
        if self.kind == "nexussync":
            self._nexus.finish()
            if self._expert_nexus is not None:
                self._expert_nexus.finish()
        elif self.ep is not None:
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
        if self._expert_nexus is not None:
            self._expert_nexus.close()
            self._closed_expert_stats = dict(self._expert_nexus.stats())
            self._expert_nexus = None
        self.wrapped = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        self.expert_params = []

    def average_losses(self, acc: torch.Tensor) -> None:
        """acc[:3] (loss, fm_loss, aux_loss) -> their mean over all ranks, so that rank 0's
        metrics report the run's loss, not its own shard's."""
        if self.d.world > 1:
            dist.all_reduce(acc[:3])
            acc[:3] /= self.d.world
