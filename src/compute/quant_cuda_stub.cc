// Stands in for quant_cuda.cu in builds without CUDA (CMake picks one of the two): the CUDA
// kernels report Unavailable.
#include "compute/quant_kernels.h"

namespace loongforge {
namespace compute {
namespace internal {

bool CudaAvailable() { return false; }

Status QuantizeRowsE4m3Cuda(const void*, DType, int64_t, int64_t, uint8_t*, float*, void*) {
  return UnavailableError("e4m3 row quantization: this build of LoongForge has no CUDA");
}

}  // namespace internal
}  // namespace compute
}  // namespace loongforge
