"""The trainer's figures: the per-step readback, the Chrome trace and the run summary.

Figures (docs/trainer.md, "Output"), measured after --warmup steps:
tokens/GPU/s = (VLM input tokens + B x (1 + action_horizon)) / step time / GPUs, where VLM input
tokens = B x cameras x image tokens + the non-padding text tokens; samples/s; step time p50/p95;
the share of step time waiting for data, exposed communication and checkpoint stall; blocking
time per checkpoint save; peak memory; model FLOPs per step and MFU (loongforge.flops).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import resource
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .flops import peak_flops
from .models.gr00t import Gr00tPolicy, count_parameters

if TYPE_CHECKING:
    from .comm import SyncBackend
    from .memory import MemSculptorSession
    from .trainer.checkpoint import Checkpointer
    from .trainer.dist import Dist
# ------------------------------------------------------------------------------------------------
# Step timing and trace


class Trace:
    """Chrome-trace (Perfetto) 'X' events of a window of steps."""

    def __init__(self, first_step: int, steps: int, rank: int, sync: Callable[[], None]) -> None:
        self.first, self.last = first_step, first_step + steps - 1
        self.rank, self.sync = rank, sync
        self.events: List[Dict[str, Any]] = []
        self.t0 = time.perf_counter()
        self.step = -1

    def active(self) -> bool:
        return self.first <= self.step <= self.last

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        if not self.active():
            yield
            return
        self.sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.events.append({"name": name, "ph": "X", "pid": self.rank, "tid": 0,
                                "ts": (t - self.t0) * 1e6,
                                "dur": (time.perf_counter() - t) * 1e6,
                                "args": {"step": self.step}})

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)


class Readback:
    """Per-step figures computed on the device and read back ``lag`` steps later.

    Each step accumulates [loss, fm_loss, aux_loss, text tokens, grad norm, skipped, sum of the
    squared text lengths] in a device tensor
    (no ``float(t)`` per microbatch), copies it into pinned host memory without blocking and
    records a CUDA event. lag 0: the trainer synchronized at the end of the step and the values
    are read at once (step time from host clocks). lag > 0 (--sync-free): a step's values are read
    ``lag`` steps later, when its event has long completed, so the host never waits for work it
    just queued and the GPU queue never drains; step times then come from the events (the GPU's
    timeline)."""

    def __init__(self, device: torch.device, lag: int,
                 flops_poly: Optional[Tuple[float, float, float]] = None) -> None:
        """flops_poly: FlopsPerShape.length_polynomial(); each row's "flops" is then counted at
        the samples' real text lengths (rows carry "samples")."""
        self.device, self.lag, self.flops_poly = device, lag, flops_poly
        self.cuda = device.type == "cuda"
        self.pending: "deque[Any]" = deque()
        self.t_prev = time.perf_counter()
        self.prev_event: Any = None

    def begin(self) -> torch.Tensor:
        # [loss, fm_loss, aux_loss, text tokens, grad norm, optimizer step skipped (non-finite),
        #  sum over samples of the squared text length]
        return torch.zeros(7, device=self.device)

    @staticmethod
    def add_micro(acc: torch.Tensor, out: Dict[str, torch.Tensor], mask: torch.Tensor,
                  accum: int, moe: bool) -> None:
        aux = out["aux_loss"].detach().float() if moe else torch.zeros((), device=acc.device)
        lens = mask.sum(dim=1).to(acc.device).float()
        vals = torch.stack([out["loss"].detach().float(), out["fm_loss"].detach().float(), aux,
                            lens.sum() * accum])
        acc[:4] += vals / accum
        acc[6] += (lens * lens).sum()

    def end(self, acc: torch.Tensor, row: Dict[str, Any], clip: bool, moe: bool,
            flag: Optional[torch.Tensor] = None) -> None:
        """flag: an int64 device scalar read back with the figures as row['bad_token_sample']
        (the trainer's TokenGuard)."""
        ev = None
        host_flag = None
        if self.cuda:
            host = torch.empty(7, pin_memory=True)
            host.copy_(acc, non_blocking=True)
            if flag is not None:
                host_flag = torch.empty((), dtype=torch.int64, pin_memory=True)
                host_flag.copy_(flag, non_blocking=True)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        else:
            host = acc
            host_flag = flag
        self.pending.append((row, host, ev, time.perf_counter(), clip, moe, host_flag))

    def ready(self) -> List[Dict[str, Any]]:
        out = []
        while len(self.pending) > self.lag:
            out.append(self._finish(self.pending.popleft()))
        return out

    def drain(self) -> List[Dict[str, Any]]:
        out = []
        while self.pending:
            out.append(self._finish(self.pending.popleft()))
        return out

    def _finish(self, item: Any) -> Dict[str, Any]:
        row, host, ev, t_host, clip, moe, host_flag = item
        if ev is not None:
            ev.synchronize()  # long complete when lag > 0: the host does not wait here
        loss, fm, aux, text_tokens, gnorm, skipped, len_sq = host.tolist()
        if self.lag > 0 and ev is not None and self.prev_event is not None:
            step_s = self.prev_event.elapsed_time(ev) / 1e3
        else:
            step_s = t_host - self.t_prev
        self.t_prev, self.prev_event = t_host, ev
        r = dict(row)
        if self.flops_poly is not None:
            c0, c1, c2 = self.flops_poly
            r["flops_padded"] = row.get("flops", float("nan"))
            r["flops"] = c0 * row["samples"] + c1 * text_tokens + c2 * len_sq
        r.update(loss=loss, grad_norm=gnorm if clip else float("nan"), step_s=step_s,
                 skipped_nonfinite=int(skipped),
                 tokens=row["tokens"] + int(round(text_tokens)), fm_loss=fm)
        if moe:
            r["aux_loss"] = aux
        if host_flag is not None:
            r["bad_token_sample"] = int(host_flag)
        return r



# Parts of a step that --profile-modules times ("other": the rest of the step, e.g. the loss,
# gradient sync, readback; Note [Module breakdown]).
MODULE_PARTS = ("data", "vision", "llm", "projector", "dit", "backward", "optimizer")


class ModuleProfiler:
    """--profile-modules N: torch.profiler over N steps after warm-up, with a named range around
    each part of the step (the data fetch, the model's vision / llm / projector / dit forward,
    backward, the optimizer step).

    Note [Module breakdown]. A part's time is the wall time of its range, with the device
    synchronized at every range edge in the profiled steps, so that a range holds exactly the
    GPU work it queued (kernels run asynchronously otherwise; backward kernels are launched by
    autograd's device thread, which profiler ranges of the main thread do not cover). On a GPU
    each part also gets ``device_ms``, the kernel time the profiler attributes to it
    (``device_time_total``, ``cuda_time_total`` on older torch; backward: autograd's
    evaluate_function events). The profiled steps are excluded from the timed figures (the
    syncs and the profiler slow them), and the model's ranges exist only while profiling:
    a normal run pays one no-op context per part. CUDA graphs would hide the ranges inside
    their replays, so the trainer refuses --cuda-graph per_microbatch (and --token-buckets,
    --compile) with this option, and --cuda-graph auto resolves to off."""

    def __init__(self, first_step: int, steps: int, device: torch.device,
                 sync: Callable[[], None]) -> None:
        self.first, self.last = first_step, first_step + steps - 1
        self.cuda = device.type == "cuda"
        self.sync = sync
        self.prof: Any = None
        self.step_s: List[float] = []
        self.t_step = 0.0
        self.result: Optional[Dict[str, Any]] = None

    def active(self, step: int) -> bool:
        return self.first <= step <= self.last

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        self.sync()
        with torch.autograd.profiler.record_function("lf::" + name):
            try:
                yield
            finally:
                self.sync()

    def begin_step(self, step: int) -> None:
        if not self.active(step):
            return
        from .models.gr00t import set_profile_ranges

        if self.prof is None:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            # Shapes: the op ranking (top_ops) tells a weight's cast from an activation's.
            self.prof = torch.profiler.profile(activities=acts, record_shapes=True)
            self.prof.start()
            set_profile_ranges(self.range)
        self.sync()
        self.t_step = time.perf_counter()

    def end_step(self, step: int) -> None:
        if not self.active(step):
            return
        self.sync()
        self.step_s.append(time.perf_counter() - self.t_step)
        if step == self.last:
            self.finish()

    def finish(self) -> None:
        """Stops the profiler (also after a run that ended inside the window) and computes
        the breakdown."""
        if self.prof is None:
            return
        from .models.gr00t import set_profile_ranges

        set_profile_ranges(None)
        self.prof.stop()
        avgs = list(self.prof.key_averages(group_by_input_shape=True))
        self.prof = None
        self.result = module_breakdown(avgs, self.step_s, self.cuda)


def _device_us(e: Any) -> float:
    for attr in ("device_time_total", "cuda_time_total"):  # renamed in torch 2.4
        if hasattr(e, attr):
            return float(getattr(e, attr))
    return 0.0


def module_breakdown(avgs: Sequence[Any], step_s: Sequence[float], cuda: bool) -> Dict[str, Any]:
    """The summary's "module_breakdown" from profiler averages (key, count, cpu_time_total in
    microseconds) of the lf:: ranges and the profiled steps' wall times (Note [Module
    breakdown]): per part ms per step and share of the step; "other" is the rest."""
    n = len(step_s)
    step_ms = sum(step_s) / n * 1e3 if n else float("nan")
    # A range is also listed as a GPU user annotation under the same key (torch 2.x, CUDA
    # activity on), with no CPU time: the CPU entry is the range's wall time.
    by_key = {e.key: e for e in avgs if not _on_device(e)}
    parts: Dict[str, Dict[str, float]] = {}
    for name in MODULE_PARTS:
        e = by_key.get("lf::" + name)
        ms = e.cpu_time_total / 1e3 / n if e is not None and n else 0.0
        row = {"ms": ms, "share": ms / step_ms if n else float("nan")}
        if cuda:
            dev = _device_us(e) if e is not None else 0.0
            if name == "backward":  # kernels launched by autograd's device thread
                dev = max(dev, sum(_device_us(a) for a in avgs
                                   if a.key.startswith("autograd::engine::evaluate_function")))
            row["device_ms"] = dev / 1e3 / n if n else 0.0
        parts[name] = row
    other = max(0.0, step_ms - sum(p["ms"] for p in parts.values())) if n else float("nan")
    parts["other"] = {"ms": other, "share": other / step_ms if n else float("nan")}
    out = {"steps": n, "step_ms": step_ms, "parts": parts,
           "timing": "wall time per range, device synchronized at range edges" +
                     ("; device_ms: kernel time" if cuda else "")}
    if cuda and n:
        out.update(top_kernels(avgs, n))
        out["ops"] = top_ops(avgs, n)
    return out


def _on_device(e: Any) -> bool:
    return str(getattr(e, "device_type", "")).rsplit(".", 1)[-1] == "CUDA"


# Kernel classes by name, first match wins (torch's and cuBLAS's kernel names on Hopper).
KERNEL_CLASSES = (("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_")),
                  ("attention", ("flash", "fmha", "attention", "efficient")),
                  ("optimizer", ("multi_tensor_apply", "fused_adam")),
                  ("norm/reduce", ("norm", "reduce", "softmax")),
                  ("copy/cast", ("copy",)),
                  ("elementwise", ("elementwise",)))


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def top_kernels(avgs: Sequence[Any], steps: int, top: int = 15) -> Dict[str, Any]:
    """The device kernels of the profiled steps, largest first: per kernel name ms and launches
    per step ("kernels", the first ``top``), per class of kernel ("kernel_classes": gemm,
    attention, ...) and all kernels' time per step ("kernel_ms"): what the GPU ran, against the
    step's wall time (the rest is launch gaps and syncs). The profiler's GPU user annotations
    (the lf:: ranges, Optimizer.step) span kernels and are not kernels themselves."""
    rows = []
    for a in avgs:
        if not _on_device(a) or getattr(a, "is_user_annotation", False):
            continue
        if a.key.startswith(("lf::", "Optimizer.", "ProfilerStep")):
            continue
        us = _self_device_us(a)
        if us > 0:
            rows.append((us, a.key, int(a.count)))
    rows.sort(reverse=True)
    classes: Dict[str, float] = {}
    for us, k, _ in rows:
        classes[kernel_class(k)] = classes.get(kernel_class(k), 0.0) + us / 1e3 / steps
    return {"kernel_ms": sum(r[0] for r in rows) / 1e3 / steps,
            "kernel_classes": dict(sorted(classes.items(), key=lambda kv: -kv[1])),
            "kernels": [{"name": k, "ms": us / 1e3 / steps, "calls": c / steps}
                        for us, k, c in rows[:top]]}


def _self_device_us(e: Any) -> float:
    return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))


def top_ops(avgs: Sequence[Any], steps: int, top: int = 15) -> List[Dict[str, Any]]:
    """The operators (aten::*, forward and backward) whose own kernels took the most device
    time, per (operator, input shapes): ms and calls per step, largest first. A kernel's name
    says what it computes (a bf16 copy, a float add); the operator and its shapes say where:
    a weight's cast and an activation's have different shapes. Needs a profile taken with
    record_shapes and averaged with group_by_input_shape."""
    rows = []
    for a in avgs:
        if _on_device(a) or not a.key.startswith("aten::"):
            continue
        us = _self_device_us(a)
        if us > 0:
            shapes = [list(x) for x in (getattr(a, "input_shapes", None) or []) if x]
            rows.append((us, a.key, str(shapes) if shapes else "", int(a.count)))
    rows.sort(key=lambda r: -r[0])
    return [{"op": k, "shapes": sh, "ms": us / 1e3 / steps, "calls": c / steps}
            for us, k, sh, c in rows[:top]]


# Namespaces and wrappers that every elementwise kernel's name repeats; the functor or the
# kernel function inside them says what the kernel does.
_KERNEL_NOISE = re.compile(r"^void |\(anonymous namespace\)::|\b(?:at::native::|at::|c10::|std::)")
_KERNEL_WHAT = re.compile(
    r"\b(\w*(?:Functor|_functor)\w*(?:<[\w:, ]*>)?|\w+_kernel_cuda|\w+_kernel_impl\w*)")


def short_kernel_name(name: str, width: int = 90) -> str:
    """A kernel's name for a line of text: the outer kernel and what it applies (the functor or
    the function inside torch's elementwise wrappers, e.g. ``vectorized_elementwise_kernel
    [bfloat16_copy_kernel_cuda]``), or the name cut to ``width``."""
    plain = _KERNEL_NOISE.sub("", name).strip()
    outer = re.match(r"[\w:]+", plain)
    what = [w for w in dict.fromkeys(_KERNEL_WHAT.findall(plain))
            if not w.startswith(("gpu_kernel_impl", "elementwise_kernel"))]
    if outer and what and len(plain) > width:
        short = f"{outer.group(0)} [{', '.join(what[:3])}]"
        if len(short) <= width:
            return short
    return plain if len(plain) <= width else plain[:width - 3] + "..."


def format_kernels(b: Dict[str, Any], width: int = 90) -> List[str]:
    """The kernel ranking of a module breakdown, a line per kernel (none on a CPU)."""
    if "kernels" not in b:
        return []
    total = b["kernel_ms"] or float("nan")
    classes = ", ".join(f"{k} {v:.1f} ms {v / total:.0%}" for k, v in b["kernel_classes"].items())
    lines = [f"   device kernels: {b['kernel_ms']:.1f} ms/step of {b['step_ms']:.1f} "
             f"({b['kernel_ms'] / b['step_ms']:.0%}): {classes}; largest:"]
    for k in b["kernels"]:
        lines.append(f"     {k['ms']:7.2f} ms {k['ms'] / b['kernel_ms']:4.0%} "
                     f"x{k['calls']:<6.0f} {short_kernel_name(k['name'], width)}")
    if b.get("ops"):
        lines.append("   operators by their kernels' time (forward and backward), with input shapes:")
        for o in b["ops"]:
            lines.append(f"     {o['ms']:7.2f} ms {o['ms'] / b['kernel_ms']:4.0%} "
                         f"x{o['calls']:<6.0f} {o['op']} {o['shapes'][:width]}")
    return lines


def _phases(phases: Dict[str, float]) -> str:
    """The start-up phases of at least 0.05 s, as " (name s, ...)"; "" when none is."""
    shown = ", ".join(f"{k} {v:.1f}" for k, v in phases.items() if v >= 0.05)
    return f" ({shown})" if shown else ""


def format_breakdown(b: Dict[str, Any]) -> str:
    """One line: each part's ms per step and share."""
    parts = " | ".join(f"{k} {v['ms']:.1f} ms {v['share']:.0%}" for k, v in b["parts"].items())
    return f"   module breakdown ({b['steps']} profiled steps, {b['step_ms']:.1f} ms/step): {parts}"


def percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


def peak_memory(device: torch.device) -> Dict[str, Any]:
    if device.type == "cuda":
        try:
            alloc = torch.cuda.max_memory_allocated(device)
            reserved = torch.cuda.max_memory_reserved(device)
        except RuntimeError:  # a pluggable allocator (MemSculptor) keeps its own statistics
            return {"kind": "cuda", "peak_allocated_bytes": float("nan"),
                    "peak_reserved_bytes": float("nan"), "fragmentation": float("nan")}
        return {"kind": "cuda", "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved,
                "fragmentation": 1 - alloc / reserved if reserved else 0.0}
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"kind": "cpu-rss", "peak_rss_bytes": self_kb * 1024,
            "peak_child_rss_bytes": child_kb * 1024}


def device_name(device: torch.device) -> Optional[str]:
    """The GPU's name (peak table key), None on a CPU."""
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError):
        return None


def mfu_figures(args: argparse.Namespace, d: Dist, rows: List[Dict[str, Any]],
                total_s: float) -> Dict[str, Any]:
    """Model FLOPs per step (loongforge.flops, at each sample's real text length) and MFU =
    FLOPs / step time / the GPU's dense bf16 peak (n/a, NaN, on a CPU or an unknown GPU without
    --peak-tflops). flops_padded_per_step: the same count at the padded lengths the step ran."""
    flops = [r.get("flops", 0.0) for r in rows]
    padded = [r["flops_padded"] for r in rows if "flops_padded" in r]
    name = device_name(d.device)
    peak = peak_flops(name, getattr(args, "peak_tflops", 0.0))
    per_step = sum(flops) / len(flops) if flops else float("nan")
    achieved = sum(flops) / total_s if rows and total_s > 0 else float("nan")
    return {"flops_per_step": per_step, "model_flops_per_s": achieved,
            "flops_padded_per_step": sum(padded) / len(padded) if padded else float("nan"),
            "peak_flops_per_s": peak if peak else float("nan"),
            "peak_source": ("--peak-tflops" if getattr(args, "peak_tflops", 0.0) > 0
                            else name or "cpu"),
            "mfu": achieved / peak if peak else float("nan")}


def save_figures(args: argparse.Namespace, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Blocking time of each checkpoint save in the timed steps (the step's checkpoint stall)."""
    every = getattr(args, "ckpt_every", 0)
    saves = [r["ckpt_stall_s"] for r in rows
             if every and r["step"] % every == 0 and not r.get("ckpt_skipped")]
    return {"ckpt_saves": len(saves),
            "ckpt_block_s_mean": sum(saves) / len(saves) if saves else float("nan"),
            "ckpt_block_s_max": max(saves) if saves else float("nan")}


def wait_by_stage(rows: List[Dict[str, Any]], total_s: float) -> Dict[str, float]:
    """Share of the timed time spent waiting for data, per loader stage that held the batch
    (rows' data_stage, DataFusion only: Note [Held by] in src/data/loader.cc); {} without it."""
    out: Dict[str, float] = {}
    for r in rows:
        if "data_stage" in r:
            out[r["data_stage"]] = out.get(r["data_stage"], 0.0) + r["data_wait_s"] / total_s
    return out


def warmup_figures(args: argparse.Namespace, losses: List[Dict[str, Any]],
                   step_p50_s: float) -> Dict[str, float]:
    """The --warmup steps' wall time, and what they took beyond as many steady steps (p50 of the
    timed ones): torch.compile's compilation, CUDA-graph captures, allocator and cuDNN warm-up,
    reported apart from the timed figures (a recompile after warm-up shows in p95 instead)."""
    warm = [r["step_s"] for r in losses[:getattr(args, "warmup", 0)] if "step_s" in r]
    total = sum(warm)
    excess = total - len(warm) * step_p50_s if step_p50_s == step_p50_s else float("nan")
    return {"warmup_s": total, "warmup_excess_s": max(0.0, excess) if excess == excess else excess}


def summarize(args: argparse.Namespace, d: Dist, rows: List[Dict[str, Any]],
              losses: List[Dict[str, Any]], status: Dict[str, str], model: Gr00tPolicy,
              loader: Any, ckpt: Checkpointer, total_s: float) -> Dict[str, Any]:
    step_s = [r["step_s"] for r in rows]
    tot = sum(step_s) or float("nan")
    counts = count_parameters(model)
    fig = {
        "timed_steps": len(rows),
        "tokens_per_gpu_per_s": sum(r["tokens"] for r in rows) / tot if rows else float("nan"),
        "samples_per_s": sum(r["samples"] for r in rows) * d.world / tot if rows else float("nan"),
        "step_ms_p50": percentile(step_s, 50) * 1e3,
        "step_ms_p95": percentile(step_s, 95) * 1e3,
        "data_wait_share": sum(r["data_wait_s"] for r in rows) / tot if rows else float("nan"),
        "data_wait_by_stage": wait_by_stage(rows, tot),
        "comm_exposed_share": sum(r["comm_exposed_s"] for r in rows) / tot if rows else float("nan"),
        "ckpt_stall_share": sum(r["ckpt_stall_s"] for r in rows) / tot if rows else float("nan"),
        "skipped_nonfinite_steps": sum(r.get("skipped_nonfinite", 0) for r in losses),
        "ckpt_stall_s": ckpt.stall_s,
        "ckpt_bytes_written": ckpt.bytes_written,
        "ckpt_drain_s": ckpt.drain_s,
        "memory": peak_memory(d.device),
    }
    fig.update(warmup_figures(args, losses, fig["step_ms_p50"] / 1e3))
    fig.update(save_figures(args, rows))
    fig.update(ckpt.figures())  # per save: bytes written, durable time; skipped saves
    fig.update(mfu_figures(args, d, rows, tot))
    return {
        "mode": args.mode, "config": args.config, "image_size": args.image_size,
        "batch_size": args.batch_size, "grad_accum": args.grad_accum, "world_size": d.world,
        "device": str(d.device), "seed": args.seed, "steps": args.steps, "warmup": args.warmup,
        "modules": status, "params": counts, "figures": fig, "wall_s": total_s,
        "loader_metrics": _safe_metrics(loader), "loss_curve": losses,
    }


def add_module_figures(summary: Dict[str, Any], ckpt: Checkpointer, sync: SyncBackend,
                       stepper: Any, counter: Any, mem: MemSculptorSession) -> None:
    """The modules' own figures: async checkpoint kind, NexusSync stats, CUDA graphs, host syncs
    (--count-syncs) and MemSculptor's memory figures."""
    if ckpt.async_impl:
        summary["modules"]["async_checkpoint"] = ckpt.async_impl
    if sync.stats():
        summary["nexussync_stats"] = sync.stats()
    if stepper is not None:
        summary["cuda_graph"] = stepper.stats()
    if counter.enabled:
        n = counter.counts
        summary["figures"]["host_syncs_per_step"] = sum(n) / len(n) if n else float("nan")
        summary["figures"]["host_syncs_max"] = max(n) if n else 0
        summary["figures"]["host_sync_sites"] = dict(counter.examples)
    ms_stats = mem.stats()
    if ms_stats is not None:
        m = summary["figures"]["memory"]
        m["memsculptor"] = ms_stats
        pa, pr = ms_stats.get("peak_allocated_bytes"), ms_stats.get("peak_reserved_bytes")
        if mem.scoped:
            # Scoped (torch.cuda.MemPool): torch's caching allocator manages the pool's blocks
            # too, so its counters cover MemSculptor's segments, the CUDA graphs' pool and the
            # rest; MemSculptor's own figures (persistent tensors) stay under "memsculptor".
            m["note"] = "torch's counters (they include the MemSculptor pool's segments)"
        elif pa and pr:  # torch's counters do not see a pluggable allocator
            m.update(peak_allocated_bytes=pa, peak_reserved_bytes=pr, fragmentation=1 - pa / pr)
    if sync.kind == "ddp":
        summary["figures"]["comm_exposed_note"] = (
            "DDP overlaps its all-reduce inside backward; exposed time is not separable here")


def _safe_metrics(loader: Any) -> Dict[str, Any]:
    try:
        return dict(loader.metrics())
    except Exception:  # metrics are informational; never fail a finished run for them
        return {}


def _stages_text(by_stage: Dict[str, float]) -> str:
    """" (decode 0.4%, read 0.1%)": the loader stages behind the data wait, largest first, those
    of at least 0.05% of the time."""
    parts = [f"{k} {v:.1%}" for k, v in sorted(by_stage.items(), key=lambda kv: -kv[1])
             if v >= 0.0005]
    return f" ({', '.join(parts)})" if parts else ""


def format_summary(s: Dict[str, Any]) -> str:
    f = s["figures"]
    mem = f["memory"]
    mem_s = (f"peak alloc {mem['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved "
             f"{mem['peak_reserved_bytes'] / 2**30:.2f} GiB, frag {mem['fragmentation']:.1%}"
             if mem["kind"] == "cuda" else f"peak RSS {mem['peak_rss_bytes'] / 2**20:.0f} MiB")
    lines = [
        f"== {s['mode']} | config {s['config']} @ {s['image_size']}px | batch {s['batch_size']} x "
        f"accum {s['grad_accum']} x world {s['world_size']} | {s['device']} | "
        f"{f['timed_steps']} timed steps",
        "   modules: " + ", ".join(f"{k} {v}" for k, v in s["modules"].items()),
        f"   tokens/GPU/s {f['tokens_per_gpu_per_s']:.1f} | samples/s {f['samples_per_s']:.2f} | "
        f"step p50 {f['step_ms_p50']:.0f} ms p95 {f['step_ms_p95']:.0f} ms | warm-up "
        f"{f['warmup_s']:.1f} s ({f['warmup_excess_s']:.1f} s beyond steady steps: compile, "
        "captures)",
        f"   data wait {f['data_wait_share']:.1%}{_stages_text(f.get('data_wait_by_stage', {}))}"
        f" | exposed comm {f['comm_exposed_share']:.1%} | "
        f"ckpt stall {f['ckpt_stall_share']:.1%} ({f['ckpt_stall_s']:.2f} s)"
        + (f" | ckpt {f['ckpt_saves_committed']} committed, "
           f"{f['ckpt_saves_skipped']} skipped (writer busy), durable "
           f"{f['ckpt_durable_s_mean']:.2f} s mean, {f['ckpt_bytes_per_save_mean'] / 1e6:.1f} MB "
           "a save" if f.get("ckpt_saves_committed") or f.get("ckpt_saves_skipped") else ""),
        f"   model FLOPs/step {f['flops_per_step'] / 1e12:.3f} TFLOP | MFU "
        + (f"{f['mfu']:.1%} of {f['peak_flops_per_s'] / 1e12:.1f} TFLOP/s ({f['peak_source']})"
           if f["mfu"] == f["mfu"] else f"n/a (no dense bf16 peak known for {f['peak_source']}; "
           "--peak-tflops sets one)")
        + (f" | ckpt blocking per save {f['ckpt_block_s_mean']:.3f} s mean, "
           f"{f['ckpt_block_s_max']:.3f} s max ({f['ckpt_saves']} saves)" if f["ckpt_saves"]
           else ""),
        f"   memory: {mem_s}",
        *([f"   start-up {f['startup_s']:.1f} s before the first step"
           + _phases(f["startup_phases_s"])] if "startup_s" in f else []),
        *([format_breakdown(s["module_breakdown"]), *format_kernels(s["module_breakdown"])]
          if "module_breakdown" in s else []),
        *([f"   host syncs per steady-state step: {f['host_syncs_per_step']:.2f} "
           f"(max {f['host_syncs_max']})"] if "host_syncs_per_step" in f else []),
        f"   loss: first {s['loss_curve'][0]['loss']:.4f} last {s['loss_curve'][-1]['loss']:.4f}"
        if s["loss_curve"] else "   loss: (no steps)",
    ]
    return "\n".join(lines)

