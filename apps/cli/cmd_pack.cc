// `loongforge demo-data`, `loongforge pack` and `loongforge inspect`: build and examine datasets.
#include <cstdio>
#include <sstream>

#include "cli.h"
#include "loongforge/pack.h"

namespace loongforge {
namespace cli {
namespace {

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

Status DemoDataMain(int argc, char** argv) {
  Args args("demo-data", "--out DIR [options]");
  args.Flag("out", "", "output folder (episodes are written to DIR/episodes)")
      .Flag("episodes", "8", "number of episodes")
      .Flag("cameras", "2", "number of cameras")
      .Flag("camera-names", "",
            "comma-separated camera names (default front,wrist,side,top,cam4,...)")
      .Flag("size", "640x480", "frame size WxH")
      .Flag("steps-min", "40", "shortest episode (steps)")
      .Flag("steps-max", "80", "longest episode (steps)")
      .Flag("state-dim", "14", "state dimensions")
      .Flag("action-dim", "14", "action dimensions")
      .Flag("seed", "0", "random seed (output is deterministic in it)")
      .Flag("quality", "90", "JPEG quality (4:2:0)")
      .Flag("threads", "0", "worker threads (0 = all cores)")
      .Switch("overwrite", "replace an existing DIR/episodes")
      .Switch("quiet", "no progress bar");
  LF_RETURN_IF_ERROR(args.Parse(argc, argv));
  if (args.help_requested()) {
    std::printf("%s", args.Usage().c_str());
    return Status::Ok();
  }
  DemoDataOptions o;
  o.out_dir = args.Get("out");
  if (o.out_dir.empty()) return InvalidArgumentError("--out is required\n" + args.Usage());
  LF_ASSIGN_OR_RETURN(int64_t episodes, args.GetInt("episodes"));
  LF_ASSIGN_OR_RETURN(int64_t cameras, args.GetInt("cameras"));
  LF_ASSIGN_OR_RETURN(int64_t steps_min, args.GetInt("steps-min"));
  LF_ASSIGN_OR_RETURN(int64_t steps_max, args.GetInt("steps-max"));
  LF_ASSIGN_OR_RETURN(int64_t state_dim, args.GetInt("state-dim"));
  LF_ASSIGN_OR_RETURN(int64_t action_dim, args.GetInt("action-dim"));
  LF_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed"));
  LF_ASSIGN_OR_RETURN(int64_t quality, args.GetInt("quality"));
  LF_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads"));
  LF_RETURN_IF_ERROR(ParseSize(args.Get("size"), &o.width, &o.height));
  o.episodes = static_cast<int>(episodes);
  o.cameras = static_cast<int>(cameras);
  o.camera_names = SplitComma(args.Get("camera-names"));
  if (!o.camera_names.empty() && !args.Has("cameras"))
    o.cameras = static_cast<int>(o.camera_names.size());
  o.steps_min = static_cast<int>(steps_min);
  o.steps_max = static_cast<int>(steps_max);
  o.state_dim = static_cast<int>(state_dim);
  o.action_dim = static_cast<int>(action_dim);
  o.seed = static_cast<uint64_t>(seed);
  o.quality = static_cast<int>(quality);
  o.threads = static_cast<int>(threads);
  o.overwrite = args.Has("overwrite");
  o.progress = !args.Has("quiet");
  LF_ASSIGN_OR_RETURN(DemoDataResult r, GenerateDemoData(o));
  std::printf("wrote %lld episodes, %lld steps, %lld frames (%dx%d q%d) to %s/episodes in %.2f s\n",
              static_cast<long long>(r.episodes), static_cast<long long>(r.steps),
              static_cast<long long>(r.frames), o.width, o.height, o.quality, o.out_dir.c_str(),
              r.seconds);
  std::printf("JPEG total %.1f MB, mean %.1f KB per frame\n", r.jpeg_bytes / 1e6,
              r.frames ? r.jpeg_bytes / 1e3 / static_cast<double>(r.frames) : 0.0);
  return Status::Ok();
}

int RunDemoData(int argc, char** argv) {
  Status s = DemoDataMain(argc, argv);
  return s.ok() ? 0 : Fail("demo-data", s);
}

Status PackMain(int argc, char** argv) {
  Args args("pack", "--src DIR --out DB [options]");
  args.Flag("src", "", "episode folder (holding episodes/)")
      .Flag("out", "", "LMDB directory to create")
      .Flag("horizon", "16", "action chunk length (future steps per sample)")
      .Flag("tokenizer", "byte-v1", "tokenizer id")
      .Flag("threads", "0", "JPEG read/validate threads (0 = all cores)")
      .Flag("max-instruction-bytes", std::to_string(kDefaultMaxInstructionBytes),
            "longest instruction accepted (bytes); longer ones are refused")
      .Switch("overwrite", "replace an existing DB (atomically, when the new one is complete)")
      .Switch("quiet", "no progress bar");
  LF_RETURN_IF_ERROR(args.Parse(argc, argv));
  if (args.help_requested()) {
    std::printf("%s", args.Usage().c_str());
    return Status::Ok();
  }
  PackOptions o;
  o.src = args.Get("src");
  o.out = args.Get("out");
  if (o.src.empty() || o.out.empty())
    return InvalidArgumentError("--src and --out are required\n" + args.Usage());
  LF_ASSIGN_OR_RETURN(int64_t horizon, args.GetInt("horizon"));
  LF_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads"));
  LF_ASSIGN_OR_RETURN(int64_t max_instruction, args.GetInt("max-instruction-bytes"));
  o.horizon = static_cast<int>(horizon);
  o.threads = static_cast<int>(threads);
  o.max_instruction_bytes = static_cast<int>(max_instruction);
  o.tokenizer = args.Get("tokenizer");
  o.overwrite = args.Has("overwrite");
  o.progress = !args.Has("quiet");
  LF_ASSIGN_OR_RETURN(PackResult r, PackEpisodes(o));
  const Schema& s = r.schema;
  std::printf(
      "packed %lld samples from %lld episodes (%zu cameras, %dx%d, state %d, action %d x %d) into "
      "%s in %.2f s\n",
      static_cast<long long>(s.num_samples), static_cast<long long>(s.num_episodes),
      s.cameras.size(), s.image_width, s.image_height, s.state_dim, s.action_horizon, s.action_dim,
      o.out.c_str(), r.seconds);
  std::printf("%.1f MB written (JPEG %.1f MB); scan+check %.2f s, write %.2f s\n",
              r.bytes_written / 1e6, r.jpeg_bytes / 1e6, r.scan_seconds, r.write_seconds);
  return Status::Ok();
}

int RunPack(int argc, char** argv) {
  Status s = PackMain(argc, argv);
  return s.ok() ? 0 : Fail("pack", s);
}

Status InspectMain(int argc, char** argv) {
  Args args("inspect", "DB [--sample N] [--json]");
  args.Flag("sample", "0", "sample id to decode").Switch("json", "print JSON");
  LF_RETURN_IF_ERROR(args.Parse(argc, argv));
  if (args.help_requested()) {
    std::printf("%s", args.Usage().c_str());
    return Status::Ok();
  }
  if (args.positional().size() != 1)
    return InvalidArgumentError("expected one DB path\n" + args.Usage());
  LF_ASSIGN_OR_RETURN(int64_t sample, args.GetInt("sample"));
  const std::string& db = args.positional()[0];
  std::string out;
  if (args.Has("json")) {
    LF_ASSIGN_OR_RETURN(out, InspectJson(db, sample));
    out += "\n";
  } else {
    LF_ASSIGN_OR_RETURN(out, InspectText(db, sample));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return Status::Ok();
}

int RunInspect(int argc, char** argv) {
  Status s = InspectMain(argc, argv);
  return s.ok() ? 0 : Fail("inspect", s);
}

}  // namespace
LF_CLI_COMMAND("demo-data", "generate a synthetic robot dataset (episode-folder format)",
               RunDemoData);
LF_CLI_COMMAND("pack", "pack an episode folder into an LMDB dataset", RunPack);
LF_CLI_COMMAND("inspect", "print a dataset's schema, counts, sizes and one sample", RunInspect);
}  // namespace cli
}  // namespace loongforge
