// Tests of the NexusSync compression kernels (top-k with error feedback, scatter-add) against a
// plain sort-based reference, on random inputs; the CUDA twins against the CPU kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "comm/topk_common.h"
#include "comm/topk_kernels.h"
#include "loongforge/comm.h"

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loongforge {
namespace comm {
namespace {

using internal::ScatterAddCpu;
using internal::TopKErrorFeedbackCpu;
#ifdef LOONGFORGE_WITH_CUDA
using internal::ScatterAddCuda;
using internal::TopKErrorFeedbackCuda;
#endif

std::vector<float> RandomVec(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Reference: the k largest |r| (ties: lower index), by full sort.
std::vector<int32_t> ReferenceTopK(const std::vector<float>& r, int64_t k) {
  std::vector<int32_t> idx(r.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return internal::MagnitudeKey(r[a]) > internal::MagnitudeKey(r[b]);
  });
  idx.resize(std::min<int64_t>(k, r.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

struct TopKCase {
  int64_t n;
  int64_t k;
  int threads;
};

// Guards the radix select: selected set, order, values and cleared residual match a full sort,
// for small/large buffers, k at the edges, and the multi-threaded chunking.
TEST(CommTopK, MatchesSortReference) {
  const TopKCase cases[] = {
      {1, 1, 1},           {17, 5, 1},           {1000, 0, 1},      {1000, 1000, 1},
      {1000, 2000, 1},     {4096, 41, 1},        {300000, 3000, 2}, {300000, 3000, 4},
      {1 << 20, 10486, 0}, {(1 << 20) + 7, 1, 3}};
  for (const auto& c : cases) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                 " threads=" + std::to_string(c.threads));
    std::vector<float> residual = RandomVec(c.n, 1 + c.n, 0.5f);
    const std::vector<float> grad = RandomVec(c.n, 2 + c.n);
    std::vector<float> acc(c.n);
    for (int64_t i = 0; i < c.n; ++i) acc[i] = residual[i] + grad[i];
    const int64_t k = std::min(c.k, c.n);
    std::vector<float> values(k);
    std::vector<int32_t> indices(k);
    ASSERT_TRUE(TopKErrorFeedbackCpu(grad.data(), DType::kFloat32, residual.data(), c.n, c.k,
                                     values.data(), DType::kFloat32, indices.data(), c.threads)
                    .ok());
    const auto ref = ReferenceTopK(acc, k);
    ASSERT_EQ(indices, ref);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(values[j], acc[indices[j]]);
      EXPECT_EQ(residual[indices[j]], 0.0f);
    }
    // Unselected entries keep the accumulated value exactly.
    std::vector<char> sel(c.n, 0);
    for (int32_t i : indices) sel[i] = 1;
    for (int64_t i = 0; i < c.n; ++i)
      if (!sel[i]) ASSERT_EQ(residual[i], acc[i]) << i;
  }
}

// Guards the tie rule (many equal magnitudes in one bin): exactly k selected, lowest indices first.
TEST(CommTopK, TiesTakeLowestIndices) {
  const int64_t n = 500000;
  std::vector<float> residual(n);
  for (int64_t i = 0; i < n; ++i) residual[i] = (i % 3 == 0) ? -2.0f : ((i % 3 == 1) ? 2.0f : 1.0f);
  const int64_t k = 200000;  // 333334 entries tie at |2|
  std::vector<float> values(k);
  std::vector<int32_t> indices(k);
  ASSERT_TRUE(TopKErrorFeedbackCpu(nullptr, DType::kFloat32, residual.data(), n, k, values.data(),
                                   DType::kFloat32, indices.data(), 2)
                  .ok());
  std::vector<int32_t> expect;
  for (int64_t i = 0; i < n && static_cast<int64_t>(expect.size()) < k; ++i)
    if (i % 3 != 2) expect.push_back(static_cast<int32_t>(i));
  EXPECT_EQ(indices, expect);
}

// Guards error feedback: over many steps, everything sent plus the residual equals the sum of the
// gradients, exactly (integer-valued grads make fp32 sums exact), for fp32 and bf16 inputs.
TEST(CommTopK, ErrorFeedbackConservesExactly) {
  const int64_t n = 70000, k = 700;
  for (DType gt : {DType::kFloat32, DType::kBFloat16}) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> d(-50, 50);
    std::vector<float> residual(n, 0.0f), sent(n, 0.0f), total(n, 0.0f);
    std::vector<float> values(k);
    std::vector<int32_t> indices(k);
    for (int step = 0; step < 20; ++step) {
      std::vector<float> g(n);
      std::vector<uint16_t> gb(n);
      for (int64_t i = 0; i < n; ++i) {
        g[i] = static_cast<float>(d(rng));
        gb[i] = internal::FloatToBf16(g[i]);  // small integers are exact in bf16
        total[i] += g[i];
      }
      const void* gp = gt == DType::kFloat32 ? static_cast<const void*>(g.data()) : gb.data();
      ASSERT_TRUE(TopKErrorFeedbackCpu(gp, gt, residual.data(), n, k, values.data(),
                                       DType::kFloat32, indices.data())
                      .ok());
      for (int64_t j = 0; j < k; ++j) sent[indices[j]] += values[j];
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sent[i] + residual[i], total[i]) << i;
  }
}

// Guards bf16 value output: the rounding error stays in the residual (value + residual == acc).
TEST(CommTopK, Bf16ValuesKeepRoundingErrorInResidual) {
  const int64_t n = 10000, k = 100;
  std::vector<float> residual = RandomVec(n, 11);
  const std::vector<float> before = residual;
  std::vector<uint16_t> values(k);
  std::vector<int32_t> indices(k);
  ASSERT_TRUE(TopKErrorFeedbackCpu(nullptr, DType::kFloat32, residual.data(), n, k, values.data(),
                                   DType::kBFloat16, indices.data())
                  .ok());
  EXPECT_EQ(indices, ReferenceTopK(before, k));
  for (int64_t j = 0; j < k; ++j) {
    const int32_t i = indices[j];
    EXPECT_EQ(internal::Bf16ToFloat(values[j]) + residual[i], before[i]);
    EXPECT_LE(std::fabs(residual[i]), std::fabs(before[i]) * (1.0f / 256));
  }
}

// Guards the caller-error paths: sizes beyond int32 indices and null outputs are InvalidArgument.
TEST(CommTopK, RejectsBadArguments) {
  float r = 1.0f;
  EXPECT_EQ(TopKErrorFeedbackCpu(nullptr, DType::kFloat32, &r, int64_t{1} << 31, 1, &r,
                                 DType::kFloat32, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      TopKErrorFeedbackCpu(nullptr, DType::kFloat32, &r, 1, 1, nullptr, DType::kFloat32, nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  int32_t bad = 5;
  Status s = ScatterAddCpu(&r, DType::kFloat32, &bad, 1, 1, &r, DType::kFloat32, 1, 1.0f, false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("index 5"), std::string::npos) << s;
}

// Guards scatter-add averaging: equals a dense per-rank sum in rank order, for sorted (threaded)
// and unsorted (serial) segments, fp32 and bf16 dense buffers.
TEST(CommScatterAdd, MatchesDenseReference) {
  const int64_t n = 600000, len = 150000, world = 4;
  std::mt19937 rng(3);
  for (bool sorted : {true, false}) {
    std::vector<int32_t> idx(world * len);
    std::vector<float> vals = RandomVec(world * len, 5);
    for (int64_t s = 0; s < world; ++s) {
      std::vector<int32_t> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      perm.resize(len);
      if (sorted) std::sort(perm.begin(), perm.end());
      std::copy(perm.begin(), perm.end(), idx.begin() + s * len);
    }
    std::vector<float> ref(n, 0.0f), ref_abs(n, 0.0f);
    for (int64_t j = 0; j < world * len; ++j) {
      ref[idx[j]] += 0.25f * vals[j];
      ref_abs[idx[j]] += 0.25f * std::fabs(vals[j]);
    }
    std::vector<float> dense(n, 123.0f);
    ASSERT_TRUE(ScatterAddCpu(vals.data(), DType::kFloat32, idx.data(), world, len, dense.data(),
                              DType::kFloat32, n, 0.25f, true, 2)
                    .ok());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dense[i], ref[i]) << i;
    std::vector<uint16_t> dense_bf(n, 0);
    ASSERT_TRUE(ScatterAddCpu(vals.data(), DType::kFloat32, idx.data(), world, len, dense_bf.data(),
                              DType::kBFloat16, n, 0.25f, false, 2)
                    .ok());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(internal::Bf16ToFloat(dense_bf[i]), ref[i], 0.02f * ref_abs[i] + 1e-6f);
  }
}

#ifdef LOONGFORGE_WITH_CUDA
bool HaveDevice() { return CudaAvailable(); }

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, v.size() * sizeof(T))),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}
template <typename T>
std::vector<T> ToHost(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Guards the CUDA radix select: same indices, values and residual as the CPU kernel (fp32 and
// bf16 grads/values, ties, k at the edges, sizes that are not multiples of a tile).
TEST(CommTopKCuda, MatchesCpu) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const TopKCase cases[] = {{1, 1, 0},      {1000, 0, 0},      {1000, 1000, 0},
                            {4097, 41, 0},  {300001, 3000, 0}, {(1 << 22) + 3, 41943, 0},
                            {5000000, 1, 0}};
  for (const auto& c : cases) {
    for (DType gt : {DType::kFloat32, DType::kBFloat16}) {
      for (DType vt : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE("n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                     " grad_bf16=" + std::to_string(gt == DType::kBFloat16) +
                     " value_bf16=" + std::to_string(vt == DType::kBFloat16));
        std::vector<float> residual = RandomVec(c.n, 21 + c.n, 0.5f);
        std::vector<float> grad = RandomVec(c.n, 22 + c.n);
        // Quantize so that ties occur.
        for (auto& x : grad) x = std::round(x * 64.0f) / 64.0f;
        for (auto& x : residual) x = std::round(x * 64.0f) / 64.0f;
        std::vector<uint16_t> grad_bf(c.n);
        for (int64_t i = 0; i < c.n; ++i) grad_bf[i] = internal::FloatToBf16(grad[i]);
        const int64_t k = std::min(c.k, c.n);
        const int vsize = DTypeSize(vt);
        std::vector<char> cpu_vals(std::max<int64_t>(1, k) * vsize);
        std::vector<int32_t> cpu_idx(k);
        std::vector<float> cpu_res = residual;
        const void* gh =
            gt == DType::kFloat32 ? static_cast<const void*>(grad.data()) : grad_bf.data();
        ASSERT_TRUE(TopKErrorFeedbackCpu(gh, gt, cpu_res.data(), c.n, c.k, cpu_vals.data(), vt,
                                         cpu_idx.data())
                        .ok());
        float* d_res = ToDevice(residual);
        void* d_grad = gt == DType::kFloat32 ? static_cast<void*>(ToDevice(grad))
                                             : static_cast<void*>(ToDevice(grad_bf));
        char* d_vals = ToDevice(std::vector<char>(std::max<int64_t>(1, k) * vsize));
        int32_t* d_idx = ToDevice(std::vector<int32_t>(std::max<int64_t>(1, k)));
        ASSERT_TRUE(
            TopKErrorFeedbackCuda(d_grad, gt, d_res, c.n, c.k, d_vals, vt, d_idx, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(ToHost(d_idx, k), cpu_idx);
        EXPECT_EQ(ToHost(d_vals, k * vsize),
                  std::vector<char>(cpu_vals.begin(), cpu_vals.begin() + k * vsize));
        EXPECT_EQ(ToHost(d_res, c.n), cpu_res);
        cudaFree(d_res);
        cudaFree(d_grad);
        cudaFree(d_vals);
        cudaFree(d_idx);
      }
    }
  }
}

// Guards the CUDA scatter-add: fp32 result equals the CPU kernel bit for bit (unique indices per
// segment, rank order); bf16 within rounding.
TEST(CommScatterAddCuda, MatchesCpu) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 1 << 20, len = 50000, world = 4;
  std::mt19937 rng(9);
  std::vector<int32_t> idx(world * len);
  for (int64_t s = 0; s < world; ++s) {
    std::vector<int32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::sort(perm.begin(), perm.begin() + len);
    std::copy(perm.begin(), perm.begin() + len, idx.begin() + s * len);
  }
  std::vector<float> vals = RandomVec(world * len, 10);
  std::vector<float> cpu(n, 0.0f), cpu_abs(n, 0.0f);
  for (int64_t j = 0; j < world * len; ++j) cpu_abs[idx[j]] += 0.25f * std::fabs(vals[j]);
  ASSERT_TRUE(ScatterAddCpu(vals.data(), DType::kFloat32, idx.data(), world, len, cpu.data(),
                            DType::kFloat32, n, 0.25f, true)
                  .ok());
  float* d_vals = ToDevice(vals);
  int32_t* d_idx = ToDevice(idx);
  float* d_dense = ToDevice(std::vector<float>(n, 7.0f));
  ASSERT_TRUE(ScatterAddCuda(d_vals, DType::kFloat32, d_idx, world, len, d_dense, DType::kFloat32,
                             n, 0.25f, true, nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ToHost(d_dense, n), cpu);
  uint16_t* d_bf = ToDevice(std::vector<uint16_t>(n, 0));
  ASSERT_TRUE(ScatterAddCuda(d_vals, DType::kFloat32, d_idx, world, len, d_bf, DType::kBFloat16, n,
                             0.25f, false, nullptr)
                  .ok());
  auto bf = ToHost(d_bf, n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(internal::Bf16ToFloat(bf[i]), cpu[i], 0.02f * cpu_abs[i] + 1e-6f) << i;
  cudaFree(d_vals);
  cudaFree(d_idx);
  cudaFree(d_dense);
  cudaFree(d_bf);
}
#endif  // LOONGFORGE_WITH_CUDA

// ---- the public entry points: validation beside the kernels ------------------------------------

// Guards dispatch: the TensorView entry point on host memory gives exactly the raw CPU kernel's
// result (bf16 grad, bf16 values).
TEST(CommTopKView, MatchesRawKernel) {
  const int64_t n = 5000, k = 77;
  const std::vector<float> g = RandomVec(n, 11);
  std::vector<uint16_t> gb(n);
  for (int64_t i = 0; i < n; ++i) gb[i] = internal::FloatToBf16(g[i]);
  std::vector<float> r1 = RandomVec(n, 12), r2 = r1;
  std::vector<uint16_t> v1(k), v2(k);
  std::vector<int32_t> i1(k), i2(k);
  ASSERT_TRUE(TopKErrorFeedbackCpu(gb.data(), DType::kBFloat16, r1.data(), n, k, v1.data(),
                                   DType::kBFloat16, i1.data())
                  .ok());
  const TensorView grad = TensorView::Contiguous(gb.data(), DType::kBFloat16, {50, 100});
  const Status s = TopKErrorFeedback(&grad, TensorView::Contiguous(r2.data(), DType::kFloat32, {n}),
                                     k, TensorView::Contiguous(v2.data(), DType::kBFloat16, {k}),
                                     TensorView::Contiguous(i2.data(), DType::kInt32, {k}));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(r1, r2);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(i1, i2);
}

// Guards the checks that moved from Python into C++: each bad tensor is InvalidArgument naming
// that tensor and what is wrong with it, before any memory is touched.
TEST(CommTopKView, RejectsBadTensorsByName) {
  std::vector<float> r(64, 1.0f), v(8);
  std::vector<int32_t> idx(8);
  std::vector<double> f64(64);
  const TensorView residual = TensorView::Contiguous(r.data(), DType::kFloat32, {64});
  const TensorView values = TensorView::Contiguous(v.data(), DType::kFloat32, {8});
  const TensorView indices = TensorView::Contiguous(idx.data(), DType::kInt32, {8});
  auto expect_bad = [](const Status& s, const std::string& want) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  };
  const TensorView bad_grad = TensorView::Contiguous(f64.data(), DType::kFloat64, {64});
  expect_bad(TopKErrorFeedback(&bad_grad, residual, 8, values, indices),
             "tensor 'grad' has dtype f64; expected f32 or bf16");
  TensorView strided = residual;
  strided.shape = {8, 4};
  strided.strides = {1, 16};
  expect_bad(TopKErrorFeedback(nullptr, strided, 8, values, indices),
             "tensor 'residual' is not contiguous");
  TensorView on_gpu = values;
  on_gpu.device = {DeviceType::kCUDA, 1};
  expect_bad(TopKErrorFeedback(nullptr, residual, 8, on_gpu, indices),
             "tensor 'values' is on cuda:1 but tensor 'residual' is on cpu");
  expect_bad(TopKErrorFeedback(nullptr, residual, 9, values, indices),
             "tensor 'values' has 8 elements");
  TensorView wide = indices;
  wide.dtype = DType::kInt64;
  expect_bad(TopKErrorFeedback(nullptr, residual, 8, values, wide),
             "tensor 'indices' has dtype i64; expected i32");
  TensorView frozen = values;
  frozen.read_only = true;
  expect_bad(TopKErrorFeedback(nullptr, residual, 8, frozen, indices),
             "tensor 'values' is read-only");
  EXPECT_EQ(r, std::vector<float>(64, 1.0f));  // nothing was written
}

// Guards scatter-add's checks: segment split, indices dtype and size, dense dtype, by name.
TEST(CommScatterAddView, RejectsBadTensorsByName) {
  std::vector<float> vals(6, 1.0f), dense(10);
  std::vector<int32_t> idx = {0, 1, 2, 3, 4, 5};
  std::vector<int64_t> idx64(6);
  const TensorView v = TensorView::Contiguous(vals.data(), DType::kFloat32, {6});
  const TensorView i = TensorView::Contiguous(idx.data(), DType::kInt32, {6});
  const TensorView d = TensorView::Contiguous(dense.data(), DType::kFloat32, {10});
  Status s = ScatterAdd(v, i, 4, d, 1.0f, false);
  EXPECT_NE(s.message().find("6 values do not split into 4 segments"), std::string::npos) << s;
  s = ScatterAdd(v, TensorView::Contiguous(idx64.data(), DType::kInt64, {6}), 1, d, 1.0f, false);
  EXPECT_NE(s.message().find("tensor 'indices' has dtype i64"), std::string::npos) << s;
  s = ScatterAdd(v, TensorView::Contiguous(idx.data(), DType::kInt32, {5}), 1, d, 1.0f, false);
  EXPECT_NE(s.message().find("tensor 'indices' has 5 elements"), std::string::npos) << s;
  s = ScatterAdd(v, i, 1, TensorView::Contiguous(idx64.data(), DType::kInt64, {6}), 1.0f, false);
  EXPECT_NE(s.message().find("tensor 'dense' has dtype i64"), std::string::npos) << s;
  ASSERT_TRUE(ScatterAdd(v, i, 2, d, 0.5f, true).ok());
  EXPECT_EQ(dense[0], 0.5f);
  EXPECT_EQ(dense[9], 0.0f);
}

}  // namespace
}  // namespace comm
}  // namespace loongforge
