"""DataFusion: model-ready robot-learning batches from a packed LMDB, decoded in C++.

``DataFusionLoader`` is an iterable of dicts of torch tensors. The tensors share memory with the
C++ batch buffers through DLPack (no copy); a buffer is recycled when its tensors are freed, so
keep a batch only as long as you need it (or ``.clone()`` what you keep).
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, Optional, Sequence, Union

import torch
from torch.utils.dlpack import from_dlpack

from . import _C

_BOOL_KEYS = ("attention_mask", "action_mask")
_TENSOR_KEYS = ("images", "tokens", "attention_mask", "state", "action", "action_mask", "sample_index")


class DataFusionLoader:
    """Deterministic, resumable, multi-threaded loader over a ``loongforge pack`` database.

    Args:
        db_path: the LMDB directory written by ``loongforge pack``.
        batch_size: samples per batch (per rank).
        image_size: output side (images are resized to image_size x image_size).
        crop_fraction: side fraction kept by the crop before the resize (GR00T uses 0.95).
        color_jitter: brightness 0.3 / contrast 0.4 / saturation 0.5 per sample.
        train: random crop offsets (True) or centre crop (False).
        seed, rank, world_size, shuffle, drop_last: the sampler; every rank gets the same number
            of batches and the order depends only on (seed, epoch, rank, world_size).
        threads: decode threads. prefetch: batches in flight.
        token_pad: 'batch_max' (pad to the longest in the batch) or a fixed length.
        on_corrupt: 'skip' (count, log, drop the sample) or 'error' (raise naming the record).
        device: 'cpu' or 'cuda' (batches are copied to the device with non_blocking=True from
            pinned buffers).
        pin_memory: page-locked buffers; default True when device is CUDA.
        normalize_state: normalize state/action with the dataset's mean/std.
        mean, std: image normalization per channel.
    """

    def __init__(
        self,
        db_path: str,
        batch_size: int,
        *,
        image_size: int = 224,
        crop_fraction: float = 0.95,
        color_jitter: bool = False,
        train: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        drop_last: bool = True,
        threads: int = 2,
        prefetch: int = 4,
        token_pad: Union[str, int] = "batch_max",
        on_corrupt: str = "skip",
        device: Union[str, torch.device] = "cpu",
        pin_memory: Optional[bool] = None,
        normalize_state: bool = True,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        timeout_s: float = 60.0,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("DataFusionLoader: device='cuda' but torch has no CUDA device")
        if pin_memory is None:
            pin_memory = self.device.type == "cuda"
        if token_pad == "batch_max":
            pad = 0
        elif isinstance(token_pad, int) and token_pad > 0:
            pad = token_pad
        else:
            raise ValueError(f"token_pad must be 'batch_max' or a positive int, got {token_pad!r}")
        self._impl = _C.DataLoader(
            str(db_path), batch_size=batch_size, image_size=image_size, crop_fraction=crop_fraction,
            color_jitter=color_jitter, train=train, seed=seed, rank=rank, world_size=world_size,
            shuffle=shuffle, drop_last=drop_last, threads=threads, prefetch=prefetch, token_pad=pad,
            on_corrupt=on_corrupt, pin_memory=bool(pin_memory), normalize_state=normalize_state,
            mean=list(mean), std=list(std), timeout_ms=int(timeout_s * 1000))
        self.db_path = str(db_path)
        self.batch_size = batch_size
        self.seed = seed
        self.schema: Dict[str, Any] = json.loads(self._impl.schema_json)
        self._epoch = 0
        self._start_batch = 0
        self._yielded = 0  # batches handed out in the current epoch (resume position)

    def __len__(self) -> int:
        return int(self._impl.batches_per_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration runs (as DistributedSampler.set_epoch)."""
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._start_batch = 0

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        epoch, start = self._epoch, self._start_batch
        self._impl.start(epoch, start)
        self._yielded = start
        try:
            while True:
                raw = self._impl.next()
                if raw is None:
                    break
                batch = {k: from_dlpack(raw[k]) for k in _TENSOR_KEYS}
                # Masks travel as uint8 (torch 1.13 has no DLPack bool); a dtype view is free.
                for k in _BOOL_KEYS:
                    batch[k] = batch[k].view(torch.bool)
                if self.device.type == "cuda":
                    batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                self._yielded = int(raw["index"]) + 1
                self._start_batch = self._yielded
                yield batch
        finally:
            self._impl.stop()
        # A completed epoch resumes at the start of the next one.
        self._epoch = epoch + 1
        self._start_batch = 0

    def state_dict(self) -> Dict[str, int]:
        """The position: the next batch the loader yields (exact mid-epoch resume)."""
        return {"seed": self.seed, "epoch": self._epoch, "next_batch": self._start_batch,
                "batches_per_epoch": len(self)}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"loader state was saved with seed {state['seed']}, this loader has "
                             f"seed {self.seed}: the order would differ")
        if int(state.get("batches_per_epoch", len(self))) != len(self):
            raise ValueError("loader state was saved with a different dataset/batch size/world size")
        self._epoch = int(state["epoch"])
        self._start_batch = int(state["next_batch"])

    def metrics(self) -> Dict[str, Any]:
        """Per-stage latency histograms (ms) and counters (images, batches, corrupt_skipped)."""
        return self._impl.metrics()

    @property
    def corrupt_skipped(self) -> int:
        return int(self._impl.corrupt_skipped)
