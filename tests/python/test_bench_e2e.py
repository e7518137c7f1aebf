"""Tests of the issue-9 benchmark drivers in bench/e2e (CPU only: they build trainer command lines
and compare loss curves; the runs themselves need the GPU)."""
import importlib.util
import json
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(REPO, "bench", "e2e", name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


ablation = _load("ablation")
curves = _load("compare_curves")


def _flag(args, name):
    return args[args.index(name) + 1] if name in args else None


# Guards the ablation's rows: each adds its switch to the rows before it, a later choice of a flag
# replaces the earlier one, unselected rows add nothing, and 'default' / 'lean' stand alone.
def test_ablation_rows_are_cumulative():
    eager = ablation.row_args("eager", "64")
    assert _flag(eager, "--cuda-graph") == "off" and _flag(eager, "--adamw") == "foreach"
    assert _flag(eager, "--token-buckets") == ""
    fused = ablation.row_args("fused", "48,64")
    assert _flag(fused, "--token-buckets") == "48,64" and _flag(fused, "--sync-free") == "on"
    assert _flag(fused, "--cuda-graph") == "per_microbatch" and _flag(fused, "--adamw") == "fused"
    assert fused.count("--cuda-graph") == 1 and fused.count("--adamw") == 1
    assert "--compile-frozen" in fused
    picked = ablation.row_args("fused", "64", ["eager", "graphs", "fused"])
    assert "--compile-frozen" not in picked and _flag(picked, "--token-buckets") == ""
    assert ablation.row_args("lean", "64") == []
    assert _flag(ablation.row_args("default", "64"), "--adamw") == "auto"


def _write(path, losses, skipped=0):
    with open(path, "w") as f:
        json.dump({"loss_curve": [{"step": i + 1, "loss": x} for i, x in enumerate(losses)],
                   "skipped_nonfinite_steps": skipped, "figures": {"step_ms_p50": 1.0}}, f)
    return str(path)


# Guards the loss-curve verdict: a run within the noise floor passes, a drifting run and one that
# goes non-finite fail (naming the first bad step), and the exit code says so.
def test_compare_curves_verdicts(tmp_path):
    base = [3.0 - 0.005 * i + 0.05 * math.sin(i) for i in range(200)]
    ref = _write(tmp_path / "ref.json", base)
    noise = _write(tmp_path / "noise.json", [x * 1.001 for x in base])
    close = _write(tmp_path / "close.json", [x * (1.004 if i % 2 else 0.996)
                                             for i, x in enumerate(base)])
    drift = _write(tmp_path / "drift.json", [x * (1 + 0.0005 * i) for i, x in enumerate(base)])
    nan = _write(tmp_path / "nan.json", base[:107] + [float("nan")] * 93, skipped=0)
    out = tmp_path / "out.json"
    argv = sys.argv
    try:
        sys.argv = ["x", "--ref", ref, "--noise", noise, close, "--json-out", str(out)]
        assert curves.main() == 0
        r = json.load(open(out))
        assert r[close]["within_noise"] and r[close]["first_nonfinite_step"] is None
        assert abs(r[close]["rel_mean"] - 0.004) < 1e-3
        sys.argv = ["x", "--ref", ref, "--noise", noise, drift, nan, "--json-out", str(out)]
        assert curves.main() == 1
        r = json.load(open(out))
        assert not r[drift]["within_noise"] and r[drift]["rel_10step_max"] > 0.05
        assert r[nan]["first_nonfinite_step"] == 108 and r[nan]["nonfinite_steps"] == 93
        assert not r[nan]["within_noise"]
    finally:
        sys.argv = argv
