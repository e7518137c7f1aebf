"""Per-microbatch CUDA graphs, static batches and host-sync accounting for the training step.

    step = GraphedStep(model, device, token_buckets=(32, 64, 128), warmup=3)
    out = step(batch, generator, loss_scale=1 / accum)   # forward + backward, graphed when it can
    # out["loss"] etc. are device tensors, valid until the next call

* **Static batches.** Every batch is padded to a shape bucket (text length rounded up to the
  smallest bucket that fits; cameras, image size and horizon are fixed by the dataset) and copied
  into fixed device buffers, one set per bucket, so a captured graph always reads the same
  addresses. Padded text positions are masked, so the losses do not depend on the bucket.
* **Graphs.** After ``warmup`` eager microbatches of the first bucket, the next one is captured:
  forward (under bf16 autocast without its weight cache) and backward into gradients that live at
  fixed addresses (NexusSync's flat buckets, or gradients allocated once here). Later microbatches
  of the bucket are replays. Gradients accumulate in place, so the same graph serves every
  microbatch of an accumulation window. A bucket first seen after a capture gets
  ``warmup_next`` eager microbatches (default 0: captured at once; Note [Later buckets]).
* **Random numbers.** The flow-matching noise and time are drawn outside the graph, from the
  trainer's generator, into static buffers (``Gr00tPolicy.draw_noise``): the same stream of
  numbers as eager mode, new on every replay.
* **Fallback.** A bucket that cannot be graphed runs eager, with one log line naming the reason:
  text longer than the largest bucket, MoE with data-dependent shapes or host reads (a capacity
  limit, expert parallelism, no grouped GEMM: Note [Graphed MoE]), DDP's reducer hooks, no CUDA,
  or a capture that failed.
* **Gradient sync.** Captured backward passes run inside ``NexusSync.no_sync()``: its hooks do
  nothing during capture and never run during replay. The trainer's ``finish()`` after the last
  microbatch then issues every bucket (at world size 1: nothing to send). At world size > 1 the
  all-reduce is therefore not overlapped with the graphed backward (Note [Graphs and NexusSync]
  in docs/trainer.md).
* **Memory.** Captures go to one graph memory pool, shared by the buckets' graphs (they replay
  one at a time on one stream, and each graph's outputs are consumed before the next replay), so
  the pool holds the largest bucket's step, not the sum. Replays allocate nothing. With
  ``grads_in_pool`` (one microbatch a step, nothing to reduce) the gradients are made by the first
  capture inside the pool, where they reuse the blocks of activations freed in backward (Note
  [Gradients in the graph pool]). With
  ``mem_pool`` (the trainer passes MemSculptor's, ``MemSculptor.graph_pool()``) the pool's
  segments come from MemSculptor; otherwise from torch's own graph pool (Note [Graphs and
  MemSculptor] in docs/trainer.md).
"""
from __future__ import annotations

import contextlib
import gc
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from . import _C

__all__ = ["GraphedStep", "SyncCounter", "pad_to_bucket", "parse_buckets", "graph_unavailable"]

# Batch fields a step reads; anything else in the loader's dict is passed through untouched.
_STEP_KEYS = ("images", "tokens", "attention_mask", "state", "action", "action_mask")


def parse_buckets(spec: str) -> Tuple[int, ...]:
    """'32,64,128' -> (32, 64, 128); '' -> (). ValueError naming the bad item."""
    if not spec:
        return ()
    out: List[int] = []
    for item in spec.split(","):
        try:
            v = int(item)
        except ValueError:
            raise ValueError(f"token bucket {item!r} is not an integer (in {spec!r})") from None
        out.append(v)
    try:  # the loader's rule (sorted, deduplicated, positive): one definition for both
        return tuple(_C.sort_token_buckets(out))
    except ValueError as e:
        raise ValueError(f"{e} (in {spec!r})") from None


def pad_to_bucket(batch: Mapping[str, torch.Tensor], buckets: Sequence[int]
                  ) -> Tuple[Dict[str, torch.Tensor], Optional[int]]:
    """Pads tokens/attention_mask to the bucket of their length (masked). Returns (batch, bucket);
    bucket None (batch unchanged) when the text is longer than every bucket or buckets is empty."""
    length = int(batch["tokens"].shape[1])
    i = _C.token_bucket_for(list(buckets), length)  # the loader's choice of bucket
    b = buckets[i] if i >= 0 else None
    if b is None or b == length:
        return dict(batch), b
    out = dict(batch)
    pad = b - length
    out["tokens"] = torch.nn.functional.pad(batch["tokens"], (0, pad))
    out["attention_mask"] = torch.nn.functional.pad(batch["attention_mask"], (0, pad))
    return out, b


def graph_unavailable(model: torch.nn.Module, device: torch.device, sync_kind: str) -> Optional[str]:
    """Why per-microbatch graphs cannot run at all here (None: they can)."""
    if device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if not hasattr(torch.cuda, "graph"):
        return f"torch {torch.__version__} has no torch.cuda.graph"
    cfg = getattr(model, "cfg", None)
    if cfg is not None and getattr(cfg, "moe_experts", 0):
        why = _moe_unavailable(model, cfg)
        if why:
            return why
    if sync_kind == "ddp":
        return "DDP's reducer hooks cannot be captured (use NexusSync)"
    return None


def _moe_unavailable(model: torch.nn.Module, cfg: Any) -> Optional[str]:
    """Why a MoE model's step cannot be captured (None: it can). Note [Graphed MoE]: with every
    assignment kept (no capacity limit), the experts on this rank (no expert parallelism) and
    torch's grouped GEMM (offsets on the device), the MoE layer's shapes depend only on the
    token count (tokens x top-k rows, sorted by expert on the device) and nothing is read back to
    the host, so the step captures like a dense one. A capacity limit keeps a data-dependent
    number of rows, expert parallelism exchanges host-side split sizes, and the padded-bmm
    fallback reads the largest expert's row count back."""
    from .moe import grouped_mm_backend

    if getattr(cfg, "moe_capacity_factor", 0.0) > 0:
        return ("MoE with a capacity limit keeps a data-dependent number of rows, which a CUDA "
                "graph cannot capture")
    layers = model.moe_layers() if hasattr(model, "moe_layers") else []
    if any(getattr(m, "ep", None) is not None and m.ep.size > 1 for m in layers):
        return "expert parallelism exchanges host-side split sizes, which a CUDA graph cannot capture"
    if grouped_mm_backend() != "torch":
        return ("MoE without torch's grouped GEMM (the padded-bmm fallback reads expert sizes back "
                "to the host), which a CUDA graph cannot capture")
    return None


def _reset_generator_after_failed_capture(device: torch.device) -> None:
    """Note [A failed capture and the generator]. Beginning a capture puts the device's default
    CUDA generator into capture mode (its draws advance a per-graph offset); ending the capture
    takes it out. A capture that fails (a host sync in the step, an out-of-memory) ends with
    cudaStreamEndCapture's error, and torch raises before it takes the generator out: every later
    random op on the device then fails with "Offset increment outside graph capture encountered
    unexpectedly", in this step's eager fallback and in everything after it in the process. The
    generator gets a fresh state with the seed and offset it had before the capture (the failed
    capture's draws never ran), which is not in capture mode. torch without graph-safe generator
    states (< 2.4) has no capture mode to leave."""
    gen = torch.cuda.default_generators[device.index if device.index is not None
                                        else torch.cuda.current_device()]
    if hasattr(gen, "graphsafe_set_state") and hasattr(gen, "clone_state"):
        gen.graphsafe_set_state(gen.clone_state())


def _no_compile_under_capture() -> Any:
    """A torch.compile'd function whose guards miss during capture runs eager code instead of
    compiling there: compilation reads the CUDA RNG state, benchmarks kernels and copies to the
    host, and any of those ends the capture. Torch without compiler stances: no change."""
    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return stance("eager_on_recompile") if stance is not None else contextlib.nullcontext()


class SyncCounter:
    """Counts host syncs per training step inside ``window()``.

    Two sources: torch's sync debug mode (``torch.cuda.set_sync_debug_mode``), which flags the
    calls that make the host wait for the device (``.item()``, ``float(t)``, D2H copies into
    pageable memory, ``nonzero``...), and the trainer's own device synchronizations, reported
    through ``explicit()``. ``counts`` holds one count per window; ``examples`` maps each site
    (the innermost frame outside torch) to how often it synchronized."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and torch.cuda.is_available() and hasattr(
            torch.cuda, "set_sync_debug_mode")
        self.counts: List[int] = []
        self.examples: Dict[str, int] = {}
        self._cur: Optional[int] = None

    def explicit(self, where: str) -> None:
        if self._cur is not None:
            self._cur += 1
            self.examples[where] = self.examples.get(where, 0) + 1

    def _site(self) -> str:
        import traceback
        frames = traceback.extract_stack()[:-3]  # drop this hook and the warnings machinery
        for fr in reversed(frames):
            fn = fr.filename.replace("\\", "/")
            if "/torch/" not in fn and "/warnings.py" not in fn and "contextlib" not in fn:
                return f"{fn.rsplit('/', 1)[-1]}:{fr.lineno} {fr.name}"
        return "unknown"

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._cur = 0
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            orig = warnings.showwarning

            def hook(message: Any, category: Any, filename: str, lineno: int,
                     file: Any = None, line: Any = None) -> None:
                if "synchroniz" in str(message) and self._cur is not None:
                    self.explicit(self._site())
                else:
                    orig(message, category, filename, lineno, file, line)

            warnings.showwarning = hook
            prev = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(1)
            # A warning surfacing from the mode switch itself is not a sync of this step (torch
            # reports its first enabling once); every real sync surfaces from the call that made it.
            self._cur = 0
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(prev)
        self.counts.append(self._cur)
        self._cur = None


@dataclass
class _Bucket:
    key: Tuple[Any, ...]
    eager_runs: int = 0
    graph: Any = None
    inputs: Dict[str, torch.Tensor] = field(default_factory=dict)
    noise: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    outputs: Dict[str, torch.Tensor] = field(default_factory=dict)
    eager_reason: str = ""
    replays: int = 0
    scale: float = 1.0


class GraphedStep:
    """Forward + backward of one microbatch, as a CUDA-graph replay where possible.

    Args:
      model: the policy (``draw_noise`` and the trainable parameters).
      runner: what runs the forward (the model, or a compiled/wrapped one) with
        ``runner(batch, noise=, time_u=)`` returning a loss dict; default: the model.
      device: the training device.
      token_buckets: text lengths batches are padded to (static shapes); () = no padding, one
        graph per distinct length.
      warmup: eager microbatches of a bucket before it is captured.
      warmup_next: the same for a bucket first seen once another bucket is captured (None: 0,
        Note [Later buckets]). A runner that compiles per shape (--compile-frozen) needs
        ``warmup`` here too.
      graphs: False = static batches only (eager).
      sync: the trainer's SyncBackend, whose capture_no_sync() a capture runs in.
      autocast_dtype: bf16 on CUDA (None: no autocast).
      max_graphs: buckets captured at most (the rest run eager).
      log: one-line logger.
      mem_pool: a ``torch.cuda.MemPool`` the captures allocate from (None: torch's own graph
        pool). The runner keeps it alive as long as its graphs.
      grads_in_pool: the first capture makes the gradients inside the graph pool (Note
        [Gradients in the graph pool]). Only for one microbatch a step whose gradients are read
        (clip, optimizer) before the next microbatch, and nothing else holds them (no NexusSync
        flat buckets, no DDP).
      pad_up: with grads_in_pool, a batch whose bucket has no graph yet runs in the graph of a
        longer captured bucket of at most ``pad_up`` times its text length (more masked padding)
        instead of a new capture (Note [Padding up to a captured bucket]); 1.0: never.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, *,
                 runner: Optional[Callable[..., Dict[str, torch.Tensor]]] = None,
                 token_buckets: Sequence[int] = (), warmup: int = 3, graphs: bool = True,
                 sync: Any = None, autocast_dtype: Optional[torch.dtype] = torch.bfloat16,
                 max_graphs: int = 8, log: Callable[[str], None] = print,
                 mem_pool: Any = None, warmup_next: Optional[int] = None,
                 grads_in_pool: bool = False, pad_up: float = 1.0) -> None:
        self.model, self.device = model, device
        # (batch, out) -> (noise, u) instead of the generator's draws; None: the generator.
        self.noise_fn: Optional[Callable[..., Any]] = None
        self.runner = runner if runner is not None else model
        self.buckets = tuple(token_buckets)
        self.warmup = max(1, int(warmup))
        self.warmup_next = max(0, int(warmup_next or 0))
        self.sync = sync
        self.autocast_dtype = autocast_dtype if device.type == "cuda" else None
        self.max_graphs = max_graphs
        self.log = log
        sync_kind = getattr(sync, "kind", "none")
        self.disabled_reason = (graph_unavailable(model, device, sync_kind) if graphs
                                else "--cuda-graph off")
        self.graphs_on = graphs and self.disabled_reason is None
        if graphs and not self.graphs_on:
            log(f"[cuda-graph] per-microbatch graphs off: {self.disabled_reason}; running eager")
        self._buckets: Dict[Tuple[Any, ...], _Bucket] = {}
        self._mem_pool = mem_pool if self.graphs_on else None
        self._pool = ((mem_pool.id if mem_pool is not None else torch.cuda.graph_pool_handle())
                      if self.graphs_on else None)
        self._side = torch.cuda.Stream(device) if self.graphs_on else None
        self._grads_ready = False
        self.grads_in_pool = grads_in_pool and self.graphs_on
        self.pad_up = float(pad_up)
        self.padded_up = 0  # microbatches run in a longer bucket's graph
        self._pad_logged: set = set()
        self.captures = 0
        self.capture_failures: List[str] = []
        self._released_graphs = 0  # graphs destroyed by release(), still counted in stats()

    # ---- public -----------------------------------------------------------------------------

    def __call__(self, batch: Mapping[str, torch.Tensor], generator: Optional[torch.Generator],
                 loss_scale: float = 1.0) -> Dict[str, torch.Tensor]:
        padded, bucket_len, key = self._resolve(batch)
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(key)
            b.eager_reason = self._eager_reason(batch, bucket_len)
            if b.eager_reason and self.graphs_on:
                self.log(f"[cuda-graph] bucket {self._describe(key)} runs eager: {b.eager_reason}")
        if not self.graphs_on or b.eager_reason:
            return self._eager(padded, generator, loss_scale)
        if b.graph is not None and b.scale == loss_scale:
            return self._replay(b, padded, generator)
        if b.graph is not None:  # another accumulation factor than at capture: rare, stay correct
            return self._eager(padded, generator, loss_scale)
        if b.eager_runs < self._warmup_of(b):
            b.eager_runs += 1
            return self._eager(padded, generator, loss_scale, side_stream=True)
        return self._capture(b, padded, generator, loss_scale)

    @property
    def keeps_grads(self) -> bool:
        """Whether the gradients must stay allocated between steps (zeroed in place, never set
        to None): a captured graph writes them at fixed addresses. With grads_in_pool, not before
        the first capture: the eager warm-up steps then drop them as tuned PyTorch does, so that
        the warm-up's peak does not hold them during the forward either (Note [Gradients in the
        graph pool])."""
        return self.graphs_on and (not self.grads_in_pool or self._grads_ready)

    def stats(self) -> Dict[str, Any]:
        return {
            "enabled": self.graphs_on,
            "reason": self.disabled_reason or "",
            "token_buckets": list(self.buckets),
            "graphs": (sum(1 for b in self._buckets.values() if b.graph is not None)
                       + self._released_graphs),
            "captures": self.captures,
            "capture_failures": list(self.capture_failures),
            "replays": sum(b.replays for b in self._buckets.values()),
            "padded_up": self.padded_up,
            "eager_buckets": {self._describe(k): b.eager_reason
                              for k, b in self._buckets.items() if b.eager_reason},
        }

    def release(self) -> None:
        """Destroys the captured graphs and drops their static buffers (inputs, noise, outputs)
        and this runner's references to the model, runner and sync, so that the run's teardown
        frees them (loongforge.train.run, before MemSculptor closes). Waits for the device first:
        a replay may still be running. The runner cannot step afterwards; stats() still reports
        what it did. Idempotent."""
        if self.graphs_on and any(b.graph is not None for b in self._buckets.values()):
            torch.cuda.synchronize(self.device)
        for b in self._buckets.values():
            if b.graph is not None:
                self._released_graphs += 1
            b.graph, b.inputs, b.noise, b.outputs = None, {}, None, {}
        if self.grads_in_pool and self.model is not None:
            self._drop_grads()  # they are the pool's blocks: the pool goes back after this
        self.model = self.runner = self.sync = None
        self._pool = self._side = self._mem_pool = None

    def static_inputs(self, batch: Mapping[str, torch.Tensor]) -> Optional[Dict[str, torch.Tensor]]:
        """The fixed buffers the graph of this batch's bucket reads (None: not graphed)."""
        _, _, key = self._resolve(batch, count=False)
        b = self._buckets.get(key)
        return b.inputs if b is not None and b.graph is not None else None

    # ---- internals --------------------------------------------------------------------------

    # Note [Padding up to a captured bucket]. With the gradients in the graph pool (Note
    # [Gradients in the graph pool]) a later bucket's capture cannot put its forward's activations
    # where the gradients live: the first graph's gradients exist while it captures, and it
    # accumulates into them. The pool then grows by about the gradients' size (n16 at batch 16:
    # 36.4 GiB allocated with a second bucket, 32.5 GiB with one, on an H200). A batch whose bucket
    # has no graph therefore runs in the graph of the shortest captured bucket that holds it,
    # when that bucket is at most pad_up times its text length: the extra text is masked padding,
    # as the bucket's own padding is (the same loss up to bf16 rounding), and costs only the
    # extra tokens' compute (n16: 8 more text tokens on 128 image tokens + 48). Longer batches,
    # and shorter ones beyond pad_up, are captured as before.
    def _resolve(self, batch: Mapping[str, torch.Tensor], count: bool = True
                 ) -> Tuple[Dict[str, torch.Tensor], Optional[int], Tuple[Any, ...]]:
        """(the batch padded to its bucket, that bucket, the key of the graph it runs in)."""
        padded, bucket_len = pad_to_bucket(batch, self.buckets)
        key = self._key(padded)
        b = self._buckets.get(key)
        if (self.pad_up <= 1.0 or not self.grads_in_pool or bucket_len is None
                or (b is not None and (b.graph is not None or b.eager_reason))):
            return padded, bucket_len, key
        for up in self.buckets:
            if up <= bucket_len or up > self.pad_up * bucket_len:
                continue
            cand, _ = pad_to_bucket(padded, (up,))
            ck = self._key(cand)
            o = self._buckets.get(ck)
            if o is None or o.graph is None:
                continue
            if count:
                self.padded_up += 1
                if key not in self._pad_logged:
                    self._pad_logged.add(key)
                    self.log(f"[cuda-graph] bucket {self._describe(key)} runs in the graph of "
                             f"{self._describe(ck)} (padded up: Note [Padding up to a captured "
                             "bucket])")
            return cand, up, ck
        return padded, bucket_len, key

    def _step_keys(self, batch: Mapping[str, torch.Tensor]) -> List[str]:
        """The batch fields the step reads (static input buffers, graph key); a runner of other
        batches (loongforge.forge) names its own."""
        return [k for k in _STEP_KEYS if k in batch]

    def _key(self, batch: Mapping[str, torch.Tensor]) -> Tuple[Any, ...]:
        return tuple((k, tuple(batch[k].shape), batch[k].dtype) for k in self._step_keys(batch))

    @staticmethod
    def _describe(key: Tuple[Any, ...]) -> str:
        shapes = dict((k, s) for k, s, _ in key)
        tok = shapes.get("tokens", (0, 0))
        return f"B{tok[0]}xL{tok[1]}"

    def _eager_reason(self, batch: Mapping[str, torch.Tensor], bucket_len: Optional[int]) -> str:
        if self.buckets and bucket_len is None:
            return (f"text length {int(batch['tokens'].shape[1])} exceeds the largest token "
                    f"bucket {self.buckets[-1]}")
        if sum(1 for b in self._buckets.values() if not b.eager_reason) > self.max_graphs:
            return f"more than {self.max_graphs} shape buckets (raise --graph-max or set buckets)"
        return ""

    # Note [Later buckets]. Eager microbatches allocate from torch's default pool. Before the
    # first capture that costs nothing: torch.cuda.graph() empties the default pool's cache as it
    # begins, so the warm-up's blocks go back before the graph pool grows. A bucket first seen
    # later (a batch of shorter text at step 35) would warm up in the default pool while the graph
    # pool stays reserved, and the run's reserved peak would hold two steps' activations (on an
    # H200: 45.1 GiB reserved for 36.6 allocated at batch 16, two buckets; 4.6% at batch 64, one).
    # What the warm-up is for (cuBLAS handles and workspaces, the side stream's first use, lazy
    # module state) was done by the first bucket, and another text length changes no kernel's
    # set-up, so a later bucket is captured at once, into the graph pool, reusing the blocks the
    # first capture freed. A runner that compiles per shape (--compile-blocks, --compile-frozen)
    # still needs eager calls of the new shape (the trainer passes warmup_next=warmup then). A
    # failed capture is not retried: on torch 2.11 it leaves the default CUDA generator in capture
    # mode (the capture's epilogue never runs), and a later eager draw from it fails ("Offset
    # increment outside graph capture"); the bucket runs eager, as before.
    def _warmup_of(self, b: _Bucket) -> int:
        later = any(o.graph is not None for o in self._buckets.values() if o is not b)
        return self.warmup_next if later else self.warmup

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # The weight-cast cache must be off under capture (its tensors would leak out of the graph).
        return torch.autocast("cuda", dtype=self.autocast_dtype, cache_enabled=False)

    def _forward_backward(self, batch: Mapping[str, torch.Tensor],
                          noise: Tuple[torch.Tensor, torch.Tensor],
                          loss_scale: float) -> Dict[str, torch.Tensor]:
        with self._autocast():
            out = self.runner(batch, noise=noise[0], time_u=noise[1])
        (out["loss"] * loss_scale).backward()
        return {k: v.detach() for k, v in out.items()}

    def _draw(self, batch: Mapping[str, torch.Tensor], generator: Optional[torch.Generator],
              out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
              ) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.noise_fn is not None:  # the trainer's per-sample noise (train.SampleNoise)
            return self.noise_fn(batch, out)
        b, horizon = batch["action"].shape[:2]
        return self.model.draw_noise(int(b), int(horizon), batch["action"].device, generator, out)

    def _eager(self, batch: Mapping[str, torch.Tensor], generator: Optional[torch.Generator],
               loss_scale: float, side_stream: bool = False,
               noise: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
        if noise is None:
            noise = self._draw(batch, generator)
        if not side_stream or self._side is None:
            return self._forward_backward(batch, noise, loss_scale)
        # Warm-up before capture runs on a side stream (lazy inits and workspace allocations
        # then happen outside the ambient stream, as torch's CUDA-graph notes recommend).
        cur = torch.cuda.current_stream(self.device)
        self._side.wait_stream(cur)
        with torch.cuda.stream(self._side):
            out = self._forward_backward(batch, noise, loss_scale)
        cur.wait_stream(self._side)
        return out

    # Note [Gradients in the graph pool]. A graph's backward writes its gradients at fixed
    # addresses, so they used to be allocated once, before the first capture, and to live for the
    # whole run beside the pool: one more copy of the trainable parameters at the forward's peak,
    # where tuned PyTorch (zero_grad(set_to_none=True)) holds none (n16: 1.71B fp32 gradients,
    # 6.4 GiB; n16-moe 13 GiB). With one microbatch a step and nothing else holding them, the first
    # capture starts with every gradient None, so autograd makes them inside the capture, from
    # the pool, in blocks the forward's activations left free as backward ran: at replay those
    # addresses hold activations during the forward and gradients after backward. That is safe
    # because each step reads the gradients (clip, optimizer, zeroing) before the next replay
    # begins, on the same stream. The first graph assigns its gradients (no read of the old
    # ones); later buckets' graphs, captured while those gradients exist, accumulate into them,
    # so the trainer's in-place zeroing before each step keeps every bucket right. Gradient
    # accumulation over microbatches (the forward of the second would overwrite the first's
    # gradients), NexusSync's flat buckets and DDP keep gradients allocated up front.
    def _drop_grads(self) -> None:
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = None

    def _ensure_grads(self) -> None:
        """Gradients must live at fixed addresses before capture: NexusSync's bucket views, or
        zeros allocated once here (the trainer then zeroes them in place, never sets None); with
        grads_in_pool, none before the first capture (Note [Gradients in the graph pool])."""
        if self._grads_ready:
            return
        if self.grads_in_pool:
            self._drop_grads()  # the first capture makes them; _capture marks them ready
            return
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        self._grads_ready = True

    def _copy_in(self, b: _Bucket, batch: Mapping[str, torch.Tensor]) -> None:
        for k, dst in b.inputs.items():
            dst.copy_(batch[k], non_blocking=True)

    def _capture(self, b: _Bucket, batch: Mapping[str, torch.Tensor],
                 generator: Optional[torch.Generator], loss_scale: float) -> Dict[str, torch.Tensor]:
        self._ensure_grads()
        b.inputs = {k: torch.empty_like(batch[k]) for k in self._step_keys(batch)}
        self._copy_in(b, batch)
        b.noise = self._draw(batch, generator)  # this microbatch's draws, in static buffers
        no_sync = (self.sync.capture_no_sync() if self.sync is not None
                   else contextlib.nullcontext())
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        try:
            # thread_local: the loader's threads keep calling CUDA (decode, copies on their own
            # streams) while this thread captures; only this thread's unsafe calls are refused.
            with no_sync, _no_compile_under_capture(), \
                    torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                b.outputs = self._forward_backward(b.inputs, b.noise, loss_scale)
        except Exception as e:  # noqa: BLE001 - any capture failure falls back to eager
            why = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        else:
            why = ""
        if why:
            _reset_generator_after_failed_capture(self.device)
            # Outside the except clause: the exception's traceback, and with it the frames that
            # hold the failed capture's activations, is gone before the eager run allocates (an
            # out-of-memory capture otherwise leaves its blocks allocated under the eager
            # fallback, which then runs out too: measured at batch 72 under a 40 GiB cap).
            noise = b.noise
            b.inputs, b.outputs, b.noise = {}, {}, None
            del graph
            if self.grads_in_pool and not self._grads_ready:
                self._drop_grads()  # made by the failed capture: the eager run makes its own
            self.capture_failures.append(f"{self._describe(b.key)}: {why}")
            gc.collect()  # frames caught in a reference cycle would hold activations until later
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            b.eager_reason = why
            self.log(f"[cuda-graph] bucket {self._describe(b.key)} runs eager: {why}")
            # This microbatch's numbers were drawn into b.noise: the eager run uses them, so the
            # generator's stream stays that of an eager run.
            return self._eager(batch, generator, loss_scale, noise=noise)
        b.graph = graph
        b.scale = loss_scale
        self._grads_ready = True  # with grads_in_pool: made by this capture, in the pool
        self.captures += 1
        self.log(f"[cuda-graph] captured bucket {self._describe(b.key)} after {b.eager_runs} "
                 f"eager warm-up microbatches")
        graph.replay()  # capture records the work; this runs it for the current microbatch
        b.replays += 1
        return b.outputs

    def _replay(self, b: _Bucket, batch: Mapping[str, torch.Tensor],
                generator: Optional[torch.Generator]) -> Dict[str, torch.Tensor]:
        self._copy_in(b, batch)
        self._draw(batch, generator, out=b.noise)
        b.graph.replay()
        b.replays += 1
        return b.outputs
