#!/usr/bin/env bash
# Regenerates the seed corpus of every fuzz target (fuzz/corpus/<target>/) from the repository's
# own generators and fixtures: `loongforge demo-data` + `loongforge pack` (JPEG frames, the packed
# data.mdb, its __schema__ and token records), tests/data/lerobot (Parquet files, LeRobot
# metadata) and hand-written checkpoint manifest bodies in the format SerializeManifest writes.
# Usage: tools/make_fuzz_corpus.sh [BUILD_DIR]   (BUILD_DIR holds a normal build's `loongforge`)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${LOONGFORGE_BUILD:-build}}
LF=$BUILD/loongforge
PY=${PY:-/usr/bin/python3}
[ -x "$LF" ] || { echo "make_fuzz_corpus: $LF not found: build first (make build)" >&2; exit 1; }
C=fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$C"
mkdir -p "$C"/{fuzz_manifest,fuzz_schema,fuzz_lmdb,fuzz_parquet,fuzz_lerobot_meta,fuzz_jpeg}

# A tiny packed dataset: 1 episode, 1 camera, 32x24 frames.
"$LF" demo-data --out "$tmp/src" --episodes 1 --cameras 1 --size 32x24 --steps-min 3 --steps-max 3 \
  --state-dim 2 --action-dim 2 --quiet --threads 1 >/dev/null
"$LF" pack --src "$tmp/src" --out "$tmp/db" --horizon 2 --quiet --threads 1 >/dev/null
cp "$tmp/db/data.mdb" "$C/fuzz_lmdb/demo.mdb"
i=0
for f in $(find "$tmp/src" -name '*.jpg' | sort | head -3); do cp "$f" "$C/fuzz_jpeg/demo_$i.jpg"; i=$((i + 1)); done
"$PY" - "$tmp/db" "$C/fuzz_schema" <<'PYEOF'
import sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False)
with env.begin() as t:
    schema = t.get(b"__schema__")
    tokens = t.get(b"00000000_tokens") or b""
open(sys.argv[2] + "/demo_schema.json", "wb").write(schema)
open(sys.argv[2] + "/demo_schema_tokens", "wb").write(schema + b"\0" + tokens)
PYEOF

cp tests/data/lerobot/features/*.parquet "$C/fuzz_parquet/"
for f in tests/data/lerobot/v3.0/meta/tasks.parquet tests/data/lerobot/v3.0/meta/episodes/chunk-000/file-000.parquet; do
  cp "$f" "$C/fuzz_parquet/v3_$(basename "$(dirname "$f")")_$(basename "$f")"
done

# fuzz_lerobot_meta: the first byte picks the file (fuzz/fuzz_lerobot_meta.cc).
seed() { { printf "\\x$(printf %02x "$1")"; cat; } > "$C/fuzz_lerobot_meta/$2"; }
seed 0 info_v21 < tests/data/lerobot/v2.1/meta/info.json
seed 0 info_v30 < tests/data/lerobot/v3.0/meta/info.json
seed 1 modality <<'JSON'
{"state": {"arm": {"start": 0, "end": 2}, "grip": {"start": 2, "end": 4}},
 "action": {"arm": {"start": 0, "end": 4}},
 "video": {"front": {"original_key": "observation.images.front"}},
 "annotation": {"human.task_description": {"original_key": "task_index"}}}
JSON
seed 2 episodes < tests/data/lerobot/v2.1/meta/episodes.jsonl
seed 3 tasks < tests/data/lerobot/v2.1/meta/tasks.jsonl
printf '0,3,5-9' | seed 4 episode_list
printf 'videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4' | seed 5 template

# fuzz_manifest: byte 0 = body that the harness wraps in a valid header.
mseed() { { printf '\x00'; cat; } > "$C/fuzz_manifest/$1"; }
h=0123456789abcdef0123456789abcdef
mseed empty <<JSON
{"format":1,"step":0,"parent":-1,"chunk_bytes":1048576,"created_unix":1.5,"segments":[],"tensors":[]}
JSON
mseed raw_zstd <<JSON
{"format":1,"step":3,"parent":2,"chunk_bytes":16,"created_unix":1700000000.25,"segments":["seg-000001.bin"],"tensors":[{"name":"w","dtype":"float32","shape":[2,4],"nbytes":32,"chunks":[["$h",16,0,0,0,16],["$h",16,1,0,16,9]]}]}
JSON
mseed xor_delta <<JSON
{"format":1,"step":4,"parent":3,"chunk_bytes":8,"created_unix":2.0,"segments":["a.bin","b.bin"],"tensors":[{"name":"b","dtype":"bfloat16","shape":[4],"nbytes":8,"chunks":[["$h",8,2,1,0,5,0,"$h",0,0,8]]}]}
JSON
echo "make_fuzz_corpus: $(find "$C" -type f | wc -l) files, $(du -sk "$C" | cut -f1) KiB"
