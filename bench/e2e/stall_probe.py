#!/usr/bin/env python3
"""Runs `python -m loongforge.train ARGS` with torch's profiler (CPU + CUDA activity, every thread)
over steps PROBE_START..PROBE_STOP, then summarizes the trace with bench/e2e/trace_summary.py.

Used to find what holds the loader back while CUDA graphs replay (issue: data wait at batch 64).
The profiler is started and stopped from a wrapper around the trainer's optimizer_step, so the
trainer itself is unchanged.

  PROBE_START=24 PROBE_STOP=30 PROBE_OUT=trace.json python3 bench/e2e/stall_probe.py --config n16 ...
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from loongforge.trainer import cli, loop

start = int(os.environ.get("PROBE_START", "24"))
stop = int(os.environ.get("PROBE_STOP", "30"))
out = os.environ.get("PROBE_OUT", "stall_trace.json")
state = {"n": 0, "prof": None}
orig = loop.optimizer_step  # the one train_loop calls


def hooked(*a, **k):
    r = orig(*a, **k)
    state["n"] += 1
    if state["n"] == start:
        state["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        state["prof"].__enter__()
    elif state["n"] == stop and state["prof"] is not None:
        torch.cuda.synchronize()
        state["prof"].__exit__(None, None, None)
        state["prof"].export_chrome_trace(out)
        state["prof"] = None
        print(f"stall_probe: trace of steps {start}..{stop} -> {out}", file=sys.stderr)
    return r


loop.optimizer_step = hooked
sys.exit(cli.main(sys.argv[1:]))
