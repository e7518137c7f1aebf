// Entry point of the `loongforge` CLI: CLI11 parses, then the deepest subcommand on the command
// line runs; its Status becomes the exit code (cli.h).
#include <cstdio>
#include <map>
#include <string>

#include "cli.h"
#include "loongforge/build_info.h"

namespace loongforge {
namespace cli {

std::vector<SetupFn>& Registry() {
  static std::vector<SetupFn> r;
  return r;
}

namespace {
std::map<const CLI::App*, RunFn>& Runs() {
  static std::map<const CLI::App*, RunFn> r;
  return r;
}
}  // namespace

CLI::App* AddCommand(CLI::App& parent, const std::string& name, const std::string& help,
                     RunFn run) {
  CLI::App* app = parent.add_subcommand(name, help);
  if (run)
    Runs()[app] = std::move(run);
  else
    app->require_subcommand(1);
  return app;
}

const RunFn& RunOf(const CLI::App* app) {
  static const RunFn kNone;
  auto it = Runs().find(app);
  return it == Runs().end() ? kNone : it->second;
}

int ExitCode(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 2;
    case StatusCode::kNotFound:
      return 3;
    case StatusCode::kDataLoss:
      return 4;
    case StatusCode::kResourceExhausted:
      return 5;
    default:
      return 1;
  }
}

int Fail(const std::string& cmd, const Status& s) {
  std::fprintf(stderr, "loongforge%s%s: error: %s\n", cmd.empty() ? "" : " ", cmd.c_str(),
               s.ToString().c_str());
  return ExitCode(s);
}

Status ParseSize(const std::string& s, int* w, int* h) {
  int a = 0, b = 0;
  char x = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &a, &x, &b, &extra) != 3 || (x != 'x' && x != 'X') ||
      a <= 0 || b <= 0)
    return InvalidArgumentError("expected a size like 640x480, got '" + s + "'");
  *w = a;
  *h = b;
  return Status::Ok();
}

namespace {

// The deepest subcommand selected so far (the root when none).
CLI::App* Deepest(CLI::App* app) {
  while (!app->get_subcommands().empty()) app = app->get_subcommands().back();
  return app;
}

// "ckpt ls" for the subcommand ls of ckpt; "" for the root.
std::string CommandPath(const CLI::App* app) {
  std::string path;
  for (; app && app->get_parent(); app = app->get_parent())
    path = app->get_name() + (path.empty() ? "" : " " + path);
  return path;
}

}  // namespace
}  // namespace cli
}  // namespace loongforge

int main(int argc, char** argv) {
  using namespace loongforge::cli;
  CLI::App app("LoongForge: datasets, loader benchmark, checkpoints and memory plans.",
               "loongforge");
  bool version = false, json = false;
  app.add_flag("--version", version,
               "build information (version, git hash, CUDA, nvJPEG, cuFile, NCCL)");
  app.add_flag("--json", json, "with --version: print JSON");
  for (SetupFn setup : Registry()) setup(app);
  app.footer("loongforge <command> --help shows a command's options.");  // the root's only
  if (argc < 2) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  if (argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      return Fail("", loongforge::InvalidArgumentError(std::string("unknown command '") + argv[1] +
                                                       "' (see loongforge --help)"));
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints the help of the deepest subcommand given; exit 0
  } catch (const CLI::ParseError& e) {
    // Every parse error is a usage error: exit 2 and one line that says where help is.
    std::string cmd = CommandPath(Deepest(&app));
    std::string help = "loongforge " + (cmd.empty() ? "" : cmd + " ") + "--help";
    return Fail(cmd,
                loongforge::InvalidArgumentError(std::string(e.what()) + " (see " + help + ")"));
  }
  if (version) {
    auto bi = loongforge::GetBuildInfo();
    std::printf("%s", json ? (bi.ToJson() + "\n").c_str() : bi.ToText().c_str());
    return 0;
  }
  CLI::App* leaf = Deepest(&app);
  const RunFn& run = RunOf(leaf);
  if (!run) {  // only options of the root, e.g. a lone --json
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  loongforge::Status s = run();
  return s.ok() ? 0 : Fail(CommandPath(leaf), s);
}
