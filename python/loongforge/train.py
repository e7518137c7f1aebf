"""Fine-tune the GR00T-N1.6-shaped policy on a packed LoongForge DB, in one of three modes.

``python -m loongforge.train`` is the trainer's command line; the trainer itself is the package
``loongforge.trainer`` (cli.py: the flags and ``main``; session.py: ``build``; loop.py:
``train_loop`` and ``run``). This module keeps the names that scripts and tests import from it.
"""
from __future__ import annotations

import sys

from .train_metrics import Readback, format_summary
from .trainer.cli import build_parser, check_args, main
from .trainer.errors import NonFiniteError, TrainError
from .trainer.inputs import TokenGuard
from .trainer.loop import StopSignal, resume, run, train_loop
from .trainer.model import build_model
from .trainer.optim import optimizer_step
from .trainer.plan import _compile_blocks_wanted, auto_buckets
from .trainer.session import SampleNoise, Session, build

__all__ = ["build_parser", "check_args", "main", "run", "build", "train_loop", "resume",
           "StopSignal", "Session", "SampleNoise", "TokenGuard", "Readback", "format_summary",
           "build_model", "auto_buckets", "optimizer_step", "TrainError", "NonFiniteError",
           "_compile_blocks_wanted"]

if __name__ == "__main__":
    sys.exit(main())
