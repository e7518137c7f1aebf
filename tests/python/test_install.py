"""`pip install .` and `pip wheel .` with nothing from any index (pyproject.toml's in-tree backend,
tools/pep517/loongforge_build.py): into a venv of Debian's Python that sees its torch, reusing the
CMake build folder (LOONGFORGE_BUILD, default <repo>/build) so nothing is compiled twice."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import tarfile
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"  # Debian's: its torch is what the venv sees (--system-site-packages)

SMOKE = r"""
import os, sys, tempfile
import torch
import loongforge
here = os.path.dirname(os.path.abspath(loongforge.__file__))
assert here.startswith(sys.prefix), (here, sys.prefix)
info = loongforge.build_info()
assert info["version"] == loongforge.__version__, info
d = tempfile.mkdtemp()
loongforge.demo_data(d + "/src", episodes=2, cameras=1, width=32, height=24, seed=1,
                     steps_min=4, steps_max=5, state_dim=3, action_dim=2)
loongforge.pack(d + "/src", d + "/db", horizon=4)
ld = loongforge.DataFusionLoader(d + "/db", 2, seed=0, image_size=16, threads=1)
batch = next(iter(ld))
assert batch["tokens"].shape[0] == 2 and batch["state"].shape == (2, 3), {
    k: tuple(v.shape) for k, v in batch.items() if k != "task"}
assert all(isinstance(v, torch.Tensor) for k, v in batch.items() if k != "task")
assert len(batch["task"]) == 2 and all(isinstance(t, str) for t in batch["task"])
print("OK", info["version"], here)
"""


def _build_dir() -> str:
    build = os.environ.get("LOONGFORGE_BUILD") or os.path.join(REPO, "build")
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.isfile(cache):
        pytest.skip(f"no CMake build folder at {build} (run `make build`, or set LOONGFORGE_BUILD)")
    with open(cache, encoding="utf-8", errors="replace") as f:
        home = next((ln.split("=", 1)[1].strip() for ln in f
                     if ln.startswith("CMAKE_HOME_DIRECTORY:")), "")
    if os.path.realpath(home) != os.path.realpath(REPO):
        pytest.skip(f"{build} is a build of {home}, not of this checkout {REPO}")
    return build


def _env(build: str) -> dict:
    # No PYTHONPATH (the source tree must not stand in for the install) and no pip settings of
    # the caller's (find-links, indexes): only the repo itself may be used.
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("PIP_")}
    env.update(LOONGFORGE_BUILD_DIR=build, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1")
    return env


def _run(cmd, env, cwd, timeout=300):
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def _check_record(whl: str) -> set:
    """Every file of the wheel is in RECORD with its sha256 and size (PEP 427), and only those."""
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(z.read(record).decode())))
        listed = {r[0] for r in rows}
        assert listed == names, (sorted(listed ^ names))
        for path, digest, size in rows:
            if path == record:
                assert digest == "" and size == ""
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + want, path
            assert int(size) == len(data), path
    return names


# Guards the offline install: pip (default build isolation, no index) builds the wheel through
# CMake in the given build folder, the wheel's RECORD is exact, and the installed package imports
# and loads data from another directory, with the `loongforge` command on the venv's PATH.
def test_pip_install_and_wheel_offline(tmp_path):
    build = _build_dir()
    if subprocess.run([PY, "-c", "import venv, ensurepip"], capture_output=True).returncode:
        pytest.skip(f"{PY} has no venv/ensurepip (apt-get install python3-venv python3-pip)")
    env = _env(build)
    venv = tmp_path / "venv"
    _run([PY, "-m", "venv", "--system-site-packages", str(venv)], env, tmp_path)
    vpy = str(venv / "bin" / "python")

    wheels = tmp_path / "wheels"
    _run([vpy, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), REPO], env, tmp_path)
    (whl,) = [str(p) for p in wheels.iterdir()]
    tag = _run([vpy, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"], env,
               tmp_path).stdout.strip()
    assert os.path.basename(whl).startswith("loongforge-") and f"-{tag}-{tag}-" in whl, whl
    names = _check_record(whl)
    assert "loongforge/__init__.py" in names and "loongforge/_bin/loongforge" in names, names
    assert any(n.startswith("loongforge/_C.") and n.endswith(".so") for n in names), names
    assert not any("__pycache__" in n for n in names), names

    _run([vpy, "-m", "pip", "install", REPO], env, tmp_path)
    r = _run([vpy, "-c", SMOKE], env, "/tmp", timeout=120)
    assert r.stdout.startswith("OK "), r.stdout
    assert str(venv) in r.stdout, r.stdout

    # The command: the C++ CLI without the source tree, and the Python entry points.
    r = _run([str(venv / "bin" / "loongforge"), "--version"], env, "/tmp", timeout=60)
    assert r.stdout.startswith("loongforge "), r.stdout
    r = _run([str(venv / "bin" / "loongforge"), "python", "-c",
              "import sys, loongforge; print(sys.executable, loongforge.__file__)"], env, "/tmp")
    assert r.stdout.split()[0] == vpy and str(venv) in r.stdout.split()[1], r.stdout


# Guards the build folder check: a LOONGFORGE_BUILD_DIR configured from another source tree would
# pack a loongforge._C that does not match these sources; the build fails naming both.
def test_build_dir_of_another_tree_is_refused(tmp_path):
    fake = tmp_path / "build"
    fake.mkdir()
    (fake / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/nowhere/else\n")
    env = _env(str(fake))
    r = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "w"), REPO],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "/nowhere/else" in out and str(fake) in out, out
    assert not (tmp_path / "w").exists() or not list((tmp_path / "w").iterdir())


# Guards the other hooks pip and build frontends call: prepare_metadata_for_build_wheel writes the
# METADATA the wheel has (no build needed), and build_sdist packs the tracked sources (the backend
# and pyproject.toml included, no build output or compiled module) with PKG-INFO.
def test_metadata_and_sdist_hooks(tmp_path):
    code = (
        "import sys; sys.path.insert(0, 'tools/pep517'); import loongforge_build as b; "
        f"print(b.prepare_metadata_for_build_wheel({str(tmp_path / 'meta')!r})); "
        f"print(b.build_sdist({str(tmp_path / 'sdist')!r}))")
    r = _run([PY, "-c", code], _env("unused"), REPO, timeout=120)
    dist_info, sdist = r.stdout.split()
    meta = (tmp_path / "meta" / dist_info / "METADATA").read_text()
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        version = re.search(r"project\(loongforge VERSION ([0-9.]+)", f.read()).group(1)
    assert dist_info == f"loongforge-{version}.dist-info"
    assert f"Name: loongforge\nVersion: {version}\n" in meta and "Requires-Dist: torch" in meta
    with tarfile.open(tmp_path / "sdist" / sdist) as tf:
        names = tf.getnames()
        base = f"loongforge-{version}/"
        assert all(n.startswith(base) for n in names)
        rel = {n[len(base):] for n in names}
        assert {"pyproject.toml", "PKG-INFO", "CMakeLists.txt", "tools/pep517/loongforge_build.py",
                "python/loongforge/__init__.py", "src/ckpt/lifecycle.cc"} <= rel
        assert not any(n.endswith(".so") or n.startswith("build") for n in rel), sorted(rel)[:20]
        assert tf.extractfile(base + "PKG-INFO").read().decode() == meta
