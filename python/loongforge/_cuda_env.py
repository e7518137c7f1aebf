"""Process-wide CUDA settings LoongForge needs before the CUDA context starts.

Note [Hardware queues]
The GPU maps every CUDA stream onto one of CUDA_DEVICE_MAX_CONNECTIONS hardware work queues
(default 8). Work in one queue runs in order, so two streams that share a queue are serialized
even though the program never ordered them. The GPU loader's decode lanes (nvJPEG creates many
internal streams) share queues with the training stream, and a CUDA-graph replay puts one step's
whole work (about 280 ms at n16 batch 64 on an H200) into that stream at once: decode copies and
kernels that landed behind it waited for the whole replay, the loader finished about one batch per
replay and the trainer waited ~90 ms for data in most steps (data wait 21-29% of the run). With 32
queues, the maximum, the same run waited 0 ms for data after warm-up (bench/e2e/diag_stall.sh,
rows b64 and b64c32; docs/BENCHMARKS.md).

The variable is read once, when the context is created, so it is set when loongforge is imported,
if the user has not set it and CUDA has not started yet. A user value is kept; the GPU loader
warns when the effective value is below kWantedQueues.
"""
from __future__ import annotations

import os
import sys

kWantedQueues = 32
_VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return False


_started_before_import = _cuda_started()
if not _started_before_import:
    os.environ.setdefault(_VAR, str(kWantedQueues))


def hardware_queues() -> str:
    """The effective CUDA_DEVICE_MAX_CONNECTIONS, or why it is not known."""
    if _started_before_import and _VAR not in os.environ:
        return "8 (CUDA started before loongforge was imported)"
    return os.environ.get(_VAR, "8 (CUDA default)")


def loader_queue_warning() -> str:
    """A warning for the GPU loader when its streams may share hardware queues with training's
    (Note [Hardware queues]); empty when the setting is right."""
    v = hardware_queues()
    try:
        n = int(v.split()[0])
    except ValueError:
        return ""
    if n >= kWantedQueues:
        return ""
    return (f"{_VAR}={v}: the GPU loader's streams share hardware queues with the training "
            f"stream and can wait behind whole CUDA-graph replays (data wait). Set "
            f"{_VAR}={kWantedQueues} before CUDA starts, or import loongforge first.")
