// XXH3-128 of fixed-size chunks of device memory, bit-identical to the CPU's XXH3_128bits, the
// batched asynchronous device snapshot (Note [Device snapshot] in device.h), and the host<->device
// copies CheckpointVault uses for restores into device tensors.
//
// Kernel shape: 8 threads per chunk, one per XXH3 accumulator lane (Note [Lane decomposition] in
// xxh3_lanes.h); the 8 lanes meet through warp shuffles and lane 0 writes the 128-bit result.
// Chunks of <= 240 bytes (XXH3's short paths) are copied to the host and hashed there.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "ckpt/device.h"
#include "ckpt/xxh3_lanes.h"
#include "loongforge/cuda_check.h"

namespace loongforge {
namespace ckpt {
namespace internal {
namespace {

__constant__ uint8_t kSecretDev[xxh3::kSecretSize] = LF_XXH3_SECRET_BYTES;

constexpr int kThreadsPerBlock = 128;  // 16 chunks per block

__global__ void HashChunksKernel(const uint8_t* data, int64_t nbytes, int64_t chunk_bytes,
                                 int64_t num_long_chunks, uint64_t* out /* 2 per chunk */) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = tid / 8;
  const int lane = static_cast<int>(tid % 8);
  const bool active = chunk < num_long_chunks;
  uint64_t acc = 0;
  size_t len = 0;
  if (active) {
    const int64_t begin = chunk * chunk_bytes;
    len = static_cast<size_t>(min(chunk_bytes, nbytes - begin));
    acc = xxh3::LongLoopLane(data + begin, len, kSecretDev, lane);
  }
  // Gather the 8 lanes of this chunk (lanes of one chunk are 8 consecutive threads of a warp).
  uint64_t accs[8];
  const unsigned mask = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < 8; ++i) accs[i] = __shfl_sync(mask, acc, i, 8);
  if (active && lane == 0) {
    uint64_t lo, hi;
    xxh3::Finalize128(accs, len, kSecretDev, &lo, &hi);
    out[2 * chunk] = lo;
    out[2 * chunk + 1] = hi;
  }
}

Status LaunchHashChunks(const uint8_t* data, int64_t nbytes, int64_t chunk_bytes,
                        int64_t num_long_chunks, uint64_t* out, cudaStream_t stream) {
  if (num_long_chunks <= 0) return Status::Ok();
  if (chunk_bytes <= static_cast<int64_t>(xxh3::kMidSizeMax))
    return InvalidArgumentError("DeviceHashChunks: chunk_bytes must exceed 240");
  const int64_t threads = num_long_chunks * 8;
  const int64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  HashChunksKernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      data, nbytes, chunk_bytes, num_long_chunks, out);
  LF_CUDA_CHECK_LAUNCH();
  return Status::Ok();
}

}  // namespace

bool DeviceSupportCompiled() { return true; }

Status DeviceHashChunks(const void* dptr, int64_t nbytes, int64_t chunk_bytes, int device,
                        std::vector<Hash128>* out) {
  out->clear();
  if (nbytes <= 0) return Status::Ok();
  const int64_t num_chunks = (nbytes + chunk_bytes - 1) / chunk_bytes;
  const int64_t tail = nbytes - (num_chunks - 1) * chunk_bytes;
  // The last chunk takes the short path on the host when it is <= 240 bytes.
  const bool short_tail = tail <= static_cast<int64_t>(xxh3::kMidSizeMax);
  const int64_t num_long = short_tail ? num_chunks - 1 : num_chunks;
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  out->resize(static_cast<size_t>(num_chunks));
  if (num_long > 0) {
    uint64_t* d_out = nullptr;
    LF_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out, static_cast<size_t>(num_long) * 16));
    Status st = LaunchHashChunks(static_cast<const uint8_t*>(dptr), nbytes, chunk_bytes, num_long,
                                 d_out, /*stream=*/0);
    std::vector<uint64_t> host(static_cast<size_t>(num_long) * 2);
    if (st.ok()) {
      cudaError_t e = cudaMemcpy(host.data(), d_out, host.size() * 8, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) {
        Status copy_error =
            ::loongforge::internal::CudaErrorToStatus(e, "cudaMemcpy(hashes)", __FILE__, __LINE__);
        st = copy_error;
      }
    }
    LF_CUDA_WARN_IF_ERROR(cudaFree(d_out));
    if (!st.ok()) return st;
    for (int64_t i = 0; i < num_long; ++i) {
      (*out)[i].lo = host[2 * i];
      (*out)[i].hi = host[2 * i + 1];
    }
  }
  if (short_tail) {
    uint8_t buf[xxh3::kMidSizeMax];
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpy(buf, static_cast<const uint8_t*>(dptr) + nbytes - tail,
                                       static_cast<size_t>(tail), cudaMemcpyDeviceToHost));
    out->back() = HashBytes(buf, static_cast<size_t>(tail));
  }
  return Status::Ok();
}

namespace {

// Makes `device` current for a scope and restores the caller's device after (Save runs on the
// caller's thread, whose current device belongs to the caller).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0) LF_CUDA_WARN_IF_ERROR(cudaSetDevice(prev_));
  }
  cudaError_t status() const { return status_; }

 private:
  int prev_ = -1;
  cudaError_t status_ = cudaSuccess;
};

#define LF_CKPT_DEVICE_GUARD(device) \
  DeviceGuard _lf_guard(device);     \
  LF_CUDA_RETURN_IF_ERROR(_lf_guard.status())

// Waits for `ev` by polling (cudaEventSynchronize has no timeout).
Status WaitEvent(cudaEvent_t ev, int64_t timeout_ms, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady)
      return ::loongforge::internal::CudaErrorToStatus(e, what, __FILE__, __LINE__);
    if (std::chrono::steady_clock::now() > deadline)
      return DeadlineExceededError(std::string(what) + " did not complete within " +
                                   std::to_string(timeout_ms) + " ms");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

class CudaDeviceSnapshot final : public DeviceSnapshot {
 public:
  explicit CudaDeviceSnapshot(int device) : device_(device) {}
  ~CudaDeviceSnapshot() override {
    DeviceGuard g(device_);
    for (cudaEvent_t e : producer_events_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(e));
    if (hashed_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(hashed_));
    if (done_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(done_));
    if (stream_) LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(stream_));
    if (d_table_) LF_CUDA_WARN_IF_ERROR(cudaFree(d_table_));
    if (h_table_) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(h_table_));
    if (h_tails_) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(h_tails_));
  }

  Status Init() {
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&hashed_, cudaEventDisableTiming));
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    return Status::Ok();
  }

  Status Begin(int64_t num_slots, int64_t num_tensors,
               const std::vector<void*>& producer_streams) override {
    LF_CKPT_DEVICE_GUARD(device_);
    if (num_slots > slots_cap_) {
      if (d_table_) LF_CUDA_RETURN_IF_ERROR(cudaFree(d_table_));
      if (h_table_) LF_CUDA_RETURN_IF_ERROR(cudaFreeHost(h_table_));
      d_table_ = nullptr;
      h_table_ = nullptr;
      slots_cap_ = 0;
      LF_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_table_, static_cast<size_t>(num_slots) * 16));
      LF_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h_table_, static_cast<size_t>(num_slots) * 16));
      slots_cap_ = num_slots;
    }
    if (num_tensors > tails_cap_) {
      if (h_tails_) LF_CUDA_RETURN_IF_ERROR(cudaFreeHost(h_tails_));
      h_tails_ = nullptr;
      tails_cap_ = 0;
      LF_CUDA_RETURN_IF_ERROR(
          cudaMallocHost(&h_tails_, static_cast<size_t>(num_tensors) * xxh3::kMidSizeMax));
      tails_cap_ = num_tensors;
    }
    num_slots_ = num_slots;
    tails_.clear();
    while (producer_events_.size() < producer_streams.size()) {
      cudaEvent_t e;
      LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      producer_events_.push_back(e);
    }
    for (size_t i = 0; i < producer_streams.size(); ++i) {
      LF_CUDA_RETURN_IF_ERROR(
          cudaEventRecord(producer_events_[i], static_cast<cudaStream_t>(producer_streams[i])));
      LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, producer_events_[i], 0));
    }
    return Status::Ok();
  }

  Status EnqueueHash(const void* dptr, int64_t nbytes, int64_t chunk_bytes,
                     int64_t first_slot) override {
    if (nbytes <= 0) return Status::Ok();
    const int64_t num_chunks = (nbytes + chunk_bytes - 1) / chunk_bytes;
    if (first_slot < 0 || first_slot + num_chunks > num_slots_)
      return InternalError("DeviceSnapshot: hash slots out of range");
    const int64_t tail = nbytes - (num_chunks - 1) * chunk_bytes;
    const bool short_tail = tail <= static_cast<int64_t>(xxh3::kMidSizeMax);
    const int64_t num_long = short_tail ? num_chunks - 1 : num_chunks;
    LF_CKPT_DEVICE_GUARD(device_);
    const uint8_t* data = static_cast<const uint8_t*>(dptr);
    LF_RETURN_IF_ERROR(
        LaunchHashChunks(data, nbytes, chunk_bytes, num_long, d_table_ + 2 * first_slot, stream_));
    if (short_tail) {
      if (static_cast<int64_t>(tails_.size()) >= tails_cap_)
        return InternalError("DeviceSnapshot: more short tails than tensors");
      uint8_t* dst = h_tails_ + tails_.size() * xxh3::kMidSizeMax;
      LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, data + nbytes - tail, static_cast<size_t>(tail),
                                              cudaMemcpyDeviceToHost, stream_));
      tails_.push_back({first_slot + num_chunks - 1, tail});
    }
    return Status::Ok();
  }

  Status FetchHashes(std::vector<Hash128>* out, int64_t timeout_ms) override {
    LF_CKPT_DEVICE_GUARD(device_);
    out->assign(static_cast<size_t>(num_slots_), Hash128{});
    if (num_slots_ == 0) return Status::Ok();
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        h_table_, d_table_, static_cast<size_t>(num_slots_) * 16, cudaMemcpyDeviceToHost, stream_));
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(hashed_, stream_));
    LF_RETURN_IF_ERROR(WaitEvent(hashed_, timeout_ms, "device chunk hashing"));
    for (int64_t i = 0; i < num_slots_; ++i) {
      (*out)[static_cast<size_t>(i)].lo = h_table_[2 * i];
      (*out)[static_cast<size_t>(i)].hi = h_table_[2 * i + 1];
    }
    for (size_t k = 0; k < tails_.size(); ++k)
      (*out)[static_cast<size_t>(tails_[k].slot)] =
          HashBytes(h_tails_ + k * xxh3::kMidSizeMax, static_cast<size_t>(tails_[k].len));
    return Status::Ok();
  }

  Status EnqueueCopy(void* host_dst, const void* dev_src, size_t n) override {
    if (n == 0) return Status::Ok();
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, dev_src, n, cudaMemcpyDeviceToHost, stream_));
    return Status::Ok();
  }

  Status Finish(int64_t timeout_ms) override {
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
    return WaitEvent(done_, timeout_ms, "device snapshot copies");
  }

 private:
  struct Tail {
    int64_t slot, len;
  };
  int device_;
  cudaStream_t stream_ = nullptr;  // "ckpt snapshot" stream of this device, owned
  cudaEvent_t hashed_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> producer_events_;
  uint64_t* d_table_ = nullptr;  // 2 words per slot
  uint64_t* h_table_ = nullptr;  // pinned mirror
  uint8_t* h_tails_ = nullptr;   // pinned, kMidSizeMax bytes per short tail
  int64_t slots_cap_ = 0, tails_cap_ = 0, num_slots_ = 0;
  std::vector<Tail> tails_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceSnapshot>> NewDeviceSnapshot(int device) {
  auto s = std::make_unique<CudaDeviceSnapshot>(device);
  LF_RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<DeviceSnapshot>(std::move(s));
}

Status DeviceToHost(void* host_dst, const void* dev_src, size_t n, int device) {
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  LF_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, dev_src, n, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status HostToDevice(void* dev_dst, const void* host_src, size_t n, int device) {
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  LF_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_dst, host_src, n, cudaMemcpyHostToDevice));
  return Status::Ok();
}

void* AllocHost(size_t n, bool pinned) {
  if (n == 0) n = 1;
  if (pinned) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, n, cudaHostAllocDefault) == cudaSuccess) return p;
    cudaGetLastError();
    LF_LOG(WARNING) << "cudaHostAlloc(" << n << ") failed; staging in pageable memory";
    return nullptr;
  }
  return std::malloc(n);
}

void FreeHost(void* p, bool pinned) {
  if (p == nullptr) return;
  if (pinned) {
    LF_CUDA_WARN_IF_ERROR(cudaFreeHost(p));
  } else {
    std::free(p);
  }
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
