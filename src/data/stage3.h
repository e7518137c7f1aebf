// Stage 3 of DataFusion (Note [Stage 3 staging]): token padding, attention mask, state/action
// normalization, action mask and sample index of one batch, from its raw records packed into one
// staging buffer. CPU twin: Stage3Reference (stage3.cc), which the CPU loader runs; CUDA kernel:
// LaunchStage3 (stage3_kernels.cu), which the GPU loader runs after copying the staging buffer to
// the device. Both produce the same bytes (the normalization is the same IEEE float subtract and
// divide; no fast-math).
//
// Note [Stage 3 staging]
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

#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

// Offsets (bytes, 256-aligned) of each part of a staging buffer for `capacity_rows` raw rows.
struct Stage3Layout {
  int capacity_rows = 0, max_tokens = 0;  // max_tokens: ids kept per row (token capacity)
  int state_dim = 0, action_dim = 0, horizon = 0;
  size_t off_src_row = 0;       // int32 [capacity_rows]: output row -> raw row
  size_t off_token_offset = 0;  // int32 [capacity_rows + 1]: row r's ids are [off[r], off[r+1])
  size_t off_sample_index = 0;  // int64 [capacity_rows]
  size_t off_state = 0;         // float [capacity_rows, state_dim], raw
  size_t off_action = 0;        // float [capacity_rows, horizon, action_dim], raw
  size_t off_amask = 0;         // uint8 [capacity_rows, horizon]
  // float [2 * state_dim + 2 * action_dim]: centre_s, scale_s, centre_a, scale_a (Stage3Dims)
  size_t off_norm = 0;
  size_t off_tokens = 0;  // int32 [capacity_rows * max_tokens]
  size_t capacity_bytes = 0;

  static Stage3Layout Make(int capacity_rows, int max_tokens, int state_dim, int action_dim,
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
struct Stage3Dims {
  int n = 0, rows = 0, len = 1;
  bool normalize = false;
  bool clip = false;  // only with normalize
};

// Output arrays (host for the twin, device for the kernel), dense with `rows` rows:
// tokens int64 [rows, len], attention_mask uint8 [rows, len], state [rows, state_dim],
// action [rows, horizon, action_dim], action_mask [rows, horizon], sample_index [rows].
struct Stage3Out {
  int64_t* tokens = nullptr;
  uint8_t* attention_mask = nullptr;
  float* state = nullptr;
  float* action = nullptr;
  uint8_t* action_mask = nullptr;
  int64_t* sample_index = nullptr;
};

// InvalidArgument unless 0 <= n <= rows <= capacity_rows and 1 <= len.
Status ValidateStage3(const Stage3Layout& layout, const Stage3Dims& dims);

// CPU twin of the kernel: fills `out` from the host staging buffer `raw`. src_row entries must be
// < capacity_rows (LF_CHECK).
void Stage3Reference(const Stage3Layout& layout, const uint8_t* raw, const Stage3Dims& dims,
                     const Stage3Out& out);

#ifdef LOONGFORGE_WITH_CUDA
// The kernel: same result as Stage3Reference, reading the staging buffer from device memory
// `device_raw` (the caller copied at least layout.Bytes(total_tokens) bytes there, on `stream` or
// ordered before it) and writing the device arrays of `out`. One launch for the batch, on
// `stream`; asynchronous. InvalidArgument for bad dims (before touching the device), or the
// launch error.
Status LaunchStage3(const Stage3Layout& layout, const uint8_t* device_raw, const Stage3Dims& dims,
                    const Stage3Out& out, cudaStream_t stream);
#endif

}  // namespace internal
}  // namespace data
}  // namespace loongforge
