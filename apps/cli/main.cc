// Entry point of the `loongforge` CLI: dispatches to registered subcommands.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cli.h"
#include "loongforge/build_info.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace cli {

std::map<std::string, Command>& Registry() {
  static std::map<std::string, Command> r;
  return r;
}

Registrar::Registrar(const char* name, const char* help, CommandFn fn) {
  Registry()[name] = Command{name, help, fn};
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
  std::fprintf(stderr, "loongforge %s: error: %s\n", cmd.c_str(), s.ToString().c_str());
  return ExitCode(s);
}

Args& Args::Flag(const std::string& name, const std::string& def, const std::string& help) {
  specs_[name] = Spec{def, help, false};
  order_.push_back(name);
  return *this;
}

Args& Args::Switch(const std::string& name, const std::string& help) {
  specs_[name] = Spec{"", help, true};
  order_.push_back(name);
  return *this;
}

Status Args::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_inline = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end())
      return InvalidArgumentError("unknown option --" + name + "\n" + Usage());
    if (it->second.is_switch) {
      values_[name] = "1";
    } else {
      if (!has_inline) {
        if (i + 1 >= argc) return InvalidArgumentError("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    }
    given_.insert(name);
  }
  return Status::Ok();
}

std::string Args::Usage() const {
  std::string u = "usage: loongforge " + cmd_ + " " + usage_ + "\n";
  for (const auto& n : order_) {
    const Spec& s = specs_.at(n);
    u += "  --" + n + (s.is_switch ? "" : " V") + "  " + s.help;
    if (!s.is_switch && !s.def.empty()) u += " (default " + s.def + ")";
    u += "\n";
  }
  return u;
}

std::string Args::Get(const std::string& name) const {
  auto v = values_.find(name);
  if (v != values_.end()) return v->second;
  auto s = specs_.find(name);
  LF_CHECK(s != specs_.end()) << "undeclared option --" << name;
  return s->second.def;
}

bool Args::Has(const std::string& name) const { return given_.count(name) > 0; }

StatusOr<int64_t> Args::GetInt(const std::string& name) const {
  std::string v = Get(name);
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0')
    return InvalidArgumentError("--" + name + " expects an integer, got '" + v + "'");
  return static_cast<int64_t>(x);
}

StatusOr<double> Args::GetDouble(const std::string& name) const {
  std::string v = Get(name);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0')
    return InvalidArgumentError("--" + name + " expects a number, got '" + v + "'");
  return x;
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

}  // namespace cli
}  // namespace loongforge

static void PrintUsage() {
  std::printf("usage: loongforge <command> [options]   (loongforge <command> --help for more)\n\n");
  for (const auto& [name, c] : loongforge::cli::Registry())
    std::printf("  %-12s %s\n", name.c_str(), c.help.c_str());
  std::printf(
      "\n  --version    build information (version, git hash, CUDA, nvJPEG, cuFile, NCCL)\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    bool json = argc > 2 && !std::strcmp(argv[2], "--json");
    auto bi = loongforge::GetBuildInfo();
    std::printf("%s", json ? (bi.ToJson() + "\n").c_str() : bi.ToText().c_str());
    return 0;
  }
  auto& reg = loongforge::cli::Registry();
  auto it = reg.find(argv[1]);
  if (it == reg.end()) {
    std::fprintf(stderr, "loongforge: unknown command '%s'\n\n", argv[1]);
    PrintUsage();
    return 2;
  }
  return it->second.fn(argc - 1, argv + 1);
}
