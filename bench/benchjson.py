"""Result files of the bench scripts: JSON written whole or not at all (a temporary file in the
same folder, fsync'd, then renamed over the name), so a script cut off by a timeout or a kill
leaves the previous result or none, never a truncated one that a table is later built from."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write(path: str, obj: Any, indent: int = 1) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=indent)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
