// XXH3-128 (seed 0, default secret) for inputs longer than 240 bytes, written lane by lane so that
// eight GPU threads can compute one hash (one accumulator lane each) and the CPU can run the very
// same code. Compiles as plain C++ and as CUDA (__host__ __device__).
//
// Note [Lane decomposition]: XXH3's long-input loop keeps 8 64-bit accumulators. Per 64-byte
// stripe, lane i adds data[i ^ 1] and mul32x32(data[i] ^ key[i]); the per-block scramble is
// lane-local. So lane i depends only on input words i and i ^ 1 of each stripe, and the 8 lanes can
// run in parallel; only the final merge needs all 8. The CPU test checks this code against
// libxxhash's XXH3_128bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"  // LF_HOST_DEVICE

namespace loongforge {
namespace ckpt {
namespace xxh3 {

constexpr size_t kStripeLen = 64;
constexpr size_t kSecretSize = 192;
constexpr size_t kStripesPerBlock = (kSecretSize - kStripeLen) / 8;  // 16
constexpr size_t kBlockLen = kStripeLen * kStripesPerBlock;          // 1024
constexpr size_t kMidSizeMax = 240;  // inputs <= this use XXH3's short paths (not here)
constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;

// The default secret (XXH3_kSecret).
#define LF_XXH3_SECRET_BYTES                                                                      \
  {                                                                                               \
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,     \
        0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, \
        0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, \
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, \
        0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, \
        0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, \
        0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, \
        0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, \
        0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, \
        0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, \
        0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, \
        0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, \
        0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e                    \
  }

// Little-endian 64-bit load from any address (inputs are not always 8-byte aligned).
LF_HOST_DEVICE uint64_t ReadLE64(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
#else
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // x86 / aarch64 are little-endian
#endif
}

LF_HOST_DEVICE uint64_t InitAcc(int lane) {
  switch (lane) {
    case 0:
      return kPrime32_3;
    case 1:
      return kPrime64_1;
    case 2:
      return kPrime64_2;
    case 3:
      return kPrime64_3;
    case 4:
      return kPrime64_4;
    case 5:
      return kPrime32_2;
    case 6:
      return kPrime64_5;
    default:
      return kPrime32_1;
  }
}

// One stripe's contribution to accumulator `lane` (see Note [Lane decomposition]).
LF_HOST_DEVICE uint64_t AccumulateLane(uint64_t acc, const uint8_t* stripe, const uint8_t* secret,
                                       int lane) {
  const uint64_t data_val = ReadLE64(stripe + 8 * lane);
  const uint64_t data_key = data_val ^ ReadLE64(secret + 8 * lane);
  const uint64_t swapped = ReadLE64(stripe + 8 * (lane ^ 1));
  return acc + swapped + (data_key & 0xFFFFFFFFULL) * (data_key >> 32);
}

LF_HOST_DEVICE uint64_t ScrambleLane(uint64_t acc, const uint8_t* secret, int lane) {
  acc ^= acc >> 47;
  acc ^= ReadLE64(secret + kSecretSize - kStripeLen + 8 * lane);
  return acc * kPrime32_1;
}

// Accumulator `lane` after XXH3's long loop over `input[0, len)`, len > 240.
LF_HOST_DEVICE uint64_t LongLoopLane(const uint8_t* input, size_t len, const uint8_t* secret,
                                     int lane) {
  uint64_t acc = InitAcc(lane);
  const size_t nb_blocks = (len - 1) / kBlockLen;
  for (size_t n = 0; n < nb_blocks; ++n) {
    const uint8_t* block = input + n * kBlockLen;
    // The 32 loads of a block are issued before they are used (the accumulator chain does not
    // feed them), so a GPU thread keeps many loads in flight instead of one per stripe. Same
    // arithmetic as AccumulateLane, stripe by stripe.
    uint64_t data[kStripesPerBlock], swapped[kStripesPerBlock];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (size_t s = 0; s < kStripesPerBlock; ++s) {
      data[s] = ReadLE64(block + s * kStripeLen + 8 * lane);
      swapped[s] = ReadLE64(block + s * kStripeLen + 8 * (lane ^ 1));
    }
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (size_t s = 0; s < kStripesPerBlock; ++s) {
      const uint64_t data_key = data[s] ^ ReadLE64(secret + s * 8 + 8 * lane);
      acc += swapped[s] + (data_key & 0xFFFFFFFFULL) * (data_key >> 32);
    }
    acc = ScrambleLane(acc, secret, lane);
  }
  const size_t nb_stripes = ((len - 1) - kBlockLen * nb_blocks) / kStripeLen;
  const uint8_t* last_block = input + nb_blocks * kBlockLen;
  for (size_t s = 0; s < nb_stripes; ++s)
    acc = AccumulateLane(acc, last_block + s * kStripeLen, secret + s * 8, lane);
  // Last stripe, with the secret offset by XXH_SECRET_LASTACC_START = 7.
  return AccumulateLane(acc, input + len - kStripeLen, secret + kSecretSize - kStripeLen - 7, lane);
}

LF_HOST_DEVICE void Mul128(uint64_t a, uint64_t b, uint64_t* lo, uint64_t* hi) {
#ifdef __CUDA_ARCH__
  *lo = a * b;
  *hi = __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  *lo = static_cast<uint64_t>(p);
  *hi = static_cast<uint64_t>(p >> 64);
#endif
}

LF_HOST_DEVICE uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  h ^= h >> 32;
  return h;
}

LF_HOST_DEVICE uint64_t MergeAccs(const uint64_t* acc, const uint8_t* secret, uint64_t start) {
  uint64_t r = start;
  for (int i = 0; i < 4; ++i) {
    uint64_t lo, hi;
    Mul128(acc[2 * i] ^ ReadLE64(secret + 16 * i), acc[2 * i + 1] ^ ReadLE64(secret + 16 * i + 8),
           &lo, &hi);
    r += lo ^ hi;
  }
  return Avalanche(r);
}

// Final 128-bit hash from the 8 lanes (XXH_SECRET_MERGEACCS_START = 11).
LF_HOST_DEVICE void Finalize128(const uint64_t* acc, size_t len, const uint8_t* secret,
                                uint64_t* lo, uint64_t* hi) {
  *lo = MergeAccs(acc, secret + 11, static_cast<uint64_t>(len) * kPrime64_1);
  *hi = MergeAccs(acc, secret + kSecretSize - 64 - 11, ~(static_cast<uint64_t>(len) * kPrime64_2));
}

}  // namespace xxh3
}  // namespace ckpt
}  // namespace loongforge
