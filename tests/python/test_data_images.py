"""DataFusionLoader images: non-square image_size=(H, W) and dtype=torch.uint8 (pixels without
normalization), against a CPU reference (PIL's libjpeg decode + the same crop and bilinear
resize, torch's half-pixel-centre interpolate)."""
import io
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
import loongforge  # noqa: E402
from loongforge import _C  # noqa: E402
from lf_testdata import make_db  # noqa: E402

H, W = 24, 40        # output: non-square, wider than tall
CROP = 0.75          # of the 96x72 frames: a 72x54 centre crop at (12, 9), whole pixels


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return make_db(str(tmp_path_factory.mktemp("images") / "db"), samples=8)


def _loader(db, **kw):
    kw = {"threads": 2, "train": False, **kw}
    return loongforge.DataFusionLoader(db, 4, image_size=(H, W), shuffle=False,
                                       crop_fraction=CROP, dct_scaling=False, **kw)


def _reference(db, sample, cam):
    """float64 [3, H, W] pixels 0..255 of the record: PIL decode, centre crop, bilinear resize
    (half-pixel centres, no antialias), as the loader's transform defines it."""
    jpeg = _C.RecordReader(db).get(f"{sample:08d}_cam_cam{cam}")
    rgb = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float64)
    h, w = rgb.shape[:2]
    ch, cw = int(h * CROP), int(w * CROP)
    y0, x0 = (h - ch) // 2, (w - cw) // 2
    crop = torch.from_numpy(rgb[y0:y0 + ch, x0:x0 + cw]).permute(2, 0, 1)[None]
    return F.interpolate(crop, size=(H, W), mode="bilinear", align_corners=False,
                         antialias=False)[0]


# Guards uint8 output: decoded + cropped + resized pixels, no normalization, within JPEG
# tolerance of an independent decoder, and the rounding of the float path's pixels.
def test_uint8_pixels_match_cpu_reference(db):
    b = next(iter(_loader(db, dtype=torch.uint8)))
    img = b["images"]
    assert img.dtype == torch.uint8 and img.shape == (4, 2, 3, H, W)
    f = next(iter(_loader(db)))["images"]
    assert f.dtype == torch.float32 and f.shape == (4, 2, 3, H, W)
    # The same decode and resize, normalized ((v / 255 - 0.5) / 0.5) or not.
    assert (img.double() - ((f.double() * 0.5 + 0.5) * 255).round()).abs().max() <= 1
    for row, sample in enumerate(b["sample_index"].tolist()):
        for cam in range(2):
            ref = _reference(db, sample, cam)
            diff = (img[row, cam].double() - ref).abs()
            # The loader decodes with libjpeg-turbo's fast integer IDCT, PIL with the slow one.
            assert diff.mean() < 1.5 and diff.max() <= 8, \
                f"sample {sample} cam {cam}: mean {diff.mean():.2f} max {diff.max():.0f}"
            # float32: the same values normalized.
            fdiff = ((f[row, cam].double() * 0.5 + 0.5) * 255 - ref).abs()
            assert fdiff.mean() < 1.5, f"sample {sample} cam {cam} float32"
    # The reference can fail: another crop is far from it.
    other = F.interpolate(torch.from_numpy(np.asarray(Image.open(io.BytesIO(
        _C.RecordReader(db).get("00000000_cam_cam0"))).convert("RGB"), np.float64)
    ).permute(2, 0, 1)[None], size=(H, W), mode="bilinear", align_corners=False)[0]
    assert (img[0, 0].double() - other).abs().mean() > 2


# Guards the resize itself, decoder aside: the loader's transform on PIL's pixels is the
# reference's to float rounding, for a non-square output.
def test_transform_matches_reference_on_same_pixels(db):
    jpeg = _C.RecordReader(db).get("00000003_cam_cam1")
    rgb = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    h, w = rgb.shape[:2]
    box = (float(w - int(w * CROP)) // 2, float(h - int(h * CROP)) // 2, w * CROP, h * CROP)
    out = np.frombuffer(_C.testing.crop_resize_normalize(rgb.tobytes(), w, h, box, W, H, mean=(0, 0, 0),
                                                  std=(1, 1, 1)), np.float32).reshape(3, H, W)
    ref = _reference(db, 3, 1)
    assert np.abs(out.astype(np.float64) * 255 - ref.numpy()).max() < 1e-2


# Guards uint8 with the rest of the adapter: NHWC layout, the map view, jitter seeded as before.
def test_uint8_layout_item_and_jitter(db):
    ld = _loader(db, dtype=torch.uint8, layout="NHWC")
    b = next(iter(ld))
    assert b["images"].shape == (4, 2, H, W, 3) and b["images"].dtype == torch.uint8
    item = ld.dataset[2]
    assert item["images"].dtype == torch.uint8 and item["images"].shape == (2, H, W, 3)
    assert torch.equal(item["images"], b["images"][2])
    j = next(iter(_loader(db, dtype=torch.uint8, color_jitter=True, train=True)))["images"]
    assert j.dtype == torch.uint8 and not torch.equal(j, b["images"].permute(0, 1, 4, 2, 3))
    assert loongforge.data.loader_options()["image_size"] == (224, 224)


# Guards non-square output on the default path (DCT scaling, random crops): shapes everywhere,
# and an int still means a square.
def test_non_square_shapes(db):
    ld = loongforge.DataFusionLoader(db, 4, image_size=(20, 36), threads=1)
    b = next(iter(ld))
    assert b["images"].shape == (4, 2, 3, 20, 36)
    assert ld.dataset[0]["images"].shape == (2, 3, 20, 36)
    assert b["images"].std() > 0.05
    sq = loongforge.DataFusionLoader(db, 4, image_size=16, threads=1)
    assert next(iter(sq))["images"].shape == (4, 2, 3, 16, 16)


@pytest.mark.parametrize("size", [0, -3, (0, 32), (32, -1), (5000, 32)])
def test_image_size_bounds(db, size):
    with pytest.raises(ValueError, match="image_size"):
        loongforge.DataFusionLoader(db, 4, image_size=size)


@pytest.mark.parametrize("size", [(1, 2, 3), "32", True, 1.5, (32.0, 32), 2**40])
def test_image_size_types(db, size):
    with pytest.raises(ValueError, match="image_size"):
        loongforge.DataFusionLoader(db, 4, image_size=size)


def test_other_dtypes_refused(db):
    with pytest.raises(ValueError, match="dtype"):
        loongforge.DataFusionLoader(db, 4, dtype=torch.int16)


GPU_OK = torch.cuda.is_available() and _C.gpu_loader_support(0)[0]


# Guards the GPU loader with non-square output (its kernel against the CPU loader, decoders
# aside) and uint8 on device='cuda': the CPU loader runs, says why, and copies the same pixels.
@pytest.mark.skipif(not GPU_OK, reason="GPU loader unavailable")
def test_gpu_non_square_and_uint8(db):
    cpu, gpu = _loader(db), _loader(db, device="cuda")
    assert gpu.gpu_pipeline
    a, b = next(iter(cpu)), next(iter(gpu))
    assert b["images"].is_cuda and b["images"].shape == (4, 2, 3, H, W)
    assert (a["images"] - b["images"].cpu()).abs().mean().item() < 0.04
    item = gpu.dataset[1]
    assert item["images"].is_cuda and item["images"].shape == (2, 3, H, W)
    diff = (item["images"] - b["images"][1]).abs().max().item()
    print("GPU dataset[1] vs its batch row: max abs diff", diff)
    assert diff < 0.1
    u = _loader(db, device="cuda", dtype=torch.uint8)
    assert not u.gpu_pipeline and "uint8" in u.metrics()["reason"]
    x = next(iter(u))["images"]
    assert x.is_cuda and x.dtype == torch.uint8
    assert torch.equal(x.cpu(), next(iter(_loader(db, dtype=torch.uint8)))["images"])
    with pytest.raises(RuntimeError, match="uint8"):
        _loader(db, device="cuda", dtype=torch.uint8, gpu_decode=True)


def _pil_rgb(db, sample, cam):
    jpeg = _C.RecordReader(db).get(f"{sample:08d}_cam_cam{cam}")
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float64)


def _resize(rgb, x0, y0, cw, ch, size):
    crop = torch.from_numpy(rgb[y0:y0 + ch, x0:x0 + cw]).permute(2, 0, 1)[None]
    return F.interpolate(crop, size=size, mode="bilinear", align_corners=False,
                         antialias=False)[0]


# Guards resize="crop": the crop has the output's aspect (crop_fraction of the largest such
# rectangle of the 96x72 frame: 96x57.6 -> 72x43.2, centred at whole pixels) and is resized
# without stretching, against PIL + torch's interpolate.
def test_resize_crop_keeps_the_aspect(db):
    b = next(iter(_loader(db, dtype=torch.uint8, resize="crop")))
    for row, sample in enumerate(b["sample_index"].tolist()):
        rgb = _pil_rgb(db, sample, 0)
        h, w = rgb.shape[:2]
        cw, ch = w * CROP, (w / (W / H)) * CROP  # the frame is wider than tall: width limits
        x0, y0 = int((w - cw) // 2), int((h - ch) // 2)
        # The loader samples a fractional box; the reference crops whole pixels around it.
        ref = _resize(rgb, x0, y0, int(round(cw)), int(round(ch)), (H, W))
        diff = (b["images"][row, 0].double() - ref).abs()
        assert diff.mean() < 2.5, f"sample {sample}: {diff.mean():.2f}"
    stretch = next(iter(_loader(db, dtype=torch.uint8)))["images"]
    assert (stretch.double() - b["images"].double()).abs().mean() > 8  # another crop


# Guards resize="pad": the crop keeps its own aspect inside the output, centred, the rest black
# (0 in uint8, (0 - mean) / std in float), and the picture is the crop resized to the letterbox.
def test_resize_pad_letterboxes(db):
    size = (40, 40)  # the 72x54 crop (4:3) becomes 40x30 in rows 5..34
    b = next(iter(loongforge.DataFusionLoader(db, 4, image_size=size, shuffle=False,
                                              crop_fraction=CROP, dct_scaling=False,
                                              train=False, threads=1, dtype=torch.uint8,
                                              resize="pad")))
    img = b["images"]
    assert img.shape == (4, 2, 3, 40, 40)
    assert img[:, :, :, :5].eq(0).all() and img[:, :, :, 35:].eq(0).all()
    for row, sample in enumerate(b["sample_index"].tolist()):
        rgb = _pil_rgb(db, sample, 1)
        h, w = rgb.shape[:2]
        ch, cw = int(h * CROP), int(w * CROP)
        ref = _resize(rgb, (w - cw) // 2, (h - ch) // 2, cw, ch, (30, 40))
        diff = (img[row, 1, :, 5:35].double() - ref).abs()
        assert diff.mean() < 1.5 and diff.max() <= 8
    f = next(iter(loongforge.DataFusionLoader(db, 4, image_size=size, shuffle=False,
                                              crop_fraction=CROP, train=False, threads=1,
                                              resize="pad", mean=[0.4, 0.5, 0.6],
                                              std=[0.2, 0.25, 0.5])))["images"]
    black = torch.tensor([-2.0, -2.0, -1.2]).view(3, 1, 1)
    torch.testing.assert_close(f[0, 0, :, :5], black.expand(3, 5, 40))


def test_resize_unknown_mode_is_named(db):
    with pytest.raises(ValueError, match="resize"):
        _loader(db, resize="letterbox")
