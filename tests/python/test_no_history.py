"""Comments, docstrings and test comments give reasons and measured facts, not history: no
reference to a tracker issue, a numbered defect or a benchmark run's letter (a reader of the
code has neither the tracker nor the run log at hand, and the reason outlives both)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATHS = ["src", "include", "python", "apps", "tests"]
# A tracker issue or a numbered defect by its number; a benchmark run by its letter (and digit).
PATTERN = r"issue [0-9]+|defects? [0-9]+|run [A-Z][0-9]?\b"


def _git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--is-inside-work-tree"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "true"


def history_hits() -> list:
    r = subprocess.run(["git", "-C", ROOT, "grep", "-nE", PATTERN, "--"] + PATHS,
                       capture_output=True, text=True)
    # git grep: 0 when something matched, 1 when nothing did, anything else is an error.
    assert r.returncode in (0, 1), r.stderr
    return [line for line in r.stdout.splitlines() if line]


@pytest.mark.skipif(not _git_checkout(), reason="not a git checkout")
def test_no_issue_defect_or_run_references():
    hits = history_hits()
    assert not hits, ("comments name history instead of the reason (state the reason or the "
                      "measured fact):\n" + "\n".join(hits))


@pytest.mark.skipif(not _git_checkout(), reason="not a git checkout")
def test_the_pattern_finds_what_it_forbids():
    import re
    pat = re.compile(PATTERN)
    # Spelled in pieces, so this file does not match its own pattern.
    for text in ["Guards issue" + " 16 here", "(issue" + " 21, defect" + " 8)",
                 "defects" + " 7 and 8", "(run" + " J4: 90 of", "see run" + " K, batch 72"]:
        assert pat.search(text), text
    for text in ["an H200 measured it", "the run's peak", "run 8 steps", "a failed run"]:
        assert not pat.search(text), text
