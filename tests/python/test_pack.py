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
        _C.pack(src, str(tmp_path / "db"), horizon=16)


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


# Guards: overwrite onto a user's folder raises FileExistsError and deletes nothing
# (the folder used to be replaced by the DB).
def test_overwrite_refuses_user_folder(tmp_path):
    src = _small(tmp_path)
    w = tmp_path / "w"
    w.mkdir()
    (w / "keep").write_text("k")
    with pytest.raises(FileExistsError, match=r"is not a LoongForge dataset"):
        packing.pack(src, str(w), overwrite=True)
    assert (w / "keep").read_text() == "k" and sorted(os.listdir(w)) == ["keep"]
    db = str(tmp_path / "db")
    packing.pack(src, db)
    assert packing.pack(src, db, horizon=2, overwrite=True)["schema"]["action_horizon"] == 2


# Guards: a truncated or empty data.mdb raises loongforge.DataLossError naming the file
# from every reader (inspect, RecordReader, DataFusionLoader), instead of killing Python (SIGBUS).
def test_truncated_db_raises_data_loss(tmp_path):
    import loongforge
    src = _small(tmp_path)
    db = str(tmp_path / "db")
    packing.pack(src, db)
    data = os.path.join(db, "data.mdb")
    size = os.path.getsize(data)
    for keep in (size // 2, 0):
        os.truncate(data, keep)
        for read in (lambda: packing.inspect_db(db), lambda: _C.RecordReader(db),
                     lambda: loongforge.DataFusionLoader(db, 2, image_size=16)):
            with pytest.raises(loongforge.DataLossError, match=r"data\.mdb: (truncated|empty)"):
                read()


# Guards: an instruction over max_instruction_bytes raises ValueError naming file:line.
def test_long_instruction_refused(tmp_path):
    src = _small(tmp_path)
    steps = os.path.join(src, "episodes", "000001", "steps.jsonl")
    with open(steps) as f:
        lines = [json.loads(line) for line in f]
    lines[0]["instruction"] = "a" * 100_000
    with open(steps, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in lines)
    with pytest.raises(ValueError, match=r"000001/steps\.jsonl:1: .* 100000 bytes, more than"):
        packing.pack(src, str(tmp_path / "db"))
    schema = packing.pack(src, str(tmp_path / "db"), max_instruction_bytes=100_000)["schema"]
    assert schema["max_tokens"] == 100_002


# Guards: bad option values are refused by the library: threads -3, repeated camera
# names (which used to write half the frames claimed).
def test_bad_values_raise_value_error(tmp_path):
    src = _small(tmp_path)
    with pytest.raises(ValueError, match=r"threads must be in 0\.\.1024"):
        packing.pack(src, str(tmp_path / "db"), threads=-3)
    with pytest.raises(ValueError, match=r"camera name 'a' is given twice"):
        packing.demo_data(str(tmp_path / "d"), episodes=1, cameras=2, width=16, height=16,
                          steps_min=2, steps_max=2, camera_names=["a", "a"])
    assert not os.path.exists(tmp_path / "db") and not os.path.exists(tmp_path / "d" / "episodes")


# Guards: a full disk while packing raises loongforge.ResourceExhaustedError naming
# data.mdb (it was "DataLoss: Input/output error"). A file-size limit makes the same short write.
def test_full_disk_raises_resource_exhausted(tmp_path):
    import subprocess
    import sys
    src = str(tmp_path / "src")
    packing.demo_data(src, episodes=2, cameras=2, width=64, height=48, steps_min=20, steps_max=20)
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (102400, 102400))\n"
            "import loongforge\n"
            "from loongforge import packing\n"
            "try:\n"
            "    packing.pack(sys.argv[1], sys.argv[2])\n"
            "except loongforge.ResourceExhaustedError as e:\n"
            "    print('RESOURCE', e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(packing.__file__)))
    r = subprocess.run([sys.executable, "-c", code, src, str(tmp_path / "db")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "RESOURCE" in r.stdout and "data.mdb" in r.stdout, r.stdout + r.stderr
    assert not os.path.exists(tmp_path / "db")


# Guards Note [Option tables] for the dataset tools: the defaults are the C++ structs' own, an
# unknown keyword lists the known ones, and an option only the table reaches (max_frame_pixels)
# takes effect.
def test_pack_options_come_from_one_table(tmp_path):
    from loongforge import packing

    assert _C.pack_options()["horizon"] == 16 and _C.pack_options()["tokenizer"] == "byte-v1"
    assert _C.pack_lerobot_options()["shortest_edge"] == 256
    assert _C.demo_data_options()["episodes"] == 8
    src = str(tmp_path / "raw")
    packing.demo_data(src, episodes=1, cameras=1, width=32, height=24, steps_min=4, steps_max=4)
    with pytest.raises(ValueError, match=r"pack: unknown option 'horizn' \(known: horizon, "):
        packing.pack(src, str(tmp_path / "db"), horizn=4)
    with pytest.raises(ValueError, match=r"demo_data: unknown option 'episode' \(known: "):
        packing.demo_data(str(tmp_path / "x"), episode=1)
    with pytest.raises(ValueError, match="pixels"):
        packing.pack(src, str(tmp_path / "db"), max_frame_pixels=100)
    assert packing.pack(src, str(tmp_path / "db"), horizon=2)["schema"]["action_horizon"] == 2
