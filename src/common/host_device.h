// Arithmetic written once for a CPU twin and its CUDA kernel (Note [Host-device twins]).
//
// Note [Host-device twins]
// ------------------------
// A kernel and its CPU twin must give the same bytes, so where they share a formula it is written
// once, as an LF_HOST_DEVICE function in a header both include: nvcc compiles it for the device
// (and for the host part of the .cu), the host compiler as plain inline C++ (the macro drops
// __host__ __device__ without __CUDACC__, so the CPU-only build needs no CUDA header).
// The few operations whose best form differs per side are the functions below, chosen by
// __CUDA_ARCH__ so that each side keeps the instructions it had when the code was written twice:
//   - Min/Max: fminf/fmaxf on the device (one instruction), std::min/std::max on the host (one
//     minss/maxss; fminf there is a libm call). They differ only for a NaN argument.
//   - DivRn/SubRn: __fdiv_rn/__fsub_rn on the device, so that an IEEE round-to-nearest divide or
//     subtract stays one even under --use_fast_math and is never fused; plain / and - on the host.
// floorf, fmodf, fminf and fmaxf where NaN semantics matter are the same function on both sides.
// Neither side builds with fast-math. The device may still contract a * b + c into an FMA (nvcc's
// default --fmad=true) where the x86-64 host does not, so formulas with such terms agree to
// within rounding, not bit for bit; the tests compare with a tolerance there.
#pragma once

#include <algorithm>
#include <cmath>

#ifdef __CUDACC__
#define LF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LF_HOST_DEVICE inline
#endif

namespace loongforge {
// hd:: (host-device): called as hd::Max(...) from any loongforge namespace.
namespace hd {

#ifdef __CUDA_ARCH__
LF_HOST_DEVICE float Min(float a, float b) { return fminf(a, b); }
LF_HOST_DEVICE float Max(float a, float b) { return fmaxf(a, b); }
LF_HOST_DEVICE float DivRn(float a, float b) { return __fdiv_rn(a, b); }
LF_HOST_DEVICE float SubRn(float a, float b) { return __fsub_rn(a, b); }
#else
LF_HOST_DEVICE float Min(float a, float b) { return std::min(a, b); }
LF_HOST_DEVICE float Max(float a, float b) { return std::max(a, b); }
LF_HOST_DEVICE float DivRn(float a, float b) { return a / b; }
LF_HOST_DEVICE float SubRn(float a, float b) { return a - b; }
#endif

}  // namespace hd
}  // namespace loongforge
