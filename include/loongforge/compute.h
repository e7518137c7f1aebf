// Kernels of the training step itself: CPU and CUDA twins with one contract, run on the
// tensors' device, CUDA work queued on the tensors' stream (TensorView::stream).
//
//   // x: [rows, cols] bf16 or f32; q: [rows, cols] u8 (e4m3 bytes); scale: [rows] f32
//   LF_RETURN_IF_ERROR(compute::QuantizeRowsE4m3(x, q, scale));
#pragma once

#include "loongforge/status.h"
#include "loongforge/tensor.h"

namespace loongforge {
namespace compute {

// Note [Row-wise e4m3 quantization]
// ---------------------------------
// Per row r of x: amax = max |x[r, c]| (NaN if any element is NaN), scale[r] = max(amax, 1e-12)
// * fp32(1/448), and q[r, c] = e4m3(clamp(x[r, c] / scale[r], -448, 448)): float8_e4m3fn, rounded
// to nearest, ties to even, stored as bytes (NaN as 0x7F with its sign). Every step is one fp32
// operation in this order, so the result is bit for bit that of loongforge.fp8.quantize_rowwise
// (x.float(), abs().amax(-1), clamp_min(1e-12) * (1 / 448), x / scale, clamp,
// .to(float8_e4m3fn)) on either device, in one pass over x on the GPU instead of seven kernels.
// The scale multiplies by the reciprocal because torch's CUDA `t / 448.0` does (its CPU kernel
// divides): written as a product, the torch ops give the same bits on both devices. A NaN row's
// scale is NaN, with the device's NaN bits. Fp8Linear (--fp8-frozen) quantizes every
// activation row this way before torch._scaled_mm.
//
// Errors (InvalidArgument naming the tensor): x not bf16/f32 or not 2-d or not contiguous; q not
// u8 of x's shape; scale not f32 with one element per row; tensors on different devices; a
// read-only q or scale. Unavailable: CUDA tensors in a build without CUDA.
Status QuantizeRowsE4m3(const TensorView& x, const TensorView& q, const TensorView& scale);

// True when the CUDA kernels are built and a device is visible.
bool CudaAvailable();

}  // namespace compute
}  // namespace loongforge
