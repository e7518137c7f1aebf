"""DataFusion: model-ready robot-learning batches from a packed LMDB, decoded in C++.

``DataFusionLoader`` is an iterable of dicts of torch tensors (and ``task``, a list of str, where
the DB stores task text). The tensors share memory with the
C++ batch buffers through DLPack (no copy); a buffer is recycled when its tensors are freed, so
keep a batch only as long as you need it (or ``.clone()`` what you keep).

With ``device='cuda'`` and a build with nvJPEG, decoding and the image transform run on the GPU
(nvJPEG batched decode, hardware JPEG engine where the GPU has one, one fused kernel) and the
batches are CUDA tensors from the start; otherwise the CPU pipeline runs and batches are copied
with ``non_blocking=True``. ``metrics()['decode_backend']`` / ``['hw_decode']`` / ``['reason']``
say which ran and why.
"""
from __future__ import annotations

import json
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
from torch.utils.dlpack import from_dlpack

from . import _C, _cuda_env, lerobot_format, text

# DBs whose lack of task text was already warned about (once per process and DB).
_NO_TASK_NOTED: set = set()
_BOOL_KEYS = ("attention_mask", "action_mask")
_TENSOR_KEYS = ("images", "tokens", "attention_mask", "state", "action", "action_mask", "sample_index")


def loader_options() -> Dict[str, Any]:
    """Every loader option (the fields of C++ ``LoaderOptions``) and its default."""
    return dict(_C.loader_options())


class DataFusionBatch(dict):
    """A batch: a dict of tensors (keys as before) and, where the DB stores task text, ``task``:
    a list of str, one per row ("" for padding rows; Note [Task text] in src/data/loader.cc); plus
    what a trainer keys CUDA graphs and memory plans on.

    Attributes:
        bucket: index into the loader's ``token_buckets`` (static shapes), else -1.
        shape_key: ``(rows, cameras, tokens_len, horizon)``; with static shapes one of the
            loader's ``shape_keys``.
        size: real samples; rows ``size..rows-1`` are padding (static shapes, corrupt samples
            skipped): zero, masks off, ``sample_index`` -1.
        epoch, index: the batch's position.
        held_by: where the batch was when it was asked for: "ready", "device", "decode",
            "read" or "buffers" (Note [Held by] in src/data/loader.cc); wait_ms: how long the
            loader's Next() waited for it.
    """

    bucket: int = -1
    shape_key: Tuple[int, int, int, int] = (0, 0, 0, 0)
    size: int = 0
    epoch: int = 0
    index: int = 0
    held_by: str = "ready"
    wait_ms: float = 0.0


class DataFusionLoader:
    """Deterministic, resumable, multi-threaded loader over a ``loongforge pack`` database.

    The loader's options are declared once, in C++ (``LoaderOptions`` in
    include/loongforge/loader.h, documented in docs/data.md); ``loader_options()`` lists every one
    with its default. Pass any of them by keyword: an unknown name raises TypeError naming it, a bad
    value ValueError naming the option. The most used: ``image_size`` (N or (H, W)),
    ``crop_fraction``, ``color_jitter``, ``train``; the sampler's ``seed``, ``rank``, ``world_size``, ``shuffle``,
    ``drop_last``; ``threads`` (decode threads), ``prefetch`` (batches in flight); static batches:
    ``token_buckets`` (every batch has ``batch_size`` rows, tokens padded to the smallest
    bucket >= its longest instruction; batches carry ``.bucket`` / ``.shape_key``), ``static_shapes``,
    ``truncate_tokens``; ``on_corrupt`` ('skip' or 'error'); ``normalize_state``, ``mean``, ``std``;
    on the GPU ``hw_decode``, ``hw_decode_ratio`` and the tuning options of docs/data.md.

    The arguments below are this torch adapter's own (they are not C++ options as such).

    Args:
        db_path: the LMDB directory written by ``loongforge pack``.
        batch_size: samples per batch (per rank).
        device: 'cpu' or 'cuda[:N]'. CUDA: the GPU loader when the build has nvJPEG (see
            gpu_decode), else the CPU loader and a non_blocking copy from pinned buffers.
        gpu_decode: None (GPU loader when available, else fall back and say why in metrics()),
            True (require it: RuntimeError naming the reason if unavailable), False (CPU loader).
        pin_memory: page-locked buffers; default True when device is CUDA.
        token_pad: 'batch_max' (pad to the longest in the batch) or a fixed length.
        layout: 'NCHW' (images [B, cams, 3, H, W]) or 'NHWC' ([B, cams, H, W, 3]).
        dtype: image dtype, torch.float32 or torch.bfloat16 (or its name, 'bfloat16'/'bf16'),
            normalized by mean/std; or torch.uint8: the decoded, cropped, resized (and jittered)
            pixels 0..255 without normalization (written by the CPU loader; with device='cuda'
            the CPU loader runs and batches are copied).
        antialias: GPU loader only: triangle-filter downscaling (ignored with a warning on CPU).
        timeout_s: every wait inside the pipeline, in seconds (> 0; there is no "no timeout").
        format: the batch contract. 'loongforge' (default): the keys above, state and action
            normalized as ``normalize`` says, the action chunk the DB was packed with.
            'lerobot' (a DB packed from LeRobot): ``LeRobotDataset``'s keys and raw values
            (loongforge.lerobot_format; docs/data.md, "Batch formats"), with the frames at their
            stored size, uncropped, in [0, 1] unless image_size, crop_fraction, mean or std say
            otherwise, and ``loader.meta`` as ``LeRobotDataset.meta``.
        delta_timestamps: format 'lerobot' only: {key: [seconds, ...]} for
            ``observation.state``, ``action`` and camera keys, as LeRobot's, with its padding
            at episode edges (``<key>_is_pad``); chosen at load time, no repack.
        tolerance_s: how far an offset may lie off the fps grid (LeRobot's default 1e-4 s).
            'groot' (a DB packed from LeRobot with GR00T's modality.json): GR00T's
            ``state.<name>``, ``action.<name>``, ``video.<name>`` and ``annotation.<name>``
            keys, each with a time axis (loongforge.lerobot_format.GrootContract).
        delta_indices: format 'groot' only: {group or key: [frame offsets]} as GR00T's
            ModalityConfig (default [0] for every key), with its "first_last" padding.
        normalize_modes: format 'groot' only: {state/action key: 'min_max' | 'q99' |
            'mean_std' | 'none'} as GR00T's StateActionTransform (default: raw).
        action_horizon: format 'loongforge' on a DB packed from LeRobot: the action chunk's
            length chosen at load time (``action`` [B, H, A], ``action_mask`` [B, H]), gathered
            from the stored per-frame rows and normalized as ``normalize`` says; None: the
            chunk the DB was packed with.
        transform: a callable batch -> batch run on every batch (and every ``dataset[i]``
            item, as a batch of one) after decode, format and tokenizer, on the batch's device:
            CUDA tensors with the GPU loader, so a GPU augmentation runs there. What it returns
            is what the loop gets (a dict; its attributes are kept where it returns the same
            batch object). It runs on the consumer's thread, in order.
        tokenizer: token ids computed from the batch's task text when it is handed out
            (loongforge.text): a built-in tokenizer's name ('byte-v1'), the path of a Hugging
            Face tokenizer.json (needs the ``tokenizers`` package), or a callable text -> ids.
            They replace the packed ``tokens``/``attention_mask`` (format 'loongforge') or come
            as ``observation.language.tokens``/``observation.language.attention_mask`` (format
            'lerobot'), padded as ``token_pad``/``token_buckets`` say with the tokenizer's pad
            id. None (default): the ids packed with the DB ('loongforge'), none ('lerobot').
        **options: any other loader option (above).
    """

    # Options this adapter sets itself, and what to pass instead.
    _OWN = {"db_path": "db_path", "device_id": "device='cuda:N'", "timeout_ms": "timeout_s"}

    def __init__(
        self,
        db_path: str,
        batch_size: int,
        *,
        device: Union[str, torch.device] = "cpu",
        gpu_decode: Optional[bool] = None,
        pin_memory: Optional[bool] = None,
        token_pad: Union[str, int] = "batch_max",
        layout: str = "NCHW",
        dtype: Union[torch.dtype, str] = torch.float32,
        antialias: bool = False,
        timeout_s: float = 60.0,
        format: str = "loongforge",
        delta_timestamps: Optional[Dict[str, Any]] = None,
        tolerance_s: float = lerobot_format.DEFAULT_TOLERANCE_S,
        tokenizer: Any = None,
        delta_indices: Optional[Dict[str, Any]] = None,
        normalize_modes: Optional[Dict[str, str]] = None,
        transform: Optional[Any] = None,
        action_horizon: Optional[int] = None,
        **options: Any,
    ) -> None:
        known = loader_options()
        if format not in ("loongforge", "lerobot", "groot"):
            raise ValueError(f"DataFusionLoader: format must be 'loongforge', 'lerobot' or "
                             f"'groot', got {format!r}")
        if (delta_indices is not None or normalize_modes is not None) and format != "groot":
            raise ValueError("DataFusionLoader: delta_indices and normalize_modes need "
                             "format='groot'")
        if delta_timestamps is not None and format != "lerobot":
            raise ValueError("DataFusionLoader: delta_timestamps needs format='lerobot' (the "
                             "'loongforge' format's action chunk is the one the DB was packed "
                             "with)")
        for k in options:
            if k in self._OWN:
                raise TypeError(f"DataFusionLoader: pass {self._OWN[k]} instead of {k!r}")
            if k not in known:
                raise TypeError(f"DataFusionLoader() got an unknown loader option {k!r} "
                                f"(known: {', '.join(sorted(known))})")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("DataFusionLoader: device='cuda' but torch has no CUDA device")
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
        # The C++ loader decides which image dtypes it writes (ValueError naming 'dtype' else).
        self.layout, self.dtype = layout, getattr(torch, _C.loader_image_dtype(dtype))
        self._gpu = False
        self._fallback_reason: Optional[str] = None
        stage_kwargs: Dict[str, Any] = {}
        if self.device.type == "cuda":
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            ok, why = _C.gpu_loader_support(self.device.index)
            if ok and self.dtype == torch.uint8:
                ok, why = False, "dtype=uint8 is written by the CPU loader only"
            if ok and options.get("resize") == "pad":
                ok, why = False, "resize='pad' is written by the CPU loader only"
            if gpu_decode is False:
                self._fallback_reason = "gpu_decode=False"
            elif ok:
                self._gpu = True
            elif gpu_decode:
                raise RuntimeError(f"DataFusionLoader: GPU loader unavailable: {why}")
            else:
                self._fallback_reason = why
        if self._gpu:
            queue_warning = _cuda_env.loader_queue_warning()  # Note [Hardware queues]
            if queue_warning:
                warnings.warn("DataFusionLoader: " + queue_warning)
            # The CPU loader writes float32 NCHW only: elsewhere this adapter converts.
            stage_kwargs = dict(device="cuda", device_id=self.device.index, layout=layout,
                              dtype=self.dtype, antialias=antialias)
        else:
            if antialias:
                warnings.warn("DataFusionLoader: antialias needs the GPU loader; ignored "
                              f"({self._fallback_reason or 'device=cpu'})")
            # The CPU loader writes float32 (converted below to bfloat16) or uint8 itself.
            if self.dtype == torch.uint8:
                stage_kwargs = dict(dtype=self.dtype)
        if pin_memory is None:
            pin_memory = self.device.type == "cuda"
        if token_pad == "batch_max":
            pad = 0
        elif isinstance(token_pad, int) and token_pad > 0:
            pad = token_pad
        else:
            raise ValueError(f"token_pad must be 'batch_max' or a positive int, got {token_pad!r}")
        if options.get("token_buckets") is None:
            options.pop("token_buckets", None)
        else:
            options["token_buckets"] = [int(b) for b in options["token_buckets"]]
        for k in ("mean", "std"):
            if k in options:
                options[k] = [float(x) for x in options[k]]
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
                not timeout_s > 0 or timeout_s * 1000 > 2**62:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self._closed = False
        # A load-time tokenizer pads its own ids: the packed ids' padding is not asked of C++
        # (it would check the packed lengths), only fixed rows where buckets make them static.
        self._own_buckets: Optional[List[int]] = None
        self._own_truncate = False
        if tokenizer is not None:
            self._own_buckets = list(_C.sort_token_buckets(options.pop("token_buckets", None) or []))
            self._own_truncate = bool(options.pop("truncate_tokens", False))
            if self._own_buckets:
                options["static_shapes"] = True
        if format in ("lerobot", "groot"):
            schema = json.loads(_C.RecordReader(str(db_path)).schema_json)
            lerobot_format.LeRobotMeta(str(db_path), schema)  # ValueError: not from LeRobot
            # LeRobot's frames: stored size, whole, float in [0, 1], unless the caller says.
            options.setdefault("image_size", (int(schema["image_height"]),
                                              int(schema["image_width"])))
            options.setdefault("crop_fraction", 1.0)
            options.setdefault("mean", [0.0, 0.0, 0.0])
            options.setdefault("std", [1.0, 1.0, 1.0])
        self._impl = _C.DataLoader(str(db_path), batch_size=batch_size,
                                   token_pad=0 if tokenizer is not None else pad,
                                   pin_memory=bool(pin_memory), timeout_ms=int(timeout_s * 1000),
                                   **options, **stage_kwargs)
        self.db_path = str(db_path)
        if not self._impl.has_task_text and self.db_path not in _NO_TASK_NOTED:
            _NO_TASK_NOTED.add(self.db_path)
            warnings.warn(f"DataFusionLoader: {self.db_path} stores no task text (packed before "
                          "'pack' wrote it, or synthetic); its batches have no 'task' (repack "
                          "it with loongforge pack to get it)")
        self.batch_size = batch_size
        self.seed = int(options.get("seed", known["seed"]))
        self.schema: Dict[str, Any] = json.loads(self._impl.schema_json)
        self._cameras = len(self.schema.get("cameras", []))
        self._horizon = int(self.schema.get("action_horizon", 0))
        self._epoch = 0
        self._start_batch = 0
        self._yielded = 0  # batches handed out in the current epoch (resume position)
        self.format = format
        if transform is not None and not callable(transform):
            raise TypeError(f"DataFusionLoader: transform must be callable (batch -> batch), got "
                            f"{type(transform).__name__}")
        self._transform = transform
        self._horizon_contract: Optional[lerobot_format.HorizonContract] = None
        if action_horizon is not None:
            if format != "loongforge":
                raise ValueError("DataFusionLoader: action_horizon is the 'loongforge' format's "
                                 "(format 'lerobot' takes delta_timestamps, 'groot' delta_indices)")
            self._horizon_contract = lerobot_format.HorizonContract(
                self.db_path, self.schema, self.device, action_horizon,
                str(options.get("normalize", known["normalize"])),
                bool(options.get("normalize_state", known["normalize_state"])))
            self._horizon = action_horizon
        self._tokenizer = None if tokenizer is None else text.LoadTimeTokenizer(tokenizer)
        if self._tokenizer is not None and not self._impl.has_task_text:
            raise ValueError(f"DataFusionLoader: tokenizer= needs the task text, which "
                             f"{self.db_path} does not store (repack it with loongforge pack)")
        self._token_pad = pad or None
        self._meta: Optional[lerobot_format.LeRobotMeta] = None
        self._contract: Optional[lerobot_format.LeRobotContract] = None
        if format == "lerobot":
            self._contract = lerobot_format.LeRobotContract(
                self.db_path, self.schema, self.device, layout, delta_timestamps, tolerance_s)
            self._meta = self._contract.meta
        elif format == "groot":
            self._contract = lerobot_format.GrootContract(
                self.db_path, self.schema, self.device, layout, delta_indices, normalize_modes)
            self._meta = self._contract.meta

    @property
    def meta(self) -> lerobot_format.LeRobotMeta:
        """``LeRobotDataset.meta`` of a DB packed from LeRobot: fps, camera keys, stats,
        episodes, tasks (ValueError naming the DB for any other)."""
        if self._meta is None:
            self._meta = lerobot_format.LeRobotMeta(self.db_path, self.schema)
        return self._meta

    def __len__(self) -> int:
        return int(self._impl.batches_per_epoch)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration runs (as DistributedSampler.set_epoch)."""
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._start_batch = 0

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        if self._closed:
            raise RuntimeError(f"DataFusionLoader({self.db_path!r}) was closed: create a new "
                               "loader to iterate again")
        epoch, start = self._epoch, self._start_batch
        self._impl.start(epoch, start)
        self._yielded = start
        # CPU loader + CUDA: the host batch of the last non_blocking copy and its event; the host
        # buffer returns to the loader's pool (and is rewritten) only after the copy has run.
        in_flight = None
        completed = False
        try:
            while True:
                if self._gpu:
                    # Batches released from here on are rewritten only after this stream's
                    # queued work (Note [GPU loader] in src/data/loader_gpu_stage.cc).
                    self._impl.set_consumer_stream(torch.cuda.current_stream(self.device))
                raw = self._impl.next()
                if in_flight is not None:
                    in_flight[1].synchronize()
                    in_flight = None
                if raw is None:
                    completed = True
                    break
                batch, host = self._wrap(raw, non_blocking=True)
                if host is not None:
                    event = torch.cuda.Event()
                    event.record()
                    in_flight = (host, event)
                self._yielded = int(raw["index"]) + 1
                self._start_batch = self._yielded
                yield batch
        finally:
            # A finished epoch leaves the pipeline prefetching the next one (the C++ loader keeps
            # it if the next epoch starts at batch 0); an abandoned one is stopped.
            if not completed:
                self._impl.stop()
        # A completed epoch resumes at the start of the next one.
        self._epoch = epoch + 1
        self._start_batch = 0

    def _wrap(self, raw: Dict[str, Any], non_blocking: bool, contract: bool = True
              ) -> Tuple[DataFusionBatch, Optional[DataFusionBatch]]:
        """A batch dict of the C++ loader as this adapter's batch (device, layout, dtype, and
        the format's keys unless `contract` is False), and the host batch a non_blocking copy
        still reads (None when nothing was copied)."""
        batch = DataFusionBatch((k, from_dlpack(raw[k])) for k in _TENSOR_KEYS)
        # Masks travel as uint8 (torch 1.13 has no DLPack bool); a dtype view is free.
        for k in _BOOL_KEYS:
            batch[k] = batch[k].view(torch.bool)
        host = None
        if self.device.type == "cuda" and not self._gpu:
            host = batch
            batch = DataFusionBatch(
                (k, v.to(self.device, non_blocking=non_blocking)) for k, v in host.items())
            if self.layout == "NHWC":
                batch["images"] = batch["images"].permute(0, 1, 3, 4, 2).contiguous()
            if self.dtype != torch.float32:
                batch["images"] = batch["images"].to(self.dtype)
        elif self.device.type == "cpu" and self.layout == "NHWC":
            batch["images"] = batch["images"].permute(0, 1, 3, 4, 2).contiguous()
        if self.device.type == "cpu" and self.dtype != torch.float32:
            batch["images"] = batch["images"].to(self.dtype)
        batch.bucket, batch.size = int(raw["bucket"]), int(raw["size"])
        batch.epoch, batch.index = int(raw["epoch"]), int(raw["index"])
        batch.held_by, batch.wait_ms = str(raw["held_by"]), float(raw["wait_ms"])
        batch.shape_key = (int(raw["rows"]), self._cameras, int(raw["tokens_len"]),
                           self._horizon)
        if "task" in raw:  # Note [Task text] in src/data/loader.cc
            batch["task"] = list(raw["task"])
        if contract and self._horizon_contract is not None:
            self._horizon_contract.convert(batch)
        if contract and self._tokenizer is not None:
            tokens, mask = self._tokenizer.batch(
                batch["task"], batch["sample_index"] >= 0, self._token_pad, self.token_buckets,
                self._own_truncate, batch["tokens"].device)
            batch["tokens"], batch["attention_mask"] = tokens, mask
            if self.token_buckets:
                batch.bucket = self.token_buckets.index(int(tokens.shape[1]))
            batch.shape_key = batch.shape_key[:2] + (int(tokens.shape[1]),) + batch.shape_key[3:]
        if contract and self._contract is not None:
            converted = DataFusionBatch(self._contract.convert(batch, self._frames))
            converted.__dict__.update(batch.__dict__)
            if self._tokenizer is not None:
                converted["observation.language.tokens"] = batch["tokens"]
                converted["observation.language.attention_mask"] = batch["attention_mask"]
            batch = converted
        if contract and self._transform is not None:
            out = self._transform(batch)
            if not isinstance(out, dict):
                raise TypeError(f"DataFusionLoader: transform returned "
                                f"{type(out).__name__}, not a dict batch")
            if not isinstance(out, DataFusionBatch):
                kept = DataFusionBatch(out)
                kept.__dict__.update(batch.__dict__)
                out = kept
            batch = out
        return batch, host

    def _frames(self, ids: torch.Tensor) -> torch.Tensor:
        """The camera frames [N, cams, ...] of sample ids [N] in epoch 0, decoded one sample at
        a time by the map-style path (history frames of delta_timestamps)."""
        got: Dict[int, torch.Tensor] = {}
        for i in ids.tolist():
            if i not in got:
                raw = self._impl.get_sample(int(i), 0)
                got[i] = self._wrap(raw, non_blocking=False, contract=False)[0]["images"][0].clone()
        return torch.stack([got[i] for i in ids.tolist()])

    @property
    def dataset(self) -> "DataFusionDataset":
        """Map-style view of the DB: ``loader.dataset[i]`` is sample ``i`` as one row of a batch
        (see :class:`DataFusionDataset`)."""
        return DataFusionDataset(self)

    def close(self) -> None:
        """Stops the pipeline threads (a finished epoch leaves them prefetching the next one).
        Iterating after close() raises RuntimeError; batches already handed out stay valid."""
        self._closed = True
        self._impl.stop()

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
        """Per-stage latency histograms (ms), counters (images, batches, corrupt_skipped), and
        which decoder ran: 'hw_decode' (bool), 'decode_backend' (str), 'reason' (str)."""
        m = self._impl.metrics()
        dev = dict(m.get("device", {}))
        if self._fallback_reason is not None:
            dev.update(gpu=False, hw_decode=False,
                       decode_backend="libjpeg-turbo (CPU) + non_blocking copy",
                       reason=f"GPU loader not used: {self._fallback_reason}")
        m["device"] = dev
        m["hw_decode"] = bool(dev.get("hw_decode", False))
        m["decode_backend"] = str(dev.get("decode_backend", "libjpeg-turbo"))
        m["reason"] = str(dev.get("reason", ""))
        return m

    @property
    def token_buckets(self) -> List[int]:
        """Token lengths of the static shapes (sorted), or [] without static shapes."""
        if self._own_buckets is not None:
            return list(self._own_buckets)
        return list(self._impl.token_buckets)

    @property
    def shape_keys(self) -> List[Tuple[int, int, int, int]]:
        """Every ``shape_key`` a batch can have with static shapes (one per bucket, in bucket
        order), so a trainer can capture its graphs up front; [] without static shapes."""
        return [(self.batch_size, self._cameras, b, self._horizon) for b in self.token_buckets]

    @property
    def gpu_pipeline(self) -> bool:
        """True when decode and transforms run on the GPU (the nvJPEG loader)."""
        return self._gpu

    @property
    def corrupt_skipped(self) -> int:
        return int(self._impl.corrupt_skipped)


class DataFusionDataset:
    """Map-style access to a loader's DB, for debugging and for samplers of one's own:
    ``ds[i]`` is sample ``i`` (0 <= i < ``len(ds)``, every sample of the DB whatever the loader's
    rank, world size or shuffle; negative indices count from the end) as a dict with the keys,
    dtypes, device, layout and meaning of one row of the loader's batches, unbatched: ``images``
    [cams, 3, H, W], ``tokens`` and ``attention_mask`` [L] (padded as a batch of one: to the
    sample's own length, ``token_pad`` or its token bucket), ``state`` [S], ``action`` [T, A],
    ``action_mask`` [T], ``sample_index`` (a 0-d tensor), and ``task`` (a str) where the DB
    stores task text.

    The values are those the loader's batches give sample ``i`` in epoch 0 (``sample(i, epoch)``
    for another epoch): the crop and jitter are drawn from (seed, epoch, sample, camera), so the
    same ``i`` always gives the same sample. The tensors are copies the caller owns. Out of range:
    IndexError naming the index and the length; a corrupt sample raises (DataLossError naming the
    record) whatever ``on_corrupt`` says. Reading ``ds[i]``, ``ds[i + 1]``, ... in order is
    prefetched (Note [Sample access] in src/data/loader.cc).
    """

    def __init__(self, loader: DataFusionLoader) -> None:
        self._loader = loader

    def __len__(self) -> int:
        return int(self._loader._impl.num_samples)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        return self.sample(index)

    def sample(self, index: int, epoch: int = 0) -> Dict[str, Any]:
        """Sample ``index`` as the loader's batches give it in ``epoch``."""
        if isinstance(index, bool) or not isinstance(index, int):
            try:
                index = index.__index__()
            except AttributeError:
                raise TypeError(f"DataFusionDataset indices must be integers, got "
                                f"{type(index).__name__}") from None
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"DataFusionDataset index {index} is out of range for a dataset of "
                             f"{n} samples ({self._loader.db_path})")
        if self._loader._closed:
            raise RuntimeError(f"DataFusionLoader({self._loader.db_path!r}) was closed")
        raw = self._loader._impl.get_sample(i, int(epoch))
        batch, _ = self._loader._wrap(raw, non_blocking=False)
        # Copies: the row's buffer goes back to the loader's pool at once.
        return {k: v[0] if k == "task" else v[0].clone() for k, v in batch.items()}
