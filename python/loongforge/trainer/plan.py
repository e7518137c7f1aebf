"""What a run will do, decided before it is built: the LoongForge modules, token buckets and
whether the dense blocks are compiled."""
from __future__ import annotations

import argparse
from typing import Tuple

import torch


MODULES = ("datafusion", "nexussync", "vault", "memsculptor")


def auto_buckets(longest: int) -> tuple:
    """Token buckets from 16 up to the first that holds `longest` tokens, four per octave and
    multiples of 8 (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, ...): padding to a bucket
    costs at most a quarter of the text, and about an eighth on average. Powers of two cost up to
    a half: on the end-to-end data (text up to 49 tokens) they pad every batch to 64, 8% more step
    time at batch 64. Only buckets that batches actually reach are captured as graphs."""
    out, b = [], 16
    while b < longest:
        out.append(b)
        b += max(8, 1 << max(0, b.bit_length() - 3))
    return tuple(out + [b])


def _compile_blocks_wanted(args: argparse.Namespace, lf: bool, device: torch.device,
                           static: bool, moe: bool = False) -> Tuple[bool, str]:
    """(whether to compile the blocks, why not). --compile-blocks: on; or auto in loongforge
    mode on CUDA with torch >= 2.5 (where one compilation serves every layer of a kind, Note
    [Compiled blocks]), static shapes (token buckets or --token-pad: otherwise every text length
    would compile anew), a dense model and no other compile flag."""
    if args.compile_blocks != "auto":
        on = args.compile_blocks == "on"
        return on, "" if on else "--compile-blocks off"
    if not lf:
        return False, "auto is on in loongforge mode only"
    if device.type != "cuda":
        return False, "needs CUDA"
    if args.compile or args.compile_frozen:
        return False, "--compile or --compile-frozen compiles instead"
    if not static:
        return False, ("text lengths vary (no token buckets, no --token-pad): each would "
                       "compile anew")
    if getattr(args, "act_ckpt", "off") != "off":
        # checkpointed compiled blocks have not run on a GPU yet: on forces them
        return False, "with --act-ckpt only when asked (--compile-blocks on)"
    if moe:
        # a MoE model's dense blocks compiled around its eager (graphed) MoE layers have not run
        # on a GPU yet: on forces them
        return False, "for MoE models only when asked (--compile-blocks on)"
    try:
        major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    except ValueError:
        return False, f"cannot read torch's version {torch.__version__!r}"
    if (major, minor) < (2, 5):
        return False, f"needs torch >= 2.5 (this is {torch.__version__})"
    return True, ""
