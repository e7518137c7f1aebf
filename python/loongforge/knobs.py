"""The LOONGFORGE_* environment knobs, as the C++ core declares them (src/common/env_knobs.cc).

The table lives in C++ only and is read here through ``loongforge._C``, so a knob has one
declaration whichever language reads it, and Python parses values with the core's own rules::

    from loongforge import knobs
    knobs.get("LOONGFORGE_SIGNAL_GRACE_S")   # 60.0 unless set; ValueError naming it when bad
    knobs.table()                            # [{"name", "type", "default", "doc", ...}, ...]

``python -m loongforge.knobs`` prints the table as the Markdown of docs/knobs.md.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List

from . import _C

__all__ = ["get", "table", "names", "markdown"]


def get(name: str) -> Any:
    """The knob's value as its declared type (int, float, bool or str): the default when the
    variable is unset or empty. ValueError, naming the variable and the value, when the value does
    not parse or lies outside the knob's range or choices; KeyError for an undeclared name."""
    return _C.env_knob(name)


def table() -> List[Dict[str, Any]]:
    """Every declared knob, in declaration order: name, type, default, doc, reader (who reads it:
    core, python, bin/loongforge), min/max (int), choices (string, when restricted), and current
    (the variable's text, None when unset or empty)."""
    return [dict(k) for k in _C.env_knobs()]


def names() -> List[str]:
    return [k["name"] for k in table()]


def markdown() -> str:
    """The table as docs/knobs.md lists it (tests/python/test_knobs.py checks that file)."""
    rows = ["| Variable | Type | Default | Read by | What it does |",
            "|---|---|---|---|---|"]
    for k in table():
        kind = k["type"]
        if "choices" in k:
            kind += ": " + k["choices"].replace("|", ", ")
        default = f"`{k['default']}`" if k["default"] else "(empty)"
        doc = k["doc"].replace("<", "&lt;").replace(">", "&gt;")
        rows.append(f"| `{k['name']}` | {kind} | {default} | {k['reader']} | {doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
