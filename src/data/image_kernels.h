// Fused GPU image kernel of DataFusion: crop + bilinear resize (optionally antialiased) + colour
// jitter + normalize + layout/dtype conversion, from decoded RGB8 device images straight into the
// model-ready batch buffer. CPU twin: internal::CropResizeNormalize (image_ops.h), with the same
// definition (half-pixel centres, sample positions clamped to the crop, jitter in the fixed order
// and with the clamps of Note [Colour jitter] in image_ops.h); the antialiased variant's twin is
// internal::CropResizeAntialiasReference.
//
// Only for CUDA builds (the whole header is empty otherwise).
#pragma once

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

enum class OutLayout : int32_t { kNCHW = 0, kNHWC = 1 };
enum class OutDType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

// One source image and what to do with it. Plain data, copied to the device as is.
// The source may be interleaved (RGBI: plane[c] = base + c, pixel_stride 3) or planar
// (plane[c] = channel c, pixel_stride 1); sample (x, y) of channel c is at
// plane[c] + y * pitch + x * pixel_stride.
struct GpuImageTask {
  const uint8_t* plane[3] = {nullptr, nullptr, nullptr};  // device pointers
  int64_t pitch = 0;                                      // bytes between rows
  int32_t pixel_stride = 3;                               // bytes between pixels
  int32_t width = 0, height = 0;
  float box_x0 = 0, box_y0 = 0, box_w = 0, box_h = 0;  // crop in source pixels
  int32_t jitter = 0;  // 1: apply brightness/contrast/saturation/hue (Note [Colour jitter])
  float brightness = 1, contrast = 1, saturation = 1;
  float hue = 0;  // fraction of a turn in [-0.5, 0.5]; 0 skips the hue pass
  // Mean luminance (0..255) used by contrast jitter. < 0: computed on the device exactly as
  // internal::MeanGray(src, box, gray_step) does (in float instead of double).
  float gray_mean = -1;
  int32_t out_index = 0;  // image slot in the output buffer
};

struct GpuResizeParams {
  int out_w = 224, out_h = 224;
  int out_count = 0;  // image slots in `out`; every task's out_index must be < out_count
  OutLayout layout = OutLayout::kNCHW;
  OutDType dtype = OutDType::kFloat32;
  bool antialias = false;  // triangle filter widened by the downscale factor (as PIL/torchvision)
  float mean[3] = {0.5f, 0.5f, 0.5f};
  float std[3] = {0.5f, 0.5f, 0.5f};
  int gray_step = 4;
};

// Runs the fused kernel for `n` tasks on `stream`:
//   out[out_index] = normalize(jitter(resize(crop(src))))  as [3, H, W] (NCHW) or [H, W, 3] (NHWC)
// of fp32 or bf16. `host_tasks` (n entries, any host memory) is validated, then copied into
// `device_tasks` (device memory for n entries, owned by the caller; it must not be in use by an
// earlier launch that has not finished) with cudaMemcpyAsync on `stream`. `out` is device memory
// for out_count images. Returns InvalidArgument naming the task for bad shapes (before touching
// the device), or the CUDA error of the copy or the launch. Asynchronous: the caller synchronizes.
Status LaunchCropResizeNormalize(const GpuImageTask* host_tasks, int n, GpuImageTask* device_tasks,
                                 const GpuResizeParams& params, void* out, cudaStream_t stream);

}  // namespace internal
}  // namespace data
}  // namespace loongforge

#endif  // LOONGFORGE_WITH_CUDA
