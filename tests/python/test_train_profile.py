"""--profile-modules (per-part step breakdown) and --fp8-frozen on the trainer, tiny CPU runs."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdb import TINY_TRAIN_ARGS  # noqa: E402

from loongforge import train  # noqa: E402
from loongforge.models import gr00t_layers  # noqa: E402
from loongforge.train_metrics import MODULE_PARTS  # noqa: E402

torch.set_num_threads(1)
COMMON = list(TINY_TRAIN_ARGS)


# Guards: the breakdown covers every part of the step, each part's range actually ran (> 0),
# the shares add up to the step, the profiled steps leave the timed figures, and the model's
# ranges are switched off again after the profile.
@pytest.mark.parametrize("mode", ["baseline", "loongforge"])
def test_profile_modules_breakdown(train_db, tmp_path, capsys, mode):
    out = str(tmp_path / "s.json")
    assert train.main(COMMON + ["--data", train_db, "--mode", mode, "--steps", "5",
                                "--profile-modules", "2", "--json-out", out]) == 0
    s = json.load(open(out))
    b = s["module_breakdown"]
    assert b["steps"] == 2 and b["step_ms"] > 0
    assert set(b["parts"]) == set(MODULE_PARTS) | {"other"}
    for name in MODULE_PARTS:
        assert b["parts"][name]["ms"] > 0 and b["parts"][name]["share"] > 0, name
    assert sum(p["share"] for p in b["parts"].values()) == pytest.approx(1.0, abs=1e-6)
    assert sum(b["parts"][n]["ms"] for n in MODULE_PARTS) <= b["step_ms"] * 1.001
    assert s["figures"]["timed_steps"] == 5 - 1 - 2
    assert gr00t_layers._PART_RANGES is None
    assert "module breakdown (2 profiled steps" in capsys.readouterr().out


# Guards the kernel ranking of a GPU profile: only device events count, largest first, per step,
# and the printed lines name them (a CPU profile has no ranking).
def test_top_kernels_ranks_device_events_per_step():
    from types import SimpleNamespace as E

    from loongforge.train_metrics import format_kernels, module_breakdown, top_kernels

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    avgs = [E(key="aten::mm", count=8, device_type=cpu, self_device_time_total=0.0,
              cpu_time_total=900.0),
            E(key="lf::vision", count=2, device_type=cpu, self_device_time_total=0.0,
              cpu_time_total=4000.0),
            # torch 2.x also lists a range as a GPU user annotation: neither a kernel nor the
            # range's wall time
            E(key="lf::vision", count=2, device_type=cuda, self_device_time_total=7000.0,
              cpu_time_total=0.0, is_user_annotation=True),
            E(key="sm90_gemm_bf16", count=8, device_type=cuda, self_device_time_total=6000.0),
            E(key="flash_fwd_kernel", count=4, device_type=cuda, self_device_time_total=2000.0),
            E(key="idle", count=2, device_type=cuda, self_device_time_total=0.0)]
    t = top_kernels(avgs, steps=2, top=1)
    assert t["kernel_ms"] == pytest.approx(4.0)
    assert t["kernels"] == [{"name": "sm90_gemm_bf16", "ms": 3.0, "calls": 4.0}]
    assert t["kernel_classes"] == {"gemm": 3.0, "attention": 1.0}
    b = module_breakdown(avgs, [0.010, 0.010], cuda=True)
    assert [k["name"] for k in b["kernels"]] == ["sm90_gemm_bf16", "flash_fwd_kernel"]
    assert b["parts"]["vision"]["ms"] == pytest.approx(2.0)  # the CPU entry's wall time
    lines = format_kernels(b)
    assert "4.0 ms/step of 10.0 (40%): gemm 3.0 ms 75%, attention 1.0 ms 25%" in lines[0]
    assert "sm90_gemm_bf16" in lines[1]
    assert format_kernels(module_breakdown(avgs, [0.010], cuda=False)) == []


# Guards the operator ranking of a GPU profile: aten ops by their own kernels' time per (op, input
# shapes), largest first, per step; device events and ranges are not operators; the printed lines
# carry the shapes that tell a weight's cast from an activation's.
def test_top_ops_ranks_operators_by_their_kernels_time():
    from types import SimpleNamespace as E

    from loongforge.train_metrics import format_kernels, module_breakdown, top_ops

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    avgs = [E(key="aten::copy_", count=4, device_type=cpu, self_device_time_total=3000.0,
              input_shapes=[[64, 184, 2048], [64, 184, 2048], []], cpu_time_total=10.0),
            E(key="aten::copy_", count=40, device_type=cpu, self_device_time_total=1000.0,
              input_shapes=[[2048, 2048], [2048, 2048], []], cpu_time_total=10.0),
            E(key="aten::add", count=2, device_type=cpu, self_device_time_total=5000.0,
              input_shapes=[], cpu_time_total=10.0),
            E(key="aten::view", count=9, device_type=cpu, self_device_time_total=0.0,
              input_shapes=[[4]], cpu_time_total=1.0),
            E(key="lf::dit", count=2, device_type=cpu, self_device_time_total=9000.0,
              cpu_time_total=4000.0),
            E(key="vectorized_elementwise_kernel", count=46, device_type=cuda,
              self_device_time_total=9000.0)]
    ops = top_ops(avgs, steps=2)
    assert [(o["op"], o["shapes"], o["ms"], o["calls"]) for o in ops] == [
        ("aten::add", "", 2.5, 1.0),
        ("aten::copy_", "[[64, 184, 2048], [64, 184, 2048]]", 1.5, 2.0),
        ("aten::copy_", "[[2048, 2048], [2048, 2048]]", 0.5, 20.0)]
    assert top_ops(avgs, steps=2, top=1)[0]["op"] == "aten::add"
    lines = format_kernels(module_breakdown(avgs, [0.010, 0.010], cuda=True))
    i = next(k for k, ln in enumerate(lines) if ln.startswith("   operators by"))
    assert "aten::add" in lines[i + 1] and "[[64, 184, 2048], [64, 184, 2048]]" in lines[i + 2]


# Guards the kernel names in the printed ranking: torch's elementwise wrappers shortened to what
# they apply, other long names cut, short names kept.
def test_short_kernel_name():
    from loongforge.train_metrics import short_kernel_name

    cast = ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_"
            "cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#8}::"
            "operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::"
            "bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}, std::array<char*, "
            "2ul>)")
    assert short_kernel_name(cast) == "vectorized_elementwise_kernel [bfloat16_copy_kernel_cuda]"
    mul = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::"
           "native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<"
           "float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, "
           "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int)")
    assert short_kernel_name(mul) == "elementwise_kernel [BinaryFunctor, MulFunctor<float>]"
    adam = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
            "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
            "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double, double>(x)")
    assert short_kernel_name(adam) == "multi_tensor_apply_kernel [FusedAdamMathFunctor]"
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_" * 2
    assert short_kernel_name(gemm, width=40) == gemm[:37] + "..."
    assert short_kernel_name("flash_fwd_kernel") == "flash_fwd_kernel"


# Guards: without the option no breakdown is made and the model's parts run no profiler range.
def test_no_profile_by_default(train_db, tmp_path):
    out = str(tmp_path / "s.json")
    assert train.main(COMMON + ["--data", train_db, "--steps", "2", "--json-out", out]) == 0
    assert "module_breakdown" not in json.load(open(out))
    assert gr00t_layers._part("vision") is gr00t_layers._NO_RANGE


# Guards: combinations that would hide or blur the ranges are one-line errors, not a
# breakdown with empty parts.
@pytest.mark.parametrize("extra,msg", [
    (["--cuda-graph", "per_microbatch"], "--cuda-graph off"),
    (["--token-buckets", "16,32"], "--token-buckets"),
    (["--compile"], "--compile"),
    (["--steps", "2"], "needs --steps >="),
])
def test_profile_modules_refused_combinations(train_db, capsys, extra, msg):
    args = COMMON + ["--data", train_db, "--steps", "5", "--profile-modules", "2"] + extra
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


# Guards: --fp8-frozen on a machine without FP8 (this CPU, torch 1.13, or a GPU below sm 8.9)
# stops with one clear line instead of a traceback or a silent bf16 run.
def test_fp8_frozen_refused_without_fp8(train_db, capsys):
    from loongforge import fp8

    try:
        fp8.check_fp8_support(torch.device("cpu"))
    except fp8.Fp8Unsupported:
        pass
    else:  # pragma: no cover - a CPU device is always refused
        pytest.fail("a CPU device passed the FP8 check")
    assert train.main(COMMON + ["--data", train_db, "--steps", "2", "--fp8-frozen"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fp8-frozen needs" in err[0]


# Guards --frozen-bf16 on the CPU: "on" is refused with one line (no bf16 autocast there), and
# "auto" leaves every weight in fp32 and says nothing of it in the modules.
def test_frozen_bf16_cpu(train_db, tmp_path, capsys):
    assert train.main(COMMON + ["--data", train_db, "--steps", "2", "--frozen-bf16", "on"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--frozen-bf16 on needs CUDA" in err[0]
    out = str(tmp_path / "s.json")
    assert train.main(COMMON + ["--data", train_db, "--steps", "1", "--mode", "loongforge",
                                "--json-out", out]) == 0
    assert "frozen_bf16" not in json.load(open(out))["modules"]


# Guards: bench/e2e/run.py passes --profile-modules to the trainer and prints each mode's
# breakdown under its table (and keeps it in results.json).
def test_bench_e2e_profile_passthrough(train_db, tmp_path):
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "e2e"
    r = subprocess.run([sys.executable, os.path.join(repo, "bench", "e2e", "run.py"),
                        "--db", train_db, "--config", "tiny", "--image-size", "28",
                        "--batches", "4", "--steps", "4", "--warmup", "1", "--ckpt-every", "0",
                        "--workers", "0", "--loader-threads", "1", "--modes", "lerobot",
                        "--profile-modules", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [x for x in r.stdout.splitlines() if "profile of 2 steps" in x]
    assert len(line) == 1 and line[0].startswith("lerobot")
    assert all(f" {p} " in line[0] for p in MODULE_PARTS)
    res = json.load(open(out / "results.json"))
    assert set(res["module_breakdown"]["4"]["lerobot"]["parts"]) == set(MODULE_PARTS) | {"other"}
