"""The trainer's input: the loader of each mode (DataFusion, or the torch DataLoader of the
baseline and tuned modes) and the guard that keeps bad token ids and over-long text away from
the model."""
from __future__ import annotations

import argparse
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from .dist import Dist
from .errors import TrainError, _missing


def make_loader(args: argparse.Namespace, d: Dist, use_datafusion: bool,
                token_buckets: Sequence[int] = (), max_text_tokens: int = 0,
                tokenizer: Any = None) -> Any:
    """The input pipeline (DataFusion takes --action-horizon and the load-time `tokenizer`). max_text_tokens > 0: the dataset holds longer instructions than the
    model takes, and the loader cuts them to that many tokens as it reads them (token_buckets
    and --token-pad are then at most that long), so its buffers stay bounded."""
    from ..augment import loader_flags

    train, jitter = loader_flags(args.augment, args.no_augment)
    common = dict(image_size=args.image_size, crop_fraction=args.crop_fraction,
                  color_jitter=jitter, train=train, seed=args.seed,
                  rank=d.rank, world_size=d.world, shuffle=True, drop_last=True)
    if use_datafusion:
        try:
            from ..data import DataFusionLoader
        except ImportError as e:
            raise _missing("DataFusionLoader (loongforge.data)", "datafusion", e) from e
        gpu: Dict[str, Any] = {}
        if d.device.type == "cuda" and args.gpu_decode != "auto":
            gpu["gpu_decode"] = args.gpu_decode == "on"
        if token_buckets:
            gpu["token_buckets"] = list(token_buckets)
        token_pad: Any = args.token_pad if args.token_pad else "batch_max"
        if max_text_tokens:
            # DataFusion cuts only to a fixed length: the largest bucket, or a fixed pad.
            gpu["truncate_tokens"] = True
            if not token_buckets and not args.token_pad:
                token_pad = max_text_tokens
        if getattr(args, "action_horizon", None) is not None:
            gpu["action_horizon"] = args.action_horizon
        if tokenizer is not None:
            gpu["tokenizer"] = tokenizer
        if d.device.type == "cuda":
            # The torch modes' resizes are antialiased (PIL's bilinear, torchvision's
            # antialias=True): the same transform in every mode. DataFusion's CPU loader has no
            # antialias option; the CPU trainer is not a benchmark.
            gpu["antialias"] = True
        return DataFusionLoader(args.data, args.batch_size, threads=args.loader_threads, **gpu,
                                prefetch=args.prefetch, token_pad=token_pad,
                                device=str(d.device), **common)
    from ..trainer_data import BaselineLoader

    tuned = args.mode == "tuned"
    return BaselineLoader(args.data, args.batch_size, workers=args.workers,
                          token_pad=args.token_pad or None, device=str(d.device),
                          style="tuned" if tuned else "lerobot",
                          gpu_decode=tuned and args.gpu_decode != "off" and d.device.type == "cuda",
                          max_tokens=max_text_tokens or None, **common)


class TokenGuard:
    """Keeps token ids outside the model's vocabulary, and text longer than it takes, away from
    the model: an id >= vocab_size would index past the embedding table
    (an IndexError, or a device-side assert on CUDA), and unbounded text grows activations
    without bound.

    Text longer than ``max_tokens`` is cut (the loaders already cut what the schema announces;
    this catches records longer than the schema says), with a one-time warning. Ids are checked
    where the batch lives. On the CPU (``deferred=False``) at once: TrainError naming the record.
    On a GPU (``deferred=True``) without a host sync, since the step must not wait: bad ids are
    replaced by 0 (padding) on the device and the first offending sample is recorded in
    ``flag``, which the readback reads with the step's figures and turns into the same
    TrainError (``check_row``) at most two steps later."""

    def __init__(self, vocab_size: int, max_tokens: int, db: str,
                 warn: Callable[[str], None], deferred: bool) -> None:
        self.vocab, self.max_tokens, self.db, self.warn = vocab_size, max_tokens, db, warn
        self.deferred = deferred
        self.warned = False
        self.flag: Optional[torch.Tensor] = None  # device int64: 1 + first bad sample, or 0

    def __call__(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        tokens = batch["tokens"]
        if tokens.shape[1] > self.max_tokens:
            if not self.warned:
                self.warn(f"warning: {self.db}: a batch has {tokens.shape[1]} text tokens, more "
                          f"than the model's {self.max_tokens} (max_text_tokens); text is cut "
                          "to that length (shown once)")
                self.warned = True
            batch = dict(batch, tokens=tokens[:, : self.max_tokens],
                         attention_mask=batch["attention_mask"][:, : self.max_tokens])
            tokens = batch["tokens"]
        bad = (tokens < 0) | (tokens >= self.vocab)
        if not self.deferred:
            if bool(bad.any()):
                row = int(bad.any(1).nonzero()[0])
                self.raise_bad(int(batch["sample_index"][row]), int(tokens[row][bad[row]][0]))
            return batch
        bad_rows = bad.any(1)
        index = batch["sample_index"].to(bad_rows.device, torch.int64, non_blocking=True)
        first = torch.where(bad_rows, index + 1,
                            torch.zeros_like(bad_rows, dtype=torch.int64)).amax()
        self.flag = first if self.flag is None else torch.maximum(self.flag, first)
        return dict(batch, tokens=tokens.masked_fill(bad, 0))

    def check_row(self, row: Dict[str, Any]) -> None:
        """Raises for a readback row whose step saw a bad id (``row['bad_token_sample']``)."""
        sample = row.pop("bad_token_sample", 0)
        if sample > 0:
            self.raise_bad(sample - 1, None)

    def raise_bad(self, sample: int, token: Optional[int]) -> None:
        got = f"token id {token}" if token is not None else "a token id"
        raise TrainError(f"{self.db}: record '{sample:08d}_tokens' (sample {sample}) has {got} "
                         f"outside the model's vocabulary [0, {self.vocab}): the DB does not "
                         "match its schema's tokenizer, or the config's vocab_size is too small")
