// Fused crop + resize + jitter + normalize + layout kernel of the GPU loader (image_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "common/cuda_check.h"
#include "image_kernels.h"
#include "image_ops.h"  // JitterPixel: the jitter arithmetic of every loader path

namespace loongforge {
namespace data {
namespace internal {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSide = 16384;

struct DeviceParams {
  int out_w, out_h;
  int layout, dtype, antialias;
  float scale[3], bias[3];  // out = v * scale + bias  ==  (v / 255 - mean) / std
  int gray_step;
};

__device__ __forceinline__ float Sample(const GpuImageTask& t, int c, int x, int y) {
  return static_cast<float>(
      t.plane[c][static_cast<int64_t>(y) * t.pitch + static_cast<int64_t>(x) * t.pixel_stride]);
}

// One block per image: mean luminance of the crop sampled every `step` pixels, as MeanGray().
__global__ void MeanGrayKernel(GpuImageTask* tasks, int step) {
  GpuImageTask& t = tasks[blockIdx.x];
  if (!t.jitter || t.gray_mean >= 0.f) return;  // uniform per block: no divergence at barriers
  const int x0 = max(0, static_cast<int>(t.box_x0)), y0 = max(0, static_cast<int>(t.box_y0));
  const int x1 = min(t.width, static_cast<int>(t.box_x0 + t.box_w));
  const int y1 = min(t.height, static_cast<int>(t.box_y0 + t.box_h));
  const int nx = x1 > x0 ? (x1 - x0 + step - 1) / step : 0;
  const int ny = y1 > y0 ? (y1 - y0 + step - 1) / step : 0;
  const int total = nx * ny;
  float sum = 0.f;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int x = x0 + (i % nx) * step, y = y0 + (i / nx) * step;
    sum += 0.2989f * Sample(t, 0, x, y) + 0.587f * Sample(t, 1, x, y) + 0.114f * Sample(t, 2, x, y);
  }
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) t.gray_mean = total ? partial[0] / static_cast<float>(total) : 0.f;
}

// Plain bilinear: the arithmetic of CropResizeNormalize (image_ops.cc), per output pixel.
__device__ __forceinline__ void Bilinear(const GpuImageTask& t, int dx, int dy, float sx, float sy,
                                         float* v) {
  const float xhi = fminf(t.box_x0 + t.box_w - 1.f, static_cast<float>(t.width - 1));
  const float yhi = fminf(t.box_y0 + t.box_h - 1.f, static_cast<float>(t.height - 1));
  float fx = (static_cast<float>(dx) + 0.5f) * sx - 0.5f + t.box_x0;
  float fy = (static_cast<float>(dy) + 0.5f) * sy - 0.5f + t.box_y0;
  fx = fminf(fmaxf(fx, fmaxf(t.box_x0, 0.f)), xhi);
  fy = fminf(fmaxf(fy, fmaxf(t.box_y0, 0.f)), yhi);
  const int x0 = static_cast<int>(fx), y0 = static_cast<int>(fy);
  const int x1 = min(x0 + 1, static_cast<int>(xhi)), y1 = min(y0 + 1, static_cast<int>(yhi));
  const float wx = fx - x0, wy = fy - y0;
  for (int c = 0; c < 3; ++c) {
    const float a = Sample(t, c, x0, y0), b = Sample(t, c, x1, y0);
    const float cc = Sample(t, c, x0, y1), d = Sample(t, c, x1, y1);
    const float top = a + (b - a) * wx;
    const float bot = cc + (d - cc) * wx;
    v[c] = top + (bot - top) * wy;
  }
}

// Antialiased: separable triangle filter of radius max(scale, 1) centred on the output pixel's
// source position, over the crop's pixels, weights renormalized (PIL / torchvision antialias).
// Definition in CropResizeAntialiasReference (image_ops.cc).
__device__ __forceinline__ void Antialias(const GpuImageTask& t, int dx, int dy, float sx, float sy,
                                          float* v) {
  const int xlo = max(0, static_cast<int>(floorf(t.box_x0)));
  const int ylo = max(0, static_cast<int>(floorf(t.box_y0)));
  const int xhi = static_cast<int>(fminf(t.box_x0 + t.box_w - 1.f, t.width - 1.f));
  const int yhi = static_cast<int>(fminf(t.box_y0 + t.box_h - 1.f, t.height - 1.f));
  const float rx = fmaxf(sx, 1.f), ry = fmaxf(sy, 1.f);
  const float cx = (dx + 0.5f) * sx + t.box_x0, cy = (dy + 0.5f) * sy + t.box_y0;
  const int ix0 = max(xlo, static_cast<int>(floorf(cx - rx))),
            ix1 = min(xhi, static_cast<int>(ceilf(cx + rx)));
  const int iy0 = max(ylo, static_cast<int>(floorf(cy - ry))),
            iy1 = min(yhi, static_cast<int>(ceilf(cy + ry)));
  float acc[3] = {0.f, 0.f, 0.f}, wsum_y = 0.f, wsum_x = 0.f;
  for (int ix = ix0; ix <= ix1; ++ix) wsum_x += fmaxf(0.f, 1.f - fabsf((ix + 0.5f - cx) / rx));
  for (int iy = iy0; iy <= iy1; ++iy) {
    const float wy = fmaxf(0.f, 1.f - fabsf((iy + 0.5f - cy) / ry));
    if (wy == 0.f) continue;
    wsum_y += wy;
    float row[3] = {0.f, 0.f, 0.f};
    for (int ix = ix0; ix <= ix1; ++ix) {
      const float wx = fmaxf(0.f, 1.f - fabsf((ix + 0.5f - cx) / rx));
      if (wx == 0.f) continue;
      for (int c = 0; c < 3; ++c) row[c] += wx * Sample(t, c, ix, iy);
    }
    for (int c = 0; c < 3; ++c) acc[c] += wy * row[c];
  }
  const float norm = (wsum_x > 0.f && wsum_y > 0.f) ? 1.f / (wsum_x * wsum_y) : 0.f;
  for (int c = 0; c < 3; ++c) v[c] = acc[c] * norm;
}

// grid = (ceil(out_w * out_h / kThreads), n): one thread per output pixel, all three channels.
template <typename OutT>
__global__ void CropResizeNormalizeKernel(const GpuImageTask* __restrict__ tasks, DeviceParams p,
                                          OutT* __restrict__ out) {
  const int pix = blockIdx.x * blockDim.x + threadIdx.x;
  const int plane = p.out_w * p.out_h;
  if (pix >= plane) return;
  const GpuImageTask t = tasks[blockIdx.y];  // registers: read once per thread
  const int dx = pix % p.out_w, dy = pix / p.out_w;
  const float sx = t.box_w / p.out_w, sy = t.box_h / p.out_h;
  float v[3];
  if (p.antialias)
    Antialias(t, dx, dy, sx, sy, v);
  else
    Bilinear(t, dx, dy, sx, sy, v);
  if (t.jitter) JitterPixel(t.brightness, t.contrast, t.saturation, t.hue, t.gray_mean, v);
  const int64_t base = static_cast<int64_t>(t.out_index) * 3 * plane;
  for (int c = 0; c < 3; ++c) {
    const float y = v[c] * p.scale[c] + p.bias[c];
    const int64_t idx = p.layout == static_cast<int>(OutLayout::kNCHW)
                            ? base + static_cast<int64_t>(c) * plane + pix
                            : base + static_cast<int64_t>(pix) * 3 + c;
    if constexpr (sizeof(OutT) == 4)
      out[idx] = y;
    else
      out[idx] = __float2bfloat16_rn(y);
  }
}

Status Validate(const GpuImageTask& t, int i, const GpuResizeParams& p) {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError("image kernel task " + std::to_string(i) + ": " + what);
  };
  if (t.width <= 0 || t.height <= 0 || t.width > kMaxSide || t.height > kMaxSide)
    return bad("source size " + std::to_string(t.width) + "x" + std::to_string(t.height) +
               " out of range");
  if (!t.plane[0] || !t.plane[1] || !t.plane[2]) return bad("null source plane");
  if (t.pixel_stride != 1 && t.pixel_stride != 3) return bad("pixel_stride must be 1 or 3");
  const int64_t row = t.pixel_stride == 3 ? 3LL * t.width : t.width;
  if (t.pitch < row)
    return bad("pitch " + std::to_string(t.pitch) + " < row bytes " + std::to_string(row));
  if (!(t.box_w >= 1.f && t.box_h >= 1.f) || !(t.box_x0 >= 0.f && t.box_y0 >= 0.f) ||
      t.box_x0 + t.box_w > t.width + 1e-3f || t.box_y0 + t.box_h > t.height + 1e-3f)
    return bad("crop box outside the " + std::to_string(t.width) + "x" + std::to_string(t.height) +
               " source");
  if (t.out_index < 0 || t.out_index >= p.out_count)
    return bad("out_index " + std::to_string(t.out_index) + " outside [0, " +
               std::to_string(p.out_count) + ")");
  if (t.jitter && !(t.brightness >= 0.f && t.contrast >= 0.f && t.saturation >= 0.f))
    return bad("negative jitter factor");
  if (t.jitter && !(t.hue >= -0.5f && t.hue <= 0.5f)) return bad("hue shift outside [-0.5, 0.5]");
  return Status::Ok();
}

}  // namespace

Status LaunchCropResizeNormalize(const GpuImageTask* host_tasks, int n, GpuImageTask* device_tasks,
                                 const GpuResizeParams& params, void* out, cudaStream_t stream) {
  if (n < 0) return InvalidArgumentError("image kernel: negative task count");
  if (params.out_w <= 0 || params.out_h <= 0 || params.out_w > kMaxSide || params.out_h > kMaxSide)
    return InvalidArgumentError("image kernel: output size out of range");
  if (params.gray_step <= 0) return InvalidArgumentError("image kernel: gray_step must be > 0");
  for (int c = 0; c < 3; ++c)
    if (!(params.std[c] > 0.f)) return InvalidArgumentError("image kernel: std must be > 0");
  if (n == 0) return Status::Ok();
  if (!host_tasks || !device_tasks || !out)
    return InvalidArgumentError("image kernel: null tasks or output");
  if (n > 65535) return InvalidArgumentError("image kernel: more than 65535 images per launch");
  bool any_gray = false;
  for (int i = 0; i < n; ++i) {
    LF_RETURN_IF_ERROR(Validate(host_tasks[i], i, params));
    any_gray |= host_tasks[i].jitter && host_tasks[i].gray_mean < 0.f;
  }
  DeviceParams dp;
  dp.out_w = params.out_w;
  dp.out_h = params.out_h;
  dp.layout = static_cast<int>(params.layout);
  dp.dtype = static_cast<int>(params.dtype);
  dp.antialias = params.antialias ? 1 : 0;
  dp.gray_step = params.gray_step;
  for (int c = 0; c < 3; ++c) {
    dp.scale[c] = 1.f / (255.f * params.std[c]);
    dp.bias[c] = -params.mean[c] / params.std[c];
  }
  LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_tasks, host_tasks, sizeof(GpuImageTask) * n,
                                          cudaMemcpyHostToDevice, stream));
  if (any_gray) {
    MeanGrayKernel<<<n, kThreads, 0, stream>>>(device_tasks, params.gray_step);
    LF_CUDA_CHECK_LAUNCH();
  }
  const int plane = params.out_w * params.out_h;
  dim3 grid((plane + kThreads - 1) / kThreads, n);
  if (params.dtype == OutDType::kFloat32)
    CropResizeNormalizeKernel<float>
        <<<grid, kThreads, 0, stream>>>(device_tasks, dp, static_cast<float*>(out));
  else
    CropResizeNormalizeKernel<__nv_bfloat16>
        <<<grid, kThreads, 0, stream>>>(device_tasks, dp, static_cast<__nv_bfloat16*>(out));
  LF_CUDA_CHECK_LAUNCH();
  return Status::Ok();
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
