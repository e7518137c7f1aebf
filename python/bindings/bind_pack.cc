// Python bindings of the dataset tools: demo_data, pack, inspect (see include/loongforge/pack.h).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "dataset/video_reader.h"
#include "loongforge/pack.h"
#include "loongforge/tokenizer.h"

namespace loongforge::data {
namespace {

py::dict SchemaDict(const Schema& s) {
  py::dict d;
  d["format_version"] = s.format_version;
  d["num_samples"] = s.num_samples;
  d["num_episodes"] = s.num_episodes;
  d["cameras"] = s.cameras;
  d["image_width"] = s.image_width;
  d["image_height"] = s.image_height;
  d["state_dim"] = s.state_dim;
  d["action_dim"] = s.action_dim;
  d["action_horizon"] = s.action_horizon;
  d["tokenizer"] = s.tokenizer;
  d["vocab_size"] = s.vocab_size;
  d["max_tokens"] = s.max_tokens;
  d["state_mean"] = s.state_mean;
  d["state_std"] = s.state_std;
  d["state_min"] = s.state_min;
  d["state_max"] = s.state_max;
  d["action_mean"] = s.action_mean;
  d["action_std"] = s.action_std;
  d["action_min"] = s.action_min;
  d["action_max"] = s.action_max;
  d["source"] = s.source;
  if (!s.source_format.empty()) {
    d["source_format"] = s.source_format;
    d["fps"] = s.fps;
    d["state_q01"] = s.state_q01;
    d["state_q99"] = s.state_q99;
    d["action_q01"] = s.action_q01;
    d["action_q99"] = s.action_q99;
    d["source_meta"] = py::module_::import("json").attr("loads")(s.source_meta);
  }
  return d;
}

// What pack and pack_lerobot return: the schema, the bytes written and the time taken.
py::dict PackResultDict(const PackResult& v) {
  py::dict d;
  d["schema"] = SchemaDict(v.schema);
  d["bytes_written"] = v.bytes_written;
  d["jpeg_bytes"] = v.jpeg_bytes;
  d["seconds"] = v.seconds;
  return d;
}

void RegisterPack(py::module_& m) {
  m.def(
      "demo_data",
      [](const std::string& out, int episodes, int cameras, int width, int height, uint64_t seed,
         int steps_min, int steps_max, int state_dim, int action_dim, int quality, int threads,
         bool overwrite, bool progress, std::vector<std::string> camera_names) {
        DemoDataOptions o;
        o.out_dir = out;
        o.episodes = episodes;
        o.cameras = cameras;
        o.camera_names = std::move(camera_names);
        o.width = width;
        o.height = height;
        o.seed = seed;
        o.steps_min = steps_min;
        o.steps_max = steps_max;
        o.state_dim = state_dim;
        o.action_dim = action_dim;
        o.quality = quality;
        o.threads = threads;
        o.overwrite = overwrite;
        o.progress = progress;
        DemoDataResult v = ValueOrThrowWithoutGil([&] { return GenerateDemoData(o); });
        py::dict d;
        d["episodes"] = v.episodes;
        d["steps"] = v.steps;
        d["frames"] = v.frames;
        d["jpeg_bytes"] = v.jpeg_bytes;
        d["seconds"] = v.seconds;
        return d;
      },
      py::arg("out"), py::arg("episodes") = 8, py::arg("cameras") = 2, py::arg("width") = 640,
      py::arg("height") = 480, py::arg("seed") = 0, py::arg("steps_min") = 40,
      py::arg("steps_max") = 80, py::arg("state_dim") = 14, py::arg("action_dim") = 14,
      py::arg("quality") = 90, py::arg("threads") = 0, py::arg("overwrite") = false,
      py::arg("progress") = false, py::arg("camera_names") = std::vector<std::string>{},
      "Writes a synthetic robot dataset to <out>/episodes (episode-folder format). Returns "
      "counts.");

  m.def(
      "pack",
      [](const std::string& src, const std::string& out, int horizon, bool overwrite,
         const std::string& tokenizer, int threads, bool progress, int max_instruction_bytes) {
        PackOptions o;
        o.src = src;
        o.out = out;
        o.horizon = horizon;
        o.overwrite = overwrite;
        o.tokenizer = tokenizer;
        o.threads = threads;
        o.progress = progress;
        o.max_instruction_bytes = max_instruction_bytes;
        PackResult v = ValueOrThrowWithoutGil([&] { return PackEpisodes(o); });
        py::dict d = PackResultDict(v);
        d["scan_seconds"] = v.scan_seconds;
        d["write_seconds"] = v.write_seconds;
        return d;
      },
      py::arg("src"), py::arg("out"), py::arg("horizon") = 16, py::arg("overwrite") = false,
      py::arg("tokenizer") = "byte-v1", py::arg("threads") = 0, py::arg("progress") = false,
      py::arg("max_instruction_bytes") = kDefaultMaxInstructionBytes,
      "Validates the episode folder `src` and packs it into the LMDB `out`. Bad input raises "
      "ValueError / FileNotFoundError naming the file (and line); an `out` that exists and is not "
      "a LoongForge DB raises FileExistsError even with overwrite. Returns the schema and sizes.");

  m.def(
      "pack_lerobot",
      [](const std::string& src, const std::string& out, const std::string& episodes,
         std::vector<std::string> cameras, int width, int height, int shortest_edge, int quality,
         const std::string& modality, int horizon, const std::string& tokenizer, int threads,
         bool overwrite, bool progress, int max_instruction_bytes, double tolerance_s) {
        LeRobotPackOptions o;
        o.src = src;
        o.out = out;
        o.episodes = episodes;
        o.cameras = std::move(cameras);
        o.width = width;
        o.height = height;
        o.shortest_edge = shortest_edge;
        o.quality = quality;
        o.modality = modality;
        o.horizon = horizon;
        o.tokenizer = tokenizer;
        o.threads = threads;
        o.overwrite = overwrite;
        o.progress = progress;
        o.max_instruction_bytes = max_instruction_bytes;
        o.tolerance_s = tolerance_s;
        PackResult v = ValueOrThrowWithoutGil([&] { return PackLeRobot(o); });
        py::dict d = PackResultDict(v);
        return d;
      },
      py::arg("src"), py::arg("out"), py::arg("episodes") = "",
      py::arg("cameras") = std::vector<std::string>{}, py::arg("width") = 0, py::arg("height") = 0,
      py::arg("shortest_edge") = 256, py::arg("quality") = 90, py::arg("modality") = "",
      py::arg("horizon") = 16, py::arg("tokenizer") = "byte-v1", py::arg("threads") = 0,
      py::arg("overwrite") = false, py::arg("progress") = false,
      py::arg("max_instruction_bytes") = kDefaultMaxInstructionBytes, py::arg("tolerance_s") = 1e-4,
      "Packs the LeRobot dataset `src` (v2.0/v2.1/v3.0) into the LMDB `out` (PackLeRobot in "
      "loongforge/pack.h). Bad input raises ValueError / FileNotFoundError naming the file; a "
      "build without FFmpeg raises RuntimeError saying so.");

  m.def("have_video_decoder", &HaveVideoDecoder,
        "True when this build decodes video (FFmpeg), as pack_lerobot needs.");

  m.def(
      "read_episode",
      [](const std::string& db, int64_t episode_index) {
        EpisodeData e = ValueOrThrowWithoutGil([&] { return ReadEpisode(db, episode_index); });
        const py::ssize_t t = e.length;
        py::dict d;
        d["episode_index"] = e.episode_index;
        d["state"] = py::array_t<float>({t, static_cast<py::ssize_t>(e.state_dim)}, e.state.data());
        d["action"] =
            py::array_t<float>({t, static_cast<py::ssize_t>(e.action_dim)}, e.action.data());
        d["timestamp"] = py::array_t<double>(t, e.timestamp.data());
        d["frame_index"] = py::array_t<int64_t>(t, e.frame_index.data());
        d["task_index"] = py::array_t<int64_t>(t, e.task_index.data());
        d["tasks"] = e.tasks;
        d["task"] = e.tasks.empty() ? std::string() : e.tasks.front();
        py::dict images;
        for (size_t c = 0; c < e.cameras.size(); ++c)
          images[py::str(e.cameras[c])] =
              py::array_t<uint8_t>({t, static_cast<py::ssize_t>(e.height),
                                    static_cast<py::ssize_t>(e.width), py::ssize_t{3}},
                                   e.images[c].data());
        d["images"] = images;
        return d;
      },
      py::arg("db"), py::arg("episode_index"),
      "One episode of a DB packed from LeRobot, raw: state [T,S], action [T,A], timestamp, "
      "frame_index, task, images {camera: uint8 [T,H,W,3]}.");

  m.def(
      "inspect",
      [](const std::string& db, int64_t sample) {
        std::string js = ValueOrThrowWithoutGil([&] { return InspectJson(db, sample); });
        return py::module_::import("json").attr("loads")(js);
      },
      py::arg("db"), py::arg("sample") = 0,
      "Schema, counts, per-modality sizes and one decoded sample of a packed DB, as a dict.");

  m.def(
      "tokenize",
      [](const std::string& text, const std::string& tokenizer) {
        auto tok = ValueOrThrow(MakeTokenizer(tokenizer));
        return tok->Encode(text);
      },
      py::arg("text"), py::arg("tokenizer") = "byte-v1",
      "Token ids of `text` as pack would store them.");
}

}  // namespace
}  // namespace loongforge::data

LF_REGISTER_BINDINGS(pack, loongforge::data::RegisterPack);
