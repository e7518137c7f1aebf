"""trainer.plan.resolve_plan on the CPU: every "auto" of the trainer resolves as its flag's help
says, on a machine with or without CUDA (``cuda_available``) and at any world size (``world``),
each choice with a reason; an explicit flag wins over auto; a flag the machine cannot honour is
refused with the line build gave."""
from __future__ import annotations

import pytest

from loongforge.models.gr00t import get_config
from loongforge.trainer.cli import build_parser
from loongforge.trainer.errors import TrainError
from loongforge.trainer.plan import Choice, auto_buckets, resolve_plan

SCHEMA = {"max_tokens": 40}


@pytest.fixture(autouse=True)
def _no_alloc_conf(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)


def _plan(*flags, cuda=False, world=1, schema=SCHEMA, config="tiny"):
    args = build_parser().parse_args(["--data", "DB", *flags])
    return resolve_plan(args, get_config(config), schema, cuda_available=cuda, world=world)


def _values(plan):
    return {k: c.value for k, c in plan.choices().items()}


# Guards: every choice of every plan says why it came out as it did.
@pytest.mark.parametrize("mode", ["loongforge", "tuned", "baseline"])
@pytest.mark.parametrize("cuda", [False, True])
def test_every_choice_has_a_reason(mode, cuda):
    for world in (1, 2):
        plan = _plan("--mode", mode, cuda=cuda, world=world)
        choices = plan.choices()
        assert len(choices) >= 20, sorted(choices)
        for name, c in choices.items():
            assert isinstance(c, Choice) and isinstance(c.reason, str) and c.reason.strip(), \
                (mode, cuda, world, name, c)


def test_loongforge_on_the_cpu():
    p = _plan()
    v = _values(p)
    assert v["device"] == "cpu" and not p.cuda
    assert all(v[f"switch:{m}"] for m in ("datafusion", "nexussync", "vault", "memsculptor"))
    assert not v["cuda_graphs"] and v["token_buckets"] == () and v["loader_buckets"] == ()
    assert not v["frozen_bf16"] and not v["norm_recompute"] and not v["sync_free"]
    assert not v["persistent_arena"] and v["expandable_segments"] == "off"
    assert v["sync"] == "nexussync" and v["checkpoint"] == "vault" and v["noise"] == "stream"
    assert not v["compile_blocks"] and p.compile_blocks.reason == "needs CUDA"
    assert v["memory_cap_mib"] == 0 and v["text_cut"] == 0 and v["token_pad"] == 0
    # The modules line as the CPU runs print it (tests/python/test_train.py reads it back).
    line = p.modules()
    assert line["memsculptor"] == "off: needs CUDA" and line["datafusion"] == "on"
    assert line["nexussync"] == "on" and line["vault"] == "off: no checkpoints"
    assert line["compile_blocks"] == "off: needs CUDA"
    assert "cuda_graph" not in line and "sync_free" not in line and "noise" not in line
    assert _plan("--ckpt-dir", "CK").modules()["vault"] == "on"


def test_loongforge_on_cuda():
    p = _plan(cuda=True)
    v = _values(p)
    assert v["device"] == "cuda" and p.cuda
    assert v["cuda_graphs"] and v["token_buckets"] == auto_buckets(40)
    assert v["loader_buckets"] == v["token_buckets"]  # every record fits the largest bucket
    assert v["frozen_bf16"] and v["norm_recompute"] and v["sync_free"]
    assert v["persistent_arena"] and v["expandable_segments"] == "on"
    # One graphed microbatch a step at world size 1: the gradients live in the graph pool and
    # NexusSync has nothing to reduce.
    assert v["grads_in_pool"] and v["sync"] == "none"
    assert p.modules()["nexussync"].startswith("off: world size 1, nothing to reduce")
    assert p.modules()["sync_free"] == "on (figures read back 2 steps late)"
    assert p.modules()["memsculptor"] == "on"
    # Two ranks: NexusSync reduces, the gradients stay in its buckets.
    v2 = _values(_plan(cuda=True, world=2))
    assert not v2["grads_in_pool"] and v2["sync"] == "nexussync"


def test_tuned_and_baseline_on_cuda():
    v = _values(_plan("--mode", "tuned", cuda=True))
    assert v["frozen_bf16"] and v["sync_free"] and v["expandable_segments"] == "on"
    assert not v["norm_recompute"] and not v["cuda_graphs"] and not v["persistent_arena"]
    assert v["checkpoint"] == "async" and v["sync"] == "none"
    assert not any(v[f"switch:{m}"] for m in ("datafusion", "nexussync", "vault", "memsculptor"))
    b = _values(_plan("--mode", "baseline", cuda=True, world=2))
    assert not b["frozen_bf16"] and not b["sync_free"] and b["expandable_segments"] == "off"
    assert b["checkpoint"] == "torch" and b["sync"] == "ddp"


# Guards: a flag given explicitly decides, whatever auto would have chosen.
def test_explicit_flags_win_over_auto():
    p = _plan("--cuda-graph", "off", "--frozen-bf16", "off", "--norm-recompute", "off",
              "--sync-free", "off", "--expandable-segments", "off", "--persistent-arena", "off",
              "--compile-blocks", "off", "--token-buckets", "24,48", "--graph-grads", "fixed",
              cuda=True)
    v = _values(p)
    assert not v["cuda_graphs"] and p.cuda_graphs.reason == "--cuda-graph off"
    assert not v["frozen_bf16"] and p.frozen_bf16.reason == "--frozen-bf16 off"
    assert not v["norm_recompute"] and not v["sync_free"] and not v["persistent_arena"]
    assert v["expandable_segments"] == "off" and not v["compile_blocks"]
    assert v["token_buckets"] == (24, 48) and not v["grads_in_pool"] and v["sync"] == "nexussync"
    on = _values(_plan("--cuda-graph", "per_microbatch", "--mode", "tuned", "--norm-recompute",
                       "on", "--sync-free", "on", "--expandable-segments", "on", cuda=True))
    assert on["cuda_graphs"] and on["norm_recompute"] and on["sync_free"]
    assert on["expandable_segments"] == "on"
    v = _values(_plan("--no-nexussync", "--no-vault", "--no-memsculptor", "--noise",
                      "per-sample", "--token-pad", "32", world=2))
    assert v["sync"] == "ddp" and v["checkpoint"] == "torch" and not v["persistent_arena"]
    assert v["noise"] == "per-sample" and v["token_pad"] == 32
    line = _plan("--no-nexussync", "--no-memsculptor", "--noise", "per-sample").modules()
    assert line["nexussync"] == "off: --no-nexussync"
    assert line["memsculptor"] == "off: --no-memsculptor"
    assert line["noise"].startswith("per sample")
    # --profile-modules needs eager steps: auto leaves the graphs off, and says so.
    p = _plan("--profile-modules", "2", cuda=True)
    assert not p.cuda_graphs.value and "--profile-modules" in p.cuda_graphs.reason
    assert p.modules()["cuda_graph"] == "off (--profile-modules: eager steps)"


def test_text_longer_than_the_model_takes_is_cut():
    cfg = get_config("tiny")
    p = _plan(cuda=True, schema={"max_tokens": cfg.max_text_tokens + 50})
    assert p.text_cut.value == cfg.max_text_tokens and "cuts them to" in p.text_cut.reason
    assert p.token_buckets.value[-1] == cfg.max_text_tokens
    with pytest.raises(TrainError, match="longer than config tiny's max_text_tokens"):
        _plan("--token-pad", str(cfg.max_text_tokens + 1))


def test_flags_the_machine_cannot_honour_are_refused():
    with pytest.raises(TrainError, match="--memory-cap-gib caps GPU memory"):
        _plan("--memory-cap-gib", "4")
    with pytest.raises(TrainError, match="--expandable-segments on needs CUDA"):
        _plan("--expandable-segments", "on")
    with pytest.raises(TrainError, match="--device cuda: torch sees no CUDA device"):
        _plan("--device", "cuda")
    with pytest.raises(TrainError, match="--frozen-bf16 on needs CUDA"):
        _plan("--frozen-bf16", "on", "--device", "cpu", cuda=True)
    with pytest.raises(TrainError, match="--token-buckets"):
        _plan("--token-buckets", "32,x")
    # The order build met them in: the memory cap first.
    with pytest.raises(TrainError, match="--memory-cap-gib"):
        _plan("--memory-cap-gib", "4", "--device", "cuda", "--frozen-bf16", "on")
    p = _plan("--memory-cap-gib", "1.5", cuda=True)
    assert p.memory_cap_mib.value == 1536 and p.modules()["memory_cap"].startswith("1.5 GiB")


def test_alloc_conf_setting_is_kept(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    p = _plan(cuda=True)
    assert p.expandable_segments.value == "off (PYTORCH_CUDA_ALLOC_CONF)"
    assert p.modules()["expandable_segments"] == "off (PYTORCH_CUDA_ALLOC_CONF)"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert _plan("--expandable-segments", "off").expandable_segments.value == \
        "on (PYTORCH_CUDA_ALLOC_CONF)"
