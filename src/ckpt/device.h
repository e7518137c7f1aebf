// Device (CUDA) side of CheckpointVault behind a CPU-buildable interface. In CPU-only builds every
// function returns Unimplemented (device_nocuda.cc); with CUDA they live in device_hash.cu.
#pragma once

#include <cstdint>
#include <memory>
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
// Note [Device snapshot]
// Save() snapshots the device tensors of one CUDA device in a batch, on a stream the vault owns:
//   Begin: an event recorded on each producer stream (the caller's current stream, or the legacy
//     default stream) is waited on by the vault's stream, so hashing and copies read the tensors
//     only after the kernels that produce them, without blocking the host or other streams;
//   EnqueueHash per tensor: the hash kernel writes 16 bytes per chunk into one device table;
//   FetchHashes: one device-to-host copy of the whole table into pinned memory, then a bounded
//     wait (the host decides which chunks changed meanwhile for its CPU tensors);
//   EnqueueCopy per run of changed chunks: cudaMemcpyAsync into the pinned staging arena;
//   Finish: an event after the last copy, waited on with a timeout. Save() returns only after it,
//     because the contract lets the caller overwrite its tensors as soon as Save() returns.
// One DeviceSnapshot per device, reused across saves (stream, events, tables grow, never shrink).
// Not thread-safe: used by Save() under the vault's API mutex.
class DeviceSnapshot {
 public:
  virtual ~DeviceSnapshot() = default;
  // Starts a snapshot of up to `num_slots` chunks in `num_tensors` tensors, ordered after the
  // work queued so far on each of `producer_streams` (cudaStream_t values; nullptr = legacy
  // default stream).
  virtual Status Begin(int64_t num_slots, int64_t num_tensors,
                       const std::vector<void*>& producer_streams) = 0;
  // Enqueues XXH3-128 of every `chunk_bytes` chunk of [dptr, dptr + nbytes) into table slots
  // [first_slot, first_slot + chunks).
  virtual Status EnqueueHash(const void* dptr, int64_t nbytes, int64_t chunk_bytes,
                             int64_t first_slot) = 0;
  // Copies the table to the host in one transfer and waits for it (DeadlineExceeded after
  // timeout_ms); out[i] is the hash of slot i, identical to HashBytes() of the same bytes.
  virtual Status FetchHashes(std::vector<Hash128>* out, int64_t timeout_ms) = 0;
  // Enqueues a device-to-host copy (host_dst should be pinned for an asynchronous transfer).
  virtual Status EnqueueCopy(void* host_dst, const void* dev_src, size_t n) = 0;
  // Waits until every enqueued copy completed (DeadlineExceeded after timeout_ms).
  virtual Status Finish(int64_t timeout_ms) = 0;
};
// Unimplemented in CPU-only builds.
StatusOr<std::unique_ptr<DeviceSnapshot>> NewDeviceSnapshot(int device);

// Page-locked host memory for staging (falls back to malloc in CPU builds).
void* AllocHost(size_t n, bool pinned);
void FreeHost(void* p, bool pinned);

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
