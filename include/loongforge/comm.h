// NexusSync compression kernels: top-k sparsification with error feedback, and the scatter-add
// that turns gathered (values, indices) from every rank back into an averaged dense gradient.
//
// These are the C++ halves of the sparse path of python/loongforge/comm.py; the collectives
// themselves run on torch.distributed (Gloo/NCCL). Tensors arrive as TensorViews
// (loongforge/tensor.h), so the core links no torch; every entry point validates its tensors
// (dtype, size, contiguity, device) and runs on the tensors' device: host memory on CPU threads,
// CUDA memory on the CUDA twin (src/comm/topk_cuda.cu), queued on the stream named below and not
// synchronized. See Note [Top-k with error feedback].
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
#include "loongforge/tensor.h"

namespace loongforge {
namespace comm {

// True if this build has the CUDA kernels and a device is visible.
bool CudaAvailable();

// Note [Top-k with error feedback], on the device of `residual`.
//   residual:    contiguous f32, n < 2^31 elements (any shape), updated in place.
//   grad:        null (select from the residual as it is), or contiguous f32/bf16 with n elements
//                on the residual's device.
//   values:      min(k, n) contiguous f32/bf16 elements (the value dtype), written.
//   indices:     min(k, n) contiguous i32 elements, written, strictly increasing.
// CPU: `num_threads` <= 0 means hardware concurrency (buffers under 256 Ki elements run on the
// calling thread); thread-safe for disjoint buffers. CUDA: queued on residual.stream; scratch
// memory comes from cudaMallocAsync on that stream.
// Errors: InvalidArgument naming the tensor (dtype, size, contiguity, device, read-only output,
// negative k); Unavailable for CUDA tensors in a build without CUDA.
Status TopKErrorFeedback(const TensorView* grad, const TensorView& residual, int64_t k,
                         const TensorView& values, const TensorView& indices, int num_threads = 0);

// dense[idx] += scale * value for every (value, idx) of `num_segments` equal segments of
// `values`/`indices` (one segment per rank, as all_gather lays them out), segment by segment in
// order, so every rank computes bit-identical results. With `zero_dense_first` the dense tensor is
// cleared first. Averaging: scale = 1 / world_size. bf16 dense tensors round after every add.
//   values:  contiguous f32/bf16; indices: contiguous i32 with as many elements;
//   dense:   contiguous f32/bf16, written; all three on one device.
// CPU: every index is checked first (InvalidArgument naming segment and entry; dense may then be
// partially updated). CUDA: queued on dense.stream; out-of-range indices are skipped, and within a
// segment indices must be unique for bit-reproducible results (top-k output is).
// Errors: InvalidArgument naming the tensor, or a bad num_segments; Unavailable for CUDA tensors
// in a build without CUDA.
Status ScatterAdd(const TensorView& values, const TensorView& indices, int64_t num_segments,
                  const TensorView& dense, float scale, bool zero_dense_first, int num_threads = 0);

}  // namespace comm
}  // namespace loongforge
