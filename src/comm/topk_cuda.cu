// CUDA top-k with error feedback and scatter-add: the twin of topk_cpu.cc (same contract, same
// selection including the tie rule, same output order; src/comm/topk_kernels.h).
//
// Selection is an exact three-level radix select on the 31 magnitude bits (11 + 11 + 9 bits):
// each level is a histogram kernel over the entries that match the prefix chosen so far, followed
// by a one-thread kernel that picks the bin holding the k-th largest key. The result is the
// threshold key t and m, the number of entries equal to t to take (lowest indices first). Then a
// count kernel gives per-tile counts, a one-block scan turns them into output offsets, and a write
// kernel compacts the selection in index order and clears it from the residual. Everything is
// queued on the caller's stream; the host never waits (k is known, so output sizes are too).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "comm/topk_common.h"
#include "comm/topk_kernels.h"
#include "common/cuda_check.h"

namespace loongforge {
namespace comm {
namespace internal {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 16;
constexpr int kTile = kThreads * kItems;
constexpr int kMaxBins = 2048;

struct SelectState {
  uint32_t prefix;  // key bits decided so far
  uint32_t mask;    // which bits are decided
  long long k_rem;  // entries still to take from keys matching prefix/mask
};

__global__ void InitState(SelectState* st, long long k) {
  st->prefix = 0;
  st->mask = 0;
  st->k_rem = k;
}

// Optionally residual += grad; then histogram of bits [shift, shift+bits) of the keys that match
// the state's prefix.
template <bool kAccumulate, bool kGradBf16>
__global__ void AccumulateHistogram(const void* __restrict__ grad, float* __restrict__ residual,
                                    long long n, int shift, int bins, bool do_hist,
                                    const SelectState* __restrict__ st,
                                    unsigned int* __restrict__ hist) {
  __shared__ unsigned int sh[kMaxBins];
  if (do_hist)
    for (int b = threadIdx.x; b < bins; b += blockDim.x) sh[b] = 0;
  __syncthreads();
  const uint32_t prefix = do_hist ? st->prefix : 0;
  const uint32_t mask = do_hist ? st->mask : 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float r = residual[i];
    if (kAccumulate) {
      if (kGradBf16) {
        r += Bf16ToFloat(static_cast<const uint16_t*>(grad)[i]);
      } else {
        r += static_cast<const float*>(grad)[i];
      }
      residual[i] = r;
    }
    if (do_hist) {
      const uint32_t key = MagnitudeKey(r);
      if ((key & mask) == prefix) atomicAdd(&sh[(key >> shift) & (bins - 1)], 1u);
    }
  }
  if (!do_hist) return;
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (sh[b] != 0) atomicAdd(&hist[b], sh[b]);
}

// Picks the bin holding the k_rem-th largest key and narrows the state to it. One thread.
__global__ void SelectBin(const unsigned int* __restrict__ hist, int bins, int shift,
                          SelectState* st) {
  long long above = 0;
  int b = bins - 1;
  for (; b > 0; --b) {
    if (above + hist[b] >= st->k_rem) break;
    above += hist[b];
  }
  st->k_rem -= above;
  st->prefix |= static_cast<uint32_t>(b) << shift;
  st->mask |= static_cast<uint32_t>(bins - 1) << shift;
}

using BlockLoadF = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_TRANSPOSE>;
using BlockScanI = cub::BlockScan<int, kThreads>;
using BlockReduceI = cub::BlockReduce<int, kThreads>;

// Loads this block's tile of `residual` (zeros past n) into r, in the blocked arrangement, and
// returns how many of its entries are real; the load's storage is free again on return.
__device__ __forceinline__ int LoadTile(const float* __restrict__ residual, long long n,
                                        typename BlockLoadF::TempStorage& storage,
                                        float (&r)[kItems]) {
  const long long base = (long long)blockIdx.x * kTile;
  const int valid = static_cast<int>(n - base < kTile ? n - base : kTile);
  BlockLoadF(storage).Load(residual + base, r, valid, 0.0f);
  __syncthreads();
  return valid;
}

// Per tile: entries strictly above the threshold key, and entries equal to it.
__global__ void CountTiles(const float* __restrict__ residual, long long n,
                           const SelectState* __restrict__ st, int* __restrict__ above,
                           int* __restrict__ ties) {
  __shared__ union {
    typename BlockLoadF::TempStorage load;
    typename BlockReduceI::TempStorage reduce;
  } tmp;
  float r[kItems];
  const int valid = LoadTile(residual, n, tmp.load, r);
  const uint32_t t = st->prefix;
  int a = 0, e = 0;
  for (int j = 0; j < kItems; ++j) {
    if (threadIdx.x * kItems + j >= valid) break;
    const uint32_t key = MagnitudeKey(r[j]);
    a += key > t;
    e += key == t;
  }
  const int sa = BlockReduceI(tmp.reduce).Sum(a);
  __syncthreads();
  const int se = BlockReduceI(tmp.reduce).Sum(e);
  if (threadIdx.x == 0) {
    above[blockIdx.x] = sa;
    ties[blockIdx.x] = se;
  }
}

// One block: tie_prefix[b] = ties in tiles before b; offset[b] = selected entries before tile b.
__global__ void ScanTiles(const int* __restrict__ above, const int* __restrict__ ties,
                          int num_tiles, const SelectState* __restrict__ st,
                          long long* __restrict__ tie_prefix, long long* __restrict__ offset) {
  using BlockScanL = cub::BlockScan<long long, kThreads>;
  __shared__ typename BlockScanL::TempStorage tmp;
  __shared__ long long carry_ties, carry_sel;
  if (threadIdx.x == 0) carry_ties = carry_sel = 0;
  __syncthreads();
  const long long m = st->k_rem;
  for (int start = 0; start < num_tiles; start += kThreads) {
    const int b = start + threadIdx.x;
    const long long e = b < num_tiles ? ties[b] : 0;
    long long tp, total;
    BlockScanL(tmp).ExclusiveSum(e, tp, total);
    __syncthreads();
    tp += carry_ties;
    long long take = m - tp;
    take = take < 0 ? 0 : (take > e ? e : take);
    const long long sel = (b < num_tiles ? above[b] : 0) + take;
    long long op, total_sel;
    BlockScanL(tmp).ExclusiveSum(sel, op, total_sel);
    __syncthreads();
    if (b < num_tiles) {
      tie_prefix[b] = tp;
      offset[b] = op + carry_sel;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      carry_ties += total;
      carry_sel += total_sel;
    }
    __syncthreads();
  }
}

template <bool kValueBf16>
__global__ void WriteSelected(float* __restrict__ residual, long long n,
                              const SelectState* __restrict__ st,
                              const long long* __restrict__ tie_prefix,
                              const long long* __restrict__ offset, void* __restrict__ out_values,
                              int32_t* __restrict__ out_indices) {
  __shared__ union {
    typename BlockLoadF::TempStorage load;
    typename BlockScanI::TempStorage scan;
  } tmp;
  const long long base = (long long)blockIdx.x * kTile;
  float r[kItems];
  const int valid = LoadTile(residual, n, tmp.load, r);
  const uint32_t t = st->prefix;
  const long long m = st->k_rem;
  int e = 0;
  for (int j = 0; j < kItems; ++j) {
    if (threadIdx.x * kItems + j < valid) e += MagnitudeKey(r[j]) == t;
  }
  int my_tie;
  BlockScanI(tmp.scan).ExclusiveSum(e, my_tie);
  __syncthreads();
  long long tie_rank = tie_prefix[blockIdx.x] + my_tie;
  unsigned int sel_bits = 0;
  int s = 0;
  for (int j = 0; j < kItems; ++j) {
    if (threadIdx.x * kItems + j >= valid) break;
    const uint32_t key = MagnitudeKey(r[j]);
    bool take = key > t;
    if (key == t) take = tie_rank++ < m;
    if (take) {
      sel_bits |= 1u << j;
      ++s;
    }
  }
  int my_off;
  BlockScanI(tmp.scan).ExclusiveSum(s, my_off);
  long long o = offset[blockIdx.x] + my_off;
  for (int j = 0; j < kItems; ++j) {
    if (!(sel_bits & (1u << j))) continue;
    const long long i = base + threadIdx.x * kItems + j;
    out_indices[o] = static_cast<int32_t>(i);
    if (kValueBf16) {
      const uint16_t v = FloatToBf16(r[j]);
      static_cast<uint16_t*>(out_values)[o] = v;
      residual[i] = r[j] - Bf16ToFloat(v);
    } else {
      static_cast<float*>(out_values)[o] = r[j];
      residual[i] = 0.0f;
    }
    ++o;
  }
}

template <bool kValueBf16, bool kDenseBf16>
__global__ void ScatterAddSegment(const void* __restrict__ values,
                                  const int32_t* __restrict__ indices, long long len,
                                  void* __restrict__ dense, long long n, float scale) {
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < len;
       j += (long long)gridDim.x * blockDim.x) {
    const int32_t i = indices[j];
    if (i < 0 || i >= n) continue;
    const float v = kValueBf16 ? Bf16ToFloat(static_cast<const uint16_t*>(values)[j])
                               : static_cast<const float*>(values)[j];
    if (kDenseBf16) {
      atomicAdd(static_cast<__nv_bfloat16*>(dense) + i, __float2bfloat16_rn(scale * v));
    } else {
      atomicAdd(static_cast<float*>(dense) + i, scale * v);
    }
  }
}

int GridFor(long long n) {
  long long blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 2048 ? (blocks < 1 ? 1 : blocks) : 2048);
}

}  // namespace

bool CudaAvailable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

Status TopKErrorFeedbackCuda(const void* grad, DType grad_dtype, float* residual, int64_t n,
                             int64_t k, void* out_values, DType value_dtype, int32_t* out_indices,
                             void* stream_ptr) {
  if (n < 0 || k < 0) return InvalidArgumentError("cuda top-k: negative size");
  if (n >= (int64_t{1} << 31)) {
    return InvalidArgumentError("cuda top-k: buffer of " + std::to_string(n) +
                                " elements exceeds int32 indices");
  }
  if (n > 0 && residual == nullptr) return InvalidArgumentError("cuda top-k: residual is null");
  k = k < n ? k : n;
  if (k > 0 && (out_values == nullptr || out_indices == nullptr)) {
    return InvalidArgumentError("cuda top-k: output values/indices are null");
  }
  if (n == 0) return Status::Ok();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int grid = GridFor(n);
  const bool bf16 = grad_dtype == DType::kBFloat16;

  if (k == 0) {
    if (grad == nullptr) return Status::Ok();
    if (bf16) {
      AccumulateHistogram<true, true>
          <<<grid, kThreads, 0, stream>>>(grad, residual, n, 0, 1, false, nullptr, nullptr);
    } else {
      AccumulateHistogram<true, false>
          <<<grid, kThreads, 0, stream>>>(grad, residual, n, 0, 1, false, nullptr, nullptr);
    }
    LF_CUDA_CHECK_LAUNCH();
    return Status::Ok();
  }

  const int num_tiles = static_cast<int>((n + kTile - 1) / kTile);
  // Scratch: state | 3 histograms | above, ties (int) | tie_prefix, offset (long long).
  const size_t hist_bytes = 3 * kMaxBins * sizeof(unsigned int);
  const size_t bytes =
      256 + hist_bytes + 2 * sizeof(int) * num_tiles + 2 * sizeof(long long) * num_tiles + 64;
  void* scratch = nullptr;
  LF_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&scratch, bytes, stream));
  char* p = static_cast<char*>(scratch);
  SelectState* st = reinterpret_cast<SelectState*>(p);
  unsigned int* hist = reinterpret_cast<unsigned int*>(p + 256);
  long long* tie_prefix = reinterpret_cast<long long*>(p + 256 + hist_bytes);
  long long* offset = tie_prefix + num_tiles;
  int* above = reinterpret_cast<int*>(offset + num_tiles);
  int* ties = above + num_tiles;

  Status status = [&]() -> Status {
    LF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(hist, 0, hist_bytes, stream));
    InitState<<<1, 1, 0, stream>>>(st, k);
    LF_CUDA_CHECK_LAUNCH();
    const int shifts[3] = {20, 9, 0};
    const int bins[3] = {2048, 2048, 512};
    for (int level = 0; level < 3; ++level) {
      unsigned int* h = hist + level * kMaxBins;
      const bool acc = level == 0 && grad != nullptr;
      if (acc && bf16) {
        AccumulateHistogram<true, true><<<grid, kThreads, 0, stream>>>(
            grad, residual, n, shifts[level], bins[level], true, st, h);
      } else if (acc) {
        AccumulateHistogram<true, false><<<grid, kThreads, 0, stream>>>(
            grad, residual, n, shifts[level], bins[level], true, st, h);
      } else {
        AccumulateHistogram<false, false><<<grid, kThreads, 0, stream>>>(
            nullptr, residual, n, shifts[level], bins[level], true, st, h);
      }
      LF_CUDA_CHECK_LAUNCH();
      SelectBin<<<1, 1, 0, stream>>>(h, bins[level], shifts[level], st);
      LF_CUDA_CHECK_LAUNCH();
    }
    CountTiles<<<num_tiles, kThreads, 0, stream>>>(residual, n, st, above, ties);
    LF_CUDA_CHECK_LAUNCH();
    ScanTiles<<<1, kThreads, 0, stream>>>(above, ties, num_tiles, st, tie_prefix, offset);
    LF_CUDA_CHECK_LAUNCH();
    if (value_dtype == DType::kBFloat16) {
      WriteSelected<true><<<num_tiles, kThreads, 0, stream>>>(residual, n, st, tie_prefix, offset,
                                                              out_values, out_indices);
    } else {
      WriteSelected<false><<<num_tiles, kThreads, 0, stream>>>(residual, n, st, tie_prefix, offset,
                                                               out_values, out_indices);
    }
    LF_CUDA_CHECK_LAUNCH();
    return Status::Ok();
  }();
  LF_CUDA_WARN_IF_ERROR(cudaFreeAsync(scratch, stream));
  return status;
}

Status ScatterAddCuda(const void* values, DType value_dtype, const int32_t* indices,
                      int64_t num_segments, int64_t segment_len, void* dense, DType dense_dtype,
                      int64_t n, float scale, bool zero_dense_first, void* stream_ptr) {
  if (num_segments < 0 || segment_len < 0 || n < 0) {
    return InvalidArgumentError("cuda scatter-add: negative size");
  }
  if (n > 0 && dense == nullptr) return InvalidArgumentError("cuda scatter-add: dense is null");
  if (num_segments * segment_len > 0 && (values == nullptr || indices == nullptr)) {
    return InvalidArgumentError("cuda scatter-add: values/indices are null");
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (zero_dense_first && n > 0) {
    LF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dense, 0, n * DTypeSize(dense_dtype), stream));
  }
  if (segment_len == 0) return Status::Ok();
  const int grid = GridFor(segment_len);
  const int vsize = DTypeSize(value_dtype);
  // One launch per segment, in rank order: within a segment indices are unique, so the atomics
  // never collide and the result is the same on every rank and every run.
  for (int64_t s = 0; s < num_segments; ++s) {
    const void* v = static_cast<const char*>(values) + s * segment_len * vsize;
    const int32_t* idx = indices + s * segment_len;
    const bool vb = value_dtype == DType::kBFloat16;
    const bool db = dense_dtype == DType::kBFloat16;
    if (vb && db) {
      ScatterAddSegment<true, true>
          <<<grid, kThreads, 0, stream>>>(v, idx, segment_len, dense, n, scale);
    } else if (vb) {
      ScatterAddSegment<true, false>
          <<<grid, kThreads, 0, stream>>>(v, idx, segment_len, dense, n, scale);
    } else if (db) {
      ScatterAddSegment<false, true>
          <<<grid, kThreads, 0, stream>>>(v, idx, segment_len, dense, n, scale);
    } else {
      ScatterAddSegment<false, false>
          <<<grid, kThreads, 0, stream>>>(v, idx, segment_len, dense, n, scale);
    }
    LF_CUDA_CHECK_LAUNCH();
  }
  return Status::Ok();
}

}  // namespace internal
}  // namespace comm
}  // namespace loongforge
