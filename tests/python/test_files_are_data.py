"""Every file LoongForge reads from Python is data: a pickle payload planted in it (one that would
create a marker file when unpickled) never runs, and the error names the file."""
import json
import os
import pickle
import re

import pytest
import torch

from loongforge import DataLossError
from loongforge.trainer.checkpoint import Checkpointer, read_state_file, write_state_file
from loongforge.trainer.dist import Dist
from loongforge.trainer.errors import TrainError

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
PYTHON_DIR = os.path.join(REPO, "python", "loongforge")
# Every tree whose Python reads files a user hands it: the package, the benchmarks and the tools.
SOURCE_DIRS = [PYTHON_DIR] + [os.path.join(REPO, d) for d in ("bench", "tools", "apps")]


class _Planted:
    """Unpickling it would create the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "MARKER"
    yield path
    assert not path.exists(), "a file's pickle payload ran"


def _payload(marker):
    return pickle.dumps({"step": 2, "x": _Planted(marker)})


# Guards: the vault's structure chunk is never unpickled; a pickled one (older layout or planted)
# is refused with DataLossError naming the vault and the step.
def test_vault_structure_with_pickle_is_refused(tmp_path, marker):
    from loongforge.ckpt import _META_NAME, CheckpointVault

    d = str(tmp_path / "v")
    with CheckpointVault(d, chunk_bytes=4096) as v:
        v.save(1, {"w": torch.zeros(4)})
        raw = bytearray(_payload(marker))
        v._v.save(2, [(_META_NAME, torch.frombuffer(raw, dtype=torch.uint8)),
                      ("w", torch.zeros(4))])
        v.wait()
    with CheckpointVault(d, read_only=True) as v:
        with pytest.raises(DataLossError, match=rf"checkpoint 2 in {re.escape(d)}: its structure "
                                                r"is a pickle"):
            v.load(2)
        assert float(v.load(1)["w"].sum()) == 0.0


# Guards: a structure that is JSON but not a well-formed one (unknown node, a chunk the manifest
# does not hold, a view past its storage) is refused naming the step and the key path.
@pytest.mark.parametrize("root,what", [
    ({"dict": [["a", {"evil": "os.system"}]]}, "a: unknown node 'evil'"),
    ({"dict": [["a", {"tensor": "nope"}]]}, "a: names chunk 'nope'"),
    ({"dict": [["a", {"view": "w", "shape": [9], "stride": [1], "offset": 0}]]},
     "a: view reaches element 8"),
    ([1, 2], "<root>: a bare JSON list"),
])
def test_vault_malformed_structure_names_step_and_path(tmp_path, root, what):
    from loongforge.ckpt import _FORMAT, _META_NAME, CheckpointVault

    d = str(tmp_path / "v")
    raw = bytearray(_FORMAT + json.dumps({"root": root}).encode())
    with CheckpointVault(d, chunk_bytes=4096) as v:
        v._v.save(3, [(_META_NAME, torch.frombuffer(raw, dtype=torch.uint8)),
                      ("w", torch.zeros(4))])
        v.wait()
        with pytest.raises(DataLossError, match=re.escape(f"checkpoint 3 in {d}: {what}")):
            v.load(3)


def _ckpt(kind, d, resume=True):
    return Checkpointer(kind, str(d), Dist(), {"mode": "x"}, resume=resume)


# Guards: the baseline's step_*.pt with a payload is refused (TrainError naming the file).
def test_baseline_step_file_with_pickle_is_refused(tmp_path, marker):
    ck = tmp_path / "ck"
    c = _ckpt("torch", ck, resume=False)
    with open(ck / "step_00000002.pt", "wb") as f:
        torch.save({"step": 2, "x": _Planted(marker)}, f)
    with pytest.raises(TrainError, match=re.escape(str(ck / "step_00000002.pt"))):
        c.latest()


# Guards: the old layout's rank_state file, garbage or a payload, gives one line naming the file.
@pytest.mark.parametrize("content", ["garbage", "payload"])
def test_old_rank_state_file_is_refused(tmp_path, marker, content):
    ck = tmp_path / "ck"
    c = _ckpt("torch", ck, resume=False)
    write_state_file({"step": 2, "model": {"w": torch.ones(2)}}, str(ck / "step_00000002.pt"))
    os.makedirs(ck / "rank_state")
    rank_file = ck / "rank_state" / "rank00000_step_00000002.pt"
    with open(rank_file, "wb") as f:
        if content == "garbage":
            f.write(b"not a checkpoint at all\n")
        else:
            torch.save({"x": _Planted(marker)}, f)
    with pytest.raises(TrainError) as e:
        c.latest()
    assert str(rank_file) in str(e.value) and "\n" not in str(e.value)


# Guards the trainer's --resume on a vault whose newest step has a pickled structure: exit 2
# with one line naming the checkpoint, nothing run.
def test_vault_resume_with_pickle_is_refused(tmp_path, marker):
    from loongforge.ckpt import _META_NAME

    ck = tmp_path / "ck"
    c = _ckpt("vault", ck, resume=False)
    c.vault._v.save(4, [(_META_NAME, torch.frombuffer(bytearray(_payload(marker)),
                                                      dtype=torch.uint8))])
    c.close()
    c = _ckpt("vault", ck, resume=True)
    with pytest.raises(TrainError, match=rf"--resume: checkpoint 4 in .*{re.escape(str(ck))}"):
        c.latest()
    c.close()


# Guards: a memory snapshot is read without resolving any global; a payload is refused naming
# the file, a plain-data snapshot (what torch writes) loads.
def test_memory_snapshot_with_pickle_is_refused(tmp_path, marker):
    from loongforge.memory import load_snapshot

    bad = tmp_path / "snap.pickle"
    bad.write_bytes(pickle.dumps({"segments": [_Planted(marker)]}))
    with pytest.raises(ValueError, match=rf"memory snapshot {re.escape(str(bad))}: .*posix.system"):
        load_snapshot(str(bad))
    good = tmp_path / "good.pickle"
    snap = {"segments": [{"device": 0, "total_size": 1 << 20, "blocks": []}], "traces": [[]]}
    good.write_bytes(pickle.dumps(snap))
    assert load_snapshot(str(good)) == snap
    garbage = tmp_path / "garbage.pickle"
    garbage.write_bytes(b"\x80\x04garbage")
    with pytest.raises(ValueError, match=re.escape(f"memory snapshot {garbage}")):
        load_snapshot(str(garbage))


# Guards: run.json is read as JSON; a pickle there is an unreadable run.json naming the file.
def test_run_json_with_pickle_is_refused(tmp_path, marker):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "run.json").write_bytes(_payload(marker))
    with pytest.raises(TrainError, match=rf"--ckpt-dir {re.escape(str(ck))}: unreadable run.json"):
        _ckpt("torch", ck)


# Guards the readers themselves: every torch.load in LoongForge's Python (the package, the
# benchmarks, the tools) passes weights_only=True, np.load passes allow_pickle=False, and pickle is
# loaded only through the memory snapshot's global-refusing unpickler.
def test_sources_read_files_as_data():
    bad = []
    for root, _, files in (w for d in SOURCE_DIRS for w in os.walk(d)):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path) as f:
                text = f.read()
            for m in re.finditer(r"torch\.load\(([^()]*(\([^()]*\))?[^()]*)\)", text):
                if "weights_only=True" not in m.group(1):
                    bad.append(f"{name}: torch.load({m.group(1)})")
            for m in re.finditer(r"np\.load\(([^)]*)\)", text):
                if "allow_pickle=False" not in m.group(1):
                    bad.append(f"{name}: np.load({m.group(1)})")
            for m in re.finditer(r"pickle\.(loads?|Unpickler)\(", text):
                line = text[:m.start()].count("\n") + 1
                bad.append(f"{name}:{line}: pickle.{m.group(1)}")
    assert bad == [], bad


# Guards the memory benchmark's snapshot reader: a planted payload is refused naming the file and
# never runs, and the other snapshots given are still reported.
def test_peak_breakdown_refuses_a_pickle_payload(tmp_path, marker):
    import subprocess
    import sys

    bad = tmp_path / "planted.pickle"
    bad.write_bytes(pickle.dumps({"segments": [_Planted(marker)]}))
    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "memory", "peak_breakdown.py"),
                        str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"{bad}: memory snapshot" in r.stderr, r.stderr


# Guards the trainer's .pt layout: a state with floats (an optimizer's lr), ints, strings, numpy
# arrays and shared tensors comes back equal through torch.load(weights_only=True) alone, and a
# file that is not that layout (a plain torch.save of a dict, or a structure naming a tensor the
# file lacks) is refused with TrainError naming the file.
def test_state_file_round_trip_and_foreign_files_refused(tmp_path):
    import numpy as np

    base = torch.arange(6, dtype=torch.float32)
    state = {"step": 3, "lr": 2.5e-4, "betas": (0.9, 0.95), "name": "adamw",
             "w": base, "view": base[2:5], "arr": np.arange(4, dtype=np.int16), "none": None}
    path = str(tmp_path / "state.pt")
    write_state_file(state, path)
    got = read_state_file(path)
    assert got["lr"] == 2.5e-4 and got["betas"] == (0.9, 0.95) and got["name"] == "adamw"
    torch.testing.assert_close(got["view"], base[2:5])
    assert got["view"].data_ptr() == got["w"].data_ptr() + 2 * 4  # one storage, as saved
    assert got["arr"].dtype == np.int16 and list(got["arr"]) == [0, 1, 2, 3]

    ck = tmp_path / "ck"
    c = _ckpt("torch", ck, resume=False)
    step_file = ck / "step_00000002.pt"
    torch.save({"step": 2, "model": {"w": torch.ones(2)}}, str(step_file))
    with pytest.raises(TrainError, match=re.escape(str(step_file)) + ".*not a loongforge state"):
        c.latest()
    doc = torch.load(path, weights_only=True)
    doc["tensors"].pop(next(iter(doc["tensors"])))
    torch.save(doc, str(step_file))
    with pytest.raises(TrainError, match=re.escape(str(step_file)) + ".*lacks"):
        c.latest()
