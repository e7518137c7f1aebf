"""The trainer end to end on a tiny packed DB: both modes, resume, sampler parity, CLI errors."""
from __future__ import annotations

import glob
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdb import TINY_TRAIN_ARGS, has_datafusion  # noqa: E402

from loongforge import train  # noqa: E402
from loongforge.trainer import loop, session  # noqa: E402
from loongforge.trainer_data import BaselineLoader, make_sampler  # noqa: E402

torch.set_num_threads(1)
# In-process runs stay on the CPU; GPU runs go through subprocesses (test_gpu_modes).
COMMON = list(TINY_TRAIN_ARGS)


def _run(args, tmp_path, name):
    out = str(tmp_path / f"{name}.json")
    assert train.main(args + ["--json-out", out]) == 0
    with open(out) as f:
        return json.load(f)


# Guards: the baseline (LeRobot-style) trainer runs end to end and reports every figure.
def test_baseline_three_steps(train_db, tmp_path):
    s = _run(COMMON + ["--data", train_db, "--mode", "baseline", "--steps", "3",
                       "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / "ck"), "--metrics-jsonl",
                       str(tmp_path / "m.jsonl"), "--trace", str(tmp_path / "t.json"),
                       "--trace-steps", "1"], tmp_path, "b")
    f = s["figures"]
    assert s["mode"] == "baseline" and f["timed_steps"] == 2
    for k in ("tokens_per_gpu_per_s", "samples_per_s", "step_ms_p50", "step_ms_p95",
              "data_wait_share", "comm_exposed_share", "ckpt_stall_share"):
        assert f[k] == f[k] and f[k] >= 0, k  # not NaN
    assert 0 < f["data_wait_share"] < 1 and f["ckpt_stall_s"] > 0
    assert f["memory"]["peak_rss_bytes"] > 0
    # The warm-up step's time, and its part beyond a steady step (compile, captures), apart.
    assert f["warmup_s"] == s["loss_curve"][0]["step_s"] > 0
    assert f["warmup_excess_s"] == max(0.0, f["warmup_s"] - f["step_ms_p50"] / 1e3)
    assert len(s["loss_curve"]) == 3 and all(r["loss"] > 0 for r in s["loss_curve"])
    assert os.path.exists(tmp_path / "ck" / "step_00000002.pt")
    assert len(open(tmp_path / "m.jsonl").read().splitlines()) == 3
    names = {e["name"] for e in json.load(open(tmp_path / "t.json"))["traceEvents"]}
    assert {"data_wait", "forward", "backward", "optimizer"} <= names
    # tokens = B*(K*img_tokens + text) + B*(1+16); the text part is at least 1 token per sample
    assert f["tokens_per_gpu_per_s"] > f["samples_per_s"] * (2 * 1 + 17)


# Guards: the tuned-PyTorch mode (workers collate, persistent workers, async checkpoints) runs
# and trains on the same data as the baseline (identical first loss with the same seed).
def test_tuned_mode_matches_baseline_data(train_db, tmp_path):
    args = COMMON + ["--data", train_db, "--steps", "3", "--workers", "1", "--ckpt-every", "2"]
    t = _run(args + ["--mode", "tuned", "--ckpt-dir", str(tmp_path / "t")], tmp_path, "t")
    b = _run(args + ["--mode", "baseline", "--ckpt-dir", str(tmp_path / "b")], tmp_path, "b")
    assert [r["loss"] for r in t["loss_curve"]] == [r["loss"] for r in b["loss_curve"]]
    assert t["modules"]["async_checkpoint"].startswith(("dcp", "thread"))


# Guards: loongforge mode runs end to end once DataFusion is in the build.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
def test_loongforge_three_steps(train_db, tmp_path):
    jl = tmp_path / "l.jsonl"
    s = _run(COMMON + ["--data", train_db, "--mode", "loongforge", "--steps", "3",
                       "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / "v"),
                       "--metrics-jsonl", str(jl)],
             tmp_path, "l")
    assert s["modules"]["datafusion"].startswith("on") and s["modules"]["vault"] == "on"
    # Each step names the loader stage that held its batch (Note [Held by]); the summary splits
    # the data wait by stage, and the parts add up to the whole.
    stages = {"ready", "device", "decode", "read", "buffers"}
    rows = [json.loads(x) for x in open(jl)]
    assert len(rows) == 3 and all(r["data_stage"] in stages for r in rows), rows
    by = s["figures"]["data_wait_by_stage"]
    assert set(by) <= stages and by
    assert abs(sum(by.values()) - s["figures"]["data_wait_share"]) < 1e-9
    assert s["modules"]["nexussync"] == "on" and "nexussync_stats" in s
    assert s["modules"]["memsculptor"] in ("off: needs CUDA", "on")
    assert len(s["loss_curve"]) == 3 and all(r["loss"] > 0 for r in s["loss_curve"])
    # The start-up before the first step, by phase, adds up to its total.
    ph = s["figures"]["startup_phases_s"]
    assert {"model init", "model to device", "loader", "step runner"} <= set(ph), ph
    assert all(v >= 0 for v in ph.values()) and ph["model init"] > 0
    assert abs(sum(ph.values()) - s["figures"]["startup_s"]) < 1e-9
    assert "start-up" in train.format_summary(s)


# Guards: with centre crops the two modes feed (nearly) the same data in the same order, so the
# same seed gives the same first-step loss up to JPEG-resize differences.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
def test_modes_same_order_and_close_first_loss(train_db, tmp_path):
    from loongforge.data import DataFusionLoader

    dl = DataFusionLoader(train_db, 4, image_size=28, train=False, seed=7, threads=1)
    bl = BaselineLoader(train_db, 4, image_size=28, train=False, seed=7, workers=0)
    for e in (0, 1):
        dl.set_epoch(e)
        bl.set_epoch(e)
        for x, y in zip(dl, bl):
            assert torch.equal(x["sample_index"], y["sample_index"])
            assert torch.equal(x["tokens"], y["tokens"])
            assert torch.allclose(x["state"], y["state"], atol=1e-5)
            assert torch.allclose(x["action"], y["action"], atol=1e-5)
            # PIL resizes with an antialias filter, DataFusion with DCT scaling + bilinear.
            assert (x["images"] - y["images"]).abs().mean() < 0.12
    args = COMMON + ["--data", train_db, "--steps", "1", "--no-augment", "--warmup", "0"]
    a = _run(args + ["--mode", "baseline"], tmp_path, "a")
    b = _run(args + ["--mode", "loongforge", "--no-vault"], tmp_path, "b")
    la, lb = a["loss_curve"][0]["loss"], b["loss_curve"][0]["loss"]
    assert abs(la - lb) / la < 0.02, (la, lb)


# Guards: the MoE variant trains through NexusSync with expert buckets and routing-load feedback.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
def test_moe_loongforge_feeds_expert_load(train_db, tmp_path):
    s = _run(COMMON + ["--data", train_db, "--mode", "loongforge", "--steps", "3", "--no-vault",
                       "--set", "moe_experts=4", "--set", "moe_top_k=2"], tmp_path, "moe")
    assert s["params"]["dit"] > 0 and all(r["aux_loss"] > 0 for r in s["loss_curve"])
    groups = json.dumps(s["nexussync_stats"])
    assert "expert" in groups, groups[:400]
    assert train.main(COMMON + ["--data", train_db, "--mode", "baseline", "--set", "moe=1"]) == 2


# Guards: the same seed gives the same init and the same first-step loss on the same batch.
def test_same_seed_same_init_and_loss(train_db):
    bl = BaselineLoader(train_db, 4, image_size=28, train=False, seed=0, workers=0)
    batch = next(iter(bl))
    losses = []
    for _ in range(2):
        m = train.build_model("tiny", 3, 28, bl.schema)
        losses.append(float(m(batch, generator=torch.Generator().manual_seed(0))["loss"]))
    assert losses[0] == losses[1]
    m2 = train.build_model("tiny", 4, 28, bl.schema)
    assert float(m2(batch, generator=torch.Generator().manual_seed(0))["loss"]) != losses[0]


def epoch_order(n, batch, seed, epoch, rank=0, world=1, shuffle=True, drop_last=True):
    return make_sampler(n, batch, seed, rank, world, shuffle, drop_last).epoch_order(epoch)


# Guards: the bound sampler stays a partition of the data per epoch, rank-disjoint, seed-stable.
def test_sampler_partition_and_determinism():
    o0 = epoch_order(103, 4, seed=5, epoch=0, rank=0, world=2)
    o1 = epoch_order(103, 4, seed=5, epoch=0, rank=1, world=2)
    assert len(o0) == len(o1) == 48 and not set(o0) & set(o1)
    assert o0 == epoch_order(103, 4, seed=5, epoch=0, rank=0, world=2)
    assert o0 != epoch_order(103, 4, seed=5, epoch=1, rank=0, world=2)
    full = epoch_order(50, 1, seed=1, epoch=0)
    assert sorted(full) == list(range(50)) and full != list(range(50))
    with pytest.raises(ValueError, match="no full batch"):
        make_sampler(3, 4, 0)


# Guards: the order is the one the deleted Python port (and every earlier run) produced: these
# lists were printed by trainer_data.epoch_order before it was replaced by _C.Sampler.
def test_sampler_order_unchanged():
    assert epoch_order(12, 2, 5, 1) == [5, 6, 4, 9, 10, 1, 8, 11, 3, 7, 2, 0]
    assert epoch_order(13, 2, 5, 0, rank=1, world=3) == [0, 8, 10, 9]
    assert epoch_order(7, 3, 2**64 - 1, 3, rank=1, world=2, drop_last=False) == [6, 4, 0, 3]


# Guards: the baseline visits samples in exactly DataFusion's order (same seed -> same data),
# including a resumed epoch (mid-epoch start) and a second rank.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
def test_sampler_matches_datafusion(train_db):
    from loongforge.data import DataFusionLoader

    for world, rank in ((1, 0), (2, 1)):
        dl = DataFusionLoader(train_db, 3, image_size=28, seed=11, rank=rank, world_size=world,
                              threads=1)
        bl = BaselineLoader(train_db, 3, image_size=28, seed=11, rank=rank, world_size=world,
                            workers=0)
        for e in (0, 2):
            dl.set_epoch(e)
            bl.set_epoch(e)
            got = [int(i) for b in dl for i in b["sample_index"]]
            n = int(dl.schema["num_samples"])
            assert got == epoch_order(n, 3, 11, e, rank, world), (world, rank, e)
            assert got == [int(i) for b in bl for i in b["sample_index"]], (world, rank, e)
        bl.load_state_dict({"seed": 11, "epoch": 1, "next_batch": 2})
        dl.set_epoch(1)
        want = [int(i) for b in dl for i in b["sample_index"]][6:]
        assert [int(i) for b in bl for i in b["sample_index"]] == want


def _has_dcp_async_save() -> bool:
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return False
    return hasattr(dcp, "async_save")


# Guards: resuming from the latest checkpoint continues the identical loss curve (both modes:
# torch.save + DataLoader position, and CheckpointVault + DataFusion position).
@pytest.mark.parametrize("mode", ["baseline", "tuned", "loongforge"])
def test_resume_is_exact(train_db, tmp_path, mode):
    if mode == "loongforge" and not has_datafusion():
        pytest.skip("loongforge.data not in this build yet")
    if mode == "tuned" and _has_dcp_async_save():
        pytest.skip("tuned mode writes DCP checkpoints on this torch; --resume reads torch.save "
                    "and CheckpointVault checkpoints only (documented in docs/trainer.md)")
    base = COMMON + ["--data", train_db, "--mode", mode, "--ckpt-every", "2"]
    full = _run(base + ["--steps", "4", "--ckpt-dir", str(tmp_path / "c1")], tmp_path, "full")
    part = _run(base + ["--steps", "4", "--stop-after", "3", "--ckpt-dir", str(tmp_path / "c2")],
                tmp_path, "part")  # preempted after step 3: the latest checkpoint is step 2
    assert [r["loss"] for r in part["loss_curve"]] == [r["loss"] for r in full["loss_curve"]][:3]
    res = _run(base + ["--steps", "4", "--ckpt-dir", str(tmp_path / "c2"), "--resume"],
               tmp_path, "res")
    a = [r["loss"] for r in full["loss_curve"]][2:]
    b = [r["loss"] for r in res["loss_curve"]]
    assert len(b) == 2 and a == b, (a, b)


# Guards: bad configs and missing DBs fail with one clear line, not a traceback.
def test_cli_errors(train_db, tmp_path, capsys):
    assert train.main(["--data", str(tmp_path / "nope"), "--steps", "1"]) == 2
    assert "missing data.mdb" in capsys.readouterr().err
    assert train.main(["--data", train_db, "--config", "huge", "--mode", "baseline"]) == 2
    assert "unknown config 'huge'" in capsys.readouterr().err
    assert train.main(["--data", train_db, "--image-size", "30", "--mode", "baseline"]) == 2
    assert "multiple of patch_size" in capsys.readouterr().err
    assert train.main(COMMON + ["--data", train_db, "--memory-cap-gib", "4"]) == 2
    assert "--memory-cap-gib caps GPU memory: it needs a CUDA device" in capsys.readouterr().err
    assert train.main(COMMON + ["--data", train_db, "--memory-cap-gib", "-1"]) == 2
    assert "--memory-cap-gib" in capsys.readouterr().err
    assert train.main(COMMON + ["--data", train_db, "--memory-history", str(tmp_path / "h")]) == 2
    assert "--memory-history records GPU allocations" in capsys.readouterr().err
    if torch.cuda.is_available():  # the path is checked before the run, on a GPU
        assert train.main(COMMON + ["--device", "cuda", "--data",
                          train_db, "--memory-history", str(tmp_path / "no" / "h")]) == 2
        assert "does not exist or is not writable" in capsys.readouterr().err
    assert train.main(COMMON + ["--data", train_db, "--compile-blocks", "on",
                                "--compile-frozen"]) == 2
    assert "choose one" in capsys.readouterr().err
    if not hasattr(torch, "compile"):  # torch 1.x: said in one line, not a traceback
        assert train.main(COMMON + ["--data", train_db, "--compile-blocks", "on"]) == 2
        assert "has no torch.compile" in capsys.readouterr().err
    if not has_datafusion():
        assert train.main(["--data", train_db, "--mode", "loongforge", "--steps", "1"]) == 2
        assert "--no-datafusion" in capsys.readouterr().err


# Guards: the GPU paths (bf16 autocast, fused AdamW, GPU DataFusion, MemSculptor, CUDA snapshots)
# run end to end, each mode in a fresh process, with close first losses.
def _run_gpu(train_db, tmp_path, name, mode, steps, *extra):
    """The trainer on CUDA in a fresh process (CUDA graphs and MemSculptor are per process)."""
    import subprocess
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(train.__file__), "..") + os.pathsep + \
        env.get("PYTHONPATH", "")
    js = str(tmp_path / f"{name}.json")
    cmd = [sys.executable, "-m", "loongforge.train", "--config", "tiny", "--image-size", "56",
           "--batch-size", "4", "--warmup", "1", "--steps", str(steps), "--workers", "1",
           "--device", "cuda", "--data", train_db, "--mode", mode, "--quiet", "--no-augment",
           "--json-out", js, *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    with open(js) as f:
        return json.load(f)


# Guards --init-device device: the model is initialised on the GPU (in MemSculptor's persistent
# pool in loongforge mode), trains in both modes from the same numbers, and a second run repeats
# them.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_init_on_device(train_db, tmp_path):
    runs = {name: _run_gpu(train_db, tmp_path, name, mode, 3, "--init-device", "device")
            for name, mode in (("t", "tuned"), ("l", "loongforge"), ("l2", "loongforge"))}
    a, b = runs["t"]["loss_curve"][0]["loss"], runs["l"]["loss_curve"][0]["loss"]
    assert abs(a - b) / a < 0.05, (a, b)  # bf16 autocast and different JPEG/resize paths
    c, d = runs["l"]["loss_curve"][0]["loss"], runs["l2"]["loss_curve"][0]["loss"]
    assert abs(c - d) <= 1e-5 * abs(c), (c, d)  # the same init from the same seed
    assert runs["l"]["figures"]["startup_phases_s"]["model init"] > 0


# Guards --frozen-bf16 in the trainer on the GPU: on by default in loongforge mode, and the run's
# losses are those of the same run with fp32 frozen weights (graphed steps, same seed).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_frozen_bf16_same_losses(train_db, tmp_path):
    on = _run_gpu(train_db, tmp_path, "on", "loongforge", 4)
    off = _run_gpu(train_db, tmp_path, "off", "loongforge", 4, "--frozen-bf16", "off")
    _switch_keeps_losses(on, off, "frozen_bf16", 4)


def _switch_keeps_losses(on, off, module, steps):
    """A switch said in the modules when on, absent when off, and the same losses (graphed GPU
    runs of the same seed: equal up to the last bits' reduction order)."""
    assert on["modules"][module].startswith("on ("), on["modules"]
    assert module not in off["modules"]
    a = [r["loss"] for r in on["loss_curve"]]
    b = [r["loss"] for r in off["loss_curve"]]
    assert len(a) == steps and a == pytest.approx(b, rel=1e-5, abs=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_modes(train_db, tmp_path):
    out = {mode: _run_gpu(train_db, tmp_path, mode, mode, 4, "--ckpt-every", "2", "--ckpt-dir",
                          str(tmp_path / f"ck_{mode}"))
           for mode in ("baseline", "tuned", "loongforge")}
    lf = out["loongforge"]
    assert lf["modules"]["memsculptor"].startswith("on")
    assert lf["modules"]["datafusion"].startswith("on")
    assert lf["modules"]["cuda_graph"].startswith("per_microbatch")  # loongforge default on CUDA
    assert lf["figures"]["memory"]["kind"] == "cuda"
    a, b = out["baseline"]["loss_curve"][0]["loss"], lf["loss_curve"][0]["loss"]
    assert abs(a - b) / a < 0.05, (a, b)  # bf16 autocast and different JPEG/resize paths


# Guards resume on the GPU: loongforge mode (device-staged checkpoint, CUDA graphs, MemSculptor)
# stopped after step 5 and resumed from its step-4 checkpoint continues the uninterrupted run's
# loss curve (to 1e-3: GPU kernels may sum in another order; CPU resume is exact, above).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_resume_continues_loss_curve(train_db, tmp_path):
    c1, c2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    full = _run_gpu(train_db, tmp_path, "full", "loongforge", 6, "--ckpt-every", "4",
                    "--ckpt-dir", c1)
    _run_gpu(train_db, tmp_path, "part", "loongforge", 6, "--ckpt-every", "4", "--ckpt-dir", c2,
             "--stop-after", "5")
    res = _run_gpu(train_db, tmp_path, "res", "loongforge", 6, "--ckpt-every", "4",
                   "--ckpt-dir", c2, "--resume")
    a = [r["loss"] for r in full["loss_curve"]][4:]
    b = [r["loss"] for r in res["loss_curve"]]
    assert full["figures"]["ckpt_snapshot_path"] == "device"
    assert len(b) == 2 and b == pytest.approx(a, rel=1e-3), (a, b)


# ------------------------------------------------------------------------------------------------
# Hardening: no flag silently does nothing, no bad value ends in a
# traceback, and nothing the model cannot take reaches it.


def _one_line_error(capsys, code_ok=(1, 2)):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("loongforge train: error: "), err
    assert "Traceback" not in err[0]
    return err[0]


# Guards: --ckpt-every without --ckpt-dir saved nothing; --resume without a directory restarted
# at step 1.
def test_checkpoint_flags_need_a_directory(train_db, tmp_path, capsys):
    base = COMMON + ["--data", train_db, "--mode", "baseline", "--steps", "2"]
    assert train.main(base + ["--ckpt-every", "1"]) == 2
    assert "--ckpt-every needs --ckpt-dir" in _one_line_error(capsys)
    assert train.main(base + ["--resume"]) == 2
    assert "--resume needs --ckpt-dir" in _one_line_error(capsys)
    assert train.main(base + ["--resume", "--ckpt-dir", str(tmp_path / "none")]) == 2
    assert "does not exist" in _one_line_error(capsys)
    assert not (tmp_path / "none").exists()


# Guards: --lr -1 and --image-size 0 ended in tracebacks.
@pytest.mark.parametrize("flag,value", [("--lr", "-1"), ("--image-size", "0"),
                                        ("--lr", "nan"), ("--clip", "-1")])
def test_bad_values_are_one_line_errors(train_db, capsys, flag, value):
    assert train.main(COMMON + ["--data", train_db, "--mode", "baseline", "--steps", "1",
                                flag, value]) == 2
    assert flag in _one_line_error(capsys)


def _tree(path):
    """{relative path: bytes} of every file under path."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


# Guards: --resume on another mode's / config's / batch size's checkpoints restarted at step 1
# (or died in a traceback) and overwrote that directory's rank_state/; and a resumed run now
# says which step it resumed from.
def test_resume_refuses_another_runs_directory(train_db, tmp_path, capsys):
    ck = str(tmp_path / "ck")
    base = COMMON + ["--data", train_db, "--steps", "3", "--ckpt-every", "2", "--ckpt-dir", ck]
    assert train.main(base + ["--mode", "baseline"]) == 0
    capsys.readouterr()
    before = _tree(ck)
    assert any(k.startswith("step_") for k in before)
    assert not any(k.startswith("rank_state") for k in before)  # inside each step_*.pt
    others = [["--mode", "tuned"], ["--mode", "baseline", "--batch-size", "2"],
              ["--mode", "baseline", "--set", "dit_layers=2"],
              ["--mode", "baseline", "--image-size", "56"]]
    if has_datafusion():
        others.append(["--mode", "loongforge"])
    for extra in others:
        for resume in (["--resume"], []):
            assert train.main(base + extra + resume) == 2, extra + resume
            line = _one_line_error(capsys)
            assert "belongs to another run" in line, line
            assert _tree(ck) == before, extra + resume  # nothing of that run was touched
    res = _run(base + ["--mode", "baseline", "--steps", "4", "--resume", "--quiet"], tmp_path, "r")
    assert [r["step"] for r in res["loss_curve"]] == [3, 4]
    assert "[baseline] resumed from step 2 of " + ck in capsys.readouterr().err


# Guards: a directory written before run.json existed is still identified by its files, so
# another mode cannot resume from (or write into) it either.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
def test_resume_refuses_unmarked_directory_of_another_format(train_db, tmp_path, capsys):
    ck = str(tmp_path / "ck")
    base = COMMON + ["--data", train_db, "--steps", "2", "--ckpt-every", "2", "--ckpt-dir", ck]
    assert train.main(base + ["--mode", "loongforge"]) == 0
    os.remove(os.path.join(ck, "run.json"))
    capsys.readouterr()
    before = _tree(ck)
    assert train.main(base + ["--mode", "baseline", "--resume"]) == 2
    assert "holds vault checkpoints" in _one_line_error(capsys)
    assert _tree(ck) == before


def _copy_db(train_db, tmp_path, name):
    import shutil

    lmdb = pytest.importorskip("lmdb")
    dst = str(tmp_path / name)
    shutil.copytree(train_db, dst)
    return lmdb.open(dst, subdir=True, map_size=1 << 30), dst


# Guards: a token id at or above the vocabulary reached the model (IndexError in the embedding).
@pytest.mark.parametrize("mode", ["baseline", "loongforge"])
def test_token_id_outside_vocab_names_the_record(train_db, tmp_path, capfd, mode):
    if mode == "loongforge" and not has_datafusion():
        pytest.skip("loongforge.data not in this build yet")
    import numpy as np

    env, bad_db = _copy_db(train_db, tmp_path, "bad_vocab")
    with env.begin(write=True) as txn:
        tok = np.frombuffer(txn.get(b"00000005_tokens"), "<i4").copy()
        tok[1] = 600  # config tiny has 512 ids
        txn.put(b"00000005_tokens", tok.tobytes())
    env.close()
    # Batch size 1 and enough steps to visit every sample of the first epoch.
    args = COMMON + ["--data", bad_db, "--mode", mode, "--steps", "30", "--batch-size", "1",
                     "--no-vault"]
    if mode == "baseline":
        assert train.main(args) == 2
        line = _one_line_error(capfd)
        assert "record '00000005_tokens'" in line and "token id 600" in line, line
        return
    # DataFusion checks ids against the DB's own tokenizer (byte-v1: 259 ids) as it reads the
    # record; under its default skip policy the sample is dropped, counted and named in the log,
    # and the run goes on (a batch left empty is not trained on).
    assert train.main(args) == 0
    err = capfd.readouterr().err
    assert "00000005_tokens" in err and "token id 600" in err, err


# Guards: the GPU form of the check (no host sync: bad ids are masked to 0 on the device and the
# first offending sample is reported through the readback) names the same record.
def test_token_guard_deferred_masks_and_reports():
    guard = train.TokenGuard(512, 8, "DB", lambda m: None, deferred=True)
    batch = {"tokens": torch.tensor([[1, 2, 3], [4, 700, -1]]),
             "attention_mask": torch.ones(2, 3, dtype=torch.bool),
             "sample_index": torch.tensor([17, 42])}
    out = guard(batch)
    assert out["tokens"].tolist() == [[1, 2, 3], [4, 0, 0]]
    rb = train.Readback(torch.device("cpu"), lag=0)
    rb.end(rb.begin(), {"step": 1, "tokens": 0}, clip=False, moe=False, flag=guard.flag)
    (row,) = rb.ready()
    with pytest.raises(train.TrainError, match="record '00000042_tokens'"):
        guard.check_row(row)


# Guards: unbounded text: the trainer fed whatever length a record held (a 100k-character
# instruction grew it to 21 GB). Text is cut to the config's max_text_tokens, with one warning.
@pytest.mark.parametrize("mode", ["baseline", "loongforge"])
def test_long_text_is_cut_to_max_text_tokens(train_db, tmp_path, capsys, mode):
    if mode == "loongforge" and not has_datafusion():
        pytest.skip("loongforge.data not in this build yet")
    jl = tmp_path / "m.jsonl"
    s = _run(COMMON + ["--data", train_db, "--mode", mode, "--steps", "3", "--no-vault",
                       "--set", "max_text_tokens=8", "--metrics-jsonl", str(jl)], tmp_path, mode)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "cuts them to 8" in err, err
    known = 4 * (2 * 1 + 17)  # B x (cameras x image tokens + 1 + horizon) at 28 px
    for line in open(jl):
        r = json.loads(line)
        assert 0 < r["tokens"] - known <= 4 * 8, r
    assert len(s["loss_curve"]) == 3


# Guards: records longer than their schema says (the loaders do not cut those) are still cut by
# the trainer before the model, with a one-time warning.
def test_text_longer_than_schema_is_cut_by_the_guard():
    warned = []
    guard = train.TokenGuard(512, 4, "DB", warned.append, deferred=False)
    batch = {"tokens": torch.arange(1, 13).reshape(2, 6),
             "attention_mask": torch.ones(2, 6, dtype=torch.bool),
             "sample_index": torch.tensor([0, 1])}
    for _ in range(2):
        out = guard(batch)
        assert out["tokens"].shape == out["attention_mask"].shape == (2, 4)
    assert len(warned) == 1


# Guards --ckpt-when-busy: every requested save is either committed or skipped and
# logged, never lost from the count; wait mode skips none; each committed save reports its bytes
# written and durable time in the summary and in a metrics row.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
@pytest.mark.parametrize("when", ["skip", "wait"])
def test_ckpt_when_busy_accounts_every_save(train_db, tmp_path, when):
    rows = str(tmp_path / "rows.jsonl")
    s = _run(COMMON + ["--data", train_db, "--mode", "loongforge", "--steps", "5",
                       "--ckpt-every", "1", "--ckpt-when-busy", when,
                       "--ckpt-dir", str(tmp_path / "v"), "--metrics-jsonl", rows], tmp_path, when)
    f = s["figures"]
    assert f["ckpt_when_busy"] == when
    assert f["ckpt_saves_committed"] + f["ckpt_saves_skipped"] == 5
    assert f["ckpt_saves_committed"] >= 1
    if when == "wait":
        assert f["ckpt_saves_skipped"] == 0
    per = f["ckpt_per_save"]
    assert len(per) == f["ckpt_saves_committed"]
    assert not set(p["step"] for p in per) & set(f["ckpt_skipped_steps"])
    assert all(p["bytes_written"] > 0 and p["durable_s"] > 0 for p in per)
    assert f["ckpt_bytes_written"] == sum(p["bytes_written"] for p in per)
    from loongforge.ckpt import CheckpointVault
    v = CheckpointVault(str(tmp_path / "v" / "vault"), read_only=True)
    assert v.steps() == sorted(p["step"] for p in per)  # nothing committed went unreported
    with open(rows) as fh:
        committed_in_rows = [r["ckpt_committed_step"] for r in map(json.loads, fh)
                             if "ckpt_committed_step" in r]
    # Commits noticed during the run are in the rows; the ones the final drain committed are not.
    assert set(committed_in_rows) <= set(v.steps())


# Guards resuming after a kill: a trainer killed (SIGKILL) while the background writer is writing
# resumes from the newest committed checkpoint and trains on from there.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build yet")
def test_kill_during_background_write_resumes_from_last_commit(train_db, tmp_path):
    import signal
    import subprocess
    import time

    from loongforge.ckpt import CheckpointVault

    ck = tmp_path / "ck"
    args = [a for a in COMMON if a != "--quiet"] + [
        "--data", train_db, "--mode", "loongforge", "--ckpt-every", "1", "--ckpt-dir", str(ck)]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    p = subprocess.Popen([sys.executable, "-m", "loongforge.train"] + args + ["--steps", "400"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifests = ck / "vault" / "manifests"
    try:
        deadline = time.monotonic() + 300  # a bound on a hung child, not a timing assertion
        while len(glob.glob(str(manifests / "ckpt-*.manifest"))) < 2:
            assert p.poll() is None, "the trainer exited before two checkpoints were committed"
            assert time.monotonic() < deadline, "no two checkpoints within 300 s"
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)  # the writer is busy: --ckpt-every 1 saves every step
        p.wait()
    v = CheckpointVault(str(ck / "vault"), read_only=True)
    last = v.latest()
    assert last is not None and last >= 2
    v.close()
    out = str(tmp_path / "resumed.json")
    r = subprocess.run([sys.executable, "-m", "loongforge.train"] + args +
                       ["--steps", str(last + 2), "--resume", "--json-out", out],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resumed from step {last} of {ck}" in r.stderr
    with open(out) as fh:
        s = json.load(fh)
    assert [x["step"] for x in s["loss_curve"]] == [last + 1, last + 2]
    v = CheckpointVault(str(ck / "vault"), read_only=True)
    assert v.latest() >= last + 1  # training went on and committed past the resumed step


# Guards the out-of-memory exit: code 3 and one line naming the batch size and where the run was
# (start-up, or the step: bench/memory/max_batch.py keeps the line per probe); any other
# RuntimeError still raises.
def test_out_of_memory_exit_names_batch_and_step(train_db, monkeypatch, capsys):
    from loongforge.models.gr00t import Gr00tPolicy

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    args = COMMON + ["--data", train_db, "--steps", "2", "--batch-size", "2"]
    monkeypatch.setattr(Gr00tPolicy, "forward", oom)
    assert train.main(args) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert "out of memory at --batch-size 2 (step 1): CUDA out of memory. Tried to allocate " \
           "2.00 GiB" in err[-1], err
    calls = []  # --memory-history dumps its snapshot at the out-of-memory (CUDA-only: stubbed)
    monkeypatch.setattr(session, "_memory_history", lambda path, dev: calls.append((path, dev)))
    assert train.main(args + ["--memory-history", "/nonexistent/h.pickle"]) == 3
    assert [c[0] for c in calls] == ["/nonexistent/h.pickle"] * 2 and calls[1][1] is None
    monkeypatch.setattr(loop, "run", oom)
    assert train.main(args) == 3
    assert "(start-up)" in capsys.readouterr().err
    monkeypatch.setattr(loop, "run", lambda a, progress=None: (_ for _ in ()).throw(
        RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):
        train.main(args)


# Guards the persistent arena and torch's expandable graph pool on the GPU (loongforge's
# defaults): the parameters, buffers and optimizer state each in one allocation, captures in
# torch's graph pool with expandable segments, and the same losses as the run with neither
# (Note [The persistent arena], Note [Graphs and MemSculptor]).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_persistent_arena_and_expandable_graph_pool_same_losses(train_db, tmp_path):
    on = _run_gpu(train_db, tmp_path, "arena", "loongforge", 4)
    off = _run_gpu(train_db, tmp_path, "plain", "loongforge", 4, "--persistent-arena", "off",
                   "--expandable-segments", "off", "--graph-pool", "memsculptor")
    mods = on["modules"]
    assert mods["persistent_arena"].count("in one allocation") == 2, mods
    assert mods["expandable_segments"] == "on" and "graphs in torch's pool" in mods["memsculptor"]
    assert "expandable_segments" not in off["modules"]
    assert "graphs in torch's pool" not in off["modules"]["memsculptor"]
    _switch_keeps_losses(on, off, "persistent_arena", 4)


# Guards --norm-recompute in the trainer on the GPU: on by default in loongforge mode (graphed
# steps), and the run's losses are those of the same run without it (Note [Recomputed norms]).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_norm_recompute_same_losses(train_db, tmp_path):
    # eager blocks: under --compile-blocks inductor's partitioner picks what backward recomputes,
    # and fuses around it, so bits may differ; this guards the recompute's exactness
    on = _run_gpu(train_db, tmp_path, "norms", "loongforge", 4, "--compile-blocks", "off")
    off = _run_gpu(train_db, tmp_path, "nonorms", "loongforge", 4, "--norm-recompute", "off",
                   "--compile-blocks", "off")
    _switch_keeps_losses(on, off, "norm_recompute", 4)


# Guards Note [Compiled blocks] in the trainer: on by default in loongforge mode on CUDA (torch >=
# 2.5), said in the modules, the blocks' compiled kernels captured in the CUDA graph, and losses
# those of the eager blocks up to bf16 rounding (inductor keeps fp32 between the casts eager
# rounds at).
@pytest.mark.skipif(not torch.cuda.is_available() or not hasattr(torch, "compile"),
                    reason="needs a CUDA device and torch.compile")
def test_gpu_compile_blocks_keeps_losses(train_db, tmp_path):
    on = _run_gpu(train_db, tmp_path, "blocks", "loongforge", 5)
    off = _run_gpu(train_db, tmp_path, "noblocks", "loongforge", 5, "--compile-blocks", "off")
    assert on["modules"]["compile_blocks"].startswith("on ("), on["modules"]
    assert "compile_blocks" not in off["modules"]
    assert on["modules"]["cuda_graph"].startswith("per_microbatch"), on["modules"]
    a = [r["loss"] for r in on["loss_curve"]]
    b = [r["loss"] for r in off["loss_curve"]]
    assert len(a) == 5 and a == pytest.approx(b, rel=2e-2), (a, b)
    assert a != b  # the compiled kernels ran (fused bf16 arithmetic rounds differently)


# Guards Note [Static shapes for --compile]: tuned mode with torch.compile of the whole model pads
# text to the dataset's longest (one shape, one compilation; torch 2.11 failed in the backward of
# the dynamic-shape recompile that varying lengths caused) and trains to finite losses.
@pytest.mark.skipif(not torch.cuda.is_available() or not hasattr(torch, "compile"),
                    reason="needs a CUDA device and torch.compile")
def test_gpu_tuned_compile_static_shapes(train_db, tmp_path):
    s = _run_gpu(train_db, tmp_path, "tc", "tuned", 4, "--compile")
    assert s["modules"]["compile"].startswith("whole model, static shapes (text padded to"), \
        s["modules"]
    assert all(r["loss"] == r["loss"] and r["loss"] > 0 for r in s["loss_curve"])


# Guards --norm-recompute on in the CPU trainer: said in the modules, the same losses as without,
# and the process-wide switch is set per run (off again in a later run that does not ask).
def test_norm_recompute_on_cpu_same_losses(train_db, tmp_path):
    from loongforge.models import gr00t_layers as L

    args = COMMON + ["--data", train_db, "--steps", "3", "--mode", "baseline"]
    on = _run(args + ["--norm-recompute", "on"], tmp_path, "on")
    assert on["modules"]["norm_recompute"].startswith("on (")
    off = _run(args, tmp_path, "off")
    assert "norm_recompute" not in off["modules"] and not L._recompute_norms
    assert [r["loss"] for r in on["loss_curve"]] == [r["loss"] for r in off["loss_curve"]]


# Guards when --compile-blocks auto compiles (Note [Compiled blocks]): loongforge mode on CUDA
# with torch >= 2.5 and static shapes only; never beside --compile / --compile-frozen, never in
# the other modes or on the CPU; on and off as asked.
def test_compile_blocks_auto_rules(monkeypatch):
    import argparse

    def want(version="2.11.0+cu130", lf=True, device="cuda", static=True, moe=False, **flags):
        monkeypatch.setattr(torch, "__version__", version)
        a = argparse.Namespace(compile_blocks="auto", compile=False, compile_frozen=False)
        vars(a).update(flags)
        wanted, why = train._compile_blocks_wanted(a, lf, torch.device(device), static, moe=moe)
        assert wanted or why  # every "no" says why (the modules line shows it)
        return wanted

    assert want()
    assert not want(static=False)  # every text length would compile anew
    assert not want(lf=False) and not want(device="cpu")
    assert not want(compile=True) and not want(compile_frozen=True)
    assert not want(act_ckpt="dit") and want(act_ckpt="off")
    assert not want(moe=True) and want(moe=True, compile_blocks="on")
    assert not want(version="2.4.1") and not want(version="1.13.1")
    assert want(version="2.5.0a0")
    assert want(lf=False, device="cpu", static=False, compile_blocks="on")
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    a = argparse.Namespace(compile_blocks="auto", compile=False, compile_frozen=False)
    assert "MoE" in train._compile_blocks_wanted(a, True, torch.device("cuda"), True, moe=True)[1]
    assert "CUDA" in train._compile_blocks_wanted(a, True, torch.device("cpu"), True)[1]
    assert not want(compile_blocks="off")
