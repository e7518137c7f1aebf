"""CheckpointVault: incremental, asynchronous, crash-consistent checkpoints for PyTorch state.

    vault = CheckpointVault("/ckpt", keep_last=3)
    vault.save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                      "loader": loader.state_dict(), "rng": torch.get_rng_state(), "epoch": 3})
    ...                          # training continues while the writer persists changed chunks
    state = vault.load()         # latest committed checkpoint (or load(step))

Tensors (CPU or CUDA, any of bool/uint8/int8/int16/int32/int64/float16/bfloat16/float32/float64)
are handed to the C++ core through DLPack (no copy in Python; non-contiguous ones are made
contiguous first); the core checks them and names the tensor in its errors. The structure around
them (dict/list/tuple, str, int, float, bool, None, bytes; numpy arrays as raw chunks) is stored as
one JSON chunk next to the tensors: loading a vault builds data only and never unpickles. Anything
else is refused by save(), naming its key path. See docs/ckpt.md.
"""
from __future__ import annotations

import base64
import json
import operator
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import _C

__all__ = ["CheckpointVault"]

_META_NAME = "__loongforge_meta__"
_CUDA_COMPILED = bool(_C.build_info().get("cuda", False))
# The structure chunk: this header line, then JSON (Note [The checkpoint structure]).
_FORMAT = b"loongforge.ckpt.structure/1\n"
_MAX_STEP = 2**63 - 1  # the manifest stores steps as int64


def _as_step(step: Any) -> int:
    """A checkpoint step as an int: Python, numpy or torch integers only (1.7 is not silently 1),
    in 0..2**63-1."""
    if isinstance(step, bool):
        raise TypeError(f"checkpoint step must be an integer, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(f"checkpoint step must be an integer, got {type(step).__name__}") from None
    if value < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {value}")
    if value > _MAX_STEP:
        raise ValueError(f"checkpoint step must be <= 2**63-1, got {value}")
    return value


# Note [The checkpoint structure]
# A checkpoint is tensors plus the structure around them (dicts, lists, numbers, strings). The
# structure is stored as one JSON chunk (_META_NAME) in the vault, so that loading a vault can
# only ever build data: no pickle, no class named by the file. Every JSON object is a tagged
# node, every other JSON value a literal:
#   null / true / false / number / string     None, bool, int, float (inf and nan too), str
#   {"dict": [[key, node], ...]}              dict with str or int keys (optimizer state
#   {"odict": [[key, node], ...]}             uses int keys); OrderedDict (state_dict())
#   {"list": [...]} / {"tuple": [...]}
#   {"bytes": "<base64>"}
#   {"tensor": name, "device": d, "requires_grad": b}    a tensor stored as chunk `name`
#   {"view": name, "shape", "stride", "offset", "device", "requires_grad"}
#                                             a tensor whose storage another entry shares: the
#                                             whole storage is chunk `name`, each entry a view
#                                             of it, so aliases come back sharing storage
#   {"ndarray": name, "dtype": "<f4", "shape": [...]}    numpy array (numeric dtypes), bytes
# Anything else is refused by save() naming its key path and type.
_NP_KINDS = "biufc"


def _path_str(path: str) -> str:
    return path or "<root>"


class _Encoder:
    def __init__(self) -> None:
        self.tensors: List[Tuple[str, torch.Tensor]] = []
        self.names: set = {_META_NAME}
        self.bases: Dict[Tuple[str, int], Tuple[str, torch.dtype, str]] = {}
        self.shared: set = set()

    def _name(self, path: str) -> str:
        name = path or "tensor"
        if name in self.names:
            i = 1
            while f"{name}#{i}" in self.names:
                i += 1
            name = f"{name}#{i}"
        self.names.add(name)
        return name

    @staticmethod
    def _storage_key(t: torch.Tensor) -> Optional[Tuple[str, int]]:
        if t.layout != torch.strided:
            return None
        s = t.storage()
        if s.size() == 0 or s.data_ptr() == 0:
            return None
        return (str(t.device), s.data_ptr())

    def scan(self, obj: Any) -> None:
        """Finds the storages that more than one tensor entry of `obj` uses."""
        seen: set = set()
        stack = [obj]
        while stack:
            o = stack.pop()
            if isinstance(o, torch.Tensor):
                key = self._storage_key(o)
                if key is not None:
                    (self.shared.add if key in seen else seen.add)(key)
            elif isinstance(o, dict):
                stack.extend(o.values())
            elif isinstance(o, (list, tuple)):
                stack.extend(o)

    def encode(self, obj: Any, path: str) -> Any:
        if obj is None or isinstance(obj, (bool, str)) or type(obj) in (int, float):
            return obj
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if type(obj) in (dict, OrderedDict):
            items = []
            for k, v in obj.items():
                if isinstance(k, bool) or type(k) not in (str, int):
                    raise TypeError(f"checkpoint state {_path_str(path)}: key {k!r} is a "
                                    f"{type(k).__name__}; keys must be str or int")
                items.append([k, self.encode(v, f"{path}/{k}" if path else str(k))])
            return {"odict" if type(obj) is OrderedDict else "dict": items}
        if type(obj) in (list, tuple):
            return {type(obj).__name__: [self.encode(v, f"{path}/{i}")
                                         for i, v in enumerate(obj)]}
        if type(obj) in (bytes, bytearray):
            return {"bytes": base64.b64encode(bytes(obj)).decode("ascii")}
        if isinstance(obj, np.ndarray) and obj.dtype.kind in _NP_KINDS and not obj.dtype.fields:
            arr = np.ascontiguousarray(obj)
            name = self._name(path)
            self.tensors.append((name, torch.from_numpy(arr.reshape(-1).view(np.uint8).copy())))
            return {"ndarray": name, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        if isinstance(obj, (np.integer, np.floating, np.bool_)):
            return obj.item()
        if isinstance(obj, float):  # float subclasses (e.g. numpy.float64 handled above)
            return float(obj)
        raise TypeError(f"checkpoint state {_path_str(path)}: a {type(obj).__module__}."
                        f"{type(obj).__qualname__} cannot be saved (a checkpoint holds tensors, "
                        "numpy arrays, dict/list/tuple, str, int, float, bool, None and bytes)")

    def _tensor(self, t: torch.Tensor, path: str) -> Dict[str, Any]:
        if t.layout != torch.strided:
            raise TypeError(f"checkpoint state {_path_str(path)}: a {t.layout} tensor cannot be "
                            "saved (dense tensors only)")
        key = self._storage_key(t)
        info = {"device": str(t.device), "requires_grad": bool(t.requires_grad)}
        if key is None or key not in self.shared:
            name = self._name(path)
            self.tensors.append((name, t))
            return dict(tensor=name, **info)
        base = self.bases.get(key)
        if base is None:
            name = self._name(path + "#storage")
            s = t.storage()
            flat = torch.tensor([], dtype=t.dtype, device=t.device).set_(s, 0, (s.size(),), (1,))
            self.tensors.append((name, flat))
            base = self.bases[key] = (name, t.dtype, path)
        elif base[1] != t.dtype:
            # Views of one storage in several dtypes (parameters packed into one arena) are
            # saved as tensors of their own: a view is rebuilt in its storage's dtype only.
            name = self._name(path)
            self.tensors.append((name, t))
            return dict(tensor=name, **info)
        return dict(view=base[0], shape=list(t.shape), stride=list(t.stride()),
                    offset=int(t.storage_offset()), **info)


def _encode_state(state: Any) -> Tuple[bytes, List[Tuple[str, torch.Tensor]]]:
    enc = _Encoder()
    enc.scan(state)
    root = enc.encode(state, "")
    text = json.dumps({"root": root}, allow_nan=True, separators=(",", ":"))
    return _FORMAT + text.encode("utf-8"), enc.tensors


class _Malformed(ValueError):
    pass


def _parse_structure(raw: bytes) -> Any:
    if not raw.startswith(_FORMAT):
        if raw[:1] == b"\x80":
            raise _Malformed("its structure is a pickle (written by an older loongforge); it is "
                             "not loaded, since unpickling a file can run code")
        raise _Malformed(f"its structure does not start with {_FORMAT[:-1].decode()!r}")
    try:
        doc = json.loads(raw[len(_FORMAT):].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _Malformed(f"its structure is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or "root" not in doc:
        raise _Malformed("its structure has no 'root'")
    return doc["root"]


def _refs(node: Any, path: str, out: Dict[str, Tuple[str, Dict[str, Any]]]) -> None:
    """Collects the chunk names a structure references (name -> (path, node)), checking tags."""
    stack = [(node, path)]
    while stack:
        n, p = stack.pop()
        if isinstance(n, list):
            raise _Malformed(f"{_path_str(p)}: a bare JSON list is not a node")
        if not isinstance(n, dict):
            continue
        if len(n) == 0:
            raise _Malformed(f"{_path_str(p)}: an empty JSON object is not a node")
        tag = next(iter(n))
        body = n[tag]
        if tag in ("dict", "odict"):
            if not isinstance(body, list):
                raise _Malformed(f"{_path_str(p)}: '{tag}' holds a {type(body).__name__}")
            for item in body:
                if (not isinstance(item, list) or len(item) != 2 or isinstance(item[0], bool)
                        or not isinstance(item[0], (str, int))):
                    raise _Malformed(f"{_path_str(p)}: a '{tag}' item is not [str|int key, node]")
                stack.append((item[1], f"{p}/{item[0]}" if p else str(item[0])))
        elif tag in ("list", "tuple"):
            if not isinstance(body, list):
                raise _Malformed(f"{_path_str(p)}: '{tag}' holds a {type(body).__name__}")
            stack.extend((v, f"{p}/{i}") for i, v in enumerate(body))
        elif tag in ("tensor", "view", "ndarray"):
            if not isinstance(body, str):
                raise _Malformed(f"{_path_str(p)}: '{tag}' names no chunk")
            out.setdefault(body, (p, n))
        elif tag != "bytes" or not isinstance(body, str):
            raise _Malformed(f"{_path_str(p)}: unknown node {tag!r}")


def _int_list(v: Any, what: str, p: str) -> List[int]:
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        raise _Malformed(f"{_path_str(p)}: '{what}' is not a list of integers")
    return v


def _decode(node: Any, path: str, chunks: Dict[str, torch.Tensor]) -> Any:
    if not isinstance(node, dict):
        return node
    tag = next(iter(node))
    body = node[tag]
    if tag in ("dict", "odict"):
        r = OrderedDict() if tag == "odict" else {}
        for k, v in body:
            r[k] = _decode(v, f"{path}/{k}" if path else str(k), chunks)
        return r
    if tag in ("list", "tuple"):
        items = [_decode(v, f"{path}/{i}", chunks) for i, v in enumerate(body)]
        return items if tag == "list" else tuple(items)
    if tag == "bytes":
        try:
            return base64.b64decode(body, validate=True)
        except ValueError as e:
            raise _Malformed(f"{_path_str(path)}: bad base64 ({e})") from None
    t = chunks[body]
    if tag == "ndarray":
        try:
            dt = np.dtype(node.get("dtype"))
        except TypeError as e:
            raise _Malformed(f"{_path_str(path)}: bad numpy dtype ({e})") from None
        shape = _int_list(node.get("shape"), "shape", path)
        if dt.kind not in _NP_KINDS or dt.fields or t.dtype != torch.uint8:
            raise _Malformed(f"{_path_str(path)}: numpy dtype {dt.str} is not a numeric dtype")
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if min(shape, default=0) < 0 or n * dt.itemsize != t.numel():
            raise _Malformed(f"{_path_str(path)}: numpy array {dt.str} {shape} needs "
                             f"{n * dt.itemsize} bytes, its chunk has {t.numel()}")
        return t.cpu().numpy().view(dt).reshape(shape).copy()
    if tag == "view":
        shape = _int_list(node.get("shape"), "shape", path)
        stride = _int_list(node.get("stride"), "stride", path)
        off = node.get("offset")
        if (type(off) is not int or off < 0 or len(shape) != len(stride)
                or min(shape + stride, default=0) < 0):
            raise _Malformed(f"{_path_str(path)}: bad view shape/stride/offset")
        end = off + sum((s - 1) * st for s, st in zip(shape, stride)) + 1
        if 0 not in shape and end > t.numel():
            raise _Malformed(f"{_path_str(path)}: view reaches element {end - 1}, its storage "
                             f"{body!r} has {t.numel()}")
        t = t.as_strided(shape, stride, off)
    if node.get("requires_grad") is True and t.is_floating_point():
        t.requires_grad_(True)
    return t


class CheckpointVault:
    """A directory of incremental checkpoints (see docs/ckpt.md).

    Args (keyword arguments; ``CheckpointVault.options()`` gives each with its default, which
    the C++ ``VaultOptions`` declares once):
        dir: vault directory (created if missing).
        chunk_bytes: chunk size for change detection (default 4 MiB; 4 KiB..1 GiB, a multiple
            of 64).
        compress: zstd each chunk when that saves >= 10% (compress_max_ratio: kept when the
            stored size is below this fraction of the raw size; compress_level: zstd's level).
        xor_delta: store changed chunks as zstd(XOR with the previous version) when smaller.
        keep_last: keep only the newest N checkpoints (0 = keep all); keep_every: plus every M-th.
        max_inflight: saves queued before save() blocks (back-pressure), default 1.
        fsync: make every checkpoint durable (turn off only for benchmarks).
        read_only: open an existing vault for reading (no writer, no lock).
        wait_timeout_ms: bound on every wait for the background writer.
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

    def __init__(self, dir: str, **options: Any) -> None:
        self.dir = str(dir)
        self._read_only = bool(options.get("read_only", False))
        self._v = _C.CheckpointVault(self.dir, **options)

    @staticmethod
    def options() -> Dict[str, Any]:
        """Every option and its default, as the C++ VaultOptions declares them."""
        return dict(_C.vault_options())

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
        meta, pairs = _encode_state(state)
        tensors = [(_META_NAME, torch.frombuffer(bytearray(meta), dtype=torch.uint8))]
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
        where = f"checkpoint {step} in {self.dir}"
        refs: Dict[str, Tuple[str, Dict[str, Any]]] = {}
        try:
            root = _parse_structure(meta_t.numpy().tobytes())
            _refs(root, "", refs)
            for name, (path, _) in refs.items():
                if name not in infos or name == _META_NAME:
                    raise _Malformed(f"{_path_str(path)}: names chunk {name!r}, which the "
                                     "manifest does not hold")
        except _Malformed as e:
            raise _C.DataLossError(f"{where}: {e}") from None
        tensors: Dict[str, torch.Tensor] = {}
        targets = []
        moves = []
        for name, (_, node) in refs.items():
            info = infos[name]
            # numpy arrays come back as numpy arrays (host memory) whatever map_location says
            saved = "cpu" if "ndarray" in node else node.get("device", "cpu")
            want = saved if map_location is None or "ndarray" in node else map_location
            try:
                dev = torch.device(want)
            except (RuntimeError, TypeError):
                raise _C.DataLossError(f"{where}: chunk {name!r}: bad device {want!r}") from None
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
        try:
            return _decode(root, "", tensors)
        except _Malformed as e:
            raise _C.DataLossError(f"{where}: {e}") from None

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

    def export_safetensors(self, step: int, path: str, model_only: bool = False,
                           strip_prefix: Optional[str] = None) -> None:
        """Writes checkpoint `step` as one .safetensors file at `path` (a new file).

        By default every tensor is written under its chunk name (``model/...``, ``optimizer/...``)
        with the structure chunk, so nothing is lost. With ``model_only=True`` only the tensors
        whose key path starts with `strip_prefix` (default ``"model/"``, the key the trainer saves
        ``model.state_dict()`` under) are written, named by the rest of the path: the file is a
        plain state dict for ``model.load_state_dict()``. A prefix matching no tensor raises
        ValueError naming it and the checkpoint's top-level keys."""
        if strip_prefix is not None and not model_only:
            raise ValueError("export_safetensors: strip_prefix selects the model's tensors and is "
                             "read only with model_only=True")
        if strip_prefix is not None and not isinstance(strip_prefix, str):
            raise TypeError(f"export_safetensors: strip_prefix must be a str, got "
                            f"{type(strip_prefix).__name__}")
        self._v.export_safetensors(_as_step(step), str(path), model_only=bool(model_only),
                                   strip_prefix="model/" if strip_prefix is None else strip_prefix)

    def stats(self) -> Dict[str, Any]:
        """Figures of the last save: blocking_s (wait_s of it: back-pressure), bytes_total,
        snapshot_path, ...; the writer's figures (bytes_written, write_s, durable_s) once it is
        committed."""
        return dict(self._v.stats())

    def __enter__(self) -> "CheckpointVault":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

