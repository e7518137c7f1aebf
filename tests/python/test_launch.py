"""`loongforge launch`: N real processes with torchrun's environment, through bin/loongforge, on
Debian's torch (gloo on the CPU): all_reduce, the trainer at world 2, a failing rank, signals and
bad flags."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdata import ENTRY, entry_env as _env, killed_at_exit  # noqa: E402
from lf_testdb import TINY_TRAIN_ARGS  # noqa: E402

ALL_REDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
print("env", " ".join(f"{k}={os.environ[k]}" for k in keys))
print("sum", t.item())
print("to stderr", file=__import__("sys").stderr)
dist.destroy_process_group()
"""


def _launch(args, cwd, timeout=180):
    return subprocess.run([ENTRY, "launch"] + args, cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


# Guards the contract torchrun users rely on: every rank gets RANK/LOCAL_RANK/WORLD_SIZE/
# LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT (one port for all), gloo's env:// rendezvous completes
# and a collective runs, and each output line carries its rank on the stream it was written to.
def test_two_ranks_all_reduce_over_gloo(tmp_path):
    (tmp_path / "ar.py").write_text(ALL_REDUCE)
    r = _launch(["--nproc", "2", "--", "ar.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    envs = {}
    for rank in (0, 1):
        assert f"[rank {rank}] sum 3.0" in r.stdout.splitlines(), r.stdout
        assert f"[rank {rank}] to stderr" in r.stderr.splitlines(), r.stderr
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"[rank {rank}] env "))
        envs[rank] = dict(kv.split("=", 1) for kv in line.split()[3:])
    for rank, e in envs.items():
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == (
            str(rank), str(rank), "2", "2")
        assert e["MASTER_ADDR"] == "127.0.0.1"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and int(envs[0]["MASTER_PORT"]) > 0


# Guards the `-m MODULE` form and --master-port: the module runs as __main__ in every rank and
# sees the port it was given.
def test_module_form_and_master_port(tmp_path):
    (tmp_path / "hello_mod.py").write_text(
        "import os\nprint('hello', os.environ['RANK'], os.environ['MASTER_PORT'])\n")
    r = _launch(["--nproc", "3", "--master-port", "29533", "--", "-m", "hello_mod"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(x for x in r.stdout.splitlines() if "hello" in x) == [
        f"[rank {i}] hello {i} 29533" for i in range(3)]


# Guards the trainer under the launcher: two gloo ranks train a few steps on the CPU, and each
# sees world 2 (the sampler splits the data, NexusSync all-reduces the gradients).
def test_trainer_two_ranks(tmp_path, train_db):
    out = tmp_path / "run.json"
    r = _launch(["--nproc", "2", "train"] + list(TINY_TRAIN_ARGS) + [
        "--data", train_db, "--mode", "loongforge", "--steps", "3", "--no-vault",
        "--json-out", str(out)], tmp_path, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["world_size"] == 2, s
    assert len(s["loss_curve"]) == 3, s["loss_curve"]


# Guards the failure path: one rank exits 3 while the other would run for a minute; the launcher
# ends the survivor at once and exits 3 with a line naming rank 1.
def test_failing_rank_ends_the_others(tmp_path):
    (tmp_path / "fail.py").write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(0.5); sys.exit(3)\n"
        "time.sleep(60)\n")
    t0 = time.monotonic()
    r = _launch(["--nproc", "2", "--grace", "5", "--", "fail.py"], tmp_path)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert time.monotonic() - t0 < 40
    assert "loongforge launch: error: rank 1 of 2 exited with code 3" in r.stderr, r.stderr


def _signal_two_ranks(tmp_path, launch_args, script, sig):
    """Runs `launch --nproc 2 <launch_args> -- <script>`, waits until both ranks have written
    ready<RANK> (their handlers are in place), then sends `sig` to the launcher. Returns (exit code,
    stdout, stderr, seconds from the signal to the exit); kills the launcher if it outlives that."""
    p = subprocess.Popen([ENTRY, "launch", "--nproc", "2"] + launch_args + ["--", script],
                         cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    with killed_at_exit(p):
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in (0, 1)):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    return p.returncode, out, err, time.monotonic() - t0


# Guards signal forwarding: SIGTERM to the launcher reaches every rank (each runs its handler and
# says so), and the launcher exits 128 + 15 as a process ended by SIGTERM would.
def test_sigterm_is_forwarded(tmp_path):
    (tmp_path / "wait.py").write_text(
        "import os, signal, sys, time\n"
        "def h(s, f):\n    print('got', s, flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, h)\n"
        "open('ready' + os.environ['RANK'], 'w').close()\n"
        "time.sleep(60)\n")
    code, out, err, _ = _signal_two_ranks(tmp_path, [], "wait.py", signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, (code, err)
    lines = out.splitlines()
    assert f"[rank 0] got {int(signal.SIGTERM)}" in lines and \
        f"[rank 1] got {int(signal.SIGTERM)}" in lines, out
    assert "loongforge launch: SIGTERM passed on to 2 rank(s); exiting 143" in err, err


# Guards the interrupt edge: a rank that ignores the forwarded SIGINT is killed after --grace, so
# Ctrl-C never leaves the launcher waiting on a stuck rank.
def test_sigint_kills_a_rank_that_ignores_it_after_grace(tmp_path):
    (tmp_path / "stuck.py").write_text(
        "import os, signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "open('ready' + os.environ['RANK'], 'w').close()\n"
        "time.sleep(120)\n")
    code, _, err, seconds = _signal_two_ranks(tmp_path, ["--grace", "2"], "stuck.py",
                                              signal.SIGINT)
    assert code == 128 + signal.SIGINT, (code, err)
    assert seconds < 30


# Guards usage errors: each is exit 2 with one line saying what is wrong, and nothing is started.
@pytest.mark.parametrize("args, msg", [
    (["--nproc", "0", "--", "x.py"], "--nproc must be >= 1, got 0"),
    (["--nproc", "two", "--", "x.py"], "invalid int value: 'two'"),
    (["--", "x.py"], "the following arguments are required: --nproc"),
    (["--nproc", "2"], "no program"),
    (["--nproc", "2", "--"], "no program after `--`"),
    (["--nproc", "2", "--", "-m"], "-m needs a module name"),
    (["--nproc", "2", "--", "missing.py"], "script 'missing.py' is not a file"),
    (["--nproc", "2", "--bogus", "--", "x.py"], "unrecognized arguments: --bogus"),
    (["--nproc", "2", "--master-port", "70000", "--", "x.py"], "--master-port must be in"),
])
def test_bad_flags_exit_2(tmp_path, args, msg):
    (tmp_path / "x.py").write_text("open('ran', 'w').close()\n")
    r = _launch(args, tmp_path, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert msg in r.stderr, r.stderr
    assert not (tmp_path / "ran").exists()
