"""bin/loongforge, the entry point the README uses: from any directory, through a symlink, and
without PYTHONPATH set by hand."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from lf_testdata import ENTRY, REPO, entry_env as _env  # noqa: E402


# Guards the README's promise: `loongforge python` imports this checkout's package in another
# directory with PYTHONPATH unset, and the C++ CLI runs through a symlink to the script.
def test_runs_anywhere_without_pythonpath(tmp_path):
    env = _env()
    r = subprocess.run([ENTRY, "python", "-c", "import loongforge; print(loongforge.__file__)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.join(REPO, "python", "loongforge", "__init__.py")
    link = tmp_path / "loongforge"
    link.symlink_to(ENTRY)
    r = subprocess.run([str(link), "--version"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("loongforge ")
    r = subprocess.run([str(link), "train", "--help"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--mode" in r.stdout


# Guards the error edge: a missing build is one line that says what to run, exit code 2.
def test_missing_build_is_one_line(tmp_path):
    env = _env(LOONGFORGE_BUILD=str(tmp_path / "nowhere"))
    r = subprocess.run([ENTRY, "train", "--help"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "is not built" in r.stderr, r.stderr


# Guards: the trainer's two module names, `python -m loongforge.train` (the one scripts and the
# docs use) and `python -m loongforge.trainer` (the package), are the same command line.
def test_train_and_trainer_modules_are_one_command_line(tmp_path):
    env = _env()
    outs = []
    for module in ("loongforge.train", "loongforge.trainer"):
        r = subprocess.run([ENTRY, "python", "-m", module, "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: loongforge train"), r.stdout[:200]
        outs.append(r.stdout)
        r = subprocess.run([ENTRY, "python", "-m", module, "--data", str(tmp_path / "none")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "no LoongForge dataset there" in r.stderr, r.stderr
    assert outs[0] == outs[1]
