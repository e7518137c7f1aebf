// The unchecked kernels behind include/loongforge/compute.h: CPU (quant.cc) and CUDA
// (quant_cuda.cu, or quant_cuda_stub.cc without CUDA) twins. compute::QuantizeRowsE4m3 validates;
// these only compute. x is f32 or bf16 (raw uint16: the top half of an f32). The element functions
// below are compiled for both sides, so the two twins round alike by construction.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "loongforge/status.h"
#include "loongforge/tensor.h"

#ifdef __CUDACC__
#define LF_HOST_DEVICE __host__ __device__
#else
#define LF_HOST_DEVICE
#endif

namespace loongforge {
namespace compute {
namespace internal {

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-12f;
// 1/448 rounded to fp32: the scale is amax times it, as torch's CUDA division by a Python scalar
// computes (a multiplication by the scalar's reciprocal), so the GPU's torch ops agree bit for bit.
constexpr float kInvE4m3Max = 1.0f / 448.0f;

LF_HOST_DEVICE inline uint32_t FloatBits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

LF_HOST_DEVICE inline float BitsFloat(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

LF_HOST_DEVICE inline float Bf16ToFloat(uint16_t b) { return BitsFloat(uint32_t{b} << 16); }

// The e4m3fn byte of v (Note [Row-wise e4m3 quantization] in loongforge/compute.h): nearest, ties
// to even; |v| >= 448 (infinities too) gives +-448; NaN gives 0x7F with v's sign bit.
LF_HOST_DEVICE inline uint8_t FloatToE4m3(float v) {
  const uint32_t u = FloatBits(v);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;   // NaN
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // 448 and beyond
  if (a < 0x3C800000u) {                      // below 2^-6: subnormal steps of 2^-9
    // |v| * 512 is exact and below 8; rintf rounds ties to even. 8 steps is the smallest normal,
    // whose byte is 0x08 too.
    return sign | static_cast<uint8_t>(rintf(BitsFloat(a) * 512.0f));
  }
  int exp = static_cast<int>(a >> 23) - 127;  // -6 .. 8
  uint32_t mant = (a >> 20) & 0x7u;           // the top 3 of 23 mantissa bits
  const uint32_t rest = a & 0xFFFFFu;         // the 20 bits dropped
  if (rest > 0x80000u || (rest == 0x80000u && (mant & 1u))) ++mant;
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | mant);
}

// The value of an e4m3fn byte (NaN for 0x7F and 0xFF).
LF_HOST_DEVICE inline float E4m3ToFloat(uint8_t b) {
  const int exp = (b >> 3) & 0xF;
  const int mant = b & 0x7;
  float v;
  if (exp == 15 && mant == 7) {
    v = BitsFloat(0x7FC00000u);
  } else if (exp == 0) {
    v = ldexpf(static_cast<float>(mant), -9);
  } else {
    v = ldexpf(1.0f + mant / 8.0f, exp - 7);
  }
  return (b & 0x80) ? -v : v;
}

// One row's quantization step for element v, given the row's scale (Note [Row-wise e4m3
// quantization]): divide, clamp (keeping NaN), round to e4m3.
LF_HOST_DEVICE inline uint8_t QuantizeElement(float v, float scale) {
  float y = v / scale;
  y = y > kE4m3Max ? kE4m3Max : (y < -kE4m3Max ? -kE4m3Max : y);
  return FloatToE4m3(y);
}

// max(a, |v|), NaN once either is NaN (as torch's amax).
LF_HOST_DEVICE inline float AbsMaxNan(float m, float v) {
  const float a = fabsf(v);
  return (a > m || a != a) ? a : m;
}

// The row scale from its amax (NaN stays NaN, as torch's clamp_min; its bits are the device's).
LF_HOST_DEVICE inline float RowScale(float amax) {
  return (amax < kAmaxFloor ? kAmaxFloor : amax) * kInvE4m3Max;
}

void QuantizeRowsE4m3Cpu(const void* x, DType x_dtype, int64_t rows, int64_t cols, uint8_t* q,
                         float* scale);

bool CudaAvailable();
Status QuantizeRowsE4m3Cuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, uint8_t* q,
                            float* scale, void* stream);

}  // namespace internal
}  // namespace compute
}  // namespace loongforge
