"""A small pure-Python Parquet writer for the tables LeRobot v2.1 writes, for benches only.

Why: LeRobot datasets with long episodes are needed to measure `pack --from-lerobot`, and a
machine without pyarrow cannot write their parquet files. This writes what pyarrow writes for a
LeRobot v2.1 episode table and nothing more:

- columns: float32 / float64 / int64 scalars (OPTIONAL, as pyarrow marks every nullable field,
  null where a value is None), and fixed_size_list<float32>[N] as the three-level LIST pyarrow writes
  (`optional group f (LIST) { repeated group list { optional float element; } }`, max definition
  level 3, max repetition level 1);
- pages: DATA_PAGE (v1), PLAIN values, levels in the RLE / bit-packed hybrid (bit-packed groups
  for short runs, RLE runs for long ones, as parquet-cpp's RleEncoder does), pages start at row
  boundaries;
- codec: UNCOMPRESSED, or SNAPPY made of literal blocks only (valid snappy, no compression: the
  point is the container, not the size);
- footer: FileMetaData in the thrift compact protocol, its length and "PAR1".

It is not a general Parquet writer: no null lists, no dictionaries, no statistics, no nested types
other than the one list shape. tests/python/test_parquet.py checks it against the project's
reader (and against pyarrow where pyarrow is importable).
"""
from __future__ import annotations

import struct
from typing import Dict, List, Sequence

# parquet.thrift enums
_BOOLEAN, _INT32, _INT64, _INT96, _FLOAT, _DOUBLE = 0, 1, 2, 3, 4, 5
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_PLAIN, _RLE = 0, 3
_UNCOMPRESSED, _SNAPPY = 0, 1
_DATA_PAGE = 0
_CONVERTED_LIST = 3

# thrift compact protocol type ids
_T_TRUE, _T_FALSE, _T_I32, _T_I64, _T_BINARY, _T_LIST, _T_STRUCT = 1, 2, 5, 6, 8, 9, 12


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


class _Struct:
    """A thrift compact struct under construction: fields must be added in increasing id order."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.last = 0

    def _header(self, fid: int, ttype: int) -> None:
        delta = fid - self.last
        if 0 < delta <= 15:
            self.buf.append((delta << 4) | ttype)
        else:
            self.buf.append(ttype)
            self.buf += _zigzag(fid)
        self.last = fid

    def i32(self, fid: int, v: int) -> "_Struct":
        self._header(fid, _T_I32)
        self.buf += _zigzag(v)
        return self

    def i64(self, fid: int, v: int) -> "_Struct":
        self._header(fid, _T_I64)
        self.buf += _zigzag(v)
        return self

    def binary(self, fid: int, v: bytes) -> "_Struct":
        self._header(fid, _T_BINARY)
        self.buf += _varint(len(v)) + v
        return self

    def struct(self, fid: int, v: "_Struct") -> "_Struct":
        self._header(fid, _T_STRUCT)
        self.buf += v.end()
        return self

    def list(self, fid: int, etype: int, items: Sequence) -> "_Struct":
        """items: ints for _T_I32, bytes for _T_BINARY, _Struct for _T_STRUCT."""
        self._header(fid, _T_LIST)
        n = len(items)
        self.buf += bytes([(n << 4) | etype]) if n < 15 else bytes([0xF0 | etype]) + _varint(n)
        for x in items:
            if etype == _T_I32:
                self.buf += _zigzag(x)
            elif etype == _T_BINARY:
                self.buf += _varint(len(x)) + x
            else:
                self.buf += x.end()
        return self

    def end(self) -> bytes:
        return bytes(self.buf) + b"\x00"


def _hybrid(values: Sequence[int], bit_width: int) -> bytes:
    """The RLE / bit-packed hybrid: a run of >= 8 equal values starting at a group boundary is an
    RLE run, everything else goes into bit-packed groups of 8 (the last one zero-padded; readers
    stop at the page's value count)."""
    out = bytearray()
    vbytes = (bit_width + 7) // 8
    literals: List[int] = []

    def flush() -> None:
        if not literals:
            return
        literals.extend([0] * (-len(literals) % 8))
        out.extend(_varint(((len(literals) // 8) << 1) | 1))
        acc = nbits = 0
        for v in literals:
            acc |= v << nbits
            nbits += bit_width
            while nbits >= 8:
                out.append(acc & 0xFF)
                acc >>= 8
                nbits -= 8
        literals.clear()

    i, n = 0, len(values)
    while i < n:
        j = i
        while j < n and values[j] == values[i]:
            j += 1
        if j - i >= 8 and len(literals) % 8 == 0:
            flush()
            out.extend(_varint((j - i) << 1))
            out.extend(values[i].to_bytes(vbytes, "little"))
            i = j
        else:
            literals.append(values[i])
            i += 1
    flush()
    return bytes(out)


def _snappy_literals(data: bytes) -> bytes:
    """Valid snappy: the uncompressed length, then literal elements of at most 64 KiB."""
    out = bytearray(_varint(len(data)))
    for p in range(0, len(data), 65536):
        chunk = data[p:p + 65536]
        n = len(chunk) - 1
        if n < 60:
            out.append(n << 2)
        elif n < 256:
            out += bytes([60 << 2, n])
        else:
            out += bytes([61 << 2]) + n.to_bytes(2, "little")
        out += chunk
    return bytes(out)


class Column:
    """One column: `kind` is "float32", "float64", "int64" or ("list_float32", N)."""

    def __init__(self, name: str, kind, values: Sequence) -> None:
        self.name = name
        self.kind = kind
        self.values = values
        self.list_size = kind[1] if isinstance(kind, tuple) else 0
        if self.list_size:
            for r, row in enumerate(values):
                if len(row) != self.list_size:
                    raise ValueError(f"{name}: row {r} has {len(row)} values, not {self.list_size}")

    @property
    def physical(self) -> int:
        k = "float32" if self.list_size else self.kind
        return {"float32": _FLOAT, "float64": _DOUBLE, "int64": _INT64}[k]

    def plain(self, lo: int, hi: int) -> bytes:
        fmt = {_FLOAT: "f", _DOUBLE: "d", _INT64: "q"}[self.physical]
        if self.list_size:
            flat = [float(x) for row in self.values[lo:hi] for x in row]
        else:
            flat = [v for v in self.values[lo:hi] if v is not None]  # None: a null
            flat = [int(x) for x in flat] if self.physical == _INT64 else [float(x) for x in flat]
        return struct.pack(f"<{len(flat)}{fmt}", *flat)

    def schema(self) -> List[_Struct]:
        if not self.list_size:
            return [_Struct().i32(1, self.physical).i32(3, _OPTIONAL).binary(4, self.name.encode())]
        return [
            _Struct().i32(3, _OPTIONAL).binary(4, self.name.encode()).i32(5, 1)
            .i32(6, _CONVERTED_LIST).struct(10, _Struct().struct(3, _Struct())),
            _Struct().i32(3, _REPEATED).binary(4, b"list").i32(5, 1),
            _Struct().i32(1, _FLOAT).i32(3, _OPTIONAL).binary(4, b"element"),
        ]

    def path(self) -> List[bytes]:
        return [self.name.encode(), b"list", b"element"] if self.list_size else [self.name.encode()]

    def page(self, lo: int, hi: int, codec: int) -> tuple:
        """(page bytes with header, number of level entries, uncompressed size)."""
        rows = hi - lo
        if self.list_size:
            n = rows * self.list_size
            rep = _hybrid(([0] + [1] * (self.list_size - 1)) * rows, 1)
            dfn = _hybrid([3] * n, 2)
            levels = struct.pack("<I", len(rep)) + rep + struct.pack("<I", len(dfn)) + dfn
        else:
            n = rows
            dfn = _hybrid([0 if v is None else 1 for v in self.values[lo:hi]], 1)
            levels = struct.pack("<I", len(dfn)) + dfn
        body = levels + self.plain(lo, hi)
        stored = _snappy_literals(body) if codec == _SNAPPY else body
        dph = _Struct().i32(1, n).i32(2, _PLAIN).i32(3, _RLE).i32(4, _RLE)
        header = (_Struct().i32(1, _DATA_PAGE).i32(2, len(body)).i32(3, len(stored))
                  .struct(5, dph).end())
        return header + stored, n, len(header) + len(body)


def write_table(path: str, columns: Sequence[Column], row_group_size: int = 1 << 20,
                rows_per_page: int = 1 << 16, compression: str = "none") -> None:
    """Writes `columns` (equal row counts) to `path`. compression: "none" or "snappy"."""
    if compression not in ("none", "snappy"):
        raise ValueError(f"compression {compression!r}: only 'none' and 'snappy'")
    codec = _SNAPPY if compression == "snappy" else _UNCOMPRESSED
    num_rows = len(columns[0].values) if columns else 0
    for c in columns:
        if len(c.values) != num_rows:
            raise ValueError(f"{c.name}: {len(c.values)} rows, not {num_rows}")
    out = bytearray(b"PAR1")
    row_groups = []
    for g0 in range(0, max(num_rows, 1), row_group_size):
        g1 = min(num_rows, g0 + row_group_size)
        chunks, group_bytes = [], 0
        for c in columns:
            first = len(out)
            nvals = unc = 0
            for p0 in range(g0, max(g1, g0 + 1), rows_per_page):
                page, n, u = c.page(p0, min(g1, p0 + rows_per_page), codec)
                out += page
                nvals += n
                unc += u
            comp = len(out) - first
            group_bytes += unc
            meta = (_Struct().i32(1, c.physical).list(2, _T_I32, [_PLAIN, _RLE])
                    .list(3, _T_BINARY, c.path()).i32(4, codec).i64(5, nvals).i64(6, unc)
                    .i64(7, comp).i64(9, first))
            chunks.append(_Struct().i64(2, first).struct(3, meta))
        row_groups.append(_Struct().list(1, _T_STRUCT, chunks).i64(2, group_bytes)
                          .i64(3, g1 - g0))
    schema = [_Struct().binary(4, b"schema").i32(5, len(columns))]
    for c in columns:
        schema += c.schema()
    footer = (_Struct().i32(1, 1).list(2, _T_STRUCT, schema).i64(3, num_rows)
              .list(4, _T_STRUCT, row_groups).binary(6, b"loongforge mini_parquet").end())
    out += footer + struct.pack("<I", len(footer)) + b"PAR1"
    with open(path, "wb") as fh:
        fh.write(out)


def lerobot_episode(path: str, episode_index: int, first_index: int, task_index: int,
                    state: Sequence[Sequence[float]], action: Sequence[Sequence[float]],
                    fps: float, compression: str = "none") -> None:
    """A LeRobot v2.1 episode table: observation.state, action, timestamp (float32, frame / fps),
    frame_index, episode_index, index, task_index (int64), one row per frame."""
    n = len(state)
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # noqa: E731
    cols = [
        Column("observation.state", ("list_float32", len(state[0])), state),
        Column("action", ("list_float32", len(action[0])), action),
        Column("timestamp", "float32", [f32(k / fps) for k in range(n)]),
        Column("frame_index", "int64", list(range(n))),
        Column("episode_index", "int64", [episode_index] * n),
        Column("index", "int64", list(range(first_index, first_index + n))),
        Column("task_index", "int64", [task_index] * n),
    ]
    write_table(path, cols, compression=compression)
