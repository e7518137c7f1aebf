"""pack --from-lerobot on the committed LeRobot fixtures (tests/data/lerobot): frames, values,
metadata, and every kind of bad input (named error, no DB left behind).

The fixtures are v2.1 and v3.0 datasets whose parquet files pyarrow wrote (make_fixtures.py, with
`<file>.expected.json` holding what pyarrow reads) and whose videos Debian's ffmpeg wrote
(make_videos.sh: every frame draws its own position and episode as a block code; the front
camera is AV1, the wrist camera H.264). Tests that need them skip, saying why, where they are
absent; tests that need FFmpeg skip on a build without it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from lf_testdata import mini_parquet
from loongforge import packing

ROOT = os.path.join(os.path.dirname(__file__), "..", "data", "lerobot")
FORMATS = ["v2.1", "v3.0"]
CLI = os.environ.get("LOONGFORGE_CLI", os.path.join(os.path.dirname(__file__), "..", "..",
                                                    "build", "loongforge"))


def fixture(fmt: str) -> str:
    root = os.path.join(ROOT, fmt)
    data = os.path.join(root, "data", "chunk-000")
    if not os.path.isfile(os.path.join(root, "meta", "info.json")) or not os.path.isdir(data):
        pytest.skip(f"LeRobot fixture {fmt} has no parquet/meta yet (made by "
                    "tests/data/lerobot/make_fixtures.py with pyarrow)")
    if not packing.have_video_decoder():
        pytest.skip("this build lacks FFmpeg (pack --from-lerobot cannot decode videos)")
    return root


def expected_rows(fmt: str, episode: int) -> dict:
    """What pyarrow reads for the rows of `episode` (columns -> per-row values)."""
    root = os.path.join(ROOT, fmt)
    name = (f"episode_{episode:06d}.parquet" if fmt.startswith("v2") else "file-000.parquet")
    with open(os.path.join(root, "data", "chunk-000", name + ".expected.json")) as fh:
        cols = json.load(fh)["columns"]
    keep = [i for i, e in enumerate(cols["episode_index"]) if e == episode]
    return {k: [v[i] for i in keep] for k, v in cols.items()}


def frame_code(img: np.ndarray) -> tuple:
    """(position, episode) drawn by make_videos.sh: two rows of eight blocks, white = 1."""
    h, w, _ = img.shape
    pos = ep = 0
    for k in range(8):
        x = (2 * k + 1) * w // 16
        pos |= int(img[h // 4, x, 1] > 128) << k
        ep |= int(img[3 * h // 4, x, 1] > 128) << k
    return pos, ep


def no_db_left(out: str) -> bool:
    parent, base = os.path.split(out)
    return not os.path.exists(out) and not any(n.startswith(base + ".partial")
                                               for n in os.listdir(parent))


@pytest.fixture(scope="module", params=FORMATS)
def packed(request, tmp_path_factory):
    fmt = request.param
    src = fixture(fmt)
    out = str(tmp_path_factory.mktemp("lerobot") / "db")
    res = packing.pack_lerobot(src, out, size=(128, 96), quality=95, threads=2)
    return fmt, out, res


# Guards the frames: every stored frame is the one its row asks for, on AV1 (front) and
# H.264 (wrist), in v2.1 (per-episode files) and v3.0 (one file, from_timestamp offsets).
def test_every_frame_is_its_rows_frame(packed):
    fmt, out, res = packed
    schema = res["schema"]
    assert sorted(schema["cameras"]) == ["front", "wrist"]
    for ep in range(schema["num_episodes"]):
        e = packing.read_episode(out, ep)
        rows = expected_rows(fmt, ep)
        assert list(e["frame_index"]) == rows["frame_index"]
        for cam, imgs in e["images"].items():
            assert imgs.dtype == np.uint8 and imgs.shape[1:] == (96, 128, 3)
            for t in range(len(imgs)):
                want = rows["frame_index"][t] if fmt.startswith("v2") else rows["index"][t]
                assert frame_code(imgs[t]) == (want, ep), (cam, ep, t)


# Guards the values: state and action equal the parquet values exactly (float32), and
# timestamps, frame indices and task text are kept.
def test_state_action_timestamps_exact(packed):
    fmt, out, res = packed
    for ep in range(res["schema"]["num_episodes"]):
        e = packing.read_episode(out, ep)
        rows = expected_rows(fmt, ep)
        np.testing.assert_array_equal(e["state"], np.array(rows["observation.state"], np.float32))
        np.testing.assert_array_equal(e["action"], np.array(rows["action"], np.float32))
        np.testing.assert_array_equal(e["timestamp"], np.array(rows["timestamp"], np.float64))
        assert e["state"].dtype == np.float32 and e["action"].dtype == np.float32
        assert e["task"] and all(isinstance(t, str) and t for t in e["tasks"])


# Guards: the schema says where the DB came from and carries mean/std/min/max/q01/q99 of the
# packed rows (q01/q99 computed when the dataset lacks them), and inspect shows them.
def test_schema_statistics_and_inspect(packed):
    fmt, out, res = packed
    s = res["schema"]
    assert s["source_format"] == "lerobot " + fmt
    assert s["fps"] == 30
    states = np.concatenate([packing.read_episode(out, e)["state"]
                             for e in range(s["num_episodes"])])
    np.testing.assert_allclose(s["state_q01"], np.quantile(states, 0.01, axis=0), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(s["state_q99"], np.quantile(states, 0.99, axis=0), rtol=1e-5,
                               atol=1e-6)
    for k in ("state_mean", "state_std", "state_min", "state_max", "action_q01", "action_q99"):
        assert len(s[k]) == s["state_dim" if k.startswith("state") else "action_dim"]
    info = packing.inspect_db(out)
    assert info["schema"]["source_format"] == "lerobot " + fmt
    if os.path.exists(CLI):
        text = subprocess.run([CLI, "inspect", out], capture_output=True, text=True, check=True)
        assert "source format lerobot " + fmt in text.stdout and "state_q99" in text.stdout


# Guards --episodes and --cameras: only the chosen episodes/cameras are packed, and read_episode
# of an episode not packed is FileNotFoundError.
def test_episode_and_camera_selection(tmp_path):
    src = fixture("v2.1")
    out = str(tmp_path / "db")
    res = packing.pack_lerobot(src, out, episodes="0,2", cameras=["wrist"], shortest_edge=48)
    s = res["schema"]
    assert s["num_episodes"] == 2 and s["cameras"] == ["wrist"]
    assert (s["image_width"], s["image_height"]) == (64, 48)
    assert packing.read_episode(out, 2)["images"]["wrist"].shape[1:] == (48, 64, 3)
    with pytest.raises(FileNotFoundError, match="no episode 1"):
        packing.read_episode(out, 1)
    with pytest.raises(FileNotFoundError, match="episode 7 is not listed"):
        packing.pack_lerobot(src, str(tmp_path / "db2"), episodes="7")
    assert no_db_left(str(tmp_path / "db2"))


# Guards GR00T's modality.json: video.<name> keys become the camera names, slices are checked
# and kept in the schema.
def test_modality_names_cameras(tmp_path):
    src = copy_fixture("v2.1", tmp_path)
    with open(os.path.join(src, "meta", "modality.json"), "w") as fh:
        json.dump({"state": {"arm": {"start": 0, "end": 5}, "gripper": {"start": 5, "end": 6}},
                   "action": {"arm": {"start": 0, "end": 7}},
                   "video": {"ego": {"original_key": "observation.images.front"}},
                   "annotation": {"human.task_description": {"original_key": "task_index"}}}, fh)
    res = packing.pack_lerobot(src, str(tmp_path / "db"), shortest_edge=0)
    s = res["schema"]
    assert s["cameras"] == ["ego"]
    assert s["source_meta"]["modality"]["state"]["gripper"] == {"start": 5, "end": 6}


def copy_fixture(fmt: str, tmp_path) -> str:
    src = fixture(fmt)
    dst = str(tmp_path / fmt)
    shutil.copytree(src, dst)
    return dst


def video_path(root: str, fmt: str, cam: str, ep: int) -> str:
    if fmt.startswith("v2"):
        return os.path.join(root, "videos", "chunk-000", f"observation.images.{cam}",
                            f"episode_{ep:06d}.mp4")
    return os.path.join(root, "videos", f"observation.images.{cam}", "chunk-000", "file-000.mp4")


def expect_failure(src: str, tmp_path, exc, *needles, **kw):
    out = str(tmp_path / "out_db")
    with pytest.raises(exc) as ei:
        packing.pack_lerobot(src, out, **kw)
    for n in needles:
        assert n in str(ei.value), str(ei.value)
    assert no_db_left(out)
    return str(ei.value)


# Bad input: a missing video.
@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_video_named(tmp_path, fmt):
    src = copy_fixture(fmt, tmp_path)
    path = video_path(src, fmt, "wrist", 1)
    os.remove(path)
    expect_failure(src, tmp_path, FileNotFoundError, path)


# Bad input: a truncated video (half its bytes): DataLoss naming the file.
@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_video_named(tmp_path, fmt):
    src = copy_fixture(fmt, tmp_path)
    path = video_path(src, fmt, "front", 2)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)
    expect_failure(src, tmp_path, RuntimeError, path)


# Bad input: a video with fewer frames than its rows (episode 1's 16 rows, episode 0's 12 frames).
def test_fewer_frames_than_rows_named(tmp_path):
    src = copy_fixture("v2.1", tmp_path)
    shutil.copy(video_path(src, "v2.1", "front", 0), video_path(src, "v2.1", "front", 1))
    msg = expect_failure(src, tmp_path, RuntimeError, video_path(src, "v2.1", "front", 1),
                         "frame_index 12", "fewer frames than rows")
    assert "episode 1" in msg


# Bad input: a row timestamp with no frame within tolerance (the fixture's float32 timestamps are
# ~1e-8 s off the frames' pts; a 1e-12 s tolerance leaves no frame for them).
@pytest.mark.parametrize("fmt", FORMATS)
def test_timestamp_without_frame_named(tmp_path, fmt):
    src = fixture(fmt)
    expect_failure(src, tmp_path, FileNotFoundError, ".mp4", "no frame within",
                   tolerance_s=1e-12)


# Bad input: info.json that disagrees with the files (state shape; video size).
@pytest.mark.parametrize("fmt", FORMATS)
def test_info_json_disagreeing_named(tmp_path, fmt):
    src = copy_fixture(fmt, tmp_path)
    info_path = os.path.join(src, "meta", "info.json")
    with open(info_path) as fh:
        info = json.load(fh)
    good = json.loads(json.dumps(info))
    info["features"]["observation.state"]["shape"] = [5]
    with open(info_path, "w") as fh:
        json.dump(info, fh)
    expect_failure(src, tmp_path, ValueError, ".parquet", "observation.state",
                   "meta/info.json says 5")
    good["features"]["observation.images.front"]["shape"] = [480, 640, 3]
    for k in ("info", "video_info"):
        good["features"]["observation.images.front"].pop(k, None)
    with open(info_path, "w") as fh:
        json.dump(good, fh)
    expect_failure(src, tmp_path, ValueError, ".mp4", "640x480")


# Bad input: episode metadata that disagrees with the parquet row count.
def test_episode_length_disagreeing_named(tmp_path):
    src = copy_fixture("v2.1", tmp_path)
    path = os.path.join(src, "meta", "episodes.jsonl")
    with open(path) as fh:
        lines = [json.loads(l) for l in fh if l.strip()]
    lines[1]["length"] += 1
    with open(path, "w") as fh:
        fh.writelines(json.dumps(l) + "\n" for l in lines)
    expect_failure(src, tmp_path, ValueError, "episode_000001.parquet", "metadata says length")


# Bad input: a modality.json slice out of range.
def test_modality_slice_out_of_range_named(tmp_path):
    src = copy_fixture("v3.0", tmp_path)
    path = os.path.join(src, "meta", "modality.json")
    with open(path, "w") as fh:
        json.dump({"state": {"arm": {"start": 0, "end": 99}}}, fh)
    expect_failure(src, tmp_path, ValueError, path, "state.arm", "out of range")


# Guards the CLI: `pack --from-lerobot` on bad input exits non-zero with one line naming the file.
def test_cli_bad_input_exit_code(tmp_path):
    if not os.path.exists(CLI):
        pytest.skip("no CLI binary at " + CLI)
    src = copy_fixture("v2.1", tmp_path)
    path = video_path(src, "v2.1", "front", 0)
    os.remove(path)
    out = str(tmp_path / "cli_db")
    r = subprocess.run([CLI, "pack", "--quiet", "--from-lerobot", src, "--out", out],
                       capture_output=True, text=True)
    assert r.returncode not in (0,) and r.returncode < 128
    assert path in r.stderr
    assert no_db_left(out)


# ---- hostile metadata: every check names the file and the row, nothing hangs ----

def rewrite_v21_episode(src: str, ep: int, timestamps) -> str:
    """Rewrites episode `ep`'s parquet of a v2.1 copy with other timestamps (None: null)."""
    mp = mini_parquet()
    rows = expected_rows("v2.1", ep)
    path = os.path.join(src, "data", "chunk-000", f"episode_{ep:06d}.parquet")
    cols = [mp.Column("observation.state", ("list_float32", len(rows["observation.state"][0])),
                      rows["observation.state"]),
            mp.Column("action", ("list_float32", len(rows["action"][0])), rows["action"]),
            mp.Column("timestamp", "float32", timestamps),
            mp.Column("frame_index", "int64", rows["frame_index"]),
            mp.Column("episode_index", "int64", rows["episode_index"]),
            mp.Column("index", "int64", rows["index"]),
            mp.Column("task_index", "int64", rows["task_index"])]
    mp.write_table(path, cols)
    return path


def rewrite_v30_episodes(src: str, over: dict) -> str:
    """Rewrites the v3.0 copy's episode table with columns replaced by `over` (name -> values)."""
    mp = mini_parquet()
    path = os.path.join(src, "meta", "episodes", "chunk-000", "file-000.parquet")
    with open(os.path.join(ROOT, "v3.0", "meta", "episodes", "chunk-000",
                           "file-000.parquet.expected.json")) as fh:
        cols = json.load(fh)["columns"]
    cols.update(over)
    out = []
    for name, values in cols.items():
        if name.endswith("from_timestamp") or name.endswith("to_timestamp"):
            out.append(mp.Column(name, "float64", values))
        elif name in ("episode_index", "length", "dataset_from_index", "dataset_to_index") or \
                name.endswith("chunk_index") or name.endswith("file_index"):
            out.append(mp.Column(name, "int64", values))
    mp.write_table(path, out)
    return path


def cli_fails(src: str, tmp_path, *needles, timeout=60):
    """Runs the CLI on `src` with a time limit: it must fail (1..127) naming `needles`, with no DB
    or staging left behind."""
    if not os.path.exists(CLI):
        pytest.skip("no CLI binary at " + CLI)
    out = str(tmp_path / "cli_db")
    try:
        r = subprocess.run([CLI, "pack", "--quiet", "--from-lerobot", src, "--out", out],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pack --from-lerobot {src} still running after {timeout} s")
    assert 0 < r.returncode < 128, (r.returncode, r.stderr)
    for n in needles:
        assert n in r.stderr, r.stderr
    assert no_db_left(out) and not os.path.exists(out + ".lock"), os.listdir(tmp_path)
    return r.stderr


# A null timestamp read as 0.0 gave row 1 frame 0; a repeated one gave two rows one frame;
# negative and NaN times have no frame.
@pytest.mark.parametrize("bad,needle", [(None, "timestamp is null"),
                                        ("dup", "does not increase"),
                                        (-1.0, "not a finite time >= 0"),
                                        (float("nan"), "not a finite time >= 0")])
def test_bad_timestamp_named(tmp_path, bad, needle):
    src = copy_fixture("v2.1", tmp_path)
    ts = list(expected_rows("v2.1", 0)["timestamp"])
    ts[1] = ts[0] if bad == "dup" else bad
    path = rewrite_v21_episode(src, 0, ts)
    expect_failure(src, tmp_path, ValueError, path, "row 1", needle)


# A timestamp past the video's end (by 2 s and more, or 1e9) is an error naming the video, the
# row and the duration: before, the reader re-seeked to the last keyframe forever.
@pytest.mark.parametrize("last", [0.4 + 2.5, 1e9])
def test_timestamp_past_video_end_named(tmp_path, last):
    src = copy_fixture("v2.1", tmp_path)
    ts = list(expected_rows("v2.1", 0)["timestamp"])
    ts[-1] = last
    rewrite_v21_episode(src, 0, ts)
    cli_fails(src, tmp_path, video_path(src, "v2.1", "front", 0), "past the end of the video",
              "frame_index 11")


# v3.0 from_timestamp inf / past the end of the file: named, never an endless decode.
@pytest.mark.parametrize("offset,needle", [(float("inf"), "from_timestamp inf"),
                                           (100.0, "past the end of the video")])
def test_v30_from_timestamp_bad_named(tmp_path, offset, needle):
    src = copy_fixture("v3.0", tmp_path)
    with open(os.path.join(ROOT, "v3.0", "meta", "episodes", "chunk-000",
                           "file-000.parquet.expected.json")) as fh:
        ft = json.load(fh)["columns"]["videos/observation.images.front/from_timestamp"]
    ft[1] = offset
    rewrite_v30_episodes(src, {"videos/observation.images.front/from_timestamp": ft})
    cli_fails(src, tmp_path, "file-000.parquet" if offset != 100.0 else "file-000.mp4", needle)


# A negative dataset_from_index turned off the index continuity check.
def test_v30_negative_from_index_named(tmp_path):
    src = copy_fixture("v3.0", tmp_path)
    path = rewrite_v30_episodes(src, {"dataset_from_index": [-12, 12, 28],
                                      "dataset_to_index": [0, 28, 48]})
    expect_failure(src, tmp_path, ValueError, path, "row 0", "dataset_from_index -12",
                   "none may be negative")


# tasks.jsonl listing a task_index twice with different texts.
def test_duplicate_task_index_named(tmp_path):
    src = copy_fixture("v2.1", tmp_path)
    path = os.path.join(src, "meta", "tasks.jsonl")
    with open(path, "a") as fh:
        fh.write(json.dumps({"task_index": 0, "task": "something else"}) + "\n")
    expect_failure(src, tmp_path, ValueError, path + ":3", "something else",
                   "pick up the red cube")


# Paths formed from templates stay in the dataset root: "..", absolute, a symlink out.
@pytest.mark.parametrize("key", ["data_path", "video_path"])
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_template_path_outside_root_refused(tmp_path, key, how):
    src = copy_fixture("v2.1", tmp_path)
    info_path = os.path.join(src, "meta", "info.json")
    with open(info_path) as fh:
        info = json.load(fh)
    outside = str(tmp_path / "outside")
    top = info[key].split("/")[0]  # "data" or "videos"
    shutil.copytree(os.path.join(src, top), os.path.join(outside, top))
    if how == "dotdot":
        info[key] = "../outside/" + info[key]
    elif how == "absolute":
        info[key] = outside + "/" + info[key]
    else:
        shutil.rmtree(os.path.join(src, top))
        os.symlink(os.path.join(outside, top), os.path.join(src, top))
    with open(info_path, "w") as fh:
        json.dump(info, fh)
    expect_failure(src, tmp_path, ValueError, key, info[key], "stay inside the dataset")


# Metadata that is a directory aborted the CLI (basic_filebuf::underflow) leaving OUT.lock and a
# staging directory; a FIFO video or parquet blocked it forever.
@pytest.mark.parametrize("rel,kind", [
    ("meta/info.json", "directory"), ("meta/modality.json", "directory"),
    ("meta/tasks.jsonl", "directory"), ("meta/episodes.jsonl", "directory"),
    ("videos/chunk-000/observation.images.front/episode_000001.mp4", "FIFO"),
    ("data/chunk-000/episode_000001.parquet", "FIFO")])
def test_non_regular_metadata_or_media_named(tmp_path, rel, kind):
    src = copy_fixture("v2.1", tmp_path)
    path = os.path.join(src, rel)
    if os.path.exists(path):
        os.remove(path)
    if kind == "directory":
        os.makedirs(path)
    else:
        os.mkfifo(path)
    cli_fails(src, tmp_path, path, kind)


# v3.0: an episode table file that is a symlink out of the dataset is refused as well.
def test_v30_episode_file_symlink_outside_refused(tmp_path):
    src = copy_fixture("v3.0", tmp_path)
    path = os.path.join(src, "meta", "episodes", "chunk-000", "file-000.parquet")
    outside = str(tmp_path / "outside.parquet")
    shutil.move(path, outside)
    os.symlink(outside, path)
    expect_failure(src, tmp_path, ValueError, "meta/episodes/chunk-000/file-000.parquet",
                   "outside", "stay inside the dataset")
