"""safetensors I/O for the policy's checkpoints and the loader that maps a GR00T checkpoint's
names onto the policy's tree (``GR00T_KEY_PREFIXES``).

Hand-written on purpose: the format is an 8-byte length, a JSON header and raw little-endian data
(about 40 lines to read and write here), and the ``safetensors`` package is not among the
project's dependencies (the CPU suite runs on Debian's python3 and torch)."""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .. import _C

# The safetensors names of the dtypes the core handles, from its one dtype table (include/
# loongforge/tensor.h), so that a file the vault exports and a file read here agree.
_ST_DTYPES: Dict[str, torch.dtype] = {d["safetensors"]: getattr(torch, d["long_name"])
                                      for d in _C.dtypes()}
_ST_NAMES: Dict[torch.dtype, str] = {v: k for k, v in _ST_DTYPES.items()}

# Prefix rewrites from GR00T checkpoint names to this module tree (first match wins).
GR00T_KEY_PREFIXES: Sequence[Tuple[str, str]] = (
    ("backbone.eagle_model.vision_model.vision_model.", "backbone.vision_model."),
    ("backbone.eagle_model.vision_model.", "backbone.vision_model."),
    ("backbone.eagle_model.language_model.model.", "backbone.language_model."),
    ("backbone.eagle_model.mlp1.", "backbone.mlp1."),
)


def read_safetensors(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Reads every tensor of a .safetensors file (copies out of a read-only mmap).
    Raises ValueError naming the file and tensor on a malformed header or out-of-range data."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{path}: not a safetensors file ({size} bytes)")
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > size - 8 or hlen > 100 << 20:
            raise ValueError(f"{path}: header length {hlen} exceeds the file ({size} bytes)")
        try:
            header = json.loads(f.read(hlen).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: header is not valid JSON: {e}") from e
        if not isinstance(header, dict):
            raise ValueError(f"{path}: header is not a JSON object")
        meta = header.pop("__metadata__", {}) or {}
        base = 8 + hlen
        out: Dict[str, torch.Tensor] = {}
        if not header:
            return out, dict(meta)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for name, info in header.items():
                try:
                    dtype = _ST_DTYPES[info["dtype"]]
                    shape = [int(s) for s in info["shape"]]
                    begin, end = (int(o) for o in info["data_offsets"])
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}: tensor '{name}': bad header entry {info!r}") from e
                numel = math.prod(shape)
                elem = torch.empty((), dtype=dtype).element_size()
                if begin < 0 or end < begin or base + end > size or end - begin != numel * elem:
                    raise ValueError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do "
                                     f"not fit {info['dtype']}{shape} in a {size}-byte file")
                raw = bytearray(mm[base + begin: base + end])
                if numel == 0:
                    t = torch.empty(shape, dtype=dtype)
                else:
                    t = torch.frombuffer(raw, dtype=dtype).reshape(shape)
                out[name] = t
    return out, dict(meta)


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: str,
                     metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors (contiguous CPU copies) in the safetensors layout, fsynced."""
    header: Dict[str, Any] = {}
    blobs: List[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _ST_NAMES:
            raise ValueError(f"tensor '{name}': dtype {t.dtype} has no safetensors code")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = dict(metadata)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * ((8 - len(hdr) % 8) % 8)  # keep the data 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _rename(name: str, prefixes: Sequence[Tuple[str, str]]) -> str:
    for old, new in prefixes:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def load_safetensors(model: nn.Module, paths: Union[str, Iterable[str]], *,
                     rename: Optional[Callable[[str], Optional[str]]] = None,
                     prefixes: Sequence[Tuple[str, str]] = GR00T_KEY_PREFIXES,
                     strict: bool = False) -> Dict[str, List[str]]:
    """Loads one or more safetensors files (a path, a list, or a directory of shards) into `model`.

    Names are rewritten by `prefixes` (GR00T -> this tree) and then `rename` (return None to drop a
    key). Returns {'missing': model keys not in the files, 'unexpected': file keys not in the model,
    'mismatched': keys whose shapes differ (not loaded)}. strict=True raises ValueError if any list
    is non-empty. Values are cast to each parameter's dtype and copied to its device."""
    if isinstance(paths, str):
        if os.path.isdir(paths):
            paths = sorted(os.path.join(paths, p) for p in os.listdir(paths)
                           if p.endswith(".safetensors"))
        else:
            paths = [paths]
    own = model.state_dict()
    seen: set = set()
    unexpected: List[str] = []
    mismatched: List[str] = []
    for path in paths:
        tensors, _ = read_safetensors(path)
        for name, t in tensors.items():
            key: Optional[str] = _rename(name, prefixes)
            if rename is not None and key is not None:
                key = rename(key)
            if key is None:
                continue
            if key not in own:
                unexpected.append(name)
                continue
            if tuple(own[key].shape) != tuple(t.shape):
                mismatched.append(f"{name}: file {list(t.shape)} vs model {list(own[key].shape)}")
                continue
            with torch.no_grad():
                own[key].copy_(t.to(own[key].dtype))
            seen.add(key)
    missing = [k for k in own if k not in seen]
    report = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    if strict and (missing or unexpected or mismatched):
        raise ValueError(f"load_safetensors: {len(missing)} missing, {len(unexpected)} "
                         f"unexpected, {len(mismatched)} mismatched keys: "
                         f"{(missing + unexpected + mismatched)[:8]}")
    return report
