"""Tests of loongforge.memory (MemSculptor) on the CPU: feature detection, planning, snapshot
import and replay."""
import contextlib

import pytest

from loongforge import memory
from loongforge.memory import MemSculptor, Trace

torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def _snapshot():
    """A hand-built dict with the structure of torch.cuda.memory._snapshot() (torch 2.x): two steps
    of the same allocations (a 4 MiB, b 2 MiB, then 3 MiB at a's address). Step 1 also reports
    free_completed (b ends by it alone), step 2 only free_requested. The tests count event
    positions (step boundary at event 10), so every event is written out."""
    mb, a, b = 1 << 20, 0x7000000, 0x7400000

    def ev(action, addr, size, time_us=None):
        e = {"action": action, "addr": addr, "size": size, "stream": 0}
        if time_us is not None:
            e["time_us"] = time_us
        return e

    trace = [
        ev("segment_alloc", a, 20 * mb),
        ev("free_requested", 0x6000000, 512),  # pre-existing
        ev("free_completed", 0x6000000, 512),
        # step 1
        ev("alloc", a, 4 * mb, 10), ev("alloc", b, 2 * mb, 11),
        ev("free_requested", a, 4 * mb, 12), ev("free_completed", a, 4 * mb, 13),
        ev("alloc", a, 3 * mb, 14), ev("free_completed", b, 2 * mb, 15),
        ev("free_requested", a, 3 * mb, 16),
        # step 2: same shape
        ev("alloc", a, 4 * mb, 20), ev("alloc", b, 2 * mb, 21),
        ev("free_requested", a, 4 * mb, 22),
        ev("alloc", a, 3 * mb, 24), ev("free_requested", b, 2 * mb, 25),
        ev("free_requested", a, 3 * mb, 26),
        ev("snapshot", 0, 0),
    ]
    return {
        "segments": [{"device": 0, "address": a, "total_size": 20 * mb,
                      "allocated_size": 0, "stream": 0, "segment_type": "large", "blocks": []}],
        "device_traces": [trace],
    }


# Guards feature detection: on a machine without CUDA the allocator says it is unavailable.
@no_cuda
def test_available_is_false_without_cuda():
    assert MemSculptor.available() is False


# Guards the error users see: install() raises a RuntimeError that says CUDA is needed and why.
@no_cuda
def test_install_raises_clear_error():
    with pytest.raises(RuntimeError, match="MemSculptor needs CUDA") as ei:
        MemSculptor().install()
    assert "plan_trace" in str(ei.value)  # points at what still works
    with pytest.raises(RuntimeError, match="MemSculptor needs CUDA"):
        MemSculptor().record(steps=2)


# Guards one copy of the core per process: the extension module hosts the torch allocator and
# exports for torch exactly its two entry points; the control functions are bindings of the same
# module, not a second C ABI.
def test_extension_module_hosts_the_torch_allocator():
    import ctypes
    import os

    from loongforge import _C
    if not hasattr(_C, "torch_allocator"):
        pytest.skip("a build without CUDA has no torch allocator")
    lib = ctypes.CDLL(os.path.abspath(_C.__file__))  # dlopen: the module already loaded
    assert lib.lf_alloc and lib.lf_free
    for name in ("lf_begin_step", "lf_last_error", "lf_stats_json", "lf_close", "lf_set_limit_mb"):
        with pytest.raises(AttributeError):
            getattr(lib, name)
    tp = _C.torch_allocator
    with pytest.raises(ValueError, match="memory cap -1 MiB is out of range"):
        tp.set_limit_mb(0, -1)
    with pytest.raises(ValueError, match="device index 64 out of range"):
        tp.set_limit_mb(64, 1)


# Guards the allocator's error where there is no device: each control function that needs the
# device's allocator says why it could not be created, as a RuntimeError, and the process goes on.
@no_cuda
def test_torch_allocator_without_a_device_says_why():
    from loongforge import _C
    if not hasattr(_C, "torch_allocator"):
        pytest.skip("a build without CUDA has no torch allocator")
    tp = _C.torch_allocator
    for call in (lambda: tp.begin_step(0, "s"), lambda: tp.stats(0), lambda: tp.close(0),
                 lambda: tp.start_recording(0)):
        with pytest.raises(RuntimeError) as ei:
            call()
        assert "cuda" in str(ei.value).lower(), str(ei.value)
    assert "cuda" in tp.last_error().lower() or tp.last_error() == ""
    tp.abandon_step(0)  # no allocator: nothing to abandon
    tp.reset_peaks(0)


# Guards plan_trace: a hand-built step packs to its lower bound and reports the layout.
def test_plan_trace_hand_built():
    t = Trace()
    t.mark_step("b64")
    t.add_alloc(1, 1000)
    t.add_alloc(2, 3000)
    t.add_free(1)
    t.add_alloc(3, 900)   # fits where 1 was
    t.add_free(2)
    t.add_free(3)
    t.add_alloc(4, 100)   # never freed: not placed
    r = memory.plan_trace(t, with_layout=True)
    (s,) = r["steps"]
    assert s["signature"] == "b64"
    assert s["allocations"] == 4 and s["planned"] == 3
    assert s["lower_bound_bytes"] == 1024 + 3072
    assert s["peak_bytes"] == s["lower_bound_bytes"]
    assert s["offsets"][3] == -1
    assert s["offsets"][0] == s["offsets"][2]  # reuse of the freed bytes
    assert r["overhead"] == 0.0


# Guards input errors: a double allocation of a live id arrives as ValueError.
def test_bad_trace_is_value_error():
    t = Trace()
    t.add_alloc(1, 10)
    t.add_alloc(1, 10)
    with pytest.raises(ValueError, match="allocated again"):
        memory.plan_trace(t)


# Guards the snapshot import: alloc/free_requested/free_completed map to one lifetime each,
# segment events and pre-existing frees are skipped, and steps split where asked.
def test_snapshot_import():
    snap = _snapshot()
    t = memory.trace_from_snapshot(snap, step_boundaries=[10], signatures=["a", "a"])
    tables = t.lifetimes()
    assert [tb["signature"] for tb in tables] == ["a", "a"]
    s0, s1 = tables
    assert [a["size"] for a in s0["allocs"]] == [4 << 20, 2 << 20, 3 << 20]
    assert all(a["freed_in_step"] for a in s0["allocs"])
    assert s0["foreign_frees"] == 1
    # 0x7400000 ended by free_completed (no free_requested came first)
    assert s0["allocs"][1]["free_seq"] == 5  # events: foreign free, a, a, f, a, f
    assert s0["allocs"][0]["free_ns"] - s0["allocs"][0]["alloc_ns"] == 2000
    assert len(s1["allocs"]) == 3
    plan = memory.plan_trace(t)
    assert plan["lower_bound_bytes"] == 6 << 20
    assert plan["peak_bytes"] == 6 << 20
    assert memory.snapshot_reserved_bytes(snap) == 20 << 20


# Guards malformed snapshots: a missing key names the entry.
def test_snapshot_malformed():
    with pytest.raises(ValueError, match="device_traces"):
        memory.trace_from_snapshot({"segments": []})
    bad = {"device_traces": [[{"action": "alloc", "size": 5}]]}
    with pytest.raises(ValueError, match=r"device_traces\[0\]\[0\]"):
        memory.trace_from_snapshot(bad)


# Guards the peak breakdown (bench/memory/peak_breakdown.py): the peak is found where the live
# bytes are largest, and the blocks live there are grouped by their loongforge frames.
def test_peak_breakdown_groups_live_blocks_by_site():
    from loongforge._snapshot_import import peak_breakdown

    def fr(*names):
        return [{"filename": f"/x/python/loongforge/{n.split(':')[0]}", "line": int(n.split(':')[1]),
                 "name": "f"} for n in names] + [{"filename": "/usr/lib/torch/nn.py", "line": 1,
                                                   "name": "g"}]

    ev = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": fr("models/a.py:1", "train.py:9")},
        {"action": "alloc", "addr": 2, "size": 50, "frames": fr("models/b.py:2", "train.py:9")},
        {"action": "alloc", "addr": 3, "size": 30, "frames": fr("models/b.py:2", "train.py:9")},
        {"action": "free_requested", "addr": 2, "size": 50},
        {"action": "alloc", "addr": 4, "size": 60, "frames": []},  # peak: 100 + 30 + 60
        {"action": "free_completed", "addr": 4, "size": 60},  # no request came first: ends it
        {"action": "free_requested", "addr": 99, "size": 7},  # allocated before recording
        {"action": "alloc", "addr": 5, "size": 70, "frames": fr("models/a.py:1", "train.py:9")},
    ]
    r = peak_breakdown({"device_traces": [ev]}, depth=1)
    assert r["peak_bytes"] == 200 and r["peak_entry"] == 7 and r["entries"] == 8
    assert [(s["site"], s["bytes"], s["blocks"]) for s in r["sites"]] == [
        ("models/a.py:1 f", 170, 2), ("models/b.py:2 f", 30, 1)]
    r = peak_breakdown({"device_traces": [ev[:6]]}, depth=2, top=1)
    assert r["peak_bytes"] == 190 and r["peak_entry"] == 4
    assert r["sites"][0] == {"site": "models/a.py:1 f < train.py:9 f", "bytes": 100, "blocks": 1}
    assert r["sites"][1] == {"site": "(other)", "bytes": 90, "blocks": 2}
    with pytest.raises(ValueError, match="device trace 1"):
        peak_breakdown({"device_traces": [ev]}, device=1)


# Guards the reserved breakdown: the reserved peak is found over segment events (alloc/map add,
# free/unmap remove), each live block is counted in the segment that holds it, and segments are
# grouped by the dump's pool id, or as released before the dump.
def test_reserved_breakdown_by_pool():
    from loongforge._snapshot_import import reserved_breakdown

    ev = [
        {"action": "segment_alloc", "addr": 1000, "size": 400, "stream": 0},  # default pool
        {"action": "alloc", "addr": 1000, "size": 300},
        {"action": "segment_alloc", "addr": 5000, "size": 200, "stream": 7},  # graph pool
        {"action": "alloc", "addr": 5100, "size": 50},
        {"action": "segment_map", "addr": 9000, "size": 100, "stream": 0},  # peak: 700
        {"action": "free_requested", "addr": 1000, "size": 300},
        {"action": "segment_free", "addr": 1000, "size": 400, "stream": 0},
        {"action": "segment_unmap", "addr": 9000, "size": 100, "stream": 0},
        {"action": "alloc", "addr": 5000, "size": 100},
    ]
    snap = {"device_traces": [ev],
            "segments": [{"address": 5000, "total_size": 200, "segment_pool_id": (1, 2)}]}
    r = reserved_breakdown(snap)
    assert r["reserved_peak_bytes"] == 700 and r["entry"] == 4 and r["allocated_bytes"] == 350
    assert r["pools"] == [
        {"pool": "released before the dump", "stream": 0, "segments": 2, "reserved": 500,
         "allocated": 300, "free": 200},
        {"pool": "(1, 2)", "stream": 7, "segments": 1, "reserved": 200, "allocated": 50,
         "free": 150}]
    with pytest.raises(ValueError, match="device trace 2"):
        reserved_breakdown(snap, device=2)
    # the block that made a segment comes after it: read at the fullest moment of the peak
    grow = [{"action": "segment_alloc", "addr": 0, "size": 100, "stream": 0},
            {"action": "alloc", "addr": 0, "size": 60},
            {"action": "alloc", "addr": 60, "size": 30},
            {"action": "free_requested", "addr": 0, "size": 60},
            {"action": "segment_alloc", "addr": 500, "size": 10, "stream": 0},
            {"action": "segment_free", "addr": 500, "size": 10, "stream": 0}]
    r = reserved_breakdown({"device_traces": [grow]})
    assert r["reserved_peak_bytes"] == 110 and r["entry"] == 4 and r["allocated_bytes"] == 30
    r = reserved_breakdown({"device_traces": [grow[:4]]})
    assert r["reserved_peak_bytes"] == 100 and r["entry"] == 2 and r["allocated_bytes"] == 90
    # an expandable segment maps pages in one range and unmaps part of them later: what stays
    # mapped is counted, and its blocks are matched to the dumped segment that holds them
    exp = [{"action": "segment_map", "addr": 0, "size": 100, "stream": 3},
           {"action": "segment_map", "addr": 100, "size": 100, "stream": 3},
           {"action": "alloc", "addr": 0, "size": 40},
           {"action": "alloc", "addr": 120, "size": 20},
           {"action": "free_requested", "addr": 120, "size": 20},
           {"action": "segment_unmap", "addr": 60, "size": 140, "stream": 3},
           {"action": "segment_map", "addr": 60, "size": 20, "stream": 3}]
    r = reserved_breakdown({"device_traces": [exp], "segments": [
        {"address": 0, "total_size": 80, "segment_pool_id": (0, 0)}]})
    assert r["reserved_peak_bytes"] == 200 and r["entry"] == 3 and r["allocated_bytes"] == 60
    assert r["pools"] == [{"pool": "released before the dump", "stream": 3, "segments": 1,
                           "reserved": 100, "allocated": 20, "free": 80},
                          {"pool": "(0, 0)", "stream": 3, "segments": 1, "reserved": 100,
                           "allocated": 40, "free": 60}]


# Guards replay: a repeated step is served from the plan after planning (hits, no misses), and
# allocated bytes return to zero.
def test_replay_planned_vs_pool():
    t = memory.trace_from_snapshot(_snapshot(), step_boundaries=[10], signatures=["a", "a"])
    planned = memory.replay_trace(t, planned=True)
    pooled = memory.replay_trace(t, planned=False)
    assert planned["planned_hits"] == 6 and planned["planned_misses"] == 0
    assert pooled["planned_hits"] == 0 and pooled["pool_allocs"] == 6
    for s in (planned, pooled):
        assert s["allocated_bytes"] == 0
        assert s["peak_allocated_bytes"] <= s["peak_reserved_bytes"]
        assert s["alloc_latency_ns"]["count"] == 6


# Guards online planning of unseen signatures (first sight): the first step of a signature is
# served by the pool and planned, its next step hits the plan; a bad mode is a ValueError.
def test_replay_first_sight():
    t = memory.trace_from_snapshot(_snapshot(), step_boundaries=[10], signatures=["a", "a"])
    online = memory.replay_trace(t, mode="first_sight")
    assert online["first_sight_plans"] == 1 and online["plans_cached"] == 1
    assert online["planned_hits"] == 3 and online["pool_allocs"] == 3
    assert memory.replay_trace(t, mode="pool")["planned_hits"] == 0
    with pytest.raises(ValueError, match="replay mode 'fast'"):
        memory.replay_trace(t, mode="fast")


# Guards the text form used to save traces from the GPU for offline planning.
def test_trace_text_round_trip():
    t = memory.trace_from_snapshot(_snapshot(), step_boundaries=[10], signatures=["a", "b"])
    back = Trace.from_text(t.to_text())
    assert back.to_text() == t.to_text()
    with pytest.raises(ValueError, match="line 1"):
        Trace.from_text("q 1 2 3\n")


# ---------------------------------------------------------------------------------------------
# Step boundaries from the optimizer (MemSculptor.attach)
# ---------------------------------------------------------------------------------------------

class _TraceSculptor(MemSculptor):
    """MemSculptor whose two step marks go into a real Trace instead of the CUDA library (which
    torch 1.13 on the CPU cannot load). Allocations are the model's layer outputs, alive while
    Python holds them (forward hooks + weakref.finalize), on a logical clock."""

    def __init__(self, model):
        super().__init__()
        self.trace = Trace()
        self.marks = []
        self._clock = 0
        self._next_id = 0
        for m in model.modules():
            m.register_forward_hook(self._on_output)

    def _tick(self):
        self._clock += 1
        return self._clock

    def _on_output(self, module, args, out):
        import weakref
        self._next_id += 1
        aid = self._next_id
        self.trace.add_alloc(aid, out.numel() * out.element_size(), time_ns=self._tick())
        weakref.finalize(out, lambda: self.trace.add_free(aid, time_ns=self._tick()))

    def _begin_step(self, signature):
        self.trace.mark_step(signature, time_ns=self._tick())
        self.marks.append(("begin", signature, self._clock))

    def _end_step(self):
        self.marks.append(("end", self._clock))


class _TokenModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                       torch.nn.Linear(32, 1))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens)).mean()


def _train(explicit, lengths=(7, 12, 7, 20), accumulate=2, signature_of=None, attach_kw=None):
    """A small training loop with varying sequence length and gradient accumulation. explicit:
    marks each step with ms.step(); else one ms.attach() call and the loop is left as is."""
    torch.manual_seed(0)
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ms = _TraceSculptor(model)
    hook = None if explicit else ms.attach(opt, model=model, **(attach_kw or {}))
    for n in lengths:
        batches = [torch.randint(0, 50, (4, n)) for _ in range(accumulate)]
        ctx = ms.step(f"len{n}") if explicit else contextlib.nullcontext()
        with ctx:
            opt.zero_grad()
            for tokens in batches:
                loss = model(tokens) / accumulate
                loss.backward()
            opt.step()
    if hook is not None:
        hook.remove()
    return ms, opt, hook


def _by_length(args):
    return f"len{args[0].shape[1]}"


# Guards attach(): steps marked from the optimizer (model= for the signature) are the same
# boundaries, signatures and trace as explicit step() blocks, with gradient accumulation.
def test_attach_optimizer_marks_same_steps_as_explicit():
    explicit, _, _ = _train(explicit=True)
    hooked, _, hook = _train(explicit=False, attach_kw={"signature": _by_length})
    assert [m for m in explicit.marks if m[0] == "begin"][:1] == [("begin", "len7", 1)]
    assert hooked.marks == explicit.marks
    assert len(explicit.marks) == 8 and hook.steps == 4
    assert hooked.trace.to_text() == explicit.trace.to_text()
    assert len(explicit.trace) > 4 * 2 * 4  # allocations were recorded, not only marks
    assert memory.plan_trace(hooked.trace) == memory.plan_trace(explicit.trace)
    hooked_replay = memory.replay_trace(hooked.trace)
    explicit_replay = memory.replay_trace(explicit.trace)
    assert explicit_replay["planned_hits"] > 0  # len7 repeats: its plan served the second step
    for key in ("peak_reserved_bytes", "planned_hits", "planned_misses", "planned_steps"):
        assert hooked_replay[key] == explicit_replay[key], key


# Guards attach() without a model: the next step begins when the previous one ends, so the
# steps match explicit marks and remove() ends one trailing step that holds no allocation.
def test_attach_without_model_begins_at_previous_step_end():
    explicit, _, _ = _train(explicit=True, lengths=(9, 9, 9))
    torch.manual_seed(0)
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ms = _TraceSculptor(model)
    hook = ms.attach(opt, signature=lambda: "len9")
    assert ms.marks == [("begin", "len9", 1)]  # the first step begins at attach
    for n in (9, 9, 9):
        batches = [torch.randint(0, 50, (4, n)) for _ in range(2)]
        opt.zero_grad()
        for tokens in batches:
            loss = model(tokens) / 2
            loss.backward()
        opt.step()
    hook.remove()
    assert ms.marks[:6] == explicit.marks
    assert [m[0] for m in ms.marks[6:]] == ["begin", "end"]  # the trailing step, ended by remove()
    assert ms.marks[6][2] == ms.marks[7][1]  # nothing happened inside it
    assert hook.steps == 4


# Guards remove(): after it the optimizer marks nothing, the instance is restored (torch < 2.0
# wraps step), and a second remove() is harmless.
def test_attach_remove_detaches():
    ms, opt, hook = _train(explicit=False, lengths=(5, 6), attach_kw={"signature": _by_length})
    n = len(ms.marks)
    assert "step" not in opt.__dict__
    opt.step()
    hook.remove()
    assert len(ms.marks) == n and hook.steps == 2


# Guards the LR-scheduler case on the wrapping path: a scheduler that wraps step() after
# attach() keeps working after remove(), and the removed hook marks nothing more.
def test_attach_remove_after_scheduler_wrapped_step():
    torch.manual_seed(0)
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ms = _TraceSculptor(model)
    hook = ms.attach(opt, model=model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.randint(0, 50, (2, 3))).backward()
    opt.step()
    sched.step()
    hook.remove()
    n = len(ms.marks)
    model(torch.randint(0, 50, (2, 3))).backward()
    opt.step()
    sched.step()
    assert len(ms.marks) == n == 2
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)


# Guards input errors: a signature that is neither str nor callable, or a callable that returns
# a non-string, is a TypeError naming the problem.
def test_attach_rejects_bad_signature():
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ms = _TraceSculptor(model)
    with pytest.raises(TypeError, match="signature must be a string or a callable"):
        ms.attach(opt, signature=5)
    with pytest.raises(TypeError, match="returned int"):
        ms.attach(opt, signature=lambda: 3)
    assert "step" not in opt.__dict__  # the failed attach left nothing behind


# Guards the CPU error path: attach() on a machine without CUDA raises the usual clear error
# and leaves the optimizer as it was.
@no_cuda
def test_attach_raises_clear_error_without_cuda():
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="MemSculptor needs CUDA"):
        MemSculptor().attach(opt)
    assert "step" not in opt.__dict__


# Guards mixing: a second attach() or an explicit step() while a hook is attached raises instead
# of nesting steps; after remove() both work again.
def test_attach_refuses_mixed_marking():
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ms = _TraceSculptor(model)
    hook = ms.attach(opt)
    with pytest.raises(RuntimeError, match="already attached"):
        ms.attach(opt)
    with pytest.raises(RuntimeError, match="remove\\(\\) it first"):
        with ms.step("x"):
            pass
    hook.remove()
    with ms.step("x"):
        pass
    ms.attach(opt).remove()
    assert [m[0] for m in ms.marks] == ["begin", "end"] * 3


# ---------------------------------------------------------------------------------------------
# Out of memory inside a step, and close()
# ---------------------------------------------------------------------------------------------

class _MarkSculptor(MemSculptor):
    """MemSculptor whose step marks are recorded instead of sent to the CUDA library (which torch
    1.13 on the CPU cannot load): what step() tells the allocator, in order."""

    def __init__(self):
        super().__init__()
        self.marks = []

    def _begin_step(self, signature):
        self.marks.append(("begin", signature))

    def _end_step(self):
        self.marks.append(("end",))

    def _abandon_step(self):
        self.marks.append(("abandon",))


_OOM_TEXT = ("CUDA out of memory (MemSculptor, cuda:0): out of memory in step 'b16' (planned, "
             "then diverged at allocation 4 of 4: more allocations than planned): 13631488 bytes "
             "(13.0 MiB) requested")


# Guards OOM: lf_alloc's exhaustion reaches Python from torch as a plain RuntimeError; inside
# step() it becomes torch.cuda.OutOfMemoryError with the same text (signature, bytes), the step is
# abandoned rather than ended (so it is neither planned nor recorded), and the next step runs.
def test_step_out_of_memory_abandons_and_raises_oom_error():
    ms = _MarkSculptor()
    with pytest.raises(torch.cuda.OutOfMemoryError) as ei:
        with ms.step("b16"):
            raise RuntimeError(_OOM_TEXT)
    assert "step 'b16'" in str(ei.value) and "13631488 bytes" in str(ei.value)
    assert isinstance(ei.value.__cause__, RuntimeError)
    with ms.step("b8"):
        pass
    assert ms.marks == [("begin", "b16"), ("abandon",), ("begin", "b8"), ("end",)]


# Guards step(): another exception in a step abandons it too and propagates unchanged.
def test_step_other_exception_abandons_and_propagates():
    ms = _MarkSculptor()
    with pytest.raises(KeyError):
        with ms.step("b8"):
            raise KeyError("batch")
    assert ms.marks == [("begin", "b8"), ("abandon",)]


# Guards close() where the allocator was never loaded (CPU, or MemSculptor not installed): it
# reports nothing live and detaches an attached optimizer hook, so the trainer may always call it.
def test_close_without_allocator_detaches_and_reports_nothing():
    model = _TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ms = _MarkSculptor()
    hook = ms.attach(opt, model=model, signature="s")
    model(torch.randint(0, 50, (2, 5))).backward()
    opt.step()
    assert ms.close() == {"live_allocations": 0, "live_bytes": 0, "message": ""}
    assert ms._hook is None and hook._removed
    model(torch.randint(0, 50, (2, 5)))  # no longer marks steps
    assert ms.marks == [("begin", "s"), ("end",)]
