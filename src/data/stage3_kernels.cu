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

// One block per output row (grid-stride over rows); its threads share the row (Stage3Row).
__global__ void Stage3Kernel(Stage3Parts p, Stage3Dims d, Stage3Out out) {
  for (int o = blockIdx.x; o < d.rows; o += gridDim.x)
    Stage3Row(p, d, out, o, threadIdx.x, blockDim.x);
}

}  // namespace

Status LaunchStage3(const Stage3Layout& L, const uint8_t* raw, const Stage3Dims& d,
                    const Stage3Out& out, cudaStream_t stream) {
  LF_RETURN_IF_ERROR(ValidateStage3(L, d));
  if (d.rows == 0) return Status::Ok();
  if (!raw || !out.tokens || !out.attention_mask || !out.state || !out.action || !out.action_mask ||
      !out.sample_index)
    return InvalidArgumentError("stage 3 kernel: null staging or output pointer");
  const Stage3Parts p = Stage3PartsOf(L, raw);
  const int blocks = std::min(d.rows, kMaxBlocks);
  Stage3Kernel<<<blocks, kThreads, 0, stream>>>(p, d, out);
  LF_CUDA_CHECK_LAUNCH();
  return Status::Ok();
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
