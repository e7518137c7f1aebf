"""Tests of bench/memory/replay_traces.py (the replay report over captured traces) on small
synthetic traces: it runs the real `loongforge mem plan|replay` CLI on the CPU."""
import importlib.util
import json
import os

import pytest

from loongforge import _C

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mod():
    spec = importlib.util.spec_from_file_location(
        "replay_traces", os.path.join(REPO, "bench", "memory", "replay_traces.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


rt = _mod()
needs_cli = pytest.mark.skipif(rt.find_cli(None) is None, reason="loongforge CLI not built")


# Guards the report end to end: every trace gets the four allocators side by side, the targets
# are evaluated from the CLI's figures, planned steps hit, and a zstd copy of a trace gives the
# same figures as the plain one.
@needs_cli
def test_report_on_synthetic_traces(tmp_path):
    traces = rt.write_synthetic(str(tmp_path / "syn"))
    zst = str(tmp_path / "syn" / "gr00t.trace.zst")
    _C.MemTrace.load(traces[0]).save(zst, True)
    assert os.path.getsize(zst) < os.path.getsize(traces[0])
    out = str(tmp_path / "report.json")
    assert rt.main(traces + [zst, "--json", out, "--segment-mb", "2"]) == 0
    rep = json.load(open(out))
    rows = rep["traces"]
    assert len(rows) == 3
    for r in rows:
        assert set(r["replay"]) == {"pool", "planned", "first_sight", "caching"}
        assert set(r["targets"]) == {"plan_within_5pct", "frag_le_3pct", "p50_le_100ns"}
        planned = r["replay"]["planned"]
        assert planned["planned_hits"] > 0
        assert r["replay"]["caching"]["planned_hits"] == 0
        # Every mode sees the same live bytes (sizes round alike, to 512 B).
        assert planned["peak_allocated_bytes"] == r["replay"]["pool"]["peak_allocated_bytes"]
        assert r["targets"]["frag_le_3pct"] == (planned["fragmentation"] <= 0.03)
    gr00t, moe, gr00t_zst = rows
    assert gr00t["replay"] == gr00t_zst["replay"] or all(
        gr00t["replay"][m]["peak_reserved_bytes"] == gr00t_zst["replay"][m]["peak_reserved_bytes"]
        for m in gr00t["replay"])
    # The GR00T-shaped steps repeat per bucket: their plans reach the lower bound.
    assert gr00t["plan_overhead"] <= 0.05 and gr00t["targets"]["plan_within_5pct"]
    # Planning beats the caching allocator's reserve on variable-length steps.
    assert (gr00t["replay"]["planned"]["peak_reserved_bytes"]
            < gr00t["replay"]["caching"]["peak_reserved_bytes"])
    # The MoE steps differ in expert sizes under one signature: merged into envelope plans.
    sigs = moe["plan"]["signatures"]
    assert sigs and all(s["merged_steps"] >= 2 for s in sigs)


# Guards the error edges: no traces -> exit 2 with a message; a corrupt trace -> exit 1 with the
# error recorded for that trace (the others are still reported).
@needs_cli
def test_report_errors(tmp_path, capsys):
    empty = tmp_path / "none"
    empty.mkdir()
    bad = tmp_path / "bad.trace"
    bad.write_text("a 1 100 0 0\nq nonsense\n")
    good = rt.write_synthetic(str(tmp_path / "syn"))[0]
    out = str(tmp_path / "r.json")
    assert rt.main([str(bad), good, "--json", out]) == 1
    rows = json.load(open(out))["traces"]
    assert "line 2" in rows[0]["error"] and "error" not in rows[1]
    assert rt.main(["--cli", str(tmp_path / "no-such-cli")]) == 2
