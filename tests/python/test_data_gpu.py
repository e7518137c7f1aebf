"""DataFusionLoader on the GPU (nvJPEG + fused kernel): equivalence with the CPU loader, streams,
fallback reporting. Builds its data through _C.RecordWriter (no python lmdb needed)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import loongforge  # noqa: E402
from loongforge import _C, _synth  # noqa: E402

GPU_OK, GPU_WHY = _C.gpu_loader_support(0)
needs_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and GPU_OK),
                               reason=f"GPU loader unavailable: {GPU_WHY}")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gpu") / "db")
    _synth.make_db(path, samples=48, cameras=2, width=160, height=120, corrupt=[7],
                   progressive=[9])
    return path


def _loader(db, **kw):
    kw.setdefault("image_size", 48)
    return loongforge.DataFusionLoader(db, 8, seed=11, threads=2, **kw)


def _collect(ld):
    return [{k: v.clone() for k, v in b.items()} for b in ld]


# Guards the availability contract: the C++ loader says why device='cuda' cannot run, and the
# constructor error carries that reason.
def test_gpu_support_reason(db):
    ok, why = _C.gpu_loader_support(0)
    assert isinstance(ok, bool) and why
    if not ok:
        with pytest.raises(RuntimeError, match="device=cuda"):
            _C.DataLoader(db, device="cuda")


# Guards the Python-side layout/dtype conversion of the CPU path (also the GPU fallback's).
def test_cpu_nhwc_bf16_equals_nchw_fp32(db):
    a = _collect(_loader(db))
    b = _collect(_loader(db, layout="NHWC", dtype=torch.bfloat16))
    assert len(a) == len(b) and b[0]["images"].dtype == torch.bfloat16
    for x, y in zip(a, b):
        assert torch.equal(x["sample_index"], y["sample_index"])
        back = y["images"].float().permute(0, 1, 4, 2, 3)
        assert torch.allclose(back, x["images"], atol=1e-2, rtol=1e-2)


# Guards GPU/CPU equivalence end to end through DLPack: CUDA tensors, same samples and stage-3
# arrays, images equal up to decoder differences; corrupt/progressive handled as on the CPU.
@needs_gpu
def test_gpu_matches_cpu(db):
    cpu = _loader(db, dct_scaling=False, color_jitter=True)
    gpu = _loader(db, device="cuda", color_jitter=True)
    assert gpu.gpu_pipeline
    a, b = _collect(cpu), _collect(gpu)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert y["images"].is_cuda and y["tokens"].is_cuda
        for k in ("sample_index", "tokens", "attention_mask", "state", "action", "action_mask"):
            assert torch.equal(x[k], y[k].cpu()), k
        assert (x["images"] - y["images"].cpu()).abs().mean().item() < 0.04
    assert gpu.corrupt_skipped == cpu.corrupt_skipped == 1
    m = gpu.metrics()
    assert m["decode_backend"].startswith("nvjpeg") and m["reason"]
    assert isinstance(m["hw_decode"], bool)
    print("metrics:", {k: m[k] for k in ("hw_decode", "decode_backend", "reason")}, m["device"])


# Guards stream safety: consuming on a side stream gives the same numbers as the default stream.
@needs_gpu
def test_gpu_side_stream_consumer(db):
    ref = [b["images"].clone() for b in _loader(db, device="cuda")]
    side = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(side):
        for b in _loader(db, device="cuda"):
            got.append(b["images"].float().mul(2) / 2)  # queued on the side stream
    side.synchronize()
    # The hardware/CUDA decode split is measured per run, and the two backends differ by a few
    # levels; a stream race would read unfinished or recycled buffers (errors of order 1).
    for r, g in zip(ref, got):
        d = (r - g).abs()
        assert d.max().item() < 0.1 and d.mean().item() < 0.01


# Guards the fallback report: gpu_decode=False runs the CPU loader, copies to the GPU, and the
# metrics say so and why.
@needs_gpu
def test_gpu_fallback_reports_reason(db):
    ld = _loader(db, device="cuda", gpu_decode=False, layout="NHWC")
    b = next(iter(ld))
    assert b["images"].is_cuda and b["images"].shape[-1] == 3
    m = ld.metrics()
    assert m["hw_decode"] is False and "non_blocking" in m["decode_backend"]
    assert "gpu_decode=False" in m["reason"]


# Guards static batches on the GPU through DLPack: token buckets, padding rows (a corrupt and a
# progressive sample are in the DB) and device stage 3 equal the CPU loader's.
@needs_gpu
def test_gpu_static_buckets_match_cpu(db):
    cpu = _loader(db, dct_scaling=False, token_buckets=[4, 6])
    gpu = _loader(db, device="cuda", token_buckets=[4, 6])
    assert gpu.metrics()["device"]["stage3_on_device"]
    a, b = list(cpu), list(gpu)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert y.shape_key == x.shape_key and y.bucket == x.bucket and y.size == x.size
        assert y["tokens"].is_cuda and y["tokens"].shape[0] == 8
        for k in ("sample_index", "tokens", "attention_mask", "state", "action", "action_mask"):
            assert torch.equal(x[k], y[k].cpu()), k
        assert (x["images"] - y["images"].cpu()).abs().mean().item() < 0.04
    assert sum(8 - x.size for x in a) == 1  # sample 7 is corrupt


# Guards the decoder binding the loader bench uses for its ceiling rows: with 2 batches in flight
# on lane threads, submit()/collect() hand batches back in order with the same decoded counts as
# the synchronous decode(), a third batch in flight is refused, and drain() leaves it usable.
@needs_gpu
def test_nvjpeg_decoder_lanes_in_order():
    if not hasattr(_C.testing, "NvJpegDecoder"):
        pytest.skip("this build has no nvJPEG")
    frames = [_synth.jpeg(_synth.frame(96 + 8 * i, 64, i), quality=85) for i in range(12)]
    batches = [frames[:4], frames[4:6] + [b"not a jpeg"], frames[6:12]]
    sync = _C.testing.NvJpegDecoder(hw_ratio=1.0)
    want = [sync.decode(b) for b in batches]
    assert want == [4, 2, 6]
    dec = _C.testing.NvJpegDecoder(hw_ratio=1.0, async_=True, lanes=2)
    dec.submit(batches[0])
    dec.submit(batches[1])
    with pytest.raises(RuntimeError, match="not collected"):
        dec.submit(batches[2])
    got = [dec.collect()]
    dec.submit(batches[2])
    got += [dec.collect(), dec.collect()]
    assert got == want
    dec.submit(batches[0])
    dec.drain()
    assert dec.in_flight() == 0
    assert dec.info()["async"] and dec.info()["lanes"] == 2


# Guards the decoder's options read from NvJpegDecoderOptions' table: the defaults come from the
# C++ struct, an unknown keyword lists the known ones, a value of the wrong type names the option,
# and an out-of-range lane count is refused by the decoder's own check.
@needs_gpu
def test_nvjpeg_decoder_options_from_the_table():
    if not hasattr(_C.testing, "NvJpegDecoder"):
        pytest.skip("this build has no nvJPEG")
    opts = _C.testing.nvjpeg_options()
    assert opts["lanes"] == 2 and opts["async_"] is False and opts["hw"] is True, opts
    assert opts["stagger"] == 1.0 and opts["max_frame_pixels"] == 64 << 20, opts
    with pytest.raises(ValueError, match=r"unknown option 'lane' \(known: device, hw_ratio"):
        _C.testing.NvJpegDecoder(lane=2)
    with pytest.raises(ValueError, match="option 'stagger' cannot take a str"):
        _C.testing.NvJpegDecoder(stagger="half")
    with pytest.raises((ValueError, RuntimeError), match="lanes"):
        _C.testing.NvJpegDecoder(lanes=1)


# Guards resize="crop" on the GPU loader: the same aspect-keeping crop box as the CPU loader
# (ChooseCropBox, one definition), so the pixels agree within the decoders' difference; and
# resize="pad" (CPU loader only) falls back to the CPU loader saying why.
@needs_gpu
def test_gpu_resize_crop_matches_cpu(db):
    kw = dict(image_size=(32, 64), resize="crop", train=True)
    a = _collect(_loader(db, dct_scaling=False, **kw))
    b = _collect(_loader(db, device="cuda", **kw))
    for x, y in zip(a, b):
        assert torch.equal(x["sample_index"], y["sample_index"].cpu())
        assert (x["images"] - y["images"].cpu()).abs().mean().item() < 0.04
    pad = _loader(db, device="cuda", image_size=(32, 64), resize="pad")
    assert not pad.gpu_pipeline and "resize='pad'" in pad.metrics()["reason"]
