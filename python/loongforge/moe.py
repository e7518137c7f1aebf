"""Mixture-of-experts pieces of the policy: grouped expert GEMMs, routing with counted drops, and
expert parallelism (tokens to their experts and back by all-to-all).

* ``grouped_mm(x, w, counts)``: rows of ``x`` sorted by expert, one GEMM for all experts.
  On CUDA in bf16 (sm90) it is torch's grouped GEMM (``torch.nn.functional.grouped_mm`` or
  ``torch._grouped_mm``, feature-detected and self-checked once against the fallback); otherwise
  the fallback pads every expert's rows to the largest group and runs one ``torch.bmm`` (also the
  CPU reference). Neither has a Python loop over experts; autograd gives both backwards.
* ``route(idx, experts, capacity)``: sorts the top-k assignments by expert; a capacity limit
  drops assignments past it (latest tokens first) and returns how many it dropped.
* ``ExpertParallel``: ``--expert-parallel N`` splits the experts across N consecutive ranks (an
  expert-parallel group); ranks holding the same experts form that expert's data-parallel group.
  See docs/moe.md for the layout and the gradient rule (Note [Expert gradients]).
"""
from __future__ import annotations

import datetime
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import knobs

__all__ = ["grouped_mm", "grouped_mm_backend", "grouped_mm_reference", "route", "Routing",
           "ExpertParallel", "check_expert_parallel"]

# ------------------------------------------------------------------------------------------------
# Grouped GEMM

_TORCH_GMM: Optional[Callable[..., torch.Tensor]] = (getattr(F, "grouped_mm", None)
                                                     or getattr(torch, "_grouped_mm", None))
_gmm_checked: Optional[bool] = None  # None: not yet self-checked; False: disabled


def grouped_mm_backend(x: Optional[torch.Tensor] = None, w: Optional[torch.Tensor] = None) -> str:
    """'torch' where torch's grouped GEMM serves (x, w), else 'padded_bmm'. Without arguments: what
    a bf16 CUDA problem would use on this build and device."""
    if _TORCH_GMM is None or _gmm_checked is False:
        return "padded_bmm"
    if knobs.get("LOONGFORGE_GROUPED_MM") == "fallback":
        return "padded_bmm"
    if x is None or w is None:
        ok = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
        return "torch" if ok else "padded_bmm"
    # torch's kernel: CUDA, bf16 (sm90 is what it was built and measured for), TMA strides that
    # are multiples of 16 bytes (K and N multiples of 8 in bf16).
    if not (x.is_cuda and x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16):
        return "padded_bmm"
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return "padded_bmm"
    if x.shape[-1] % 8 or w.shape[-2] % 8:
        return "padded_bmm"
    return "torch"


def _group_ids(counts: torch.Tensor, rows: int) -> torch.Tensor:
    """Expert id of each sorted row (int64 [rows]); no host sync (output_size is known)."""
    g = torch.arange(counts.numel(), device=counts.device)
    return torch.repeat_interleave(g, counts, output_size=rows)


def _padded_bmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    groups, rows = w.shape[0], x.shape[0]
    gid = _group_ids(counts, rows)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(rows, device=x.device) - starts[gid]
    width = int(counts.max()) if rows else 0  # one host read: the padded height
    padded = x.new_zeros(groups, width, x.shape[1])
    padded = padded.index_put((gid, pos), x)
    out = torch.bmm(padded, w.transpose(1, 2))  # [G, width, N]
    return out[gid, pos]


class _DenseGrad(torch.autograd.Function):
    """Identity whose backward hands on a dense gradient: torch's grouped GEMM refuses a
    broadcast one (zero strides, as ``y.sum().backward()`` gives: "Invalid strides/sizes")."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return g.contiguous()


def _torch_gmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return _DenseGrad.apply(_TORCH_GMM(x, w.transpose(-2, -1), offs=offs))


def _self_check(device: torch.device) -> bool:
    """Runs torch's grouped GEMM once against the fallback (forward and backward, an empty
    expert included); a mismatch or an error disables it for the process, with a warning."""
    global _gmm_checked
    # Gradients on even when the first grouped_mm call runs under no_grad or inference_mode (an
    # evaluation, a benchmark's forward): the check's backward would fail there and disable
    # torch's kernel for the whole process.
    try:
        with torch.inference_mode(False), torch.enable_grad():
            ok = _compare_with_fallback(device)
    except (RuntimeError, TypeError) as e:  # torch's refusals (dtype, arch) are RuntimeErrors
        warnings.warn(f"torch grouped GEMM unusable here ({e}); using the padded-bmm fallback")
        ok = False
    else:
        if not ok:
            warnings.warn("torch grouped GEMM disagrees with the padded-bmm reference; "
                          "using the fallback")
    _gmm_checked = ok
    return ok


def _compare_with_fallback(device: torch.device) -> bool:
    """torch's grouped GEMM against the padded-bmm fallback, forward and backward."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(24, 32, device=device, generator=g).bfloat16().requires_grad_()
    w = torch.randn(3, 16, 32, device=device, generator=g).bfloat16().requires_grad_()
    counts = torch.tensor([10, 0, 14], device=device)
    y = _torch_gmm(x, w, counts)
    gy = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), gy)
    y2 = _padded_bmm(x.float(), w.float(), counts)
    gx2, gw2 = torch.autograd.grad(y2, (x, w), gy.float())
    # A broadcast gradient (y.sum()) must work too: it is what a loss summing y hands back.
    gs = torch.autograd.grad(_torch_gmm(x, w, counts).sum(), (x, w))
    gs2 = torch.autograd.grad(_padded_bmm(x.float(), w.float(), counts).sum(), (x, w))
    return all(torch.allclose(a.float(), b.float(), rtol=3e-2, atol=3e-1)
               for a, b in ((y, y2), (gx, gx2), (gw, gw2), *zip(gs, gs2)))


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-expert x_e @ w_e^T as one grouped GEMM.

    x: [M, K], rows sorted by expert (expert 0's counts[0] rows first); w: [G, N, K] (nn.Linear
    layout per expert); counts: int64 [G] on x's device, summing to M (zeros allowed). Returns
    [M, N] in x's dtype. Differentiable in x and w."""
    if w.dim() != 3 or x.dim() != 2 or x.shape[1] != w.shape[2] or counts.numel() != w.shape[0]:
        raise ValueError(f"grouped_mm: x {list(x.shape)}, w {list(w.shape)}, counts "
                         f"{list(counts.shape)} do not fit ([M, K], [G, N, K], [G])")
    if grouped_mm_backend(x, w) == "torch":
        if _gmm_checked is None:
            _self_check(x.device)
        if _gmm_checked:
            return _torch_gmm(x, w, counts)
    return _padded_bmm(x, w, counts)


def grouped_mm_reference(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-expert loop (tests only): the definition grouped_mm must match."""
    out, start = [], 0
    for e, c in enumerate(counts.tolist()):
        out.append(x[start:start + c] @ w[e].t())
        start += c
    return torch.cat(out) if out else x.new_zeros(0, w.shape[1])


# ------------------------------------------------------------------------------------------------
# Routing


class Routing:
    """Top-k assignments sorted by expert. ``order``: assignment ids (token * k + slot) kept,
    grouped by expert; ``counts``: kept assignments per expert; ``routed``: assignments per expert
    before the capacity limit; ``dropped``: int64 scalar, routed - kept (never silent: the layer
    reports it)."""

    def __init__(self, order: torch.Tensor, counts: torch.Tensor, routed: torch.Tensor,
                 dropped: torch.Tensor) -> None:
        self.order, self.counts, self.routed, self.dropped = order, counts, routed, dropped


def capacity_of(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Assignments each expert accepts per forward: ceil(factor * tokens * k / E); 0 = no limit."""
    return 0 if factor <= 0 else max(1, int(math.ceil(factor * tokens * top_k / experts)))


def route(idx: torch.Tensor, experts: int, capacity: int = 0) -> Routing:
    """idx: int64 [N, k] chosen experts per token. capacity 0: keep every assignment (no host
    sync); otherwise each expert keeps its first ``capacity`` assignments in token order."""
    flat = idx.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)
    # Not bincount: on CUDA it reads the largest id back to size its output (a host sync, which
    # a CUDA graph cannot capture); the expert count is known.
    routed = torch.zeros(experts, dtype=torch.long, device=idx.device).index_add_(
        0, flat, torch.ones_like(flat))
    if capacity <= 0:
        return Routing(order, routed, routed, torch.zeros((), dtype=torch.long, device=idx.device))
    starts = torch.cumsum(routed, 0) - routed
    pos = torch.arange(flat.numel(), device=idx.device) - starts[sorted_e]
    keep = pos < capacity
    counts = routed.clamp(max=capacity)
    return Routing(order[keep], counts, routed, routed.sum() - counts.sum())


# ------------------------------------------------------------------------------------------------
# Expert parallelism


def check_expert_parallel(experts: int, top_k: int, ep_size: int, world: int) -> None:
    """ValueError naming the setting when (experts, top_k, ep_size, world) cannot run."""
    if ep_size < 1:
        raise ValueError(f"--expert-parallel must be >= 1, got {ep_size}")
    if ep_size > 1 and experts <= 0:
        raise ValueError(f"--expert-parallel {ep_size} needs a MoE config (moe_experts > 0)")
    if experts and not 1 <= top_k <= experts:
        raise ValueError(f"moe_top_k {top_k} must be in [1, moe_experts={experts}]")
    if experts and experts % ep_size:
        raise ValueError(f"moe_experts {experts} is not divisible by --expert-parallel {ep_size}")
    if world % ep_size:
        raise ValueError(f"world size {world} is not divisible by --expert-parallel {ep_size}")


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: List[int], in_splits: List[int],
                ep: "ExpertParallel", what: str) -> torch.Tensor:
        ctx.splits, ctx.ep, ctx.what = (out_splits, in_splits), ep, what
        y = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        ep.all_to_all(y, x.contiguous(), out_splits, in_splits, what)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        out_splits, in_splits = ctx.splits
        gx = gy.new_empty((sum(in_splits),) + tuple(gy.shape[1:]))
        ctx.ep.all_to_all(gx, gy.contiguous(), in_splits, out_splits, ctx.what + " backward")
        return gx, None, None, None, None


class ExpertParallel:
    """Process groups and token exchange for ``--expert-parallel N``.

    Ranks [g*N, (g+1)*N) form expert-parallel group g; rank r holds experts
    [(r % N) * E/N, (r % N + 1) * E/N). The ranks {r % N + j*N} hold the same experts and form
    their expert-data-parallel group (size world/N), over which expert gradients are reduced.
    Every wait is bounded by ``timeout_s``; a dead peer gives a RuntimeError naming the exchange.

    Note [Expert gradients]: each rank's loss is the mean over its own batch and dense gradients
    are averaged over all W ranks (DDP / NexusSync). An expert's local gradient already sums the
    contributions of every rank in its expert-parallel group (the all-to-all backward brings them
    home), so summing over its expert-data-parallel group gives the sum over all W ranks; dividing
    by W gives the same mean as the dense parameters."""

    def __init__(self, ep_size: int, experts: int, top_k: int, timeout_s: float = 300.0) -> None:
        init = dist.is_available() and dist.is_initialized()
        self.world = dist.get_world_size() if init else 1
        self.rank = dist.get_rank() if init else 0
        if ep_size > 1 and not init:
            raise ValueError(f"--expert-parallel {ep_size} needs torch.distributed (torchrun)")
        check_expert_parallel(experts, top_k, ep_size, self.world)
        self.size, self.experts, self.timeout_s = ep_size, experts, timeout_s
        self.local = experts // ep_size
        self.ep_rank = self.rank % ep_size
        self.first_expert = self.ep_rank * self.local
        self.group: Any = None
        self.dp_group: Any = None
        self.world_group: Any = dist.group.WORLD if init else None
        if init:
            timeout = datetime.timedelta(seconds=timeout_s)
            # Every rank creates every group, in the same order (torch.distributed's rule).
            for g in range(self.world // ep_size):
                ranks = list(range(g * ep_size, (g + 1) * ep_size))
                pg = dist.new_group(ranks, timeout=timeout)
                if self.rank in ranks:
                    self.group = pg
            for j in range(ep_size):
                ranks = list(range(j, self.world, ep_size))
                pg = dist.new_group(ranks, timeout=timeout)
                if self.rank in ranks:
                    self.dp_group = pg
        self.dp_size = self.world // ep_size

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: List[int],
                   in_splits: List[int], what: str) -> None:
        try:
            work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group,
                                          async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise RuntimeError(
                f"expert parallel: all-to-all ({what}) on rank {self.rank} failed or timed out "
                f"after {self.timeout_s:g} s; a peer of expert-parallel group "
                f"{self.rank // self.size} may have died: {e}") from e

    def dispatch_compute(self, xs: torch.Tensor, counts: torch.Tensor,
                         compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                         ) -> torch.Tensor:
        """xs: rows sorted by global expert, counts int64 [E]. Sends each row to the rank holding
        its expert, runs ``compute(rows sorted by local expert, local counts [E/N])`` there and
        brings the results back in xs's order."""
        n, el = self.size, self.local
        recv = torch.empty_like(counts)
        self.all_to_all(recv, counts.contiguous(), [el] * n, [el] * n, "expert counts")
        rc = recv.view(n, el)  # [source rank, local expert]
        in_splits = counts.view(n, el).sum(1).tolist()
        out_splits = rc.sum(1).tolist()
        xr = _AllToAll.apply(xs, out_splits, in_splits, self, "tokens to experts")
        key = _group_ids(rc.reshape(-1), xr.shape[0]) % el  # local expert of each received row
        perm = torch.sort(key, stable=True).indices
        yr = compute(xr[perm], rc.sum(0))
        back = torch.empty_like(perm)
        back[perm] = torch.arange(perm.numel(), device=perm.device)
        return _AllToAll.apply(yr[back], in_splits, out_splits, self, "results to tokens")

    def global_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over all ranks (no autograd): the router's load fractions for the aux loss."""
        t = t.clone()
        if self.world_group is not None and self.world > 1:
            dist.all_reduce(t, group=self.world_group)
        return t

    def reduce_expert_grads(self, params: Sequence[torch.nn.Parameter]) -> int:
        """Note [Expert gradients]: sum over the expert-data-parallel group, divide by the world
        size. Returns the bytes all-reduced (0 when the group is one rank)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return 0
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.dp_size > 1:
            work = dist.all_reduce(flat, group=self.dp_group, async_op=True)
            try:
                work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
            except RuntimeError as e:
                raise RuntimeError(f"expert parallel: expert-gradient all-reduce on rank "
                                   f"{self.rank} failed or timed out after {self.timeout_s:g} s: "
                                   f"{e}") from e
        flat /= self.world
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
        return flat.numel() * flat.element_size() if self.dp_size > 1 else 0

    def describe(self) -> Dict[str, Any]:
        return {"expert_parallel": self.size, "expert_data_parallel": self.dp_size,
                "local_experts": [self.first_expert, self.first_expert + self.local]}


# Note [Expert-parallel checkpoints]
# With --expert-parallel N, rank 0's model and optimizer state (the checkpoint's shared part)
# hold only rank 0's experts, under the same local names (experts.0 ..) every rank uses for its
# own. So every rank also writes its experts' parameters and optimizer state into its per-rank
# file (expert_shard), and on resume loads the shared part first and its own shard over it
# (load_expert_shard). The shard records which experts it holds; resuming with another expert
# layout is refused (the run's identity includes expert_parallel, and the shard is checked).
def _expert_names_and_indices(model: torch.nn.Module, opt: torch.optim.Optimizer
                              ) -> Tuple[List[str], List[int]]:
    ids = {id(p) for p in model.expert_parameters()}
    names = [n for n, p in model.named_parameters() if id(p) in ids]
    order = [p for g in opt.param_groups for p in g["params"]]
    return names, [i for i, p in enumerate(order) if id(p) in ids]


def expert_shard(model: torch.nn.Module, opt: torch.optim.Optimizer,
                 ep: ExpertParallel) -> Dict[str, Any]:
    """This rank's experts for its per-rank checkpoint file (Note [Expert-parallel
    checkpoints]): their parameters by name and their optimizer state by index."""
    names, idx = _expert_names_and_indices(model, opt)
    sd = model.state_dict()
    state = opt.state_dict()["state"]
    return {"first_expert": ep.first_expert, "local": ep.local, "expert_parallel": ep.size,
            "model": {n: sd[n] for n in names},
            "optimizer": {i: state[i] for i in idx if i in state}}


def load_expert_shard(model: torch.nn.Module, opt: torch.optim.Optimizer, ep: ExpertParallel,
                      shard: Optional[Dict[str, Any]]) -> None:
    """Restores this rank's experts over the shared state already loaded. ValueError naming
    what differs when the shard is missing or holds other experts."""
    if shard is None:
        raise ValueError(f"the checkpoint has no expert shard for rank {ep.rank} (it was not "
                         f"written with --expert-parallel {ep.size})")
    have = (shard.get("expert_parallel"), shard.get("first_expert"), shard.get("local"))
    want = (ep.size, ep.first_expert, ep.local)
    if have != want:
        raise ValueError(f"rank {ep.rank}'s expert shard holds experts {have[1]}.."
                         f"{(have[1] or 0) + (have[2] or 0) - 1} of --expert-parallel {have[0]}; "
                         f"this rank holds {want[1]}..{want[1] + want[2] - 1} of "
                         f"--expert-parallel {want[0]}")
    names, idx = _expert_names_and_indices(model, opt)
    if sorted(shard["model"]) != sorted(names):
        raise ValueError(f"rank {ep.rank}'s expert shard names other parameters than this "
                         "model's experts")
    model.load_state_dict(shard["model"], strict=False)
    sd = opt.state_dict()
    for i in idx:  # load_state_dict casts each state to its parameter's device and dtype
        if i in shard["optimizer"]:
            sd["state"][i] = shard["optimizer"][i]
        else:
            sd["state"].pop(i, None)
    opt.load_state_dict(sd)


def clip_grad_norm_(ep: Optional[ExpertParallel], params: Sequence[torch.nn.Parameter],
                    expert_params: Sequence[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ over the whole model when the experts are split across ranks: the dense
    part is the same on every rank, each expert lives on one rank of its expert-parallel group,
    so the squared norm is dense + the expert-parallel group's sum of local expert parts. Without
    expert parallelism it is torch's clip_grad_norm_."""
    if ep is None or ep.size == 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    ids = {id(p) for p in expert_params}
    grads = [p.grad for p in params if p.grad is not None]
    dense = [p.grad for p in params if p.grad is not None and id(p) not in ids]
    expert = [p.grad for p in expert_params if p.grad is not None]

    def sq(gs: List[torch.Tensor]) -> torch.Tensor:
        if not gs:
            return torch.zeros((), dtype=torch.float32, device=grads[0].device)
        return torch.stack([g.detach().float().pow(2).sum() for g in gs]).sum()

    e2 = sq(expert)
    dist.all_reduce(e2, group=ep.group)
    total = (sq(dense) + e2).sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total
