#!/usr/bin/env python3
"""Packs a LeRobot v2.1 dataset for the training row of issue 19 (bench/e2e/lerobot_row.sh):
--episodes episodes of --frames rows, 2 cameras of 640x480 AV1 at 30 fps (lerobot_speed.py's
make_dataset: mini_parquet tables, Debian's ffmpeg with libsvtav1), then
`loongforge pack --from-lerobot` at its defaults (frames stored as JPEG, shortest edge 256).

Run where FFmpeg is (the CPU machine); the packed DB is what travels to the GPU machine, whose
demo dataset of the same shape (`demo-data --size 341x256`) is the comparison. Prints the DB path,
its rows and frame size.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lerobot_speed import REPO, make_dataset  # noqa: E402  (a sibling file, not a package)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.path.join(REPO, "build", "loongforge"))
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--out", required=True, help="the packed DB (replaced if it exists)")
    a = ap.parse_args()
    src = tempfile.mkdtemp(prefix="lf_lerobot_src_")
    try:
        rows, cams = make_dataset(src, 640, 480, a.episodes, a.frames)
        subprocess.run([a.cli, "pack", "--from-lerobot", src, "--out", a.out, "--overwrite"],
                       check=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    mb = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out)) / 2**20
    print(f"{a.out}: {rows} rows x {cams} cameras from {a.episodes} episodes, {mb:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
