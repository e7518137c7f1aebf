// Entry point of the `loongforge` CLI: CLI11 parses, then the deepest subcommand on the command
// line runs; its Status becomes the exit code (cli.h). Any C++ exception that escapes a command
// becomes one error line and an exit code too, and a failed write of stdout is an error.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <system_error>

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

CLI::Validator StrictNumber(const std::string& type_name) {
  if (type_name != "INT" && type_name != "UINT" && type_name != "FLOAT") return CLI::Validator();
  return CLI::Validator(
      [type_name](std::string& v) -> std::string {
        const char* b = v.data();
        const char* e = b + v.size();
        if (type_name == "FLOAT") {
          // strtod accepts leading spaces, hex, "inf" and "nan": only plain decimal digits,
          // sign, point and exponent are allowed through to it.
          bool ok = !v.empty() && v.find_first_not_of("0123456789+-.eE") == std::string::npos;
          char* end = nullptr;
          errno = 0;
          const double d = ok ? std::strtod(b, &end) : 0;
          if (!ok || end != e || errno == ERANGE || !std::isfinite(d))
            return "'" + v + "' is not a finite decimal number";
          return std::string();
        }
        const char* digits = b + (b != e && (*b == '+' || (*b == '-' && type_name == "INT")));
        if (digits == e ||
            std::string(digits, e).find_first_not_of("0123456789") != std::string::npos)
          return "'" + v + "' is not " +
                 (type_name == "UINT" ? "a non-negative decimal integer" : "a decimal integer");
        if (*digits == '0' && digits + 1 != e)  // CLI11 would read it as octal
          return "'" + v + "' has a leading zero";
        std::from_chars_result r;
        if (type_name == "UINT") {
          uint64_t u = 0;
          r = std::from_chars(digits, e, u);
        } else {
          int64_t i = 0;
          r = std::from_chars(*b == '+' ? b + 1 : b, e, i);
        }
        if (r.ec == std::errc::result_out_of_range || r.ptr != e)
          return "'" + v + "' is out of range (" +
                 (type_name == "UINT"
                      ? "0.." + std::to_string(UINT64_MAX)
                      : std::to_string(INT64_MIN) + ".." + std::to_string(INT64_MAX)) +
                 ")";
        return std::string();
      },
      "", "STRICT_" + type_name);
}

void AddStrictNumbers(CLI::App& app) {
  for (CLI::Option* o : app.get_options([](CLI::Option*) { return true; })) {
    CLI::Validator v = StrictNumber(o->get_type_name());
    if (!v.get_name().empty()) o->check(v);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) AddStrictNumbers(*sub);
}

Status FlushStdout() {
  errno = 0;
  const int rc = std::fflush(stdout);
  const int err = errno;
  if (rc != 0 || std::ferror(stdout)) return ErrnoToStatus(err != 0 ? err : EIO, "write stdout");
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

// Parses and runs the command line; everything main() does but catching what escapes.
int Main(CLI::App& app, int argc, char** argv) {
  bool version = false, json = false;
  app.add_flag("--version", version,
               "build information (version, git hash, CUDA, nvJPEG, cuFile, NCCL)");
  app.add_flag("--json", json, "with --version: print JSON");
  for (SetupFn setup : Registry()) setup(app);
  AddStrictNumbers(app);  // Note [Strict numbers] (cli.h)
  app.footer("loongforge <command> --help shows a command's options.");  // the root's only
  if (argc < 2) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  if (argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      return Fail("", InvalidArgumentError(std::string("unknown command '") + argv[1] +
                                           "' (see loongforge --help)"));
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    const int rc = app.exit(e);  // prints the help of the deepest subcommand given; exit 0
    Status out = FlushStdout();
    return out.ok() ? rc : Fail(CommandPath(Deepest(&app)), out);
  } catch (const CLI::ParseError& e) {
    // Every parse error is a usage error: exit 2 and one line that says where help is.
    std::string cmd = CommandPath(Deepest(&app));
    std::string help = "loongforge " + (cmd.empty() ? "" : cmd + " ") + "--help";
    return Fail(cmd, InvalidArgumentError(std::string(e.what()) + " (see " + help + ")"));
  }
  if (version) {
    auto bi = GetBuildInfo();
    std::printf("%s", json ? (bi.ToJson() + "\n").c_str() : bi.ToText().c_str());
    Status out = FlushStdout();
    return out.ok() ? 0 : Fail("", out);
  }
  CLI::App* leaf = Deepest(&app);
  const RunFn& run = RunOf(leaf);
  if (!run) {  // only options of the root, e.g. a lone --json
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  Status s = run();
  if (!s.ok()) return Fail(CommandPath(leaf), s);
  Status out = FlushStdout();
  return out.ok() ? 0 : Fail(CommandPath(leaf), out);
}

}  // namespace
}  // namespace cli
}  // namespace loongforge

int main(int argc, char** argv) {
  using namespace loongforge::cli;
  CLI::App app("LoongForge: datasets, loader benchmark, checkpoints and memory plans.",
               "loongforge");
  // A C++ exception a command did not turn into a Status (an allocation or thread creation that
  // failed, a library's logic_error) is still one line and an exit code, not std::terminate.
  auto fail = [&app](const loongforge::Status& s) { return Fail(CommandPath(Deepest(&app)), s); };
  try {
    return Main(app, argc, argv);
  } catch (const std::bad_alloc&) {
    return fail(loongforge::ResourceExhaustedError("out of memory (std::bad_alloc)"));
  } catch (const std::system_error& e) {
    const int err = e.code().category() == std::generic_category() ||
                            e.code().category() == std::system_category()
                        ? e.code().value()
                        : 0;
    // The code follows the errno (EAGAIN from thread creation: Unavailable); the message is
    // the exception's own, which already says what strerror would.
    const loongforge::StatusCode code =
        err != 0 ? loongforge::ErrnoToStatus(err, "").code() : loongforge::StatusCode::kInternal;
    return fail(loongforge::Status(code, std::string("system error: ") + e.what()));
  } catch (const std::exception& e) {
    return fail(loongforge::InternalError(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return fail(loongforge::InternalError("unexpected exception of unknown type"));
  }
}
