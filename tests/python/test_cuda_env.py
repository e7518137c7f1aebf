"""Note [Hardware queues]: importing loongforge sets CUDA_DEVICE_MAX_CONNECTIONS before CUDA starts,
keeps a user's value, and the GPU loader's warning names a value below 32."""
import os
import subprocess
import sys

_PY = sys.executable


def _run(code: str, env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(env_extra)
    return subprocess.run([_PY, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_import_sets_32_queues_when_unset():
    # Guards the fix of the batch-64 data wait: without it the default 8 queues come back.
    out = _run("import loongforge, os; print(os.environ['CUDA_DEVICE_MAX_CONNECTIONS'])", {})
    assert out == "32"


def test_user_value_is_kept_and_warned_about():
    # Guards that a user's explicit setting is never overridden, only reported.
    code = ("import loongforge, os; from loongforge import _cuda_env; "
            "print(os.environ['CUDA_DEVICE_MAX_CONNECTIONS']); print(_cuda_env.loader_queue_warning())")
    out = _run(code, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}).splitlines()
    assert out[0] == "1"
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in out[1] and "32" in out[1]


def test_no_warning_at_32():
    out = _run("from loongforge import _cuda_env; print(repr(_cuda_env.loader_queue_warning()))", {})
    assert out == "''"
