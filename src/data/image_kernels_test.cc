// Tests of the fused GPU image kernel against the CPU references of image_ops.h. Shape
// validation runs everywhere CUDA is compiled in; the numeric tests need a device (GTEST_SKIP).
#include <gtest/gtest.h>

#include "common/cuda_check.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "image_kernels.h"
#include "image_ops.h"
#include "loader_test_util.h"
#include "test_dataset.h"

namespace loongforge {
namespace data {
namespace {

using internal::CropBox;
using internal::GpuImageTask;
using internal::GpuResizeParams;
using internal::Jitter;
using internal::NormalizeParams;
using internal::OutDType;
using internal::OutLayout;
using internal::RgbImage;

bool HaveDevice() { return ::loongforge::internal::CudaDevicePresent(); }

// Device memory for the test's lifetime.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// A source image on the device, interleaved (RGBI) or planar, with padded rows.
struct DeviceImage {
  RgbImage host;
  std::unique_ptr<DevBuf> mem;
  GpuImageTask task;
  DeviceImage(int w, int h, uint64_t seed, bool planar) {
    host.pixels = testing::RandomRgb(w, h, seed);
    host.width = w;
    host.height = h;
    const int64_t pitch = planar ? ((w + 63) / 64) * 64 : 3 * w + 13;
    std::vector<uint8_t> staged(static_cast<size_t>(pitch) * h * (planar ? 3 : 1), 0xAB);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          uint8_t v = host.pixels[(static_cast<size_t>(y) * w + x) * 3 + c];
          if (planar)
            staged[static_cast<size_t>(c) * pitch * h + y * pitch + x] = v;
          else
            staged[y * pitch + 3 * x + c] = v;
        }
    mem = std::make_unique<DevBuf>(staged.size());
    EXPECT_EQ(cudaMemcpy(mem->p, staged.data(), staged.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    const uint8_t* base = mem->as<uint8_t>();
    for (int c = 0; c < 3; ++c)
      task.plane[c] = planar ? base + static_cast<size_t>(c) * pitch * h : base + c;
    task.pitch = pitch;
    task.pixel_stride = planar ? 1 : 3;
    task.width = w;
    task.height = h;
  }
};

// A task over the whole interleaved RGB image at `base` (w x h, rows `pitch` bytes apart).
GpuImageTask InterleavedTask(const uint8_t* base, int w, int h, int64_t pitch) {
  GpuImageTask t;
  for (int c = 0; c < 3; ++c) t.plane[c] = base + c;
  t.pitch = pitch;
  t.pixel_stride = 3;
  t.width = w;
  t.height = h;
  t.box_w = static_cast<float>(w);
  t.box_h = static_cast<float>(h);
  return t;
}

struct Case {
  OutLayout layout;
  OutDType dtype;
  bool planar;
  int jitter;  // 0 off, 1 gray computed on the device, 2 gray given by the caller
  bool antialias;
};

// Runs one launch over several random images and compares every output value with the CPU
// reference; returns the worst error relative to the dtype's tolerance (<= 1 passes).
double RunCase(const Case& k, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(0, 1);
  const int n = 5, ow = 37 + static_cast<int>(seed % 5) * 11,
            oh = 29 + static_cast<int>(seed % 3) * 17;
  NormalizeParams np{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
  GpuResizeParams p;
  p.out_w = ow;
  p.out_h = oh;
  p.out_count = n + 2;
  p.layout = k.layout;
  p.dtype = k.dtype;
  p.antialias = k.antialias;
  for (int c = 0; c < 3; ++c) p.mean[c] = np.mean[c], p.std[c] = np.std[c];
  std::vector<std::unique_ptr<DeviceImage>> imgs;
  std::vector<GpuImageTask> tasks;
  std::vector<std::vector<float>> refs;
  for (int i = 0; i < n; ++i) {
    // Down- and up-scaling, odd sizes, integer offsets (as the loader) and fractional sizes.
    int w = 20 + static_cast<int>(u(rng) * 150), h = 16 + static_cast<int>(u(rng) * 120);
    imgs.push_back(std::make_unique<DeviceImage>(w, h, seed * 101 + i, k.planar));
    GpuImageTask t = imgs.back()->task;
    CropBox box;
    box.w = w * (0.5f + 0.5f * u(rng));
    box.h = h * (0.5f + 0.5f * u(rng));
    box.x0 = std::floor((w - box.w) * u(rng));
    box.y0 = std::floor((h - box.h) * u(rng));
    t.box_x0 = box.x0, t.box_y0 = box.y0, t.box_w = box.w, t.box_h = box.h;
    Jitter j;
    j.enabled = k.jitter != 0;
    j.brightness = 0.7f + 0.6f * u(rng);
    j.contrast = 0.6f + 0.8f * u(rng);
    j.saturation = 0.5f + u(rng);
    // GR00T's hue range most of the time, the whole [-0.5, 0.5] now and then (every HSV sector).
    j.hue = (i % 2 ? 0.16f : 1.f) * (u(rng) - 0.5f);
    const float gray = internal::MeanGray(imgs.back()->host, box, 4);
    t.jitter = j.enabled;
    t.brightness = j.brightness, t.contrast = j.contrast, t.saturation = j.saturation;
    t.hue = j.hue;
    t.gray_mean = k.jitter == 2 ? gray : -1.f;
    t.out_index = n + 1 - i;  // reversed, with unused slots: indexing must be exact
    tasks.push_back(t);
    std::vector<float> ref(3 * ow * oh);
    if (k.antialias)
      internal::CropResizeAntialiasReference(imgs.back()->host, box, ow, oh, j, gray, np,
                                             ref.data());
    else
      internal::CropResizeNormalizeReference(imgs.back()->host, box, ow, oh, j, gray, np,
                                             ref.data());
    refs.push_back(std::move(ref));
  }
  const size_t elem = k.dtype == OutDType::kFloat32 ? 4 : 2;
  const size_t per_image = 3 * static_cast<size_t>(ow) * oh;
  DevBuf out(elem * per_image * p.out_count), dtasks(sizeof(GpuImageTask) * n);
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Status s = internal::LaunchCropResizeNormalize(tasks.data(), n, dtasks.as<GpuImageTask>(), p,
                                                 out.p, stream);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  std::vector<uint8_t> host(elem * per_image * p.out_count);
  EXPECT_EQ(cudaMemcpy(host.data(), out.p, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    const size_t base = static_cast<size_t>(tasks[i].out_index) * per_image;
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < oh; ++y)
        for (int x = 0; x < ow; ++x) {
          const size_t pix = static_cast<size_t>(y) * ow + x;
          const size_t idx =
              base + (k.layout == OutLayout::kNCHW ? c * ow * oh + pix : pix * 3 + c);
          float got;
          if (elem == 4) {
            std::memcpy(&got, host.data() + 4 * idx, 4);
          } else {
            uint16_t b;
            std::memcpy(&b, host.data() + 2 * idx, 2);
            got = Bf16ToFloat(b);
          }
          const float want = refs[i][c * ow * oh + pix];
          // float32 vs double on 0..255 values scaled by 1/(255*0.224), plus jitter clamps:
          // ~1e-4 typical; the antialias sums more taps, the hue pass divides by the channel
          // spread. bf16 keeps 8 significant bits.
          const double tol =
              elem == 4 ? (k.antialias || k.jitter ? 3e-3 : 2e-3) : std::fabs(want) / 128 + 4e-3;
          worst = std::max(worst, std::fabs(got - want) / tol);
        }
  }
  return worst;
}

// Guards the launcher's contract: bad shapes are InvalidArgument naming the task, before any
// device work (so this runs without a GPU too).
TEST(ImageKernels, RejectsBadShapes) {
  static uint8_t dummy[16];
  const GpuImageTask t = InterleavedTask(dummy, 10, 8, 30);
  GpuResizeParams p;
  p.out_w = p.out_h = 4;
  p.out_count = 1;
  auto launch = [&](GpuImageTask bad) {
    GpuImageTask tasks[2] = {t, bad};
    return internal::LaunchCropResizeNormalize(tasks, 2, reinterpret_cast<GpuImageTask*>(dummy), p,
                                               dummy, nullptr);
  };
  GpuImageTask b = t;
  b.box_x0 = 1;  // 1 + 10 > 10
  Status s = launch(b);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("task 1"), std::string::npos) << s;
  b = t;
  b.out_index = 1;
  EXPECT_EQ(launch(b).code(), StatusCode::kInvalidArgument);
  b = t;
  b.pitch = 29;
  EXPECT_EQ(launch(b).code(), StatusCode::kInvalidArgument);
  b = t;
  b.plane[2] = nullptr;
  EXPECT_EQ(launch(b).code(), StatusCode::kInvalidArgument);
  b = t;
  b.jitter = 1;
  b.hue = 0.6f;  // torchvision's adjust_hue takes [-0.5, 0.5]
  EXPECT_EQ(launch(b).code(), StatusCode::kInvalidArgument);
  p.std[1] = 0;
  EXPECT_EQ(launch(t).code(), StatusCode::kInvalidArgument);
}

// Guards the fused kernel: every layout x dtype x source format x jitter mode must equal the
// double-precision CPU definition within the dtype's tolerance.
TEST(ImageKernels, MatchesCpuReference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1;
  for (OutLayout layout : {OutLayout::kNCHW, OutLayout::kNHWC})
    for (OutDType dtype : {OutDType::kFloat32, OutDType::kBFloat16})
      for (bool planar : {false, true})
        for (int jitter : {0, 1, 2}) {
          Case k{layout, dtype, planar, jitter, false};
          double worst = RunCase(k, seed++);
          EXPECT_LE(worst, 1.0) << "layout " << int(layout) << " dtype " << int(dtype) << " planar "
                                << planar << " jitter " << jitter;
        }
}

// Range(lo, hi) over a std::mt19937, for DrawJitter.
struct TestRng {
  std::mt19937 gen;
  float Range(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
};

// Guards the kernel against its CPU twin (CropResizeNormalize, the CPU loader's fused pass) with
// GR00T's jitter as the loaders draw it (DrawJitter) plus hue shifts over all of [-0.5, 0.5], the
// contrast mean computed on the device: a hue sector, clamp or draw that differs fails here.
TEST(ImageKernels, JitterMatchesCpuTwin) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  TestRng rng{std::mt19937(7)};
  const int n = 16, ow = 48, oh = 40;
  NormalizeParams np;
  GpuResizeParams p;
  p.out_w = ow;
  p.out_h = oh;
  p.out_count = n;
  std::vector<std::unique_ptr<DeviceImage>> imgs;
  std::vector<GpuImageTask> tasks;
  std::vector<std::vector<float>> twins;
  for (int i = 0; i < n; ++i) {
    const int w = 64 + 7 * i, h = 48 + 5 * i;
    imgs.push_back(std::make_unique<DeviceImage>(w, h, 900 + i, i % 2 == 1));
    GpuImageTask t = imgs.back()->task;
    CropBox box;
    box.w = w * 0.95f;
    box.h = h * 0.95f;
    box.x0 = std::floor((w - box.w) * rng.Range(0.f, 1.f));
    box.y0 = std::floor((h - box.h) * rng.Range(0.f, 1.f));
    t.box_x0 = box.x0, t.box_y0 = box.y0, t.box_w = box.w, t.box_h = box.h;
    Jitter j = internal::DrawJitter(&rng);
    if (i % 4 == 3) j.hue = rng.Range(-0.5f, 0.5f);
    t.jitter = 1;
    t.brightness = j.brightness, t.contrast = j.contrast, t.saturation = j.saturation;
    t.hue = j.hue;
    t.gray_mean = -1.f;  // on the device, as the GPU loader does
    t.out_index = i;
    tasks.push_back(t);
    std::vector<float> twin(3 * ow * oh);
    internal::CropResizeNormalize(imgs.back()->host, box, ow, oh, j,
                                  internal::MeanGray(imgs.back()->host, box, p.gray_step), np,
                                  twin.data());
    twins.push_back(std::move(twin));
  }
  DevBuf out(sizeof(float) * 3 * ow * oh * n), dtasks(sizeof(GpuImageTask) * n);
  Status s = internal::LaunchCropResizeNormalize(tasks.data(), n, dtasks.as<GpuImageTask>(), p,
                                                 out.p, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(static_cast<size_t>(3) * ow * oh * n);
  ASSERT_EQ(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  double worst = 0;
  for (int i = 0; i < n; ++i)
    for (size_t k = 0; k < twins[i].size(); ++k)
      worst = std::max<double>(worst, std::fabs(got[i * twins[i].size() + k] - twins[i][k]));
  // float vs float: FMA contraction and the device's float mean vs the host's double mean;
  // 2e-3 of the [-1, 1] range is a quarter of a 0..255 level.
  EXPECT_LE(worst, 2e-3);
}

// Guards the antialias option against its CPU definition (triangle filter widened by the scale).
TEST(ImageKernels, AntialiasMatchesReference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 50; seed < 56; ++seed) {
    Case k{seed % 2 ? OutLayout::kNHWC : OutLayout::kNCHW, OutDType::kFloat32, seed % 3 == 0,
           static_cast<int>(seed % 3), true};
    EXPECT_LE(RunCase(k, seed), 1.0) << "seed " << seed;
  }
}

// Guards that antialias actually filters: a 1-pixel checkerboard downscaled 4x must come out
// nearly flat with antialias, and not with plain bilinear.
TEST(ImageKernels, AntialiasRemovesCheckerboard) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const int w = 128, h = 128, o = 32;
  std::vector<uint8_t> px(w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) px[(y * w + x) * 3 + c] = ((x + y) % 2) ? 255 : 0;
  DevBuf src(px.size()), out(4 * 3 * o * o), dtasks(sizeof(GpuImageTask));
  ASSERT_EQ(cudaMemcpy(src.p, px.data(), px.size(), cudaMemcpyHostToDevice), cudaSuccess);
  GpuImageTask t = InterleavedTask(src.as<uint8_t>(), w, h, 3 * w);
  t.box_w = 127;  // a non-integer phase so that plain bilinear samples between pixels
  t.box_h = 127;
  double spread[2];
  for (int aa = 0; aa < 2; ++aa) {
    GpuResizeParams p;
    p.out_w = p.out_h = o;
    p.out_count = 1;
    p.antialias = aa;
    ASSERT_TRUE(
        internal::LaunchCropResizeNormalize(&t, 1, dtasks.as<GpuImageTask>(), p, out.p, nullptr)
            .ok());
    std::vector<float> got(3 * o * o);
    ASSERT_EQ(cudaMemcpy(got.data(), out.p, 4 * got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    double lo = 1e9, hi = -1e9;
    for (float v : got) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
    spread[aa] = hi - lo;
  }
  EXPECT_LT(spread[1], 0.2) << "antialiased output still shows the pattern";
  EXPECT_GT(spread[0], 0.5) << "plain bilinear should alias here (test would not discriminate)";
}

}  // namespace
}  // namespace data
}  // namespace loongforge
