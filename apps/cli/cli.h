// The `loongforge` command-line tool: command registry, CLI11 set-up, and the one place (besides
// the Python bindings) where a Status becomes an exit code and one clear line.
//
// Argument parsing is CLI11's (header-only, Debian libcli11-dev). Each module adds its commands in
// its own apps/cli/cmd_<module>.cc:
//
//   void AddPack(CLI::App& root) {
//     auto o = std::make_shared<data::PackOptions>();
//     CLI::App* app = AddCommand(root, "pack", "pack an episode folder", [o] { ... });
//     app->add_option("--src", o->src, "episode folder")->required();
//   }
//   LF_CLI_COMMAND(AddPack);
//
// Options bind to the library's Options structs, so a flag's default is the struct's default.
// main.cc parses, then runs the RunFn of the deepest subcommand on the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge {
namespace cli {

// What a command does once its arguments parsed; runs after every option is stored.
using RunFn = std::function<Status()>;
// Adds a command (and its subcommands) to the root app.
using SetupFn = void (*)(CLI::App& root);

std::vector<SetupFn>& Registry();

struct Registrar {
  explicit Registrar(SetupFn fn) { Registry().push_back(fn); }
};

// Adds subcommand `name` to `parent`. `run` is called when `name` is the deepest subcommand on the
// command line. A command with subcommands of its own (ckpt, mem, bench) passes no `run` and
// requires one of them.
CLI::App* AddCommand(CLI::App& parent, const std::string& name, const std::string& help,
                     RunFn run = nullptr);

// The RunFn of `app` (null if none was given).
const RunFn& RunOf(const CLI::App* app);

// Exit codes: 0 ok, 1 runtime failure, 2 usage / invalid argument, 3 not found, 4 data loss,
// 5 resource exhausted.
int ExitCode(const Status& s);
// Prints "loongforge <cmd>: error: <status>" to stderr and returns ExitCode(s).
int Fail(const std::string& cmd, const Status& s);

// Parses "640x480" into width and height.
Status ParseSize(const std::string& s, int* w, int* h);

}  // namespace cli
}  // namespace loongforge

#define LF_CLI_COMMAND(setup) \
  static ::loongforge::cli::Registrar LF_CONCAT(_lf_cli_reg_, __LINE__)(setup)
