// Builds without CUDA cannot pin host memory: batch buffers are pageable (pinned_memory_cuda.cc
// is the CUDA twin). Declared in loader_pipeline.h.
#include "loader_pipeline.h"

namespace loongforge {
namespace data {
namespace internal {

bool PinnedAvailable() { return false; }
void* AllocPinned(size_t bytes) { return nullptr; }
void FreePinned(void* p) {}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
