"""Random numbers that belong to a sample, not to a rank.

A per-rank ``torch.Generator`` gives each sample numbers that depend on which rank it landed on
and how many samples that rank drew before it, so the same run on 1, 2 or 4 ranks draws different
noise and its loss curve changes with the world size. Drawn from (seed, epoch, sample index,
stream) instead, a sample's flow-matching noise, its diffusion time or its dropout of a modality
are the same whichever rank trains it, in whichever batch; DataFusion's augmentation is drawn the
same way. A user's ``loss_fn`` reads the batch's ``sample_index`` (DataFusion batches carry it)
and the epoch:

    noise = lf.sample_rng.normal(batch["sample_index"], (horizon, action_dim), seed=0, epoch=e)
    t = lf.sample_rng.uniform(batch["sample_index"], (), seed=0, epoch=e, stream=1)

Note [Counter-based sample numbers]
Each value is a hash of (seed, epoch, stream, sample, element): a 32-bit integer finalizer (a
xorshift-multiply mix) applied in turn to each part, the parts folded in by xor. The arithmetic is
int64 torch ops whose values stay below 2**49 (32-bit multiplies split into 16-bit halves), so the
same bits come out on the CPU and on CUDA, with no overflow anywhere, and in any batch order.
Uniforms take the hash's top 24 bits, (h + 0.5) / 2**24, never 0 or 1; normals are Box-Muller
over two uniforms of the same element. This is for training noise, not cryptography.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import torch

__all__ = ["uniform", "normal"]

_M32 = 0xFFFFFFFF
Shape = Union[int, Sequence[int], Tuple[()]]


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for 0 <= x < 2**32, in int64 without overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit finalizer: every input bit reaches every output bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _key(sample_index: torch.Tensor, seed: int, epoch: int, stream: int) -> torch.Tensor:
    """One 32-bit key a sample ([B] int64), from everything that names its numbers."""
    for name, v in (("seed", seed), ("epoch", epoch), ("stream", stream)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
            raise ValueError(f"sample_rng: {name} must be an integer in 0..2**64-1, got {v!r}")
    if sample_index.dtype not in (torch.int32, torch.int64) or sample_index.dim() != 1:
        raise ValueError("sample_rng: sample_index must be a 1-D int32/int64 tensor (a batch's "
                         f"sample indices), got {sample_index.dtype} of shape "
                         f"{list(sample_index.shape)}")
    idx = sample_index.to(torch.int64)
    if idx.numel() and bool((idx < 0).any()):
        raise ValueError("sample_rng: sample_index holds a negative index (a padding row's -1?); "
                         "draw for real rows only")
    h = torch.zeros_like(idx)
    for part in (seed & _M32, seed >> 32, epoch & _M32, epoch >> 32, stream & _M32, stream >> 32):
        h = _mix(h ^ part)
    h = _mix(h ^ (idx & _M32))
    return _mix(h ^ (idx >> 32))


def _bits(sample_index: torch.Tensor, shape: Shape, seed: int, epoch: int, stream: int,
          per_element: int) -> torch.Tensor:
    """[B, *shape, per_element] hashes: per_element independent 32-bit values per element."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = math.prod(shape) if shape else 1
    key = _key(sample_index, seed, epoch, stream)
    counter = torch.arange(n * per_element, device=key.device, dtype=torch.int64)
    h = _mix(key[:, None] ^ _mix(counter)[None, :])
    return h.view(key.shape[0], *shape, per_element)


def _to_unit(h: torch.Tensor) -> torch.Tensor:
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 2**24)


def uniform(sample_index: torch.Tensor, shape: Shape = (), *, seed: int, epoch: int = 0,
            stream: int = 0) -> torch.Tensor:
    """[B, *shape] float32 uniforms in (0, 1), on sample_index's device; row b depends only on
    (seed, epoch, stream, sample_index[b]) (Note [Counter-based sample numbers])."""
    return _to_unit(_bits(sample_index, shape, seed, epoch, stream, 1)).squeeze(-1)


def normal(sample_index: torch.Tensor, shape: Shape = (), *, seed: int, epoch: int = 0,
           stream: int = 0) -> torch.Tensor:
    """[B, *shape] float32 standard normals (Box-Muller), row b depending only on (seed, epoch,
    stream, sample_index[b]). Use another `stream` for each independent draw of a step."""
    u = _to_unit(_bits(sample_index, shape, seed, epoch, stream, 2))
    r = torch.sqrt(-2.0 * torch.log(u[..., 0]))
    return r * torch.cos((2.0 * math.pi) * u[..., 1])
