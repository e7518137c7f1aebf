// Python bindings of the dataset tools: demo_data, pack, inspect (see include/loongforge/pack.h).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "dataset/video_reader.h"
#include "loongforge/pack.h"
#include "loongforge/tokenizer.h"
#include "option_table.h"

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

// DemoDataOptions, PackOptions and LeRobotPackOptions by Python name (Note [Option tables]); the
// required paths are positional arguments, everything else a keyword read against the table.
const std::vector<OptionField<DemoDataOptions>>& DemoDataFields() {
  using O = DemoDataOptions;
  static const char* const w = "demo_data";
  static const std::vector<OptionField<O>> fields = {
      Plain(w, "episodes", &O::episodes),
      Plain(w, "cameras", &O::cameras),
      Plain(w, "camera_names", &O::camera_names),
      Plain(w, "width", &O::width),
      Plain(w, "height", &O::height),
      Plain(w, "steps_min", &O::steps_min),
      Plain(w, "steps_max", &O::steps_max),
      Plain(w, "state_dim", &O::state_dim),
      Plain(w, "action_dim", &O::action_dim),
      Plain(w, "seed", &O::seed),
      Plain(w, "quality", &O::quality),
      Plain(w, "threads", &O::threads),
      Plain(w, "overwrite", &O::overwrite),
      Plain(w, "progress", &O::progress),
  };
  return fields;
}

const std::vector<OptionField<PackOptions>>& PackFields() {
  using O = PackOptions;
  static const char* const w = "pack";
  static const std::vector<OptionField<O>> fields = {
      Plain(w, "horizon", &O::horizon),
      Plain(w, "tokenizer", &O::tokenizer),
      Plain(w, "threads", &O::threads),
      Plain(w, "overwrite", &O::overwrite),
      Plain(w, "progress", &O::progress),
      Plain(w, "max_instruction_bytes", &O::max_instruction_bytes),
      Plain(w, "max_frame_pixels", &O::max_frame_pixels),
  };
  return fields;
}

const std::vector<OptionField<LeRobotPackOptions>>& LeRobotPackFields() {
  using O = LeRobotPackOptions;
  static const char* const w = "pack_lerobot";
  static const std::vector<OptionField<O>> fields = {
      Plain(w, "episodes", &O::episodes),
      Plain(w, "cameras", &O::cameras),
      Plain(w, "width", &O::width),
      Plain(w, "height", &O::height),
      Plain(w, "shortest_edge", &O::shortest_edge),
      Plain(w, "quality", &O::quality),
      Plain(w, "modality", &O::modality),
      Plain(w, "horizon", &O::horizon),
      Plain(w, "tokenizer", &O::tokenizer),
      Plain(w, "threads", &O::threads),
      Plain(w, "tolerance_s", &O::tolerance_s),
      Plain(w, "overwrite", &O::overwrite),
      Plain(w, "progress", &O::progress),
      Plain(w, "max_instruction_bytes", &O::max_instruction_bytes),
  };
  return fields;
}

void RegisterPack(py::module_& m) {
  m.def(
      "demo_data",
      [](const std::string& out, const py::kwargs& kw) {
        DemoDataOptions o;
        o.out_dir = out;
        ApplyOptions(DemoDataFields(), "demo_data", kw, &o);
        DemoDataResult v = ValueOrThrowWithoutGil([&] { return GenerateDemoData(o); });
        py::dict d;
        d["episodes"] = v.episodes;
        d["steps"] = v.steps;
        d["frames"] = v.frames;
        d["jpeg_bytes"] = v.jpeg_bytes;
        d["seconds"] = v.seconds;
        return d;
      },
      py::arg("out"),
      "Writes a synthetic robot dataset to <out>/episodes (episode-folder format); keywords are "
      "DemoDataOptions fields (demo_data_options()). Returns counts.");
  m.def(
      "pack",
      [](const std::string& src, const std::string& out, const py::kwargs& kw) {
        PackOptions o;
        o.src = src;
        o.out = out;
        ApplyOptions(PackFields(), "pack", kw, &o);
        PackResult v = ValueOrThrowWithoutGil([&] { return PackEpisodes(o); });
        py::dict d = PackResultDict(v);
        d["scan_seconds"] = v.scan_seconds;
        d["write_seconds"] = v.write_seconds;
        return d;
      },
      py::arg("src"), py::arg("out"),
      "Validates the episode folder `src` and packs it into the LMDB `out`; keywords are "
      "PackOptions fields (pack_options()). Bad input raises ValueError / FileNotFoundError "
      "naming the file (and line); an `out` that exists and is not a LoongForge DB raises "
      "FileExistsError even with overwrite. Returns the schema and sizes.");
  m.def(
      "pack_lerobot",
      [](const std::string& src, const std::string& out, const py::kwargs& kw) {
        LeRobotPackOptions o;
        o.src = src;
        o.out = out;
        ApplyOptions(LeRobotPackFields(), "pack_lerobot", kw, &o);
        return PackResultDict(ValueOrThrowWithoutGil([&] { return PackLeRobot(o); }));
      },
      py::arg("src"), py::arg("out"),
      "Packs the LeRobot dataset `src` (v2.0/v2.1/v3.0) into the LMDB `out` (PackLeRobot in "
      "loongforge/pack.h); keywords are LeRobotPackOptions fields (pack_lerobot_options()). Bad "
      "input raises ValueError / FileNotFoundError naming the file; a build without FFmpeg "
      "raises RuntimeError saying so.");
  m.def(
      "demo_data_options", [] { return OptionDefaults(DemoDataFields()); },
      "Every demo_data option and its default (Note [Option tables]).");
  m.def(
      "pack_options", [] { return OptionDefaults(PackFields()); },
      "Every pack option and its default (Note [Option tables]).");
  m.def(
      "pack_lerobot_options", [] { return OptionDefaults(LeRobotPackFields()); },
      "Every pack_lerobot option and its default (Note [Option tables]).");

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
      "read_frame_table",
      [](const std::string& db) {
        FrameTable f = ValueOrThrowWithoutGil([&] { return ReadFrameTable(db); });
        const py::ssize_t n = f.rows;
        py::dict d;
        d["fps"] = f.fps;
        d["state"] = py::array_t<float>({n, static_cast<py::ssize_t>(f.state_dim)}, f.state.data());
        d["action"] =
            py::array_t<float>({n, static_cast<py::ssize_t>(f.action_dim)}, f.action.data());
        d["timestamp"] = py::array_t<double>(n, f.timestamp.data());
        d["episode_index"] = py::array_t<int64_t>(n, f.episode_index.data());
        d["frame_index"] = py::array_t<int64_t>(n, f.frame_index.data());
        d["task_index"] = py::array_t<int64_t>(n, f.task_index.data());
        d["index"] = py::array_t<int64_t>(n, f.index.data());
        d["episode_first"] = py::array_t<int64_t>(n, f.episode_first.data());
        d["episode_length"] = py::array_t<int64_t>(n, f.episode_length.data());
        return d;
      },
      py::arg("db"),
      "Every row of a DB packed from LeRobot without its images (numpy arrays per column, raw): "
      "state, action, timestamp, episode_index, frame_index, task_index, index, episode_first, "
      "episode_length, and fps.");

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
  m.def(
      "tokenizer_info",
      [](const std::string& tokenizer) {
        auto tok = ValueOrThrow(MakeTokenizer(tokenizer));
        py::dict d;
        d["id"] = tok->id();
        d["vocab_size"] = tok->vocab_size();
        d["pad_id"] = tok->pad_id();
        return d;
      },
      py::arg("tokenizer"), "id, vocab_size and pad_id of a built-in tokenizer.");
}

}  // namespace
}  // namespace loongforge::data

LF_REGISTER_BINDINGS(pack, loongforge::data::RegisterPack);
