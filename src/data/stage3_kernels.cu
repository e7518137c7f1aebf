// Stage 3 kernel of the GPU loader (stage3.h): padding, masks, normalization from the staged raw
// records, one launch per batch. CPU twin: Stage3Reference (stage3.cc).
#include <cuda_runtime.h>

#include <algorithm>

#include "loongforge/cuda_check.h"
#include "stage3.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxBlocks = 65535;

struct Parts {
  const int32_t* src_row;
  const int32_t* tok_off;
  const int64_t* sample;
  const float* state;
  const float* action;
  const uint8_t* amask;
  const float* norm;
  const int32_t* ids;
};

// (x - centre) / scale in IEEE float, then the clamp to [-1, 1] when d.clip: Stage3Reference's
// norm_one (fminf/fmaxf are IEEE minNum/maxNum, as std::fmin/std::fmax).
__device__ __forceinline__ float NormOne(float x, float centre, float scale, bool clip) {
  const float y = __fdiv_rn(__fsub_rn(x, centre), scale);
  return clip ? fminf(fmaxf(y, -1.f), 1.f) : y;
}

// One block per output row (grid-stride over rows); threads stride over each array of the row.
// Arithmetic as Stage3Reference (NormOne).
__global__ void Stage3Kernel(Parts p, int S, int A, int H, Stage3Dims d, Stage3Out out) {
  for (int o = blockIdx.x; o < d.rows; o += gridDim.x) {
    int64_t* tok = out.tokens + static_cast<int64_t>(o) * d.len;
    uint8_t* am = out.attention_mask + static_cast<int64_t>(o) * d.len;
    float* st = out.state + static_cast<int64_t>(o) * S;
    float* ac = out.action + static_cast<int64_t>(o) * H * A;
    uint8_t* amk = out.action_mask + static_cast<int64_t>(o) * H;
    if (o >= d.n) {  // static-shape padding row
      for (int t = threadIdx.x; t < d.len; t += blockDim.x) tok[t] = 0, am[t] = 0;
      for (int k = threadIdx.x; k < S; k += blockDim.x) st[k] = 0.f;
      for (int k = threadIdx.x; k < H * A; k += blockDim.x) ac[k] = 0.f;
      for (int k = threadIdx.x; k < H; k += blockDim.x) amk[k] = 0;
      if (threadIdx.x == 0) out.sample_index[o] = -1;
      continue;
    }
    const int i = p.src_row[o];
    const int nt = min(p.tok_off[i + 1] - p.tok_off[i], d.len);
    const int32_t* row_ids = p.ids + p.tok_off[i];
    for (int t = threadIdx.x; t < d.len; t += blockDim.x) {
      tok[t] = t < nt ? static_cast<int64_t>(row_ids[t]) : 0;
      am[t] = t < nt;
    }
    const float* rs = p.state + static_cast<int64_t>(i) * S;
    const float* ra = p.action + static_cast<int64_t>(i) * H * A;
    const float *smean = p.norm, *sstd = p.norm + S, *amean = p.norm + 2 * S,
                *astd = p.norm + 2 * S + A;
    for (int k = threadIdx.x; k < S; k += blockDim.x)
      st[k] = d.normalize ? NormOne(rs[k], smean[k], sstd[k], d.clip) : rs[k];
    for (int k = threadIdx.x; k < H * A; k += blockDim.x)
      ac[k] = d.normalize ? NormOne(ra[k], amean[k % A], astd[k % A], d.clip) : ra[k];
    for (int k = threadIdx.x; k < H; k += blockDim.x)
      amk[k] = p.amask[static_cast<int64_t>(i) * H + k];
    if (threadIdx.x == 0) out.sample_index[o] = p.sample[i];
  }
}

}  // namespace

Status LaunchStage3(const Stage3Layout& L, const uint8_t* raw, const Stage3Dims& d,
                    const Stage3Out& out, cudaStream_t stream) {
  LF_RETURN_IF_ERROR(ValidateStage3(L, d));
  if (d.rows == 0) return Status::Ok();
  if (!raw || !out.tokens || !out.attention_mask || !out.state || !out.action || !out.action_mask ||
      !out.sample_index)
    return InvalidArgumentError("stage 3 kernel: null staging or output pointer");
  Parts p;
  p.src_row = reinterpret_cast<const int32_t*>(raw + L.off_src_row);
  p.tok_off = reinterpret_cast<const int32_t*>(raw + L.off_token_offset);
  p.sample = reinterpret_cast<const int64_t*>(raw + L.off_sample_index);
  p.state = reinterpret_cast<const float*>(raw + L.off_state);
  p.action = reinterpret_cast<const float*>(raw + L.off_action);
  p.amask = raw + L.off_amask;
  p.norm = reinterpret_cast<const float*>(raw + L.off_norm);
  p.ids = reinterpret_cast<const int32_t*>(raw + L.off_tokens);
  const int blocks = std::min(d.rows, kMaxBlocks);
  Stage3Kernel<<<blocks, kThreads, 0, stream>>>(p, L.state_dim, L.action_dim, L.horizon, d, out);
  LF_CUDA_CHECK_LAUNCH();
  return Status::Ok();
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
