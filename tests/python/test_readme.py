"""README.md's commands run as written: every ```sh/```bash/```console block, in order, like a user
pasting them into one terminal (the working directory and exported variables carry from one block
to the next), each exiting 0; and the "Reading the output" sample is what the trainer prints.

A block that cannot run here carries `<!-- readme-test: skip, REASON -->` on the line before it."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
COMMAND_LANGS = ("sh", "bash", "console")
SKIP_RE = re.compile(r"^<!--\s*readme-test:\s*skip\b(.*?)-->\s*$")
# Both spellings of a number the trainer prints: 2398, 0.00e+00, 2115.1, 1,234.
NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*(?:e[+-]?\d+)?")


class ReadmeError(Exception):
    pass


def parse_blocks(text: str, name: str = "README.md"):
    """Every fenced block as dict(lang, start line, body, skip reason or None).

    Raises ReadmeError for a skip marker with no reason, one not directly before a command block,
    and an unclosed fence: the test must not pass because a marker went astray."""
    lines = text.splitlines()
    blocks, i, pending = [], 0, None
    while i < len(lines):
        line = lines[i]
        m = SKIP_RE.match(line.strip())
        if m:
            reason = m.group(1).strip().lstrip(",").strip()
            if not reason:
                raise ReadmeError(f"{name}:{i + 1}: readme-test skip marker gives no reason")
            pending = (i + 1, reason)
            i += 1
            continue
        if line.startswith("```"):
            lang = line[3:].strip().lower()
            start = i + 1
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise ReadmeError(f"{name}:{start}: fence opened here is never closed")
            skip = None
            if pending is not None:
                if lang not in COMMAND_LANGS:
                    raise ReadmeError(f"{name}:{pending[0]}: skip marker is not before a command "
                                      f"block (the next block, line {start}, is '{lang}')")
                skip = pending[1]
                pending = None
            blocks.append(dict(lang=lang, line=start, body="\n".join(lines[i + 1:j]), skip=skip))
            i = j + 1
            continue
        if pending is not None and line.strip():
            raise ReadmeError(f"{name}:{pending[0]}: skip marker is not directly before a block")
        i += 1
    if pending is not None:
        raise ReadmeError(f"{name}:{pending[0]}: skip marker at the end, before no block")
    return blocks


def command_blocks(blocks):
    return [b for b in blocks if b["lang"] in COMMAND_LANGS]


def script_of(block) -> str:
    """The shell text of a block; a console block keeps its `$ ` lines, without the prompt."""
    if block["lang"] == "console":
        return "\n".join(x[2:] for x in block["body"].splitlines() if x.startswith("$ "))
    return block["body"]


# The start-up line lists the phases that took at least 0.05 s: which ones do depends on the
# machine's timing, not on the format, so they compare as one placeholder.
STARTUP_PHASES_RE = re.compile(r"(before the first step)( \(.*\))?$")


def normalize(line: str) -> str:
    line = STARTUP_PHASES_RE.sub(r"\1 (PHASES)", line.rstrip())
    return " ".join(NUMBER_RE.sub("N", line).split())


def _read():
    with open(README, encoding="utf-8") as f:
        return f.read()


# Guards the marker rules themselves: a reasonless or stray marker is an error, so a block cannot
# drop out of the run unnoticed.
def test_parser_rejects_bad_markers():
    ok = "x\n<!-- readme-test: skip, needs a GPU -->\n```sh\nnvidia-smi\n```\n```sh\nls\n```\n"
    b = parse_blocks(ok)
    assert [(x["skip"], x["body"]) for x in b] == [("needs a GPU", "nvidia-smi"), (None, "ls")]
    with pytest.raises(ReadmeError, match="gives no reason"):
        parse_blocks("<!-- readme-test: skip -->\n```sh\nls\n```\n")
    with pytest.raises(ReadmeError, match="not directly before"):
        parse_blocks("<!-- readme-test: skip, why -->\ntext\n```sh\nls\n```\n")
    with pytest.raises(ReadmeError, match="not before a command block"):
        parse_blocks("<!-- readme-test: skip, why -->\n```python\nx = 1\n```\n")
    with pytest.raises(ReadmeError, match="never closed"):
        parse_blocks("```sh\nls\n")
    assert script_of(dict(lang="console", body="$ ls -l\ntotal 0")) == "ls -l"


# Guards the README's coverage: every skip names its reason, and most command blocks run.
def test_skips_have_reasons_and_most_blocks_run():
    cmds = command_blocks(parse_blocks(_read()))
    run = [b for b in cmds if b["skip"] is None]
    assert cmds, "README.md has no command blocks"
    assert len(run) * 2 > len(cmds), (
        f"only {len(run)} of {len(cmds)} README command blocks run; skipped: "
        + "; ".join(f"line {b['line']}: {b['skip']}" for b in cmds if b["skip"]))


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for build in (os.environ.get("LOONGFORGE_BUILD"), os.path.join(REPO, "build")):
        if build and os.access(os.path.join(build, "loongforge"), os.X_OK):
            env["LOONGFORGE_BUILD"] = os.path.abspath(build)
            break
    else:
        pytest.skip("no built loongforge CLI")
    env["LOONGFORGE_PYTHON"] = sys.executable
    env["PATH"] = os.path.join(REPO, "bin") + os.pathsep + env.get("PATH", "")
    # `cd "$(mktemp -d)"` in the README lands in the test's folder, and so does every file the
    # commands write.
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    return env


# Each block runs in a fresh bash that starts where the previous one ended: its folder and its
# variables (REPO=$PWD as well as PATH; `set -a` exports every assignment) are saved on exit and
# restored at the start of the next.
_WRAP = """set -aeo pipefail
cd "$LF_README_CWD"
. "$LF_README_ENV"
trap 'rc=$?; pwd > "$LF_README_CWD_FILE"; export -p | grep -vE '"'"'^declare -x (PWD|OLDPWD|SHLVL|_|LF_README_[A-Z_]+)='"'"' > "$LF_README_ENV"; exit $rc' EXIT
"""


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    env = _env(tmp)
    state_env, cwd_file = tmp / "state.env", tmp / "state.cwd"
    state_env.write_text("")
    cwd = REPO  # the README's first commands run "in the repository root"
    runs = []
    for b in command_blocks(parse_blocks(_read())):
        if b["skip"] is not None:
            continue
        e = dict(env, LF_README_CWD=cwd, LF_README_ENV=str(state_env),
                 LF_README_CWD_FILE=str(cwd_file))
        r = subprocess.run(["bash", "-c", _WRAP + script_of(b)], env=e, capture_output=True,
                           text=True, timeout=1200)
        cwd = cwd_file.read_text().strip() if cwd_file.exists() else cwd
        runs.append(dict(block=b, rc=r.returncode, out=r.stdout, err=r.stderr, cwd=cwd))
        if r.returncode != 0:
            break
    return dict(tmp=str(tmp), runs=runs)


# Guards "the README's lines run as written": each command block exits 0, in order, and writes
# only under the temporary folder (never into the checkout).
def test_every_command_block_exits_0(readme_runs):
    runs = readme_runs["runs"]
    assert runs
    for r in runs:
        b = r["block"]
        assert r["rc"] == 0, (f"README.md block at line {b['line']} exited {r['rc']}:\n"
                              f"{b['body']}\n--- stdout\n{r['out'][-3000:]}\n--- stderr\n"
                              f"{r['err'][-3000:]}")
        assert r["cwd"].startswith(readme_runs["tmp"] + os.sep), (
            f"README.md block at line {b['line']} ended in {r['cwd']}, outside the temp folder")
    want = [b for b in command_blocks(parse_blocks(_read())) if b["skip"] is None]
    assert len(runs) == len(want)


# Guards "Reading the output": the sample lines have the fields, labels and units the trainer
# prints today for the README's own run (numbers aside).
def test_reading_the_output_sample_matches(readme_runs):
    text = _read()
    sec = text.split("## Reading the output", 1)
    assert len(sec) == 2, "README.md has no 'Reading the output' section"
    sample = next(b for b in parse_blocks(sec[1]) if b["lang"] == "")
    printed = set()
    for r in readme_runs["runs"]:
        # The per-step lines go to stderr, the summary to stdout.
        printed.update(normalize(x) for x in (r["out"] + r["err"]).splitlines() if x.strip())
    missing = [x for x in sample["body"].splitlines() if x.strip() and normalize(x) not in printed]
    assert not missing, ("README.md 'Reading the output' lines the trainer no longer prints: "
                         f"{missing}\nprinted (normalized): {sorted(printed)}")


# Guards the multi-process spelling: the README's several-process command is one the test runs
# on Debian's torch 1.13 (torch.distributed.run's `--nproc-per-node` is torch 2.x only, and
# Debian's torchrun fails on Python 3.11), so it is a `loongforge launch` line in a run block.
def test_several_processes_line_is_run():
    run = [b for b in command_blocks(parse_blocks(_read())) if b["skip"] is None]
    assert any(re.search(r"^loongforge launch --nproc [2-9]", script_of(b), re.M) for b in run), (
        "README.md has no run (unskipped) command block with `loongforge launch --nproc N`")
