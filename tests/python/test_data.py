"""DataFusionLoader from Python: tensors through DLPack, determinism, resume, errors."""
import os
import struct
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import loongforge  # noqa: E402
from lf_testdata import make_db  # noqa: E402


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return make_db(str(tmp_path_factory.mktemp("data") / "db"))


@pytest.fixture(scope="module")
def bad_db(tmp_path_factory):
    return make_db(str(tmp_path_factory.mktemp("bad") / "db"), corrupt=[5])


def _loader(db, **kw):
    kw.setdefault("image_size", 32)
    kw.setdefault("threads", 2)
    return loongforge.DataFusionLoader(db, 4, seed=3, **kw)


# Guards the tensor contract the trainer relies on (keys, dtypes, shapes).
def test_batch_dict_types_and_shapes(db):
    ld = _loader(db)
    assert len(ld) == 6
    b = next(iter(ld))
    assert b["images"].shape == (4, 2, 3, 32, 32) and b["images"].dtype == torch.float32
    assert b["tokens"].dtype == torch.int64 and b["attention_mask"].dtype == torch.bool
    assert b["tokens"].shape == b["attention_mask"].shape
    assert b["state"].shape == (4, 6)
    assert b["action"].shape == (4, 3, 4)
    assert b["action_mask"].shape == (4, 3) and b["action_mask"].dtype == torch.bool
    assert b["sample_index"].shape == (4,)
    # Padding is zero exactly where the mask is off.
    assert torch.all((b["tokens"] != 0) == b["attention_mask"])
    assert b["images"].abs().max() <= 1.0001 and b["images"].std() > 0.05


# Guards zero-copy delivery: tensors must stay valid after the loader moves on and is destroyed.
def test_tensors_outlive_iteration(db):
    kept = []
    ld = _loader(db)
    for b in ld:
        kept.append((b["sample_index"], b["images"]))
    first = kept[0][1].clone()
    del ld
    assert torch.equal(first, kept[0][1])
    idx = torch.cat([k[0] for k in kept])
    assert len(set(idx.tolist())) == 24


# Guards determinism and epochs: same seed/epoch -> same order; next epoch differs.
def test_deterministic_and_epochs(db):
    a = [b["sample_index"].tolist() for b in _loader(db)]
    b = [x["sample_index"].tolist() for x in _loader(db, threads=1)]
    assert a == b
    ld = _loader(db)
    e0 = [x["sample_index"].tolist() for x in ld]
    e1 = [x["sample_index"].tolist() for x in ld]  # iteration advances the epoch
    assert e0 == a and e1 != e0


# Guards exact resume from state_dict in the middle of an epoch.
def test_state_dict_resume(db):
    full = [b["sample_index"].tolist() for b in _loader(db)]
    ld = _loader(db)
    it = iter(ld)
    for _ in range(2):
        next(it)
    state = ld.state_dict()
    assert state["next_batch"] == 2
    ld2 = _loader(db)
    ld2.load_state_dict(state)
    rest = [b["sample_index"].tolist() for b in ld2]
    assert rest == full[2:]
    with pytest.raises(ValueError):
        loongforge.DataFusionLoader(db, 4, seed=99).load_state_dict(state)


# Guards the error model: C++ statuses arrive as the right Python exceptions, naming the record.
def test_errors(db, bad_db, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        loongforge.DataFusionLoader(str(tmp_path / "nope"), 4)
    with pytest.raises(ValueError):
        loongforge.DataFusionLoader(db, 0)
    with pytest.raises(ValueError, match="on_corrupt"):
        _loader(db, on_corrupt="ignore")
    ld = _loader(bad_db, on_corrupt="error", shuffle=False)
    with pytest.raises(loongforge.DataLossError, match="00000005_cam_cam"):
        for _ in ld:
            pass
    ld = _loader(bad_db, shuffle=False)
    seen = [i for b in ld for i in b["sample_index"].tolist()]
    assert 5 not in seen and len(seen) == 23 and ld.corrupt_skipped == 1


def test_metrics_and_build_info(db):
    ld = _loader(db)
    for _ in ld:
        pass
    ld.close()  # quiesce the next epoch's prefetch so the counters hold still
    m = ld.metrics()
    # 48 images in the epoch, plus what the pipeline already prefetched of the next one.
    assert m["counters"]["images_decoded"] >= 48
    assert m["histograms"]["decode_ms"]["count"] == m["counters"]["images_decoded"]
    assert m["histograms"]["batch_latency_ms"]["p50"] > 0
    info = loongforge.build_info()
    assert {"version", "git_hash", "cuda", "nvjpeg", "cufile", "nccl"} <= set(info)


# Guards equivalence with the PIL/torchvision baseline: same records, same normalization, and
# images within a small tolerance of an independent decoder + antialiased resize (centre crop).
def test_matches_pil_torchvision_baseline(db):
    from loongforge.trainer_data import LmdbFrameDataset
    ds = LmdbFrameDataset(db, image_size=48, train=False)
    ld = _loader(db, train=False, shuffle=False, image_size=48)
    b = next(iter(ld))
    for row, idx in enumerate(b["sample_index"].tolist()):
        ref = ds[idx]
        assert torch.allclose(b["state"][row], ref["state"], atol=1e-5)
        assert torch.allclose(b["action"][row], ref["action"], atol=1e-5)
        assert torch.equal(b["action_mask"][row], ref["action_mask"])
        n = len(ref["tokens"])
        assert b["tokens"][row, :n].tolist() == ref["tokens"].tolist()
        mae = (b["images"][row] - ref["images"]).abs().mean().item()
        assert mae < 0.05, f"sample {idx}: mean abs diff {mae:.4f} vs PIL"


# Guards static batches from Python: every batch has batch_size rows and a tokens length from
# the bucket set (the smallest that fits), .bucket/.shape_key agree with the tensors and with
# shape_keys, masks cover exactly each sample's (i % 5) + 2 tokens, and the dict holds tensors only.
def test_token_buckets_shapes_and_masks(db):
    ld = loongforge.DataFusionLoader(db, 2, seed=3, image_size=32, threads=2,
                                     token_buckets=[6, 3], shuffle=False)
    assert ld.token_buckets == [3, 6]
    assert ld.shape_keys == [(2, 2, 3, 3), (2, 2, 6, 3)]
    seen = set()
    for b in ld:
        assert all(isinstance(v, torch.Tensor) for v in b.values())
        rows, length = b["tokens"].shape
        assert rows == 2 and b.size == 2 and length == ld.token_buckets[b.bucket]
        assert b.shape_key == (rows, 2, length, 3) and b.shape_key in ld.shape_keys
        lens = torch.tensor([(i % 5) + 2 for i in b["sample_index"].tolist()])
        assert length >= lens.max() and (b.bucket == 0 or ld.token_buckets[b.bucket - 1] < lens.max())
        want = torch.arange(length)[None, :] < lens[:, None]
        assert torch.equal(b["attention_mask"], want)
        assert torch.equal(b["tokens"] != 0, want)
        seen.add(b.bucket)
    assert seen == {0, 1}
    # Without buckets the batch still says where it is, with bucket -1.
    b = next(iter(_loader(db)))
    assert b.bucket == -1 and b.shape_key[0] == 4


# Guards the too-long contract in Python: an instruction longer than the largest bucket raises
# ValueError naming the record (skip policy or not); truncate_tokens cuts it; buckets shorter than
# the schema's max_tokens are refused at construction.
def test_token_buckets_too_long(tmp_path):
    from loongforge import _C, _synth
    path = str(tmp_path / "long")
    w = _C.RecordWriter(path, True)
    frame = _synth.jpeg(_synth.frame(64, 48, 1), 90)
    for i in range(8):
        w.put(f"{i:08d}_cam_cam0", frame)
        _synth.write_arrays(w, i, 6, 4, 3)
    # 10 valid ids (byte-v1); the schema says at most 6
    w.put("00000005_tokens", struct.pack("<10i", *range(3, 13)))
    _synth.commit_schema(w, 8, ["cam0"], 64, 48, 6, 4, 3, "test_token_buckets_too_long")
    ld = loongforge.DataFusionLoader(path, 4, image_size=16, token_buckets=[4, 6], shuffle=False)
    with pytest.raises(ValueError, match="00000005_tokens"):
        for _ in ld:
            pass
    ld = loongforge.DataFusionLoader(path, 4, image_size=16, token_buckets=[4, 6], shuffle=False,
                                     truncate_tokens=True)
    batches = list(ld)
    assert [tuple(b["tokens"].shape) for b in batches] == [(4, 6), (4, 6)]
    assert batches[1]["attention_mask"][1].all()  # sample 5, cut to 6
    with pytest.raises(ValueError, match="truncate_tokens"):
        loongforge.DataFusionLoader(path, 4, token_buckets=[4, 5])


# Guards "options declared once" (Note [Loader options] in python/bindings/bind_data.cc): the
# Python defaults are the C++ struct's, an unknown option is refused naming it (in the adapter and
# in the binding), a bad value names the option, and the GPU tuning options (formerly
# LOONGFORGE_LOADER_* environment variables) are accepted and checked on every build.
def test_options_declared_once(db):
    from loongforge import _C
    from loongforge.data import loader_options
    opts = loader_options()
    assert opts["batch_size"] == 32 and opts["threads"] == 2 and opts["prefetch"] == 4
    assert opts["on_corrupt"] == "skip" and opts["device"] == "cpu" and opts["prefault"] == "touch"
    assert opts["decode_lanes"] == 2 and opts["decode_stagger"] == 1.0 and opts["async_decode"]
    assert opts["mean"] == [0.5, 0.5, 0.5] and opts["token_buckets"] == []
    with pytest.raises(TypeError, match="'no_such_option'"):
        _loader(db, no_such_option=1)
    with pytest.raises(ValueError, match="'no_such_option'"):
        _C.DataLoader(db, no_such_option=1)
    with pytest.raises(TypeError, match="timeout_s"):
        _loader(db, timeout_ms=5)
    with pytest.raises(ValueError, match="'threads'"):
        _loader(db, threads="two")
    with pytest.raises(ValueError, match="decode_lanes"):
        _loader(db, decode_lanes=1)
    with pytest.raises(ValueError, match="prefault"):
        _loader(db, prefault="sometimes")
    ld = _loader(db, decode_lanes=3, decode_stagger=0.5, prefault="populate", async_decode=False)
    assert len(next(iter(ld))["sample_index"]) == 4
    ld.close()


# Guards the one bucket rule: the step runner's padding (graphs.pad_to_bucket) picks the bucket
# the loader would (smallest >= length), through the loader's own function.
def test_token_bucket_rule_is_the_loaders():
    from loongforge import _C
    assert _C.sort_token_buckets([64, 16, 32, 16]) == [16, 32, 64]
    with pytest.raises(ValueError, match="positive"):
        _C.sort_token_buckets([8, 0])
    assert [_C.token_bucket_for([16, 32, 64], n) for n in (1, 16, 17, 64, 65)] == [0, 0, 1, 2, -1]


# Guards the loader's dtype and stream through the one converter (no Python dtype table): torch
# dtypes and names are accepted, other dtypes are refused by the C++ check naming the option, and
# the consumer stream takes a torch stream, an int handle or None, nothing else.
def test_image_dtype_and_stream_through_the_converter(db):
    from loongforge import _C
    assert _C.loader_options()["dtype"] == "float32"
    assert _C.loader_image_dtype(torch.bfloat16) == "bfloat16"
    assert _C.loader_image_dtype("bf16") == "bfloat16"
    assert _loader(db, dtype="bfloat16").dtype == torch.bfloat16
    b = next(iter(_loader(db, dtype=torch.bfloat16)))
    assert b["images"].dtype == torch.bfloat16 and b["tokens"].dtype == torch.int64
    with pytest.raises(ValueError, match="option 'dtype' must be float32, bfloat16 or uint8 .*, got int64"):
        _loader(db, dtype=torch.int64)
    with pytest.raises(ValueError, match="option 'dtype': unknown dtype 'f8'"):
        _loader(db, dtype="f8")
    with pytest.raises(ValueError, match="option 'dtype' must be a torch.dtype or a dtype name"):
        _loader(db, dtype=3)
    with pytest.raises(ValueError, match="option 'dtype' must be float32, bfloat16 or uint8 .*, got float16"):
        _C.DataLoader(db, dtype=torch.float16)
    # The CPU loader writes float32 or uint8; bfloat16 is the GPU loader's (or the adapter's cast).
    with pytest.raises(ValueError, match="need device=cuda"):
        _C.DataLoader(db, dtype="bf16")
    impl = _C.DataLoader(db, batch_size=4)
    impl.set_consumer_stream(None)
    impl.set_consumer_stream(0)
    with pytest.raises(ValueError, match="must be a torch.cuda.Stream, an int cudaStream_t or None"):
        impl.set_consumer_stream("stream")
    with pytest.raises(ValueError, match="must be a torch.cuda.Stream"):
        impl.set_consumer_stream(1.5)


# Guards RecordWriter.commit's error path: the error of a failed Commit is raised once the GIL is
# held again (it was raised with the GIL released), as the RuntimeError naming the misuse.
def test_record_writer_second_commit_raises(tmp_path):
    from loongforge import _C, _synth
    path = str(tmp_path / "twice")
    w = _C.RecordWriter(path, True)
    w.put("00000000_cam_cam0", _synth.jpeg(_synth.frame(64, 48, 1), 90))
    _synth.write_arrays(w, 0, 6, 4, 3)
    _synth.commit_schema(w, 1, ["cam0"], 64, 48, 6, 4, 3, "test_record_writer_second_commit")
    schema_json = _C.RecordReader(path).schema_json
    with pytest.raises(RuntimeError, match="after Commit"):
        w.commit(schema_json)


# Guards the loader API bounds: threads far past any machine (100000 aborted the process with
# "terminate called without an active exception"), a timeout that is no wait bound, a negative
# seed, and a negative corrupt limit are ValueError naming the option.
def test_option_bounds(db):
    with pytest.raises(ValueError, match="'threads' must be in 1..256.*got 100000"):
        _loader(db, threads=100000)
    for t in (-1, 0, float("nan")):
        with pytest.raises(ValueError, match="timeout_s must be a positive"):
            _loader(db, timeout_s=t)
    with pytest.raises(ValueError, match="'seed' must be in 0..18446744073709551615, got -1"):
        loongforge.DataFusionLoader(db, 4, seed=-1)
    with pytest.raises(ValueError, match="max_consecutive_corrupt"):
        _loader(db, max_consecutive_corrupt=-1)


# Guards: iterating a closed loader raises instead of silently restarting it.
def test_iterate_after_close_raises(db):
    ld = _loader(db, threads=1)
    next(iter(ld))
    ld.close()
    with pytest.raises(RuntimeError, match="was closed"):
        next(iter(ld))


def _fork_child(ld, q):
    try:
        q.put("N %d" % sum(1 for _ in ld))
    except Exception as e:  # the error is the expected outcome; the parent checks its text
        q.put("ERR " + str(e))


# Guards: a loader used in a fork child (multiprocessing's default start method) raises there,
# naming the cause, instead of hanging on threads fork did not copy (the child hung 60 s).
def test_fork_child_raises(db):
    import multiprocessing as mp
    ld = _loader(db, threads=1)
    next(iter(ld))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_fork_child, args=(ld, q))
    p.start()
    p.join(30)
    if p.exitcode is None:
        p.kill()
        p.join()
    assert p.exitcode == 0
    msg = q.get(timeout=5)
    assert msg.startswith("ERR") and "fork" in msg and "create a new loader" in msg, msg
    assert len(next(iter(ld))["sample_index"]) == 4  # the parent's loader still works


# Guards: under on_corrupt='skip' a DB whose every sample is corrupt stops the loader with
# DataLoss naming the last record once max_consecutive_corrupt samples in a row failed (the
# trainer skipped forever); isolated corrupt samples are still skipped.
def test_consecutive_corrupt_limit(tmp_path, bad_db):
    allbad = make_db(str(tmp_path / "allbad"), corrupt=range(24))
    ld = _loader(allbad, shuffle=False, max_consecutive_corrupt=10)
    with pytest.raises(loongforge.DataLossError,
                       match=r"10 corrupt samples in a row.*the last sample 9: .*'00000009_cam"):
        for _ in ld:
            pass
    # Across epochs too: 24 per epoch, a limit of 30 is reached in the second.
    ld = _loader(allbad, shuffle=False, max_consecutive_corrupt=30)
    assert sum(b.size for b in ld) == 0
    with pytest.raises(loongforge.DataLossError, match="30 corrupt samples in a row"):
        for _ in ld:
            pass
    ld = _loader(bad_db, shuffle=False, max_consecutive_corrupt=1)
    with pytest.raises(loongforge.DataLossError, match="1 corrupt samples in a row"):
        for _ in ld:
            pass
    assert sum(b.size for b in _loader(bad_db, shuffle=False)) == 23


# Guards: a per-sample meta record of the wrong size (4 bytes, not int32[2]) is corrupt data
# (accepted before), skipped or raised by the policy, naming the record.
def test_short_meta_record(tmp_path):
    from loongforge import _C, _synth
    import io
    import numpy as np
    from PIL import Image
    path = str(tmp_path / "me")
    w = _C.RecordWriter(path, overwrite=True)
    buf = io.BytesIO()
    Image.fromarray(np.full((24, 32, 3), 120, np.uint8)).save(buf, "JPEG")
    for i in range(8):
        w.put(f"{i:08d}_cam_c", buf.getvalue())
        _synth.write_arrays(w, i, 6, 4, 3)
        if i == 2:
            w.put(f"{i:08d}_meta", b"\0\0\0\0")
    _synth.commit_schema(w, 8, ["c"], 32, 24, 6, 4, 3, "test")
    with pytest.raises(loongforge.DataLossError, match="'00000002_meta' has 4 bytes, expected 8"):
        for _ in _loader(path, shuffle=False, on_corrupt="error"):
            pass
    seen = [i for b in _loader(path, shuffle=False) for i in b["sample_index"].tolist()]
    assert 2 not in seen and len(seen) == 7


# Guards the live-loader findings: data.mdb truncated (SIGBUS) or overwritten with zeros (LMDB
# assertion, abort) while a loader iterates raises DataLossError naming data.mdb. The pause lets
# the prefetched batches finish reading before the file changes (the race Note [A DB changed
# under its reader] leaves open).
@pytest.mark.parametrize("damage", ["truncate", "zeros"])
def test_db_changed_while_iterating(tmp_path, damage):
    import time
    path = make_db(str(tmp_path / "db"), samples=64)
    data = os.path.join(path, "data.mdb")
    ld = _loader(path, threads=1, on_corrupt="error", prefetch=1)
    it = iter(ld)
    next(it)
    time.sleep(0.5)
    if damage == "truncate":
        os.truncate(data, 8192)
    else:
        with open(data, "r+b") as f:
            f.write(bytes(os.path.getsize(data)))
    with pytest.raises(loongforge.DataLossError, match="data.mdb.*changed while the dataset"):
        for _ in it:
            pass


# Guards: `inspect` of a dataset folder the user cannot read says PermissionDenied naming it (it
# said NotFound "missing data.mdb", exit 3). As root, who reads anything, it runs as nobody.
def test_inspect_unreadable_folder(db, tmp_path):
    import shutil
    import subprocess
    cli = os.path.join(os.environ.get("LOONGFORGE_BUILD", os.path.join(
        os.path.dirname(__file__), "..", "..", "build")), "loongforge")
    if not os.path.exists(cli):
        pytest.skip("no loongforge CLI in this build")
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(root, 0o755)
    path = str(root / "db000")
    shutil.copytree(db, path)
    os.chmod(path, 0)
    cmd = [cli, "inspect", path]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(path, 0o755)
    assert r.returncode not in (0, 3), r
    assert "PermissionDenied" in r.stderr and path in r.stderr, r.stderr
