"""GR00T's image transforms: the loader's fused CPU twin against torchvision's functional
definitions (Note [Colour jitter] in src/data/image_ops.h), the CPU loader's jitter draws, and the
baseline's fixed-order jitter."""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import loongforge  # noqa: E402
from loongforge import _C  # noqa: E402
from loongforge.augment import (BRIGHTNESS, CONTRAST, HUE, SATURATION,  # noqa: E402
                                GrootColorJitter, apply_jitter, loader_flags)
from lf_testdata import make_db  # noqa: E402

TF = pytest.importorskip("torchvision.transforms.functional")
TOL = 2.0 / 255  # on the [0, 1] image: float32 twin vs torchvision (observed ~1e-5)


def _image(h=48, w=64, seed=0, hi=190):
    """Random RGB8 with values <= hi: 1.3 * hi < 255, so brightness never clips and contrast's mean
    after brightness is exactly brightness x the mean before it (the twin's definition)."""
    rng = np.random.default_rng(seed)
    smooth = np.linspace(0, 1, w)[None, :, None] * np.array([1.0, 0.3, 0.6])
    img = hi * (0.6 * smooth + 0.4 * rng.random((h, w, 3)))
    return np.clip(img, 0, hi).astype(np.uint8)


def _torchvision(img, box, out, jitter):
    """Crop -> bilinear resize (no antialias) -> fixed-order jitter, on float [0, 1]."""
    x0, y0, bw, bh = box
    t = torch.from_numpy(img).permute(2, 0, 1).float() / 255
    t = TF.crop(t, y0, x0, bh, bw)
    t = TF.resize(t, [out[1], out[0]], interpolation=TF.InterpolationMode.BILINEAR,
                  antialias=False)
    gray_mean = float(TF.rgb_to_grayscale(t).mean()) * 255
    return (apply_jitter(t, *jitter) if jitter else t), gray_mean


def _twin(img, box, out, jitter, gray_mean):
    h, w = img.shape[:2]
    raw = _C.testing.crop_resize_normalize(img.tobytes(), w, h, [float(v) for v in box], out[0], out[1],
                                    jitter, gray_mean)
    y = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(3, out[1], out[0])
    return y * 0.5 + 0.5  # undo the (0.5, 0.5) normalization


# (brightness, contrast, saturation, hue): range ends, GR00T's hue range, every hue sector.
PARAMS = [(1.0, 1.0, 1.0, 0.0), (0.7, 0.6, 0.5, -0.08), (1.3, 1.4, 1.5, 0.08),
          (1.1, 0.8, 1.2, 0.03), (0.9, 1.2, 0.7, -0.45), (1.0, 1.0, 1.0, 0.31),
          (1.2, 1.3, 1.4, 0.5), (0.8, 0.9, 0.0, 0.2)]


# Guards the CPU twin of the GPU kernel (the fused crop/resize/jitter/normalize pass of the CPU
# loader) against torchvision's definitions of resize and of the four jitter ops, on fixed
# parameters: a wrong formula, grayscale weight, clamp, hue sector or op order fails here.
@pytest.mark.parametrize("jitter", PARAMS)
@pytest.mark.parametrize("box,out", [((3, 2, 60, 45), (32, 24)),   # downscale (0.95 crop)
                                     ((0, 0, 64, 48), (80, 56)),   # upscale, whole frame
                                     ((5, 4, 41, 33), (41, 33))])  # identity resize
def test_twin_matches_torchvision(jitter, box, out):
    img = _image(seed=sum(box))
    want, gray_mean = _torchvision(img, box, out, jitter)
    got = _twin(img, box, out, jitter, gray_mean)
    err = (got - want).abs().max().item()
    assert err <= TOL, f"max error {err * 255:.3f}/255 for jitter {jitter}"


# Guards the twin without jitter (resize alone): exact up to float rounding.
def test_twin_resize_without_jitter():
    img = _image(seed=7, hi=255)
    want, _ = _torchvision(img, (3, 2, 60, 45), (32, 24), None)
    got = _twin(img, (3, 2, 60, 45), (32, 24), None, 0.0)
    assert (got - want).abs().max().item() <= 1e-4


# Guards the contrast mean the loader uses (MeanGray of the source crop, every 4th pixel, with
# torchvision's gray weights): it stands for torchvision's mean of the resized image within one
# level on a smooth (camera-like) image; on every pixel, within a quarter level.
def test_loader_contrast_mean_close_to_torchvision():
    yy, xx = np.mgrid[0:48, 0:64]
    img = (120 + 60 * np.sin(xx / 6.0)[..., None] * np.cos(yy / 9.0)[..., None]
           * np.array([1.0, 0.5, -0.7]))
    img = np.clip(img, 0, 255).astype(np.uint8)
    box, out = (3, 2, 60, 45), (32, 24)
    _, want = _torchvision(img, box, out, None)
    fbox = [float(v) for v in box]
    assert abs(_C.testing.mean_gray(img.tobytes(), 64, 48, fbox, 4) - want) <= 1.0
    assert abs(_C.testing.mean_gray(img.tobytes(), 64, 48, fbox, 1) - want) <= 0.25


# Guards against a hue that is a no-op or applied to the wrong channel order: a pure red pixel
# shifted by +1/3 turn becomes pure green, as torchvision says.
def test_hue_third_turn_maps_red_to_green():
    img = np.zeros((2, 2, 3), np.uint8)
    img[..., 0] = 200
    got = _twin(img, (0, 0, 2, 2), (2, 2), (1.0, 1.0, 1.0, 1 / 3), 0.0)
    want = TF.adjust_hue(torch.from_numpy(img).permute(2, 0, 1).float() / 255, 1 / 3)
    assert torch.allclose(got, want, atol=1e-3)
    assert got[1].min() > 0.78 and got[0].max() < 1e-3


def _mix(x):
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


class _SampleRng:
    """src/data/loader_pipeline.h's SampleRng, bit for bit."""

    def __init__(self, seed, epoch, sample, camera):
        self.s = _mix(_mix(_mix(seed) ^ epoch) ^ sample) ^ camera

    def uniform(self):
        self.s = _mix(self.s)
        return np.float32(self.s >> 40) / np.float32(1 << 24)

    def range(self, lo, hi):
        lo, hi = np.float32(lo), np.float32(hi)
        return float(lo + (hi - lo) * self.uniform())


# Guards the loader's draws (crop offsets, then brightness, contrast, saturation, hue from the
# sample's SampleRng) and that the CPU loader applies hue: its jittered images equal the fixed-order
# definition applied to its own un-jittered images with those draws. The tolerance (3/255) covers
# the contrast mean taken on the source crop instead of the resized image.
def test_cpu_loader_jitter_draws_match_definition(tmp_path):
    db = make_db(str(tmp_path / "db"), samples=8)
    kw = dict(image_size=32, threads=2, seed=5, dct_scaling=False)
    plain = next(iter(loongforge.DataFusionLoader(db, 4, color_jitter=False, **kw)))
    jit = next(iter(loongforge.DataFusionLoader(db, 4, color_jitter=True, **kw)))
    assert torch.equal(plain["sample_index"], jit["sample_index"])
    worst = 0.0
    for i, sample in enumerate(plain["sample_index"].tolist()):
        for cam in range(plain["images"].shape[1]):
            rng = _SampleRng(5, 0, sample, cam)
            rng.uniform(), rng.uniform()  # crop offsets
            f = [rng.range(1 - BRIGHTNESS, 1 + BRIGHTNESS), rng.range(1 - CONTRAST, 1 + CONTRAST),
                 rng.range(1 - SATURATION, 1 + SATURATION), rng.range(-HUE, HUE)]
            x = plain["images"][i, cam] * 0.5 + 0.5
            m = float(TF.rgb_to_grayscale(x).mean())
            x = (x * f[0]).clamp(0, 1)
            x = (f[1] * x + (1 - f[1]) * f[0] * m).clamp(0, 1)  # the loader's contrast mean
            x = TF.adjust_hue(TF.adjust_saturation(x, f[2]), f[3])
            got = jit["images"][i, cam] * 0.5 + 0.5
            worst = max(worst, (got - x).abs().max().item())
    assert worst <= 3.0 / 255, f"max error {worst * 255:.2f}/255"


# Guards the baseline's jitter: factors in GR00T's ranges, drawn from the seeded torch RNG in the
# order brightness, contrast, saturation, hue, and applied in that fixed order.
def test_groot_color_jitter_fixed_order_and_ranges():
    j = GrootColorJitter()
    img = torch.from_numpy(_image(seed=11)).permute(2, 0, 1).float() / 255
    torch.manual_seed(123)
    out = j(img)
    torch.manual_seed(123)
    b, c, s, h = j.draw()
    assert 0.7 <= b <= 1.3 and 0.6 <= c <= 1.4 and 0.5 <= s <= 1.5 and -0.08 <= h <= 0.08
    assert torch.equal(out, apply_jitter(img, b, c, s, h))
    with pytest.raises(ValueError):
        GrootColorJitter(hue=0.6)


# Guards the trainer's --augment switch: GR00T's transforms by default, all off with 'none'.
def test_loader_flags():
    assert loader_flags("groot") == (True, True)
    assert loader_flags("none") == (False, False)
    assert loader_flags("groot", no_augment=True) == (False, False)
    with pytest.raises(ValueError):
        loader_flags("randaugment")


# Guards the trainer's flags: --color-jitter with --augment none is a contradiction, refused with
# one line (exit 2) before any data is read, not silently ignored.
def test_trainer_refuses_jitter_with_augment_none(capsys):
    from loongforge import train

    assert train.main(["--data", "/nonexistent", "--augment", "none", "--color-jitter"]) == 2
    assert "--color-jitter contradicts" in capsys.readouterr().err
