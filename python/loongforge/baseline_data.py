"""The LeRobot-style baseline input pipeline, for side-by-side comparisons.

A torch ``DataLoader`` over the same packed LMDB: PIL JPEG decode and torchvision transforms
(RandomCrop 0.95 -> Resize -> optional ColorJitter -> ToTensor -> Normalize) in worker processes,
and the processor step (token padding, masks) in the main process, as LeRobot/GR00T pipelines do.
It yields the same dict as :class:`loongforge.DataFusionLoader` so both feed the same model.
"""
from __future__ import annotations

import io
import json
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class LmdbFramesDataset(Dataset):
    """Reads one sample's records from a ``loongforge pack`` LMDB and transforms it with PIL."""

    def __init__(self, db_path: str, image_size: int = 224, crop_fraction: float = 0.95,
                 train: bool = True, color_jitter: bool = False, normalize_state: bool = True,
                 mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5)):
        from . import _C
        self.db_path = db_path
        # Raw record bytes come through LoongForge's LMDB reader (a plain key lookup); decoding
        # and transforms are PIL/torchvision, as in the pipelines being compared against.
        self.schema: Dict[str, Any] = json.loads(_C.RecordReader(db_path).schema_json)
        self.image_size = image_size
        self.crop_fraction = crop_fraction
        self.train = train
        self.color_jitter = color_jitter
        self.normalize_state = normalize_state
        self.mean, self.std = list(mean), list(std)
        self._reader = None  # opened lazily in each worker process (LMDB envs must not cross fork)
        self._tf = None

    def __len__(self) -> int:
        return int(self.schema["num_samples"])

    def _transforms(self):
        from torchvision import transforms as T
        w, h = self.schema["image_width"], self.schema["image_height"]
        crop = (int(h * self.crop_fraction), int(w * self.crop_fraction))
        tf: List[Any] = [T.RandomCrop(crop) if self.train else T.CenterCrop(crop),
                         T.Resize((self.image_size, self.image_size))]
        if self.color_jitter:
            tf.append(T.ColorJitter(brightness=0.3, contrast=0.4, saturation=0.5))
        tf += [T.ToTensor(), T.Normalize(self.mean, self.std)]
        return T.Compose(tf)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        from PIL import Image
        from . import _C
        if self._reader is None:
            self._reader = _C.RecordReader(self.db_path)
            self._tf = self._transforms()
        sc = self.schema
        key = f"{i:08d}_"
        def get(mod: str) -> bytes:
            return self._reader.get(key + mod)

        images = [self._tf(Image.open(io.BytesIO(get("cam_" + c))).convert("RGB"))
                  for c in sc["cameras"]]
        tokens = np.frombuffer(get("tokens"), dtype="<i4").astype(np.int64)
        state = np.frombuffer(get("state"), dtype="<f4").copy()
        action = np.frombuffer(get("action"), dtype="<f4").copy().reshape(
            sc["action_horizon"], sc["action_dim"])
        amask = np.frombuffer(get("amask"), dtype=np.uint8).astype(bool)
        if self.normalize_state and sc.get("state_std"):
            sstd = np.where(np.array(sc["state_std"]) > 1e-6, sc["state_std"], 1.0)
            astd = np.where(np.array(sc["action_std"]) > 1e-6, sc["action_std"], 1.0)
            state = (state - np.array(sc["state_mean"])) / sstd
            action = (action - np.array(sc["action_mean"])) / astd
        return {"images": torch.stack(images), "tokens": tokens,
                "state": torch.from_numpy(state.astype(np.float32)),
                "action": torch.from_numpy(action.astype(np.float32)),
                "action_mask": torch.from_numpy(amask), "sample_index": i}


def pad_collate(samples: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """The 'processor': pads token ids to the batch max and builds the attention mask."""
    n = max(len(s["tokens"]) for s in samples)
    tokens = torch.zeros(len(samples), n, dtype=torch.int64)
    mask = torch.zeros(len(samples), n, dtype=torch.bool)
    for i, s in enumerate(samples):
        t = torch.from_numpy(s["tokens"])
        tokens[i, : len(t)] = t
        mask[i, : len(t)] = True
    return {
        "images": torch.stack([s["images"] for s in samples]),
        "tokens": tokens, "attention_mask": mask,
        "state": torch.stack([s["state"] for s in samples]),
        "action": torch.stack([s["action"] for s in samples]),
        "action_mask": torch.stack([s["action_mask"] for s in samples]),
        "sample_index": torch.tensor([s["sample_index"] for s in samples], dtype=torch.int64),
    }


def _list_collate(samples: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return samples


class BaselineLoader:
    """torch DataLoader (PIL + torchvision in workers), collate/padding in the main process."""

    def __init__(self, db_path: str, batch_size: int, *, workers: int = 2, seed: int = 0,
                 rank: int = 0, world_size: int = 1, shuffle: bool = True, drop_last: bool = True,
                 pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: Optional[int] = None, **dataset_kw: Any) -> None:
        self.dataset = LmdbFramesDataset(db_path, **dataset_kw)
        self.schema = self.dataset.schema
        self.sampler = torch.utils.data.distributed.DistributedSampler(
            self.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last)
        kw: Dict[str, Any] = {}
        if workers > 0:
            kw["persistent_workers"] = persistent_workers
            if prefetch_factor is not None:
                kw["prefetch_factor"] = prefetch_factor
        # Workers decode and transform; the list collate leaves the processor to the main process.
        self.loader = DataLoader(self.dataset, batch_size=batch_size, sampler=self.sampler,
                                 num_workers=workers, collate_fn=_list_collate,
                                 drop_last=drop_last, pin_memory=False, **kw)
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        for samples in self.loader:
            batch = pad_collate(samples)
            if self.pin_memory:
                batch = {k: v.pin_memory() for k, v in batch.items()}
            yield batch
