"""LoongForge's Parquet reader (src/dataset/parquet) against pyarrow's values.

Two references, both pyarrow's: the committed fixtures under tests/data/lerobot/ with the values
pyarrow read when it wrote them (`<file>.expected.json`, made by make_fixtures.py; checked on every
machine), and, where pyarrow is importable (the GPU machine), random tables written and read by
pyarrow on the spot.
"""
import glob
import json
import math
import os

import numpy as np
import pytest

import loongforge
from lf_testdata import mini_parquet
from loongforge import _C

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "data", "lerobot")
FIXTURE_FILES = sorted(glob.glob(os.path.join(FIXTURES, "**", "*.parquet"), recursive=True))


def _py(v):
    """A reader value (numpy array / list / scalar) as plain JSON-like Python values."""
    if isinstance(v, np.ndarray):
        return [_py(x) for x in v.tolist()]
    if isinstance(v, list):
        return [_py(x) for x in v]
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    return v


def _same(a, b):
    """Exact equality, NaN equal to NaN, bool distinct from int."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float))
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _read(path, columns):
    """_C.read_parquet, skipping the test when this build lacks the file's codec library (the GPU
    machine's build may have no libsnappy): that is a build's choice, not a reader error."""
    try:
        return _C.read_parquet(path, columns)
    except RuntimeError as e:
        if "this build has no lib" in str(e):
            pytest.skip(str(e))
        raise


def _check_against_expected(path, exp):
    # No supported column: nothing to read (an empty list would ask for every column).
    got = _read(path, list(exp["columns"])) if exp["columns"] else {}
    assert _C.parquet_num_rows(path) == exp["num_rows"]
    for name, want in exp["columns"].items():
        have = _py(got[name])
        assert len(have) == exp["num_rows"], name
        bad = [i for i, (x, y) in enumerate(zip(have, want)) if not _same(x, y)]
        assert not bad, f"{path}: column {name!r} row {bad[0]}: {have[bad[0]]!r} != {want[bad[0]]!r}"
    for name, feature in exp["unsupported"].items():
        with pytest.raises(RuntimeError) as e:
            _C.read_parquet(path, [name])
        msg = str(e.value)
        assert path in msg and f"'{name}'" in msg and feature in msg, msg


# Guards the reader on every committed fixture: values equal pyarrow's exactly, refused features
# named with the file and column. Skipped only until the fixtures are generated and committed.
@pytest.mark.skipif(not FIXTURE_FILES, reason="fixtures not generated yet (make_fixtures.py)")
@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[os.path.relpath(p, FIXTURES) for p in FIXTURE_FILES])
def test_fixture_matches_pyarrow_values(path):
    with open(path + ".expected.json") as fh:
        exp = json.load(fh)
    _check_against_expected(path, exp)
    assert set(_C.parquet_column_names(path)) == set(exp["columns"]) | set(exp["unsupported"])


# Guards that C++ errors arrive as the documented Python exceptions.
def test_errors_are_python_exceptions(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        _C.read_parquet(str(tmp_path / "missing.parquet"))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 20 + b"XXXX")
    with pytest.raises(loongforge.DataLossError, match="bad.parquet"):
        _C.read_parquet(str(bad))
    trunc = tmp_path / "trunc.parquet"
    trunc.write_bytes(b"PAR1" + b"\0" * 20 + b"\xff\xff\x00\x00PAR1")
    with pytest.raises(loongforge.DataLossError, match="footer length"):
        _C.read_parquet(str(trunc))


# ---- random tables, written by pyarrow here (skipped without pyarrow) ----

def _random_table(pa, rng, n):
    null = rng.random(n) < 0.25
    words = ["a", "bb", "", "pick up", "ü"]
    return pa.table({
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f64": pa.array([None if null[i] else float(x) for i, x in enumerate(rng.standard_normal(n))]),
        "i32": pa.array(rng.integers(-2**31, 2**31, n).astype(np.int32)),
        "i64": pa.array([None if null[(i + 1) % n] else int(x)
                         for i, x in enumerate(rng.integers(-2**63, 2**63 - 1, n))]),
        "b": pa.array([None if null[(i + 2) % n] else bool(x) for i, x in enumerate(rng.random(n) < .5)]),
        "s": pa.array([None if null[(i + 3) % n] else words[int(k)]
                       for i, k in enumerate(rng.integers(0, len(words), n))]),
        "fsl": pa.array(list(rng.standard_normal((n, 3)).astype(np.float32)),
                        type=pa.list_(pa.float32(), 3)),
        "lst": pa.array([None if rng.random() < .1 else float(np.float32(rng.standard_normal()))
                         for _ in range(int(k))] for k in rng.integers(0, 5, n)),
    })


CONFIGS = [
    dict(compression="snappy"),
    dict(compression="zstd", data_page_version="2.0"),
    dict(compression="gzip", use_dictionary=False),
    dict(compression="none", row_group_size=37, data_page_size=128, write_batch_size=8),
    dict(compression="snappy", data_page_version="2.0", row_group_size=50, data_page_size=64,
         write_batch_size=8, write_page_checksum=True),
]


# Guards the reader against pyarrow on random values over every codec, both page versions,
# dictionary and plain encodings, many row groups and pages, nulls and lists.
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("seed", [0, 1])
def test_random_tables_match_pyarrow(tmp_path, config, seed):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(seed)
    table = _random_table(pa, rng, int(rng.integers(1, 400)))
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, **config)
    back = pq.read_table(path)
    exp = {"num_rows": back.num_rows, "unsupported": {},
           "columns": {c: back.column(c).to_pylist() for c in back.column_names}}
    _check_against_expected(path, exp)


# ---- bench/pack/mini_parquet.py (the benches' writer for machines without pyarrow) ----

def _f32(x):
    return float(np.float32(x))


# Guards the bench's LeRobot tables (bench/pack/lerobot_speed.py --episodes): what mini_parquet
# writes is read back exactly by the project's reader, over row groups, pages and both codecs,
# and equals pyarrow's reading where pyarrow is importable.
@pytest.mark.parametrize("compression", ["none", "snappy"])
@pytest.mark.parametrize("rows,row_group_size,rows_per_page", [
    (1, 1 << 20, 1 << 16), (300, 1 << 20, 1 << 16), (301, 128, 37), (17, 5, 3)])
def test_mini_parquet_roundtrip(tmp_path, compression, rows, row_group_size, rows_per_page):
    mp = mini_parquet()
    rng = np.random.default_rng(rows)
    state = [[_f32(x) for x in r] for r in rng.standard_normal((rows, 6))]
    action = [[_f32(x) for x in r] for r in rng.standard_normal((rows, 1))]
    wide = [[_f32(x) for x in r] for r in rng.standard_normal((rows, 19))]
    f64 = [float(x) for x in rng.standard_normal(rows)]
    i64 = [int(x) for x in rng.integers(-2**63, 2**63 - 1, rows)]
    ts = [_f32(k / 30) for k in range(rows)]
    cols = [mp.Column("observation.state", ("list_float32", 6), state),
            mp.Column("action", ("list_float32", 1), action),
            mp.Column("wide", ("list_float32", 19), wide),
            mp.Column("timestamp", "float32", ts),
            mp.Column("f64", "float64", f64),
            mp.Column("index", "int64", i64)]
    path = str(tmp_path / "t.parquet")
    mp.write_table(path, cols, row_group_size=row_group_size, rows_per_page=rows_per_page,
                   compression=compression)
    want = {"observation.state": state, "action": action, "wide": wide, "timestamp": ts,
            "f64": f64, "index": i64}
    exp = {"num_rows": rows, "unsupported": {}, "columns": want}
    _check_against_expected(path, exp)
    assert _C.parquet_column_names(path) == list(want)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return
    back = pq.read_table(path)
    assert back.column_names == list(want)
    for name, values in want.items():
        assert back.column(name).to_pylist() == values, name


# Guards the bench's episode tables: the LeRobot v2.1 columns, in LeRobot's order and types.
def test_mini_parquet_lerobot_episode(tmp_path):
    mp = mini_parquet()
    path = str(tmp_path / "episode_000003.parquet")
    state = [[_f32(r + d / 8) for d in range(6)] for r in range(40)]
    action = [[_f32(-r - d / 8) for d in range(7)] for r in range(40)]
    mp.lerobot_episode(path, 3, 1000, 1, state, action, 30.0)
    got = _read(path, [])
    assert [c for c in got] == ["observation.state", "action", "timestamp", "frame_index",
                                "episode_index", "index", "task_index"]
    assert _py(got["observation.state"]) == state and _py(got["action"]) == action
    assert _py(got["timestamp"]) == [_f32(k / 30) for k in range(40)]
    assert _py(got["frame_index"]) == list(range(40))
    assert _py(got["episode_index"]) == [3] * 40 and _py(got["task_index"]) == [1] * 40
    assert _py(got["index"]) == list(range(1000, 1040))
