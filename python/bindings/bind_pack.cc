// Python bindings of the dataset tools: demo_data, pack, inspect (see include/loongforge/pack.h).
#include <pybind11/stl.h>

#include "bindings.h"
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
        StatusOr<DemoDataResult> r = [&] {
          py::gil_scoped_release release;
          return GenerateDemoData(o);
        }();
        DemoDataResult v = ValueOrThrow(std::move(r));
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
        StatusOr<PackResult> r = [&] {
          py::gil_scoped_release release;
          return PackEpisodes(o);
        }();
        PackResult v = ValueOrThrow(std::move(r));
        py::dict d;
        d["schema"] = SchemaDict(v.schema);
        d["bytes_written"] = v.bytes_written;
        d["jpeg_bytes"] = v.jpeg_bytes;
        d["seconds"] = v.seconds;
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
      "inspect",
      [](const std::string& db, int64_t sample) {
        StatusOr<std::string> r = [&] {
          py::gil_scoped_release release;
          return InspectJson(db, sample);
        }();
        std::string js = ValueOrThrow(std::move(r));
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
