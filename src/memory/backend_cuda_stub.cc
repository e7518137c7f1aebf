// Stands in for backend_cuda.cu in builds without CUDA (CMake picks one of the two): the CUDA
// factories report Unavailable.
#include "loongforge/memory.h"

namespace loongforge {
namespace mem {

StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaBackend(int device, size_t limit_bytes) {
  return UnavailableError("MemSculptor: this build has no CUDA (configure with nvcc present)");
}
StatusOr<std::unique_ptr<StreamFence>> CreateCudaFence(int device) {
  return UnavailableError("MemSculptor: this build has no CUDA (configure with nvcc present)");
}

}  // namespace mem
}  // namespace loongforge
