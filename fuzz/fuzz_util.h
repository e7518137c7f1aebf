// Helpers shared by the libFuzzer targets: one fixed scratch directory per process (removed at
// exit), and whole-file writes into it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace lf_fuzz {

// /tmp/lf_fuzz_<name>_<pid>, created on first use and removed when the process exits normally.
inline const std::string& ScratchDir(const char* name) {
  static const std::string dir = [name] {
    const char* base = std::getenv("TMPDIR");
    std::string d = std::string(base && *base ? base : "/tmp") + "/lf_fuzz_" + name + "_" +
                    std::to_string(static_cast<long>(getpid()));
    std::filesystem::create_directories(d);
    static std::string to_remove = d;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(to_remove, ec);
    });
    return d;
  }();
  return dir;
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace lf_fuzz
