// What this build is: version, git hash, and which optional GPU features were compiled in, plus
// what the runtime finds (driver and device count). Printed by `loongforge --version` and returned
// by `loongforge.build_info()`.
#pragma once

#include <string>

namespace loongforge {

struct BuildInfo {
  std::string version;
  std::string git_hash;
  std::string build_type;
  std::string compiler;
  bool cuda = false;         // CUDA code compiled in
  std::string cuda_version;  // toolkit version at build time
  std::string cuda_archs;    // e.g. "80;90"
  bool nvjpeg = false;
  bool cufile = false;
  bool nccl = false;
  int cuda_runtime_version = 0;  // 0 when CUDA is off
  int cuda_driver_version = 0;   // 0 when no driver is present
  int cuda_device_count = 0;     // devices visible now
  std::string ToText() const;
  std::string ToJson() const;
};

BuildInfo GetBuildInfo();

namespace internal {
struct CompileTimeBuildInfo {
  const char* version;
  const char* git_hash;
  const char* build_type;
  const char* compiler;
  bool cuda;
  const char* cuda_version;
  const char* cuda_archs;
  bool nvjpeg, cufile, nccl;
};
extern const CompileTimeBuildInfo kCompileTimeBuildInfo;
}  // namespace internal
}  // namespace loongforge
