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

// Colour jitter of one image: torchvision's adjust_brightness, adjust_contrast, adjust_saturation
// and adjust_hue, in that fixed order (Note [Colour jitter]).
struct Jitter {
  bool enabled = false;
  float brightness = 1, contrast = 1, saturation = 1;
  float hue = 0;  // fraction of a turn, in [-0.5, 0.5]; 0 skips the hue pass
};

// Note [Colour jitter]
// --------------------
// GR00T N1.6 trains with torchvision's ColorJitter(brightness=0.3, contrast=0.4, saturation=0.5,
// hue=0.08): factors uniform in [1-x, 1+x], hue shift uniform in [-0.08, 0.08]. torchvision draws
// a random order of the four ops per call; every LoongForge mode applies them in the fixed order
// brightness -> contrast -> saturation -> hue instead (python/loongforge/augment.py does the same
// with torchvision's functional ops), because the fused kernels compute contrast's mean luminance
// once per image, before the per-pixel pass: with the fixed order it is the crop's mean times the
// brightness factor (exact up to clamping), while after a hue shift it would need a second pass.
// Definitions, per pixel, on values v in 0..255 (torchvision's on v / 255 in [0, 1]):
//   gray(R, G, B) = 0.2989 R + 0.587 G + 0.114 B
//   brightness b:  v = clamp(b v)
//   contrast c:    v = clamp(c v + (1 - c) m),  m = mean gray of the image after brightness
//   saturation s:  v = clamp(s v + (1 - s) gray(R, G, B))
//   hue h:         RGB -> HSV (torchvision's _rgb2hsv), H = (H + h) mod 1, HSV -> RGB (_hsv2rgb)
// clamp() is to [0, 255] after each op, as torchvision's _blend clamps to [0, 1].
// The draws, from the sample's SampleRng after the crop offsets: brightness, contrast,
// saturation, hue (DrawJitter).
constexpr float kJitterBrightness = 0.3f;
constexpr float kJitterContrast = 0.4f;
constexpr float kJitterSaturation = 0.5f;
constexpr float kJitterHue = 0.08f;

// GR00T's jitter drawn from `rng` (anything with Range(lo, hi) -> float, e.g. SampleRng), in the
// order every loader stage draws it (Note [Colour jitter]).
template <typename Rng>
Jitter DrawJitter(Rng* rng) {
  Jitter j;
  j.enabled = true;
  j.brightness = rng->Range(1.f - kJitterBrightness, 1.f + kJitterBrightness);
  j.contrast = rng->Range(1.f - kJitterContrast, 1.f + kJitterContrast);
  j.saturation = rng->Range(1.f - kJitterSaturation, 1.f + kJitterSaturation);
  j.hue = rng->Range(-kJitterHue, kJitterHue);
  return j;
}

// Applies `j` to one RGB pixel in 0..255 (Note [Colour jitter]); `gray_mean` is the image's mean
// gray before brightness. Shared by every CPU path; the GPU kernel repeats the same arithmetic.
void ApplyJitter(const Jitter& j, float gray_mean, float* r, float* g, float* b);

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

// Mean gray (0.2989 R + 0.587 G + 0.114 B, 0..255) of `box`, sampled every `step` pixels: the
// contrast mean of Note [Colour jitter], taken on the source crop rather than on the resized image
// (they differ by the resampling only).
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
