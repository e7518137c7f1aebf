// XXH3-128 of fixed-size chunks of device memory, bit-identical to the CPU's XXH3_128bits, plus the
// host<->device copies CheckpointVault uses for snapshots and restores into device tensors.
//
// Kernel shape: 8 threads per chunk, one per XXH3 accumulator lane (Note [Lane decomposition] in
// xxh3_lanes.h); the 8 lanes meet through warp shuffles and lane 0 writes the 128-bit result.
// Chunks of <= 240 bytes (XXH3's short paths) are copied to the host and hashed there.
#include <cuda_runtime.h>

#include <cstdlib>

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
