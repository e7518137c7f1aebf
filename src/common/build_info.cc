#include "loongforge/build_info.h"

#include <sstream>

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loongforge {

BuildInfo GetBuildInfo() {
  const auto& c = internal::kCompileTimeBuildInfo;
  // CompileTimeBuildInfo lists BuildInfo's compile-time fields, in BuildInfo's order.
  BuildInfo b{c.version,      c.git_hash,   c.build_type, c.compiler, c.cuda,
              c.cuda_version, c.cuda_archs, c.nvjpeg,     c.cufile,   c.nccl};
#ifdef LOONGFORGE_WITH_CUDA
  cudaRuntimeGetVersion(&b.cuda_runtime_version);
  if (cudaDriverGetVersion(&b.cuda_driver_version) != cudaSuccess) b.cuda_driver_version = 0;
  if (cudaGetDeviceCount(&b.cuda_device_count) != cudaSuccess) {
    b.cuda_device_count = 0;
    cudaGetLastError();  // clear the error left by a machine without a driver
  }
#endif
  return b;
}

static const char* YesNo(bool v) { return v ? "yes" : "no"; }

std::string BuildInfo::ToText() const {
  std::ostringstream os;
  os << "loongforge " << version << " (git " << git_hash << ", " << build_type << ", " << compiler
     << ")\n";
  os << "  CUDA:    " << YesNo(cuda);
  if (cuda) {
    os << " (toolkit " << cuda_version << ", archs " << cuda_archs << ", runtime "
       << cuda_runtime_version << ", driver " << cuda_driver_version << ", devices "
       << cuda_device_count << ")";
  }
  os << "\n  nvJPEG:  " << YesNo(nvjpeg) << "\n  cuFile:  " << YesNo(cufile)
     << "\n  NCCL:    " << YesNo(nccl) << "\n";
  return os.str();
}

std::string BuildInfo::ToJson() const {
  std::ostringstream os;
  auto b = [](bool v) { return v ? "true" : "false"; };
  os << "{\"version\": \"" << version << "\", \"git_hash\": \"" << git_hash
     << "\", \"build_type\": \"" << build_type << "\", \"compiler\": \"" << compiler
     << "\", \"cuda\": " << b(cuda) << ", \"cuda_version\": \"" << cuda_version
     << "\", \"cuda_archs\": \"" << cuda_archs << "\", \"nvjpeg\": " << b(nvjpeg)
     << ", \"cufile\": " << b(cufile) << ", \"nccl\": " << b(nccl)
     << ", \"cuda_runtime_version\": " << cuda_runtime_version
     << ", \"cuda_driver_version\": " << cuda_driver_version
     << ", \"cuda_device_count\": " << cuda_device_count << "}";
  return os.str();
}

}  // namespace loongforge
