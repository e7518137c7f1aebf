"""docs/adopting.md's Python runs as written: every ```python block, in order, in one interpreter
and one namespace (like a user pasting them into one session), in an empty working directory."""
from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_readme import parse_blocks  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "adopting.md")

RUNNER = """
import sys
namespace = {{"__name__": "__main__"}}
for line, code in {blocks!r}:
    print(f"--- docs/adopting.md:{{line}}", flush=True)
    exec(compile(code, f"docs/adopting.md:{{line}}", "exec"), namespace)
print("--- all blocks ran", flush=True)
"""


def python_blocks():
    with open(DOC) as f:
        return [b for b in parse_blocks(f.read(), "docs/adopting.md") if b["lang"] == "python"]


def test_every_python_block_runs(tmp_path):
    blocks = python_blocks()
    # The worked example: model, data, plain loop, Forge loop, resume, packed DB.
    assert len(blocks) >= 6, [b["line"] for b in blocks]
    script = tmp_path / "run_doc.py"
    script.write_text(RUNNER.format(blocks=[(b["line"], b["body"]) for b in blocks]))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "--- all blocks ran" in r.stdout
    # What the blocks leave behind: the plain loop's file and the two Forge vaults.
    assert (work / "plain_checkpoint.pt").exists()
    assert (work / "ckpt" / "vault").is_dir() and (work / "ckpt_db" / "vault").is_dir()
