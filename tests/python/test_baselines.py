"""The torch modes' input pipelines as their users run them (trainer_data.BaselineLoader): LeRobot's
DataLoader settings, the tuned sampler across epochs, the deferred (GPU) decode's parameters and
batched jitter against the PIL path, and the same samples and tokens in every mode."""
from __future__ import annotations

import io
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdb import TINY_TRAIN_ARGS, has_datafusion  # noqa: E402

from loongforge import train  # noqa: E402
from loongforge.trainer_data import (STYLES, BaselineLoader, GpuImages,  # noqa: E402
                                     LmdbFrameDataset, _rgb_hsv)

torch.set_num_threads(1)


def _indices(loader, epochs):
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out.append([b["sample_index"].tolist() for b in loader])
    return out


# Guards the LeRobot row's DataLoader: the settings of LeRobot's train script (workers collate,
# persistent workers, prefetch 4, pinned memory on CUDA only, a new iterator per epoch), and the
# tuned row's one difference in the loader (its sampler runs across epochs).
def test_loader_settings_are_lerobots(train_db):
    le = BaselineLoader(train_db, 4, image_size=28, workers=2, style="lerobot")
    s = le.settings()
    assert s["num_workers"] == 2 and s["persistent_workers"] and s["prefetch_factor"] == 4
    assert s["collate_in_workers"] and not s["across_epochs"] and not s["pin_memory"]
    assert s["decode"] == "cpu (PIL)"
    tu = BaselineLoader(train_db, 4, image_size=28, workers=2, style="tuned", gpu_decode=True)
    t = tu.settings()
    assert t["across_epochs"] and t["persistent_workers"] and t["prefetch_factor"] == 4
    # No CUDA here: the tuned loader says why it decodes on the CPU.
    assert t["decode"] == "cpu (PIL)" and t["gpu_decode_reason"] == "not a CUDA device"
    with pytest.raises(ValueError, match="style must be one of"):
        BaselineLoader(train_db, 4, style="fast")
    assert STYLES == ("lerobot", "tuned")


# Guards both styles' order: each epoch visits DataFusion's sampler order, the tuned loader keeps
# one DataLoader iterator through the epoch boundary (its workers prefetch across it), and a
# loader resumed mid-epoch continues at the saved batch.
def test_epoch_order_and_iterator_across_epochs(train_db):
    le = BaselineLoader(train_db, 3, image_size=28, workers=1, seed=5, style="lerobot")
    tu = BaselineLoader(train_db, 3, image_size=28, workers=1, seed=5, style="tuned")
    want = [[sorted(le.sampler.batch(e, b)) for b in range(len(le))] for e in range(2)]
    for loader in (le, tu):
        got = _indices(loader, 2)
        assert [[sorted(b) for b in ep] for ep in got] == want
    it = tu._it
    tu.set_epoch(2)
    next(iter(tu))
    assert tu._it is it  # the same iterator: nothing restarted at the boundaries
    st = tu.state_dict()
    again = BaselineLoader(train_db, 3, image_size=28, workers=0, seed=5, style="tuned")
    again.load_state_dict(st)
    assert [sorted(b["sample_index"].tolist()) for b in again] == \
        [sorted(tu.sampler.batch(2, b)) for b in range(st["next_batch"], len(tu))]


# Guards the deferred decode's parameters: the workers draw each camera's crop offset and jitter
# factors in the PIL path's order from the same per-sample seed, so applying them to the PIL
# frame gives the PIL path's image bit for bit.
def test_deferred_params_reproduce_the_pil_path(train_db):
    from PIL import Image
    import torchvision.transforms as T
    from loongforge.augment import apply_jitter

    cpu = LmdbFrameDataset(train_db, image_size=28, color_jitter=True, train=True)
    defer = LmdbFrameDataset(train_db, image_size=28, color_jitter=True, train=True,
                             decode="defer")
    th, tw = cpu.crop
    for idx in (0, 3, 7):
        a, b = cpu[(1, idx)], defer[(1, idx)]
        assert b["crop"].shape == (2, 2) and b["jitter"].shape == (2, 4)
        for c, jpeg in enumerate(b["jpegs"]):
            img = Image.open(io.BytesIO(jpeg.numpy().tobytes())).convert("RGB")
            i, j = b["crop"][c].tolist()
            x = T.ToTensor()(T.Resize((28, 28), antialias=True)(img.crop((j, i, j + tw, i + th))))
            x = T.Normalize([0.5] * 3, [0.5] * 3)(apply_jitter(x, *b["jitter"][c].tolist()))
            assert torch.equal(x, a["images"][c]), (idx, c)
        for k in ("tokens", "state", "action", "action_mask", "sample_index"):
            assert torch.equal(a[k], b[k]), k
    with pytest.raises(ValueError, match="decode must be"):
        LmdbFrameDataset(train_db, decode="gpu")


# Guards the batched jitter (one set of kernels for the whole batch, per-image factors) against
# torchvision's per-image ops in apply_jitter.
@pytest.mark.skipif(_rgb_hsv() is None, reason="torchvision without batched RGB/HSV helpers")
def test_batched_jitter_matches_per_image_ops():
    from loongforge.augment import GrootColorJitter, apply_jitter

    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 20, 24, generator=g)
    x[0] = 0.5  # a grey image: hue undefined, saturation 0
    torch.manual_seed(1)
    jit = GrootColorJitter()
    f = torch.tensor([jit.draw() for _ in range(6)])
    gi = GpuImages(torch.device("cpu"), 20, (20, 24), 1, True, (0.5,) * 3, (0.5,) * 3)
    got = gi._jitter(x.clone(), f)
    want = torch.stack([apply_jitter(im, *p) for im, p in zip(x, f.tolist())])
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


# Guards "the same samples and the same loss definition in every mode": the LeRobot-style and
# tuned loaders yield the same samples and tokens as DataFusion, batch by batch, and the trainer's
# two torch modes give the same losses (the same pipeline on the CPU), loongforge's within the
# JPEG/resize difference of its own decoder.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build")
def test_same_samples_tokens_and_losses_in_every_mode(train_db, tmp_path):
    from loongforge.data import DataFusionLoader

    df = DataFusionLoader(train_db, 4, image_size=28, seed=3, threads=1)
    loaders = [BaselineLoader(train_db, 4, image_size=28, seed=3, workers=0, style=s)
               for s in STYLES]
    for batches in zip(df, *loaders):
        ref = batches[0]
        for b in batches[1:]:
            assert torch.equal(b["sample_index"], ref["sample_index"])
            assert torch.equal(b["tokens"], ref["tokens"])
            assert torch.equal(b["attention_mask"], ref["attention_mask"])
            assert torch.allclose(b["action"], ref["action"]) and torch.allclose(b["state"],
                                                                                 ref["state"])
    curves = {}
    for mode in ("lerobot", "tuned", "loongforge"):
        out = str(tmp_path / f"{mode}.json")
        assert train.main(list(TINY_TRAIN_ARGS) + ["--data", train_db, "--mode", mode,
                                                   "--steps", "4", "--workers", "1",
                                                   "--json-out", out]) == 0
        import json
        with open(out) as f:
            curves[mode] = [r["loss"] for r in json.load(f)["loss_curve"]]
    assert curves["lerobot"] == curves["tuned"]
    assert curves["loongforge"] == pytest.approx(curves["tuned"], rel=0.05)


# Guards the trainer's flags of the rows: --compile-mode needs --compile, --start-batch cannot
# be combined with --resume and must lie inside an epoch, and the LeRobot mode's name is accepted.
def test_trainer_row_flags(train_db, capsys):
    base = list(TINY_TRAIN_ARGS) + ["--data", train_db, "--steps", "2"]
    assert train.main(base + ["--compile-mode", "reduce-overhead"]) == 2
    assert "needs --compile" in capsys.readouterr().err
    assert train.main(base + ["--start-batch", "3", "--resume", "--ckpt-dir", "x"]) == 2
    assert "--start-batch" in capsys.readouterr().err
    assert train.main(base + ["--start-batch", "100000"]) == 2
    assert "an epoch has" in capsys.readouterr().err
    assert train.main(base + ["--mode", "lerobot", "--start-batch", "1", "--workers", "0"]) == 0
