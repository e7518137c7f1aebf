"""loongforge.sample_rng: a sample's random numbers depend on (seed, epoch, stream, sample index)
only, so a run draws the same noise for a sample on any number of ranks and in any batch."""
import math

import pytest
import torch

from loongforge import sample_rng


# Guards the property world-size invariance rests on: a row is a function of its own sample
# index, whatever else is in the batch and in which order (a rank's shard is any sub-batch).
def test_a_row_depends_on_its_sample_only():
    whole = torch.arange(0, 64)
    ref = sample_rng.normal(whole, (16, 7), seed=3, epoch=2)
    shard = torch.tensor([41, 5, 63, 0])
    got = sample_rng.normal(shard, (16, 7), seed=3, epoch=2)
    assert torch.equal(got, ref[shard])
    for r in range(4):  # the strided shards four ranks take, put back together
        part = whole[r::4]
        assert torch.equal(sample_rng.normal(part, (16, 7), seed=3, epoch=2), ref[part])
    assert torch.equal(sample_rng.uniform(shard.to(torch.int32), 5, seed=3),
                       sample_rng.uniform(whole, 5, seed=3)[shard])


# Guards that each name of a draw matters: another seed, epoch, stream or sample gives other
# numbers, and big values (64-bit seeds, sample indices past 2**32) are folded in whole.
def test_every_part_of_the_name_changes_the_numbers():
    idx = torch.tensor([7, 2**33 + 7])
    base = sample_rng.uniform(idx, 8, seed=1, epoch=0, stream=0)
    assert not torch.equal(base[0], base[1])
    for kw in ({"seed": 2}, {"seed": 1 + 2**40}, {"epoch": 1}, {"stream": 1}):
        args = {"seed": 1, "epoch": 0, "stream": 0, **kw}
        other = sample_rng.uniform(idx, 8, **args)
        assert (other != base).float().mean() > 0.9, kw


# Guards the distributions: uniforms strictly inside (0, 1) with mean 1/2 and variance 1/12,
# normals with mean 0, variance 1 and the normal's tail mass, elements uncorrelated.
def test_distributions():
    idx = torch.arange(4096)
    u = sample_rng.uniform(idx, 256, seed=0)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 2e-3 and abs(u.var().item() - 1 / 12) < 1e-3
    z = sample_rng.normal(idx, 256, seed=0, stream=5)
    assert abs(z.mean().item()) < 5e-3 and abs(z.var().item() - 1) < 1e-2
    tail = (z.abs() > 1.96).float().mean().item()
    assert abs(tail - 0.05) < 2e-3, tail
    c = torch.corrcoef(torch.stack([z[:, 0], z[:, 1], u[:, 0]]))
    assert (c - torch.eye(3)).abs().max() < 0.06, c


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="seed must be an integer"):
        sample_rng.normal(torch.arange(3), 2, seed=-1)
    with pytest.raises(ValueError, match="1-D int32/int64"):
        sample_rng.normal(torch.zeros(3), 2, seed=0)
    with pytest.raises(ValueError, match="negative index"):
        sample_rng.normal(torch.tensor([0, -1]), 2, seed=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_gives_the_cpus_numbers():
    idx = torch.arange(128)
    cpu = sample_rng.uniform(idx, 64, seed=9, epoch=1)
    assert torch.equal(sample_rng.uniform(idx.cuda(), 64, seed=9, epoch=1).cpu(), cpu)
    torch.testing.assert_close(sample_rng.normal(idx.cuda(), 64, seed=9).cpu(),
                               sample_rng.normal(idx, 64, seed=9), rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(sample_rng.normal(idx.cuda(), 4, seed=0).abs().max()))
