// CPU top-k with error feedback and scatter-add (src/comm/topk_kernels.h; contract in
// include/loongforge/comm.h).
//
// Selection is a two-level radix select on the magnitude bits, multi-threaded over contiguous
// chunks: pass 1 accumulates residual += grad and builds a 2048-bin histogram of the top magnitude
// bits; pass 2 counts, per chunk, the entries strictly above the threshold bin and collects the
// candidates inside it; the exact k-th (key, index) is found among the candidates with
// nth_element; pass 3 writes the selected entries in index order (per-chunk offsets from the
// counts) and clears them from the residual. Every pass streams memory once, so the cost is
// ~3 reads + 1 write of the residual, independent of k.
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/topk_common.h"
#include "comm/topk_kernels.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace comm {
namespace internal {
namespace {

constexpr int64_t kSerialBelowElems = int64_t{1} << 18;
constexpr int kHistBits = 11;
constexpr int kHistBins = 1 << kHistBits;
constexpr int kHistShift = 31 - kHistBits;  // key < 2^31: top 11 bits of the magnitude

int ResolveThreads(int num_threads, int64_t n) {
  if (n < kSerialBelowElems) return 1;
  int t = num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  t = std::max(1, t);
  // At least 64 Ki elements per thread, or the spawn cost dominates.
  return static_cast<int>(std::min<int64_t>(t, std::max<int64_t>(1, n >> 16)));
}

// Runs fn(chunk) for chunk in [0, num_chunks) on num_chunks threads (the caller runs chunk 0).
template <typename Fn>
void ParallelChunks(int num_chunks, Fn&& fn) {
  if (num_chunks <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(num_chunks - 1);
  for (int c = 1; c < num_chunks; ++c) threads.emplace_back([&fn, c] { fn(c); });
  fn(0);
  for (auto& t : threads) t.join();
}

struct Candidate {
  uint32_t key;
  int32_t index;
};

// Orders by larger magnitude first, then lower index (the deterministic tie rule).
inline bool Before(uint32_t ka, int64_t ia, uint32_t kb, int64_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

Status CheckCommon(const void* grad_ok, const float* residual, int64_t n, int64_t k,
                   const void* out_values, const int32_t* out_indices) {
  if (n < 0 || k < 0) {
    return InvalidArgumentError("top-k: negative size (n=" + std::to_string(n) +
                                ", k=" + std::to_string(k) + ")");
  }
  if (n >= (int64_t{1} << 31)) {
    return InvalidArgumentError("top-k: buffer of " + std::to_string(n) +
                                " elements exceeds int32 indices (split it into buckets)");
  }
  if (n > 0 && residual == nullptr) return InvalidArgumentError("top-k: residual is null");
  if (k > 0 && n > 0 && (out_values == nullptr || out_indices == nullptr)) {
    return InvalidArgumentError("top-k: output values/indices are null");
  }
  (void)grad_ok;
  return Status::Ok();
}

}  // namespace

Status TopKErrorFeedbackCpu(const void* grad, DType grad_dtype, float* residual, int64_t n,
                            int64_t k, void* out_values, DType value_dtype, int32_t* out_indices,
                            int num_threads) {
  LF_RETURN_IF_ERROR(CheckCommon(grad, residual, n, k, out_values, out_indices));
  k = std::min(k, n);
  const int nt = ResolveThreads(num_threads, n);
  const int64_t chunk = (n + nt - 1) / std::max(1, nt);
  auto chunk_range = [&](int c, int64_t* lo, int64_t* hi) {
    *lo = std::min<int64_t>(n, c * chunk);
    *hi = std::min<int64_t>(n, *lo + chunk);
  };

  // Pass 1: residual += grad, histogram of the top magnitude bits.
  std::vector<std::vector<int64_t>> hists(nt, std::vector<int64_t>(k > 0 ? kHistBins : 0, 0));
  ParallelChunks(nt, [&](int c) {
    int64_t lo, hi;
    chunk_range(c, &lo, &hi);
    if (grad != nullptr) {
      if (grad_dtype == DType::kFloat32) {
        const float* g = static_cast<const float*>(grad);
        for (int64_t i = lo; i < hi; ++i) residual[i] += g[i];
      } else {
        const uint16_t* g = static_cast<const uint16_t*>(grad);
        for (int64_t i = lo; i < hi; ++i) residual[i] += Bf16ToFloat(g[i]);
      }
    }
    if (k == 0) return;
    int64_t* h = hists[c].data();
    for (int64_t i = lo; i < hi; ++i) ++h[MagnitudeKey(residual[i]) >> kHistShift];
  });
  if (k == 0 || n == 0) return Status::Ok();

  // Threshold bin: the bin holding the k-th largest key, counting from the top.
  std::vector<int64_t> hist(kHistBins, 0);
  for (const auto& h : hists)
    for (int b = 0; b < kHistBins; ++b) hist[b] += h[b];
  int bin = kHistBins - 1;
  int64_t above = 0;
  for (; bin > 0; --bin) {
    if (above + hist[bin] >= k) break;
    above += hist[bin];
  }
  const int64_t need = k - above;  // taken from inside `bin`, 1 <= need <= hist[bin]

  // Pass 2: per chunk, count keys above the bin and collect the candidates inside it.
  std::vector<int64_t> above_per_chunk(nt, 0);
  std::vector<std::vector<Candidate>> cands(nt);
  ParallelChunks(nt, [&](int c) {
    int64_t lo, hi;
    chunk_range(c, &lo, &hi);
    int64_t cnt = 0;
    auto& out = cands[c];
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t key = MagnitudeKey(residual[i]);
      const int b = static_cast<int>(key >> kHistShift);
      cnt += b > bin;
      if (b == bin) out.push_back({key, static_cast<int32_t>(i)});
    }
    above_per_chunk[c] = cnt;
  });
  std::vector<Candidate> all;
  all.reserve(hist[bin]);
  for (const auto& v : cands) all.insert(all.end(), v.begin(), v.end());
  std::nth_element(all.begin(), all.begin() + (need - 1), all.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return Before(a.key, a.index, b.key, b.index);
                   });
  const uint32_t t_key = all[need - 1].key;
  const int64_t t_index = all[need - 1].index;
  auto selected = [&](uint32_t key, int64_t i) {
    return key > t_key || (key == t_key && i <= t_index);
  };

  // Output offsets per chunk: entries above the bin plus the chunk's candidates that made it.
  std::vector<int64_t> offset(nt + 1, 0);
  for (int c = 0; c < nt; ++c) {
    int64_t sel = above_per_chunk[c];
    for (const Candidate& cd : cands[c]) sel += selected(cd.key, cd.index);
    offset[c + 1] = offset[c] + sel;
  }
  LF_CHECK(offset[nt] == k) << "top-k selected " << offset[nt] << " of k=" << k;

  // Pass 3: write in index order and clear (or keep the rounding error of) what was sent.
  ParallelChunks(nt, [&](int c) {
    int64_t lo, hi;
    chunk_range(c, &lo, &hi);
    int64_t o = offset[c];
    for (int64_t i = lo; i < hi; ++i) {
      const float r = residual[i];
      if (!selected(MagnitudeKey(r), i)) continue;
      out_indices[o] = static_cast<int32_t>(i);
      if (value_dtype == DType::kFloat32) {
        static_cast<float*>(out_values)[o] = r;
        residual[i] = 0.0f;
      } else {
        const uint16_t v = FloatToBf16(r);
        static_cast<uint16_t*>(out_values)[o] = v;
        residual[i] = r - Bf16ToFloat(v);
      }
      ++o;
    }
  });
  return Status::Ok();
}

Status ScatterAddCpu(const void* values, DType value_dtype, const int32_t* indices,
                     int64_t num_segments, int64_t segment_len, void* dense, DType dense_dtype,
                     int64_t n, float scale, bool zero_dense_first, int num_threads) {
  if (num_segments < 0 || segment_len < 0 || n < 0) {
    return InvalidArgumentError("scatter-add: negative size");
  }
  if (n > 0 && dense == nullptr) return InvalidArgumentError("scatter-add: dense buffer is null");
  const int64_t total = num_segments * segment_len;
  if (total > 0 && (values == nullptr || indices == nullptr)) {
    return InvalidArgumentError("scatter-add: values/indices are null");
  }
  if (zero_dense_first && n > 0) std::memset(dense, 0, n * DTypeSize(dense_dtype));

  auto value_at = [&](int64_t j) -> float {
    return value_dtype == DType::kFloat32 ? static_cast<const float*>(values)[j]
                                          : Bf16ToFloat(static_cast<const uint16_t*>(values)[j]);
  };
  auto add_range = [&](int64_t lo, int64_t hi) {
    if (dense_dtype == DType::kFloat32) {
      float* d = static_cast<float*>(dense);
      for (int64_t j = lo; j < hi; ++j) d[indices[j]] += scale * value_at(j);
    } else {
      uint16_t* d = static_cast<uint16_t*>(dense);
      for (int64_t j = lo; j < hi; ++j) {
        const int32_t i = indices[j];
        d[i] = FloatToBf16(Bf16ToFloat(d[i]) + scale * value_at(j));
      }
    }
  };

  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t base = s * segment_len;
    // Validate the whole segment before touching dense, and learn whether it is strictly
    // increasing (then its entries hit distinct addresses and may be split across threads).
    bool increasing = true;
    for (int64_t j = 0; j < segment_len; ++j) {
      const int32_t i = indices[base + j];
      if (i < 0 || i >= n) {
        return InvalidArgumentError("scatter-add: segment " + std::to_string(s) + " entry " +
                                    std::to_string(j) + " has index " + std::to_string(i) +
                                    " outside the dense buffer of " + std::to_string(n));
      }
      if (j > 0 && i <= indices[base + j - 1]) increasing = false;
    }
    const int nt = increasing ? ResolveThreads(num_threads, segment_len * 4) : 1;
    const int64_t chunk = (segment_len + nt - 1) / nt;
    ParallelChunks(nt, [&](int c) {
      const int64_t lo = base + std::min<int64_t>(segment_len, c * chunk);
      const int64_t hi = base + std::min<int64_t>(segment_len, c * chunk + chunk);
      add_range(lo, hi);
    });
  }
  return Status::Ok();
}

}  // namespace internal
}  // namespace comm
}  // namespace loongforge
