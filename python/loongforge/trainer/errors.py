"""The trainer's errors: what ``python -m loongforge.train`` (and ``loongforge.Forge``) report to
the user in one line."""
from __future__ import annotations


class TrainError(RuntimeError):
    """A configuration or environment problem reported to the user in one line."""


class NonFiniteError(TrainError):
    """The run stopped: --max-nonfinite-steps steps in a row had a non-finite loss or gradient
    (Note [Non-finite steps])."""


def _missing(module: str, flag: str, err: BaseException) -> TrainError:
    return TrainError(f"loongforge mode needs {module}, which is not available in this build "
                      f"({type(err).__name__}: {err}); run with --no-{flag} to switch it off")
