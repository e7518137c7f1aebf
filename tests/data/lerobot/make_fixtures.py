#!/usr/bin/env python3
"""Builds the committed LeRobot parquet fixtures with pyarrow (the real writer LeRobot uses).

CI has no pyarrow, so the output is committed. Run on a machine with pyarrow, from the repo root:

    python3 tests/data/lerobot/make_fixtures.py            # writes under tests/data/lerobot/

Writes:
  v2.1/  meta/{info.json,episodes.jsonl,tasks.jsonl,episodes_stats.jsonl},
         data/chunk-000/episode_00000{0,1,2}.parquet  (fixed_size_list<float>[N] state/action, snappy)
  v3.0/  meta/{info.json,tasks.parquet}, meta/episodes/chunk-000/file-000.parquet,
         data/chunk-000/file-000.parquet  (list<float> state/action, snappy)
  features/  one file per reader feature (codecs, dictionary strings, nulls, data page v2, several
         row groups and pages, page checksums, every physical type) and files with features the
         reader refuses (INT96, struct, list of lists, DELTA encoding, LZ4).
Next to every parquet, `<file>.expected.json` holds the values pyarrow reads:
  {"num_rows": N, "columns": {name: [row values]}, "unsupported": {name: feature}}
where list columns are lists per row, nulls are null, bytes are {"hex": ...}, and `unsupported` names the columns the
LoongForge reader must refuse (their values are omitted). Videos (videos/...) are made separately;
info.json's video paths follow LeRobot's templates.
The content is deterministic (fixed seed), so re-running reproduces the same values.
"""
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.abspath(__file__))
FPS = 30
STATE_DIM = 6
ACTION_DIM = 7
LENGTHS = [12, 16, 20]
TASKS = ["pick up the red cube", "place the cube in the bowl"]
EPISODE_TASK = [0, 1, 0]
CAMERAS = ["observation.images.front", "observation.images.wrist"]
VIDEO_SIZE = (96, 128)  # height, width: w4's videos must match


def unsupported_feature(t):
    """The feature the LoongForge reader refuses in arrow type t, or None (Note [Parquet subset])."""
    if pa.types.is_struct(t):
        return "nested struct"
    if pa.types.is_map(t):
        return "map type"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        v = t.value_type
        if pa.types.is_list(v) or pa.types.is_fixed_size_list(v) or pa.types.is_large_list(v):
            return "nested list"
        return unsupported_feature(v)
    if pa.types.is_decimal(t):
        return "DECIMAL"
    if pa.types.is_uint64(t):
        return None  # supported while values fit int64
    if pa.types.is_fixed_size_binary(t) or pa.types.is_float16(t):
        return "FIXED_LEN_BYTE_ARRAY"
    return None


def to_json(v):
    """JSON form of a pyarrow value: bytes (non-UTF-8 BYTE_ARRAY) as {"hex": ...}."""
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, list):
        return [to_json(x) for x in v]
    return v


def write(table, path, expect_unsupported=None, **kw):
    """Writes table to path with pyarrow and path.expected.json with what pyarrow reads back."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kw.setdefault("compression", "snappy")
    pq.write_table(table, path, **kw)
    back = pq.read_table(path)
    cols, unsupported = {}, dict(expect_unsupported or {})
    for name in back.column_names:
        f = unsupported.get(name) or unsupported_feature(back.schema.field(name).type)
        if f:
            unsupported[name] = f
            continue
        cols[name] = [to_json(v) for v in back.column(name).to_pylist()]
    exp = {"num_rows": back.num_rows, "columns": cols, "unsupported": unsupported}
    with open(path + ".expected.json", "w") as fh:
        json.dump(exp, fh, indent=None, separators=(",", ":"))
        fh.write("\n")


def episode_rows(rng, ep, start_index, list_type):
    n = LENGTHS[ep]
    state = rng.standard_normal((n, STATE_DIM)).astype(np.float32)
    action = rng.standard_normal((n, ACTION_DIM)).astype(np.float32)
    frame = np.arange(n, dtype=np.int64)
    return {
        "observation.state": pa.array(list(state), type=list_type(STATE_DIM)),
        "action": pa.array(list(action), type=list_type(ACTION_DIM)),
        "timestamp": pa.array((frame / FPS).astype(np.float32)),
        "frame_index": pa.array(frame),
        "episode_index": pa.array(np.full(n, ep, dtype=np.int64)),
        "index": pa.array(np.arange(start_index, start_index + n, dtype=np.int64)),
        "task_index": pa.array(np.full(n, EPISODE_TASK[ep], dtype=np.int64)),
    }, state, action


def features(video_info_key, version):
    f = {
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM],
                              "names": [f"joint_{i}" for i in range(STATE_DIM)]},
        "action": {"dtype": "float32", "shape": [ACTION_DIM],
                   "names": [f"joint_{i}" for i in range(ACTION_DIM)]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    for cam in CAMERAS:
        f[cam] = {
            "dtype": "video", "shape": [VIDEO_SIZE[0], VIDEO_SIZE[1], 3],
            "names": ["height", "width", "channels"],
            video_info_key: {"video.height": VIDEO_SIZE[0], "video.width": VIDEO_SIZE[1],
                             "video.codec": "h264" if cam.endswith("wrist") else "av1",
                             "video.pix_fmt": "yuv420p",
                             "video.is_depth_map": False, "video.fps": FPS, "video.channels": 3,
                             "has_audio": False},
        }
    return f


def stats(x):
    return {"min": x.min(0).tolist(), "max": x.max(0).tolist(), "mean": x.mean(0).tolist(),
            "std": x.std(0).tolist(), "count": [len(x)]}


def write_info(root, version, sizes, data_path, video_path):
    """Writes root/meta/info.json as LeRobot `version` does; `sizes` are its version's size and
    count fields (they stand between total_tasks and fps)."""
    info = {
        "codebase_version": version, "robot_type": "loongforge_fixture",
        "total_episodes": len(LENGTHS), "total_frames": sum(LENGTHS), "total_tasks": len(TASKS),
        **sizes,
        "fps": FPS, "splits": {"train": f"0:{len(LENGTHS)}"},
        "data_path": data_path, "video_path": video_path,
        "features": features("info", version),
    }
    os.makedirs(os.path.join(root, "meta"), exist_ok=True)
    with open(os.path.join(root, "meta/info.json"), "w") as fh:
        json.dump(info, fh, indent=4)


def make_v21(rng):
    root = os.path.join(ROOT, "v2.1")
    write_info(root, "v2.1",
               {"total_videos": len(LENGTHS) * len(CAMERAS), "total_chunks": 1,
                "chunks_size": 1000},
               "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
               "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4")
    with open(os.path.join(root, "meta/tasks.jsonl"), "w") as fh:
        for i, t in enumerate(TASKS):
            fh.write(json.dumps({"task_index": i, "task": t}) + "\n")
    ep_lines, stat_lines, start = [], [], 0
    for ep, n in enumerate(LENGTHS):
        cols, state, action = episode_rows(rng, ep, start, lambda d: pa.list_(pa.float32(), d))
        write(pa.table(cols),
              os.path.join(root, f"data/chunk-000/episode_{ep:06d}.parquet"))
        ep_lines.append({"episode_index": ep, "tasks": [TASKS[EPISODE_TASK[ep]]], "length": n})
        frame = np.arange(n, dtype=np.float64)[:, None]
        stat_lines.append({"episode_index": ep, "stats": {
            "observation.state": stats(state.astype(np.float64)),
            "action": stats(action.astype(np.float64)),
            "timestamp": stats(frame / FPS), "frame_index": stats(frame),
        }})
        start += n
    with open(os.path.join(root, "meta/episodes.jsonl"), "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in ep_lines)
    with open(os.path.join(root, "meta/episodes_stats.jsonl"), "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in stat_lines)


def make_v30(rng):
    root = os.path.join(ROOT, "v3.0")
    write_info(root, "v3.0",
               {"chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500},
               "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
               "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    parts, start, ep_cols = [], 0, {k: [] for k in [
        "episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
        "dataset_from_index", "dataset_to_index"]}
    video_cols = {}
    all_state, all_action = [], []
    for ep, n in enumerate(LENGTHS):
        cols, state, action = episode_rows(rng, ep, start, lambda d: pa.list_(pa.float32()))
        parts.append(pa.table(cols))
        all_state.append(state)
        all_action.append(action)
        ep_cols["episode_index"].append(ep)
        ep_cols["tasks"].append([TASKS[EPISODE_TASK[ep]]])
        ep_cols["length"].append(n)
        ep_cols["data/chunk_index"].append(0)
        ep_cols["data/file_index"].append(0)
        ep_cols["dataset_from_index"].append(start)
        ep_cols["dataset_to_index"].append(start + n)
        for cam in CAMERAS:  # all episodes in one video file per camera, back to back
            video_cols.setdefault(f"videos/{cam}/chunk_index", []).append(0)
            video_cols.setdefault(f"videos/{cam}/file_index", []).append(0)
            video_cols.setdefault(f"videos/{cam}/from_timestamp", []).append(start / FPS)
            video_cols.setdefault(f"videos/{cam}/to_timestamp", []).append((start + n) / FPS)
        start += n
    write(pa.concat_tables(parts), os.path.join(root, "data/chunk-000/file-000.parquet"))
    ep_table = {k: pa.array(v, type=pa.list_(pa.string()) if k == "tasks" else pa.int64())
                for k, v in ep_cols.items()}
    ep_table.update({k: pa.array(v, type=pa.float64() if "timestamp" in k else pa.int64())
                     for k, v in video_cols.items()})
    for key, per_ep in (("observation.state", all_state), ("action", all_action)):
        for stat in ("min", "max", "mean", "std"):
            ep_table[f"stats/{key}/{stat}"] = pa.array(
                [getattr(x.astype(np.float64), stat)(0).tolist() for x in per_ep],
                type=pa.list_(pa.float64()))
    # Image statistics are [3, 1, 1] nested lists in LeRobot: a column the reader refuses, while
    # the others of the file still read.
    ep_table[f"stats/{CAMERAS[0]}/mean"] = pa.array(
        [[[[0.5]], [[0.5]], [[0.5]]] for _ in LENGTHS],
        type=pa.list_(pa.list_(pa.list_(pa.float64()))))
    ep_table["meta/episodes/chunk_index"] = pa.array([0] * len(LENGTHS), type=pa.int64())
    ep_table["meta/episodes/file_index"] = pa.array([0] * len(LENGTHS), type=pa.int64())
    write(pa.table(ep_table), os.path.join(root, "meta/episodes/chunk-000/file-000.parquet"))
    # LeRobot keeps tasks as a DataFrame indexed by the task text; pyarrow stores that index as a
    # plain column named after it.
    write(pa.table({"task_index": pa.array(range(len(TASKS)), type=pa.int64()),
                    "task": pa.array(TASKS)}), os.path.join(root, "meta/tasks.parquet"))


def make_features(rng):
    root = os.path.join(ROOT, "features")
    n = 300
    base = pa.table({
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f64": pa.array(rng.standard_normal(n)),
        "i64": pa.array(rng.integers(-2**62, 2**62, n)),
        "vec": pa.array(list(rng.standard_normal((n, 5)).astype(np.float32)),
                        type=pa.list_(pa.float32(), 5)),
    })
    write(base, f"{root}/compression_none.parquet", compression="none")
    write(base, f"{root}/compression_zstd.parquet", compression="zstd")
    write(base, f"{root}/compression_gzip.parquet", compression="gzip")
    words = ["pick", "place", "push", "", "open the drawer", "日本語"]
    write(pa.table({"task": pa.array([words[i] for i in rng.integers(0, len(words), n)]),
                    "idx": pa.array(rng.integers(0, 4, n))}),
          f"{root}/dictionary_strings.parquet", use_dictionary=True)
    null = rng.random(n) < 0.3
    lists = []
    for i in range(n):
        k = int(rng.integers(0, 4))
        lists.append([None if rng.random() < 0.2 else float(np.float32(rng.standard_normal()))
                      for _ in range(k)])
    nullable = pa.table({
        "i": pa.array([None if null[i] else int(i) for i in range(n)], type=pa.int32()),
        "d": pa.array([None if null[(i + 7) % n] else float(i) / 3 for i in range(n)]),
        "s": pa.array([None if null[(i + 3) % n] else f"s{i}" for i in range(n)]),
        "b": pa.array([None if null[(i + 5) % n] else bool(i % 3) for i in range(n)]),
        "l": pa.array(lists, type=pa.list_(pa.float32())),
    })
    write(nullable, f"{root}/nullable.parquet")
    write(nullable, f"{root}/data_page_v2.parquet", data_page_version="2.0",
          compression="zstd")
    write(base, f"{root}/row_groups_and_pages.parquet", row_group_size=70, data_page_size=256,
          write_batch_size=16)
    write(base, f"{root}/page_checksum.parquet", write_page_checksum=True)
    write(pa.table({
        "flag": pa.array(rng.random(n) < 0.5),
        "i8": pa.array(rng.integers(-128, 128, n).astype(np.int8)),
        "i32": pa.array(rng.integers(-2**31, 2**31, n).astype(np.int32)),
        "u8": pa.array(rng.integers(0, 256, n).astype(np.uint8)),
        "u32": pa.array(rng.integers(0, 2**32, n).astype(np.uint32)),
        "u64": pa.array(rng.integers(0, 2**62, n).astype(np.uint64)),
        "bin": pa.array([bytes([i % 256, 0, 255]) for i in range(n)], type=pa.binary()),
    }), f"{root}/physical_types.parquet")
    # Features the reader refuses (value checks are replaced by the expected error).
    ts = pa.array(np.arange(4).astype("datetime64[ns]"))
    write(pa.table({"ts": ts, "ok": pa.array([1, 2, 3, 4])}), f"{root}/unsupported_int96.parquet",
          expect_unsupported={"ts": "INT96"}, use_deprecated_int96_timestamps=True)
    write(pa.table({"s": pa.array([{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}]),
                    "ok": pa.array([1, 2])}), f"{root}/unsupported_struct.parquet")
    write(pa.table({"ll": pa.array([[[1.0], [2.0, 3.0]], [[]]]), "ok": pa.array([1, 2])}),
          f"{root}/unsupported_nested_list.parquet")
    write(pa.table({"x": pa.array(np.arange(100, dtype=np.int64)), "ok": pa.array(range(100))}),
          f"{root}/unsupported_delta.parquet", expect_unsupported={"x": "DELTA_BINARY_PACKED"},
          use_dictionary=False, column_encoding={"x": "DELTA_BINARY_PACKED"})
    write(pa.table({"x": pa.array(np.arange(100, dtype=np.int64))}),
          f"{root}/unsupported_lz4.parquet", expect_unsupported={"x": "LZ4"}, compression="lz4")


def main():
    rng = np.random.default_rng(19)
    make_v21(rng)
    make_v30(rng)
    make_features(rng)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ROOT) for f in fs)
    print(f"fixtures under {ROOT}: {size} bytes (pyarrow {pa.__version__})")
    return 0 if size < 1 << 20 else 1


if __name__ == "__main__":
    sys.exit(main())
