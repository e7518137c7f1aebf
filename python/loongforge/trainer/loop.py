"""The run: ``train_loop`` runs a built session's steps, ``run`` builds, runs and reports, and
``resume`` / ``StopSignal`` are how a run starts from a checkpoint and how it stops on a
signal."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist

from .. import knobs
from ..flops import FlopsPerShape
from ..models.gr00t import Gr00tPolicy
from ..train_metrics import add_module_figures, summarize
from . import session as _session
from .checkpoint import Checkpointer, rng_state, set_rng_state
from .dist import Dist
from .errors import NonFiniteError, TrainError
from .optim import lr_lambda, optimizer_step
from .session import Progress, Session, _allocator_settings, _log, build


def moe_metrics(model: Gr00tPolicy) -> Dict[str, Any]:
    """Per-expert assignments (summed over MoE layers) and dropped assignments of the last
    forward, for a metrics row (one host read)."""
    counts, dropped = model.expert_load()
    return {"expert_tokens": counts.tolist(), "dropped_tokens": int(dropped)}


def resume(args: argparse.Namespace, ckpt: Checkpointer, model: Gr00tPolicy,
           opt: torch.optim.Optimizer, sched: Any, loader: Any, noise_gen: torch.Generator,
           log: Callable[[str], None], ep: Any = None) -> int:
    """--resume: restores the latest checkpoint and returns its step (0 without --resume, or
    when the directory holds none yet), and says which."""
    if not args.resume:
        return 0
    st = ckpt.latest()
    if st is None:
        log(f"[{args.mode}] --resume: no checkpoint in {args.ckpt_dir} yet; starting at step 1")
        return 0
    step = int(st["step"])
    if step > args.steps:
        raise TrainError(f"--resume: the latest checkpoint in {args.ckpt_dir} is step {step}, "
                         f"past --steps {args.steps} (a larger --steps continues that run)")
    if step == args.steps:
        log(f"[{args.mode}] --resume: the latest checkpoint in {args.ckpt_dir} is step {step}, "
            f"--steps {args.steps}: nothing left to train (a larger --steps continues)")
    try:
        model.load_state_dict(st["model"])
        before = {p: dict(s) for p, s in opt.state.items()}
        opt.load_state_dict(st["optimizer"])
        from ..memory import state_back_into_place

        state_back_into_place(opt, before)  # Note [The persistent arena]
        sched.load_state_dict(st["scheduler"])
        loader.load_state_dict(st["loader"])
        if ep is not None:
            from ..moe import load_expert_shard

            load_expert_shard(model, opt, ep, st.get("experts"))
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainError(f"--resume: checkpoint step {step} in {args.ckpt_dir} does not fit this "
                         f"run: {first}") from e
    set_rng_state(st["rng"], noise_gen)
    log(f"[{args.mode}] resumed from step {step} of {args.ckpt_dir}")
    apply_changed_flags(args, st.get("flags"), step, opt, sched, log)
    return step


# Note [Flags on --resume]. The flags that shape the saved state (mode, config, --set,
# --image-size, --batch-size, world size, --seed) are in the directory's run.json: a resume that
# differs is refused before it reads anything (Checkpointer, Note [Checkpoint directory
# identity]). The others are the new run's to choose; each checkpoint records them ("flags"),
# and a resume applies and logs every one that changed. The optimizer's and the scheduler's
# state carry the old learning rate and weight decay, so those are written back from the flags
# (the schedule is recomputed at the resumed step when --lr, --lr-warmup, --min-lr-ratio or
# --steps changed).
RESUME_FLAGS = ("steps", "lr", "lr_warmup", "min_lr_ratio", "weight_decay", "clip", "grad_accum",
                "max_nonfinite_steps", "crop_fraction", "augment", "token_pad")
_SCHEDULE_FLAGS = ("steps", "lr", "lr_warmup", "min_lr_ratio")


def saved_flags(args: argparse.Namespace) -> Dict[str, Any]:
    return {k: getattr(args, k) for k in RESUME_FLAGS}


def apply_changed_flags(args: argparse.Namespace, old: Any, step: int,
                        opt: torch.optim.Optimizer, sched: Any,
                        log: Callable[[str], None]) -> List[str]:
    """Writes the flags that changed since the checkpoint into the restored optimizer and
    scheduler, logs each, and returns their names (Note [Flags on --resume])."""
    if not isinstance(old, dict):  # a checkpoint from before flags were recorded
        return []
    changed = [k for k in RESUME_FLAGS if k in old and old[k] != getattr(args, k)]
    for k in changed:
        log(f"[{args.mode}] --resume: --{k.replace('_', '-')} {getattr(args, k)} (the checkpoint's "
            f"run had {old[k]}): applied from step {step + 1}")
    if "weight_decay" in changed:
        for g in opt.param_groups:
            g["weight_decay"] = args.weight_decay
    if any(k in changed for k in _SCHEDULE_FLAGS):
        factor = lr_lambda(args.steps, args.lr_warmup, args.min_lr_ratio)(sched.last_epoch)
        sched.base_lrs = [args.lr for _ in opt.param_groups]
        for g in opt.param_groups:
            g["initial_lr"] = args.lr
            g["lr"] = args.lr * factor
        sched._last_lr = [g["lr"] for g in opt.param_groups]
    return changed


def expert_state(ep: Any, model: Gr00tPolicy, opt: torch.optim.Optimizer) -> Dict[str, Any]:
    """The per-rank "experts" entry of a checkpoint under expert parallelism, else nothing."""
    if ep is None:
        return {}
    from ..moe import expert_shard

    return {"experts": expert_shard(model, opt, ep)}


def params_finite(params: List[torch.nn.Parameter], d: Dist) -> bool:
    """Whether every parameter is finite on every rank (one host sync: at checkpoints only)."""
    ok = torch.stack([torch.isfinite(p.detach()).all() for p in params]).all().to(torch.int32)
    if d.world > 1 and dist.is_initialized():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok)


class StopSignal:
    """SIGTERM, SIGUSR1 and a first SIGINT: stop at the next step boundary, checkpoint there when
    there is a --ckpt-dir, wait for that checkpoint to commit, and exit 0 (a scheduler's
    preemption notice, or Ctrl-C). A second SIGINT exits at once (130), saving nothing.

    Note [Stopping on a signal]. The handler only records the signal; the loop polls at each
    step boundary. With several ranks, every rank must stop after the same step (the next save
    and the collectives of the next step need them all), and a signal may reach one rank only:
    each poll all-reduces the ranks' flags (MAX). With --sync-free steps the reduced flag is
    read back ``lag`` polls later through pinned memory, like the step's figures (Readback), so
    that the host does not wait for the step it just queued; every rank reads the same poll's
    result at the same step, so they still agree. Handlers go in only in the main thread (Python
    allows no other) and the previous ones come back when the run ends."""

    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

    def __init__(self, d: Dist, lag: int, mode: str) -> None:
        self.d, self.lag, self.mode = d, lag, mode
        self.name: Optional[str] = None  # the first signal received
        self.step: Optional[int] = None  # the step the run stopped after
        self._old: Dict[int, Any] = {}
        self._pending: "deque[Any]" = deque()
        self.saved: List[int] = []  # the steps whose checkpoint was not skipped
        self._timer: Optional[threading.Timer] = None
        try:
            self.grace_s = knobs.get("LOONGFORGE_SIGNAL_GRACE_S")
        except ValueError as e:
            raise TrainError(f"{e} (a positive number of seconds)") from None
        if not self.grace_s > 0:
            raise TrainError(f"LOONGFORGE_SIGNAL_GRACE_S must be a positive number of seconds, "
                             f"got {self.grace_s:g}")

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.SIGNALS:
            num = getattr(signal, name)
            self._old[num] = signal.signal(num, self._on_signal)

    def restore(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for num, old in self._old.items():
            signal.signal(num, old)
        self._old = {}

    def _on_signal(self, num: int, _frame: Any) -> None:
        name = signal.Signals(num).name
        if self.name is not None and num == signal.SIGINT:
            os.write(2, f"[{self.mode}] second SIGINT: exiting now, nothing more saved\n".encode())
            self._exit(130)
        if self.name is None:
            self.name = name
            if self.d.is_main:
                os.write(2, f"[{self.mode}] signal {name}: stopping at the next step boundary "
                            "(SIGINT again: exit now)\n".encode())
            # A run stuck before its next step boundary (a loader that yields nothing, a hung
            # collective) must still end: after the grace period it exits as the signal would.
            self._timer = threading.Timer(self.grace_s, self._expire, (num, name))
            self._timer.daemon = True
            self._timer.start()

    def reached(self, step: int) -> None:
        """The run stops after `step`: the boundary is reached, the grace period no longer runs
        (writing the checkpoint may take longer than it)."""
        self.step = step
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self, num: int, name: str) -> None:
        os.write(2, f"[{self.mode}] signal {name}: no step boundary within {self.grace_s:g} s "
                    "(LOONGFORGE_SIGNAL_GRACE_S): exiting without a checkpoint\n".encode())
        self._exit(128 + num)

    @staticmethod
    def _exit(code: int) -> None:
        """Exits now. The DataLoader's worker processes go first: left behind, they would print
        their own tracebacks when the connection to this process breaks."""
        import multiprocessing

        for child in multiprocessing.active_children():
            with contextlib.suppress(Exception):
                child.kill()
        os._exit(code)

    def poll(self) -> bool:
        """At a step boundary: whether the run stops after this step (the same on every rank)."""
        local = self.name is not None
        if self.d.world == 1 or not dist.is_initialized():
            return local
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=self.d.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if self.lag == 0 or self.d.device.type != "cuda":
            return bool(flag.item())
        host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._pending.append((host, ev))
        if len(self._pending) <= self.lag:
            return False
        host, ev = self._pending.popleft()
        ev.synchronize()  # recorded `lag` steps ago: long complete
        return bool(host.item())

    def message(self, ckpt: Checkpointer) -> str:
        name = self.name or "on another rank"
        if not ckpt.dir:
            return f"[{self.mode}] signal {name}: no --ckpt-dir: nothing saved, exiting"
        if self.step in ckpt.skipped or self.step not in self.saved:
            return (f"[{self.mode}] signal {name}: step {self.step} not saved (see above), "
                    "exiting")
        return f"[{self.mode}] signal {name}: saved step {self.step}, exiting"


def train_loop(s: Session) -> "tuple[List[Dict[str, Any]], List[Dict[str, Any]], float]":
    """Runs steps start_step .. end; returns the timed rows (after --warmup), every step's
    losses and the wall time."""
    args, d, cfg = s.args, s.d, s.cfg
    loader, sync, ckpt, mem, opt, sched = s.loader, s.sync, s.ckpt, s.mem, s.opt, s.sched
    trace, readback, counter, stepper, guard = s.trace, s.readback, s.counter, s.stepper, s.guard
    model, runner, noise_gen, autocast, start_step = (s.model, s.runner, s.noise_gen, s.autocast,
                                                      s.start_step)
    log = _log(d)
    jsonl = open(args.metrics_jsonl, "w") if args.metrics_jsonl and d.is_main else None
    img_tokens = len(s.schema["cameras"]) * cfg.tokens_per_image
    horizon = int(s.schema["action_horizon"])
    shape_flops = FlopsPerShape(cfg, len(s.schema["cameras"]), horizon)  # counted once per shape

    def batches() -> Iterator[Dict[str, torch.Tensor]]:
        epoch = loader.state_dict()["epoch"]
        while True:
            loader.set_epoch(epoch)
            batches_seen, samples = 0, 0
            for b in loader:
                batches_seen += 1
                # Every sample of the batch was skipped as corrupt (DataFusion's skip policy,
                # batch size 1 or a bad stretch): nothing to train on, the next batch follows.
                if b["tokens"].shape[0] > 0:
                    samples += int(b["tokens"].shape[0])
                    if s.noise is not None:
                        s.noise.epoch = epoch
                    yield b
            if batches_seen and not samples:  # it would loop over empty epochs for ever
                raise TrainError(f"--data {args.data}: epoch {epoch}: every sample was skipped "
                                 f"as corrupt ({batches_seen} batches, none left to train on; "
                                 "the loader's warnings above name them)")
            epoch += 1

    it = batches()
    # LOONGFORGE_MEM_TRACE=PATH keeps the recorded steps' trace (for `loongforge mem replay`),
    # LOONGFORGE_MEM_RECORD_STEPS=N records N steps instead of min(3, warm-up) (diagnosis).
    try:
        rec_steps = knobs.get("LOONGFORGE_MEM_RECORD_STEPS")  # 0: the default below
    except ValueError as e:
        raise TrainError(str(e)) from None
    mem.record(steps=rec_steps or max(1, min(3, args.warmup)),
               trace_path=knobs.get("LOONGFORGE_MEM_TRACE") or None)
    rows: List[Dict[str, Any]] = []
    losses: List[Dict[str, Any]] = []
    t_run = time.perf_counter()
    end_step = min(args.steps, args.stop_after) if args.stop_after else args.steps
    prof = s.profiler
    # Profiled steps (--profile-modules) come right after --warmup and leave the timed figures.
    timed_from = args.warmup + (args.profile_modules if prof is not None else 0)

    nonfinite: List[int] = []  # the steps of the current run of skipped (non-finite) steps

    def finish_row(r: Dict[str, Any]) -> None:
        guard.check_row(r)
        step = r["step"] - 1
        if r.get("skipped_nonfinite"):
            nonfinite.append(r["step"])
        else:
            nonfinite.clear()
        losses.append({k: r[k] for k in ("step", "loss", "fm_loss", "aux_loss", "grad_norm",
                                         "skipped_nonfinite", "step_s") if k in r})
        if step - start_step >= timed_from:
            rows.append(r)
        if jsonl:
            jsonl.write(json.dumps(r) + "\n")
            jsonl.flush()
        if d.is_main and not args.quiet and (step + 1) % args.log_every == 0:
            st = r["step_s"]
            print(f"[{args.mode}] step {step + 1}/{args.steps} loss {r['loss']:.4f} "
                  f"lr {r['lr']:.2e} step {st * 1e3:.0f} ms "
                  f"wait {r['data_wait_s'] / st * 100:.0f}% "
                  f"tok/s {r['tokens'] / st:.0f} samples/s {r['samples'] / st:.1f}"
                  + (" (skipped: loss or gradient not finite)" if nonfinite else ""),
                  file=sys.stderr, flush=True)
        if len(nonfinite) >= args.max_nonfinite_steps:
            raise NonFiniteError(
                f"step {r['step']}: loss {r['loss']:.4g}, gradient norm {r['grad_norm']:.4g}: "
                f"{len(nonfinite)} steps in a row without a finite loss and gradient (steps "
                f"{nonfinite[0]}..{nonfinite[-1]} skipped, no update; --max-nonfinite-steps "
                f"{args.max_nonfinite_steps}); the weights are those of step {nonfinite[0] - 1}"
                + ((f", the newest checkpoint of this run is step {s.stop.saved[-1]}"
                    if s.stop.saved else ", this run took no checkpoint") if ckpt.dir else "")
                + " (a smaller --lr, or --clip)")

    moe = bool(cfg.moe_experts)
    no_range = contextlib.nullcontext()
    stop = s.stop
    saved = stop.saved

    def save(n: int) -> float:
        """Checkpoints step n unless its weights are not finite (Note [Non-finite steps]: a
        skipped step leaves the last finite weights, which are saved; an update that overflowed
        them is not). The state is built only when the save happens, timed in the stall."""
        if not params_finite(s.params, d):
            log(f"[{args.mode}] step {n}: checkpoint not taken: the weights are not finite; "
                "the newest committed checkpoint stays the latest")
            return 0.0
        skipped = len(ckpt.skipped)
        stall = ckpt.save(n, lambda: {
            "step": n, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "loader": loader.state_dict(), "rng": rng_state(noise_gen),
            "config": args.config, "flags": saved_flags(args),
            **expert_state(sync.ep, model, opt)},
            model=model, optimizer=opt)
        if len(ckpt.skipped) == skipped:
            saved.append(n)
        return stall
    stop.install()
    try:
        for step in range(start_step, end_step):
            trace.step = step
            s.progress.where = (f"step {step + 1}" + (
                "" if stepper is None or not stepper.graphs_on else
                f", {stepper.captures} bucket graphs captured"))
            part = prof.range if prof is not None and prof.active(step) else (lambda _n: no_range)
            if prof is not None:
                prof.begin_step(step)
            wait = 0.0
            stage, stage_wait = None, -1.0  # the loader stage behind the longest wait
            samples = 0
            known_tokens = 0
            flops = 0.0
            with counter.window() if step - start_step >= timed_from else contextlib.nullcontext():
                acc = readback.begin()  # device: [loss, fm_loss, aux_loss, text tokens, grad norm]
                sync.zero_grad(opt, keep=stepper is not None and stepper.keeps_grads)
                for micro in range(args.grad_accum):
                    t0 = time.perf_counter()
                    with trace.span("data_wait"), part("data"):
                        batch = next(it)
                        dt = time.perf_counter() - t0
                        wait += dt
                        if dt > stage_wait:
                            stage, stage_wait = getattr(batch, "held_by", None), dt
                        batch = guard(batch)
                    b = int(batch["tokens"].shape[0])
                    samples += b
                    known_tokens += b * img_tokens + b * (1 + horizon)
                    last = micro == args.grad_accum - 1
                    sig = f"L{int(batch['tokens'].shape[1])}xB{b}"
                    flops += shape_flops(b, int(batch["tokens"].shape[1])).total
                    sync.set_micro_step(is_last=last)
                    with (contextlib.nullcontext() if last else sync.no_sync()), mem.step(sig):
                        if stepper is not None:
                            with trace.span("forward_backward"):
                                out = stepper(batch, noise_gen, 1.0 / args.grad_accum)
                        else:
                            with trace.span("forward"), autocast():
                                if s.noise is not None:
                                    nz, tu = s.noise(batch)
                                    out = runner(batch, noise=nz, time_u=tu)
                                elif args.compile:
                                    # Drawn outside the compiled model (a generator argument
                                    # breaks its graph), the same stream as eager steps draw.
                                    act = batch["action"]
                                    nz, tu = model.draw_noise(int(act.shape[0]), int(act.shape[1]),
                                                              act.device, noise_gen)
                                    out = runner(batch, noise=nz, time_u=tu)
                                else:
                                    out = runner(batch, generator=noise_gen)
                                loss = out["loss"] / args.grad_accum
                            with trace.span("backward"), part("backward"):
                                loss.backward()
                            del loss
                    readback.add_micro(acc, out, batch["attention_mask"], args.grad_accum, moe)
                    del batch, out
                with trace.span("comm"):
                    sync.finish()
                    sync.average_losses(acc)
                feed = step == start_step + args.warmup or (step + 1) % 100 == 0
                if feed:
                    sync.feed_expert_load(model)  # collective: every rank at the same step
                # Per-expert load in the metrics: each step unless figures are read back late.
                moe_row = moe_metrics(model) if moe and (feed or not s.sync_free) else {}
                with trace.span("optimizer"), part("optimizer"):
                    optimizer_step(opt, s.params, args.clip, acc, sync)
                    sched.step()
                stall = 0.0
                if args.ckpt_every and step == start_step:
                    ckpt.prepare({"model": model.state_dict(), "optimizer": opt.state_dict()})
                if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                    with trace.span("checkpoint"):
                        stall = save(step + 1)
                if not s.sync_free:
                    s.sync_dev()
                if prof is not None:  # before the step's end mark: profiler shutdown in this step
                    prof.end_step(step)
                readback.end(acc, {
                    "step": step + 1, "lr": sched.get_last_lr()[0], "data_wait_s": wait,
                    **({"data_stage": stage} if stage else {}),
                    "comm_exposed_s": sync.exposed_s, "ckpt_stall_s": stall, "samples": samples,
                    "tokens": known_tokens, "flops": flops, **moe_row, **ckpt.row_fields()},
                    clip=True,  # the norm is computed also with --clip 0 (Note [Non-finite steps])
                    moe=moe,
                    flag=guard.flag)
                for r in readback.ready():
                    finish_row(r)
                if stop.poll():
                    stop.reached(step + 1)
                    break
        for r in readback.drain():
            finish_row(r)
        if stop.step is not None and ckpt.dir and stop.step not in saved:
            ckpt.when_busy = "wait"  # this save is the one the signal asked for
            save(stop.step)
    finally:
        if prof is not None:
            prof.finish()  # a run that ended inside the window: ranges off, profiler stopped
        it.close()  # stops the loader's pipeline (DataFusion threads, DataLoader workers) now
        if jsonl:
            jsonl.close()
    return rows, losses, time.perf_counter() - t_run


def _cudagraph_skips() -> str:
    """How often inductor ran a compiled graph without its CUDA graph (reduce-overhead), and
    why, from torch's own counters."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return "cudagraph skips unknown (no torch._dynamo counters)"
    n = int(counters["inductor"].get("cudagraph_skips", 0))
    return f"cudagraph skips {n}"


def run(args: argparse.Namespace, progress: Optional[Progress] = None) -> Dict[str, Any]:
    """One training run; `progress` (optional) says where it is when it fails."""
    s = build(args)
    if progress is not None:
        s.progress = progress
    try:
        try:
            rows, losses, total_s = train_loop(s)
        except RuntimeError as e:  # the snapshot of an out-of-memory is the one most wanted
            if "out of memory" in str(e).lower():
                _session._memory_history(args.memory_history, None)
            if isinstance(e, TrainError):
                # The saves already queued hold finite weights of completed steps: let them
                # commit (a failure here is secondary to the one being reported).
                with contextlib.suppress(Exception):
                    s.ckpt.close()
            raise
        _session._memory_history(args.memory_history, None)
        if args.trace and s.d.is_main:
            s.trace.write(args.trace)
        s.ckpt.close()  # waits for the writer: a save a signal asked for is committed here
        if s.stop.step is not None:
            _log(s.d)(s.stop.message(s.ckpt))
        if args.compile and args.compile_mode == "reduce-overhead":
            s.status["compile"] += f"; {_cudagraph_skips()}"
        summary = summarize(args, s.d, rows, losses, s.status, s.model, s.loader, s.ckpt,
                            total_s)
        add_module_figures(summary, s.ckpt, s.sync, s.stepper, s.counter, s.mem)
        if s.profiler is not None and s.profiler.result is not None:
            summary["module_breakdown"] = s.profiler.result
        summary["figures"]["startup_s"] = sum(s.startup.values())
        summary["figures"]["startup_phases_s"] = dict(s.startup)
        if s.d.is_main and args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=2)
    finally:
        s.stop.restore()
        s.release()
    # Note [Trainer teardown]. MemSculptor closes after the run's tensors are gone (docs/memory.md,
    # "Shutdown"); whatever it still counts then is reported as a leak. The session is the only
    # owner of the model, the optimizer, the loader, the checkpointer and the step runner, and
    # nothing the summary holds refers to them; once release() has broken NexusSync's hook cycle,
    # dropping the session frees every one of their tensors by reference counting (no garbage
    # collection needed, none relied on: a cycle through autograd's C++ state may be invisible
    # to the collector). tests/python/test_train_teardown.py checks this at the point of close().
    mem, expandable_set = s.mem, s.expandable_set_by_run
    del s
    mem.close()
    if expandable_set:  # the setting is the process's: a later run in it starts as before
        _allocator_settings("expandable_segments:False")
    return summary


