// Stage 3 kernel of the GPU loader (collate.h): padding, masks, normalization from the staged raw
// records, one launch per batch. CPU twin: CollateReference (collate.cc).
#include <cuda_runtime.h>

#include <algorithm>

#include "collate.h"
#include "common/cuda_check.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxBlocks = 65535;

// One block per output row (grid-stride over rows); its threads share the row (CollateRow).
__global__ void CollateKernel(CollateParts p, CollateDims d, CollateOut out) {
  for (int o = blockIdx.x; o < d.rows; o += gridDim.x)
    CollateRow(p, d, out, o, threadIdx.x, blockDim.x);
}

}  // namespace

Status LaunchCollate(const CollateLayout& L, const uint8_t* raw, const CollateDims& d,
                     const CollateOut& out, cudaStream_t stream) {
  LF_RETURN_IF_ERROR(ValidateCollate(L, d));
  if (d.rows == 0) return Status::Ok();
  if (!raw || !out.tokens || !out.attention_mask || !out.state || !out.action || !out.action_mask ||
      !out.sample_index)
    return InvalidArgumentError("stage 3 kernel: null staging or output pointer");
  const CollateParts p = CollatePartsOf(L, raw);
  const int blocks = std::min(d.rows, kMaxBlocks);
  CollateKernel<<<blocks, kThreads, 0, stream>>>(p, d, out);
  LF_CUDA_CHECK_LAUNCH();
  return Status::Ok();
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
