"""CheckpointVault: incremental, asynchronous, crash-consistent checkpoints for PyTorch state.

    vault = CheckpointVault("/ckpt", keep_last=3)
    vault.save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                      "loader": loader.state_dict(), "rng": torch.get_rng_state(), "epoch": 3})
    ...                          # training continues while the writer persists changed chunks
    state = vault.load()         # latest committed checkpoint (or load(step))

Tensors (CPU or CUDA, any of bool/uint8/int8/int16/int32/int64/float16/bfloat16/float32/float64)
are handed to the C++ core through DLPack (no copy in Python; non-contiguous ones are made
contiguous first); the core checks them and names the tensor in its errors. Everything else in the state (numbers, strings, bytes, other picklables) is pickled
into one small blob stored next to the tensors. See docs/ckpt.md.
"""
from __future__ import annotations

import operator
import pickle
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _C

__all__ = ["CheckpointVault"]

_META_NAME = "__loongforge_meta__"
_CUDA_COMPILED = bool(_C.build_info().get("cuda", False))


def _as_step(step: Any) -> int:
    """A checkpoint step as an int: Python, numpy or torch integers only (1.7 is not silently 1),
    and >= 0."""
    if isinstance(step, bool):
        raise TypeError(f"checkpoint step must be an integer, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(f"checkpoint step must be an integer, got {step!r} "
                        f"({type(step).__name__})") from None
    if value < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {value}")
    return value


class _Slot:
    """Placeholder for a tensor inside the pickled skeleton of the state."""

    __slots__ = ("name", "device", "requires_grad")

    def __init__(self, name: str, device: str, requires_grad: bool) -> None:
        self.name = name
        self.device = device
        self.requires_grad = requires_grad

    def __getstate__(self) -> Tuple[str, str, bool]:
        return (self.name, self.device, self.requires_grad)

    def __setstate__(self, s: Tuple[str, str, bool]) -> None:
        self.name, self.device, self.requires_grad = s


def _flatten(obj: Any, path: str, out: List[Tuple[str, torch.Tensor]], names: set) -> Any:
    if isinstance(obj, torch.Tensor):
        name = path or "tensor"
        if name in names or name == _META_NAME:
            i = 1
            while f"{name}#{i}" in names:
                i += 1
            name = f"{name}#{i}"
        names.add(name)
        out.append((name, obj))
        return _Slot(name, str(obj.device), bool(obj.requires_grad))
    if type(obj) in (dict, OrderedDict):
        r = type(obj)()
        for k, v in obj.items():
            r[k] = _flatten(v, f"{path}/{k}" if path else str(k), out, names)
        return r
    if type(obj) in (list, tuple):
        return type(obj)(_flatten(v, f"{path}/{i}", out, names) for i, v in enumerate(obj))
    return obj


def _unflatten(obj: Any, tensors: Dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        t = tensors[obj.name]
        if obj.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t
    if type(obj) in (dict, OrderedDict):
        r = type(obj)()
        for k, v in obj.items():
            r[k] = _unflatten(v, tensors)
        return r
    if type(obj) in (list, tuple):
        return type(obj)(_unflatten(v, tensors) for v in obj)
    return obj


class CheckpointVault:
    """A directory of incremental checkpoints (see docs/ckpt.md).

    Args:
        dir: vault directory (created if missing).
        chunk_bytes: chunk size for change detection (default 4 MiB).
        compress: zstd each chunk when that saves >= 10%.
        xor_delta: store changed chunks as zstd(XOR with the previous version) when smaller.
        keep_last: keep only the newest N checkpoints (0 = keep all); keep_every: plus every M-th.
        max_inflight: saves queued before save() blocks (back-pressure), default 1.
        fsync: make every checkpoint durable (turn off only for benchmarks).
        io_threads: threads hashing/copying in save() and reading/verifying in load()
            (0 = min(4, hardware threads)).
        device_staging: "auto" | "on" | "off": where save() snapshots CUDA tensors. With a
            device arena ("auto" when it fits with a margin, or "on") save() only queues a
            device-to-device copy on the current stream's behalf and returns; the current stream
            waits on the GPU for that copy, and hashing plus device-to-host copies of changed
            chunks happen in the background. "off": hash on the GPU and copy changed chunks to
            pinned host memory before save() returns. stats() has snapshot_path/snapshot_reason.
        device_staging_max_bytes: cap on one device's arena (0 = none; above it: host staging).
        d2h_buffer_bytes: size of each of the writer's two pinned buffers per device.
        writer: "auto" | "posix" | "cufile": how the background writer moves device-staged chunks
            to disk. "cufile" writes raw chunks straight from the device staging arena with
            cuFileWrite (GPUDirect Storage, or its compat mode without nvidia-fs); the constructor
            raises if cuFile is not built or its driver does not open. "auto" = "posix".
            stats() has writer/writer_reason/chunks_cufile/bytes_cufile/cufile_s.

    Errors from the background writer are raised by the next save()/wait()/close().
    loongforge.DataLossError: corrupted data or manifest; loongforge.ResourceExhaustedError: disk full.
    """

    def __init__(self, dir: str, chunk_bytes: int = 4 << 20, compress: bool = False,
                 xor_delta: bool = False, keep_last: int = 0, keep_every: int = 0,
                 max_inflight: int = 1, fsync: bool = True, read_only: bool = False,
                 io_threads: int = 0, device_staging: str = "auto",
                 device_staging_max_bytes: int = 0, d2h_buffer_bytes: int = 64 << 20,
                 writer: str = "auto") -> None:
        self.dir = str(dir)
        self._read_only = read_only
        self._v = _C.CheckpointVault(self.dir, chunk_bytes=chunk_bytes, compress=compress,
                                     xor_delta=xor_delta, keep_last=keep_last,
                                     keep_every=keep_every, max_inflight=max_inflight,
                                     fsync=fsync, read_only=read_only, io_threads=io_threads,
                                     device_staging=device_staging,
                                     device_staging_max_bytes=device_staging_max_bytes,
                                     d2h_buffer_bytes=d2h_buffer_bytes, writer=writer)

    # ---- saving ----
    def save(self, step: int, state: Any) -> None:
        """Snapshots `state` and returns; the write happens in the background. `step` is an
        integer >= 0 (int, numpy or torch integer), greater than every step saved before. Waits
        first while max_inflight earlier saves are not committed (stats()["wait_s"])."""
        self._v.save(_as_step(step), self._tensors(state))

    def try_save(self, step: int, state: Any) -> bool:
        """save() that never waits for the writer: while max_inflight saves are pending it
        returns False at once, having flattened and snapshotted nothing (the caller skips this
        checkpoint; `step` may still be saved later). True when the save was queued."""
        step = _as_step(step)
        if self._v.busy():
            return False
        return bool(self._v.try_save(step, self._tensors(state)))

    def reserve_device_staging(self, state: Any) -> Tuple[int, str]:
        """Allocates ahead the device staging arenas a save of `state` (same structure and
        devices as the saves to come) would take, so that the first save does not allocate
        inside the caller's step. Returns (bytes allocated, why nothing was when 0). Call it
        between saves; with a save in flight it does nothing."""
        return tuple(self._v.reserve_device_staging(self._tensors(state)))

    def busy(self) -> bool:
        """True while max_inflight saves are snapshotted but not committed (save() would wait)."""
        return bool(self._v.busy())

    def committed_stats(self) -> List[Dict[str, Any]]:
        """stats() of each save committed since the previous call, oldest first: bytes_written,
        durable_s (save() call to commit), write_s, ... (docs/ckpt.md, "When the writer is
        busy")."""
        return list(self._v.take_committed_stats())

    def _tensors(self, state: Any) -> List[Tuple[str, torch.Tensor]]:
        pairs: List[Tuple[str, torch.Tensor]] = []
        skeleton = _flatten(state, "", pairs, set())
        meta = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        meta_t = torch.frombuffer(bytearray(meta), dtype=torch.uint8) if meta else torch.empty(0, dtype=torch.uint8)
        tensors = [(_META_NAME, meta_t)]
        for name, t in pairs:
            # No detach(): the converter exports a tensor that requires grad through a detached
            # view itself (the same memory), and a detach per tensor costs ~4 us x thousands.
            if not t.is_contiguous():
                t = t.contiguous()
            if t.is_cuda and not _CUDA_COMPILED:
                t = t.cpu()
            # A CUDA tensor's snapshot is ordered after the work queued so far on the current
            # stream of its device (no host synchronization); with device staging, later work on
            # that stream waits (on the GPU) for the copy.
            tensors.append((name, t))
        return tensors

    def wait(self) -> None:
        """Blocks until every queued save is committed; raises the writer's error, if any."""
        self._v.wait()

    def close(self) -> None:
        self._v.close()

    # ---- loading ----
    def latest(self) -> Optional[int]:
        """Newest committed step, after pending saves of this vault are committed."""
        self._settle()
        return self._v.latest()

    def steps(self) -> List[int]:
        self._settle()
        return list(self._v.list())

    def _settle(self) -> None:
        # Read-your-writes: reads see this vault's own queued saves (and raise their errors).
        if not self._read_only:
            self._v.wait()

    def load(self, step: Optional[int] = None, map_location: Optional[str] = None) -> Any:
        """Restores checkpoint `step` (default: the latest). Tensors return to the device they were
        saved from (CUDA when available) unless `map_location` names one (e.g. "cpu")."""
        self._settle()
        if step is None:
            # The newest checkpoint whose manifest loads: a damaged newer one is skipped with a
            # warning in the log naming it (an explicit load(step) of it raises DataLossError).
            step = self.latest()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.dir}")
        step = _as_step(step)
        infos = {d["name"]: d for d in self._v.describe(int(step))}
        if _META_NAME not in infos:
            raise ValueError(f"checkpoint {step} in {self.dir} was not written by loongforge.ckpt")
        meta_t = torch.empty(infos[_META_NAME]["nbytes"], dtype=torch.uint8)
        self._v.restore_into(int(step), [(_META_NAME, meta_t)])
        skeleton = pickle.loads(meta_t.numpy().tobytes())
        slots: Dict[str, _Slot] = {}
        _collect_slots(skeleton, slots)
        tensors: Dict[str, torch.Tensor] = {}
        targets = []
        moves = []
        for name, slot in slots.items():
            info = infos[name]
            dev = torch.device(map_location) if map_location is not None else torch.device(slot.device)
            if dev.type == "cuda" and not torch.cuda.is_available():
                dev = torch.device("cpu")
            direct = dev.type == "cpu" or (dev.type == "cuda" and _CUDA_COMPILED)
            alloc_dev = dev if direct else torch.device("cpu")
            dtype = getattr(torch, _C.dtype_long_name(info["dtype"]))
            t = torch.empty(info["shape"], dtype=dtype, device=alloc_dev)
            targets.append((name, t))
            tensors[name] = t
            if not direct:
                moves.append((name, dev))
        self._v.restore_into(int(step), targets)
        for name, dev in moves:
            tensors[name] = tensors[name].to(dev)
        return _unflatten(skeleton, tensors)

    def verify(self, step: Optional[int] = None) -> None:
        """Re-reads every chunk of `step` (default latest) and checks its checksum."""
        self._settle()
        step = self.latest() if step is None else _as_step(step)
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.dir}")
        self._v.verify(step)

    # ---- lifecycle ----
    def merge(self, step: int) -> None:
        self._v.merge(_as_step(step))

    def gc(self, dry_run: bool = False) -> Dict[str, int]:
        return dict(self._v.gc(dry_run))

    def export_safetensors(self, step: int, path: str) -> None:
        self._v.export_safetensors(_as_step(step), str(path))

    def stats(self) -> Dict[str, Any]:
        """Figures of the last save: blocking_s (wait_s of it: back-pressure), bytes_total,
        snapshot_path, ...; the writer's figures (bytes_written, write_s, durable_s) once it is
        committed."""
        return dict(self._v.stats())

    def __enter__(self) -> "CheckpointVault":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _collect_slots(obj: Any, out: Dict[str, _Slot]) -> None:
    if isinstance(obj, _Slot):
        out[obj.name] = obj
    elif type(obj) in (dict, OrderedDict):
        for v in obj.values():
            _collect_slots(v, out)
    elif type(obj) in (list, tuple):
        for v in obj:
            _collect_slots(v, out)
