// Image kernels of the CPU loader: JPEG decode with DCT-domain scaling, and the fused
// crop + bilinear resize + colour jitter + normalize + HWC->CHW pass that writes straight into the
// batch buffer. Each has a plain reference twin used by the tests. The per-pixel colour jitter
// (JitterPixel) is also the GPU kernel's (image_kernels.cu), so this header compiles under nvcc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/host_device.h"
#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

// A crop rectangle in source pixel coordinates (may be fractional after DCT scaling).
struct CropBox {
  float x0 = 0, y0 = 0, w = 0, h = 0;
};

// The crop box of a frame of `width` x `height` for an output of `out_w` x `out_h` under `mode`
// (ResizeMode in loongforge/loader.h; kPad crops as kStretch), keeping `fraction` of the sides,
// its offset at (fx, fy) in [0, 1] of the slack (0.5: centre), in whole source pixels as
// torchvision's RandomCrop and CenterCrop place it. The one definition of the CPU and GPU stages.
CropBox ChooseCropBox(int width, int height, int out_w, int out_h, float fraction, int mode,
                      float fx, float fy);

// The letterbox of a kPad resize: the largest rectangle of the crop's aspect inside out_w x
// out_h, centred (x, y, w, h in output pixels, w and h >= 1).
struct PadRect {
  int x = 0, y = 0, w = 0, h = 0;
};
PadRect LetterboxRect(const CropBox& box, int out_w, int out_h);

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

// clamp() of Note [Colour jitter].
LF_HOST_DEVICE float Clamp255(float v) { return hd::Min(hd::Max(v, 0.f), 255.f); }

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

// torchvision's adjust_hue (_rgb2hsv, shift by `hue` turns, _hsv2rgb) on the RGB pixel v[0..2] in
// 0..255. Part of JitterPixel.
LF_HOST_DEVICE void HuePixel(float hue, float* v) {
  const float R = v[0], G = v[1], B = v[2];
  const float maxc = hd::Max(R, hd::Max(G, B)), minc = hd::Min(R, hd::Min(G, B));
  if (maxc == minc) return;  // gray: s = 0, the shift changes nothing
  const float cr = maxc - minc;
  const float s = hd::DivRn(cr, maxc);
  const float rc = hd::DivRn(maxc - R, cr), gc = hd::DivRn(maxc - G, cr),
              bc = hd::DivRn(maxc - B, cr);
  float h;
  if (maxc == R)
    h = bc - gc;
  else if (maxc == G)
    h = 2.f + rc - bc;
  else
    h = 4.f + gc - rc;
  h = fmodf(hd::DivRn(h, 6.f) + 1.f, 1.f) + hue;
  h -= floorf(h);  // Python's % 1.0: in [0, 1) for a negative shift too
  const float h6 = h * 6.f;
  const float fi = floorf(h6);
  const float f = h6 - fi;
  const int i = static_cast<int>(fi) % 6;
  const float x = maxc;
  const float p = Clamp255(x * (1.f - s)), q = Clamp255(x * (1.f - s * f));
  const float t = Clamp255(x * (1.f - s * (1.f - f)));
  switch (i) {
    case 0:
      v[0] = x, v[1] = t, v[2] = p;
      break;
    case 1:
      v[0] = q, v[1] = x, v[2] = p;
      break;
    case 2:
      v[0] = p, v[1] = x, v[2] = t;
      break;
    case 3:
      v[0] = p, v[1] = q, v[2] = x;
      break;
    case 4:
      v[0] = t, v[1] = p, v[2] = x;
      break;
    default:
      v[0] = x, v[1] = p, v[2] = q;
      break;
  }
}

// Applies the jitter factors to the RGB pixel v[0..2] in 0..255 (Note [Colour jitter]);
// `gray_mean` is the image's mean gray before brightness. The one definition, for every CPU path
// (ApplyJitter) and the GPU kernel (image_kernels.cu): Note [Host-device twins].
LF_HOST_DEVICE void JitterPixel(float brightness, float contrast, float saturation, float hue,
                                float gray_mean, float* v) {
  float R = Clamp255(v[0] * brightness), G = Clamp255(v[1] * brightness),
        B = Clamp255(v[2] * brightness);
  const float m = gray_mean * brightness;
  R = Clamp255((R - m) * contrast + m);
  G = Clamp255((G - m) * contrast + m);
  B = Clamp255((B - m) * contrast + m);
  const float gray = 0.2989f * R + 0.587f * G + 0.114f * B;
  v[0] = Clamp255((R - gray) * saturation + gray);
  v[1] = Clamp255((G - gray) * saturation + gray);
  v[2] = Clamp255((B - gray) * saturation + gray);
  if (hue != 0.f) HuePixel(hue, v);
}

// JitterPixel with the factors of `j`, on rgb[0..2].
inline void ApplyJitter(const Jitter& j, float gray_mean, float* rgb) {
  JitterPixel(j.brightness, j.contrast, j.saturation, j.hue, gray_mean, rgb);
}

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

// The default bound on a frame's pixel count (width x height from its JPEG header): 64 Mi pixels
// (e.g. 8192 x 8192), far above any camera frame, far below what a hostile header can claim.
// LoaderOptions::max_frame_pixels and PackOptions::max_frame_pixels default to it.
constexpr int64_t kDefaultMaxFramePixels = int64_t{64} << 20;

// DataLoss naming `what`, the frame's `width` x `height` and `max_pixels` when the frame has more
// pixels than `max_pixels`; Ok otherwise. The one check of every decode path (CPU, GPU, pack).
Status CheckFramePixels(int64_t width, int64_t height, int64_t max_pixels, const std::string& what);

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
  // a truncated stream) is an error: DataLoss naming `what`. A header whose width x height exceeds
  // `max_pixels` (>= 1) is DataLoss naming `what`, both sides and the bound, before any pixel
  // buffer is allocated: a few bytes of header may claim 65500 x 65500 (12 GiB of RGB).
  Status Decode(std::string_view jpeg, int min_w, int min_h, RgbImage* out, const std::string& what,
                int64_t max_pixels = kDefaultMaxFramePixels);

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
// The same crop, resize and jitter without normalization: the pixel values (0..255) rounded to
// uint8 [3, out_h, out_w] (LoaderOptions::dtype uint8).
void CropResizeToUint8(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                       const Jitter& jitter, float gray_mean, uint8_t* out);

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
