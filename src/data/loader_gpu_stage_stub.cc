// Builds without nvJPEG have no GPU stage (loader_gpu_stage.cc is its twin): DataLoader::Create
// refuses device = kCuda with the reason GpuStageSupport gives.
#include "loader_pipeline.h"
#include "loongforge/build_info.h"

namespace loongforge {
namespace data {
namespace internal {

bool GpuStageSupport(int device_id, std::string* reason) {
  *reason = ::loongforge::internal::kCompileTimeBuildInfo.cuda
                ? "this build has no nvJPEG (nvjpeg.h / libnvjpeg not found at configure time)"
                : "this build has no CUDA";
  return false;
}

StatusOr<std::unique_ptr<DecodeStage>> CreateGpuStage(Pipeline& p) {
  std::string why;
  GpuStageSupport(p.opts.device_id, &why);
  return UnavailableError("loader: device=cuda: " + why);
}

// Not reached: Create checks GpuStageSupport before it builds the slot pool.
std::shared_ptr<SlotMemory> CreateGpuSlotMemory(const LoaderOptions& o) { return nullptr; }

}  // namespace internal
}  // namespace data
}  // namespace loongforge
