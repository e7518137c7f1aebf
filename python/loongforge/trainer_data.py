"""The input pipelines of the trainer's torch modes, and the sampler shared with DataFusion.

Both are what a PyTorch user writes: a ``torch.utils.data.DataLoader`` whose workers open the LMDB
themselves and collate batches (token padding and masks included), pinned memory and a
non-blocking host-to-device copy, persistent workers, prefetch 4. That is LeRobot's own train
script (src/lerobot/scripts/lerobot_train.py at huggingface/lerobot 7427f31: pin_memory on CUDA,
the default collate in the workers, persistent_workers, prefetch_factor 4, ``cycle()`` over the
loader). The two styles differ where their users differ:

- ``style="lerobot"``: the workers decode the JPEGs with PIL and run torchvision's transforms
  (RandomCrop of 0.95 of each side -> Resize (antialiased) -> ToTensor -> optional GR00T colour
  jitter -> Normalize); each epoch starts a new iterator over the persistent workers, as
  ``cycle()`` does, so the first batches of an epoch wait for the workers to refill.
- ``style="tuned"`` with ``gpu_decode=True`` (CUDA): the workers read the JPEG bytes and draw the
  crop and jitter parameters; the main process decodes the batch on the GPU
  (``torchvision.io.decode_jpeg`` on a list, nvJPEG) and crops, resizes (antialiased), jitters
  and normalizes the whole batch there. Its batch sampler runs across epochs, so the workers keep
  prefetching through an epoch boundary. Without CUDA (or torchvision's GPU decode) it decodes as
  the lerobot style does.

Both yield the same dict as ``loongforge.DataFusionLoader`` with the same normalization, visit
samples in the same order (DataFusion's own sampler, ``_C.Sampler``) and draw each sample's crop
and jitter from (seed, epoch, sample index), so every mode trains the same model on the same data.
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
    return _C.Sampler(num_samples, batch_size, seed=seed, rank=rank, world_size=world_size,
                      shuffle=shuffle, drop_last=drop_last)


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
    ``decode="defer"``: the camera JPEGs' bytes (``jpegs``) and each camera's crop offset and
    jitter factors (``crop`` [cams, 2], ``jitter`` [cams, 4]) instead of images, drawn from the
    same per-sample seed in the same order as the PIL path draws them (:class:`GpuImages` applies
    them). The LMDB environment is opened lazily in each worker process (never shared across
    fork)."""

    def __init__(self, db_path: str, image_size: int = 224, crop_fraction: float = 0.95,
                 color_jitter: bool = False, train: bool = True, normalize_state: bool = True,
                 mean: Sequence[float] = (0.5, 0.5, 0.5),
                 std: Sequence[float] = (0.5, 0.5, 0.5),
                 max_tokens: Optional[int] = None, decode: str = "cpu") -> None:
        import torchvision.transforms as T

        if decode not in ("cpu", "defer"):
            raise ValueError(f"decode must be 'cpu' or 'defer', got {decode!r}")
        self.decode = decode
        self.train, self.color_jitter = train, color_jitter
        self.db_path = db_path
        self.max_tokens = max_tokens  # longer instructions are cut as they are read
        self.schema = read_schema(db_path)
        s = self.schema
        self.cameras: List[str] = list(s["cameras"])
        self.state_dim, self.action_dim = int(s["state_dim"]), int(s["action_dim"])
        self.horizon = int(s["action_horizon"])
        crop = (int(s["image_height"] * crop_fraction), int(s["image_width"] * crop_fraction))
        self.frame = (int(s["image_height"]), int(s["image_width"]))
        self.crop = crop
        # PIL's bilinear resize filters with a triangle of the scale's width (antialiased), as
        # the GPU paths (GpuImages, DataFusion's antialias option) do.
        ops: List[Any] = [T.RandomCrop(crop) if train else T.CenterCrop(crop),
                          T.Resize((image_size, image_size), antialias=True), T.ToTensor()]
        if color_jitter:  # GR00T's jitter on the [0, 1] tensor, fixed order (augment.py)
            from .augment import GrootColorJitter

            ops.append(GrootColorJitter())
        ops.append(T.Normalize(list(mean), list(std)))
        self.transform = T.Compose(ops)
        self._jitter = ops[3] if color_jitter else None
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
        out: Dict[str, Any] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + epoch * 7919 + idx) & (2**63 - 1))
            if self.decode == "cpu":
                out["images"] = torch.stack(
                    [self.transform(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs])
            else:
                out.update(self._draw_params(len(jpegs)))
                out["jpegs"] = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
        action = action.reshape(self.horizon, self.action_dim)
        if self.norm is not None:
            sm, ss, am, ast = self.norm
            state = (state - sm) / ss
            action = (action - am) / ast
        out.update({"tokens": torch.from_numpy(tokens.astype(np.int64)),
                    "state": torch.from_numpy(state), "action": torch.from_numpy(action),
                    "action_mask": torch.from_numpy(amask.astype(bool)),
                    "sample_index": torch.tensor(idx, dtype=torch.long)})
        return out

    def _draw_params(self, cameras: int) -> Dict[str, torch.Tensor]:
        """Each camera's crop offset and jitter factors, drawn from the global RNG in the order
        the PIL transform draws them (crop, then jitter, camera by camera)."""
        import torchvision.transforms as T

        h, w = self.frame
        th, tw = self.crop
        crop = torch.zeros(cameras, 2, dtype=torch.long)
        jitter = torch.zeros(cameras, 4)
        shape_only = torch.empty(()).expand(3, h, w)  # get_params reads the size only
        for c in range(cameras):
            if self.train:
                i, j, _, _ = T.RandomCrop.get_params(shape_only, (th, tw))
            else:  # torchvision's center_crop offsets
                i, j = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
            crop[c, 0], crop[c, 1] = i, j
            if self._jitter is not None:
                jitter[c] = torch.tensor(self._jitter.draw())
        return {"crop": crop, "jitter": jitter}


def process(samples: List[Dict[str, torch.Tensor]],
            token_pad: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """The collate function (run in the DataLoader's workers): stack, pad tokens (0) to the
    batch max or a fixed length; deferred JPEGs stay a flat list (sample-major)."""
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
    out: Dict[str, Any] = {"tokens": tokens, "attention_mask": mask}
    for k in ("images", "state", "action", "action_mask", "sample_index", "crop", "jitter"):
        if k in samples[0]:
            out[k] = torch.stack([s[k] for s in samples])
    if "jpegs" in samples[0]:  # sample-major, camera-minor: the GPU decodes them as one list
        out["jpegs"] = [j for s in samples for j in s["jpegs"]]
    return out


def gpu_decode_support(device: torch.device) -> Optional[str]:
    """None when torchvision can decode JPEGs on ``device`` (a list at once), else why not."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return "not a CUDA device"
    try:
        from torchvision.io import decode_jpeg
    except ImportError as e:
        return f"torchvision.io.decode_jpeg unavailable: {e}"
    import inspect

    if "device" not in inspect.signature(decode_jpeg).parameters:
        return "this torchvision's decode_jpeg has no device argument"
    return None


def _rgb_hsv() -> Any:
    """torchvision's batched RGB<->HSV conversions (the ones adjust_hue uses), or None."""
    try:
        from torchvision.transforms import _functional_tensor as ft
    except ImportError:
        try:  # torchvision < 0.15 names the module without the underscore
            from torchvision.transforms import functional_tensor as ft  # type: ignore
        except ImportError:
            return None
    pair = getattr(ft, "_rgb2hsv", None), getattr(ft, "_hsv2rgb", None)
    return pair if all(pair) else None


class GpuImages:
    """A batch's camera JPEGs -> model-ready images on the GPU: one batched nvJPEG decode
    (torchvision), each image's crop (offsets drawn in the workers), one antialiased bilinear
    resize of the whole batch, GR00T's colour jitter with per-image factors, Normalize.

    The jitter follows apply_jitter (torchvision's adjust_brightness, adjust_contrast,
    adjust_saturation, adjust_hue in that order) with each op's factor a per-image tensor, so the
    whole batch is a handful of kernels instead of a few dozen per image."""

    def __init__(self, device: torch.device, image_size: int, crop: "tuple[int, int]",
                 cameras: int, jitter: bool, mean: Sequence[float], std: Sequence[float]) -> None:
        self.device, self.size, self.crop, self.cameras = device, image_size, crop, cameras
        self.jitter = jitter
        self.mean = torch.tensor(list(mean), device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(list(std), device=device).view(1, 3, 1, 1)
        self.hsv = _rgb_hsv()
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __call__(self, jpegs: List[torch.Tensor], crop: torch.Tensor,
                 jitter: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        frames = self._decode(jpegs)
        th, tw = self.crop
        offsets = crop.reshape(-1, 2).tolist()  # host tensor from the workers: no device sync
        if len(offsets) != len(frames):
            raise ValueError(f"GPU decode: {len(frames)} frames for {len(offsets)} crops")
        x = torch.stack([f[:, i:i + th, j:j + tw] for f, (i, j) in zip(frames, offsets)])
        x = F.interpolate(x.float(), size=(self.size, self.size), mode="bilinear",
                          antialias=True, align_corners=False).div_(255.0).clamp_(0.0, 1.0)
        if self.jitter:
            x = self._jitter(x, jitter.reshape(-1, 4).to(self.device, non_blocking=True))
        x = (x - self.mean) / self.std
        return x.view(-1, self.cameras, 3, self.size, self.size)

    def _decode(self, jpegs: List[torch.Tensor]) -> List[torch.Tensor]:
        """Note [Decoding beside a step in flight]. torchvision allocates the decoded frames on
        the caller's current stream and writes them from its own stream, which waits for
        nothing. Without a host sync per step the current stream still runs the previous step
        when the next batch is decoded, and the allocator may hand out a block that step has
        freed but still uses: the decoder overwrites it (n16 turned to NaN by its third step).
        So the frames are allocated on a side stream of their own, whose blocks nothing else
        uses; the step's stream waits for it, and each frame is marked as used there."""
        from torchvision.io import ImageReadMode, decode_jpeg

        if self.side is None:
            return decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=self.device)
        main = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.side):
            frames = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=self.device)
        main.wait_stream(self.side)
        for f in frames:
            f.record_stream(main)
        return frames

    def _jitter(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        from .augment import apply_jitter

        if self.hsv is None:  # per image, torchvision's own ops
            return torch.stack([apply_jitter(im, *[float(v) for v in p])
                                for im, p in zip(x, f.tolist())])
        per = f.view(-1, 4, 1, 1, 1)
        b, c, s, h = per[:, 0], per[:, 1], per[:, 2], per[:, 3]
        x = (x * b).clamp_(0.0, 1.0)
        gray = (0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
        mean = gray.mean(dim=(-3, -2, -1), keepdim=True)
        x = (c * x + (1.0 - c) * mean).clamp_(0.0, 1.0)
        gray = (0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
        x = (s * x + (1.0 - s) * gray).clamp_(0.0, 1.0)
        rgb2hsv, hsv2rgb = self.hsv
        hsv = rgb2hsv(x)
        hue = torch.remainder(hsv[:, 0:1] + h, 1.0)
        return hsv2rgb(torch.cat([hue, hsv[:, 1:]], dim=1))


class _EpochBatches:
    """Batch sampler over (epoch, index) pairs in DataFusion's order, from the owner's position
    when iteration starts: one DataLoader with persistent workers serves every epoch. across:
    run on into the following epochs (the tuned style), so the workers prefetch through an
    epoch boundary; else stop at the epoch's end (a new iterator per epoch, as LeRobot's
    ``cycle()``)."""

    def __init__(self, owner: "BaselineLoader", across: bool) -> None:
        self.owner, self.across = owner, across

    def __iter__(self) -> Iterator[List["tuple[int, int]"]]:
        o = self.owner
        e, start = o._epoch, o._start
        while True:
            for b in range(start, o._len):
                yield [(e, i) for i in o.sampler.batch(e, b)]
            if not self.across:
                return
            e, start = e + 1, 0

    def __len__(self) -> int:
        return self.owner._len - self.owner._start


STYLES = ("lerobot", "tuned")


class BaselineLoader:
    """Iterable of model-ready batches with the DataFusionLoader interface (set_epoch, len,
    state_dict) over a torch DataLoader; ``style`` and ``gpu_decode`` as in the module's doc.
    Workers collate; with workers, they persist and prefetch 4 batches each; on CUDA the batches
    are pinned and copied without blocking."""

    def __init__(self, db_path: str, batch_size: int, *, image_size: int = 224,
                 crop_fraction: float = 0.95, color_jitter: bool = False, train: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 drop_last: bool = True, workers: int = 2, token_pad: Optional[int] = None,
                 device: str = "cpu", pin_memory: Optional[bool] = None,
                 normalize_state: bool = True, style: str = "lerobot",
                 gpu_decode: bool = False, max_tokens: Optional[int] = None) -> None:
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        self.device = torch.device(device)
        self.gpu_decode_reason = gpu_decode_support(self.device) if gpu_decode else "off"
        self.gpu = gpu_decode and self.gpu_decode_reason is None
        self.dataset = LmdbFrameDataset(db_path, image_size, crop_fraction, color_jitter, train,
                                        normalize_state, max_tokens=max_tokens,
                                        decode="defer" if self.gpu else "cpu")
        self.schema = self.dataset.schema
        self.dataset.seed = seed
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle, self.drop_last, self.workers = shuffle, drop_last, workers
        self.token_pad, self.style = token_pad, style
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        self._epoch, self._start = 0, 0
        self.sampler = make_sampler(len(self.dataset), batch_size, seed, rank, world_size,
                                    shuffle, drop_last)
        self._len = self.sampler.batches_per_epoch
        self._dl: Optional[torch.utils.data.DataLoader] = None
        self._it: Any = None  # the across-epoch iterator (tuned) and the position it is at
        self._it_at: "tuple[int, int]" = (-1, -1)
        self._images = (GpuImages(self.device, image_size, self.dataset.crop,
                                  len(self.dataset.cameras), color_jitter, (0.5,) * 3, (0.5,) * 3)
                        if self.gpu else None)

    def __len__(self) -> int:
        return self._len

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch, self._start = int(epoch), 0

    def settings(self) -> Dict[str, Any]:
        """The DataLoader's settings as this loader runs them (for reports and tests)."""
        dl = self._loader()
        return {"style": self.style, "num_workers": dl.num_workers,
                "persistent_workers": dl.persistent_workers,
                "prefetch_factor": dl.prefetch_factor if dl.num_workers else None,
                "pin_memory": dl.pin_memory, "collate_in_workers": dl.num_workers > 0,
                "non_blocking": self.device.type == "cuda",
                "across_epochs": self.style == "tuned",
                "decode": "gpu (torchvision nvJPEG)" if self.gpu else "cpu (PIL)",
                "gpu_decode_reason": self.gpu_decode_reason}

    def _loader(self) -> torch.utils.data.DataLoader:
        if self._dl is not None:
            return self._dl
        gen = torch.Generator()
        gen.manual_seed(self.seed * 1_000_003 + self.rank)
        kw: Dict[str, Any] = {}
        if self.workers > 0:
            kw.update(persistent_workers=True, prefetch_factor=4)
        self._dl = torch.utils.data.DataLoader(
            self.dataset, batch_sampler=_EpochBatches(self, across=self.style == "tuned"),
            num_workers=self.workers, collate_fn=functools.partial(process,
                                                                   token_pad=self.token_pad),
            pin_memory=self.pin_memory, generator=gen, **kw)
        return self._dl

    def _to_device(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        jpegs, crop, jitter = batch.pop("jpegs", None), batch.pop("crop", None), \
            batch.pop("jitter", None)
        if self.device.type != "cpu":
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        if jpegs is not None:
            batch["images"] = self._images(jpegs, crop, jitter)
        return batch

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        epoch, start = self._epoch, self._start
        self.dataset.epoch = epoch
        if self.style == "tuned":
            if self._it is None or self._it_at != (epoch, start):
                self._it = iter(self._loader())  # a fresh sampler position
            self._it_at = (epoch, start)
            for b in range(start, self._len):
                item = next(self._it)
                self._it_at = (epoch, b + 1) if b + 1 < self._len else (epoch + 1, 0)
                self._start = b + 1
                yield self._to_device(item)
        else:
            for i, item in enumerate(self._loader()):
                self._start = start + i + 1
                yield self._to_device(item)
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
