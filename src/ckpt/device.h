// Device (CUDA) side of CheckpointVault behind a CPU-buildable interface. In CPU-only builds every
// function returns Unimplemented (device_cuda_stub.cc); with CUDA they live in device_cuda.cu.
#pragma once

#include <cstdint>
#include <functional>
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
// Device memory that holds one save's copy of the device tensors of one CUDA device (Note [Device
// staging] in snapshot.cc). Owned by a queued save while its writer reads it, then recycled.
class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  virtual int device() const = 0;
  virtual uint8_t* data() const = 0;
  virtual int64_t capacity() const = 0;
};
// cudaMalloc of `bytes` on `device` (ResourceExhausted when it fails).
StatusOr<std::unique_ptr<DeviceArena>> NewDeviceArena(int device, int64_t bytes);
// cudaMemGetInfo of `device`.
Status DeviceMemInfo(int device, int64_t* free_bytes, int64_t* total_bytes);

// A byte range of device memory.
struct DeviceSpan {
  const void* data = nullptr;
  int64_t nbytes = 0;
};

// Note [Device snapshot]
// Save() snapshots the device tensors of one CUDA device in a batch, on a stream the vault owns:
//   Begin: an event recorded on each producer stream (the caller's current stream, or the legacy
//     default stream) is waited on by the vault's stream, so hashing and copies read the tensors
//     only after the kernels that produce them, without blocking the host or other streams.
// Then one of two paths (Note [Device staging] in snapshot.cc):
//   device staging: EnqueueDeviceCopy per tensor into a DeviceArena, then Publish: the copies
//     are launched (a few kernels for any number of tensors), the arena's ready event is
//     recorded after them and every producer stream waits on it, so the
//     caller's later kernels on those streams cannot overwrite a tensor before it is copied.
//     Save() returns without waiting for the GPU. Hashing happens later, in the writer
//     (StagingReader), on the staged copy.
//   host staging: EnqueueHash per tensor adds its chunks to one batch, SubmitHashes launches one
//     kernel for the batch (all SMs work at once: one launch per tensor ran one thread block at a
//     time, 3.2 s for 6.4 GB on an H200), FetchHashes copies the hash table to the host in one
//     transfer and waits; EnqueueCopy per run of changed chunks into pinned host staging; Finish
//     waits for those copies.
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
  // Adds XXH3-128 of every `chunk_bytes` chunk of [dptr, dptr + nbytes) to the batch, into table
  // slots [first_slot, first_slot + chunks).
  virtual Status EnqueueHash(const void* dptr, int64_t nbytes, int64_t chunk_bytes,
                             int64_t first_slot) = 0;
  // Launches the hash kernel for every chunk added since Begin (one launch).
  virtual Status SubmitHashes() = 0;
  // Copies the table to the host in one transfer and waits for it (DeadlineExceeded after
  // timeout_ms); out[i] is the hash of slot i, identical to HashBytes() of the same bytes.
  virtual Status FetchHashes(std::vector<Hash128>* out, int64_t timeout_ms) = 0;
  // Enqueues a device-to-host copy (host_dst should be pinned for an asynchronous transfer).
  virtual Status EnqueueCopy(void* host_dst, const void* dev_src, size_t n) = 0;
  // Adds a device-to-device copy (into a DeviceArena); Publish launches every copy added since
  // Begin, batched (Note [Batched device copies] in device_cuda.cu).
  virtual Status EnqueueDeviceCopy(void* dev_dst, const void* dev_src, size_t n) = 0;
  // Records `arena`'s ready event after every copy enqueued so far and makes each of
  // `producer_streams` wait for it (cudaStreamWaitEvent: no host wait).
  virtual Status Publish(DeviceArena* arena, const std::vector<void*>& producer_streams) = 0;
  // Waits until every enqueued copy completed (DeadlineExceeded after timeout_ms).
  virtual Status Finish(int64_t timeout_ms) = 0;
};
// Unimplemented in CPU-only builds.
StatusOr<std::unique_ptr<DeviceSnapshot>> NewDeviceSnapshot(int device);

// The writer's side of device staging, one per device, used by the writer thread only: hashes a
// published arena and copies chosen chunks of it to the host through two pinned buffers.
class StagingReader {
 public:
  virtual ~StagingReader() = default;
  // Hashes every `chunk_bytes` chunk of each span (inside `arena`) once the arena's snapshot
  // copies completed (its ready event; no host wait for them). `out` gets the chunks of all
  // spans in order. Waits with a timeout (DeadlineExceeded).
  virtual Status Hash(DeviceArena* arena, const std::vector<DeviceSpan>& spans, int64_t chunk_bytes,
                      std::vector<Hash128>* out, int64_t timeout_ms) = 0;
  // Copies each of `ranges` (each at most buffer_bytes) to the host in batches that fill one of
  // two pinned buffers, the next batch's transfer running while `fn(i, host_ptr)` handles range i
  // of the current one (host_ptr valid during the call). Ranges are handed out in order. `*wait_s`
  // gets the time spent waiting for transfers. On error, waits for queued transfers first.
  virtual Status CopyOut(const std::vector<DeviceSpan>& ranges, int64_t timeout_ms,
                         const std::function<Status(size_t, const uint8_t*)>& fn,
                         double* wait_s) = 0;
  virtual int64_t buffer_bytes() const = 0;
};
StatusOr<std::unique_ptr<StagingReader>> NewStagingReader(int device, int64_t buffer_bytes);

// Unimplemented in CPU-only builds.
StatusOr<std::unique_ptr<DeviceSnapshot>> NewDeviceSnapshot(int device);

// Page-locked host memory for staging (falls back to malloc in CPU builds).
void* AllocHost(size_t n, bool pinned);
void FreeHost(void* p, bool pinned);

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
