"""Tests of loongforge.ckpt.CheckpointVault (the Python facade over the C++ vault)."""
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from loongforge import _C
from loongforge.ckpt import CheckpointVault
from loongforge.trainer.checkpoint import read_state_file, write_state_file

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "python")


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert type(a) == type(b) and list(a.keys()) == list(b.keys())
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) == type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _training_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "loader": {"epoch": 2, "position": 1234, "seed": b"\x01\x02"},
        "rng": torch.get_rng_state(),
        "extras": {"name": "run-1", "lrs": [0.1, 0.01], "t": (1, "x")},
    }


# Guards the state round trip: model/optimizer/loader/RNG/extras come back identical.
def test_round_trip_training_state(tmp_path):
    state = _training_state()
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        assert v.latest() is None
        v.save(10, state)
        v.wait()
        assert v.latest() == 10
        _assert_same(state, v.load())
        _assert_same(state, v.load(10, map_location="cpu"))


# Guards dtype coverage: every dtype incl. bf16, empty and non-contiguous tensors.
def test_every_dtype_empty_and_noncontiguous(tmp_path):
    g = torch.Generator().manual_seed(1)
    state = {}
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        state[str(dt)] = torch.randn(33, 7, generator=g).to(dt)
    for dt in [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]:
        state[str(dt)] = torch.randint(-100 if dt != torch.uint8 else 0, 100, (50,), generator=g).to(dt)
    state["bool"] = torch.rand(40, generator=g) > 0.5
    state["empty"] = torch.empty(0, 3)
    state["scalar"] = torch.tensor(3.5)
    base = torch.randn(20, 30, generator=g)
    state["transposed"] = base.t()
    state["strided"] = base[::2, 1::3]
    state["lone_transposed"] = torch.randn(5, 6, generator=g).t()
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        v.save(1, state)
        out = v.load(1)
    _assert_same(state, out)
    # A view whose storage no other entry uses is stored (and comes back) contiguous; views of
    # one storage come back as views of one storage.
    assert out["lone_transposed"].is_contiguous()
    assert out["transposed"].storage().data_ptr() == out["strided"].storage().data_ptr()


# Guards incremental saves: with 1 of 10 tensors changed, only that tensor's bytes are written.
def test_incremental_writes_only_changed(tmp_path):
    state = {f"t{i}": torch.randn(64, 256) for i in range(10)}  # 64 KiB each
    with CheckpointVault(str(tmp_path), chunk_bytes=16384) as v:
        v.save(1, state)
        v.wait()
        full = v.stats()
        assert full["bytes_written"] >= 10 * 65536
        state["t3"].add_(1.0)
        v.save(2, state)
        v.wait()
        inc = v.stats()
        assert inc["chunks_written"] <= 4 + 1  # t3's 4 chunks (+ the small state blob)
        assert inc["bytes_written"] < 0.15 * full["bytes_written"]
        assert inc["blocking_s"] >= 0 and inc["bytes_total"] >= 10 * 65536
        _assert_same(state, v.load(2))


# Guards corruption detection: a flipped byte arrives as loongforge._C.DataLossError.
def test_flipped_byte_raises_data_loss(tmp_path):
    state = {"w": torch.randn(4096)}
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        v.save(1, state)
    seg = [p for p in glob.glob(str(tmp_path / "segments" / "*")) if os.path.getsize(p) > 8000][0]
    with open(seg, "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 0xFF]))
    v = CheckpointVault(str(tmp_path), read_only=True)
    with pytest.raises(_C.DataLossError, match="tensor 'w'"):
        v.load(1)
    with pytest.raises(_C.DataLossError):
        v.verify(1)


# Guards error translation: missing step -> FileNotFoundError, bad step order -> ValueError,
# a second writer -> RuntimeError (Unavailable).
def test_error_types(tmp_path):
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        with pytest.raises(FileNotFoundError):
            v.load()
        v.save(5, {"a": torch.zeros(3)})
        with pytest.raises(ValueError):
            v.save(5, {"a": torch.zeros(3)})
        with pytest.raises(RuntimeError, match="another process"):
            CheckpointVault(str(tmp_path))
        with pytest.raises(FileNotFoundError):
            v.load(99)


# Guards the checks behind the checkpoint's TensorRef (a name plus the converter's TensorView):
# the C++ Save refuses views that are not contiguous or named twice with a ValueError naming the
# tensor, and nothing is committed.
def test_save_checks_views_in_cpp(tmp_path):
    v = _C.CheckpointVault(str(tmp_path / "v"), chunk_bytes=4096, fsync=False)
    with pytest.raises(ValueError, match="tensor 'w' is not contiguous"):
        v.save(1, [("w", torch.zeros(4, 8).t())])
    with pytest.raises(ValueError, match="tensor name 'w' appears twice"):
        v.save(1, [("w", torch.zeros(2)), ("w", torch.ones(2))])
    with pytest.raises(ValueError, match="each tensor is \\(name, tensor\\)"):
        v.save(1, [("w",)])
    v.wait()
    assert v.list() == []
    v.save(1, [("w", torch.arange(6, dtype=torch.int16))])
    v.wait()
    assert v.describe(1)[0]["dtype"] == "i16" and v.describe(1)[0]["shape"] == [6]
    v.close()

# Guards ENOSPC surfacing in Python: ResourceExhaustedError (a MemoryError) from the next call,
# the earlier checkpoint still loads.
def test_disk_full_raises_resource_exhausted(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    if subprocess.call(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                       stderr=subprocess.DEVNULL) != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        v = CheckpointVault(str(d), chunk_bytes=65536)
        first = {"w": torch.randn(150_000)}  # 600 KB
        v.save(1, first)
        v.wait()
        v.save(2, {"w": torch.randn(150_000)})
        with pytest.raises(_C.ResourceExhaustedError) as e:
            v.wait()
        assert isinstance(e.value, MemoryError)
        _assert_same(first, v.load(1))
        v.close()
        del v
    finally:
        subprocess.call(["umount", "-l", str(d)])


CHILD = textwrap.dedent("""
    import sys, torch
    from loongforge.ckpt import CheckpointVault
    v = CheckpointVault(sys.argv[1], chunk_bytes=1 << 16)
    step = (v.latest() or 0) + 1
    while True:
        g = torch.Generator().manual_seed(step)
        v.save(step, {"w": torch.randn(1 << 18, generator=g), "step": step})
        v.wait()
        print(step, flush=True)
        step += 1
""")


# Guards crash consistency from Python: kill -9 of a saving process leaves the last committed
# checkpoint loadable and exact.
def test_kill_nine_leaves_previous_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(PYTHON_DIR))
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env,
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"1"  # at least one commit
        time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    v = CheckpointVault(str(tmp_path))
    step = v.latest()
    state = v.load(step)
    g = torch.Generator().manual_seed(step)
    assert state["step"] == step
    assert torch.equal(state["w"], torch.randn(1 << 18, generator=g))
    v.gc()
    v.verify(step)
    v.close()


# Guards lifecycle from Python: retention, merge and export keep the latest state exact.
def test_retention_merge_export(tmp_path):
    state = {"a": torch.randn(2048), "b": torch.arange(100)}
    with CheckpointVault(str(tmp_path), chunk_bytes=4096, keep_last=2, compress=True) as v:
        for s in range(1, 6):
            state["a"][s] += 1
            v.save(s, state)
        v.wait()
        assert v.steps() == [4, 5]
        v.merge(5)
        _assert_same(state, v.load(5))
        out = tmp_path / "x.safetensors"
        v.export_safetensors(5, str(out))
        assert out.stat().st_size > 8 + 2048 * 4 + 800


# Guards the device path: CUDA tensors (GPU hash + pinned staging) round-trip back onto the GPU.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_round_trip(tmp_path):
    state = {"w": torch.randn(3, 1_000_003, device="cuda"), "b": torch.randn(7, device="cuda").half()}
    with CheckpointVault(str(tmp_path), chunk_bytes=1 << 20) as v:
        v.save(1, state)
        state["w"][1].add_(1)
        v.save(2, state)
        v.wait()
        assert v.stats()["chunks_written"] <= 6
        out = v.load(2)
    assert out["w"].is_cuda
    _assert_same({k: t.cpu() for k, t in state.items()}, {k: t.cpu() for k, t in out.items()})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_save_orders_after_current_stream_and_is_complete_on_return(tmp_path):
    # Guards the async device snapshot: save() inside a side-stream context sees the work queued
    # on that stream without a host sync, and overwriting right after save() does not leak in.
    side = torch.cuda.Stream()
    src = torch.randn(64, 1 << 20, device="cuda")
    w = torch.zeros_like(src)
    v = CheckpointVault(str(tmp_path / "v"), chunk_bytes=1 << 20)
    side.wait_stream(torch.cuda.current_stream())  # src and w were made on the default stream
    with torch.cuda.stream(side):
        for _ in range(4):
            w.copy_(src)
        w.mul_(2.0)
        v.save(1, {"w": w})
        w.fill_(-1.0)
    side.synchronize()
    expected = src * 2.0
    out = v.load(1)
    assert torch.equal(out["w"], expected)
    v.close()


# Guards device staging from Python: save() returns after queuing a device copy; the current
# stream's next kernels (an in-place overwrite) wait for it, so the checkpoint holds the values
# from before; the second save recycles the arena and writes only the changed tensor's chunks.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_device_staging_overwrite_right_after_save(tmp_path):
    g = torch.Generator(device="cuda").manual_seed(5)
    state = {f"w{i}": torch.randn(1 << 20, generator=g, device="cuda") for i in range(6)}
    a = torch.randn(4096, 4096, device="cuda")
    with CheckpointVault(str(tmp_path), chunk_bytes=1 << 20, device_staging="on") as v:
        expected = {k: (t * 2.0).cpu() for k, t in state.items()}
        for _ in range(20):  # keep the current stream busy so the copy is still queued
            a = a @ a / 64.0
        for t in state.values():
            t.mul_(2.0)  # queued behind the busy work; the snapshot must see it
        v.save(1, state)
        for t in state.values():
            t.fill_(-1.0)  # same stream, right after save()
        first = v.stats()
        assert first["snapshot_path"] == "device", first
        v.wait()
        _assert_same(expected, {k: t.cpu() for k, t in v.load(1).items()})
        for k in state:
            state[k].copy_(expected[k].cuda())
        state["w3"][7] += 1.0
        v.save(2, state)
        v.wait()
        second = v.stats()
        assert second["snapshot_path"] == "device"
        assert second["staging_allocated"] == 0
        assert second["chunks_written"] == 1 and second["bytes_d2h"] == 1 << 20
        out = v.load(2)
    assert out["w3"].is_cuda
    _assert_same({k: t.cpu() for k, t in state.items()}, {k: t.cpu() for k, t in out.items()})


# Guards the fallback from Python: above device_staging_max_bytes the snapshot is staged on the
# host and stats() says why.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_device_staging_cap_falls_back_to_host(tmp_path):
    state = {"w": torch.randn(1 << 20, device="cuda")}
    with CheckpointVault(str(tmp_path), chunk_bytes=1 << 20, device_staging_max_bytes=1 << 16) as v:
        v.save(1, state)
        st = v.stats()
        assert st["snapshot_path"] == "host" and "device_staging_max_bytes" in st["snapshot_reason"]
        _assert_same({"w": state["w"].cpu()}, {"w": v.load(1)["w"].cpu()})


# Guards option validation: a bad device_staging value is a ValueError naming the choices.
def test_device_staging_option_is_validated(tmp_path):
    with pytest.raises(ValueError, match="'auto' or 'on' or 'off', got 'sometimes'"):
        CheckpointVault(str(tmp_path), device_staging="sometimes")


# Guards the parallel load path from Python: io_threads=4 restores many chunks into torch.empty
# tensors exactly, and save() after load keeps only changed chunks.
def test_parallel_io_threads_round_trip_and_stats(tmp_path):
    g = torch.Generator().manual_seed(3)
    state = {f"t{i}": torch.randn(70_001 + i, generator=g) for i in range(6)}
    with CheckpointVault(str(tmp_path), chunk_bytes=8192, io_threads=4) as v:
        v.save(1, state)
        first = v.stats()
        assert first["staging_allocated"] > 0 and first["bytes_copied"] == first["bytes_total"]
        state["t2"][5] += 1.0
        v.save(2, state)
        second = v.stats()
        assert second["staging_allocated"] == 0 and second["bytes_copied"] == 8192
        _assert_same(state, v.load(2))


# Guards step validation: 1.7 was silently saved as 1 and -1 gave a confusing message; numpy and
# torch integers are steps too.
def test_step_must_be_a_nonnegative_integer(tmp_path):
    import numpy as np
    v = CheckpointVault(str(tmp_path / "v"))
    state = {"w": torch.arange(10, dtype=torch.float32)}
    with pytest.raises(TypeError, match="integer"):
        v.save(1.7, state)
    with pytest.raises(ValueError, match=r"must be >= 0, got -1"):
        v.save(-1, state)
    with pytest.raises(TypeError):
        v.save(True, state)
    v.save(np.int64(3), state)
    v.save(torch.tensor(5), state)
    v.save(10 ** 12 + 1, state)
    assert v.steps() == [3, 5, 10 ** 12 + 1]
    assert v.latest() == 10 ** 12 + 1
    _assert_same(v.load(np.int32(5)), state)
    with pytest.raises(TypeError):
        v.load(5.0)
    v.close()


# Guards resume against one damaged manifest: load() falls back to the newest good checkpoint and
# the log names the skipped file; load(step) of the damaged one is DataLossError naming the file.
def test_damaged_newest_manifest_falls_back_with_warning(tmp_path, capfd):
    d = str(tmp_path / "v")
    v = CheckpointVault(d)
    v.save(1, {"w": torch.ones(4)})
    v.save(2, {"w": torch.full((4,), 2.0)})
    v.close()
    bad = os.path.join(d, "manifests", "ckpt-000000000002.manifest")
    with open(bad, "r+b") as f:
        f.truncate(20)
    v = CheckpointVault(d)
    capfd.readouterr()
    state = v.load()
    _assert_same(state, {"w": torch.ones(4)})
    err = capfd.readouterr().err
    assert "ckpt-000000000002.manifest" in err and "skipping checkpoint 2" in err, err
    with pytest.raises(_C.DataLossError, match="ckpt-000000000002.manifest"):
        v.load(2)
    assert v.steps() == [1, 2]
    v.close()


# Guards --ckpt-when-busy skip: try_save while the previous save is still being written returns
# False without waiting or queuing, the newest committed checkpoint stays loadable and exact, and
# every committed save reports its bytes and durable time.
def test_try_save_skips_while_writer_busy_and_keeps_last_commit(tmp_path):
    v = CheckpointVault(str(tmp_path), chunk_bytes=1 << 20, fsync=True)
    queued, skipped = [], []
    step = 0
    for _ in range(20):  # a round skips when the writer is still busy right after a save
        step += 1
        g = torch.Generator().manual_seed(step)
        state = {"w": torch.randn(4 << 20, generator=g), "step": step}  # 16 MB, fsync'ed
        assert v.try_save(step, state)
        queued.append(step)
        step += 1
        if v.try_save(step, {"w": torch.zeros(4 << 20), "step": step}):
            queued.append(step)
        else:
            skipped.append(step)
            assert v.busy()
            break
        v.wait()
    assert skipped, "the writer never was busy right after a 16 MB save"
    v.wait()
    assert not v.busy()
    assert v.steps() == queued and v.latest() == queued[-1]
    g = torch.Generator().manual_seed(queued[-1])
    got = v.load()
    assert got["step"] == queued[-1] and torch.equal(got["w"], torch.randn(4 << 20, generator=g))
    done = v.committed_stats()
    assert [s["step"] for s in done] == queued
    assert all(s["bytes_written"] > 0 and s["durable_s"] >= s["write_s"] > 0 for s in done)
    assert v.committed_stats() == []  # taken once
    assert v.try_save(skipped[0], {"step": skipped[0]})  # a skipped step may be saved later
    v.close()


# Guards trainer checkpoints on the slow path: the trainer's Checkpointer saves a CUDA
# model plus AdamW state larger than one staging buffer (d2h_buffer_bytes, 64 MiB) through device
# staging, and the saved state restores exactly.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_trainer_checkpoint_takes_device_staging(tmp_path):
    if not _C.build_info().get("cuda", False):
        pytest.skip("loongforge built without CUDA")
    from loongforge.trainer.checkpoint import Checkpointer
    from loongforge.trainer.dist import Dist

    dev = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 4096, device=dev)).sum().backward()
    opt.step()
    ck = Checkpointer("vault", str(tmp_path / "ck"), Dist(device=dev), {"mode": "test"},
                      when_busy="wait")
    state = {"step": 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
             "loader": {"pos": 1}, "rng": {"torch": torch.get_rng_state()}}
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    assert nbytes > 64 << 20
    ck.save(1, state, model, opt)
    st = ck.vault.stats()
    assert st["snapshot_path"] == "device", st["snapshot_reason"]
    want = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    got = ck.latest()  # waits for the commit
    ck.close()
    fig = ck.figures()
    assert fig["ckpt_saves_committed"] == 1 and fig["ckpt_snapshot_path"] == "device"
    # bytes_written is after compression (Adam's moments after one step compress): the raw size
    # of what the snapshot copied on the device covers the whole state instead.
    assert st["bytes_total"] >= nbytes and st["bytes_copied"] >= nbytes, st
    assert 0 < fig["ckpt_per_save"][0]["bytes_written"] <= st["bytes_total"] + (1 << 20)
    assert got["step"] == 1
    for k, t in want.items():
        assert torch.equal(got["model"][k].cpu(), t), k


# Guards the data-only structure: every kind of value it holds comes back with its type (int
# keys of optimizer state, inf/nan, bytes, numpy arrays, tuples, OrderedDict).
def test_structure_round_trips_data_values(tmp_path):
    import math
    from collections import OrderedDict

    import numpy as np

    state = {"od": OrderedDict([("b", 1), ("a", 2)]), 3: {"x": (1, 2.5, "s", None, True)},
             "inf": float("inf"), "ninf": -math.inf, "big": 2**70, "bytes": b"\x00\xff",
             "np": np.arange(6, dtype=np.uint32).reshape(2, 3), "np0": np.float64(1.5),
             "rng": np.random.RandomState(3).get_state(), "nan": float("nan")}
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        v.save(1, state)
        out = v.load(1)
    assert math.isnan(out.pop("nan")) and math.isnan(state.pop("nan"))
    assert type(out["od"]) is OrderedDict and list(out["od"]) == ["b", "a"]
    assert out[3] == {"x": (1, 2.5, "s", None, True)}
    assert out["big"] == 2**70 and out["inf"] == math.inf and out["ninf"] == -math.inf
    assert out["bytes"] == b"\x00\xff" and out["np0"] == 1.5
    assert out["np"].dtype == np.uint32 and (out["np"] == state["np"]).all()
    rs = np.random.RandomState()
    rs.set_state(out["rng"])
    assert (rs.randint(0, 1000, 5) == np.random.RandomState(3).randint(0, 1000, 5)).all()


# Guards: a value the format cannot hold is refused by save() (not at load), naming its key path
# and type; nothing is written.
def test_save_refuses_non_data_values_naming_path(tmp_path):
    class Thing:
        pass

    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        with pytest.raises(TypeError, match=r"checkpoint state extras/1/obj: a .*Thing cannot"):
            v.save(1, {"w": torch.zeros(2), "extras": [0, {"obj": Thing()}]})
        with pytest.raises(TypeError, match=r"extras: key \(1, 2\) is a tuple"):
            v.save(1, {"extras": {(1, 2): 3}})
        with pytest.raises(TypeError, match=r"<root>: a builtins.set"):
            v.save(1, {1, 2})
        assert v.latest() is None


# Guards storage sharing: entries that share a storage (the same tensor twice, a view of it)
# come back sharing one storage, with their own shapes and values.
def test_aliased_tensors_come_back_sharing_storage(tmp_path):
    w = torch.arange(12, dtype=torch.float32)
    state = {"a": w, "b": w, "v": w.view(3, 4)[1:, ::2], "other": torch.ones(3)}
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        v.save(1, state)
        out = v.load(1)
    _assert_same(state, out)
    ptr = out["a"].storage().data_ptr()
    assert out["b"].storage().data_ptr() == ptr and out["v"].storage().data_ptr() == ptr
    out["a"][5] = -1.0
    assert out["b"][5] == -1.0 and out["v"][0, 0] == 4.0 and out["v"][0, 1] == 6.0
    out["a"][4] = -2.0
    assert out["v"][0, 0] == -2.0
    assert out["other"].storage().data_ptr() != ptr
    # Views in another dtype (parameters of several dtypes packed into one arena) come back
    # with their values, each in a storage of its own.
    with CheckpointVault(str(tmp_path / "d"), chunk_bytes=4096) as v:
        v.save(1, {"a": w, "b": w.view(torch.int32)})
        v.wait()
        back = v.load(1)
    assert torch.equal(back["a"], w) and torch.equal(back["b"], w.view(torch.int32))


# Guards the step and chunk-size bounds: a step beyond int64 and a chunk size outside 4 KiB..1 GiB
# are refused with a short message (no tensor dump), before anything is written.
def test_step_and_chunk_bytes_bounds(tmp_path):
    with CheckpointVault(str(tmp_path / "a"), chunk_bytes=4096) as v:
        with pytest.raises(ValueError, match=r"^checkpoint step must be <= 2\*\*63-1, got "
                                             r"9223372036854775808$"):
            v.save(2**63, {"a": torch.ones(2)})
        with pytest.raises(ValueError, match=r"^checkpoint step must be >= 0, got -1$"):
            v.save(-1, {"a": torch.ones(2)})
        v.save(2**63 - 1, {"a": torch.ones(2)})
        assert v.latest() == 2**63 - 1
    for bad in (2**40, 0, -4096, 4095, (1 << 30) + 64):
        with pytest.raises(ValueError, match=r"vault .*/b: chunk_bytes must be in \[4096, "
                                             r"1073741824\] and a multiple of 64"):
            CheckpointVault(str(tmp_path / "b"), chunk_bytes=bad)
    with pytest.raises(ValueError, match=r"option 'chunk_bytes' cannot take a float"):
        CheckpointVault(str(tmp_path / "b"), chunk_bytes=4096.0)
    assert not os.path.exists(tmp_path / "b")


# Guards Note [Option tables] for the vault: every VaultOptions field is settable from Python
# with the C++ default, an unknown name lists the known ones, and a set option reaches the writer
# (a higher zstd level stores compressible chunks in fewer bytes).
def test_vault_options_come_from_one_table(tmp_path):
    opts = CheckpointVault.options()
    assert opts["chunk_bytes"] == 4 << 20 and opts["compress"] is False
    assert opts["compress_level"] == 1 and opts["writer"] == "auto"
    assert {"compress_max_ratio", "wait_timeout_ms", "keep_last", "device_staging"} <= set(opts)
    with pytest.raises(ValueError, match=r"unknown option 'chunk_byte' \(known: chunk_bytes, "):
        CheckpointVault(str(tmp_path / "x"), chunk_byte=4096)
    with pytest.raises(ValueError, match=r"compress_level must be in \[1, 22\]"):
        CheckpointVault(str(tmp_path / "x"), compress_level=0)
    g = torch.Generator().manual_seed(0)
    state = {"w": (torch.randn(1 << 20, generator=g) * 4).round().to(torch.int16)}
    stored = {}
    for level in (1, 19):
        d = tmp_path / f"z{level}"
        with CheckpointVault(str(d), compress=True, compress_level=level) as v:
            v.save(1, state)
            v.wait()
            _assert_same(state, v.load(1))
        stored[level] = sum(f.stat().st_size for f in (d / "segments").iterdir())
    assert stored[19] < stored[1], stored


def _train_args(train_db, ck, mode, steps):
    from lf_testdb import TINY_TRAIN_ARGS

    return list(TINY_TRAIN_ARGS) + ["--data", train_db, "--mode", mode, "--steps", str(steps),
                                    "--ckpt-every", "2", "--ckpt-dir", str(ck)]


def _modes():
    from lf_testdb import has_datafusion

    return ["baseline", "loongforge"] if has_datafusion() else ["baseline"]


def _tree(d):
    return sorted((os.path.relpath(p, d), os.path.getsize(p))
                  for p in glob.glob(os.path.join(str(d), "**"), recursive=True)
                  if os.path.isfile(p))


# Guards: a new run (no --resume) into the --ckpt-dir of a finished run trained until its first
# save and then failed ("step 2 is not greater than the last step 20"); now it stops before
# training with one line, and the directory is untouched. No rank_state/ files are written: the
# rank state is inside each checkpoint.
@pytest.mark.parametrize("mode", ["baseline", "loongforge"])
def test_new_run_into_finished_runs_dir_is_refused(train_db, tmp_path, capsys, mode):
    if mode not in _modes():
        pytest.skip("loongforge.data not in this build")
    from loongforge import train

    ck = tmp_path / "ck"
    assert train.main(_train_args(train_db, ck, mode, 4)) == 0
    capsys.readouterr()
    before = _tree(ck)
    assert not any(p.startswith("rank_state") for p, _ in before)
    assert train.main(_train_args(train_db, ck, mode, 4)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"loongforge train: error: --ckpt-dir {ck} already holds checkpoints of a run: "
                   "pass --resume to continue it, or pick another --ckpt-dir"], err
    assert _tree(ck) == before
    assert train.main(_train_args(train_db, ck, mode, 6) + ["--resume"]) == 0
    assert f"resumed from step 4 of {ck}" in capsys.readouterr().err


# Guards: --resume with a garbage rank-state file (a checkpoint of the layout that kept it
# beside the step file) gave an UnpicklingError traceback; now exit 2, one line naming the file.
def test_resume_with_garbage_old_rank_state_names_file(train_db, tmp_path, capsys):
    from loongforge import train

    ck = tmp_path / "ck"
    assert train.main(_train_args(train_db, ck, "baseline", 2)) == 0
    step_file = ck / "step_00000002.pt"
    st = read_state_file(str(step_file))
    st.pop("__rank_state__")
    write_state_file(st, str(step_file))
    os.makedirs(ck / "rank_state")
    rank_file = ck / "rank_state" / "rank00000_step_00000002.pt"
    rank_file.write_bytes(b"not a pickle\n")
    capsys.readouterr()
    assert train.main(_train_args(train_db, ck, "baseline", 4) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(rank_file) in err[0] and "Traceback" not in err[0], err


# Guards one atomic checkpoint per step: the trainer is killed (SIGKILL) at random points while
# it saves every step; each time the newest checkpoint on disk is complete (shared state and
# this rank's state) and a resume from it trains on.
@pytest.mark.parametrize("mode", ["baseline", "loongforge"])
def test_kill_nine_at_random_points_leaves_resumable_checkpoint(train_db, tmp_path, mode):
    if mode not in _modes():
        pytest.skip("loongforge.data not in this build")
    import random

    from lf_testdb import TINY_TRAIN_ARGS
    from loongforge.trainer.checkpoint import Checkpointer
    from loongforge.trainer.dist import Dist

    env = dict(os.environ, PYTHONPATH=os.path.abspath(PYTHON_DIR))
    rnd = random.Random(7)
    for run in range(3):
        ck = tmp_path / f"ck{run}"
        args = [a for a in TINY_TRAIN_ARGS if a != "--quiet"] + [
            "--data", train_db, "--mode", mode, "--ckpt-every", "1", "--ckpt-dir", str(ck)]
        p = subprocess.Popen([sys.executable, "-m", "loongforge.train"] + args +
                             ["--steps", "400"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300  # a bound on a hung child, not a timing assertion
            while not (glob.glob(str(ck / "step_*.pt")) or
                       glob.glob(str(ck / "vault" / "manifests" / "*.manifest"))):
                assert p.poll() is None, "the trainer exited before its first checkpoint"
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(rnd.uniform(0.0, 1.5))  # somewhere in a later step or save
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        with open(ck / "run.json") as fh:
            run_id = json.load(fh)
        c = Checkpointer(run_id.pop("checkpoint"), str(ck), Dist(), run_id, resume=True)
        st = c.latest()
        c.close()
        assert st is not None and st["step"] >= 1
        assert {"model", "optimizer", "scheduler", "loader", "rng"} <= set(st), sorted(st)
        if run == 2:
            out = str(tmp_path / "resumed.json")
            r = subprocess.run([sys.executable, "-m", "loongforge.train"] + args +
                               ["--steps", str(st["step"] + 1), "--resume", "--json-out", out],
                               env=env, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr[-2000:]
            with open(out) as fh:
                assert [x["step"] for x in json.load(fh)["loss_curve"]] == [st["step"] + 1]
