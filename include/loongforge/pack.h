// Building and examining LoongForge datasets: a synthetic robot-dataset generator (demo-data),
// the packer that turns an episode folder into the LMDB record store, and inspect.
//
// The episode-folder input format and the LMDB layout are described in docs/DATASET.md:
//   <src>/episodes/<id>/steps.jsonl            one JSON object per line:
//                                              {"step": i, "state": [...], "action": [...],
//                                               "instruction": "..."}
//   <src>/episodes/<id>/cam_<name>/<step>.jpg  one JPEG per camera per step
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/dataset.h"
#include "loongforge/status.h"

namespace loongforge::data {

// ---- demo-data ----------------------------------------------------------------------------------

struct DemoDataOptions {
  std::string out_dir;  // episodes are written to <out_dir>/episodes/
  int episodes = 8;
  int cameras = 2;                        // names come from camera_names or the default list
  std::vector<std::string> camera_names;  // empty: "front", "wrist", "side", "top", "left", ...
  int width = 640, height = 480;
  int steps_min = 40, steps_max = 80;  // episode length, uniform in [steps_min, steps_max]
  int state_dim = 14, action_dim = 14;
  uint64_t seed = 0;
  int quality = 90;        // JPEG quality, 4:2:0 chroma subsampling
  int threads = 0;         // 0 = hardware concurrency; the output does not depend on it
  bool overwrite = false;  // replace an existing <out_dir>/episodes written by demo-data
  bool progress = true;    // progress bar on stderr
};

struct DemoDataResult {
  int64_t episodes = 0, steps = 0, frames = 0;
  int64_t jpeg_bytes = 0;  // total size of all frames
  double seconds = 0;
};

// The default camera names for `k` cameras ("front", "wrist", "side", "top", then "cam4", ...).
std::vector<std::string> DefaultCameraNames(int k);

// Writes a synthetic dataset in the episode-folder format. Frames are rendered scenes (textured
// wall and wooden table, lighting gradient, robot-arm links, boxes and balls that follow the
// episode's state trajectory, per-pixel sensor noise) encoded with libjpeg-turbo, so JPEG sizes
// and decode costs resemble real camera frames. Deterministic in (options minus threads/progress).
// The episodes are staged in a new directory <out_dir>/episodes.partial.XXXXXX (mkdtemp) and
// renamed into place when complete; episodes/ gets a marker file ".loongforge-demo-data" (the
// packer ignores dotfiles), and overwrite replaces only an episodes/ folder that carries it, never
// recorded data.
// Errors: InvalidArgument for bad options (threads < 0, camera names that repeat or are not
// [A-Za-z0-9_-]+, ...), AlreadyExists if <out_dir>/episodes exists and !overwrite or is not
// demo data, I/O errors naming the file.
StatusOr<DemoDataResult> GenerateDemoData(const DemoDataOptions& options);

// Renders one synthetic frame (RGB, width*height*3 bytes) for tests and benchmarks of decoders:
// the scene of episode `episode`, camera index `camera`, at normalized time `t` in [0, 1].
std::vector<uint8_t> RenderDemoFrame(int width, int height, uint64_t seed, int episode, int camera,
                                     double t);

// ---- pack ---------------------------------------------------------------------------------------

// The longest instruction pack accepts by default, in bytes of UTF-8 (a paragraph; robot task
// instructions are a sentence). Longer ones are refused rather than cut, so a dataset never
// carries text its author did not see; raise PackOptions::max_instruction_bytes for long ones.
constexpr int kDefaultMaxInstructionBytes = 4096;
constexpr int kMaxInstructionBytesLimit = 1 << 20;
constexpr int kMaxPackThreads = 1024;
constexpr int64_t kDefaultPackMaxFramePixels = int64_t{64} << 20;

struct PackOptions {
  std::string src;                    // the folder holding episodes/
  std::string out;                    // the LMDB directory to create
  int horizon = 16;                   // action chunk length (future steps per sample), 1..4096
  std::string tokenizer = "byte-v1";  // MakeTokenizer() id
  int threads = 0;  // JPEG read/validate threads, 0..kMaxPackThreads; 0 = hardware concurrency
  // Replace an existing DB at `out` (atomically, on success). Only a LoongForge DB is replaced;
  // any other file or folder at `out` is refused (RecordWriter in dataset.h).
  bool overwrite = false;
  bool progress = true;
  // Instructions longer than this (bytes) are refused, naming the file and line;
  // 1..kMaxInstructionBytesLimit.
  int max_instruction_bytes = kDefaultMaxInstructionBytes;
  // A frame whose JPEG header claims more pixels (width x height) than this is refused, naming
  // the file, its size and the bound: the loader would refuse every record of it (its
  // max_frame_pixels has the same default, 64 Mi pixels). >= 1.
  int64_t max_frame_pixels = kDefaultPackMaxFramePixels;
};

struct PackResult {
  Schema schema;
  int64_t bytes_written = 0;  // keys + values
  int64_t jpeg_bytes = 0;
  double seconds = 0;
  double scan_seconds = 0;   // parse steps.jsonl, list frames, cross-episode checks
  double write_seconds = 0;  // read + check frames, write records, commit (fsync + rename)
};

// Validates every input and writes the DB (docs/DATASET.md). Samples are numbered 0..N-1 in
// episode order (episode ids in natural order: digit runs compare numerically), then step order.
// The DB is written through a RecordWriter (dataset.h), created before the inputs are scanned:
// the output is locked for the whole pack, staged in a new <out>.partial.XXXXXX, and published by
// rename only after every record and the schema are written and synced; on any error nothing is
// left at <out> (an existing DB replaced with overwrite stays as it was) and the staging
// directory is removed.
// Errors name the file (and line for steps.jsonl):
//   NotFound: missing <src>/episodes, steps.jsonl, camera folder in one episode, frame for a step.
//   InvalidArgument: bad options (horizon, threads, max_instruction_bytes, out = '.'), empty
//     episodes folder, non-JSON line, missing/mistyped step/state/action/instruction, an
//     instruction over max_instruction_bytes, ragged state or action dims (expected vs got),
//     non-contiguous step numbers, a camera folder not present in the first episode, a frame that
//     is not a JPEG, a frame of a different size, a frame file with no step, a bad file name, a
//     tokenizer that returns ids outside its vocabulary.
//   AlreadyExists: `out` exists and !overwrite, or exists and is not a LoongForge DB.
//   Unavailable: another pack is writing `out`.
//   ResourceExhausted: the disk, a quota or the file-size limit is full (naming the file).
StatusOr<PackResult> PackEpisodes(const PackOptions& options);

// ---- pack --from-lerobot ------------------------------------------------------------------------

// Packs a LeRobot dataset (v2.0, v2.1, v3.0; GR00T's meta/modality.json) into the record store
// (docs/DATASET.md, "Bring your LeRobot dataset"; src/dataset/lerobot_import.cc).
struct LeRobotPackOptions {
  std::string src;  // the dataset root (holding meta/info.json)
  std::string out;  // the LMDB directory to create
  // Episodes to pack, as LeRobot episode_index values: "0,3,5-9" (ranges inclusive); empty = all
  // episodes the metadata lists.
  std::string episodes;
  // Cameras: LeRobot video keys ("observation.images.top") or, with a modality file, its names
  // ("top" for video.top); empty = every video feature. DB camera names are the last dotted part.
  std::vector<std::string> cameras;
  int width = 0, height = 0;  // frame size; both 0 = by shortest_edge
  int shortest_edge = 256;    // used when width/height are 0; <= 0 keeps the video's size
  int quality = 90;           // JPEG quality (4:2:0), 1..100
  // GR00T modality file; empty = <src>/meta/modality.json when it exists; "none" = ignore it.
  std::string modality;
  int horizon = 16;  // action chunk length, 1..4096 (as PackOptions)
  std::string tokenizer = "byte-v1";
  int threads = 0;  // episodes decoded in parallel, 0..kMaxPackThreads; 0 = hardware concurrency
  double tolerance_s = 1e-4;  // frame timestamp tolerance (LeRobot's tolerance_s)
  bool overwrite = false;
  bool progress = true;
  int max_instruction_bytes = kDefaultMaxInstructionBytes;
};

// Validates the whole dataset and writes the DB through a RecordWriter (atomic publish as
// PackEpisodes: nothing is visible at `out` unless every file was read and checked; on any error
// no DB and no staging directory remain). Records per sample as PackEpisodes, plus
// "{id}_lerobot": float64 timestamp, int64 task_index, int64 LeRobot index. Schema gains
// source_format, fps, q01/q99 and source_meta. State and action are stored exactly (float64
// values must be representable as float32).
// Errors name the file and the column, row or frame:
//   FailedPrecondition: this build lacks FFmpeg (video decoding).
//   NotFound: meta/info.json, a data file, a video, a listed episode missing; no frame within
//     tolerance of a row's timestamp.
//   InvalidArgument: bad options; info.json or episodes metadata that disagree with the files
//     (column missing, list lengths vs feature shape, row counts vs episode length, frame_index
//     not 0..T-1, video size or fps); a modality slice out of range; unknown codebase_version.
//   DataLoss: a truncated or corrupt parquet or video, a video with fewer frames than rows.
//   Unimplemented: a parquet feature the reader does not support.
StatusOr<PackResult> PackLeRobot(const LeRobotPackOptions& options);

// One episode of a DB packed by PackLeRobot, raw (unnormalized).
struct EpisodeData {
  int64_t episode_index = 0;  // LeRobot's
  int64_t length = 0;         // T
  int state_dim = 0, action_dim = 0;
  std::vector<float> state;   // T x state_dim
  std::vector<float> action;  // T x action_dim (row t = the action of step t)
  std::vector<double> timestamp;
  std::vector<int64_t> frame_index, task_index;
  std::vector<std::string> tasks;  // per row
  std::vector<std::string> cameras;
  int width = 0, height = 0;
  std::vector<std::vector<uint8_t>> images;  // per camera: T x height x width x 3 RGB
};

// Reads episode `episode_index` (LeRobot numbering) from the DB at `db`. NotFound if the DB has
// no such episode; FailedPrecondition if the DB was not packed from LeRobot; DataLoss naming the
// record for a damaged one.
StatusOr<EpisodeData> ReadEpisode(const std::string& db, int64_t episode_index);

// Every row of a DB packed by PackLeRobot without its images, in sample order: what LeRobot's
// per-frame table holds, read once by the loader's LeRobot contract (format "lerobot",
// delta_timestamps) to gather rows at other offsets of the same episode.
struct FrameTable {
  int64_t rows = 0;
  int state_dim = 0, action_dim = 0;
  double fps = 0;
  std::vector<float> state;   // rows x state_dim, raw
  std::vector<float> action;  // rows x action_dim, raw (row i = the action of sample i's step)
  std::vector<double> timestamp;
  std::vector<int64_t> episode_index, frame_index, task_index, index;  // LeRobot's
  std::vector<int64_t> episode_first, episode_length;  // per row: its episode's samples in the DB
};

// The frame table of the DB at `db`. FailedPrecondition if it was not packed from LeRobot;
// DataLoss naming the DB or the record when the episode table or a record is damaged (an
// episode's rows not frames 0..T-1 in sample order included).
StatusOr<FrameTable> ReadFrameTable(const std::string& db);

// ---- inspect ------------------------------------------------------------------------------------

// A JSON report of the DB at `path`: "schema", "counts" (keys, samples, episodes), "modalities"
// (per modality: count, total_bytes, mean_bytes), "db_file_bytes", and "sample" (sample
// `sample_id` decoded: episode, step, tokens, text, state, action_row0, amask, and per camera
// the JPEG width, height and bytes). OutOfRange if sample_id is not in the DB; DataLoss naming
// the record if one has the wrong size or token ids outside the vocabulary (CheckTokens), and
// naming data.mdb if the file is damaged.
StatusOr<std::string> InspectJson(const std::string& path, int64_t sample_id);

// The same report as human-readable text.
StatusOr<std::string> InspectText(const std::string& path, int64_t sample_id);

}  // namespace loongforge::data
