"""bench/moe/topk_vs_dense.py (the top-k vs dense comparison on tiny-moe): the --init-steps
start and the summary, on 2 CPU processes with a few steps (the measured runs are in
docs/BENCHMARKS.md)."""
import argparse
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# An importable module, not a file loaded by path: the spawned ranks unpickle its worker by name
# (spawn hands the parent's sys.path to them).
sys.path.insert(0, os.path.join(REPO, "bench", "moe"))
import topk_vs_dense as tvd  # noqa: E402


def _args(**kw):
    a = dict(steps=2, procs=2, batch=1, lr=1e-3, lr_compare=1e-3, feed_every=1, load_threshold=1.0,
             init_steps=3, init_cache=None, topk_ratio=None, noise_seed=0, pool=8)
    a.update(kw)
    return argparse.Namespace(**a)


# Guards the --init-steps start: the compared run continues the init phase's training exactly (model
# and AdamW state carried, the pool's batches and noise draws continuing at step init_steps), and
# --lr-compare is the lr the compared run steps with (0: the model stays the init state).
def test_init_steps_continues_the_dense_run_and_sets_lr(tmp_path):
    a = _args(init_cache=str(tmp_path / "init.pt"))
    path, rec = tvd.init_state(a, str(tmp_path))
    assert len(rec["losses"]) == 3 and os.path.exists(path)
    # One dense run of init_steps + steps with the init phase's noise draws: the same losses.
    whole = tvd.run(_args(steps=5), None, noise_seed=tvd.INIT_NOISE_SEED)
    cont = tvd.run(a, None, noise_seed=tvd.INIT_NOISE_SEED, init_path=path)
    assert whole["losses"][:3] == pytest.approx(rec["losses"], rel=1e-6)
    assert cont["losses"] == pytest.approx(whole["losses"][3:], rel=1e-6)
    assert cont["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6)
    # lr 0: AdamW leaves every parameter as the init phase left it.
    frozen = tvd.run(_args(lr_compare=0.0), None, noise_seed=1, init_path=path)
    assert frozen["eval_loss"] == pytest.approx(rec["eval_loss"], rel=1e-6)
    assert frozen["eval_loss_heldout"] == pytest.approx(rec["eval_loss_heldout"], rel=1e-6)
    assert frozen["eval_loss"] != pytest.approx(cont["eval_loss"], rel=1e-6)
    # The cache is reused for the same setup, trained again for another.
    assert tvd.init_state(a, str(tmp_path))[1].get("reused") is True
    assert "reused" not in tvd.init_state(_args(init_cache=a.init_cache, init_steps=2),
                                          str(tmp_path))[1]


# Guards the summary's held-out evaluation: gaps and floor computed from the key asked for.
def test_summarize_uses_the_evaluation_asked_for():
    runs = [{"seed": s, "topk_ratio": r, "eval_loss": e, "eval_loss_heldout": h, "train_tail20": 1.0,
             "bytes_sent": {}, "byte_counters": {}, "low_load_experts": [], "run_wall_s": 1.0}
            for s, r, e, h in [(0, None, 1.0, 2.0), (0, 0.05, 1.1, 2.0), (1, None, 1.02, 2.2),
                               (1, 0.05, 1.02, 2.2)]]
    train, held = tvd.summarize(runs), tvd.summarize(runs, "eval_loss_heldout")
    assert train["floor"]["max_abs"] == pytest.approx(0.02)
    assert held["floor"]["max_abs"] == pytest.approx(0.1)
    assert train["topk"][0]["relative_gap"] == pytest.approx([0.1, 0.0])
    assert held["topk"][0]["relative_gap"] == pytest.approx([0.0, 0.0])


# Guards the flags: --lr-compare without --init-steps and a negative --init-steps are refused.
@pytest.mark.parametrize("argv", [["--lr-compare", "1e-4"], ["--init-steps", "-1"]])
def test_bad_init_flags_refused(monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", ["topk_vs_dense.py"] + argv)
    with pytest.raises(SystemExit) as e:
        tvd.main()
    assert e.value.code == 2
