// The unchecked kernels behind include/loongforge/comm.h: CPU (topk_cpu.cc) and CUDA
// (topk_cuda.cu, or topk_cuda_stub.cc without CUDA) twins with one contract. Callers go through
// comm::TopKErrorFeedback / comm::ScatterAdd (topk.cc), which validate dtypes, sizes and devices;
// these only reject null buffers and sizes out of range. Dtypes are kFloat32 or kBFloat16 (bf16 as
// raw uint16 storage); residuals are f32, indices i32.
#pragma once

#include <cstdint>

#include "loongforge/status.h"
#include "loongforge/tensor.h"

namespace loongforge {
namespace comm {
namespace internal {

// Note [Top-k with error feedback]. `grad` may be null. k is clamped to n; n must be < 2^31.
Status TopKErrorFeedbackCpu(const void* grad, DType grad_dtype, float* residual, int64_t n,
                            int64_t k, void* out_values, DType value_dtype, int32_t* out_indices,
                            int num_threads = 0);

// dense[idx] += scale * value, segment by segment; indices are range-checked per segment first.
Status ScatterAddCpu(const void* values, DType value_dtype, const int32_t* indices,
                     int64_t num_segments, int64_t segment_len, void* dense, DType dense_dtype,
                     int64_t n, float scale, bool zero_dense_first, int num_threads = 0);

bool CudaAvailable();

// CUDA twins (device pointers; queued on `stream`, a cudaStream_t). Unavailable without CUDA.
Status TopKErrorFeedbackCuda(const void* grad, DType grad_dtype, float* residual, int64_t n,
                             int64_t k, void* out_values, DType value_dtype, int32_t* out_indices,
                             void* stream);
Status ScatterAddCuda(const void* values, DType value_dtype, const int32_t* indices,
                      int64_t num_segments, int64_t segment_len, void* dense, DType dense_dtype,
                      int64_t n, float scale, bool zero_dense_first, void* stream);

}  // namespace internal
}  // namespace comm
}  // namespace loongforge
