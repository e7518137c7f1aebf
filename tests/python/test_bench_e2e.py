"""Tests of the issue-9 benchmark drivers in bench/e2e (CPU only: they build trainer command lines
and compare loss curves; the runs themselves need the GPU)."""
import importlib.util
import json
import math
import os
import sys

import pytest

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


run = _load("run")


def _fig(tok, p50=100.0, warm=0.0):
    return {"figures": {"warmup_excess_s": warm, "peak_flops_per_s": 1e15,
                        "memory": {"kind": "cuda", "peak_allocated_bytes": 36 * 2**30,
                                   "peak_reserved_bytes": 45 * 2**30}},
            "steady": {"tokens_per_gpu_per_s": tok, "step_ms_p50": p50, "step_ms_p95": 110.0,
                       "data_wait_share": 0.01, "boundary_cost_s": 0.25,
                       "flops_per_step": 19.1e12}}


# Guards the benchmark's rows: each names the trainer configuration its users run (LeRobot's
# DataLoader as the baseline mode, tuned+graphs as tuned with reduce-overhead compilation), the
# old baseline name still works, and an unknown row is refused naming the known ones.
def test_e2e_rows_map_to_trainer_configurations():
    assert run.trainer_mode("lerobot") == ("baseline", [], "lerobot")
    assert run.trainer_mode("baseline") == ("baseline", [], "lerobot")
    assert run.trainer_mode("tuned+graphs") == (
        "tuned", ["--compile", "--compile-mode", "reduce-overhead"], "tuned_graphs")
    assert run.trainer_mode("tuned+compile") == ("tuned", ["--compile"], "tuned_compile")
    assert run.trainer_mode("loongforge") == ("loongforge", [], "loongforge")
    with pytest.raises(SystemExit, match="unknown mode 'fast'.*tuned\\+graphs"):
        run.trainer_mode("fast")


# Guards the table: every ratio is against tuned+graphs (also below 1), MFU comes from the
# steady FLOPs and p50, and the boundary and warm-up columns are the row's own.
def test_e2e_table_ratios_against_tuned_graphs():
    rows = run.table_rows({"lerobot": _fig(1000.0), "tuned": _fig(2000.0),
                           "tuned+graphs": _fig(4000.0, warm=150.0),
                           "loongforge": _fig(3600.0, p50=50.0)}, peak=1e15)
    assert "vs t+graphs" in rows[0] and "boundary" in rows[0] and "MFU" in rows[0]
    lf = next(r for r in rows if r.startswith("loongforge")).split()
    assert "0.90x" in lf and "1.80x" in lf and "3.60x" in lf, lf
    assert lf[-1] == "38.2%"  # 19.1 TFLOP in 50 ms of a 1 PFLOP/s peak
    graphs = next(r for r in rows if r.startswith("tuned+graphs")).split()
    assert "1.00x" in graphs and "150s" in graphs and "0.25s" in graphs and "36.0/45.0" in graphs


def _rows(step_s, boundary, bpe, n=40, warmup=5):
    """Per-step rows as the trainer writes them: step_s everywhere, 1 s more at each boundary."""
    out = []
    for k in range(1, n + 1):
        extra = 1.0 if k >= boundary and (k - boundary) % bpe == 0 else 0.0
        out.append({"step": k, "step_s": step_s + extra, "tokens": 1000, "samples": 10,
                    "data_wait_s": extra, "flops": 1e12})
    return out


# Guards the steady state and the boundary's cost: the boundary's steps leave the steady figures,
# its excess over steady p50 steps is its cost, per boundary; the start batch puts the boundary
# in the middle of the timed steps.
def test_e2e_steady_state_and_boundary_cost():
    assert run.start_batch(625, 20, 320) == 625 - 20 - 150
    assert run.start_batch(30, 20, 320) == 0  # an epoch shorter than the window
    st = run.steady(_rows(0.1, boundary=21, bpe=1000), warmup=5, boundary_step=21,
                    batches_per_epoch=1000)
    assert st["boundaries"] == 1 and st["boundary_cost_s"] == pytest.approx(1.0)
    assert st["steps"] == 35 - run.BOUNDARY_STEPS and st["data_wait_share"] == 0.0
    assert st["tokens_per_gpu_per_s"] == pytest.approx(10000.0)
    assert st["step_ms_p50"] == pytest.approx(100.0)
    two = run.steady(_rows(0.1, boundary=10, bpe=15), warmup=5, boundary_step=10,
                     batches_per_epoch=15)
    assert two["boundaries"] == 3 and two["boundary_cost_s"] == pytest.approx(1.0)
    none = run.steady(_rows(0.1, boundary=999, bpe=1000), warmup=5, boundary_step=999,
                      batches_per_epoch=1000)
    assert none["boundaries"] == 0 and none["boundary_cost_s"] != none["boundary_cost_s"]


def _load_from(folder, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "bench", folder,
                                                                     name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


# Guards the largest-batch search: for any threshold it finds the largest multiple of 8
# that fits (doubling, then bisecting), never probes a batch twice, never passes the limit, and
# says when nothing fits or everything up to the limit does.
def test_max_batch_search_finds_the_largest_multiple_of_step():
    mb = _load_from("memory", "max_batch")
    for limit_fit in (0, 8, 15, 16, 17, 100, 127, 128, 129, 600, 1024, 5000):
        tried = []

        def fits(b):
            assert b % 8 == 0 and 0 < b <= 1024 and b not in tried, (b, tried)
            tried.append(b)
            return b <= limit_fit

        lo, hi = mb.largest_fitting(fits, 16, 8, 1024)
        want = min(limit_fit, 1024) // 8 * 8
        assert lo == want, (limit_fit, lo, tried)
        # The first failure is right above the answer, or there is none up to the limit.
        assert hi == (None if want == 1024 else want + 8), (limit_fit, hi, tried)
        assert len(tried) <= 16
    with __import__("pytest").raises(ValueError):
        mb.largest_fitting(lambda b: True, 12, 8, 64)
    # a small growth near the answer: one step at a time, the same answer, fewer probes
    tried = []
    lo, hi = mb.largest_fitting(lambda b: tried.append(b) or b <= 64, 56, 8, 1024, growth=1.1)
    assert (lo, hi) == (64, 72) and tried == [56, 64, 72]
    tried = []
    assert mb.largest_fitting(lambda b: tried.append(b) or b <= 200, 56, 8, 1024,
                              growth=1.5) == (200, 208)
    assert tried[:4] == [56, 88, 136, 208], tried
    with __import__("pytest").raises(ValueError, match="growth"):
        mb.largest_fitting(lambda b: True, 8, 8, 64, growth=1.0)
