// The pieces of `pack --from-lerobot` (PackLeRobot in loongforge/pack.h) that tests reach
// directly: LeRobot metadata (meta/info.json, episodes, tasks), GR00T's modality.json, episode
// lists, path templates, quantiles (all defined in lerobot_meta.cc; PackLeRobot and ReadEpisode
// are in lerobot_import.cc).
//
// Note [LeRobot layouts] (checked against huggingface/lerobot src/lerobot/datasets/utils.py):
//   v2.0 / v2.1: data_path "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
//     video_path "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
//     episode_chunk = episode_index // chunks_size; meta/episodes.jsonl ({episode_index, tasks,
//     length}), meta/tasks.jsonl ({task_index, task}); statistics in meta/stats.json (v2.0) or
//     meta/episodes_stats.jsonl (v2.1).
//   v3.0: data_path "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", video_path
//     "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"; episodes in
//     meta/episodes/chunk-*/file-*.parquet with episode_index, length, dataset_from_index,
//     dataset_to_index, data/chunk_index, data/file_index and per video key
//     videos/<key>/chunk_index, videos/<key>/file_index, videos/<key>/from_timestamp; tasks in
//     meta/tasks.parquet (task_index, and the task text as column "task" or pandas' index column
//     "__index_level_0__"); statistics in meta/stats.json.
//   Both: a row's frame is the video frame at (row timestamp + the episode's from_timestamp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge::data::lerobot {

struct Feature {
  std::string key, dtype;
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  // Videos: picture size from shape + names (HWC or CHW) or info/video_info; 0 if unknown.
  int width = 0, height = 0;
  std::string codec;  // info["video.codec"], may be empty
  bool is_video() const { return dtype == "video"; }
};

struct Info {
  std::string path;     // meta/info.json
  std::string version;  // "v2.0", "v2.1", "v3.0"
  int major = 0, minor = 0;
  double fps = 0;
  int64_t chunks_size = 1000;
  std::string data_path, video_path;
  std::map<std::string, Feature> features;
  int64_t total_episodes = -1;
};

// Parses meta/info.json. InvalidArgument naming the file for a missing/mistyped field, an
// unsupported codebase_version, a video feature whose shape says neither HWC nor CHW.
StatusOr<Info> ParseInfo(const std::string& info_json_path);

struct VideoLocation {
  int64_t chunk_index = 0, file_index = 0;
  double from_timestamp = 0;
};

struct EpisodeMeta {
  int64_t episode_index = 0, length = 0;
  std::vector<std::string> tasks;
  // v3.0 only:
  int64_t from_index = -1, to_index = -1;
  int64_t data_chunk = 0, data_file = 0;
  std::map<std::string, VideoLocation> videos;  // video key -> location
};

// The episodes listed by the metadata (episodes.jsonl, or meta/episodes/**.parquet for v3), in
// episode_index order. `video_keys` are the v3 per-camera columns to read.
StatusOr<std::vector<EpisodeMeta>> ReadEpisodes(const std::string& root, const Info& info,
                                                const std::vector<std::string>& video_keys);

// task_index -> task text (tasks.jsonl or tasks.parquet).
StatusOr<std::map<int64_t, std::string>> ReadTasks(const std::string& root, const Info& info);

// "0,3,5-9" -> {0, 3, 5, 6, 7, 8, 9} (sorted, unique). InvalidArgument for anything else.
StatusOr<std::vector<int64_t>> ParseEpisodeList(const std::string& spec);

// Python str.format subset used by LeRobot's templates: {name} and {name:0Nd}.
StatusOr<std::string> FormatTemplate(const std::string& tmpl,
                                     const std::map<std::string, int64_t>& ints,
                                     const std::map<std::string, std::string>& strings);

// root + "/" + rel for a path the metadata forms (a template filled in, modality.json), after
// checking that it stays inside `root`: `rel` must be relative, and the path with every symlink
// of its existing part and every ".." resolved must lie under realpath(root). InvalidArgument
// naming `what` (the template or the file), `rel` and where it leads otherwise.
StatusOr<std::string> PathInRoot(const std::string& root, const std::string& rel,
                                 const std::string& what);

struct Slice {
  std::string name;
  int start = 0, end = 0;  // [start, end)
};

struct Modality {
  std::string path;
  std::vector<Slice> state, action;
  std::vector<std::pair<std::string, std::string>> video;  // name -> original LeRobot key
  std::string task_column;  // parquet column of task indices ("task_index" if not said)
  std::string json;         // the file as parsed (stored in the schema's source_meta)
};

// Parses GR00T's modality.json and checks every slice against the dims: InvalidArgument naming
// the file, the slice and the dims when one is out of range (start < 0, end <= start, end > dim),
// or naming both slices when two of a group overlap.
StatusOr<Modality> ParseModality(const std::string& path, int state_dim, int action_dim);

// Per-dimension quantile q (0..1) of `rows` (n x dims, row-major), as numpy.quantile's default
// linear interpolation.
std::vector<float> Quantile(const std::vector<float>& rows, size_t dims, double q);

}  // namespace loongforge::data::lerobot
