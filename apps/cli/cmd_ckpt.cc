// `loongforge ckpt ls|show|verify|restore|merge|gc|export DIR ...`: inspect and maintain a
// CheckpointVault directory.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "loongforge/ckpt.h"
#include "loongforge/progress.h"

namespace loongforge {
namespace cli {
namespace {
using ckpt::CheckpointVault;

constexpr const char* kUsage =
    "ckpt <ls|show|verify|restore|merge|gc|export> DIR [options]\n"
    "  ls DIR                      list checkpoints\n"
    "  show DIR [--step N]         tensors of a checkpoint (default: latest)\n"
    "  verify DIR [--step N|--all] re-read every chunk and check its checksum\n"
    "  restore DIR --out OUTDIR [--step N] [--force]   write each tensor as OUTDIR/<i>.bin +\n"
    "                              tensors.json (OUTDIR new or empty; --force replaces those "
    "files)\n"
    "  merge DIR [--step N]        make a checkpoint self-contained (one segment)\n"
    "  gc DIR [--dry-run]          delete segments no checkpoint references\n"
    "  export DIR --out FILE.safetensors [--step N]";

std::string Human(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 30))
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  else if (b >= (1 << 20))
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  else if (b >= 1024)
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(b));
  return buf;
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

StatusOr<int64_t> PickStep(const Args& a, const CheckpointVault& v) {
  if (a.Has("step")) return a.GetInt("step");
  auto l = v.Latest();
  if (!l) return NotFoundError("no checkpoint in " + v.dir());
  return *l;
}

StatusOr<int64_t> TotalBytes(const CheckpointVault& v, int64_t step) {
  LF_ASSIGN_OR_RETURN(auto s, v.Summary(step));
  return s.bytes_total;
}

Status Run(const std::string& sub, const Args& a, const std::string& dir) {
  const bool writes = sub == "merge" || sub == "gc";
  ckpt::VaultOptions o;
  o.read_only = !writes;
  LF_ASSIGN_OR_RETURN(auto v, CheckpointVault::Open(dir, o));
  if (sub == "ls") {
    LF_ASSIGN_OR_RETURN(auto steps, v->List());
    std::printf("%12s %12s %8s %12s %12s %9s  %s\n", "step", "parent", "tensors", "total", "own",
                "segments", "created");
    for (int64_t s : steps) {
      auto sum = v->Summary(s);
      if (!sum.ok()) {  // list every step; a damaged one is marked, not the end of the list
        std::printf("%12lld  DAMAGED: %s\n", static_cast<long long>(s),
                    sum.status().ToString().c_str());
        continue;
      }
      const auto& m = *sum;
      std::time_t t = static_cast<std::time_t>(m.created_unix);
      char when[32];
      std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
      std::printf("%12lld %12lld %8lld %12s %12s %9lld  %s\n", static_cast<long long>(s),
                  static_cast<long long>(m.parent), static_cast<long long>(m.num_tensors),
                  Human(m.bytes_total).c_str(), Human(m.bytes_own).c_str(),
                  static_cast<long long>(m.num_segments), when);
    }
    return Status::Ok();
  }
  if (sub == "show") {
    LF_ASSIGN_OR_RETURN(int64_t step, PickStep(a, *v));
    LF_ASSIGN_OR_RETURN(auto infos, v->Describe(step));
    std::printf("checkpoint %lld: %zu tensors\n", static_cast<long long>(step), infos.size());
    for (const auto& i : infos)
      std::printf("  %-50s %-5s %-20s %12s %6lld chunks\n", i.name.c_str(), i.dtype.c_str(),
                  ShapeStr(i.shape).c_str(), Human(i.nbytes).c_str(),
                  static_cast<long long>(i.num_chunks));
    return Status::Ok();
  }
  if (sub == "verify") {
    std::vector<int64_t> steps;
    if (a.Has("all")) {
      LF_ASSIGN_OR_RETURN(steps, v->List());
    } else {
      LF_ASSIGN_OR_RETURN(int64_t s, PickStep(a, *v));
      steps.push_back(s);
    }
    for (int64_t s : steps) {
      LF_ASSIGN_OR_RETURN(int64_t total, TotalBytes(*v, s));
      ProgressBar bar("verify " + std::to_string(s), total);
      int64_t last = 0;
      LF_RETURN_IF_ERROR(v->Verify(s, [&](int64_t done) {
        bar.Add(done - last);
        last = done;
      }));
      bar.Finish();
      std::printf("checkpoint %lld: OK (%s)\n", static_cast<long long>(s), Human(total).c_str());
    }
    return Status::Ok();
  }
  if (sub == "export" || sub == "restore") {
    if (!a.Has("out")) return InvalidArgumentError("--out is required");
    LF_ASSIGN_OR_RETURN(int64_t step, PickStep(a, *v));
    LF_ASSIGN_OR_RETURN(int64_t total, TotalBytes(*v, step));
    ProgressBar bar(sub + " " + std::to_string(step), total);
    int64_t last = 0;
    auto progress = [&](int64_t done) {
      bar.Add(done - last);
      last = done;
    };
    if (sub == "export") {
      LF_RETURN_IF_ERROR(v->ExportSafetensors(step, a.Get("out"), progress));
      bar.Finish();
      std::printf("wrote %s\n", a.Get("out").c_str());
      return Status::Ok();
    }
    const std::string out = a.Get("out");
    LF_RETURN_IF_ERROR(v->RestoreToDirectory(step, out, a.Has("force"), progress));
    bar.Finish();
    LF_ASSIGN_OR_RETURN(auto infos, v->Describe(step));
    std::printf("restored %zu tensors of checkpoint %lld into %s\n", infos.size(),
                static_cast<long long>(step), out.c_str());
    return Status::Ok();
  }
  if (sub == "merge") {
    LF_ASSIGN_OR_RETURN(int64_t step, PickStep(a, *v));
    LF_ASSIGN_OR_RETURN(int64_t total, TotalBytes(*v, step));
    ProgressBar bar("merge " + std::to_string(step), total);
    int64_t last = 0;
    LF_RETURN_IF_ERROR(v->Merge(step, [&](int64_t done) {
      bar.Add(done - last);
      last = done;
    }));
    bar.Finish();
    std::printf("checkpoint %lld is self-contained\n", static_cast<long long>(step));
    return Status::Ok();
  }
  if (sub == "gc") {
    LF_ASSIGN_OR_RETURN(auto st, v->Gc(a.Has("dry-run")));
    std::printf("%s %lld segments (%s); %lld live segments (%s)\n",
                a.Has("dry-run") ? "would delete" : "deleted",
                static_cast<long long>(st.segments_deleted), Human(st.bytes_freed).c_str(),
                static_cast<long long>(st.segments_live), Human(st.bytes_live).c_str());
    for (const auto& p : st.skipped)
      std::printf("left alone (not a vault segment): %s\n", p.c_str());
    return Status::Ok();
  }
  return InvalidArgumentError("unknown ckpt subcommand '" + sub + "'");
}

int RunCkpt(int argc, char** argv) {
  Args args("ckpt", kUsage);
  args.Flag("step", "", "checkpoint step (default: latest)");
  args.Flag("out", "", "output file (export) or directory (restore)");
  args.Switch("all", "verify every checkpoint");
  args.Switch("dry-run", "gc: only report");
  args.Switch("force", "restore: replace the files restore writes in a non-empty --out");
  if (Status s = args.Parse(argc, argv); !s.ok()) return Fail("ckpt", s);
  if (args.help_requested()) {
    std::printf("%s", args.Usage().c_str());
    return 0;
  }
  if (args.positional().size() != 2)
    return Fail("ckpt", InvalidArgumentError(std::string("usage: loongforge ") + kUsage));
  Status s = Run(args.positional()[0], args, args.positional()[1]);
  if (!s.ok()) return Fail("ckpt " + args.positional()[0], s);
  return 0;
}

}  // namespace
LF_CLI_COMMAND("ckpt", "inspect and maintain checkpoints: ls show verify restore merge gc export",
               RunCkpt);
}  // namespace cli
}  // namespace loongforge
