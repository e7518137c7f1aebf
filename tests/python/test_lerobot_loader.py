"""The loader on a packed LeRobot dataset (exact sample semantics):
action chunks and their mask as LeRobot's delta_timestamps give them, normalization by the
dataset's statistics in each mode, and the trainer on a dataset whose dims are smaller than the
model's.

LeRobot's rule (lerobot/datasets/lerobot_dataset.py, `_get_query_indices`): with
delta_timestamps {"action": [k / fps for k in range(H)]}, sample `idx` of the episode whose rows
are [ep_start, ep_end) gets action rows max(ep_start, min(ep_end - 1, idx + k)) and
`action_is_pad` (idx + k >= ep_end); LoongForge's action_mask is its negation. The raw values come
from pyarrow's reading of the fixture's parquet files (`*.expected.json`), not from the DB.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lf_testdata import pack_lerobot_fixture
from loongforge import packing
from loongforge.data import DataFusionLoader

ROOT = os.path.join(os.path.dirname(__file__), "..", "data", "lerobot", "v2.1")
REPO = os.path.join(os.path.dirname(__file__), "..", "..")
HORIZON = 8


def raw_rows():
    """(state [N, S], action [N, A], episode bounds [(start, end)]) of every row of the v2.1
    fixture, in episode order (the DB's sample order), as pyarrow read them."""
    states, actions, bounds, start = [], [], [], 0
    for ep in range(3):
        path = os.path.join(ROOT, "data", "chunk-000", f"episode_{ep:06d}.parquet.expected.json")
        with open(path) as fh:
            cols = json.load(fh)["columns"]
        states.append(np.asarray(cols["observation.state"], dtype=np.float32))
        actions.append(np.asarray(cols["action"], dtype=np.float32))
        bounds.append((start, start + len(cols["action"])))
        start += len(cols["action"])
    return np.concatenate(states), np.concatenate(actions), bounds


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return pack_lerobot_fixture(str(tmp_path_factory.mktemp("lerobot_loader") / "db"),
                                quality=90, horizon=HORIZON)


def load_all(db: str, **options):
    """Every sample of the DB in order: {key: numpy array indexed by sample}."""
    loader = DataFusionLoader(db, 16, shuffle=False, drop_last=False, image_size=32, threads=1,
                              **options)
    got = {}
    for batch in loader:
        n = batch.size
        for k in ("state", "action", "action_mask", "sample_index"):
            got.setdefault(k, []).append(batch[k][:n].numpy().copy())
    loader.close()
    out = {k: np.concatenate(v) for k, v in got.items()}
    order = np.argsort(out["sample_index"])
    return {k: v[order] for k, v in out.items()}, loader.schema


def lerobot_chunk(actions: np.ndarray, bounds, idx: int, horizon: int):
    """LeRobot's `_get_query_indices` for delta indices 0..horizon-1: (action [H, A], is_pad [H])."""
    ep_start, ep_end = next(b for b in bounds if b[0] <= idx < b[1])
    query = [max(ep_start, min(ep_end - 1, idx + k)) for k in range(horizon)]
    is_pad = np.array([(idx + k < ep_start) | (idx + k >= ep_end) for k in range(horizon)])
    return actions[query], is_pad


# Guards the sample semantics: chunk starts at the sample's own frame, steps past the
# episode's end repeat its last action (LeRobot's clamp) with the mask off, and no chunk reaches
# into the next episode -- checked on every sample, including the last HORIZON of each episode.
def test_action_chunk_is_lerobots_delta_timestamps(db):
    state, actions, bounds = raw_rows()
    got, schema = load_all(db, normalize="none")
    assert int(schema["action_horizon"]) == HORIZON
    assert list(got["sample_index"]) == list(range(len(actions)))
    np.testing.assert_array_equal(got["state"], state)
    padded = 0
    for idx in range(len(actions)):
        want, is_pad = lerobot_chunk(actions, bounds, idx, HORIZON)
        np.testing.assert_array_equal(got["action"][idx], want, err_msg=f"sample {idx}")
        np.testing.assert_array_equal(got["action_mask"][idx], ~is_pad, err_msg=f"sample {idx}")
        padded += int(is_pad.any())
    assert padded == 3 * (HORIZON - 1)  # the last HORIZON - 1 samples of each episode
    # read_episode gives the same raw rows back.
    ep1 = packing.read_episode(db, 1)
    np.testing.assert_array_equal(ep1["action"], actions[bounds[1][0]:bounds[1][1]])


def numpy_normalize(x: np.ndarray, mode: str, s: dict, what: str) -> np.ndarray:
    """Isaac-GR00T's Normalizer (gr00t/data/transform/state_action.py) in float64, except
    mean_std's std ~0 rule (LoongForge only centres such a dimension)."""
    x = x.astype(np.float64)
    if mode == "mean_std":
        mean, std = np.array(s[what + "_mean"]), np.array(s[what + "_std"], dtype=np.float32)
        return (x - mean) / np.where(std > 1e-6, std, 1.0)
    lo_key, hi_key = ("min", "max") if mode == "min_max" else ("q01", "q99")
    lo, hi = np.array(s[f"{what}_{lo_key}"]), np.array(s[f"{what}_{hi_key}"])
    same = lo == hi
    y = 2 * (x - lo) / np.where(same, 1.0, hi - lo) - 1
    if mode == "min_max":
        return np.where(same, 0.0, y)
    return np.clip(np.where(same, x, y), -1, 1)


# Guards the `normalize` option: the CPU stage-3 twin gives the NumPy/GR00T values for mean_std,
# min_max and q01_q99 (the last with values clamped to [-1, 1]), on state and the action chunk.
@pytest.mark.parametrize("mode", ["mean_std", "min_max", "q01_q99"])
def test_normalize_modes_match_numpy(db, mode):
    raw, schema = load_all(db, normalize="none")
    got, _ = load_all(db, normalize=mode)
    for what in ("state", "action"):
        want = numpy_normalize(raw[what], mode, schema, what)
        np.testing.assert_allclose(got[what], want, rtol=1e-5, atol=1e-5, err_msg=f"{mode} {what}")
    if mode == "q01_q99":  # the clamp is exercised: some raw values lie outside [q01, q99]
        assert np.isclose(np.abs(got["action"]), 1.0).any()
        assert np.abs(got["action"]).max() <= 1.0
    if mode == "min_max":
        assert got["state"].min() == pytest.approx(-1, abs=1e-6)
        assert got["state"].max() == pytest.approx(1, abs=1e-6)
    # normalize_state=False still means raw values, whatever the mode.
    off, _ = load_all(db, normalize=mode, normalize_state=False)
    np.testing.assert_array_equal(off["action"], raw["action"])


# Guards the refusal: a mode whose statistics the schema lacks (an episode-folder pack has no
# q01/q99) is a ValueError naming the statistic, never silently raw values; a bad name too.
def test_normalize_refuses_missing_statistics(tmp_path):
    packing.demo_data(str(tmp_path / "src"), episodes=1, cameras=1, width=64, height=48,
                      steps_min=4, steps_max=4, state_dim=3, action_dim=2)
    out = str(tmp_path / "db")
    packing.pack(str(tmp_path / "src"), out, horizon=2)
    with pytest.raises(ValueError, match="state_q01"):
        DataFusionLoader(out, 2, normalize="q01_q99")
    with pytest.raises(ValueError, match="normalize"):
        DataFusionLoader(out, 2, normalize="q99")
    DataFusionLoader(out, 2, normalize="min_max").close()  # min/max are there


# Guards that the trainer trains on a packed LeRobot dataset with no other change: state 6 /
# action 7 dims (smaller than tiny's max 32) are zero-padded to the model's maxima, padded action
# dims and padded steps carry no loss, in both the DataFusion and the baseline input paths.
@pytest.mark.parametrize("mode", ["loongforge", "baseline"])
def test_trainer_trains_on_packed_lerobot(db, mode, tmp_path):
    summary = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    cmd = [sys.executable, "-m", "loongforge.train", "--config", "tiny", "--data", db,
           "--mode", mode, "--steps", "3", "--device", "cpu", "--batch-size", "4",
           "--warmup", "0", "--workers", "0", "--loader-threads", "1", "--quiet",
           "--json-out", str(summary)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    curve = json.loads(summary.read_text())["loss_curve"]
    losses = [row["loss"] for row in curve]
    assert len(losses) == 3 and all(np.isfinite(losses)), curve


def _train(db, tmp_path, *extra):
    summary = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    cmd = [sys.executable, "-m", "loongforge.train", "--config", "tiny", "--data", db,
           "--steps", "2", "--device", "cpu", "--batch-size", "4", "--warmup", "0",
           "--workers", "0", "--loader-threads", "1", "--quiet", "--json-out", str(summary),
           *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return r, (json.loads(summary.read_text()) if r.returncode == 0 else None)


# Guards the trainer on the contract chosen at load time: another action horizon and a load-time
# tokenizer train the same DB without a repack (the model's vocabulary is the tokenizer's), and the
# modes whose loaders read the packed chunks refuse both, naming the repack.
def test_trainer_takes_horizon_and_tokenizer_at_load_time(db, tmp_path):
    r, summary = _train(db, tmp_path, "--action-horizon", "5", "--tokenizer", "byte-v1")
    assert r.returncode == 0, r.stderr[-3000:]
    losses = [row["loss"] for row in summary["loss_curve"]]
    assert len(losses) == 2 and all(np.isfinite(losses))
    r, _ = _train(db, tmp_path, "--mode", "tuned", "--action-horizon", "5")
    assert r.returncode == 2 and "repack with loongforge pack --horizon" in r.stderr
    r, _ = _train(db, tmp_path, "--tokenizer", "byte-v7")
    assert r.returncode == 2 and "byte-v7" in r.stderr, r.stderr[-2000:]
