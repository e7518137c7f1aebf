// Stage 3 of DataFusion (Note [Collate staging]): token padding, attention mask, state/action
// normalization, action mask and sample index of one batch, from its raw records packed into one
// staging buffer. CPU twin: CollateReference (collate.cc), which the CPU loader runs; CUDA kernel:
// LaunchCollate (collate_kernels.cu), which the GPU loader runs after copying the staging buffer to
// the device. Both run CollateRow, so they produce the same bytes (the normalization is an IEEE
// float subtract and divide; no fast-math).
//
// Note [Collate staging]
// ----------------------
// Stage 1 (lf-fetch) packs every sample of a batch, in sampler order ("raw rows"), into the
// slot's staging buffer as soon as its records are looked up: token ids (int32, already cut to
// the loader's token capacity), their offsets, raw state/action/action-mask and the sample id.
// Which samples survive (corrupt ones are dropped) is known only after decode, so stage 3 adds
// `src_row[o]` (output row o <- raw row) and picks the padded length; only then does it run.
// Fixed-size parts come first and the ragged token ids last, so the GPU loader copies
// Bytes(total_tokens) bytes: raw ids and lengths, never padded int64 tokens or masks.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common/host_device.h"
#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

// Offsets (bytes, 256-aligned) of each part of a staging buffer for `capacity_rows` raw rows.
struct CollateLayout {
  int capacity_rows = 0, max_tokens = 0;  // max_tokens: ids kept per row (token capacity)
  int state_dim = 0, action_dim = 0, horizon = 0;
  size_t off_src_row = 0;       // int32 [capacity_rows]: output row -> raw row
  size_t off_token_offset = 0;  // int32 [capacity_rows + 1]: row r's ids are [off[r], off[r+1])
  size_t off_sample_index = 0;  // int64 [capacity_rows]
  size_t off_state = 0;         // float [capacity_rows, state_dim], raw
  size_t off_action = 0;        // float [capacity_rows, horizon, action_dim], raw
  size_t off_amask = 0;         // uint8 [capacity_rows, horizon]
  // float [2 * state_dim + 2 * action_dim]: centre_s, scale_s, centre_a, scale_a (CollateDims)
  size_t off_norm = 0;
  size_t off_tokens = 0;  // int32 [capacity_rows * max_tokens]
  size_t capacity_bytes = 0;

  static CollateLayout Make(int capacity_rows, int max_tokens, int state_dim, int action_dim,
                            int horizon);
  // Bytes holding everything up to `total_tokens` ids: what a copy of the staging must move.
  size_t Bytes(int64_t total_tokens) const {
    return off_tokens + sizeof(int32_t) * static_cast<size_t>(total_tokens);
  }
};

// One launch: `n` output rows carry data (src_row[0..n)), rows n..rows-1 are padding (zeros, masks
// off, sample_index -1). Tokens are padded with 0 to `len`; a row longer than `len` is cut.
// normalize: state/action become (x - centre) / scale with the staged per-dimension parameters,
// then, with clip, are clamped to [-1, 1] (fmin/fmax). The loader stages the parameters of its
// mode (Note [State normalization] in src/data/loader.cc): mean_std (mean, std), min_max and
// q01_q99 ((lo + hi) / 2, (hi - lo) / 2; q01_q99 clips, as GR00T's "q99" mode does).
struct CollateDims {
  int n = 0, rows = 0, len = 1;
  bool normalize = false;
  bool clip = false;  // only with normalize
};

// Output arrays (host for the twin, device for the kernel), dense with `rows` rows:
// tokens int64 [rows, len], attention_mask uint8 [rows, len], state [rows, state_dim],
// action [rows, horizon, action_dim], action_mask [rows, horizon], sample_index [rows].
struct CollateOut {
  int64_t* tokens = nullptr;
  uint8_t* attention_mask = nullptr;
  float* state = nullptr;
  float* action = nullptr;
  uint8_t* action_mask = nullptr;
  int64_t* sample_index = nullptr;
};

// InvalidArgument unless 0 <= n <= rows <= capacity_rows and 1 <= len.
Status ValidateCollate(const CollateLayout& layout, const CollateDims& dims);

// Typed pointers to the parts of one staging buffer (host or device memory), and its dims.
struct CollateParts {
  const int32_t* src_row;
  const int32_t* tok_off;
  const int64_t* sample;
  const float* state;
  const float* action;
  const uint8_t* amask;
  const float* norm;
  const int32_t* ids;
  int state_dim, action_dim, horizon;
};

// The parts of `raw`, a staging buffer laid out by `layout`.
CollateParts CollatePartsOf(const CollateLayout& layout, const uint8_t* raw);

// (x - centre) / scale as two IEEE float operations, then with `clip` the clamp to [-1, 1]
// (fminf/fmaxf: IEEE minNum/maxNum on both sides).
LF_HOST_DEVICE float CollateNormalize(float x, float centre, float scale, bool clip) {
  const float y = hd::DivRn(hd::SubRn(x, centre), scale);
  return clip ? fminf(fmaxf(y, -1.f), 1.f) : y;
}

// Output row `o` of one launch: the one body of the CPU twin and the kernel (Note [Host-device
// twins]). Writes the elements lane, lane + lanes, ... of each of the row's arrays: the twin runs
// it with (0, 1), a CUDA block with (threadIdx.x, blockDim.x). For o < n, src_row[o] must be a raw
// row of the buffer.
LF_HOST_DEVICE void CollateRow(const CollateParts& p, const CollateDims& d, const CollateOut& out,
                               int o, int lane, int lanes) {
  const int S = p.state_dim, A = p.action_dim, H = p.horizon;
  int64_t* tok = out.tokens + static_cast<int64_t>(o) * d.len;
  uint8_t* am = out.attention_mask + static_cast<int64_t>(o) * d.len;
  float* st = out.state + static_cast<int64_t>(o) * S;
  float* ac = out.action + static_cast<int64_t>(o) * H * A;
  uint8_t* amk = out.action_mask + static_cast<int64_t>(o) * H;
  if (o >= d.n) {  // static-shape padding row
    for (int t = lane; t < d.len; t += lanes) tok[t] = 0, am[t] = 0;
    for (int k = lane; k < S; k += lanes) st[k] = 0.f;
    for (int k = lane; k < H * A; k += lanes) ac[k] = 0.f;
    for (int k = lane; k < H; k += lanes) amk[k] = 0;
    if (lane == 0) out.sample_index[o] = -1;
    return;
  }
  const int i = p.src_row[o];
  const int row_len = p.tok_off[i + 1] - p.tok_off[i];
  const int nt = row_len < d.len ? row_len : d.len;  // a row longer than len is cut
  const int32_t* row_ids = p.ids + p.tok_off[i];
  for (int t = lane; t < d.len; t += lanes) {
    tok[t] = t < nt ? static_cast<int64_t>(row_ids[t]) : 0;
    am[t] = t < nt;
  }
  const float* rs = p.state + static_cast<int64_t>(i) * S;
  const float* ra = p.action + static_cast<int64_t>(i) * H * A;
  const float *smean = p.norm, *sstd = p.norm + S, *amean = p.norm + 2 * S,
              *astd = p.norm + 2 * S + A;
  for (int k = lane; k < S; k += lanes)
    st[k] = d.normalize ? CollateNormalize(rs[k], smean[k], sstd[k], d.clip) : rs[k];
  for (int k = lane; k < H * A; k += lanes)
    ac[k] = d.normalize ? CollateNormalize(ra[k], amean[k % A], astd[k % A], d.clip) : ra[k];
  for (int k = lane; k < H; k += lanes) amk[k] = p.amask[static_cast<int64_t>(i) * H + k];
  if (lane == 0) out.sample_index[o] = p.sample[i];
}

// CPU twin of the kernel: fills `out` from the host staging buffer `raw`. src_row entries must be
// < capacity_rows (LF_CHECK).
void CollateReference(const CollateLayout& layout, const uint8_t* raw, const CollateDims& dims,
                      const CollateOut& out);

#ifdef LOONGFORGE_WITH_CUDA
// The kernel: same result as CollateReference, reading the staging buffer from device memory
// `device_raw` (the caller copied at least layout.Bytes(total_tokens) bytes there, on `stream` or
// ordered before it) and writing the device arrays of `out`. One launch for the batch, on
// `stream`; asynchronous. InvalidArgument for bad dims (before touching the device), or the
// launch error.
Status LaunchCollate(const CollateLayout& layout, const uint8_t* device_raw,
                     const CollateDims& dims, const CollateOut& out, cudaStream_t stream);
#endif

}  // namespace internal
}  // namespace data
}  // namespace loongforge
