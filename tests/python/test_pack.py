"""Python side of the dataset tools: demo_data -> pack -> inspect, and C++ errors as exceptions."""
import json
import os

import numpy as np
import pytest

# The read-back check uses py-lmdb as an independent reader (Debian's python3-lmdb; the GPU
# machine's Python has none, and the packer is CPU code tested here).
lmdb = pytest.importorskip("lmdb")

from loongforge import _C
from loongforge import packing


def _small(tmp_path, episodes=2):
    src = str(tmp_path / "src")
    packing.demo_data(src, episodes=episodes, cameras=2, width=48, height=32, seed=3,
                      steps_min=3, steps_max=5, state_dim=4, action_dim=3)
    return src


# Guards the binding round trip and that the DB is readable by a third-party LMDB reader with the
# documented layout (keys, dtypes, shapes).
def test_demo_pack_inspect_roundtrip(tmp_path):
    src = _small(tmp_path)
    db = str(tmp_path / "db")
    r = packing.pack(src, db, horizon=4)
    schema = r["schema"]
    assert schema["cameras"] == ["front", "wrist"]
    assert (schema["image_width"], schema["image_height"]) == (48, 32)
    n = schema["num_samples"]
    assert n >= 6
    info = packing.inspect_db(db, sample=n - 1)
    assert info["sample"]["amask"] == [1, 0, 0, 0]  # last step of the last episode
    assert info["modalities"]["cam_front"]["count"] == n
    env = lmdb.open(db, readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        state = np.frombuffer(txn.get(b"00000000_state"), dtype="<f4")
        action = np.frombuffer(txn.get(b"00000000_action"), dtype="<f4").reshape(4, 3)
        tokens = np.frombuffer(txn.get(b"00000000_tokens"), dtype="<i4")
        jpeg = txn.get(b"00000000_cam_wrist")
    env.close()
    assert state.shape == (4,)
    assert np.array_equal(action[0], np.array(_first_line(src)["action"], dtype=np.float32))
    assert tokens[0] == 1 and tokens[-1] == 2
    assert jpeg[:2] == b"\xff\xd8"
    with open(os.path.join(src, "episodes", "000000", "cam_wrist", "0.jpg"), "rb") as f:
        assert f.read() == jpeg
    assert list(tokens) == _C.tokenize(_first_line(src)["instruction"])


def _first_line(src):
    with open(os.path.join(src, "episodes", "000000", "steps.jsonl")) as f:
        return json.loads(f.readline())


# Guards error translation: a non-JPEG frame raises ValueError naming the file, and no DB is left.
def test_bad_frame_raises_value_error_naming_file(tmp_path):
    src = _small(tmp_path)
    bad = os.path.join(src, "episodes", "000001", "cam_front", "1.jpg")
    with open(bad, "wb") as f:
        f.write(b"definitely not a jpeg")
    db = str(tmp_path / "db")
    with pytest.raises(ValueError, match=r"000001/cam_front/1\.jpg: not a JPEG"):
        packing.pack(src, db)
    assert not os.path.exists(db) and not os.path.exists(db + ".partial")


# Guards error translation for steps.jsonl: file:line in a ValueError.
def test_bad_json_line_raises_value_error_with_line(tmp_path):
    src = _small(tmp_path)
    steps = os.path.join(src, "episodes", "000000", "steps.jsonl")
    with open(steps) as f:
        lines = f.readlines()
    lines[1] = "{oops\n"
    with open(steps, "w") as f:
        f.writelines(lines)
    with pytest.raises(ValueError, match=r"000000/steps\.jsonl:2: not valid JSON"):
        _C.pack(src, str(tmp_path / "db"), 16, False)


# Guards the other exception kinds: missing frame -> FileNotFoundError, existing output -> FileExistsError.
def test_missing_frame_and_existing_output(tmp_path):
    src = _small(tmp_path)
    db = str(tmp_path / "db")
    packing.pack(src, db)
    with pytest.raises(FileExistsError):
        packing.pack(src, db)
    os.remove(os.path.join(src, "episodes", "000000", "cam_wrist", "2.jpg"))
    with pytest.raises(FileNotFoundError, match=r"cam_wrist/2\.jpg: missing frame for step 2"):
        packing.pack(src, str(tmp_path / "db2"))
