// CUDA twin of the row-wise e4m3 quantization (include/loongforge/compute.h, Note [Row-wise e4m3
// quantization]): one block per row reads the row twice (amax, then divide and round; the second
// read hits the cache) and writes its bytes and its scale, in one launch on the caller's stream.
// The element functions are quant_kernels.h's, shared with the CPU twin, so both round alike.
// Rows whose length and addresses allow it are read 16 bytes and written 8 (bf16) or 4 (f32)
// bytes at a time.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "common/cuda_check.h"
#include "compute/quant_kernels.h"

namespace loongforge {
namespace compute {
namespace internal {
namespace {

constexpr int kThreads = 256;

// kVec elements of row-major x from element i: 8 bf16 or 4 f32 from one 16-byte load, else one.
template <bool kBf16, int kVec>
__device__ inline void LoadVec(const void* __restrict__ x, long long i, float (&v)[kVec]) {
  if constexpr (kVec == 8) {
    static_assert(kBf16, "8-wide loads are bf16");
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + i);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = Bf16ToFloat(static_cast<uint16_t>(w[k] & 0xFFFFu));
      v[2 * k + 1] = Bf16ToFloat(static_cast<uint16_t>(w[k] >> 16));
    }
  } else if constexpr (kVec == 4) {
    static_assert(!kBf16, "4-wide loads are f32");
    const float4 raw = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + i);
    v[0] = raw.x;
    v[1] = raw.y;
    v[2] = raw.z;
    v[3] = raw.w;
  } else {
    v[0] =
        kBf16 ? Bf16ToFloat(static_cast<const uint16_t*>(x)[i]) : static_cast<const float*>(x)[i];
  }
}

template <int kVec>
__device__ inline void StoreVec(uint8_t* __restrict__ q, long long i, const uint8_t (&b)[kVec]) {
  if constexpr (kVec == 8) {
    uint2 w;
    w.x = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t{b[3]} << 24);
    w.y = b[4] | (b[5] << 8) | (b[6] << 16) | (uint32_t{b[7]} << 24);
    *reinterpret_cast<uint2*>(q + i) = w;
  } else if constexpr (kVec == 4) {
    *reinterpret_cast<uint32_t*>(q + i) =
        b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t{b[3]} << 24);
  } else {
    q[i] = b[0];
  }
}

template <bool kBf16, int kVec>
__global__ void __launch_bounds__(kThreads)
    QuantizeRows(const void* __restrict__ x, long long cols, uint8_t* __restrict__ q,
                 float* __restrict__ scale) {
  __shared__ float warp_max[kThreads / 32];
  __shared__ float row_scale;
  const long long base = static_cast<long long>(blockIdx.x) * cols;
  const long long nvec = cols / kVec;  // callers pick kVec so that it divides cols

  float m = 0.0f;
  for (long long j = threadIdx.x; j < nvec; j += kThreads) {
    float v[kVec];
    LoadVec<kBf16, kVec>(x, base + j * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = AbsMaxNan(m, v[k]);
  }
  for (int off = 16; off > 0; off >>= 1) m = AbsMaxNan(m, __shfl_down_sync(0xFFFFFFFFu, m, off));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = warp_max[0];
    for (int w = 1; w < kThreads / 32; ++w) r = AbsMaxNan(r, warp_max[w]);
    const float s = RowScale(r);
    scale[blockIdx.x] = s;
    row_scale = s;
  }
  __syncthreads();
  const float s = row_scale;
  for (long long j = threadIdx.x; j < nvec; j += kThreads) {
    float v[kVec];
    uint8_t b[kVec];
    LoadVec<kBf16, kVec>(x, base + j * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) b[k] = QuantizeElement(v[k], s);
    StoreVec<kVec>(q, base + j * kVec, b);
  }
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool CudaAvailable() { return loongforge::internal::CudaDevicePresent(); }

Status QuantizeRowsE4m3Cuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, uint8_t* q,
                            float* scale, void* stream) {
  if (rows < 0 || cols < 0) return InvalidArgumentError("e4m3 row quantization: negative size");
  if (rows > INT_MAX) {
    return InvalidArgumentError("e4m3 row quantization: " + std::to_string(rows) +
                                " rows, more than one launch takes (2^31 - 1)");
  }
  if (rows == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = static_cast<unsigned>(rows);
  if (x_dtype == DType::kBFloat16) {
    if (cols % 8 == 0 && Aligned(x, 16) && Aligned(q, 8)) {
      QuantizeRows<true, 8><<<grid, kThreads, 0, s>>>(x, cols, q, scale);
    } else {
      QuantizeRows<true, 1><<<grid, kThreads, 0, s>>>(x, cols, q, scale);
    }
  } else {
    if (cols % 4 == 0 && Aligned(x, 16) && Aligned(q, 4)) {
      QuantizeRows<false, 4><<<grid, kThreads, 0, s>>>(x, cols, q, scale);
    } else {
      QuantizeRows<false, 1><<<grid, kThreads, 0, s>>>(x, cols, q, scale);
    }
  }
  LF_CUDA_CHECK_LAUNCH();
  return Status::Ok();
}

}  // namespace internal
}  // namespace compute
}  // namespace loongforge
