#!/usr/bin/env bash
# Writes the fixture videos of the LeRobot test datasets with Debian's ffmpeg CLI (libsvtav1,
# libx264). Run from anywhere: bash tests/data/lerobot/make_videos.sh [FIXTURE_DIR ...]
#
# Every frame encodes which frame it is, robust to lossy compression: the picture is two rows
# (top and bottom half) of eight blocks (1/8 of the width each), each black (Y=16) or white
# (Y=235).
#   top row:    bits 0..7 of the frame's position in its video file (v2.1: frame_index;
#               v3.0: the position in the concatenated file = the row's dataset index)
#   bottom row: bits 0..7 of the episode_index
# Tests decode a frame's code from the block centres (threshold 128) and compare it with the row.
#
# The layout comes from each fixture's meta/info.json when present (fps; every feature of dtype
# "video", its size and codec from info/video_info; v2.1 lengths from meta/episodes.jsonl).
# Without info.json the defaults below are used; make_fixtures.py writes metadata that matches
# them: 128x96 at 30 fps; episodes 0, 1, 2 of 12, 16 and 20 frames (v3.0: one file per camera,
# episodes back to back); observation.images.front: AV1 (libsvtav1, GOP 2, yuv420p).
# observation.images.wrist is always H.264 (libx264, GOP 8, B-frames), so both codecs are covered;
# hevc/file-000.mp4 (HEVC, libx265) is the v3.0 wrist video re-encoded (end of this script).
set -euo pipefail
export SVT_LOG=1  # SVT-AV1: errors only
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
W=128
H=96
default_lengths="12 16 20"
default_fps=30
default_cams="observation.images.front:av1 observation.images.wrist:h264"

# "key:codec ..." from info.json, or the defaults.
cameras() {
  local info="$1/meta/info.json"
  if [ -f "$info" ]; then
    "$py" - "$info" <<'PYEOF'
import json, sys
info = json.load(open(sys.argv[1]))
for k, f in info["features"].items():
    if f.get("dtype") != "video":
        continue
    vi = f.get("info") or f.get("video_info") or {}
    codec = "h264" if k == "observation.images.wrist" else vi.get("video.codec", "av1")
    print(f"{k}:{codec}:{vi['video.width']}:{vi['video.height']}")
PYEOF
  else
    for c in $default_cams; do echo "$c:$W:$H"; done
  fi
}
fps_of() {
  local info="$1/meta/info.json"
  if [ -f "$info" ]; then "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["fps"])' "$info"
  else echo $default_fps; fi
}
lengths_of() {
  local eps="$1/meta/episodes.jsonl"
  if [ -f "$eps" ]; then
    "$py" -c 'import json,sys; print(" ".join(str(json.loads(l)["length"]) for l in open(sys.argv[1]) if l.strip()))' "$eps"
  else echo $default_lengths; fi
}

# bit b of expression E as a luma level
bits_expr() {  # $1: expression of the value, for block floor(8*X/W)
  echo "if(mod(floor(($1)/pow(2,floor(8*X/W))),2),235,16)"
}

# encode OUT CODEC:WIDTH:HEIGHT FPS NFRAMES EPISODE_EXPR
encode() {
  local out="$1" spec="$2" fps="$3" n="$4" ep="$5"
  local codec="${spec%%:*}" rest="${spec#*:}"
  local w="${rest%%:*}" h="${rest##*:}"
  local lum="if(lt(Y,H/2),$(bits_expr N),$(bits_expr "$ep"))"
  local enc
  case "$codec" in
    av1) enc=(-c:v libsvtav1 -g 2 -preset 8 -crf 30) ;;
    h264) enc=(-c:v libx264 -g 8 -bf 2 -crf 18) ;;
    hevc) enc=(-c:v libx265 -g 8 -crf 18 -x265-params log-level=error) ;;
    *) echo "unknown codec $codec" >&2; exit 1 ;;
  esac
  mkdir -p "$(dirname "$out")"
  ffmpeg -nostdin -v error -y -f lavfi -i "color=c=black:s=${w}x${h}:r=${fps}" -frames:v "$n" \
    -vf "format=yuv420p,geq=lum='${lum}':cb=128:cr=128" "${enc[@]}" -pix_fmt yuv420p \
    -an -map_metadata -1 -fflags +bitexact "$out"
  echo "wrote $out ($codec, $n frames)"
}

make_v21() {
  local dir="$1" fps lengths
  fps=$(fps_of "$dir"); lengths=($(lengths_of "$dir"))
  for cc in $(cameras "$dir"); do
    local key="${cc%%:*}" spec="${cc#*:}"
    for e in "${!lengths[@]}"; do
      encode "$dir/videos/chunk-000/$key/$(printf 'episode_%06d.mp4' "$e")" "$spec" "$fps" \
        "${lengths[$e]}" "$e"
    done
  done
}

make_v30() {
  local dir="$1" fps lengths
  fps=$(fps_of "$dir"); lengths=($default_lengths)
  if [ -f "$dir/meta/lengths.txt" ]; then lengths=($(cat "$dir/meta/lengths.txt")); fi
  # Episode of file position N: nested ifs over the cumulative lengths.
  local expr="" close="" start=0 total=0
  for e in "${!lengths[@]}"; do total=$((total + lengths[e])); done
  for e in "${!lengths[@]}"; do
    start=$((start + lengths[e]))
    if [ "$e" -lt $((${#lengths[@]} - 1)) ]; then expr+="if(lt(N,$start),$e,"; close+=")"; else expr+="$e"; fi
  done
  expr+="$close"
  for cc in $(cameras "$dir"); do
    local key="${cc%%:*}" spec="${cc#*:}"
    encode "$dir/videos/$key/chunk-000/file-000.mp4" "$spec" "$fps" "$total" "$expr"
  done
}

dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=("$here/v2.1" "$here/v3.0")
for d in "${dirs[@]}"; do
  case "$(basename "$d")" in
    v2*) make_v21 "$d" ;;
    v3*) make_v30 "$d" ;;
    *) echo "$d: name must start with v2 or v3" >&2; exit 2 ;;
  esac
done

# HEVC (libx265, GOP 8, B-frames): the v3.0 wrist video re-encoded, for the reader's HEVC test
# (the block codes survive a second lossy encode).
if [ $# -eq 0 ]; then
  mkdir -p "$here/hevc"
  ffmpeg -nostdin -v error -y -i "$here/v3.0/videos/observation.images.wrist/chunk-000/file-000.mp4" \
    -c:v libx265 -pix_fmt yuv420p -x265-params log-level=error:keyint=8:bframes=3 -tag:v hvc1 \
    "$here/hevc/file-000.mp4"
fi
