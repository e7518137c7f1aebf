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

// Note [Strict numbers]
// ---------------------
// CLI11 converts numbers with strtoull/strtoll in base 0: "-1" wraps to 2^64 - 1 for an unsigned
// flag, a value past 64 bits saturates, "010" is octal and " 9" or "0x9" pass. Every numeric
// option of every command therefore gets StrictNumber (main.cc adds it by the option's type
// before parsing): the whole string is a decimal integer ("INT": optional sign; "UINT": no
// minus) that fits 64 bits, or a finite decimal number ("FLOAT"). CLI11's own conversion then
// refuses a value past a narrower type (int). A flag with a meaningful range adds
// CLI::Range(lo, hi) as well. Either failure is a usage error (exit 2) whose line names the
// flag and the value.
//
// The check of Note [Strict numbers] for CLI11 type name `type_name` ("INT", "UINT" or
// "FLOAT"); an empty validator (no check) for any other type.
CLI::Validator StrictNumber(const std::string& type_name);
// Adds StrictNumber to every numeric option of `app` and of all its subcommands.
void AddStrictNumbers(CLI::App& app);

// Flushes stdout and reports a write error of it (a full disk, a closed pipe): Ok, or the errno
// Status of the failed write ("write stdout: No space left on device"). Called once a command
// has printed everything, so that a lost output is never exit 0.
Status FlushStdout();

}  // namespace cli
}  // namespace loongforge

#define LF_CLI_COMMAND(setup) \
  static ::loongforge::cli::Registrar LF_CONCAT(_lf_cli_reg_, __LINE__)(setup)
