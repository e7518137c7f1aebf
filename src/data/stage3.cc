// Stage 3 staging layout and its CPU twin (stage3.h).
#include "stage3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "loongforge/logging.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

}  // namespace

Stage3Layout Stage3Layout::Make(int capacity_rows, int max_tokens, int state_dim, int action_dim,
                                int horizon) {
  Stage3Layout l;
  l.capacity_rows = capacity_rows;
  l.max_tokens = max_tokens;
  l.state_dim = state_dim;
  l.action_dim = action_dim;
  l.horizon = horizon;
  const size_t r = static_cast<size_t>(capacity_rows);
  size_t p = 0;
  auto part = [&](size_t bytes) {
    size_t at = p;
    p += Align(bytes);
    return at;
  };
  l.off_src_row = part(sizeof(int32_t) * r);
  l.off_token_offset = part(sizeof(int32_t) * (r + 1));
  l.off_sample_index = part(sizeof(int64_t) * r);
  l.off_state = part(sizeof(float) * r * state_dim);
  l.off_action = part(sizeof(float) * r * horizon * action_dim);
  l.off_amask = part(r * horizon);
  l.off_norm = part(sizeof(float) * 2 * (state_dim + action_dim));
  l.off_tokens = part(sizeof(int32_t) * r * max_tokens);
  l.capacity_bytes = p;
  return l;
}

Status ValidateStage3(const Stage3Layout& layout, const Stage3Dims& d) {
  if (d.n < 0 || d.n > d.rows || d.rows > layout.capacity_rows || d.len < 1)
    return InvalidArgumentError(
        "stage 3: n=" + std::to_string(d.n) + " rows=" + std::to_string(d.rows) +
        " len=" + std::to_string(d.len) + " do not fit a staging buffer of " +
        std::to_string(layout.capacity_rows) + " rows");
  return Status::Ok();
}

void Stage3Reference(const Stage3Layout& L, const uint8_t* raw, const Stage3Dims& d,
                     const Stage3Out& out) {
  LF_CHECK(ValidateStage3(L, d).ok());
  const auto* src_row = reinterpret_cast<const int32_t*>(raw + L.off_src_row);
  const auto* tok_off = reinterpret_cast<const int32_t*>(raw + L.off_token_offset);
  const auto* sample = reinterpret_cast<const int64_t*>(raw + L.off_sample_index);
  const auto* state = reinterpret_cast<const float*>(raw + L.off_state);
  const auto* action = reinterpret_cast<const float*>(raw + L.off_action);
  const uint8_t* amask = raw + L.off_amask;
  const auto* norm = reinterpret_cast<const float*>(raw + L.off_norm);
  const auto* ids = reinterpret_cast<const int32_t*>(raw + L.off_tokens);
  const int S = L.state_dim, A = L.action_dim, H = L.horizon;
  const float *smean = norm, *sstd = norm + S, *amean = norm + 2 * S, *astd = norm + 2 * S + A;
  // Kept as two IEEE operations (and a clamp), as the kernel does (no contraction on x86-64
  // without -mfma; the kernel uses the _rn intrinsics).
  auto norm_one = [&d](float x, float centre, float scale) {
    const float y = (x - centre) / scale;
    return d.clip ? std::fmin(std::fmax(y, -1.f), 1.f) : y;
  };
  for (int o = 0; o < d.rows; ++o) {
    int64_t* tok = out.tokens + static_cast<size_t>(o) * d.len;
    uint8_t* am = out.attention_mask + static_cast<size_t>(o) * d.len;
    float* st = out.state + static_cast<size_t>(o) * S;
    float* ac = out.action + static_cast<size_t>(o) * H * A;
    uint8_t* amk = out.action_mask + static_cast<size_t>(o) * H;
    if (o >= d.n) {  // static-shape padding row
      std::memset(tok, 0, sizeof(int64_t) * d.len);
      std::memset(am, 0, d.len);
      std::memset(st, 0, sizeof(float) * S);
      std::memset(ac, 0, sizeof(float) * H * A);
      std::memset(amk, 0, H);
      out.sample_index[o] = -1;
      continue;
    }
    const int i = src_row[o];
    LF_CHECK(i >= 0 && i < L.capacity_rows);
    const int nt = std::min(tok_off[i + 1] - tok_off[i], d.len);
    const int32_t* row_ids = ids + tok_off[i];
    for (int t = 0; t < d.len; ++t) {
      tok[t] = t < nt ? row_ids[t] : 0;
      am[t] = t < nt;
    }
    const float* rs = state + static_cast<size_t>(i) * S;
    const float* ra = action + static_cast<size_t>(i) * H * A;
    for (int k = 0; k < S; ++k) st[k] = d.normalize ? norm_one(rs[k], smean[k], sstd[k]) : rs[k];
    for (int k = 0; k < H * A; ++k)
      ac[k] = d.normalize ? norm_one(ra[k], amean[k % A], astd[k % A]) : ra[k];
    std::memcpy(amk, amask + static_cast<size_t>(i) * H, H);
    out.sample_index[o] = sample[i];
  }
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
