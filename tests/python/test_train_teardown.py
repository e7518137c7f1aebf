"""The trainer's clean shutdown: when MemSculptor closes at the end of ``train.run``, nothing of
the run (model parameters, optimizer state) is still alive (otherwise: "MemSculptor on
cuda:0 closed with 379 live allocations (11.8 GiB) still held by the caller")."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdb import TINY_TRAIN_ARGS, has_datafusion, tiny_train_db  # noqa: E402

from loongforge import train  # noqa: E402
from loongforge.memory import MemSculptorSession  # noqa: E402
from loongforge.trainer import loop as trainer_loop  # noqa: E402

torch.set_num_threads(1)
# The first import of torchvision (the baseline loader imports it inside train.build) leaves a
# frame cycle (torch.fx.wrap keeps its own frame) that holds the importing frames, build's with
# its model, until the collector runs: a one-time artifact of that import, not of the run.
with contextlib.suppress(ImportError):
    import torchvision  # noqa: F401
COMMON = list(TINY_TRAIN_ARGS) + ["--steps", "3"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tiny_train_db(tmp_path_factory.mktemp("db"))


def _alive_at_close(monkeypatch, argv):
    """Runs train.run(argv); returns (tensors watched, names of those still alive when
    MemSculptorSession.close ran). Watched: every parameter of the model, every tensor of the
    optimizer's state (taken after the last step), the model and the optimizer themselves."""
    watched = []
    seen = {}
    loop = train.train_loop

    def watching_loop(s):
        out = loop(s)
        watched.append(("model", weakref.ref(s.model)))
        watched.append(("optimizer", weakref.ref(s.opt)))
        for name, p in s.model.named_parameters():
            watched.append((f"parameter {name}", weakref.ref(p)))
        for i, st in enumerate(s.opt.state.values()):
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    watched.append((f"optimizer state {i}.{k}", weakref.ref(v)))
        return out

    close = MemSculptorSession.close

    def checking_close(self):
        # No gc.collect() first: the run must free them by reference counting (Note [Trainer
        # teardown] in trainer/loop.py); a cycle through autograd hooks may escape the collector.
        seen["alive"] = [name for name, r in watched if r() is not None]
        return close(self)

    monkeypatch.setattr(trainer_loop, "train_loop", watching_loop)
    monkeypatch.setattr(MemSculptorSession, "close", checking_close)
    # The collector stays off for the run: a pass must not depend on when it happens to run.
    enabled = gc.isenabled()
    gc.disable()
    try:
        train.run(train.build_parser().parse_args(argv))
    finally:
        if enabled:
            gc.enable()
        gc.collect()
    assert "alive" in seen, "train.run ended without closing its MemSculptorSession"
    return watched, seen["alive"]


# Guards: baseline mode (DataLoader, torch.save checkpoints) drops the model and the optimizer
# state before MemSculptor closes.
def test_baseline_run_releases_model_and_optimizer_before_close(db, tmp_path, monkeypatch):
    watched, alive = _alive_at_close(monkeypatch, COMMON + [
        "--data", db, "--mode", "baseline", "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / "c"),
        "--trace", str(tmp_path / "t.json"), "--trace-steps", "1"])
    assert sum(1 for n, _ in watched if n.startswith("optimizer state")) > 0
    assert alive == [], f"{len(alive)} of {len(watched)} still alive, first: {alive[:5]}"


# Guards: loongforge mode (DataFusion, NexusSync flat buckets, CheckpointVault, the static-batch
# step runner of graphs.py) drops the model and the optimizer state before MemSculptor closes.
@pytest.mark.skipif(not has_datafusion(), reason="loongforge.data not in this build")
def test_loongforge_run_releases_model_and_optimizer_before_close(db, tmp_path, monkeypatch):
    watched, alive = _alive_at_close(monkeypatch, COMMON + [
        "--data", db, "--mode", "loongforge", "--ckpt-every", "2", "--ckpt-dir",
        str(tmp_path / "v"), "--token-buckets", "16,32,64", "--trace", str(tmp_path / "t.json"),
        "--trace-steps", "1"])
    assert sum(1 for n, _ in watched if n.startswith("optimizer state")) > 0
    assert alive == [], f"{len(alive)} of {len(watched)} still alive, first: {alive[:5]}"
