// Tests of the row-wise e4m3 quantization (include/loongforge/compute.h): the element rounding
// against a brute-force nearest-value search, the CPU twin against the Note's formula, the checks,
// and the CUDA twin against the CPU twin bit for bit on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compute/quant_kernels.h"
#include "loongforge/compute.h"

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loongforge {
namespace compute {
namespace {

using internal::E4m3ToFloat;
using internal::FloatToE4m3;

uint16_t ToBf16(float v) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The nearest finite e4m3 value to v (|v| <= 448), ties to the even mantissa: by search over all
// codes.
uint8_t NearestE4m3(float v) {
  int best = -1;
  double best_d = 0;
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    if (std::signbit(v) != static_cast<bool>(b & 0x80)) continue;
    const double d = std::fabs(static_cast<double>(E4m3ToFloat(static_cast<uint8_t>(b))) - v);
    if (best < 0 || d < best_d || (d == best_d && (b & 1) == 0)) {
      best = b;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

// Guards the element rounding: known codes (zero signs, the limits, ties to even among normals and
// subnormals, saturation, NaN) and every finite code round-tripping.
TEST(ComputeE4m3, KnownValuesAndRoundTrip) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    float v;
    uint8_t code;
  } cases[] = {{0.0f, 0x00},
               {-0.0f, 0x80},
               {1.0f, 0x38},
               {-1.0f, 0xB8},
               {448.0f, 0x7E},
               {-448.0f, 0xFE},
               {500.0f, 0x7E},
               {INFINITY, 0x7E},
               {-INFINITY, 0xFE},
               {1.0625f, 0x38},
               {1.1875f, 0x3A},
               {std::ldexp(1.0f, -6), 0x08},
               {std::ldexp(1.0f, -9), 0x01},
               {std::ldexp(1.5f, -9), 0x02},
               {std::ldexp(0.5f, -9), 0x00},
               {std::ldexp(2.5f, -9), 0x02},
               {nan, 0x7F},
               {-nan, 0xFF}};
  for (const auto& c : cases) {
    EXPECT_EQ(FloatToE4m3(c.v), c.code) << c.v;
  }
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(E4m3ToFloat(static_cast<uint8_t>(b))));
      continue;
    }
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(b))), b) << b;
  }
}

// Guards the rounding on random values across the whole range: the nearest e4m3 value, ties to
// even, as a search over all codes finds it.
TEST(ComputeE4m3, RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp(-12.0f, 8.8f);
  std::uniform_int_distribution<int> sign(0, 1);
  for (int i = 0; i < 20000; ++i) {
    float v = std::exp2(exp(rng));
    if (v > 448.0f) v = 448.0f;
    if (sign(rng)) v = -v;
    ASSERT_EQ(FloatToE4m3(v), NearestE4m3(v)) << v;
  }
  // Exact midpoints between neighbours go to the even code.
  for (int b = 0; b < 0x7E; ++b) {
    const float lo = E4m3ToFloat(static_cast<uint8_t>(b));
    const float hi = E4m3ToFloat(static_cast<uint8_t>(b + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32
    ASSERT_EQ(FloatToE4m3(mid), (b & 1) ? b + 1 : b) << mid;
  }
}

// Guards the CPU twin: per-row scale amax * fp32(1/448) (a zero row takes the 1e-12 floor), bytes
// the rounding of x / scale, bf16 and f32 alike; a NaN poisons its row only.
TEST(ComputeE4m3, CpuRowsFollowTheNote) {
  const std::vector<float> x = {1.0f, -2.0f, 4.0f, 0.5f,   // amax 4
                                0.0f, 0.0f,  0.0f, 0.0f,   // zero row
                                3.0f, NAN,   1.0f, 2.0f};  // NaN row
  std::vector<uint8_t> q(12);
  std::vector<float> s(3);
  ASSERT_TRUE(QuantizeRowsE4m3(TensorView::Contiguous(x.data(), DType::kFloat32, {3, 4}),
                               TensorView::Contiguous(q.data(), DType::kUInt8, {3, 4}),
                               TensorView::Contiguous(s.data(), DType::kFloat32, {3}))
                  .ok());
  EXPECT_EQ(s[0], 4.0f / 448.0f);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(q[c], FloatToE4m3(x[c] / s[0])) << c;
  EXPECT_EQ(q[2], 0x7E);  // the row's largest is 448
  EXPECT_EQ(s[1], 1e-12f * (1.0f / 448.0f));
  for (int c = 4; c < 8; ++c) EXPECT_EQ(q[c], 0x00);
  EXPECT_TRUE(std::isnan(s[2]));
  for (int c = 8; c < 12; ++c) EXPECT_EQ(q[c] & 0x7F, 0x7F) << c;

  std::vector<uint16_t> xb(8);
  for (int i = 0; i < 8; ++i) xb[i] = ToBf16(x[i]);
  std::vector<uint8_t> qb(8);
  std::vector<float> sb(2);
  ASSERT_TRUE(QuantizeRowsE4m3(TensorView::Contiguous(xb.data(), DType::kBFloat16, {2, 4}),
                               TensorView::Contiguous(qb.data(), DType::kUInt8, {2, 4}),
                               TensorView::Contiguous(sb.data(), DType::kFloat32, {2}))
                  .ok());
  EXPECT_EQ(std::vector<uint8_t>(q.begin(), q.begin() + 8), qb);
  EXPECT_EQ(std::vector<float>(s.begin(), s.begin() + 2), sb);
}

// Guards the checks: each bad tensor is named.
TEST(ComputeE4m3, RefusesBadTensors) {
  std::vector<float> x(12), s(3), s_short(2);
  std::vector<uint8_t> q(12);
  std::vector<int32_t> xi(12);
  const TensorView xv = TensorView::Contiguous(x.data(), DType::kFloat32, {3, 4});
  const TensorView qv = TensorView::Contiguous(q.data(), DType::kUInt8, {3, 4});
  const TensorView sv = TensorView::Contiguous(s.data(), DType::kFloat32, {3});
  auto msg = [](const Status& st) { return st.ToString(); };
  Status st = QuantizeRowsE4m3(TensorView::Contiguous(xi.data(), DType::kInt32, {3, 4}), qv, sv);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(msg(st).find("'x'"), std::string::npos) << msg(st);
  st = QuantizeRowsE4m3(TensorView::Contiguous(x.data(), DType::kFloat32, {2, 3, 2}), qv, sv);
  EXPECT_NE(msg(st).find("2-d"), std::string::npos) << msg(st);
  st = QuantizeRowsE4m3(xv, TensorView::Contiguous(x.data(), DType::kFloat32, {3, 4}), sv);
  EXPECT_NE(msg(st).find("'q'"), std::string::npos) << msg(st);
  st = QuantizeRowsE4m3(xv, qv, TensorView::Contiguous(s_short.data(), DType::kFloat32, {2}));
  EXPECT_NE(msg(st).find("'scale'"), std::string::npos) << msg(st);
  TensorView on_gpu = qv;
  on_gpu.device = {DeviceType::kCUDA, 0};
  st = QuantizeRowsE4m3(xv, on_gpu, sv);
  EXPECT_NE(msg(st).find("tensor 'q' is on cuda:0"), std::string::npos) << msg(st);
  TensorView ro = sv;
  ro.read_only = true;
  EXPECT_EQ(QuantizeRowsE4m3(xv, qv, ro).code(), StatusCode::kInvalidArgument);
}

#ifdef LOONGFORGE_WITH_CUDA
// Guards the CUDA twin: bytes and scales equal the CPU twin's bit for bit on random rows (bf16 and
// f32; lengths that take the vector and the scalar paths; an unaligned start; zero and NaN rows;
// values spread over many binades), and an empty input launches nothing.
TEST(ComputeE4m3Cuda, MatchesCpu) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> binade(-20.0f, 20.0f);
  const struct {
    int64_t rows, cols, offset;
  } cases[] = {{1, 1, 0}, {3, 17, 0}, {64, 1152, 0}, {257, 4304, 0}, {33, 1536, 1}, {5, 8, 3}};
  for (const auto& c : cases) {
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) +
                   " offset " + std::to_string(c.offset) + (bf16 ? " bf16" : " f32"));
      const int64_t n_el = c.rows * c.cols;
      std::vector<float> xf(n_el);
      for (auto& v : xf) v = n(rng) * std::exp2(binade(rng));
      if (c.rows > 2) {
        for (int64_t j = 0; j < c.cols; ++j) xf[j] = 0.0f;  // a zero row
        xf[c.cols + c.cols / 2] = NAN;                      // a NaN row
      }
      const size_t esz = bf16 ? 2 : 4;
      std::vector<uint8_t> host((n_el + c.offset) * esz);
      for (int64_t i = 0; i < n_el; ++i) {
        if (bf16) {
          const uint16_t b = ToBf16(std::isnan(xf[i]) ? 0.0f : xf[i]);
          const uint16_t v = std::isnan(xf[i]) ? uint16_t{0x7FC0} : b;
          std::memcpy(&host[(i + c.offset) * 2], &v, 2);
        } else {
          std::memcpy(&host[(i + c.offset) * 4], &xf[i], 4);
        }
      }
      const DType dt = bf16 ? DType::kBFloat16 : DType::kFloat32;
      std::vector<uint8_t> q_cpu(n_el);
      std::vector<float> s_cpu(c.rows);
      ASSERT_TRUE(
          QuantizeRowsE4m3(TensorView::Contiguous(&host[c.offset * esz], dt, {c.rows, c.cols}),
                           TensorView::Contiguous(q_cpu.data(), DType::kUInt8, {c.rows, c.cols}),
                           TensorView::Contiguous(s_cpu.data(), DType::kFloat32, {c.rows}))
              .ok());
      uint8_t *dx = nullptr, *dq = nullptr;
      float* ds = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), host.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dq), n_el + c.offset), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ds), c.rows * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dx, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      const Device gpu{DeviceType::kCUDA, 0};
      const Status st = QuantizeRowsE4m3(
          TensorView::Contiguous(dx + c.offset * esz, dt, {c.rows, c.cols}, gpu),
          TensorView::Contiguous(dq + c.offset, DType::kUInt8, {c.rows, c.cols}, gpu),
          TensorView::Contiguous(ds, DType::kFloat32, {c.rows}, gpu));
      ASSERT_TRUE(st.ok()) << st.ToString();
      std::vector<uint8_t> q_gpu(n_el);
      std::vector<float> s_gpu(c.rows);
      ASSERT_EQ(cudaMemcpy(q_gpu.data(), dq + c.offset, n_el, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(s_gpu.data(), ds, c.rows * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(q_gpu, q_cpu);
      for (int64_t r = 0; r < c.rows; ++r) {
        if (std::isnan(s_cpu[r])) {  // NaN bits are the device's (0x7FFFFFFF on the GPU)
          EXPECT_TRUE(std::isnan(s_gpu[r])) << "row " << r;
          continue;
        }
        uint32_t a, b;
        std::memcpy(&a, &s_gpu[r], 4);
        std::memcpy(&b, &s_cpu[r], 4);
        EXPECT_EQ(a, b) << "row " << r;
      }
      cudaFree(dx);
      cudaFree(dq);
      cudaFree(ds);
    }
  }
  EXPECT_TRUE(QuantizeRowsE4m3(TensorView::Contiguous(static_cast<void*>(nullptr), DType::kFloat32,
                                                      {0, 8}, {DeviceType::kCUDA, 0}),
                               TensorView::Contiguous(static_cast<void*>(nullptr), DType::kUInt8,
                                                      {0, 8}, {DeviceType::kCUDA, 0}),
                               TensorView::Contiguous(static_cast<void*>(nullptr), DType::kFloat32,
                                                      {0}, {DeviceType::kCUDA, 0}))
                  .ok());
}
#endif  // LOONGFORGE_WITH_CUDA

}  // namespace
}  // namespace compute
}  // namespace loongforge
