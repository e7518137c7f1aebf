"""Tests of loongforge.memory (MemSculptor) on the CPU: feature detection, planning, snapshot
import and replay."""
import pytest

from loongforge import memory
from loongforge.memory import MemSculptor, Trace

torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def _snapshot():
    """A hand-built dict with the structure of torch.cuda.memory._snapshot() (torch 2.x)."""
    mb = 1 << 20
    trace = [
        {"action": "segment_alloc", "addr": 0x7000000, "size": 20 * mb, "stream": 0},
        {"action": "free_requested", "addr": 0x6000000, "size": 512, "stream": 0},  # pre-existing
        {"action": "free_completed", "addr": 0x6000000, "size": 512, "stream": 0},
        {"action": "alloc", "addr": 0x7000000, "size": 4 * mb, "stream": 0, "time_us": 10},
        {"action": "alloc", "addr": 0x7400000, "size": 2 * mb, "stream": 0, "time_us": 11},
        {"action": "free_requested", "addr": 0x7000000, "size": 4 * mb, "stream": 0, "time_us": 12},
        {"action": "free_completed", "addr": 0x7000000, "size": 4 * mb, "stream": 0, "time_us": 13},
        {"action": "alloc", "addr": 0x7000000, "size": 3 * mb, "stream": 0, "time_us": 14},
        {"action": "free_completed", "addr": 0x7400000, "size": 2 * mb, "stream": 0, "time_us": 15},
        {"action": "free_requested", "addr": 0x7000000, "size": 3 * mb, "stream": 0, "time_us": 16},
        # second step: same shape
        {"action": "alloc", "addr": 0x7000000, "size": 4 * mb, "stream": 0, "time_us": 20},
        {"action": "alloc", "addr": 0x7400000, "size": 2 * mb, "stream": 0, "time_us": 21},
        {"action": "free_requested", "addr": 0x7000000, "size": 4 * mb, "stream": 0, "time_us": 22},
        {"action": "alloc", "addr": 0x7000000, "size": 3 * mb, "stream": 0, "time_us": 24},
        {"action": "free_requested", "addr": 0x7400000, "size": 2 * mb, "stream": 0, "time_us": 25},
        {"action": "free_requested", "addr": 0x7000000, "size": 3 * mb, "stream": 0, "time_us": 26},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0},
    ]
    return {
        "segments": [{"device": 0, "address": 0x7000000, "total_size": 20 * mb,
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
