"""The environment knobs' single declaration (src/common/env_knobs.cc): every LOONGFORGE_* name
the code reads is in the table and read through it, `loongforge info --env` and docs/knobs.md list
the table, and a bad value is refused with the variable named."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from loongforge import knobs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ["src", "include", "python", "apps", "bin"]
CODE_EXT = (".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp", ".py")
# Compile definitions and CMake options, not environment variables.
NOT_KNOBS = re.compile(r"^LOONGFORGE_(WITH_[A-Z0-9_]*|TESTS)$")

# A name in a string literal: getenv("X"), EnvInt("X"), os.environ.get("X"), knobs.get("X"),
# setenv("X", ...) in a test. A shell read in bin/: ${X:-...} or $X.
QUOTED = re.compile(r"""["'](LOONGFORGE_[A-Z0-9_]+)["']""")
SHELL_READ = re.compile(r"\$\{?(LOONGFORGE_[A-Z0-9_]+)")
# Reads that bypass the table (writes, os.environ[X] = ..., stay allowed).
CXX_DIRECT = re.compile(r"""\bgetenv\(\s*"LOONGFORGE_""")
PY_DIRECT = re.compile(r"""os\.environ\.get\(\s*["']LOONGFORGE_|os\.getenv\(\s*["']LOONGFORGE_|"""
                       r"""os\.environ\[\s*["']LOONGFORGE_[A-Z0-9_]+["']\s*\](?!\s*=[^=])""")


def _files():
    """The scanned folders' files: git's tracked ones in a checkout (build outputs and caches
    left out), else every file under them."""
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "--"] + SCANNED,
                             capture_output=True, text=True, check=True).stdout.split()
        if out:
            return [os.path.join(REPO, f) for f in out]
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for top in SCANNED:
        for root, dirs, names in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [os.path.join(root, n) for n in names]
    return found


def _sources():
    """(relative path, text) of every code file and every bin/ script."""
    for path in _files():
        rel = os.path.relpath(path, REPO)
        if not (rel.endswith(CODE_EXT) or rel.startswith("bin" + os.sep)):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                yield rel, f.read()
        except (UnicodeDecodeError, OSError):
            continue


def names_read():
    """{name: [where it is read]} over src, include, python, apps and bin."""
    found = {}
    for rel, text in _sources():
        pats = [QUOTED] + ([SHELL_READ] if rel.startswith("bin" + os.sep) else [])
        for pat in pats:
            for m in pat.finditer(text):
                if not NOT_KNOBS.match(m.group(1)):
                    line = text.count("\n", 0, m.start()) + 1
                    found.setdefault(m.group(1), []).append(f"{rel}:{line}")
    return found


def test_table_is_well_formed():
    t = knobs.table()
    assert len(t) >= 15
    assert len({k["name"] for k in t}) == len(t)
    for k in t:
        assert k["name"].startswith("LOONGFORGE_") and not NOT_KNOBS.match(k["name"]), k
        assert k["type"] in ("int", "float", "bool", "string"), k
        assert k["doc"] and "\n" not in k["doc"], k
        assert k["reader"] in ("core", "python", "bin/loongforge"), k


def test_every_knob_read_is_declared():
    read = names_read()
    # The scan itself works: it finds knobs of every kind of reader.
    for name in ("LOONGFORGE_MEM_LIMIT_MB", "LOONGFORGE_LOG_LEVEL", "LOONGFORGE_SIGNAL_GRACE_S",
                 "LOONGFORGE_BUILD"):
        assert name in read, (name, sorted(read))
    undeclared = {n: w for n, w in read.items() if n not in set(knobs.names())}
    assert not undeclared, ("LOONGFORGE_* names read but not declared in "
                            f"src/common/env_knobs.cc: {undeclared}")


def test_every_declared_knob_is_read():
    stale = sorted(set(knobs.names()) - set(names_read()))
    assert not stale, f"declared in src/common/env_knobs.cc but read nowhere: {stale}"


def test_no_reader_bypasses_the_table():
    direct = []
    for rel, text in _sources():
        if rel == os.path.join("src", "common", "env_knobs.cc"):
            continue  # the getters themselves
        pat = PY_DIRECT if rel.endswith(".py") else CXX_DIRECT
        for m in pat.finditer(text):
            direct.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    assert not direct, f"LOONGFORGE_* read without the knob table (use EnvInt/knobs.get): {direct}"


def test_the_patterns_catch_what_they_are_for():
    assert QUOTED.findall('EnvInt("LOONGFORGE_X_MB")') == ["LOONGFORGE_X_MB"]
    assert SHELL_READ.findall("b=${LOONGFORGE_X:-$root}") == ["LOONGFORGE_X"]
    assert CXX_DIRECT.search('std::getenv("LOONGFORGE_X")')
    assert PY_DIRECT.search('os.environ.get("LOONGFORGE_X", "1")')
    assert PY_DIRECT.search("v = os.environ['LOONGFORGE_X']")
    assert not PY_DIRECT.search('os.environ["LOONGFORGE_X"] = "3"')
    assert NOT_KNOBS.match("LOONGFORGE_WITH_CUDA") and not NOT_KNOBS.match("LOONGFORGE_DEBUG")


def _cli():
    path = os.path.join(os.environ.get("LOONGFORGE_BUILD") or os.path.join(REPO, "build"),
                        "loongforge")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no {path} (build the CLI)")
    return path


def test_info_env_lists_every_knob():
    env = dict(os.environ, LOONGFORGE_MEM_SEGMENT_MB="64")
    r = subprocess.run([_cli(), "info", "--env"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    for k in knobs.table():
        assert re.search(rf"^{k['name']}$", r.stdout, re.M), k["name"]
        assert k["doc"] in r.stdout, k["name"]
    assert "current '64'" in r.stdout
    r = subprocess.run([_cli(), "info", "--env", "--json"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {k["name"]: k for k in json.loads(r.stdout)}
    assert set(rows) == set(knobs.names())
    for k in knobs.table():
        row = rows[k["name"]]
        assert (row["type"], row["default"], row["doc"]) == (k["type"], k["default"], k["doc"])
    assert rows["LOONGFORGE_MEM_SEGMENT_MB"]["current"] == "64"
    assert rows["LOONGFORGE_MEM_SEGMENT_MB"]["valid"] is True


def test_info_env_names_an_invalid_value():
    env = dict(os.environ, LOONGFORGE_MEM_LIMIT_MB="12x")
    r = subprocess.run([_cli(), "info", "--env"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "LOONGFORGE_MEM_LIMIT_MB='12x': not an integer" in r.stdout, r.stdout


def test_docs_list_the_table():
    with open(os.path.join(REPO, "docs", "knobs.md"), encoding="utf-8") as f:
        doc = f.read()
    m = re.search(r"<!-- knobs:begin[^>]*-->\n(.*?)<!-- knobs:end -->", doc, re.S)
    assert m, "docs/knobs.md has no knobs:begin/knobs:end block"
    assert m.group(1) == knobs.markdown(), (
        "docs/knobs.md's table differs from the declared knobs: replace it with the output of "
        "`python -m loongforge.knobs`")
    for name in knobs.names():
        assert f"| `{name}` |" in doc, name
    with open(os.path.join(REPO, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        assert "(knobs.md)" in f.read()


def test_bad_integer_names_the_variable(monkeypatch):
    monkeypatch.setenv("LOONGFORGE_MEM_RECORD_STEPS", "3x")
    with pytest.raises(ValueError, match=r"LOONGFORGE_MEM_RECORD_STEPS='3x': not an integer"):
        knobs.get("LOONGFORGE_MEM_RECORD_STEPS")
    monkeypatch.setenv("LOONGFORGE_MEM_RECORD_STEPS", "-2")
    with pytest.raises(ValueError, match=r"LOONGFORGE_MEM_RECORD_STEPS='-2': must be >= 0"):
        knobs.get("LOONGFORGE_MEM_RECORD_STEPS")
    monkeypatch.setenv("LOONGFORGE_MEM_RECORD_STEPS", "5")
    assert knobs.get("LOONGFORGE_MEM_RECORD_STEPS") == 5


def test_values_have_their_declared_types(monkeypatch):
    for k in knobs.table():
        monkeypatch.delenv(k["name"], raising=False)
        v = knobs.get(k["name"])
        assert type(v).__name__ == {"int": "int", "float": "float", "bool": "bool",
                                    "string": "str"}[k["type"]], (k["name"], v)
    monkeypatch.setenv("LOONGFORGE_FP8_FUSED", "off")
    assert knobs.get("LOONGFORGE_FP8_FUSED") is False
    monkeypatch.setenv("LOONGFORGE_FP8_FUSED", "maybe")
    with pytest.raises(ValueError, match="LOONGFORGE_FP8_FUSED='maybe'"):
        knobs.get("LOONGFORGE_FP8_FUSED")
    monkeypatch.setenv("LOONGFORGE_SIGNAL_GRACE_S", "")  # empty: the default
    assert knobs.get("LOONGFORGE_SIGNAL_GRACE_S") == 60.0
    monkeypatch.setenv("LOONGFORGE_GROUPED_MM", "sometimes")
    with pytest.raises(ValueError, match="LOONGFORGE_GROUPED_MM='sometimes': not one of auto"):
        knobs.get("LOONGFORGE_GROUPED_MM")


def test_undeclared_name_is_a_key_error():
    with pytest.raises(KeyError, match="LOONGFORGE_NOT_A_KNOB"):
        knobs.get("LOONGFORGE_NOT_A_KNOB")


def test_trainer_refuses_a_bad_knob_with_its_name(monkeypatch):
    from loongforge.train import StopSignal, TrainError
    from loongforge.trainer.dist import Dist
    monkeypatch.setenv("LOONGFORGE_SIGNAL_GRACE_S", "soon")
    with pytest.raises(TrainError, match="LOONGFORGE_SIGNAL_GRACE_S='soon': not a finite number"):
        StopSignal(Dist(), 0, "baseline")
    monkeypatch.setenv("LOONGFORGE_SIGNAL_GRACE_S", "0")
    with pytest.raises(TrainError, match="LOONGFORGE_SIGNAL_GRACE_S must be a positive number"):
        StopSignal(Dist(), 0, "baseline")
    monkeypatch.setenv("LOONGFORGE_SIGNAL_GRACE_S", "2.5")
    assert StopSignal(Dist(), 0, "baseline").grace_s == 2.5


# The trainer's knobs read inside a run end it with one line naming the variable (exit 2), as a
# bad flag does, not with a traceback.
def test_trainer_bad_knob_is_a_one_line_error(train_db, monkeypatch, capsys):
    sys.path.insert(0, os.path.dirname(__file__))
    from lf_testdb import TINY_TRAIN_ARGS
    from loongforge import train
    args = list(TINY_TRAIN_ARGS) + ["--data", train_db, "--mode", "baseline", "--steps", "1"]
    monkeypatch.setenv("LOONGFORGE_MEM_RECORD_STEPS", "3x")
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert "LOONGFORGE_MEM_RECORD_STEPS='3x': not an integer" in err and "Traceback" not in err
    monkeypatch.delenv("LOONGFORGE_MEM_RECORD_STEPS")
    monkeypatch.setenv("LOONGFORGE_DEBUG", "maybe")
    assert train.main(args) == 2
    assert "LOONGFORGE_DEBUG='maybe': not a boolean" in capsys.readouterr().err


# MemSculptor's torch allocator refuses a bad knob at its device's initialization, with the
# variable named, instead of running under a cap nobody asked for. A fresh process: the allocator
# initializes each device once.
def test_allocator_refuses_a_bad_knob():
    from loongforge import _C
    if not hasattr(_C, "torch_allocator"):
        pytest.skip("a build without CUDA has no torch allocator")
    code = ("from loongforge import _C\n"
            "try:\n"
            "    _C.torch_allocator.begin_step(0, 'probe')\n"
            "except (RuntimeError, ValueError) as e:\n"
            "    print('refused:', e)\n")
    env = dict(os.environ, LOONGFORGE_MEM_LIMIT_MB="12x",
               PYTHONPATH=os.path.join(REPO, "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused: ") and \
        "LOONGFORGE_MEM_LIMIT_MB='12x': not an integer" in r.stdout, r.stdout


# bin/loongforge is a shell script and reads its two knobs itself: its default interpreter is the
# declared one.
def test_launcher_default_is_the_declared_one():
    with open(os.path.join(REPO, "bin", "loongforge"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"\$\{LOONGFORGE_PYTHON:-([^}]*)\}", text)
    assert m, "bin/loongforge no longer reads LOONGFORGE_PYTHON"
    declared = {k["name"]: k["default"] for k in knobs.table()}
    assert m.group(1) == declared["LOONGFORGE_PYTHON"]
    assert re.search(r"\$\{LOONGFORGE_BUILD:-\$root/build\}", text)
    assert declared["LOONGFORGE_BUILD"] == ""  # empty: <repo>/build, as the script says


# Guards: --memory-cap-gib reaches MemSculptor as a parameter (MemSculptorSession -> MemSculptor ->
# the torch allocator's set_limit_mb), not through the environment: the real allocator takes a
# cap before the device's first use and refuses one out of range naming it, and nothing in the
# trainer or MemSculptor writes os.environ.
def test_memory_cap_is_a_parameter_not_an_environment_variable(monkeypatch):
    from loongforge import memory

    session = memory.MemSculptorSession(True, True, limit_mb=1536)
    assert session.limit_mb == 1536 and memory.MemSculptor(0, limit_mb=1536).limit_mb == 1536
    from loongforge import _C
    if not hasattr(_C, "torch_allocator"):
        pytest.skip("a build without CUDA has no torch allocator")
    memory.apply_limit(3, 1536)  # device 3: never used by this process
    memory.apply_limit(3, None)  # no cap given: nothing to set
    with pytest.raises(ValueError, match="memory cap -5 MiB is out of range"):
        memory.apply_limit(3, -5)
    with pytest.raises(ValueError, match="device index 99 out of range"):
        memory.apply_limit(99, 10)
    with open(memory.__file__, encoding="utf-8") as f:
        assert "os.environ[" not in f.read()
    trainer = os.path.join(REPO, "python", "loongforge", "trainer")
    for name in (n for n in os.listdir(trainer) if n.endswith(".py")):
        with open(os.path.join(trainer, name), encoding="utf-8") as f:
            assert "os.environ[" not in f.read(), name
