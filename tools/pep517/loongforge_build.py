"""The PEP 517 build backend of LoongForge: `pip install .` and `pip wheel .` without PyPI.

pyproject.toml names this module with `requires = []`, so pip's isolated build environment needs
nothing from any index: the extension is built by CMake (as `make build` does), and the wheel
(PEP 427) and sdist are written here with the standard library only.

Environment:
  LOONGFORGE_BUILD_DIR   a CMake build folder (relative: to the source tree), configured already
                         (e.g. `build/` of `make build`, so CI does not compile twice) or
                         configured here if new; default: <source>/build-wheel, configured
                         without the test suite.
  LOONGFORGE_CUDA        AUTO (default: CUDA paths when nvcc works, as the Makefile), ON or OFF;
                         read only when a build folder is configured here.
  LOONGFORGE_CMAKE_ARGS  further arguments for that configure step (split like a shell would).
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the number of CPUs).

The wheel holds python/loongforge (sources only: .so files left in the source tree by other
builds are not taken), the files the build lists in <build>/wheel_files.txt (loongforge._C, the
CUDA allocator plug-in when built, the CLI binary as loongforge/_bin/loongforge), and the
`loongforge` command (tools/pep517/loongforge_script.py).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import io
import os
import re
import shlex
import stat
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from typing import Dict, List, Optional, Tuple

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

__all__ = ["build_wheel", "build_sdist", "get_requires_for_build_wheel",
           "get_requires_for_build_sdist", "prepare_metadata_for_build_wheel"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCRIPT = os.path.join(_HERE, "loongforge_script.py")


class BuildError(RuntimeError):
    pass


def _hook(fn):
    # A BuildError is the user's to fix (a wrong folder, a failed compile): one line, no traceback.
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BuildError as e:
            print(f"loongforge_build: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
    return wrapped


def _root() -> str:
    # pip runs the backend with the source tree as the working directory (PEP 517).
    return os.path.abspath(os.getcwd())


def _project(root: str) -> Dict:
    path = os.path.join(root, "pyproject.toml")
    if tomllib is None:
        raise BuildError(f"reading {path} needs Python 3.11 or newer (tomllib)")
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    proj = doc.get("project")
    if not isinstance(proj, dict) or not isinstance(proj.get("name"), str):
        raise BuildError(f"{path}: [project] with a name is required")
    return proj


def _version(root: str) -> str:
    # One version for the C++ core and the package: CMakeLists.txt's project(... VERSION x.y.z).
    path = os.path.join(root, "CMakeLists.txt")
    with open(path, encoding="utf-8") as f:
        m = re.search(r"project\(\s*loongforge\s+VERSION\s+([0-9][0-9A-Za-z.]*)", f.read())
    if not m:
        raise BuildError(f"{path}: no `project(loongforge VERSION x.y.z)` to take the version from")
    return m.group(1)


def _dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata(root: str) -> str:
    proj = _project(root)
    lines = ["Metadata-Version: 2.1", f"Name: {proj['name']}", f"Version: {_version(root)}"]
    if proj.get("description"):
        lines.append(f"Summary: {proj['description']}")
    if proj.get("requires-python"):
        lines.append(f"Requires-Python: {proj['requires-python']}")
    lic = proj.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    for dep in proj.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    for url_name, url in proj.get("urls", {}).items():
        lines.append(f"Project-URL: {url_name}, {url}")
    body = ""
    readme = proj.get("readme")
    if isinstance(readme, str) and os.path.isfile(os.path.join(root, readme)):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(root, readme), encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _wheel_tag() -> str:
    # loongforge._C is built for this interpreter: a CPython-version, ABI and platform tag.
    impl = {"cpython": "cp"}.get(sys.implementation.name, sys.implementation.name)
    ver = f"{sys.version_info[0]}{sys.version_info[1]}"
    abi = f"{impl}{ver}" + ("d" if sysconfig.get_config_var("Py_DEBUG") else "")
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{impl}{ver}-{abi}-{plat}"


def _log(msg: str) -> None:
    print(f"loongforge_build: {msg}", file=sys.stderr, flush=True)


def _run(cmd: List[str], cwd: str) -> None:
    _log("$ " + " ".join(shlex.quote(c) for c in cmd))
    try:
        subprocess.run(cmd, cwd=cwd, check=True)
    except FileNotFoundError:
        raise BuildError(f"{cmd[0]} not found (install cmake: make deps)") from None
    except subprocess.CalledProcessError as e:
        raise BuildError(f"`{' '.join(cmd[:3])} ...` failed with exit code {e.returncode}") from None


def _cache_value(cache: str, key: str) -> Optional[str]:
    with open(cache, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split("=", 1)[1].strip() if "=" in line else None
    return None


def _build(root: str) -> List[Tuple[str, str, str]]:
    """Configures (if needed) and builds the targets the wheel ships; returns wheel_files.txt's
    (where, target, path) rows."""
    given = os.environ.get("LOONGFORGE_BUILD_DIR")
    build = os.path.abspath(given) if given else os.path.join(root, "build-wheel")
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        src = _cache_value(cache, "CMAKE_HOME_DIRECTORY")
        if src is None or os.path.realpath(src) != os.path.realpath(root):
            raise BuildError(f"LOONGFORGE_BUILD_DIR={build} is a build of {src}, not of {root}: "
                             "its loongforge._C would not match these Python sources")
        _log(f"reusing the CMake build folder {build}")
    else:
        cuda = os.environ.get("LOONGFORGE_CUDA", "AUTO")
        cmd = ["cmake", "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
               f"-DLOONGFORGE_CUDA={cuda}", f"-DPython3_EXECUTABLE={sys.executable}",
               "-DLOONGFORGE_TESTS=OFF"]
        cmd += shlex.split(os.environ.get("LOONGFORGE_CMAKE_ARGS", ""))
        _run(cmd, root)
    listing = os.path.join(build, "wheel_files.txt")
    if not os.path.exists(listing):
        # Generated by CMakeLists.txt at configure time; an older configure lacks it.
        _run(["cmake", build], root)
    if not os.path.exists(listing):
        raise BuildError(f"{listing} was not generated: is {build} configured with "
                         "LOONGFORGE_PYTHON=ON?")
    rows = []
    with open(listing, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split(" ", 2)
            if not line.strip():
                continue
            if len(parts) != 3 or parts[0] not in ("package", "cli"):
                raise BuildError(f"{listing}:{n}: expected '<package|cli> <target> <path>'")
            rows.append((parts[0], parts[1], parts[2]))
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    cmd = ["cmake", "--build", build, "--parallel", jobs, "--target"] + [t for _, t, _ in rows]
    _run(cmd, root)
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    for where, target, path in rows:
        if not os.path.isfile(path):
            raise BuildError(f"{listing}: target {target} built no file at {path}")
        if target == "_C" and not path.endswith(ext):
            raise BuildError(f"{path} is built for another Python (this one, {sys.executable}, "
                             f"loads *{ext}); reconfigure {build} with "
                             f"-DPython3_EXECUTABLE={sys.executable}")
    return rows


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


class _WheelWriter:
    """A PEP 427 wheel: every file hashed into RECORD, which is written last."""

    def __init__(self, path: str, epoch: int) -> None:
        self.zf = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records: List[str] = []
        self.date = time.gmtime(max(epoch, 315532800))[:6]  # zip cannot store dates before 1980

    def add(self, arcname: str, data: bytes, executable: bool = False) -> None:
        info = zipfile.ZipInfo(arcname, date_time=self.date)
        mode = 0o755 if executable else 0o644
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, data)
        self.records.append(f"{arcname},{_record_hash(data)},{len(data)}")

    def add_file(self, arcname: str, path: str) -> None:
        with open(path, "rb") as f:
            data = f.read()
        self.add(arcname, data, executable=bool(os.stat(path).st_mode & stat.S_IXUSR))

    def close(self, record_name: str) -> None:
        self.records.append(f"{record_name},,")
        info = zipfile.ZipInfo(record_name, date_time=self.date)
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        self.zf.writestr(info, "\n".join(self.records) + "\n", zipfile.ZIP_DEFLATED)
        self.zf.close()


def _package_sources(root: str) -> List[Tuple[str, str]]:
    """(arcname, path) of every .py file of python/loongforge, sorted."""
    base = os.path.join(root, "python")
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(base, "loongforge")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                out.append((os.path.relpath(p, base).replace(os.sep, "/"), p))
    return out


def _dist_info_files(root: str, tag: str) -> Dict[str, bytes]:
    wheel = ("Wheel-Version: 1.0\nGenerator: loongforge_build\nRoot-Is-Purelib: false\n"
             f"Tag: {tag}\n")
    files = {"METADATA": _metadata(root).encode("utf-8"), "WHEEL": wheel.encode("utf-8")}
    lic = os.path.join(root, "LICENSE")
    if os.path.isfile(lic):
        with open(lic, "rb") as f:
            files["LICENSE"] = f.read()
    return files


def _dist_info_dir(root: str) -> str:
    return f"{_dist_name(_project(root)['name'])}-{_version(root)}.dist-info"


# ---- PEP 517 hooks ----
def get_requires_for_build_wheel(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> List[str]:
    return []


@_hook
def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings=None) -> str:
    root = _root()
    name = _dist_info_dir(root)
    d = os.path.join(metadata_directory, name)
    os.makedirs(d, exist_ok=True)
    for fn, data in _dist_info_files(root, _wheel_tag()).items():
        with open(os.path.join(d, fn), "wb") as f:
            f.write(data)
    return name


@_hook
def build_wheel(wheel_directory: str, config_settings=None,
                metadata_directory: Optional[str] = None) -> str:
    root = _root()
    rows = _build(root)
    name = _dist_name(_project(root)["name"])
    version = _version(root)
    tag = _wheel_tag()
    wheel_name = f"{name}-{version}-{tag}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    out = os.path.join(wheel_directory, wheel_name)
    tmp = out + ".part"
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    w = _WheelWriter(tmp, epoch)
    try:
        for arc, path in _package_sources(root):
            w.add_file(arc, path)
        for where, _, path in rows:
            if where == "package":
                w.add_file("loongforge/" + os.path.basename(path), path)
            else:  # the CLI: run through the `loongforge` command (loongforge_script.py)
                w.add_file("loongforge/_bin/" + os.path.basename(path), path)
        with open(_SCRIPT, "rb") as f:
            script = f.read()
        data_dir = f"{name}-{version}.data"
        # pip rewrites a `#!python` first line to the interpreter it installs for.
        w.add(f"{data_dir}/scripts/loongforge", script, executable=True)
        dist_info = f"{name}-{version}.dist-info"
        for fn, data in _dist_info_files(root, tag).items():
            w.add(f"{dist_info}/{fn}", data)
        w.close(f"{dist_info}/RECORD")
    except BaseException:
        w.zf.close()
        os.unlink(tmp)
        raise
    os.replace(tmp, out)
    _log(f"wrote {out}")
    return wheel_name


@_hook
def build_sdist(sdist_directory: str, config_settings=None) -> str:
    """The files git tracks (the source tree as committed, plus local edits to them); outside a
    git checkout (an unpacked sdist), every file but build folders and compiled objects."""
    root = _root()
    name = _dist_name(_project(root)["name"])
    version = _version(root)
    base = f"{name}-{version}"
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                             check=True).stdout
        files = sorted(f for f in out.decode("utf-8", "surrogateescape").split("\0") if f)
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(("build", ".git"))
                                 and d != "__pycache__")
            for fn in filenames:
                if not fn.endswith((".so", ".pyc", ".o")):
                    files.append(os.path.normpath(os.path.join(rel, fn)))
        files.sort()
    os.makedirs(sdist_directory, exist_ok=True)
    sdist = f"{base}.tar.gz"
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    tmp = os.path.join(sdist_directory, sdist + ".part")
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for rel in files:
            path = os.path.join(root, rel)
            if not os.path.isfile(path) or os.path.islink(path):
                continue  # deleted in the work tree, or a link: neither is source to ship
            ti = tf.gettarinfo(path, arcname=f"{base}/{rel}")
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mtime = epoch
            with open(path, "rb") as f:
                tf.addfile(ti, f)
        pkg_info = _metadata(root).encode("utf-8")
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size, ti.mtime, ti.mode = len(pkg_info), epoch, 0o644
        tf.addfile(ti, io.BytesIO(pkg_info))
    os.replace(tmp, os.path.join(sdist_directory, sdist))
    return sdist
