"""Keeps bench/multigpu/harness.py (run by bench/multigpu.sh on 2-8 GPUs) from rotting: its
kill-one-rank check and a tiny all-reduce sweep, on 2 real Gloo processes."""
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "multigpu"))

import harness  # noqa: E402


def _args(**kw):
    a = harness.resolve(harness.build_parser().parse_args(["sweep", "--profile", "cpu"]))
    a.update(d=32, layers=1, experts=2, batch=1, seq=8, bucket_mb=0.01, first_mb=0.005,
             timeout_s=10.0, deadline_s=25.0)
    a.update(kw)
    return a


def test_kill_one_rank_every_survivor_errors_within_timeout(tmp_path):
    # Guards: a SIGKILLed rank must make the other rank raise NexusSync's error (naming its rank)
    # within the timeout, and the harness must report it, not hang or report a pass on a hang.
    a = _args()
    res = harness.launch("kill", a, 2, str(tmp_path))
    k = harness.merge_kill(res, a)
    assert k["killed"] and k["victim_exitcode"] == -signal.SIGKILL, k
    (s,) = k["survivors"]
    assert s["exitcode"] == harness.KILL_EXIT_CODE and not s["hung"], s
    assert "NexusSync" in s["error"] and "rank 0" in s["error"], s
    assert 0 <= s["seconds_after_kill"] <= a["timeout_s"], s
    assert k["pass"] and k["all_clear_nexussync_errors"]


def test_tiny_sweep_nexus_matches_torch_allreduce(tmp_path):
    # Guards: the sweep's NexusSync path averages correctly and both columns are timed and
    # turned into a positive bus bandwidth for every size.
    a = _args(sizes_mb=[0.25, 1], reps=1, min_iters=1, max_iters=2, block_s=0.05)
    res = harness.launch("sweep", a, 2, str(tmp_path))
    harness._check_ok(res)
    rows = harness.merge_sweep(res)
    assert [r["mb"] for r in rows] == [0.25, 1]
    for r in rows:
        assert r["nexus_correct"], r
        assert r["torch_busbw_GBps"] > 0 and r["nexus_busbw_GBps"] > 0, r
