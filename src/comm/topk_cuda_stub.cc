// Stand-ins for the CUDA compression kernels in a build without CUDA: they report Unavailable.
#ifndef LOONGFORGE_WITH_CUDA
#include "loongforge/comm.h"

namespace loongforge {

bool CommCudaAvailable() { return false; }

Status TopKErrorFeedbackCuda(const void*, GradDType, float*, int64_t, int64_t, void*, GradDType,
                             int32_t*, void*) {
  return UnavailableError("top-k: this build of LoongForge has no CUDA");
}

Status ScatterAddCuda(const void*, GradDType, const int32_t*, int64_t, int64_t, void*, GradDType,
                      int64_t, float, bool, void*) {
  return UnavailableError("scatter-add: this build of LoongForge has no CUDA");
}

}  // namespace loongforge
#endif  // LOONGFORGE_WITH_CUDA
