"""The task text in every batch (key `task`, one str per row), from what the DB stores."""
import glob
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from loongforge import _C, packing  # noqa: E402
from loongforge.data import DataFusionLoader  # noqa: E402
from lf_testdata import pack_lerobot_fixture  # noqa: E402
from lf_testdata import make_db  # noqa: E402

LEROBOT = os.path.join(os.path.dirname(__file__), "..", "data", "lerobot", "v2.1")


@pytest.fixture(scope="module")
def episode_db(tmp_path_factory):
    """A `pack` of demo episodes whose instruction changes every step (non-ASCII included);
    returns (db, the instruction of each sample in pack order, read from the steps files)."""
    root = tmp_path_factory.mktemp("task")
    packing.demo_data(str(root / "raw"), episodes=3, cameras=1, width=64, height=48,
                      steps_min=5, steps_max=7, state_dim=3, action_dim=2)
    texts = []
    for e, steps in enumerate(sorted(glob.glob(str(root / "raw" / "episodes" / "*" /
                                                   "steps.jsonl")))):
        rows = [json.loads(line) for line in open(steps)]
        for r in rows:
            r["instruction"] = f"épisode {e}: étape {r['step']} ☕" if r["step"] % 3 else ""
            texts.append(r["instruction"])
        with open(steps, "w") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    packing.pack(str(root / "raw"), str(root / "db"))
    return str(root / "db"), texts


def _lerobot_texts():
    tasks = {}
    for line in open(os.path.join(LEROBOT, "meta", "tasks.jsonl")):
        t = json.loads(line)
        tasks[t["task_index"]] = t["task"]
    by_text = {v: v for v in tasks.values()}
    texts = []
    for line in open(os.path.join(LEROBOT, "meta", "episodes.jsonl")):
        e = json.loads(line)
        texts += [by_text[e["tasks"][0]]] * e["length"]
    return texts


@pytest.fixture(scope="module")
def lerobot_db(tmp_path_factory):
    return pack_lerobot_fixture(str(tmp_path_factory.mktemp("task_lerobot") / "db"), quality=90,
                                horizon=4)


def _without_task_records(src, dst):
    """A copy of `src` as a DB packed before "{id}_task" records existed."""
    r = _C.RecordReader(src)
    w = _C.RecordWriter(dst)
    for k in r.keys():
        if k != "__schema__" and not k.endswith("_task"):
            w.put(k, r.get(k))
    w.commit(r.schema_json)
    return dst


def _all_tasks(db, **kw):
    """{sample_index: task} over one epoch, checking every batch's list."""
    got = {}
    ld = DataFusionLoader(db, 4, image_size=16, threads=1, drop_last=False, **kw)
    for b in ld:
        assert isinstance(b["task"], list) and len(b["task"]) == b["tokens"].shape[0]
        assert all(isinstance(t, str) for t in b["task"])
        for i, t in zip(b["sample_index"].tolist(), b["task"]):
            got[i] = t
    return got, ld


# Guards the episode-folder path: each row's task is the instruction of its own step in
# steps.jsonl (per step, UTF-8, empty ones included), whatever the shuffle; the map view agrees.
def test_pack_stores_and_loader_delivers_task(episode_db):
    db, texts = episode_db
    got, ld = _all_tasks(db, seed=5)
    assert got == dict(enumerate(texts))
    assert ld.dataset[4]["task"] == texts[4]
    assert packing.inspect_db(db, 4)["sample"]["task"] == texts[4]
    # The text is what the tokens encode (byte-v1: byte b -> b + 3 between bos and eos).
    b = next(iter(DataFusionLoader(db, 4, image_size=16, threads=1, shuffle=False)))
    for row, t in enumerate(b["task"]):
        ids = b["tokens"][row][b["attention_mask"][row]].tolist()
        assert bytes(i - 3 for i in ids[1:-1]).decode() == t


# Guards the LeRobot path: the text of the row's task_index in meta/tasks.jsonl, from the
# "{id}_task" records and, for a DB packed before them, from "{id}_lerobot" + the schema's table.
def test_lerobot_task(lerobot_db, tmp_path):
    texts = dict(enumerate(_lerobot_texts()))
    assert _all_tasks(lerobot_db)[0] == texts
    old = _without_task_records(lerobot_db, str(tmp_path / "old"))
    assert not any(k.endswith("_task") for k in _C.RecordReader(old).keys())
    assert _all_tasks(old)[0] == texts
    assert DataFusionLoader(old, 2, image_size=16).dataset[13]["task"] == texts[13]


# Guards static shapes with a sample skipped as corrupt: the padding row's task is "" and the
# kept rows keep their own text.
def test_task_padding_rows(episode_db, tmp_path):
    db, texts = episode_db
    r = _C.RecordReader(db)
    w = _C.RecordWriter(str(tmp_path / "bad"))
    for k in r.keys():
        if k != "__schema__":
            v = r.get(k)
            w.put(k, v[: len(v) // 2] if k == "00000001_cam_front" else v)
    w.commit(r.schema_json)
    ld = DataFusionLoader(str(tmp_path / "bad"), 4, image_size=16, threads=1, shuffle=False,
                          static_shapes=True)
    b = next(iter(ld))
    assert b.size == 3 and b["sample_index"].tolist() == [0, 2, 3, -1]
    assert b["task"] == [texts[0], texts[2], texts[3], ""]


# Guards a DB that stores no text: no `task` key (the batch keeps its tensors), one warning per
# DB, and a DB that has it says so.
def test_no_task_text_noted_once(tmp_path, episode_db):
    db = make_db(str(tmp_path / "db"), samples=8)
    with pytest.warns(UserWarning, match="stores no task text") as w:
        for _ in range(2):
            ld = DataFusionLoader(db, 4, image_size=16, threads=1)
            b = next(iter(ld))
            assert "task" not in b and "task" not in ld.dataset[0]
            assert not ld._impl.has_task_text
    assert sum("task text" in str(x.message) for x in w) == 1
    assert DataFusionLoader(episode_db[0], 4, image_size=16)._impl.has_task_text
