#include "image_ops.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "loongforge/loader.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace data {
namespace internal {

JpegDecoder::JpegDecoder() : handle_(tjInitDecompress()) {
  LF_CHECK(handle_ != nullptr) << "tjInitDecompress failed";
}

JpegDecoder::~JpegDecoder() { tjDestroy(static_cast<tjhandle>(handle_)); }

// libjpeg-turbo 2.1 keeps error/warning state in the handle after a failed call, which makes later
// good images fail too; a fresh handle after every error is cheap and always clean.
void JpegDecoder::Reset() {
  tjDestroy(static_cast<tjhandle>(handle_));
  handle_ = tjInitDecompress();
  LF_CHECK(handle_ != nullptr) << "tjInitDecompress failed";
}

Status JpegDecoder::ReadHeader(std::string_view jpeg, int* width, int* height,
                               const std::string& what) {
  int subsamp = 0, colorspace = 0;
  if (jpeg.size() < 4 || static_cast<uint8_t>(jpeg[0]) != 0xFF ||
      static_cast<uint8_t>(jpeg[1]) != 0xD8)
    return DataLossError(what + ": not a JPEG (no SOI marker)");
  if (tjDecompressHeader3(
          static_cast<tjhandle>(handle_), reinterpret_cast<const unsigned char*>(jpeg.data()),
          static_cast<unsigned long>(jpeg.size()), width, height, &subsamp, &colorspace) != 0) {
    Status err = DataLossError(
        what + ": bad JPEG header: " + tjGetErrorStr2(static_cast<tjhandle>(handle_)));
    Reset();
    return err;
  }
  return Status::Ok();
}

Status CheckFramePixels(int64_t width, int64_t height, int64_t max_pixels,
                        const std::string& what) {
  if (width * height <= max_pixels) return Status::Ok();
  return DataLossError(what + ": JPEG header claims " + std::to_string(width) + "x" +
                       std::to_string(height) + " = " + std::to_string(width * height) +
                       " pixels, over max_frame_pixels " + std::to_string(max_pixels));
}

Status JpegDecoder::Decode(std::string_view jpeg, int min_w, int min_h, RgbImage* out,
                           const std::string& what, int64_t max_pixels) {
  int w = 0, h = 0;
  LF_RETURN_IF_ERROR(ReadHeader(jpeg, &w, &h, what));
  // Bounded on the header's size, not the scaled one: libjpeg-turbo's working memory follows the
  // full frame whatever the output scale.
  LF_RETURN_IF_ERROR(CheckFramePixels(w, h, max_pixels, what));
  tjscalingfactor best{1, 1};
  if (min_w > 0 && min_h > 0) {
    int n = 0;
    tjscalingfactor* factors = tjGetScalingFactors(&n);
    int64_t best_area = static_cast<int64_t>(w) * h;  // up to 65535^2: past int
    for (int i = 0; i < n; ++i) {
      const tjscalingfactor f = factors[i];
      if (f.num > f.denom) continue;  // never upscale in the decoder
      int sw = TJSCALED(w, f), sh = TJSCALED(h, f);
      if (sw >= min_w && sh >= min_h && static_cast<int64_t>(sw) * sh < best_area) {
        best = f;
        best_area = static_cast<int64_t>(sw) * sh;
      }
    }
  }
  int sw = TJSCALED(w, best), sh = TJSCALED(h, best);
  out->pixels.resize(static_cast<size_t>(sw) * sh * 3);
  out->width = sw;
  out->height = sh;
  out->scale_num = best.num;
  out->scale_denom = best.denom;
  // TJFLAG_STOPONWARNING: a truncated or damaged stream is an error, not a grey half-image.
  int rc = tjDecompress2(static_cast<tjhandle>(handle_),
                         reinterpret_cast<const unsigned char*>(jpeg.data()),
                         static_cast<unsigned long>(jpeg.size()), out->pixels.data(), sw, sw * 3,
                         sh, TJPF_RGB, TJFLAG_STOPONWARNING | TJFLAG_FASTDCT);
  if (rc != 0) {
    Status err =
        DataLossError(what + ": corrupt JPEG: " + tjGetErrorStr2(static_cast<tjhandle>(handle_)));
    Reset();
    return err;
  }
  return Status::Ok();
}

float MeanGray(const RgbImage& src, const CropBox& box, int step) {
  int x0 = std::max(0, static_cast<int>(box.x0)), y0 = std::max(0, static_cast<int>(box.y0));
  int x1 = std::min(src.width, static_cast<int>(box.x0 + box.w));
  int y1 = std::min(src.height, static_cast<int>(box.y0 + box.h));
  double sum = 0;
  int64_t n = 0;
  for (int y = y0; y < y1; y += step) {
    const uint8_t* row = src.pixels.data() + static_cast<size_t>(y) * src.width * 3;
    for (int x = x0; x < x1; x += step) {
      const uint8_t* p = row + 3 * x;
      sum += 0.2989 * p[0] + 0.587 * p[1] + 0.114 * p[2];
      ++n;
    }
  }
  return n ? static_cast<float>(sum / n) : 0.f;
}

namespace {

// Half-pixel-centre source coordinate of output index `d`, clamped to [lo, hi].
inline float SourceCoord(int d, float scale, float origin, float lo, float hi) {
  float s = (static_cast<float>(d) + 0.5f) * scale - 0.5f + origin;
  return std::min(std::max(s, lo), hi);
}

// The fused pass of CropResizeNormalize and CropResizeToUint8: the same taps and jitter, then
// either normalized floats or the pixel values rounded to uint8.
template <typename Out>
void CropResizeInto(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                    const Jitter& jitter, float gray_mean, const NormalizeParams& norm, Out* out) {
  const float sx = box.w / out_w, sy = box.h / out_h;
  const float xhi = std::min(box.x0 + box.w - 1, static_cast<float>(src.width - 1));
  const float yhi = std::min(box.y0 + box.h - 1, static_cast<float>(src.height - 1));
  // Column taps are shared by every row: precompute byte offsets and weights once.
  thread_local std::vector<int> xoff0, xoff1;
  thread_local std::vector<float> xw;
  xoff0.resize(out_w);
  xoff1.resize(out_w);
  xw.resize(out_w);
  for (int dx = 0; dx < out_w; ++dx) {
    float s = SourceCoord(dx, sx, box.x0, std::max(box.x0, 0.f), xhi);
    int x0 = static_cast<int>(s);
    int x1 = std::min(x0 + 1, static_cast<int>(xhi));
    xoff0[dx] = 3 * x0;
    xoff1[dx] = 3 * x1;
    xw[dx] = s - x0;
  }
  float scale[3], bias[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.f / (255.f * norm.std[c]);
    bias[c] = -norm.mean[c] / norm.std[c];
  }
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  const size_t stride = static_cast<size_t>(src.width) * 3;
  for (int dy = 0; dy < out_h; ++dy) {
    float s = SourceCoord(dy, sy, box.y0, std::max(box.y0, 0.f), yhi);
    int y0 = static_cast<int>(s);
    int y1 = std::min(y0 + 1, static_cast<int>(yhi));
    float wy = s - y0;
    const uint8_t* r0 = src.pixels.data() + y0 * stride;
    const uint8_t* r1 = src.pixels.data() + y1 * stride;
    Out* o0 = out + static_cast<size_t>(dy) * out_w;
    Out* o1 = o0 + plane;
    Out* o2 = o1 + plane;
    for (int dx = 0; dx < out_w; ++dx) {
      const uint8_t* a = r0 + xoff0[dx];
      const uint8_t* b = r0 + xoff1[dx];
      const uint8_t* c = r1 + xoff0[dx];
      const uint8_t* d = r1 + xoff1[dx];
      const float wx = xw[dx];
      float v[3];
      for (int ch = 0; ch < 3; ++ch) {
        float top = a[ch] + (b[ch] - a[ch]) * wx;
        float bot = c[ch] + (d[ch] - c[ch]) * wx;
        v[ch] = top + (bot - top) * wy;
      }
      if (jitter.enabled) ApplyJitter(jitter, gray_mean, v);
      if constexpr (std::is_same_v<Out, uint8_t>) {
        // Bilinear weights of bytes stay in 0..255 but for float rounding: clamp, round.
        o0[dx] = static_cast<uint8_t>(Clamp255(v[0]) + 0.5f);
        o1[dx] = static_cast<uint8_t>(Clamp255(v[1]) + 0.5f);
        o2[dx] = static_cast<uint8_t>(Clamp255(v[2]) + 0.5f);
      } else {
        o0[dx] = v[0] * scale[0] + bias[0];
        o1[dx] = v[1] * scale[1] + bias[1];
        o2[dx] = v[2] * scale[2] + bias[2];
      }
    }
  }
}

}  // namespace

CropBox ChooseCropBox(int width, int height, int out_w, int out_h, float fraction, int mode,
                      float fx, float fy) {
  CropBox box;
  float w = static_cast<float>(width), h = static_cast<float>(height);
  if (mode == static_cast<int>(ResizeMode::kCrop)) {
    // The largest rectangle of the output's aspect inside the frame.
    const float aspect = static_cast<float>(out_w) / static_cast<float>(out_h);
    if (w > h * aspect)
      w = h * aspect;
    else
      h = w / aspect;
  }
  box.w = w * fraction;
  box.h = h * fraction;
  box.x0 = std::floor((width - box.w) * fx);
  box.y0 = std::floor((height - box.h) * fy);
  return box;
}

PadRect LetterboxRect(const CropBox& box, int out_w, int out_h) {
  PadRect r;
  const double aspect = static_cast<double>(box.w) / box.h;
  if (out_w >= out_h * aspect) {
    r.h = out_h;
    r.w = std::max(1, static_cast<int>(std::lround(out_h * aspect)));
  } else {
    r.w = out_w;
    r.h = std::max(1, static_cast<int>(std::lround(out_w / aspect)));
  }
  r.w = std::min(r.w, out_w);
  r.h = std::min(r.h, out_h);
  r.x = (out_w - r.w) / 2;
  r.y = (out_h - r.h) / 2;
  return r;
}

void CropResizeNormalize(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                         const Jitter& jitter, float gray_mean, const NormalizeParams& norm,
                         float* out) {
  CropResizeInto(src, box, out_w, out_h, jitter, gray_mean, norm, out);
}

void CropResizeToUint8(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                       const Jitter& jitter, float gray_mean, uint8_t* out) {
  CropResizeInto(src, box, out_w, out_h, jitter, gray_mean, NormalizeParams{}, out);
}

void CropResizeNormalizeReference(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                                  const Jitter& jitter, float gray_mean,
                                  const NormalizeParams& norm, float* out) {
  const double xlo = std::max<double>(box.x0, 0), ylo = std::max<double>(box.y0, 0);
  const double xhi = std::min<double>(box.x0 + box.w - 1, src.width - 1);
  const double yhi = std::min<double>(box.y0 + box.h - 1, src.height - 1);
  auto px = [&](int x, int y, int c) {
    return static_cast<double>(src.pixels[(static_cast<size_t>(y) * src.width + x) * 3 + c]);
  };
  for (int dy = 0; dy < out_h; ++dy) {
    for (int dx = 0; dx < out_w; ++dx) {
      double fx = (dx + 0.5) * box.w / out_w - 0.5 + box.x0;
      double fy = (dy + 0.5) * box.h / out_h - 0.5 + box.y0;
      fx = std::clamp(fx, xlo, xhi);
      fy = std::clamp(fy, ylo, yhi);
      int x0 = static_cast<int>(std::floor(fx)), y0 = static_cast<int>(std::floor(fy));
      int x1 = std::min<int>(x0 + 1, static_cast<int>(xhi));
      int y1 = std::min<int>(y0 + 1, static_cast<int>(yhi));
      double wx = fx - x0, wy = fy - y0;
      float v[3];
      for (int c = 0; c < 3; ++c) {
        double top = px(x0, y0, c) * (1 - wx) + px(x1, y0, c) * wx;
        double bot = px(x0, y1, c) * (1 - wx) + px(x1, y1, c) * wx;
        v[c] = static_cast<float>(top * (1 - wy) + bot * wy);
      }
      if (jitter.enabled) ApplyJitter(jitter, gray_mean, v);
      for (int c = 0; c < 3; ++c)
        out[(static_cast<size_t>(c) * out_h + dy) * out_w + dx] =
            static_cast<float>((v[c] / 255.0 - norm.mean[c]) / norm.std[c]);
    }
  }
}

void CropResizeAntialiasReference(const RgbImage& src, const CropBox& box, int out_w, int out_h,
                                  const Jitter& jitter, float gray_mean,
                                  const NormalizeParams& norm, float* out) {
  const int xlo = std::max(0, static_cast<int>(std::floor(box.x0)));
  const int ylo = std::max(0, static_cast<int>(std::floor(box.y0)));
  const int xhi = static_cast<int>(std::min<double>(box.x0 + box.w - 1, src.width - 1));
  const int yhi = static_cast<int>(std::min<double>(box.y0 + box.h - 1, src.height - 1));
  const double sx = static_cast<double>(box.w) / out_w, sy = static_cast<double>(box.h) / out_h;
  const double rx = std::max(sx, 1.0), ry = std::max(sy, 1.0);
  // Taps and normalized weights of one axis.
  auto taps = [](double c, double r, int lo, int hi, std::vector<std::pair<int, double>>* t) {
    t->clear();
    double sum = 0;
    for (int i = std::max(lo, static_cast<int>(std::floor(c - r)));
         i <= std::min(hi, static_cast<int>(std::ceil(c + r))); ++i) {
      double w = std::max(0.0, 1.0 - std::fabs((i + 0.5 - c) / r));
      if (w > 0) t->push_back({i, w}), sum += w;
    }
    for (auto& p : *t) p.second /= sum;
  };
  std::vector<std::pair<int, double>> tx, ty;
  for (int dy = 0; dy < out_h; ++dy) {
    taps((dy + 0.5) * sy + box.y0, ry, ylo, yhi, &ty);
    for (int dx = 0; dx < out_w; ++dx) {
      taps((dx + 0.5) * sx + box.x0, rx, xlo, xhi, &tx);
      float v[3];
      for (int c = 0; c < 3; ++c) {
        double acc = 0;
        for (const auto& [y, wy] : ty)
          for (const auto& [x, wx] : tx)
            acc += wy * wx * src.pixels[(static_cast<size_t>(y) * src.width + x) * 3 + c];
        v[c] = static_cast<float>(acc);
      }
      if (jitter.enabled) ApplyJitter(jitter, gray_mean, v);
      for (int c = 0; c < 3; ++c)
        out[(static_cast<size_t>(c) * out_h + dy) * out_w + dx] =
            static_cast<float>((v[c] / 255.0 - norm.mean[c]) / norm.std[c]);
    }
  }
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
