// `loongforge demo-data`, `loongforge pack` and `loongforge inspect`: build and examine datasets.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "loongforge/pack.h"

namespace loongforge {
namespace cli {
namespace {

using data::DemoDataOptions;
using data::DemoDataResult;
using data::GenerateDemoData;
using data::InspectJson;
using data::InspectText;
using data::PackEpisodes;
using data::PackOptions;
using data::PackResult;
using data::Schema;

void AddDemoData(CLI::App& root) {
  auto o = std::make_shared<DemoDataOptions>();
  auto size = std::make_shared<std::string>("640x480");
  auto quiet = std::make_shared<bool>(false);
  auto cameras = std::make_shared<CLI::Option*>(nullptr);  // set below; read after the parse
  CLI::App* app = AddCommand(
      root, "demo-data", "generate a synthetic robot dataset (episode-folder format)",
      [o, size, quiet, cameras]() -> Status {
        LF_RETURN_IF_ERROR(ParseSize(*size, &o->width, &o->height));
        if (!o->camera_names.empty() && (*cameras)->count() == 0)
          o->cameras = static_cast<int>(o->camera_names.size());
        o->progress = !*quiet;
        LF_ASSIGN_OR_RETURN(DemoDataResult r, GenerateDemoData(*o));
        std::printf(
            "wrote %lld episodes, %lld steps, %lld frames (%dx%d q%d) to %s/episodes in %.2f s\n",
            static_cast<long long>(r.episodes), static_cast<long long>(r.steps),
            static_cast<long long>(r.frames), o->width, o->height, o->quality, o->out_dir.c_str(),
            r.seconds);
        std::printf("JPEG total %.1f MB, mean %.1f KB per frame\n", r.jpeg_bytes / 1e6,
                    r.frames ? r.jpeg_bytes / 1e3 / static_cast<double>(r.frames) : 0.0);
        return Status::Ok();
      });
  app->add_option("--out", o->out_dir, "output folder (episodes are written to DIR/episodes)")
      ->required();
  app->add_option("--episodes", o->episodes, "number of episodes")->capture_default_str();
  *cameras = app->add_option("--cameras", o->cameras, "number of cameras")->capture_default_str();
  app->add_option("--camera-names", o->camera_names,
                  "comma-separated camera names (default front,wrist,side,top,cam4,...)")
      ->delimiter(',');
  app->add_option("--size", *size, "frame size WxH")->capture_default_str();
  app->add_option("--steps-min", o->steps_min, "shortest episode (steps)")->capture_default_str();
  app->add_option("--steps-max", o->steps_max, "longest episode (steps)")->capture_default_str();
  app->add_option("--state-dim", o->state_dim, "state dimensions")->capture_default_str();
  app->add_option("--action-dim", o->action_dim, "action dimensions")->capture_default_str();
  app->add_option("--seed", o->seed, "random seed (output is deterministic in it)")
      ->capture_default_str();
  app->add_option("--quality", o->quality, "JPEG quality (4:2:0)")->capture_default_str();
  app->add_option("--threads", o->threads, "worker threads (0 = all cores)")->capture_default_str();
  app->add_flag("--overwrite", o->overwrite, "replace an existing DIR/episodes");
  app->add_flag("--quiet", *quiet, "no progress bar");
}

void PrintPacked(const PackResult& r, const std::string& out) {
  const Schema& s = r.schema;
  std::printf(
      "packed %lld samples from %lld episodes (%zu cameras, %dx%d, state %d, action %d x "
      "%d) into %s in %.2f s\n",
      static_cast<long long>(s.num_samples), static_cast<long long>(s.num_episodes),
      s.cameras.size(), s.image_width, s.image_height, s.state_dim, s.action_horizon, s.action_dim,
      out.c_str(), r.seconds);
  std::printf("%.1f MB written (JPEG %.1f MB); scan+check %.2f s, write %.2f s\n",
              r.bytes_written / 1e6, r.jpeg_bytes / 1e6, r.scan_seconds, r.write_seconds);
}

// Says when the frames were stored at another size than the videos', and how to keep it.
void PrintFrameSize(const Schema& s, const data::LeRobotPackOptions& lr) {
  const auto meta = nlohmann::json::parse(s.source_meta, nullptr, false);
  if (meta.is_discarded() || !meta.contains("source_frame_size")) return;
  const auto& src = meta["source_frame_size"];
  if (!src.is_array() || src.size() != 2 || !src[0].is_number_integer() ||
      !src[1].is_number_integer())
    return;
  const int w = src[0].get<int>(), h = src[1].get<int>();
  if (w == s.image_width && h == s.image_height) return;
  if (lr.width > 0)
    std::printf("frames resized from the videos' %dx%d to %dx%d (--size)\n", w, h, s.image_width,
                s.image_height);
  else
    std::printf(
        "frames resized from the videos' %dx%d to %dx%d (--shortest-edge %d; "
        "--shortest-edge 0 keeps the videos' size)\n",
        w, h, s.image_width, s.image_height, lr.shortest_edge);
}

void AddPack(CLI::App& root) {
  auto o = std::make_shared<PackOptions>();
  // pack --from-lerobot SRC: the LeRobot import (PackLeRobot); shares --out, --horizon,
  // --tokenizer, --threads, --max-instruction-bytes, --overwrite and --quiet with pack --src.
  auto lr = std::make_shared<data::LeRobotPackOptions>();
  auto size = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  CLI::App* app = AddCommand(
      root, "pack", "pack an episode folder (--src) or a LeRobot dataset (--from-lerobot)",
      [o, lr, size, quiet]() -> Status {
        o->progress = !*quiet;
        if (lr->src.empty() == o->src.empty())
          return InvalidArgumentError("pack: give exactly one of --src DIR or --from-lerobot DIR");
        if (o->src.empty()) {
          lr->out = o->out;
          lr->horizon = o->horizon;
          lr->tokenizer = o->tokenizer;
          lr->threads = o->threads;
          lr->max_instruction_bytes = o->max_instruction_bytes;
          lr->overwrite = o->overwrite;
          lr->progress = o->progress;
          if (!size->empty()) LF_RETURN_IF_ERROR(ParseSize(*size, &lr->width, &lr->height));
          LF_ASSIGN_OR_RETURN(PackResult r, data::PackLeRobot(*lr));
          PrintPacked(r, o->out);
          std::printf("source %s, %.4g fps\n", r.schema.source_format.c_str(), r.schema.fps);
          PrintFrameSize(r.schema, *lr);
          return Status::Ok();
        }
        LF_ASSIGN_OR_RETURN(PackResult r, PackEpisodes(*o));
        PrintPacked(r, o->out);
        return Status::Ok();
      });
  app->add_option("--src", o->src, "episode folder (holding episodes/)");
  app->add_option("--from-lerobot", lr->src,
                  "LeRobot dataset root (v2.0/v2.1/v3.0, holding meta/info.json)");
  app->add_option("--out", o->out, "LMDB directory to create")->required();
  app->add_option("--horizon", o->horizon, "action chunk length (future steps per sample)")
      ->capture_default_str();
  app->add_option("--tokenizer", o->tokenizer, "tokenizer id")->capture_default_str();
  app->add_option("--threads", o->threads,
                  "worker threads: JPEG read/validate, or LeRobot episodes decoded (0 = all cores)")
      ->capture_default_str();
  app->add_option("--max-instruction-bytes", o->max_instruction_bytes,
                  "longest instruction accepted (bytes); longer ones are refused")
      ->capture_default_str();
  app->add_option("--max-frame-pixels", o->max_frame_pixels,
                  "--src: refuse a frame whose JPEG header claims more pixels (width x height)")
      ->check(CLI::Range(int64_t{1}, INT64_MAX))
      ->capture_default_str();
  app->add_flag("--overwrite", o->overwrite,
                "replace an existing DB (atomically, when the new one is complete)");
  app->add_flag("--quiet", *quiet, "no progress bar");
  // LeRobot-only options.
  app->add_option("--episodes", lr->episodes,
                  "LeRobot: episode indices to pack, e.g. 0,3,5-9 (default: all listed)");
  app->add_option("--cameras", lr->cameras,
                  "LeRobot: comma-separated video keys or camera names (default: all videos)")
      ->delimiter(',');
  app->add_option("--size", *size, "LeRobot: frame size WxH (default: by --shortest-edge)");
  app->add_option("--shortest-edge", lr->shortest_edge,
                  "LeRobot: resize so the shortest edge is this (0 = keep the video's size)")
      ->check(CLI::Range(0, 8192))
      ->capture_default_str();
  app->add_option("--quality", lr->quality, "LeRobot: JPEG quality (4:2:0)")->capture_default_str();
  app->add_option("--modality", lr->modality,
                  "LeRobot: GR00T modality.json (default: SRC/meta/modality.json if present; "
                  "'none' to ignore it)");
}

void AddInspect(CLI::App& root) {
  struct Flags {
    std::string db;
    int64_t sample = 0;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = AddCommand(
      root, "inspect", "print a dataset's schema, counts, sizes and one sample", [f]() -> Status {
        std::string out;
        if (f->json) {
          LF_ASSIGN_OR_RETURN(out, InspectJson(f->db, f->sample));
          out += "\n";
        } else {
          LF_ASSIGN_OR_RETURN(out, InspectText(f->db, f->sample));
        }
        std::fwrite(out.data(), 1, out.size(), stdout);
        return Status::Ok();
      });
  app->add_option("DB", f->db, "packed dataset")->required();
  app->add_option("--sample", f->sample, "sample id to decode")->capture_default_str();
  app->add_flag("--json", f->json, "print JSON");
}

}  // namespace
LF_CLI_COMMAND(AddDemoData);
LF_CLI_COMMAND(AddPack);
LF_CLI_COMMAND(AddInspect);
}  // namespace cli
}  // namespace loongforge
