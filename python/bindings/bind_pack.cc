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
  using D = DemoDataOptions;
  DefWithOptions<D>(
      m, "demo_data",
      "Writes a synthetic robot dataset to <out>/episodes (episode-folder format). Returns "
      "counts.",
      [](const D& o) {
        DemoDataResult v = ValueOrThrowWithoutGil([&] { return GenerateDemoData(o); });
        py::dict d;
        d["episodes"] = v.episodes;
        d["steps"] = v.steps;
        d["frames"] = v.frames;
        d["jpeg_bytes"] = v.jpeg_bytes;
        d["seconds"] = v.seconds;
        return d;
      },
      Arg("out", &D::out_dir), Arg("episodes", &D::episodes, 8), Arg("cameras", &D::cameras, 2),
      Arg("width", &D::width, 640), Arg("height", &D::height, 480), Arg("seed", &D::seed, 0),
      Arg("steps_min", &D::steps_min, 40), Arg("steps_max", &D::steps_max, 80),
      Arg("state_dim", &D::state_dim, 14), Arg("action_dim", &D::action_dim, 14),
      Arg("quality", &D::quality, 90), Arg("threads", &D::threads, 0),
      Arg("overwrite", &D::overwrite, false), Arg("progress", &D::progress, false),
      Arg("camera_names", &D::camera_names, std::vector<std::string>{}));

  using P = PackOptions;
  DefWithOptions<P>(
      m, "pack",
      "Validates the episode folder `src` and packs it into the LMDB `out`. Bad input raises "
      "ValueError / FileNotFoundError naming the file (and line); an `out` that exists and is not "
      "a LoongForge DB raises FileExistsError even with overwrite. Returns the schema and sizes.",
      [](const P& o) {
        PackResult v = ValueOrThrowWithoutGil([&] { return PackEpisodes(o); });
        py::dict d = PackResultDict(v);
        d["scan_seconds"] = v.scan_seconds;
        d["write_seconds"] = v.write_seconds;
        return d;
      },
      Arg("src", &P::src), Arg("out", &P::out), Arg("horizon", &P::horizon, 16),
      Arg("overwrite", &P::overwrite, false), Arg("tokenizer", &P::tokenizer, "byte-v1"),
      Arg("threads", &P::threads, 0), Arg("progress", &P::progress, false),
      Arg("max_instruction_bytes", &P::max_instruction_bytes, kDefaultMaxInstructionBytes));

  using L = LeRobotPackOptions;
  DefWithOptions<L>(
      m, "pack_lerobot",
      "Packs the LeRobot dataset `src` (v2.0/v2.1/v3.0) into the LMDB `out` (PackLeRobot in "
      "loongforge/pack.h). Bad input raises ValueError / FileNotFoundError naming the file; a "
      "build without FFmpeg raises RuntimeError saying so.",
      [](const L& o) {
        return PackResultDict(ValueOrThrowWithoutGil([&] { return PackLeRobot(o); }));
      },
      Arg("src", &L::src), Arg("out", &L::out), Arg("episodes", &L::episodes, ""),
      Arg("cameras", &L::cameras, std::vector<std::string>{}), Arg("width", &L::width, 0),
      Arg("height", &L::height, 0), Arg("shortest_edge", &L::shortest_edge, 256),
      Arg("quality", &L::quality, 90), Arg("modality", &L::modality, ""),
      Arg("horizon", &L::horizon, 16), Arg("tokenizer", &L::tokenizer, "byte-v1"),
      Arg("threads", &L::threads, 0), Arg("overwrite", &L::overwrite, false),
      Arg("progress", &L::progress, false),
      Arg("max_instruction_bytes", &L::max_instruction_bytes, kDefaultMaxInstructionBytes),
      Arg("tolerance_s", &L::tolerance_s, 1e-4));

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
