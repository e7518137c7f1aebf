// Device (CUDA) side of CheckpointVault behind a CPU-buildable interface. In CPU-only builds every
// function returns Unimplemented (device_nocuda.cc); with CUDA they live in device_hash.cu.
#pragma once

#include <cstdint>
#include <vector>

#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {
namespace internal {

bool DeviceSupportCompiled();
// XXH3-128 of each `chunk_bytes` chunk of the device buffer [dptr, dptr + nbytes) (the last chunk
// may be shorter), identical to HashBytes() on the same bytes. Synchronous.
Status DeviceHashChunks(const void* dptr, int64_t nbytes, int64_t chunk_bytes, int device,
                        std::vector<Hash128>* out);
Status DeviceToHost(void* host_dst, const void* dev_src, size_t n, int device);
Status HostToDevice(void* dev_dst, const void* host_src, size_t n, int device);
// Page-locked host memory for staging (falls back to malloc in CPU builds).
void* AllocHost(size_t n, bool pinned);
void FreeHost(void* p, bool pinned);

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
