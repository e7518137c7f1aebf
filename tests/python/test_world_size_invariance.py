"""The trainer's global loss curve does not depend on the number of ranks: with --noise per-sample
(Note [Noise that belongs to the sample] in trainer/session.py) one rank on the global batch and
2 or 4 gloo ranks started by `loongforge launch`, each on its share, give the same losses. What
makes it hold: DataFusion's sampler deals a global order out to the ranks in turn, augmentation
and noise are drawn per sample, NexusSync averages the gradients and the metrics average the
ranks' losses."""
import json
import os
import subprocess
import sys

import pytest

from lf_testdb import has_datafusion

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    if not has_datafusion():
        pytest.skip("loongforge.data not in this build")
    import loongforge as lf

    root = tmp_path_factory.mktemp("ws")
    lf.demo_data(str(root / "raw"), episodes=4, cameras=1, width=64, height=48, steps_min=16,
                 steps_max=16, state_dim=8, action_dim=7)
    # Horizon 1: no sample's action chunk runs past its episode, so every rank's masked mean is
    # over as many actions as the others' and their average is the global batch's mean.
    lf.pack(str(root / "raw"), str(root / "db"), horizon=1)
    return str(root / "db")


def _losses(db, out, nproc, noise):
    args = ["--config", "tiny", "--image-size", "28", "--warmup", "1", "--workers", "0",
            "--loader-threads", "1", "--quiet", "--threads", "1", "--device", "cpu", "--data", db,
            "--mode", "loongforge", "--steps", "4", "--no-vault", "--seed", "3", "--noise", noise,
            "--batch-size", str(GLOBAL_BATCH // nproc), "--metrics-jsonl", str(out)]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "loongforge.train", *args] if nproc == 1 else \
        [sys.executable, "-m", "loongforge.launch", "--nproc", str(nproc), "train", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    with open(out) as f:
        return [json.loads(line)["loss"] for line in f]


def test_global_losses_equal_one_rank_on_the_global_batch(db, tmp_path):
    one = _losses(db, tmp_path / "one.jsonl", 1, "per-sample")
    assert len(one) == 4
    for n in (2, 4):
        many = _losses(db, tmp_path / f"n{n}.jsonl", n, "per-sample")
        for i, (a, b) in enumerate(zip(one, many)):
            assert abs(a - b) <= 1e-5 * abs(a), (n, i, a, b)
    # A generator per rank draws other noise on two ranks: the curves part (what the flag fixes).
    one_s = _losses(db, tmp_path / "one_s.jsonl", 1, "stream")
    two_s = _losses(db, tmp_path / "two_s.jsonl", 2, "stream")
    assert max(abs(a - b) / abs(a) for a, b in zip(one_s, two_s)) > 1e-3
