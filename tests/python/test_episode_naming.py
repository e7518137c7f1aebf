"""inspect and packing.read_episode name a LeRobot pack's episodes the same way: by the source's
episode_index (LeRobot's own numbering), also when only some episodes were packed."""
import os
import struct

import numpy as np
import pytest

from lf_testdata import pack_lerobot_fixture
from loongforge import _C, packing

LEROBOT = os.path.join(os.path.dirname(__file__), "..", "data", "lerobot", "v2.1")
LENGTHS = {0: 12, 1: 16, 2: 20}  # meta/episodes.jsonl of the fixture


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return pack_lerobot_fixture(str(tmp_path_factory.mktemp("episodes") / "db"), episodes="1,2",
                                horizon=4)


def _expected():
    """(sample id, episode_index, step) of every sample of the "1,2" pack."""
    rows, sid = [], 0
    for ep in (1, 2):
        for t in range(LENGTHS[ep]):
            rows.append((sid, ep, t))
            sid += 1
    return rows


def _check(db):
    episodes = {ep: packing.read_episode(db, ep) for ep in (1, 2)}
    for sid, ep, t in _expected():
        x = packing.inspect_db(db, sid)["sample"]
        assert (x["episode"], x["step"]) == (ep, t), f"sample {sid}"
        e = episodes[ep]
        assert e["frame_index"][t] == t
        np.testing.assert_array_equal(np.asarray(x["state"], np.float32), e["state"][t])
    with pytest.raises(FileNotFoundError, match="no episode 0"):
        packing.read_episode(db, 0)


# Guards the naming on a new pack: inspect's episode is the number read_episode takes, and the
# "_meta" record holds it.
def test_inspect_and_read_episode_agree(db):
    _check(db)
    r = _C.RecordReader(db)
    assert struct.unpack("<2i", r.get("00000016_meta")) == (2, 0)


# Guards DBs packed before "_meta" held the episode_index (it held the pack position 0, 1, ...):
# inspect still names the source's episodes.
def test_old_meta_records(db, tmp_path):
    r = _C.RecordReader(db)
    w = _C.RecordWriter(str(tmp_path / "old"))
    for k in r.keys():
        if k == "__schema__":
            continue
        v = r.get(k)
        if k.endswith("_meta"):
            ep, t = struct.unpack("<2i", v)
            v = struct.pack("<2i", ep - 1, t)
        w.put(k, v)
    w.commit(r.schema_json)
    assert struct.unpack("<2i", _C.RecordReader(str(tmp_path / "old")).get("00000016_meta")) == (1, 0)
    _check(str(tmp_path / "old"))
