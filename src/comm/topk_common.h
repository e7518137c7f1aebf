// Helpers shared by the CPU and CUDA compression kernels: bf16 <-> fp32 and the magnitude key.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"  // LF_HOST_DEVICE

namespace loongforge {
namespace comm {
namespace internal {

LF_HOST_DEVICE uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

LF_HOST_DEVICE float BitsToFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// |x| as an unsigned key whose order is the order of magnitudes (NaN above +inf).
LF_HOST_DEVICE uint32_t MagnitudeKey(float x) { return FloatBits(x) & 0x7FFFFFFFu; }

LF_HOST_DEVICE float Bf16ToFloat(uint16_t v) { return BitsToFloat(static_cast<uint32_t>(v) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
LF_HOST_DEVICE uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace internal
}  // namespace comm
}  // namespace loongforge
