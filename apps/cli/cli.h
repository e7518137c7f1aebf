// The `loongforge` command-line tool: subcommand registry, argument parsing and the one place
// (besides the Python bindings) where a Status becomes an exit code and one clear line.
//
// Each module adds its subcommands in its own apps/cli/cmd_<module>.cc with
//   LF_CLI_COMMAND("pack", "pack an episode folder into an LMDB", RunPack);
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge {
namespace cli {

using CommandFn = int (*)(int argc, char** argv);  // argv[0] is the subcommand name

struct Command {
  std::string name, help;
  CommandFn fn;
};

std::map<std::string, Command>& Registry();

struct Registrar {
  Registrar(const char* name, const char* help, CommandFn fn);
};

// Exit codes: 0 ok, 1 runtime failure, 2 usage / invalid argument, 3 not found, 4 data loss,
// 5 resource exhausted.
int ExitCode(const Status& s);
// Prints "loongforge <cmd>: error: <status>" to stderr and returns ExitCode(s).
int Fail(const std::string& cmd, const Status& s);

// A small --flag value parser. Flags are declared before Parse(); unknown flags are an error.
class Args {
 public:
  Args(std::string cmd, std::string usage) : cmd_(std::move(cmd)), usage_(std::move(usage)) {}
  // Declares a flag that takes a value, with a default ("" = none) and help.
  Args& Flag(const std::string& name, const std::string& def, const std::string& help);
  // Declares a boolean switch (present = true).
  Args& Switch(const std::string& name, const std::string& help);
  // Parses argv[1..]; positional arguments are collected in order. --help prints usage.
  Status Parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  std::string Usage() const;

  std::string Get(const std::string& name) const;
  bool Has(const std::string& name) const;  // switch present, or flag given explicitly
  StatusOr<int64_t> GetInt(const std::string& name) const;
  StatusOr<double> GetDouble(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  struct Spec {
    std::string def, help;
    bool is_switch;
  };
  std::string cmd_, usage_;
  std::map<std::string, Spec> specs_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> values_;
  std::set<std::string> given_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// Parses "640x480" into width and height.
Status ParseSize(const std::string& s, int* w, int* h);

}  // namespace cli
}  // namespace loongforge

#define LF_CLI_COMMAND(name, help, fn) \
  static ::loongforge::cli::Registrar LF_CONCAT(_lf_cli_reg_, __LINE__)(name, help, fn)
