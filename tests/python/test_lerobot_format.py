"""format="lerobot" batches against LeRobot's definitions, computed here from the fixture's parquet
rows as pyarrow read them (`*.expected.json`) and its tasks.jsonl, not from the DB.

LeRobot's rules (lerobot/datasets/lerobot_dataset.py and utils.py): an offset d of
delta_timestamps must satisfy |d*fps - round(d*fps)| / fps <= tolerance_s and becomes
round(d*fps) frames; sample idx of the episode with rows [ep_start, ep_end) reads rows
max(ep_start, min(ep_end - 1, idx + k)) and `<key>_is_pad` = idx + k < ep_start or >= ep_end.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from lf_testdata import LEROBOT_V21, pack_lerobot_fixture
from loongforge import _C, packing
from loongforge.data import DataFusionLoader

FPS = 30
CAMERAS = ("observation.images.front", "observation.images.wrist")


def parquet_rows():
    """{column: numpy array over every row of the fixture, in episode order} and the episode
    bounds [(start, end)], from pyarrow's reading of the parquet files."""
    cols, bounds, start = {}, [], 0
    for ep in range(3):
        path = os.path.join(LEROBOT_V21, "data", "chunk-000",
                            f"episode_{ep:06d}.parquet.expected.json")
        with open(path) as fh:
            c = json.load(fh)["columns"]
        for k, v in c.items():
            cols.setdefault(k, []).append(np.asarray(v))
        bounds.append((start, start + len(c["action"])))
        start += len(c["action"])
    return {k: np.concatenate(v) for k, v in cols.items()}, bounds


def tasks_jsonl():
    with open(os.path.join(LEROBOT_V21, "meta", "tasks.jsonl")) as fh:
        return {int(j["task_index"]): j["task"] for j in map(json.loads, fh) if j}


def lerobot_query(bounds, idx, offsets):
    """LeRobot's _get_query_indices for one sample: (rows, is_pad)."""
    start, end = next(b for b in bounds if b[0] <= idx < b[1])
    rows = [max(start, min(end - 1, idx + k)) for k in offsets]
    pad = np.array([idx + k < start or idx + k >= end for k in offsets])
    return rows, pad


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return pack_lerobot_fixture(str(tmp_path_factory.mktemp("lerobot_format") / "db"),
                                quality=95, horizon=4)


def every_sample(db, batch_size=16, **options):
    """Every sample of the DB in sample order: {key: stacked values} (task: list)."""
    loader = DataFusionLoader(db, batch_size, shuffle=False, drop_last=False, threads=1,
                              format="lerobot", **options)
    got = {}
    for batch in loader:
        n = batch.size
        for k, v in batch.items():
            got.setdefault(k, []).append(v[:n] if k == "task" else v[:n].clone())
    loader.close()
    return {k: sum(v, []) if k == "task" else torch.cat(v) for k, v in got.items()}, loader


# Guards the keys and raw values of the contract: LeRobot's names, state and action unnormalized
# and exact, the index columns as the parquet files hold them, the task text per row.
def test_keys_and_values_are_lerobots(db):
    rows, _ = parquet_rows()
    got, loader = every_sample(db)
    assert set(got) >= {"observation.state", "action", "task", "timestamp", "frame_index",
                        "episode_index", "index", "task_index", *CAMERAS}
    assert "action_mask" not in got and "tokens" not in got
    np.testing.assert_array_equal(got["observation.state"].numpy(),
                                  rows["observation.state"].astype(np.float32))
    np.testing.assert_array_equal(got["action"].numpy(), rows["action"].astype(np.float32))
    assert got["action"].shape == (48, 7)
    for k in ("frame_index", "episode_index", "index", "task_index"):
        assert got[k].dtype == torch.int64
        np.testing.assert_array_equal(got[k].numpy(), rows[k], err_msg=k)
    assert got["timestamp"].dtype == torch.float32
    np.testing.assert_array_equal(got["timestamp"].numpy(), rows["timestamp"].astype(np.float32))
    tasks = tasks_jsonl()
    assert got["task"] == [tasks[int(t)] for t in rows["task_index"]]


# Guards the frames: stored size, uncropped, float in [0, 1], equal within JPEG rounding to the
# frames read_episode decodes from the same records; uint8 gives the decoded pixels.
def test_frames_are_the_stored_frames(db):
    got, loader = every_sample(db)
    ep = packing.read_episode(db, 1)
    start = parquet_rows()[1][1][0]  # episode 1's first sample
    for cam, name in zip(CAMERAS, loader.schema["cameras"]):
        frames = got[cam]
        assert frames.shape == (48, 3, 48, 64) and frames.dtype == torch.float32
        assert 0.0 <= float(frames.min()) and float(frames.max()) <= 1.0
        want = torch.from_numpy(ep["images"][name]).permute(0, 3, 1, 2).float() / 255
        # The loader decodes with libjpeg-turbo's fast IDCT, read_episode with the exact one.
        err = (frames[start:start + len(want)] - want).abs()
        assert err.mean().item() < 1.5 / 255 and err.max().item() <= 8 / 255, cam
    got8, _ = every_sample(db, dtype=torch.uint8)
    assert got8[CAMERAS[0]].dtype == torch.uint8


# Guards delta_timestamps: past and future offsets on state and action, resolved with the fps,
# clamped at the episode's edges with the pad flags LeRobot sets, on every sample.
def test_delta_timestamps_follow_lerobots_query(db):
    rows, bounds = parquet_rows()
    state_off, action_off = [-2, -1, 0], list(range(0, 10))
    got, _ = every_sample(db, delta_timestamps={
        "observation.state": [k / FPS for k in state_off],
        "action": [k / FPS for k in action_off]})
    assert got["observation.state"].shape == (48, 3, 6)
    assert got["action"].shape == (48, 10, 7)
    pads = 0
    for idx in range(48):
        for key, off in (("observation.state", state_off), ("action", action_off)):
            q, pad = lerobot_query(bounds, idx, off)
            np.testing.assert_array_equal(got[key][idx].numpy(),
                                          rows[key][q].astype(np.float32), err_msg=f"{key} {idx}")
            np.testing.assert_array_equal(got[key + "_is_pad"][idx].numpy(), pad,
                                          err_msg=f"{key}_is_pad {idx}")
            pads += int(pad.any())
    assert pads == 3 * 2 + 3 * 9  # two past-pads and nine future-pads per episode


# Guards history frames: an image offset gives the frame of the clamped row, and offset 0 the
# sample's own frame.
def test_image_offsets_give_the_neighbouring_frames(db):
    _, bounds = parquet_rows()
    plain, _ = every_sample(db)
    got, _ = every_sample(db, delta_timestamps={CAMERAS[0]: [-1 / FPS, 0.0]})
    assert got[CAMERAS[0]].shape == (48, 2, 3, 48, 64)
    for idx in range(48):
        q, pad = lerobot_query(bounds, idx, [-1, 0])
        torch.testing.assert_close(got[CAMERAS[0]][idx, 0], plain[CAMERAS[0]][q[0]])
        torch.testing.assert_close(got[CAMERAS[0]][idx, 1], plain[CAMERAS[0]][idx])
        np.testing.assert_array_equal(got[CAMERAS[0] + "_is_pad"][idx].numpy(), pad)
    assert got[CAMERAS[1]].shape == (48, 3, 48, 64)


# Guards LeRobotDataset.meta's counterpart: fps, camera keys, stats per feature, episodes, tasks.
def test_meta_is_lerobots(db):
    loader = DataFusionLoader(db, 4, format="lerobot", threads=1)
    m = loader.meta
    assert m.fps == FPS and m.camera_keys == list(CAMERAS)
    assert m.total_frames == 48 and m.total_episodes == 3
    assert [e["episode_index"] for e in m.episodes] == [0, 1, 2]
    assert m.tasks == tasks_jsonl()
    with open(os.path.join(LEROBOT_V21, "meta", "info.json")) as fh:
        info = json.load(fh)
    assert m.info == info and m.robot_type == "loongforge_fixture"
    assert m.names["observation.state"] == [f"joint_{i}" for i in range(6)]
    assert m.names["action"] == info["features"]["action"]["names"]
    rows, _ = parquet_rows()
    for key in ("observation.state", "action"):
        s = m.stats[key]
        assert set(s) == {"mean", "std", "min", "max", "q01", "q99"}
        np.testing.assert_allclose(s["min"].numpy(), rows[key].min(0), rtol=1e-6)
        np.testing.assert_allclose(s["max"].numpy(), rows[key].max(0), rtol=1e-6)
    loader.close()


# Guards map-style access under the format: ds[i] is row i of the batches.
def test_dataset_index_has_the_same_contract(db):
    got, _ = every_sample(db, delta_timestamps={"action": [0.0, 1 / FPS]})
    loader = DataFusionLoader(db, 4, format="lerobot", threads=1,
                              delta_timestamps={"action": [0.0, 1 / FPS]})
    last = parquet_rows()[1][0][1] - 1  # the last frame of episode 0: its next action is a pad
    one = loader.dataset[last]
    torch.testing.assert_close(one["action"], got["action"][last])
    assert one["action_is_pad"].tolist() == [False, True]
    assert one["task"] == got["task"][last] and int(one["index"]) == last
    loader.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta_timestamps={"observation.velocity": [0.0]}), "'observation.velocity' is not a feature"),
    (dict(delta_timestamps={"action": [0.0, 0.05]}), r"offset 0.05 s is .* off the 30 fps"),
    (dict(delta_timestamps={"action": []}), "non-empty list"),
    (dict(delta_timestamps={"action": ["0.1"]}), "not a number"),
    (dict(tolerance_s=-1.0, delta_timestamps={"action": [0.0]}), "tolerance_s"),
    (dict(format="lerobt"), "format must be"),
    (dict(format="loongforge", delta_timestamps={"action": [0.0]}), "needs format='lerobot'"),
])
def test_bad_options_are_named(db, kwargs, match):
    kwargs = {"format": "lerobot", **kwargs}
    with pytest.raises(ValueError, match=match):
        DataFusionLoader(db, 4, threads=1, **kwargs)


def test_db_not_from_lerobot_names_the_pack_command(tmp_path):
    from lf_testdata import make_db
    path = make_db(str(tmp_path / "native"), samples=4)
    with pytest.raises(ValueError, match="pack --from-lerobot"):
        DataFusionLoader(path, 2, format="lerobot", threads=1)


# Guards the frame table's checks: an episode table that does not cover the DB's samples in
# order is DataLoss naming the DB, not a wrong gather.
def test_damaged_episode_table_is_named(db, tmp_path):
    reader = _C.RecordReader(db)
    schema = json.loads(reader.schema_json)
    meta = schema["source_meta"]
    meta = json.loads(meta) if isinstance(meta, str) else meta
    meta["episodes"][1]["length"] += 1
    schema["source_meta"] = json.dumps(meta) if isinstance(schema["source_meta"], str) else meta
    out = str(tmp_path / "damaged")
    w = _C.RecordWriter(out, overwrite=True)
    for k in reader.keys():
        if k != "__schema__":
            w.put(k, reader.get(k))
    w.commit(json.dumps(schema))
    with pytest.raises(Exception, match="episode table"):
        packing.read_episode(out, 1)
    with pytest.raises(Exception, match="episode table"):
        DataFusionLoader(out, 2, format="lerobot", threads=1)


# Guards the load-time tokenizer: ids computed from the batch's task text, padded as token_pad
# says with the tokenizer's pad id, under both formats; a callable works like a built-in.
def test_tokenizer_chosen_at_load_time(db):
    words = {w: i + 5 for i, w in enumerate(sorted({w for t in tasks_jsonl().values()
                                                     for w in t.split()}))}
    per_word = lambda text: [words[w] for w in text.split()]  # noqa: E731
    loader = DataFusionLoader(db, 8, shuffle=False, threads=1, tokenizer=per_word)
    batch = next(iter(loader))
    for r, text in enumerate(batch["task"]):
        ids = per_word(text)
        assert batch["tokens"][r, :len(ids)].tolist() == ids
        assert batch["attention_mask"][r].sum().item() == len(ids)
    assert batch["tokens"].shape[1] == max(len(per_word(t)) for t in batch["task"])
    loader.close()
    loader = DataFusionLoader(db, 8, shuffle=False, threads=1, format="lerobot",
                              tokenizer="byte-v1", token_pad=40)
    batch = next(iter(loader))
    toks = batch["observation.language.tokens"]
    assert toks.shape == (8, 40)
    want = _C.tokenize(batch["task"][0], "byte-v1")
    assert toks[0, :len(want)].tolist() == want
    assert batch["observation.language.attention_mask"][0].sum().item() == len(want)
    loader.close()


@pytest.mark.parametrize("spec, exc, match", [
    ("byte-v9", ValueError, "byte-v9"),
    ("/nonexistent/tokenizer.json", FileNotFoundError, "/nonexistent/tokenizer.json"),
    (3, TypeError, "tokenizer must be"),
])
def test_bad_tokenizer_is_named(db, spec, exc, match):
    with pytest.raises(exc, match=match):
        DataFusionLoader(db, 4, threads=1, tokenizer=spec)


def test_tokenizer_too_long_for_token_pad_is_named(db):
    loader = DataFusionLoader(db, 4, threads=1, tokenizer="byte-v1", token_pad=5)
    with pytest.raises(ValueError, match="more than the batch's length 5"):
        next(iter(loader))
    loader.close()


def test_tokenizer_json_needs_the_tokenizers_package(db, tmp_path):
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        path = tmp_path / "tokenizer.json"
        path.write_text("{}")
        with pytest.raises(ImportError, match="'tokenizers' package"):
            DataFusionLoader(db, 4, threads=1, tokenizer=str(path))
        return
    # Where the library is installed (the GPU machine): a word-level tokenizer.json built here.
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "[UNK]": 1}
    for t in tasks_jsonl().values():
        for w in t.split():
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loader = DataFusionLoader(db, 4, shuffle=False, threads=1, tokenizer=str(tmp_path))
    batch = next(iter(loader))
    ids = [vocab[w] for w in batch["task"][0].split()]
    assert batch["tokens"][0, :len(ids)].tolist() == ids
    loader.close()


# Guards static shapes under a load-time tokenizer: every batch's ids are padded to the smallest
# bucket that holds its longest task, which the batch's bucket and shape_key name.
def test_tokenizer_pads_to_the_buckets(db):
    loader = DataFusionLoader(db, 8, threads=1, tokenizer="byte-v1", token_buckets=[64, 32, 8])
    assert loader.token_buckets == [8, 32, 64]
    for batch in loader:
        longest = max(len(_C.tokenize(t, "byte-v1")) for t in batch["task"] if t)
        want = min(b for b in (8, 32, 64) if b >= longest)
        assert batch["tokens"].shape == (8, want)
        assert loader.token_buckets[batch.bucket] == want and batch.shape_key[2] == want
    loader.close()


@pytest.fixture(scope="module")
def groot_db(tmp_path_factory):
    """The fixture with GR00T's meta/modality.json (state split in two, camera renamed), packed."""
    import shutil
    src = str(tmp_path_factory.mktemp("groot_src") / "v2.1")
    shutil.copytree(LEROBOT_V21, src)
    with open(os.path.join(src, "meta", "modality.json"), "w") as fh:
        json.dump({"state": {"arm": {"start": 0, "end": 5}, "gripper": {"start": 5, "end": 6}},
                   "action": {"arm": {"start": 0, "end": 7}},
                   "video": {"ego": {"original_key": "observation.images.front"}},
                   "annotation": {"human.task_description": {"original_key": "task_index"}}}, fh)
    return pack_lerobot_fixture(str(tmp_path_factory.mktemp("groot") / "db"), src, horizon=4)


def numpy_groot(x, mode, lo_hi):
    """GR00T's Normalizer formulas in float64 (the module docstring of lerobot_format)."""
    lo, hi = (np.asarray(v, dtype=np.float64) for v in lo_hi)
    if mode == "mean_std":
        return (x - lo) / np.where(hi > 1e-6, hi, 1.0)
    same = lo == hi
    y = 2 * (x - lo) / np.where(same, 1.0, hi - lo) - 1
    return np.where(same, 0.0, y) if mode == "min_max" else np.clip(np.where(same, x, y), -1, 1)


# Guards format="groot": GR00T's keys from modality.json with a time axis, the slices of the
# state and action vectors over the delta indices with "first_last" padding, per-key
# normalization by GR00T's formulas on the slice's statistics, the task as the annotation.
def test_groot_step_data(groot_db):
    rows, bounds = parquet_rows()
    loader = DataFusionLoader(groot_db, 16, shuffle=False, drop_last=False, threads=1,
                              format="groot", delta_indices={"action": [0, 1, 2, 3],
                                                             "state.arm": [-1, 0]},
                              normalize_modes={"action.arm": "min_max", "state.arm": "q99",
                                               "state.gripper": "mean_std"})
    stats = loader.meta.stats
    tasks = tasks_jsonl()
    seen = 0
    for batch in loader:
        assert set(batch) >= {"state.arm", "state.gripper", "action.arm", "video.ego",
                              "annotation.human.task_description"}
        assert batch["video.ego"].shape[1:] == (1, 3, 48, 64)
        for r in range(batch.size):
            idx = seen + r  # shuffle=False: samples in order
            for key, off, sl, col, mode, st in (
                    ("state.arm", [-1, 0], slice(0, 5), "observation.state", "q99", ("q01", "q99")),
                    ("state.gripper", [0], slice(5, 6), "observation.state", "mean_std",
                     ("mean", "std")),
                    ("action.arm", [0, 1, 2, 3], slice(0, 7), "action", "min_max", ("min", "max"))):
                q, _ = lerobot_query(bounds, idx, off)  # first_last = LeRobot's clamp
                raw = rows[col][q][:, sl].astype(np.float32).astype(np.float64)
                want = numpy_groot(raw, mode, [stats[col][s][sl].numpy() for s in st])
                np.testing.assert_allclose(batch[key][r].double().numpy(), want, rtol=1e-5,
                                           atol=1e-5, err_msg=f"{key} {idx}")
            assert batch["annotation.human.task_description"][r] == \
                tasks[int(rows["task_index"][idx])]
        seen += batch.size
    assert seen == 48
    loader.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta_indices={"proprio": [0]}), "'proprio' is neither a modality group"),
    (dict(delta_indices={"action": [0.5]}), "list of int"),
    (dict(normalize_modes={"state.arm": "minmax"}), "'minmax' is not one of"),
    (dict(normalize_modes={"video.ego": "min_max"}), "not a state or action key"),
])
def test_groot_bad_options_are_named(groot_db, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataFusionLoader(groot_db, 4, threads=1, format="groot", **kwargs)


def test_groot_needs_a_modality_file(db):
    with pytest.raises(ValueError, match="modality.json"):
        DataFusionLoader(db, 4, threads=1, format="groot")


# Guards the transform hook: it sees the finished batch (format keys, device) and what it returns
# is what the loop and dataset[i] get, with the batch's attributes kept.
def test_transform_hook_runs_on_every_batch(db):
    calls = []

    def flip(batch):
        calls.append(len(batch["task"]))
        batch["observation.state"] = -batch["observation.state"]
        return {**batch, "seen": torch.ones(len(batch["task"]))}

    plain, _ = every_sample(db)
    got, loader = every_sample(db, transform=flip)
    torch.testing.assert_close(got["observation.state"], -plain["observation.state"])
    assert got["seen"].shape == (48,) and sum(calls) == 48
    loader = DataFusionLoader(db, 4, threads=1, format="lerobot", transform=flip)
    batch = next(iter(loader))
    assert batch.size == 4 and "seen" in batch
    torch.testing.assert_close(loader.dataset[3]["observation.state"],
                               -plain["observation.state"][3])
    loader.close()
    with pytest.raises(TypeError, match="transform must be callable"):
        DataFusionLoader(db, 4, threads=1, transform=3)
    bad = DataFusionLoader(db, 4, threads=1, transform=lambda b: [b])
    with pytest.raises(TypeError, match="not a dict batch"):
        next(iter(bad))
    bad.close()


# Guards the load-time horizon of the 'loongforge' format: at the packed horizon it gives the
# packed chunks and masks in every normalize mode, and another horizon follows the same rule
# (rows idx..idx+H-1 of the episode, the last repeated with the mask off) without a repack.
@pytest.mark.parametrize("mode", ["mean_std", "min_max", "q01_q99", "none"])
def test_action_horizon_at_load_time(db, mode):
    def collect(**kw):
        loader = DataFusionLoader(db, 16, shuffle=False, drop_last=False, threads=1,
                                  normalize=mode, **kw)
        out = {k: torch.cat([b[k][:b.size] for b in loader]) for k in ("action", "action_mask")}
        loader.close()
        return out, loader
    packed, _ = collect()
    same, _ = collect(action_horizon=4)
    torch.testing.assert_close(same["action"], packed["action"], rtol=1e-6, atol=1e-6)
    assert torch.equal(same["action_mask"], packed["action_mask"])
    longer, loader = collect(action_horizon=10)
    assert longer["action"].shape == (48, 10, 7) and loader.shape_keys == []
    torch.testing.assert_close(longer["action"][:, :4][packed["action_mask"]],
                               packed["action"][packed["action_mask"]], rtol=1e-6, atol=1e-6)
    _, bounds = parquet_rows()
    for idx in range(48):
        _, pad = lerobot_query(bounds, idx, range(10))
        assert longer["action_mask"][idx].tolist() == (~pad).tolist()


def test_action_horizon_on_a_native_db_names_the_repack(tmp_path):
    from lf_testdata import make_db
    path = make_db(str(tmp_path / "native"), samples=4)
    with pytest.raises(ValueError, match="pack --horizon 8"):
        DataFusionLoader(path, 2, threads=1, action_horizon=8)


# Guards old LeRobot packs: a DB without the per-frame LeRobot records names the repack command.
def test_pack_without_frame_records_names_the_repack(db, tmp_path):
    reader = _C.RecordReader(db)
    out = str(tmp_path / "old")
    w = _C.RecordWriter(out, overwrite=True)
    for k in reader.keys():
        if k != "__schema__" and not k.endswith("_lerobot"):
            w.put(k, reader.get(k))
    w.commit(reader.schema_json)
    with pytest.raises(Exception, match="repack it with loongforge pack --from-lerobot"):
        DataFusionLoader(out, 2, format="lerobot", threads=1)


# Guards format="lerobot" through the public API: a LeRobot-style policy reading LeRobot's keys
# trains through forge.loader + compile_step, and its loss curve is the plain loop's on the same
# batches (fp32, CPU).
def test_forge_trains_a_lerobot_policy_on_lerobot_keys(db, tmp_path):
    import loongforge as lf

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6 + 3, 7 * 4)

        def forward(self, batch):
            img = batch["observation.images.front"].mean(dim=(2, 3))
            pred = self.net(torch.cat([batch["observation.state"], img], 1)).view(-1, 4, 7)
            keep = (~batch["action_is_pad"]).unsqueeze(2).float()
            return ((pred - batch["action"]) ** 2 * keep).sum() / keep.sum().clamp(min=1)

    kw = dict(batch_size=8, format="lerobot", seed=0, threads=1,
              delta_timestamps={"action": [k / FPS for k in range(4)]})

    def run(use_forge):
        torch.manual_seed(0)
        policy = Policy()
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        losses = []
        if use_forge:
            with lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck")) as forge:
                policy, opt = forge.setup(policy, opt)
                step = forge.compile_step(lambda m, b: m(b))
                for batch in forge.loader(db, **kw):
                    losses.append(float(step(batch)))
        else:
            rest = {k: v for k, v in kw.items() if k != "batch_size"}
            loader = DataFusionLoader(db, kw["batch_size"], **rest)
            for batch in loader:
                opt.zero_grad()
                loss = policy(batch)
                loss.backward()
                opt.step()
                losses.append(float(loss))
            loader.close()
        return losses

    plain, forged = run(False), run(True)
    assert len(plain) == len(forged) == 6 and plain[0] != plain[-1]
    for a, b in zip(plain, forged):
        assert abs(a - b) <= 1e-5 * abs(a), (plain, forged)
