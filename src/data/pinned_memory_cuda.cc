// Page-locked host memory for the loader's batch buffers (builds with CUDA; the twin without CUDA
// is pinned_memory_cpu.cc). Declared in loader_pipeline.h.
#include <cuda_runtime_api.h>

#include "loader_pipeline.h"

namespace loongforge {
namespace data {
namespace internal {

bool PinnedAvailable() { return true; }

void* AllocPinned(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) return p;
  cudaGetLastError();  // no device or no memory: the caller falls back to pageable memory
  return nullptr;
}

void FreePinned(void* p) { cudaFreeHost(p); }

}  // namespace internal
}  // namespace data
}  // namespace loongforge
