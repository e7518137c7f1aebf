#!/usr/bin/env python3
"""Decode speed of `loongforge pack --from-lerobot` on 640x480 AV1 at 30 fps (issue 19 target:
at least 400 frames/s on 2 cores, one pass over each video). Method: docs/bench_pack.md.

Builds a LeRobot v2.1 dataset in a scratch folder, in one of two modes:
  long (default): --episodes episodes of --frames rows each (4 x 300), the fixture's meta/info.json
         features and tasks, parquet tables written by mini_parquet.py (no pyarrow needed);
  --fixture: the committed fixture (tests/data/lerobot/v2.1) as it is, meta and parquet (3 short
         episodes of 12-20 rows, 96 frames over 2 cameras).
Either way every episode and camera gets a new 640x480 AV1 video (Debian's ffmpeg, libsvtav1,
yuv420p, GOP 2 as LeRobot's encoder default, 30 fps) with exactly as many frames as the episode
has rows, and info.json is rewritten to say 640x480 AV1. Then it times, best of --runs:
  pack   `loongforge pack --from-lerobot` end to end (decode, resize to shortest edge 256, JPEG,
         LMDB write and fsync): frames/s = rows x cameras / wall seconds; also the process's CPU
         seconds (user + sys) and frames x threads / CPU seconds, the rate it would reach with
         `threads` cores to itself kept busy (an upper bound, for a contended machine where the
         wall figure measures the neighbours too);
  dav1d  the same videos decoded by ffmpeg's own libdav1d with one thread and no output, as the
         library's reference rate;
  long   a 10 s (300 frame) 640x480 AV1 video decoded by ffmpeg's libdav1d, one thread, one
         pass: the rate a long episode reaches once per-file setup is spread out.
Prints one JSON object (and writes it to --json).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(REPO, "tests", "data", "lerobot", "v2.1")


def encode(out: str, frames: int, width: int, height: int, fps: int) -> None:
    """An AV1 video as LeRobot encodes it (libsvtav1, yuv420p, GOP 2), moving test pattern."""
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                    f"testsrc2=size={width}x{height}:rate={fps}", "-frames:v", str(frames),
                    "-c:v", "libsvtav1", "-pix_fmt", "yuv420p", "-g", "2", "-crf", "30",
                    "-preset", "12", out], check=True, capture_output=True)


def write_long_tables(root: str, info: dict, episodes: int, frames: int) -> None:
    """meta/episodes.jsonl and one parquet table per episode of `frames` rows (mini_parquet), the
    fixture's tasks alternating; `info` gets the new totals."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mini_parquet  # noqa: E402  (a sibling file, not a package)

    with open(os.path.join(root, "meta", "tasks.jsonl")) as fh:
        tasks = [json.loads(line) for line in fh if line.strip()]
    os.remove(os.path.join(root, "meta", "episodes_stats.jsonl"))
    sdim = info["features"]["observation.state"]["shape"][0]
    adim = info["features"]["action"]["shape"][0]
    with open(os.path.join(root, "meta", "episodes.jsonl"), "w") as eh:
        for e in range(episodes):
            task = tasks[e % len(tasks)]
            d = os.path.join(root, "data", f"chunk-{e // info['chunks_size']:03d}")
            os.makedirs(d, exist_ok=True)
            state = [[math.sin(0.05 * k + j) for j in range(sdim)] for k in range(frames)]
            action = [[math.cos(0.05 * k + j) for j in range(adim)] for k in range(frames)]
            mini_parquet.lerobot_episode(os.path.join(d, f"episode_{e:06d}.parquet"), e,
                                         e * frames, task["task_index"], state, action,
                                         float(info["fps"]))
            eh.write(json.dumps({"episode_index": e, "tasks": [task["task"]],
                                 "length": frames}) + "\n")
    cams = sum(1 for f in info["features"].values() if f["dtype"] == "video")
    info.update({"total_episodes": episodes, "total_frames": episodes * frames,
                 "total_videos": episodes * cams, "total_chunks": 1 + (episodes - 1)
                 // info["chunks_size"], "splits": {"train": f"0:{episodes}"}})


def make_dataset(root: str, width: int, height: int, episodes: int = 0, frames: int = 0) -> tuple:
    """A v2.1 dataset with new width x height AV1 videos: (rows, cameras). episodes > 0: that
    many episodes of `frames` rows (mini_parquet tables); 0: the fixture's meta and parquet."""
    shutil.copytree(os.path.join(FIXTURE, "meta"), os.path.join(root, "meta"))
    info_path = os.path.join(root, "meta", "info.json")
    with open(info_path) as fh:
        info = json.load(fh)
    if episodes > 0:
        write_long_tables(root, info, episodes, frames)
    else:
        shutil.copytree(os.path.join(FIXTURE, "data"), os.path.join(root, "data"))
    cams = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    for k in cams:
        f = info["features"][k]
        names = f.get("names") or []
        f["shape"] = ([3, height, width] if names and names[0] == "channels"
                      else [height, width, 3])
        vi = f.setdefault("info", {})
        vi.update({"video.height": height, "video.width": width, "video.codec": "av1",
                   "video.pix_fmt": "yuv420p", "video.fps": info["fps"]})
    with open(info_path, "w") as fh:
        json.dump(info, fh, indent=4)
    rows = 0
    with open(os.path.join(root, "meta", "episodes.jsonl")) as fh:
        episodes = [json.loads(line) for line in fh if line.strip()]
    for ep in episodes:
        e, n = ep["episode_index"], ep["length"]
        rows += n
        for k in cams:
            d = os.path.join(root, "videos", f"chunk-{e // info['chunks_size']:03d}", k)
            os.makedirs(d, exist_ok=True)
            encode(os.path.join(d, f"episode_{e:06d}.mp4"), n, width, height, int(info["fps"]))
    return rows, len(cams)


def dav1d_seconds(paths: list) -> float:
    """Wall seconds for ffmpeg's libdav1d (one thread) to decode `paths`, no output."""
    t = time.perf_counter()
    for p in paths:
        subprocess.run(["ffmpeg", "-v", "error", "-threads", "1", "-c:v", "libdav1d",
                        "-i", p, "-f", "null", "-"], check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.path.join(REPO, "build", "loongforge"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--episodes", type=int, default=4, help="episodes (long mode)")
    ap.add_argument("--frames", type=int, default=300, help="rows per episode (long mode)")
    ap.add_argument("--fixture", action="store_true",
                    help="the committed fixture's 3 short episodes instead (the old mode)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lf_lerobot_speed_")
    try:
        src = os.path.join(work, "src")
        rows, cams = make_dataset(src, args.width, args.height,
                                  0 if args.fixture else args.episodes, args.frames)
        videos = [os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(src, "videos"))
                  for f in fs]
        load_before = os.getloadavg()
        pack_s, pack_cpu_s = [], []
        for r in range(args.runs):
            out = os.path.join(work, f"db{r}")
            t = time.perf_counter()
            ru = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([args.cli, "pack", "--from-lerobot", src, "--out", out,
                            "--threads", str(args.threads), "--quiet"], check=True,
                           stdout=subprocess.DEVNULL)
            pack_s.append(time.perf_counter() - t)
            ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
            pack_cpu_s.append(ru2.ru_utime - ru.ru_utime + ru2.ru_stime - ru.ru_stime)
            shutil.rmtree(out)
        dav1d_s = min(dav1d_seconds(videos) for _ in range(args.runs))
        long_mp4 = os.path.join(work, "long.mp4")
        encode(long_mp4, 300, args.width, args.height, 30)
        long_s = min(dav1d_seconds([long_mp4]) for _ in range(args.runs))
        frames = rows * cams
        res = {
            "video": f"{args.width}x{args.height} AV1 (libsvtav1, GOP 2, yuv420p) 30 fps",
            "mode": "fixture" if args.fixture else f"{args.episodes} x {args.frames} rows",
            "episodes_rows": rows, "cameras": cams, "frames": frames, "threads": args.threads,
            "pack_best_s": round(min(pack_s), 4),
            "pack_runs_s": [round(x, 4) for x in pack_s],
            "pack_cpu_s": [round(x, 3) for x in pack_cpu_s],
            "pack_cpu_ms_per_frame": round(1000 * min(pack_cpu_s) / frames, 3),
            "pack_frames_per_s_if_cores_free": round(
                frames * args.threads / min(pack_cpu_s), 1),
            "load_avg_1_5_15_before": [round(x, 2) for x in load_before],
            "load_avg_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
            "pack_frames_per_s": round(frames / min(pack_s), 1),
            "dav1d_1thread_frames_per_s": round(frames / dav1d_s, 1),
            "dav1d_1thread_long_300_frames_per_s": round(300 / long_s, 1),
            "target_frames_per_s": 400,
        }
        res["target_met"] = res["pack_frames_per_s"] >= 400
        print(json.dumps(res, indent=2))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(res, fh, indent=2)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
