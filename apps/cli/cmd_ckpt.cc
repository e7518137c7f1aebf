// `loongforge ckpt ls|show|verify|restore|merge|gc|export DIR ...`: inspect and maintain a
// CheckpointVault directory.
#include <charconv>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.h"
#include "loongforge/ckpt.h"
#include "loongforge/progress.h"

namespace loongforge {
namespace cli {
namespace {
using ckpt::CheckpointVault;

// The options of every ckpt subcommand; each subcommand declares the ones it reads.
struct Args {
  std::optional<std::string> step;      // --step (default: latest), parsed by PickStep
  std::string out;                      // --out
  bool all = false;                     // verify --all
  bool dry_run = false;                 // gc --dry-run
  bool force = false;                   // restore / export --force
  bool model_only = false;              // export --model-only
  std::string strip_prefix = "model/";  // export --strip-prefix (with --model-only)
};

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

// --step must be a whole non-negative number ("", "1.5", "-1", "7x" are refused, not read as 0).
StatusOr<int64_t> PickStep(const Args& a, const CheckpointVault& v) {
  if (a.step) {
    const std::string& t = *a.step;
    int64_t step = -1;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), step);
    if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || step < 0)
      return InvalidArgumentError("--step must be a non-negative integer, got '" + t + "'");
    return step;
  }
  auto l = v.Latest();
  if (!l) return NotFoundError("no checkpoint in " + v.dir());
  return *l;
}

// The vault's progress callback (cumulative bytes done) advancing `bar`, which must outlive it.
ckpt::ProgressFn AdvanceBar(ProgressBar& bar) {
  return [&bar, last = int64_t{0}](int64_t done) mutable {
    bar.Add(done - last);
    last = done;
  };
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
    if (a.all) {
      LF_ASSIGN_OR_RETURN(steps, v->List());
    } else {
      LF_ASSIGN_OR_RETURN(int64_t s, PickStep(a, *v));
      steps.push_back(s);
    }
    for (int64_t s : steps) {
      LF_ASSIGN_OR_RETURN(int64_t total, TotalBytes(*v, s));
      ProgressBar bar("verify " + std::to_string(s), total);
      LF_RETURN_IF_ERROR(v->Verify(s, AdvanceBar(bar)));
      bar.Finish();
      std::printf("checkpoint %lld: OK (%s)\n", static_cast<long long>(s), Human(total).c_str());
    }
    return Status::Ok();
  }
  if (sub == "export" || sub == "restore") {
    LF_ASSIGN_OR_RETURN(int64_t step, PickStep(a, *v));
    LF_ASSIGN_OR_RETURN(int64_t total, TotalBytes(*v, step));
    // A model-only export writes part of the checkpoint: its size is not known up front.
    ProgressBar bar(sub + " " + std::to_string(step), a.model_only ? 0 : total);
    const ckpt::ProgressFn progress = AdvanceBar(bar);
    if (sub == "export") {
      ckpt::ExportOptions eo;
      eo.replace = a.force;
      eo.model_only = a.model_only;
      eo.strip_prefix = a.strip_prefix;
      LF_RETURN_IF_ERROR(v->ExportSafetensors(step, a.out, eo, progress));
      bar.Finish();
      std::printf("wrote %s\n", a.out.c_str());
      return Status::Ok();
    }
    LF_RETURN_IF_ERROR(v->RestoreToDirectory(step, a.out, a.force, progress));
    bar.Finish();
    LF_ASSIGN_OR_RETURN(auto infos, v->Describe(step));
    std::printf("restored %zu tensors of checkpoint %lld into %s\n", infos.size(),
                static_cast<long long>(step), a.out.c_str());
    return Status::Ok();
  }
  if (sub == "merge") {
    LF_ASSIGN_OR_RETURN(int64_t step, PickStep(a, *v));
    LF_ASSIGN_OR_RETURN(int64_t total, TotalBytes(*v, step));
    ProgressBar bar("merge " + std::to_string(step), total);
    LF_RETURN_IF_ERROR(v->Merge(step, AdvanceBar(bar)));
    bar.Finish();
    std::printf("checkpoint %lld is self-contained\n", static_cast<long long>(step));
    return Status::Ok();
  }
  if (sub == "gc") {
    LF_ASSIGN_OR_RETURN(auto st, v->Gc(a.dry_run));
    std::printf("%s %lld segments (%s); %lld live segments (%s)\n",
                a.dry_run ? "would delete" : "deleted", static_cast<long long>(st.segments_deleted),
                Human(st.bytes_freed).c_str(), static_cast<long long>(st.segments_live),
                Human(st.bytes_live).c_str());
    for (const auto& p : st.skipped)
      std::printf("left alone (not a vault segment): %s\n", p.c_str());
    return Status::Ok();
  }
  return InvalidArgumentError("unknown ckpt subcommand '" + sub + "'");
}

void AddCkpt(CLI::App& root) {
  CLI::App* ckpt = AddCommand(root, "ckpt", "inspect and maintain a checkpoint directory");
  struct Sub {
    const char* name;
    const char* help;
  };
  for (const Sub& sub : {
           Sub{"ls", "list checkpoints"},
           Sub{"show", "tensors of a checkpoint"},
           Sub{"verify", "re-read every chunk and check its checksum"},
           Sub{"restore",
               "write each tensor as OUT/<i>.bin, and OUT/tensors.json (OUT new or empty)"},
           Sub{"merge", "make a checkpoint self-contained (one segment)"},
           Sub{"gc", "delete segments no checkpoint references"},
           Sub{"export", "write a checkpoint as one .safetensors file"},
       }) {
    auto a = std::make_shared<Args>();
    auto dir = std::make_shared<std::string>();
    const std::string name = sub.name;
    CLI::App* app =
        AddCommand(*ckpt, name, sub.help, [name, a, dir] { return Run(name, *a, *dir); });
    app->add_option("DIR", *dir, "checkpoint directory")->required();
    if (name != "ls" && name != "gc")
      app->add_option("--step", a->step, "checkpoint step (default: latest)")
          ->check(CLI::Validator(
              [](std::string& t) {  // a usage error, refused before the vault is opened
                int64_t step = -1;
                const auto r = std::from_chars(t.data(), t.data() + t.size(), step);
                return t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || step < 0
                           ? "--step must be a non-negative integer, got '" + t + "'"
                           : std::string();
              },
              "STEP"));
    if (name == "restore") {
      app->add_option("--out", a->out, "output directory (new or empty)")->required();
      app->add_flag("--force", a->force, "replace the files restore writes in a non-empty --out");
    }
    if (name == "export") {
      app->add_option("--out", a->out, "output .safetensors file (new)")->required();
      app->add_flag("--force", a->force, "replace an existing regular file at --out");
      CLI::Option* model_only = app->add_flag("--model-only", a->model_only,
                                              "only the model's tensors, named as in its "
                                              "state_dict() (load_state_dict takes the file)");
      app->add_option("--strip-prefix", a->strip_prefix,
                      "with --model-only: the key path prefix that selects the model's tensors "
                      "and is removed from their names (default 'model/')")
          ->needs(model_only);
    }
    if (name == "verify") app->add_flag("--all", a->all, "verify every checkpoint");
    if (name == "gc") app->add_flag("--dry-run", a->dry_run, "only report");
  }
}

}  // namespace
LF_CLI_COMMAND(AddCkpt);
}  // namespace cli
}  // namespace loongforge
