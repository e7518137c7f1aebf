// Runs the real `loongforge` binary for the CLI tests of every module (PackCli, MemCli, CliArgs,
// ...). LF_TEST_CLI, its path, is defined for the test binary by apps/cli/CMakeLists.txt.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace loongforge {
namespace testing {

struct CliResult {
  int exit_code = -1;  // -1: the shell could not run it, or it died on a signal
  std::string out;     // stdout
  std::string err;     // stderr
  std::string output;  // stdout then stderr, for checks that do not care which
};

// Runs `loongforge ARGS` through the shell (ARGS is not quoted) and waits for it.
inline CliResult RunCli(const std::string& args) {
  namespace fs = std::filesystem;
  static int n = 0;
  const fs::path err_file =
      fs::temp_directory_path() /
      ("lf_cli_err_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  std::string cmd = std::string(LF_TEST_CLI) + " " + args + " 2>" + err_file.string();
  CliResult r;
  char buf[4096];
  size_t k;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, k);
    int st = ::pclose(p);
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  if (FILE* e = std::fopen(err_file.c_str(), "r")) {
    while ((k = std::fread(buf, 1, sizeof(buf), e)) > 0) r.err.append(buf, k);
    std::fclose(e);
  }
  std::error_code ec;
  fs::remove(err_file, ec);
  r.output = r.out + r.err;
  return r;
}

}  // namespace testing
}  // namespace loongforge
