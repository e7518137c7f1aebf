"""The LeRobot-style baseline input pipeline, and the sampler shared with DataFusion.

Baseline = what a PyTorch user does today: a ``torch.utils.data.DataLoader`` whose workers open the
LMDB themselves, decode JPEGs with PIL and run torchvision transforms (RandomCrop of 0.95 of each
side -> Resize -> ToTensor -> optional GR00T colour jitter -> Normalize); then a processor in the main
process, serially with the training step, pads the tokens and builds the masks; then a synchronous
host-to-device copy. It yields the same dict as ``loongforge.DataFusionLoader`` with the same
normalization, and visits samples in the same order (it draws them from DataFusion's own sampler,
``_C.Sampler``), so both modes train the same model on the same data.
"""
from __future__ import annotations

import functools
import io
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch


def make_sampler(num_samples: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True, drop_last: bool = True) -> Any:
    """DataFusion's own sampler (``_C.Sampler``, src/data/sampler.cc): this rank's order per
    epoch. ValueError for bad arguments; ImportError naming the build when _C is missing."""
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(f"the baseline loader needs loongforge._C (its sampler): {e}; build "
                          "it with cmake (README)") from e
    return _C.Sampler(num_samples, batch_size, seed, rank, world_size, shuffle, drop_last)


def _c_reader(db_path: str) -> Any:
    """LoongForge's own LMDB reader (a plain key lookup; no python3-lmdb on the GPU machine)."""
    try:
        from . import _C
    except ImportError:
        return None
    cls = getattr(_C, "RecordReader", None)
    return None if cls is None else cls(db_path)


def read_schema(db_path: str) -> Dict[str, Any]:
    """The __schema__ record of a packed DB (FileNotFoundError / ValueError naming the DB)."""
    if not os.path.exists(os.path.join(db_path, "data.mdb")):
        raise FileNotFoundError(f"{db_path}: no LoongForge dataset (missing data.mdb)")
    reader = _c_reader(db_path)
    if reader is not None:
        return json.loads(reader.schema_json)
    import lmdb

    if not os.path.exists(os.path.join(db_path, "data.mdb")):
        raise FileNotFoundError(f"{db_path}: no LoongForge dataset (missing data.mdb)")
    env = lmdb.open(db_path, readonly=True, lock=False, readahead=False, subdir=True)
    try:
        with env.begin() as txn:
            raw = txn.get(b"__schema__")
    finally:
        env.close()
    if raw is None:
        raise ValueError(f"{db_path}: dataset is incomplete (no __schema__ record)")
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except ValueError as e:
        raise ValueError(f"{db_path}: __schema__ is not valid JSON: {e}") from e


def _stats(schema: Dict[str, Any], key: str, dim: int) -> Optional[np.ndarray]:
    v = schema.get(key) or []
    return np.asarray(v, dtype=np.float32) if len(v) == dim else None


class LmdbFrameDataset(torch.utils.data.Dataset):
    """One sample per index: PIL-decoded, torchvision-transformed camera images plus raw arrays.
    The LMDB environment is opened lazily in each worker process (never shared across fork)."""

    def __init__(self, db_path: str, image_size: int = 224, crop_fraction: float = 0.95,
                 color_jitter: bool = False, train: bool = True, normalize_state: bool = True,
                 mean: Sequence[float] = (0.5, 0.5, 0.5),
                 std: Sequence[float] = (0.5, 0.5, 0.5),
                 max_tokens: Optional[int] = None) -> None:
        import torchvision.transforms as T

        self.db_path = db_path
        self.max_tokens = max_tokens  # longer instructions are cut as they are read
        self.schema = read_schema(db_path)
        s = self.schema
        self.cameras: List[str] = list(s["cameras"])
        self.state_dim, self.action_dim = int(s["state_dim"]), int(s["action_dim"])
        self.horizon = int(s["action_horizon"])
        crop = (int(s["image_height"] * crop_fraction), int(s["image_width"] * crop_fraction))
        ops: List[Any] = [T.RandomCrop(crop) if train else T.CenterCrop(crop),
                          T.Resize((image_size, image_size)), T.ToTensor()]
        if color_jitter:  # GR00T's jitter on the [0, 1] tensor, fixed order (augment.py)
            from .augment import GrootColorJitter

            ops.append(GrootColorJitter())
        ops.append(T.Normalize(list(mean), list(std)))
        self.transform = T.Compose(ops)
        self.norm = None
        if normalize_state:
            sm, ss = _stats(s, "state_mean", self.state_dim), _stats(s, "state_std", self.state_dim)
            am, ast = (_stats(s, "action_mean", self.action_dim),
                       _stats(s, "action_std", self.action_dim))
            if all(x is not None for x in (sm, ss, am, ast)):
                # Constant dimensions (std ~ 0) stay centred, as DataFusion does.
                self.norm = (sm, np.where(ss > 1e-6, ss, 1.0).astype(np.float32),
                             am, np.where(ast > 1e-6, ast, 1.0).astype(np.float32))
        self._env = None
        self._pid = -1
        self.seed, self.epoch = 0, 0  # set by BaselineLoader before each epoch's workers start

    def __len__(self) -> int:
        return int(self.schema["num_samples"])

    def _reader(self) -> Any:
        """Opened lazily in each process: LMDB environments must not cross fork."""
        if self._env is None or self._pid != os.getpid():
            self._env = _c_reader(self.db_path)
            if self._env is None:
                import lmdb

                self._env = lmdb.open(self.db_path, readonly=True, lock=False, readahead=False,
                                      max_readers=512)
            self._pid = os.getpid()
        return self._env

    def _get(self, txn: Any, idx: int, modality: str) -> bytes:
        key = f"{idx:08d}_{modality}"
        v = txn.get(key) if txn is None else txn.get(key.encode())
        if v is None:
            raise KeyError(f"{self.db_path}: record '{key}' not found")
        return bytes(v)

    def _read(self, idx: int) -> "tuple[List[bytes], bytes, bytes, bytes, bytes]":
        env = self._reader()
        mods = [f"cam_{c}" for c in self.cameras] + ["tokens", "state", "action", "amask"]
        if hasattr(env, "schema_json"):  # _C.RecordReader: get(key) -> bytes
            vals = [self._c_get(env, idx, m) for m in mods]
        else:
            with env.begin(buffers=False) as txn:
                vals = [self._get(txn, idx, m) for m in mods]
        k = len(self.cameras)
        return vals[:k], vals[k], vals[k + 1], vals[k + 2], vals[k + 3]

    def _c_get(self, reader: Any, idx: int, modality: str) -> bytes:
        key = f"{idx:08d}_{modality}"
        try:
            return bytes(reader.get(key))
        except FileNotFoundError as e:
            raise KeyError(f"{self.db_path}: record '{key}' not found") from e

    def __getitem__(self, item: Any) -> Dict[str, torch.Tensor]:
        """item: a sample index, or (epoch, index) from the epoch-aware batch sampler (persistent
        workers keep a stale copy of self.epoch, so the epoch travels with the index)."""
        from PIL import Image

        epoch, idx = item if isinstance(item, tuple) else (self.epoch, int(item))
        jpegs, tok_b, state_b, action_b, amask_b = self._read(idx)
        tokens = np.frombuffer(tok_b, dtype="<i4")
        if self.max_tokens is not None:
            tokens = tokens[: self.max_tokens]
        state = np.frombuffer(state_b, dtype="<f4").copy()
        action = np.frombuffer(action_b, dtype="<f4").copy()
        amask = np.frombuffer(amask_b, dtype=np.uint8)
        # Per-sample augmentation seed (as DataFusion's SampleRng): crops do not depend on the worker
        # count or on where a resumed epoch starts.
        # fork_rng keeps the caller's global RNG untouched when there are no workers.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + epoch * 7919 + idx) & (2**63 - 1))
            images = torch.stack([self.transform(Image.open(io.BytesIO(j)).convert("RGB"))
                                  for j in jpegs])
        action = action.reshape(self.horizon, self.action_dim)
        if self.norm is not None:
            sm, ss, am, ast = self.norm
            state = (state - sm) / ss
            action = (action - am) / ast
        return {"images": images, "tokens": torch.from_numpy(tokens.astype(np.int64)),
                "state": torch.from_numpy(state), "action": torch.from_numpy(action),
                "action_mask": torch.from_numpy(amask.astype(bool)),
                "sample_index": torch.tensor(idx, dtype=torch.long)}


def _identity(samples: List[Dict[str, torch.Tensor]]) -> List[Dict[str, torch.Tensor]]:
    return samples


def process(samples: List[Dict[str, torch.Tensor]],
            token_pad: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """The main-process processor: stack, pad tokens (0) to the batch max or a fixed length."""
    lens = [int(s["tokens"].numel()) for s in samples]
    length = token_pad if token_pad else max(max(lens), 1)
    if max(lens) > length:
        raise ValueError(f"token sequence of {max(lens)} exceeds token_pad={length}")
    b = len(samples)
    tokens = torch.zeros(b, length, dtype=torch.long)
    mask = torch.zeros(b, length, dtype=torch.bool)
    for i, s in enumerate(samples):
        tokens[i, : lens[i]] = s["tokens"]
        mask[i, : lens[i]] = True
    return {"images": torch.stack([s["images"] for s in samples]), "tokens": tokens,
            "attention_mask": mask, "state": torch.stack([s["state"] for s in samples]),
            "action": torch.stack([s["action"] for s in samples]),
            "action_mask": torch.stack([s["action_mask"] for s in samples]),
            "sample_index": torch.stack([s["sample_index"] for s in samples])}


class _EpochBatches:
    """Batch sampler over (epoch, index) pairs in DataFusion's order; re-read on each iteration,
    so one DataLoader with persistent workers serves every epoch."""

    def __init__(self, owner: "BaselineLoader") -> None:
        self.owner = owner

    def __iter__(self) -> Iterator[List["tuple[int, int]"]]:
        o = self.owner
        e = o._epoch
        for b in range(o._start, o._len):
            yield [(e, i) for i in o.sampler.batch(e, b)]

    def __len__(self) -> int:
        return self.owner._len - self.owner._start


class BaselineLoader:
    """Iterable of model-ready batches with the DataFusionLoader interface (set_epoch, len,
    state_dict) over a torch DataLoader.

    Defaults are the LeRobot-style pipeline (processor in the main process, synchronous copy).
    ``tuned=True`` is the tuned-PyTorch pipeline: collate in the workers, persistent workers,
    prefetch_factor 4, pinned memory and non-blocking copies on CUDA."""

    def __init__(self, db_path: str, batch_size: int, *, image_size: int = 224,
                 crop_fraction: float = 0.95, color_jitter: bool = False, train: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 drop_last: bool = True, workers: int = 2, token_pad: Optional[int] = None,
                 device: str = "cpu", pin_memory: bool = False, normalize_state: bool = True,
                 tuned: bool = False, max_tokens: Optional[int] = None) -> None:
        self.dataset = LmdbFrameDataset(db_path, image_size, crop_fraction, color_jitter, train,
                                        normalize_state, max_tokens=max_tokens)
        self.schema = self.dataset.schema
        self.dataset.seed = seed
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle, self.drop_last, self.workers = shuffle, drop_last, workers
        self.token_pad, self.device = token_pad, torch.device(device)
        self.tuned = tuned
        self.pin_memory = pin_memory or (tuned and self.device.type == "cuda")
        self._epoch, self._start = 0, 0
        self.sampler = make_sampler(len(self.dataset), batch_size, seed, rank, world_size,
                                    shuffle, drop_last)
        self._len = self.sampler.batches_per_epoch
        self._dl: Optional[torch.utils.data.DataLoader] = None

    def __len__(self) -> int:
        return self._len

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch, self._start = int(epoch), 0

    def _loader(self) -> torch.utils.data.DataLoader:
        if self._dl is not None and self.tuned:
            return self._dl
        gen = torch.Generator()
        gen.manual_seed(self.seed * 1_000_003 + self._epoch * 7919 + self.rank)
        kw: Dict[str, Any] = {}
        if self.tuned:
            collate: Any = functools.partial(process, token_pad=self.token_pad)
            if self.workers > 0:
                kw.update(persistent_workers=True, prefetch_factor=4)
            kw["pin_memory"] = self.pin_memory
        else:
            collate = _identity  # the processor runs in the main process, serially
        self._dl = torch.utils.data.DataLoader(self.dataset, batch_sampler=_EpochBatches(self),
                                               num_workers=self.workers, collate_fn=collate,
                                               generator=gen, **kw)
        return self._dl

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        epoch, start = self._epoch, self._start
        self.dataset.epoch = epoch
        for i, item in enumerate(self._loader()):
            batch = item if self.tuned else process(item, self.token_pad)
            if self.device.type != "cpu":
                if self.pin_memory and not self.tuned:
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                # LeRobot-style: synchronous copy. Tuned: pinned + non_blocking.
                batch = {k: v.to(self.device, non_blocking=self.tuned)
                         for k, v in batch.items()}
            self._start = start + i + 1
            yield batch
        self._epoch, self._start = epoch + 1, 0

    def state_dict(self) -> Dict[str, int]:
        return {"seed": self.seed, "epoch": self._epoch, "next_batch": self._start,
                "batches_per_epoch": self._len}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError("loader state was saved with a different seed")
        self._epoch, self._start = int(state["epoch"]), int(state["next_batch"])

    def metrics(self) -> Dict[str, Any]:
        return {}
