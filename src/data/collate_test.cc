// Tests of stage 3 (collate.h): the CPU twin against hand-computed values, and the CUDA kernel
// against the twin on random staged batches (skipped without a device).
#include "collate.h"

#include <gtest/gtest.h>

#include "common/cuda_check.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loongforge {
namespace data {
namespace {

using internal::CollateDims;
using internal::CollateLayout;
using internal::CollateOut;

// A staged batch of `raw_rows` samples with random lengths and values (never all zero).
struct Staged {
  CollateLayout L;
  std::vector<uint8_t> raw;
  std::vector<int> len;  // tokens of each raw row
  Staged(int cap, int max_tokens, int S, int A, int H, int raw_rows, uint64_t seed) {
    L = CollateLayout::Make(cap, max_tokens, S, A, H);
    raw.assign(L.capacity_bytes, 0xCD);  // garbage where nothing is staged
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    auto* off = reinterpret_cast<int32_t*>(raw.data() + L.off_token_offset);
    auto* ids = reinterpret_cast<int32_t*>(raw.data() + L.off_tokens);
    auto* sidx = reinterpret_cast<int64_t*>(raw.data() + L.off_sample_index);
    auto* st = reinterpret_cast<float*>(raw.data() + L.off_state);
    auto* ac = reinterpret_cast<float*>(raw.data() + L.off_action);
    uint8_t* am = raw.data() + L.off_amask;
    auto* norm = reinterpret_cast<float*>(raw.data() + L.off_norm);
    int total = 0;
    for (int i = 0; i < raw_rows; ++i) {
      off[i] = total;
      len.push_back(1 + static_cast<int>(rng() % max_tokens));
      for (int t = 0; t < len.back(); ++t) ids[total++] = 3 + static_cast<int32_t>(rng() % 50000);
      sidx[i] = 1000 + 7 * i;
      for (int k = 0; k < S; ++k) st[i * S + k] = u(rng);
      for (int k = 0; k < H * A; ++k) ac[i * H * A + k] = u(rng);
      for (int k = 0; k < H; ++k) am[i * H + k] = rng() % 2;
    }
    off[raw_rows] = total;
    for (int k = 0; k < S + A; ++k) {
      norm[k < S ? k : S + k] = u(rng);                             // means
      norm[k < S ? S + k : S + A + k] = 0.25f + std::fabs(u(rng));  // stds
    }
  }
  // Output row o <- raw row src[o].
  void SetSrc(const std::vector<int>& src) {
    std::memcpy(raw.data() + L.off_src_row, src.data(), sizeof(int32_t) * src.size());
  }
};

struct HostOut {
  std::vector<int64_t> tokens, sample_index;
  std::vector<uint8_t> attention_mask, action_mask;
  std::vector<float> state, action;
  HostOut(const CollateLayout& L, int rows, int len)
      : tokens(rows * len, -7),
        sample_index(rows, -7),
        attention_mask(rows * len, 9),
        action_mask(rows * L.horizon, 9),
        state(rows * L.state_dim, -7.f),
        action(rows * L.horizon * L.action_dim, -7.f) {}
  CollateOut Ptrs() {
    return CollateOut{tokens.data(), attention_mask.data(), state.data(),
                      action.data(), action_mask.data(),    sample_index.data()};
  }
};

// Guards the twin's definition: padding with 0 and mask off past each row's length, truncation
// at `len`, (x - mean) / std, action mask and sample ids through src_row, zero padding rows.
TEST(Collate, ReferenceValues) {
  const int S = 3, A = 2, H = 2;
  Staged st(6, 8, S, A, H, 5, 1);
  st.SetSrc({4, 0, 2});  // raw rows 1 and 3 were dropped
  CollateDims d;
  d.n = 3;
  d.rows = 5;
  d.len = 4;
  d.normalize = true;
  HostOut out(st.L, d.rows, d.len);
  internal::CollateReference(st.L, st.raw.data(), d, out.Ptrs());
  const auto* off = reinterpret_cast<const int32_t*>(st.raw.data() + st.L.off_token_offset);
  const auto* ids = reinterpret_cast<const int32_t*>(st.raw.data() + st.L.off_tokens);
  const auto* sv = reinterpret_cast<const float*>(st.raw.data() + st.L.off_state);
  const auto* av = reinterpret_cast<const float*>(st.raw.data() + st.L.off_action);
  const auto* norm = reinterpret_cast<const float*>(st.raw.data() + st.L.off_norm);
  const int src[3] = {4, 0, 2};
  for (int o = 0; o < 3; ++o) {
    const int i = src[o];
    EXPECT_EQ(out.sample_index[o], 1000 + 7 * i);
    for (int t = 0; t < d.len; ++t) {
      const bool on = t < st.len[i];
      EXPECT_EQ(out.attention_mask[o * d.len + t], on) << o << "," << t;
      EXPECT_EQ(out.tokens[o * d.len + t], on ? ids[off[i] + t] : 0) << o << "," << t;
    }
    for (int k = 0; k < S; ++k)
      EXPECT_EQ(out.state[o * S + k], (sv[i * S + k] - norm[k]) / norm[S + k]);
    for (int k = 0; k < H * A; ++k)
      EXPECT_EQ(out.action[o * H * A + k],
                (av[i * H * A + k] - norm[2 * S + k % A]) / norm[2 * S + A + k % A]);
    for (int k = 0; k < H; ++k)
      EXPECT_EQ(out.action_mask[o * H + k], st.raw[st.L.off_amask + i * H + k]);
  }
  for (int o = 3; o < 5; ++o) {
    EXPECT_EQ(out.sample_index[o], -1);
    for (int t = 0; t < d.len; ++t) {
      EXPECT_EQ(out.tokens[o * d.len + t], 0);
      EXPECT_EQ(out.attention_mask[o * d.len + t], 0);
    }
    for (int k = 0; k < S; ++k) EXPECT_EQ(out.state[o * S + k], 0.f);
    for (int k = 0; k < H * A; ++k) EXPECT_EQ(out.action[o * H * A + k], 0.f);
    for (int k = 0; k < H; ++k) EXPECT_EQ(out.action_mask[o * H + k], 0);
  }
  // Bad dims are caller errors.
  d.rows = 7;
  EXPECT_EQ(internal::ValidateCollate(st.L, d).code(), StatusCode::kInvalidArgument);
}

// Guards the q01_q99 clamp (CollateDims::clip): values mapped outside [-1, 1] are clamped, those
// inside are the plain (x - centre) / scale; without clip nothing is clamped.
TEST(Collate, ClipClampsToUnitRange) {
  const int S = 4, A = 3, H = 3;
  Staged st(4, 4, S, A, H, 4, 5);
  auto* norm = reinterpret_cast<float*>(st.raw.data() + st.L.off_norm);
  for (int k = 0; k < 2 * (S + A); ++k) norm[k] = k % 2 ? 0.5f : 0.1f;  // values in [-3, 3] spill
  st.SetSrc({0, 1, 2, 3});
  CollateDims d;
  d.n = d.rows = 4;
  d.normalize = true;
  HostOut plain(st.L, d.rows, d.len), clipped(st.L, d.rows, d.len);
  internal::CollateReference(st.L, st.raw.data(), d, plain.Ptrs());
  d.clip = true;
  internal::CollateReference(st.L, st.raw.data(), d, clipped.Ptrs());
  int inside = 0, outside = 0;
  auto check = [&](float p, float c) {
    if (p > 1.f || p < -1.f) {
      ++outside;
      EXPECT_EQ(c, p > 0 ? 1.f : -1.f);
    } else {
      ++inside;
      EXPECT_EQ(c, p);
    }
  };
  for (size_t i = 0; i < plain.state.size(); ++i) check(plain.state[i], clipped.state[i]);
  for (size_t i = 0; i < plain.action.size(); ++i) check(plain.action[i], clipped.action[i]);
  EXPECT_GT(inside, 0);
  EXPECT_GT(outside, 0);
}

#ifdef LOONGFORGE_WITH_CUDA
bool HaveDevice() { return ::loongforge::internal::CudaDevicePresent(); }

// Guards the launcher's validation: bad dims are InvalidArgument before any device work (so it
// holds on machines without a GPU too).
TEST(CollateKernel, RejectsBadDims) {
  Staged st(4, 8, 2, 2, 2, 4, 2);
  CollateDims d;
  d.n = 5;
  d.rows = 4;
  CollateOut out;
  EXPECT_EQ(internal::LaunchCollate(st.L, nullptr, d, out, nullptr).code(),
            StatusCode::kInvalidArgument);
  d.n = 2;
  d.rows = 3;
  d.len = 0;
  EXPECT_EQ(internal::LaunchCollate(st.L, nullptr, d, out, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// Guards the kernel against its CPU twin, bit for bit, on random batches: with and without
// normalization (and its q01_q99 clamp), cut and padded tokens, dropped rows and static-shape
// padding rows.
TEST(CollateKernel, MatchesReference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  for (int trial = 0; trial < 8; ++trial) {
    const int cap = 37 + trial * 50, S = 5 + trial, A = 3 + trial, H = 2 + trial % 3;
    const int max_tokens = 16 + 8 * trial;
    Staged st(cap, max_tokens, S, A, H, cap, 100 + trial);
    std::mt19937_64 rng(trial);
    std::vector<int> src;
    for (int i = 0; i < cap; ++i)
      if (rng() % 5) src.push_back(i);  // ~20% dropped
    st.SetSrc(src);
    CollateDims d;
    d.n = static_cast<int>(src.size());
    d.rows = trial % 2 ? cap : d.n;
    d.len = trial % 3 == 0 ? max_tokens / 2 : max_tokens;  // some rows cut at len
    d.normalize = trial % 2 == 0 || trial >= 6;
    d.clip = trial >= 6;  // trials 6, 7: scales small enough that many values clamp
    if (d.clip) {
      auto* norm = reinterpret_cast<float*>(st.raw.data() + st.L.off_norm);
      for (int k = S; k < 2 * S; ++k) norm[k] = 0.4f;
      for (int k = 2 * S + A; k < 2 * S + 2 * A; ++k) norm[k] = 0.4f;
    }
    HostOut ref(st.L, d.rows, d.len), got(st.L, d.rows, d.len);
    internal::CollateReference(st.L, st.raw.data(), d, ref.Ptrs());
    const auto* off = reinterpret_cast<const int32_t*>(st.raw.data() + st.L.off_token_offset);
    const size_t copy = st.L.Bytes(off[cap]);
    uint8_t *draw = nullptr, *dout = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&draw), st.L.capacity_bytes), cudaSuccess);
    const size_t tb = sizeof(int64_t) * d.rows * d.len, mb = size_t(d.rows) * d.len;
    const size_t sb = sizeof(float) * d.rows * S, ab = sizeof(float) * d.rows * H * A;
    const size_t kb = size_t(d.rows) * H, ib = sizeof(int64_t) * d.rows;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), tb + mb + sb + ab + kb + ib + 64),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(dout, 0x5A, tb + mb + sb + ab + kb + ib + 64), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(draw, st.raw.data(), copy, cudaMemcpyHostToDevice), cudaSuccess);
    CollateOut o;
    o.tokens = reinterpret_cast<int64_t*>(dout);
    o.sample_index = reinterpret_cast<int64_t*>(dout + tb);
    o.state = reinterpret_cast<float*>(dout + tb + ib);
    o.action = reinterpret_cast<float*>(dout + tb + ib + sb);
    o.attention_mask = dout + tb + ib + sb + ab;
    o.action_mask = dout + tb + ib + sb + ab + mb;
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_TRUE(internal::LaunchCollate(st.L, draw, d, o, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto back = [](auto& v, const void* p) {
      ASSERT_EQ(cudaMemcpy(v.data(), p, v.size() * sizeof(v[0]), cudaMemcpyDeviceToHost),
                cudaSuccess);
    };
    back(got.tokens, o.tokens);
    back(got.sample_index, o.sample_index);
    back(got.state, o.state);
    back(got.action, o.action);
    back(got.attention_mask, o.attention_mask);
    back(got.action_mask, o.action_mask);
    EXPECT_EQ(got.tokens, ref.tokens) << "trial " << trial;
    EXPECT_EQ(got.attention_mask, ref.attention_mask) << "trial " << trial;
    EXPECT_EQ(got.state, ref.state) << "trial " << trial;  // bitwise: same IEEE operations
    EXPECT_EQ(got.action, ref.action) << "trial " << trial;
    EXPECT_EQ(got.action_mask, ref.action_mask) << "trial " << trial;
    EXPECT_EQ(got.sample_index, ref.sample_index) << "trial " << trial;
    cudaStreamDestroy(stream);
    cudaFree(draw);
    cudaFree(dout);
  }
}
#endif  // LOONGFORGE_WITH_CUDA

}  // namespace
}  // namespace data
}  // namespace loongforge
