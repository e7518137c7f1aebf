// Stands in for device_cuda.cu in builds without CUDA (CMake picks one of the two): every device
// function returns Unimplemented; host buffers are plain malloc.
#include <cstdlib>

#include "ckpt/device.h"

namespace loongforge {
namespace ckpt {
namespace internal {
namespace {
Status NoCuda() {
  return UnimplementedError("CheckpointVault: CUDA support is not compiled into this build");
}
}  // namespace

bool DeviceSupportCompiled() { return false; }
Status DeviceHashChunks(const void*, int64_t, int64_t, int, std::vector<Hash128>*) {
  return NoCuda();
}
Status DeviceToHost(void*, const void*, size_t, int) { return NoCuda(); }
Status HostToDevice(void*, const void*, size_t, int) { return NoCuda(); }
StatusOr<std::unique_ptr<DeviceSnapshot>> NewDeviceSnapshot(int) { return NoCuda(); }
StatusOr<std::unique_ptr<DeviceArena>> NewDeviceArena(int, int64_t) { return NoCuda(); }
Status DeviceMemInfo(int, int64_t*, int64_t*) { return NoCuda(); }
StatusOr<std::unique_ptr<StagingReader>> NewStagingReader(int, int64_t) { return NoCuda(); }
void* AllocHost(size_t n, bool) { return std::malloc(n ? n : 1); }
void FreeHost(void* p, bool) { std::free(p); }

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
