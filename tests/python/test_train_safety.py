"""A run that fails, fails safe: non-finite steps are skipped and stop the run, every numeric flag
is checked when it is parsed, flags changed on --resume are applied or refused, and SIGTERM /
SIGUSR1 / SIGINT checkpoint at a step boundary and exit cleanly."""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdata import killed_at_exit  # noqa: E402
from lf_testdb import TINY_TRAIN_ARGS, has_datafusion  # noqa: E402

from loongforge import train  # noqa: E402
from loongforge.trainer.checkpoint import read_state_file  # noqa: E402
from loongforge.trainer.optim import lr_lambda, optimizer_step  # noqa: E402

torch.set_num_threads(1)
COMMON = list(TINY_TRAIN_ARGS)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ["baseline", "loongforge"]


def _need(mode):
    if mode == "loongforge" and not has_datafusion():
        pytest.skip("loongforge.data (DataFusion, CheckpointVault) is not in this build")


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    errors = [e for e in err if "error" in e]
    assert len(errors) == 1 and errors[0].startswith("loongforge train: error: "), err
    assert not any("Traceback" in e for e in err), err
    return errors[0]


def _model_tensors(ck, mode, step):
    """{name: tensor} of the model saved at `step` in checkpoint directory `ck`."""
    if mode == "loongforge":
        from loongforge.ckpt import CheckpointVault

        v = CheckpointVault(os.path.join(ck, "vault"), read_only=True)
        try:
            return v.load(step, map_location="cpu")["model"]
        finally:
            v.close()
    return read_state_file(os.path.join(ck, f"step_{step:08d}.pt"))["model"]


# ---- non-finite steps -------------------------------------------------------------------------


def _linear_opt(fused=False):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    params = list(lin.parameters())
    return params, torch.optim.AdamW(params, lr=1e-2)


# Guards: with --clip 0 the norm was not computed and a NaN gradient stepped the optimizer,
# turning every parameter into NaN; a NaN loss with finite gradients stepped too.
@pytest.mark.parametrize("clip", [0.0, 1.0])
@pytest.mark.parametrize("what", ["grad", "loss"])
def test_nonfinite_step_leaves_parameters_and_state(clip, what):
    params, opt = _linear_opt()
    for p in params:
        p.grad = torch.ones_like(p)
    acc = torch.zeros(6)
    optimizer_step(opt, params, clip, acc)  # a finite step: state exists, parameters move
    assert acc[5] == 0 and acc[4] > 0
    before = [p.detach().clone() for p in params]
    state = [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    acc = torch.zeros(6)
    if what == "grad":
        params[0].grad[0, 0] = float("nan")
    else:
        acc[0] = float("inf")
    optimizer_step(opt, params, clip, acc)
    assert acc[5] == 1
    assert all(torch.equal(a, p) for a, p in zip(before, params))
    for p, st in zip(params, state):
        assert all(torch.equal(st[k], opt.state[p][k]) for k in st)


# Guards: `--lr 1e30 --clip 0` trained on NaN for every step, committed checkpoints whose
# tensors were NaN (122 of 220) and exited 0. Now the run stops after --max-nonfinite-steps
# skipped steps in a row with one line naming the step, exit 1, and every checkpoint is finite.
@pytest.mark.parametrize("mode", MODES)
def test_nonfinite_loss_stops_the_run(train_db, tmp_path, capsys, mode):
    _need(mode)
    ck = str(tmp_path / "ck")
    rc = train.main(COMMON + ["--data", train_db, "--mode", mode, "--steps", "12", "--lr", "1e30",
                              "--clip", "0", "--ckpt-every", "2", "--ckpt-dir", ck])
    line = _one_line_error(capsys)
    assert rc == 1, line
    assert "step 4:" in line and "3 steps in a row" in line and "steps 2..4 skipped" in line
    assert "the newest checkpoint of this run is step 4" in line, line
    for step in (2, 4):  # step 4 was skipped: its checkpoint holds the weights of step 1
        model = _model_tensors(ck, mode, step)
        bad = [k for k, t in model.items() if t.is_floating_point() and not t.isfinite().all()]
        assert not bad, (step, bad)
    assert not os.path.exists(os.path.join(ck, "step_00000006.pt"))


# Guards: a skipped step updated nothing: the checkpoints of steps 2 and 4 (steps 2..4 skipped)
# hold the same weights, and a run below the limit finishes with the skipped steps counted.
def test_skipped_steps_do_not_update_the_weights(train_db, tmp_path):
    ck = str(tmp_path / "ck")
    out = str(tmp_path / "s.json")
    assert train.main(COMMON + ["--data", train_db, "--mode", "baseline", "--steps", "4",
                                "--lr", "1e30", "--clip", "1", "--max-nonfinite-steps", "5",
                                "--ckpt-every", "2", "--ckpt-dir", ck, "--json-out", out]) == 0
    s = json.load(open(out))
    assert [r["skipped_nonfinite"] for r in s["loss_curve"]] == [0, 1, 1, 1]
    assert s["figures"]["skipped_nonfinite_steps"] == 3
    a, b = _model_tensors(ck, "baseline", 2), _model_tensors(ck, "baseline", 4)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- flags ------------------------------------------------------------------------------------


# Guards: these values reached the core or torch and ended in tracebacks (seed -1: ValueError
# from the DataLoader; 1e20: RuntimeError Overflow), or trained on NaN (--lr inf, --lr 1e400).
@pytest.mark.parametrize("flag,value", [
    ("--lr", "inf"), ("--lr", "1e400"), ("--lr", "nan"), ("--lr", "-1"), ("--lr", "x"),
    ("--seed", "-1"), ("--seed", "99999999999999999999"), ("--seed", "1.5"),
    ("--prefetch", "0"), ("--crop-fraction", "0"), ("--crop-fraction", "1.5"),
    ("--steps", "0"), ("--batch-size", "0"), ("--batch-size", "99999999999"),
    ("--grad-accum", "0"), ("--min-lr-ratio", "2"), ("--weight-decay", "inf"),
    ("--clip", "-1"), ("--clip", "nan"), ("--image-size", "0"), ("--loader-threads", "0"),
    ("--graph-pad-up", "0.5"), ("--topk-ratio", "0"), ("--ep-timeout", "inf"),
    ("--max-nonfinite-steps", "0"), ("--log-every", "0"), ("--memory-cap-gib", "-2")])
def test_numeric_flags_are_checked_when_parsed(train_db, capsys, flag, value):
    assert train.main(COMMON + ["--data", train_db, "--steps", "1", flag, value]) == 2
    line = _one_line_error(capsys)
    assert line.startswith(f"loongforge train: error: argument {flag}: "), line
    assert value in line, line


# Guards: a batch larger than the dataset ended in a ValueError traceback.
def test_batch_larger_than_the_dataset(train_db, capsys):
    assert train.main(COMMON + ["--data", train_db, "--mode", "baseline", "--steps", "1",
                                "--batch-size", "100000"]) == 2
    line = _one_line_error(capsys)
    assert "100000" in line and "full batch" in line, line


# Guards: a read-only --ckpt-dir ended in a PermissionError traceback. Root ignores permission
# bits, so the run goes as `nobody` there.
def test_read_only_checkpoint_directory(train_db, tmp_path):
    import shutil
    import stat
    import tempfile

    top = tempfile.mkdtemp(prefix="lf-ro-")
    try:
        os.chmod(top, 0o755)
        db = os.path.join(top, "db")
        shutil.copytree(train_db, db)
        ro = os.path.join(top, "ro")
        os.mkdir(ro)
        for root, dirs, files in os.walk(top):
            for n in dirs + files:
                p = os.path.join(root, n)
                os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
        os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH
                 | stat.S_IXOTH)
        user = 65534 if os.geteuid() == 0 else None
        r = subprocess.run(
            [sys.executable, "-m", "loongforge.train"] + COMMON +
            ["--data", db, "--steps", "2", "--mode", "baseline", "--ckpt-every", "1",
             "--ckpt-dir", os.path.join(ro, "ck")], capture_output=True, text=True, timeout=120,
            env=_env(), cwd=top, user=user)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1, r.stderr
        assert err[0].startswith("loongforge train: error: --ckpt-dir ") and \
            "Permission denied" in err[0], err
        assert os.listdir(ro) == []
    finally:
        os.chmod(top, 0o755)
        for root, dirs, _ in os.walk(top):
            for n in dirs:
                os.chmod(os.path.join(root, n), 0o755)
        shutil.rmtree(top)


# Guards: `--resume --lr 1e30` silently kept the checkpoint's learning rate (the optimizer's and
# the scheduler's state carried it). Changed flags are applied and logged.
def test_resume_applies_and_logs_changed_flags(train_db, tmp_path, capsys):
    ck = str(tmp_path / "ck")
    base = COMMON + ["--data", train_db, "--mode", "baseline", "--ckpt-every", "2",
                     "--ckpt-dir", ck]
    assert train.main(base + ["--steps", "8", "--stop-after", "2"]) == 0
    capsys.readouterr()
    jl = str(tmp_path / "m.jsonl")
    assert train.main(base + ["--steps", "6", "--resume", "--lr", "1e-3", "--clip", "0.5",
                              "--metrics-jsonl", jl]) == 0
    err = capsys.readouterr().err
    assert "--resume: --lr 0.001 (the checkpoint's run had 0.0001): applied from step 3" in err
    assert "--resume: --steps 6 (the checkpoint's run had 8)" in err
    assert "--resume: --clip 0.5 (the checkpoint's run had 1.0)" in err
    rows = [json.loads(x) for x in open(jl)]
    assert [r["step"] for r in rows] == [3, 4, 5, 6]
    f = lr_lambda(6, 0.05, 0.0)  # the new schedule: --lr 1e-3 over --steps 6
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * f(k) for k in (3, 4, 5, 6)],
                                                    rel=1e-6)


# ---- signals ----------------------------------------------------------------------------------


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("LOONGFORGE_DEBUG", None)
    return env


def _cmd(train_db, mode, steps, *extra):
    return ([sys.executable, "-m", "loongforge.train"] +
            [a for a in COMMON if a != "--quiet"] +
            ["--data", train_db, "--mode", mode, "--steps", str(steps), "--workers", "1"]
            + list(extra))


def _losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))}


def _interrupt(cmd, after_step, signals, gap=0.0):
    """Starts cmd, waits for its `step after_step/` line, sends `signals` (gap seconds apart) and
    returns (returncode, stderr)."""
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=_env())
    lines = []
    with killed_at_exit(p):
        for line in p.stderr:
            lines.append(line)
            if f" step {after_step}/" in line:
                break
        for i, sig in enumerate(signals):
            if i:
                time.sleep(gap)
            p.send_signal(sig)
        out, rest = p.communicate(timeout=120)
    return p.returncode, "".join(lines) + rest


# Guards: SIGTERM killed the trainer mid-step (exit -15): the steps since the last checkpoint
# were lost and nothing said so. Now it stops at the next step boundary, checkpoints, says which
# step, exits 0, and a --resume continues the uninterrupted run's losses with no step lost.
@pytest.mark.parametrize("mode", ["loongforge", "tuned"])
def test_sigterm_checkpoints_and_resume_continues(train_db, tmp_path, mode):
    _need(mode)
    if mode == "tuned":
        try:
            import torch.distributed.checkpoint as dcp
        except ImportError:  # torch 1.13: tuned mode writes torch.save checkpoints
            dcp = None
        if hasattr(dcp, "async_save"):
            pytest.skip("tuned mode saves DCP checkpoints with this torch, which --resume does not "
                        "read (it says so and exits 2)")
    n = 10
    full = str(tmp_path / "full.jsonl")
    r = subprocess.run(_cmd(train_db, mode, n, "--metrics-jsonl", full), capture_output=True,
                       text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    ck = str(tmp_path / "ck")
    at = random.Random().randint(2, 5)
    rc, err = _interrupt(_cmd(train_db, mode, n, "--ckpt-dir", ck, "--ckpt-every", "100",
                              "--metrics-jsonl", str(tmp_path / "a.jsonl")), at, [signal.SIGTERM])
    assert rc == 0, err[-2000:]
    assert "Traceback" not in err
    saved = [ln for ln in err.splitlines() if "signal SIGTERM: saved step" in ln]
    assert len(saved) == 1, err[-2000:]
    stop = int(saved[0].split("saved step ")[1].split(",")[0])
    assert at <= stop < n, (at, stop)
    part = _losses(str(tmp_path / "a.jsonl"))
    assert max(part) == stop
    res = str(tmp_path / "res.jsonl")
    r = subprocess.run(_cmd(train_db, mode, n, "--ckpt-dir", ck, "--ckpt-every", "100",
                            "--resume", "--metrics-jsonl", res), capture_output=True, text=True,
                       timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    a, b, c = _losses(full), _losses(res), part
    assert sorted(b) == list(range(stop + 1, n + 1)), (stop, sorted(b))
    for k in c:
        assert c[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (k, c[k], a[k])
    for k in b:
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (k, b[k], a[k])


# Guards: SIGINT ended in a KeyboardInterrupt traceback from inside autograd. A first SIGINT
# now behaves like SIGTERM; a second one exits at once (130), without a traceback. SIGUSR1
# without a --ckpt-dir says that nothing was saved.
def test_sigint_twice_exits_at_once_and_sigusr1_without_directory(train_db, tmp_path):
    _need("loongforge")
    rc, err = _interrupt(_cmd(train_db, "loongforge", 400), 2, [signal.SIGUSR1])
    assert rc == 0, err[-2000:]
    assert "[loongforge] signal SIGUSR1: no --ckpt-dir: nothing saved, exiting" in err, err[-2000:]
    rc, err = _interrupt(_cmd(train_db, "baseline", 400, "--ckpt-dir", str(tmp_path / "ck")), 2,
                         [signal.SIGINT, signal.SIGINT], gap=0.05)
    assert rc == 130, err[-2000:]
    assert "second SIGINT: exiting now" in err and "Traceback" not in err, err[-2000:]
    rc, err = _interrupt(_cmd(train_db, "baseline", 400, "--ckpt-dir", str(tmp_path / "ck2")), 3,
                         [signal.SIGINT])
    assert rc == 0 and "Traceback" not in err, err[-2000:]
    assert "[baseline] signal SIGINT: saved step " in err, err[-2000:]
    assert not math.isnan(float(err.split("saved step ")[1].split(",")[0]))


# Guards: with several ranks a signal that reached one rank only would stop that rank alone, and
# the other would wait in the next step's collective. Each step boundary all-reduces the ranks'
# flags: both stop after the same step and both write that step's rank state.
def test_signal_to_one_rank_stops_every_rank_at_the_same_step(train_db, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ck = str(tmp_path / "ck")
    env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    cmd = _cmd(train_db, "baseline", 400, "--ckpt-dir", ck, "--batch-size", "2", "--workers", "0")
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    with killed_at_exit(*procs):
        lines = []
        for line in procs[0].stderr:  # rank 0 logs the steps
            lines.append(line)
            if " step 2/" in line:
                break
        procs[1].send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=120) for p in procs]
    err0 = "".join(lines) + outs[0][1]
    assert [p.returncode for p in procs] == [0, 0], (err0[-2000:], outs[1][1][-2000:])
    saved = [ln for ln in err0.splitlines() if "signal on another rank: saved step" in ln]
    assert len(saved) == 1, err0[-2000:]
    step = int(saved[0].split("saved step ")[1].split(",")[0])
    # Both ranks' own states are inside that step's one checkpoint file.
    saved_state = read_state_file(os.path.join(ck, f"step_{step:08d}.pt"))
    assert sorted(saved_state["__rank_state__"]) == [f"rank{r:05d}" for r in range(2)]


# Guards: --resume from a checkpoint past --steps trained nothing and exited 0, saying only
# "loss: (no steps)".
def test_resume_past_steps_is_refused(train_db, tmp_path, capsys):
    ck = str(tmp_path / "ck")
    base = COMMON + ["--data", train_db, "--mode", "baseline", "--ckpt-every", "2",
                     "--ckpt-dir", ck]
    assert train.main(base + ["--steps", "4"]) == 0
    capsys.readouterr()
    assert train.main(base + ["--steps", "3", "--resume"]) == 2
    line = _one_line_error(capsys)
    assert "is step 4, past --steps 3" in line, line


# Guards: a run stuck before its next step boundary ignored SIGTERM for ever once the handler
# had taken it (a `timeout` never ended it). After the grace period it exits as SIGTERM would.
def test_signal_without_a_step_boundary_exits_after_the_grace_period():
    code = ("import os, signal, time\n"
            "from loongforge.train import StopSignal\n"
            "from loongforge.trainer.dist import Dist\n"
            "s = StopSignal(Dist(), 0, 'baseline')\n"
            "s.install()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(60)\n")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(_env(), LOONGFORGE_SIGNAL_GRACE_S="0.5"))
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert time.monotonic() - t < 30
    assert "no step boundary within 0.5 s" in r.stderr and "Traceback" not in r.stderr, r.stderr


# Guards: a DB whose every sample is corrupt looped over empty epochs until killed (90 s in the
# probe); it now stops at the end of the first epoch with one line.
def test_every_sample_corrupt_stops_with_one_line(train_db, tmp_path, capsys):
    _need("loongforge")
    import shutil

    lmdb = pytest.importorskip("lmdb", reason="rewriting the DB's records needs python3-lmdb")
    db = str(tmp_path / "bad")
    shutil.copytree(train_db, db)
    env = lmdb.open(db)
    with env.begin(write=True) as txn:
        for k in [k for k, _ in txn.cursor() if b"_cam_" in k]:
            txn.put(k, b"not a jpeg")
    env.close()
    assert train.main(COMMON + ["--data", db, "--mode", "loongforge", "--steps", "3"]) == 2
    line = _one_line_error(capsys)
    assert "every sample was skipped as corrupt" in line and db in line, line
