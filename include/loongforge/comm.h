// NexusSync compression kernels: top-k sparsification with error feedback, and the scatter-add
// that turns gathered (values, indices) from every rank back into an averaged dense gradient.
//
// These are the C++ halves of the sparse path of python/loongforge/comm.py; the collectives
// themselves run on torch.distributed (Gloo/NCCL). Buffers are raw pointers (from torch tensors'
// data_ptr()), so the core links no torch. See Note [Top-k with error feedback].
//
// Note [Top-k with error feedback]
//   residual += grad;  select the k entries of largest |residual| (ties: lower index first);
//   emit value = residual[i] (rounded to the value dtype) and index i, in ascending index order;
//   residual[i] -= emitted value   (exactly 0 for fp32 values; the bf16 rounding error otherwise).
//   So after every call: emitted values + residual == previous residual + grad, element by element
//   and exactly (nothing is ever lost, only delayed). Residuals are always fp32.
//   NaN compares above +inf (it is selected first), so a NaN gradient is sent, not hidden.
#pragma once

#include <cstdint>

#include "loongforge/status.h"

namespace loongforge {

// Element types of gradient, value and dense buffers. bf16 is passed as raw uint16 storage.
enum class GradDType : int { kFloat32 = 0, kBFloat16 = 1 };

// Bytes per element of `t`.
int GradDTypeSize(GradDType t);

// ---- CPU -------------------------------------------------------------------------------------

// Note [Top-k with error feedback]. `grad` (n elements of grad_dtype) may be null: then the
// residual is selected from as it is (no accumulation). `residual`: n floats, updated in place.
// `out_values`: k elements of value_dtype; `out_indices`: k int32, strictly increasing.
// k is clamped to n; n must be < 2^31. `num_threads` <= 0 means hardware concurrency (buffers
// under 256 Ki elements run on the calling thread). Thread-safe for disjoint buffers.
// Errors: InvalidArgument for null buffers, negative sizes, n >= 2^31.
Status TopKErrorFeedbackCpu(const void* grad, GradDType grad_dtype, float* residual, int64_t n,
                            int64_t k, void* out_values, GradDType value_dtype,
                            int32_t* out_indices, int num_threads = 0);

// dense[idx] += scale * value for every (value, idx) of `num_segments` segments of `segment_len`
// entries each (one segment per rank, as all_gather lays them out), segment by segment in order,
// so every rank computes bit-identical results. With `zero_dense_first` the n-element dense buffer
// is cleared first. Averaging: scale = 1 / world_size. bf16 dense buffers round after every add.
// Errors: InvalidArgument for null buffers or an index outside [0, n) (names segment and entry;
// dense may then be partially updated).
Status ScatterAddCpu(const void* values, GradDType value_dtype, const int32_t* indices,
                     int64_t num_segments, int64_t segment_len, void* dense, GradDType dense_dtype,
                     int64_t n, float scale, bool zero_dense_first, int num_threads = 0);

// ---- CUDA (device pointers; work is queued on `stream`, a cudaStream_t, and not synchronized)
// ----

// True if this build has the CUDA kernels and a device is visible.
bool CommCudaAvailable();

// CUDA twin of TopKErrorFeedbackCpu (same contract, same selection, same output order).
// Scratch memory is taken with cudaMallocAsync on `stream`. Unavailable without CUDA.
Status TopKErrorFeedbackCuda(const void* grad, GradDType grad_dtype, float* residual, int64_t n,
                             int64_t k, void* out_values, GradDType value_dtype,
                             int32_t* out_indices, void* stream);

// CUDA twin of ScatterAddCpu. Indices are not range-checked on the device: out-of-range indices
// are skipped. Within a segment, indices must be unique for bit-reproducible results (top-k output
// is). Unavailable without CUDA.
Status ScatterAddCuda(const void* values, GradDType value_dtype, const int32_t* indices,
                      int64_t num_segments, int64_t segment_len, void* dense, GradDType dense_dtype,
                      int64_t n, float scale, bool zero_dense_first, void* stream);

}  // namespace loongforge
