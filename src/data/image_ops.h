// Image kernels of the CPU loader: JPEG decode with DCT-domain scaling, and the fused
// crop + bilinear resize + colour jitter + normalize + HWC->CHW pass that writes straight into the
// batch buffer. Each has a plain reference twin used by the tests.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

// A crop rectangle in source pixel coordinates (may be fractional after DCT scaling).
struct CropBox {
  float x0 = 0, y0 = 0, w = 0, h = 0;
};

struct Jitter {
  bool enabled = false;
  float brightness = 1, contrast = 1, saturation = 1;
};

struct NormalizeParams {
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};
};

// A decoded RGB8 image (HWC, stride = 3 * width).
struct RgbImage {
  std::vector<uint8_t> pixels;
  int width = 0, height = 0;
  int scale_num = 1, scale_denom = 1;  // DCT scaling applied relative to the JPEG's size
};

// Owns one libjpeg-turbo handle; one per thread (not thread-safe).
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header only. DataLoss naming `what` if it is not a JPEG.
  Status ReadHeader(std::string_view jpeg, int* width, int* height, const std::string& what);
  // Decodes `jpeg` to RGB8. With `min_w`/`min_h` > 0, picks the smallest libjpeg-turbo scaling
  // factor whose output is still at least min_w x min_h (DCT-domain downscaling: the IDCT produces
  // the smaller image directly, a large saving for 640x480 -> 224x224). Any libjpeg warning (e.g.
  // a truncated stream) is an error: DataLoss naming `what`.
  Status Decode(std::string_view jpeg, int min_w, int min_h, RgbImage* out,
                const std::string& what);

 private:
  void Reset();
  void* handle_;
};

// Bilinear (half-pixel centres, sample positions clamped to the crop) resize of `box` of `src`
// into `out` = float32 [3, out_h, out_w], then jitter, then (x/255 - mean) / std.
// `gray_mean` (0..255) is the mean luminance used by contrast jitter; ignored when jitter is off.
void CropResizeNormalize(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                         const Jitter& jitter, float gray_mean, const NormalizeParams& norm,
                         float* out);

// Mean luminance (ITU-R 601, 0..255) of `box`, sampled every `step` pixels.
float MeanGray(const RgbImage& src, const CropBox& box, int step);

// Reference twin of CropResizeNormalize: straightforward double-precision code, one pixel at a
// time, following the same definition. Tests only.
void CropResizeNormalizeReference(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                                  const Jitter& jitter, float gray_mean,
                                  const NormalizeParams& norm, float* out);

// Reference of the GPU kernel's antialiased resize (image_kernels.h), double precision: for output
// pixel d the source centre is c = (d + 0.5) * scale + x0 (pixel i's centre at i + 0.5); taps are
// the crop's pixels within radius r = max(scale, 1) of c, weighted max(0, 1 - |i + 0.5 - c| / r)
// and renormalized; separable in x and y. Then jitter and normalize as above. Tests only.
void CropResizeAntialiasReference(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                                  const Jitter& jitter, float gray_mean,
                                  const NormalizeParams& norm, float* out);

}  // namespace internal
}  // namespace data
}  // namespace loongforge
