// Stands in for topk_cuda.cu in builds without CUDA (CMake picks one of the two): the CUDA
// compression kernels report Unavailable.
#include "comm/topk_kernels.h"

namespace loongforge {
namespace comm {
namespace internal {

bool CudaAvailable() { return false; }

Status TopKErrorFeedbackCuda(const void*, DType, float*, int64_t, int64_t, void*, DType, int32_t*,
                             void*) {
  return UnavailableError("top-k: this build of LoongForge has no CUDA");
}

Status ScatterAddCuda(const void*, DType, const int32_t*, int64_t, int64_t, void*, DType, int64_t,
                      float, bool, void*) {
  return UnavailableError("scatter-add: this build of LoongForge has no CUDA");
}

}  // namespace internal
}  // namespace comm
}  // namespace loongforge
