"""Hostile inputs through the real `loongforge` binary and the loader: frames whose JPEG header
claims 65500x65500, numeric flags out of range, stdout that cannot be written. Expected everywhere:
one line naming the flag, file or record, the mapped exit code, bounded memory, nothing left behind.
"""
import os
import resource
import struct
import subprocess
import sys

import pytest

import loongforge
from lf_testdata import make_db

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOUND = 64 << 20  # the default max_frame_pixels


def _cli():
    for build in (os.environ.get("LOONGFORGE_BUILD"), os.path.join(REPO, "build")):
        if build and os.access(os.path.join(build, "loongforge"), os.X_OK):
            return os.path.join(build, "loongforge")
    pytest.skip("no loongforge binary (make build)")


def _run(*args, stdout=subprocess.PIPE, timeout=120):
    return subprocess.run([_cli(), *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


def _claim(jpeg: bytes, w: int, h: int) -> bytes:
    """`jpeg` with its baseline SOF0 header rewritten to claim w x h (scan data unchanged)."""
    b = bytearray(jpeg)
    i = b.find(b"\xff\xc0")
    assert i >= 0
    b[i + 5:i + 9] = struct.pack(">HH", h, w)
    return bytes(b)


def _hostile_db(tmp_path, name, every=False):
    """A small DB whose sample 5 (or every sample) has JPEG headers claiming 65500x65500."""
    lmdb = pytest.importorskip("lmdb")
    db = make_db(str(tmp_path / name), samples=16)
    env = lmdb.open(db, map_size=1 << 30, subdir=True)
    with env.begin(write=True) as t:
        keys = [k for k, _ in t.cursor() if b"_cam_" in k]
        for k in keys:
            if every or k.startswith(b"00000005_"):
                t.put(k, _claim(t.get(k), 65500, 65500))
    env.sync(True)
    env.close()
    return db


def _one_error_line(r, prefix):
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(prefix), r.stderr
    return lines[0]


# A record whose header claims more pixels than max_frame_pixels is corrupt: DataLoss naming the DB,
# the record, the claimed size and the bound under on_corrupt='error'; skipped under 'skip'.
def test_loader_refuses_frame_over_pixel_bound(tmp_path):
    db = _hostile_db(tmp_path, "one")
    kw = dict(image_size=32, threads=2, shuffle=False, drop_last=False)
    with pytest.raises(loongforge._C.DataLossError) as e:
        for _ in loongforge.DataFusionLoader(db, 4, on_corrupt="error", **kw):
            pass
    msg = str(e.value)
    assert db in msg and "record '00000005_cam_" in msg, msg
    assert "65500x65500" in msg and f"max_frame_pixels {BOUND}" in msg, msg
    seen = [i for b in loongforge.DataFusionLoader(db, 4, on_corrupt="skip", **kw)
            for i in b["sample_index"].tolist() if i >= 0]
    assert sorted(seen) == [i for i in range(16) if i != 5]
    # The bound is the caller's: a lower one refuses the good 96x72 frames too.
    with pytest.raises(loongforge._C.DataLossError, match="96x72 = 6912 pixels"):
        for _ in loongforge.DataFusionLoader(db, 4, on_corrupt="error", max_frame_pixels=6911,
                                             **kw):
            pass
    with pytest.raises(ValueError, match="max_frame_pixels must be >= 1"):
        loongforge.DataFusionLoader(db, 4, max_frame_pixels=0, **kw)


def _peak_rss_mb(db):
    """Peak RSS (MB) of `loongforge bench loader` on `db`, in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = _run("bench", "loader", "--db", db, "--batch", 4, "--threads", 1, "--image-size", 64,
             "--warmup", 0)
    assert r.returncode == 0, r.stderr
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert after >= before
    return after / 1024.0


# Every frame claiming 65500x65500 (12 GiB of RGB each) must cost no more memory than good frames:
# the header is refused before a buffer is sized from it.
def test_bench_loader_memory_bounded_on_hostile_headers(tmp_path):
    hostile = _hostile_db(tmp_path, "all", every=True)
    bad = _peak_rss_mb(hostile)  # first: RUSAGE_CHILDREN keeps the largest child so far
    good = _peak_rss_mb(make_db(str(tmp_path / "good"), samples=16))
    assert bad < 2 * max(good, 64), (bad, good)


# pack --src refuses such a frame, naming the file and both values, and leaves nothing behind.
def test_pack_refuses_frame_over_pixel_bound(tmp_path):
    from loongforge import packing
    src = str(tmp_path / "src")
    packing.demo_data(src, episodes=1, cameras=1, width=32, height=24, seed=1, steps_min=3,
                      steps_max=3, state_dim=2, action_dim=2)
    eps = sorted(e for e in os.listdir(os.path.join(src, "episodes")) if not e.startswith("."))
    ep = os.path.join(src, "episodes", eps[0])
    cam = os.path.join(ep, sorted(d for d in os.listdir(ep) if d.startswith("cam_"))[0])
    frame = os.path.join(cam, sorted(os.listdir(cam))[1])
    with open(frame, "rb") as f:
        data = f.read()
    with open(frame, "wb") as f:
        f.write(_claim(data, 65500, 65500))
    out = str(tmp_path / "db")
    r = _run("pack", "--quiet", "--src", src, "--out", out)
    assert r.returncode == 2, r.stderr
    line = _one_error_line(r, "loongforge pack: error: ")
    assert frame in line and "65500x65500" in line and f"max_frame_pixels {BOUND}" in line, line
    assert sorted(os.listdir(tmp_path)) == ["src"]
    r = _run("pack", "--quiet", "--src", src, "--out", out, "--max-frame-pixels", 0)
    assert r.returncode == 2 and "--max-frame-pixels" in r.stderr, r.stderr


# Numeric flags are parsed strictly: the whole string, in the type's and the flag's range, no
# wrap-around; a bad value exits 2 with one line naming the flag and the value.
@pytest.mark.parametrize("args,flag,value", [
    (["demo-data", "--out", "{tmp}/d", "--seed", "18446744073709551616"], "--seed",
     "18446744073709551616"),
    (["demo-data", "--out", "{tmp}/d", "--seed", "-1"], "--seed", "-1"),
    (["demo-data", "--out", "{tmp}/d", "--episodes", "1e3"], "--episodes", "1e3"),
    (["demo-data", "--out", "{tmp}/d", "--episodes", "010"], "--episodes", "010"),
    (["demo-data", "--out", "{tmp}/d", "--quality", " 90"], "--quality", " 90"),
    (["pack", "--from-lerobot", "{tmp}/x", "--out", "{tmp}/o", "--shortest-edge", "-5"],
     "--shortest-edge", "-5"),
    (["pack", "--src", "{tmp}/x", "--out", "{tmp}/o", "--horizon", "99999999999"], "--horizon",
     "99999999999"),
    (["bench", "loader", "--db", "{tmp}/db", "--warmup", "-5"], "--warmup", "-5"),
    (["bench", "loader", "--db", "{tmp}/db", "--max-batches", "-1"], "--max-batches", "-1"),
    (["bench", "loader", "--db", "{tmp}/db", "--threads", "99999"], "--threads", "99999"),
    (["bench", "loader", "--db", "{tmp}/db", "--epochs", "0"], "--epochs", "0"),
    (["mem", "replay", "--segment-mb", "-3", "x"], "--segment-mb", "-3"),
])
def test_numeric_flags_are_strict(tmp_path, args, flag, value):
    r = _run(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.returncode == 2, (r.returncode, r.stderr)
    line = _one_error_line(r, "loongforge " + args[0])
    assert flag in line and value.strip() in line, line
    assert not os.path.exists(tmp_path / "d")


# A command whose stdout cannot be written (a full disk, a closed pipe's reader) fails, not exit 0.
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_stdout_write_error_is_reported(tmp_path):
    db = make_db(str(tmp_path / "db"), samples=4)
    for args in (["inspect", db, "--json"], ["inspect", db], ["--version"]):
        with open("/dev/full", "w") as full:
            r = _run(*args, stdout=full)
        assert r.returncode != 0, args
        assert "stdout" in r.stderr and "No space left on device" in r.stderr, r.stderr


# An exception no command maps (here: std::system_error from thread creation, with each thread's
# stack sized 1 TiB by RLIMIT_STACK so the address space runs out) is one line with an exit code,
# never std::terminate's abort.
def test_exception_at_main_is_one_line(tmp_path):
    db = make_db(str(tmp_path / "db"), samples=8)
    code = ("import resource, subprocess, sys;"
            "resource.setrlimit(resource.RLIMIT_STACK, (1 << 40, 1 << 40));"
            "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    r = subprocess.run([sys.executable, "-c", code, _cli(), "bench", "loader", "--db", db,
                        "--batch", "4", "--threads", "256", "--image-size", "32"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert 0 < r.returncode < 128, (r.returncode, r.stderr[-2000:])
    assert "terminate called" not in r.stderr, r.stderr[-2000:]
    _one_error_line(r, "loongforge bench loader: error: ")


# Guards the retry after a killed export: the temp file the killed process was filling is removed
# by the next export of the same output (its owner pid is gone), and that export succeeds.
def test_killed_export_leaves_nothing_for_the_retry(tmp_path):
    import signal
    import time

    import torch

    cli = _cli()
    vault = tmp_path / "vault"
    with loongforge.CheckpointVault(str(vault)) as v:
        v.save(1, {"w": torch.randn(64 << 20, generator=torch.Generator().manual_seed(0))})
    out = tmp_path / "x.safetensors"
    p = subprocess.Popen([cli, "ckpt", "export", str(vault), "--out", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # a bound on a hung child, not a timing assertion
        while not [f for f in tmp_path.iterdir() if f.name.startswith(".x.safetensors.tmp.")]:
            assert p.poll() is None, "export ended before its temp file was seen"
            assert time.monotonic() < deadline
            time.sleep(0.001)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    left = [f.name for f in tmp_path.iterdir() if f.name.startswith(".x.safetensors.tmp.")]
    assert len(left) == 1 and f"{p.pid}@" in left[0], left
    r = _run("ckpt", "export", vault, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "no longer running" in r.stderr, r.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["vault", "x.safetensors"]
    assert out.stat().st_size > (256 << 20)
