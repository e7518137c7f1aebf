// nvJPEG batched decode with hardware/CUDA split and CPU fallback: Note [GPU decode paths] in
// nvjpeg_decoder.h.
#include "nvjpeg_decoder.h"

#include <nvjpeg.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include "gpu_util.h"
#include "image_ops.h"
#include "loongforge/cuda_check.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace internal {
namespace {

constexpr int kMaxSide = 16384;
constexpr size_t kPitchAlign = 128;
constexpr size_t kAllocGranule = size_t{64} << 10;

const char* NvjpegStatusName(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS:
      return "SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG:
      return "BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "IMPLEMENTATION_NOT_SUPPORTED";
    default:
      return "UNKNOWN";
  }
}

Status NvjpegError(nvjpegStatus_t s, const char* expr) {
  std::string msg = std::string(expr) + " failed: NVJPEG_STATUS_" + NvjpegStatusName(s);
  if (s == NVJPEG_STATUS_ALLOCATOR_FAILURE) return ResourceExhaustedError(msg);
  if (s == NVJPEG_STATUS_ARCH_MISMATCH || s == NVJPEG_STATUS_NOT_INITIALIZED)
    return UnavailableError(msg);
  return InternalError(msg);
}

#define LF_NVJPEG_RETURN_IF_ERROR(expr)                                     \
  do {                                                                      \
    nvjpegStatus_t _lf_st = (expr);                                         \
    if (_lf_st != NVJPEG_STATUS_SUCCESS) return NvjpegError(_lf_st, #expr); \
  } while (0)

size_t RoundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// An EOI marker within the last 64 bytes (trailing padding after it is tolerated). nvJPEG may
// decode a truncated stream without complaint; libjpeg-turbo reports it, so such streams take
// the CPU path and get the CPU loader's error.
bool HasEoi(std::string_view j) {
  const size_t n = j.size();
  const size_t lo = n > 64 ? n - 64 : 0;
  for (size_t i = n; i > lo + 1; --i)
    if (static_cast<uint8_t>(j[i - 2]) == 0xFF && static_cast<uint8_t>(j[i - 1]) == 0xD9)
      return true;
  return false;
}

enum class Path : uint8_t { kHardware, kCuda, kCpu };

struct DeviceBuffer {
  void* p = nullptr;
  size_t capacity = 0;
};

}  // namespace

struct NvJpegBatchDecoder::Impl {
  NvJpegDecoderOptions opts;
  cudaStream_t stream = nullptr;       // hardware decode, CPU-path uploads, ready events
  cudaStream_t cuda_stream = nullptr;  // CUDA-backend decode, so it overlaps the engine's work
  cudaEvent_t cuda_done = nullptr;
  nvjpegHandle_t hw = nullptr, sw = nullptr, parse_handle = nullptr;
  nvjpegJpegState_t hw_state[2] = {nullptr, nullptr}, sw_state[2] = {nullptr, nullptr};
  nvjpegJpegStream_t parser = nullptr;
  cudaEvent_t ready[2] = {nullptr, nullptr}, released[2] = {nullptr, nullptr};
  bool released_recorded[2] = {false, false};
  std::vector<DeviceBuffer> bufs[2];
  int set = 1;                 // buffer set of the last Decode(); the next one uses set ^ 1
  int auto_phase = 3;          // 0 warm-up, 1 measure hardware, 2 measure cuda, 3 fixed ratio
  mutable std::mutex info_mu;  // info is read by other threads (metrics)
  NvJpegDecoderInfo info;
  // Per-batch scratch, reused.
  std::vector<Path> path;
  std::vector<uint32_t> width, height;
  std::vector<RgbImage> cpu_images;

  ~Impl();
  Status Ensure(int s, size_t i, size_t bytes);
  // Runs one nvjpegDecodeBatched over `idx`. *failed: nvJPEG rejected the batch (the caller
  // retries those images on the CPU); a non-OK return is a device failure.
  Status RunBatched(nvjpegHandle_t h, nvjpegJpegState_t st, int s, const std::vector<size_t>& idx,
                    const std::vector<std::string_view>& jpegs, std::vector<DecodedImage>* out,
                    cudaStream_t on, bool* failed);
  Status RunCpu(int s, const std::vector<size_t>& idx, const std::vector<std::string_view>& jpegs,
                const std::function<std::string(size_t)>& name_of, std::vector<DecodedImage>* out,
                std::vector<Status>* status);
};

NvJpegBatchDecoder::Impl::~Impl() {
  if (stream) LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(stream));
  if (cuda_stream) LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(cuda_stream));
  for (int s = 0; s < 2; ++s) {
    if (hw_state[s]) nvjpegJpegStateDestroy(hw_state[s]);
    if (sw_state[s]) nvjpegJpegStateDestroy(sw_state[s]);
    for (DeviceBuffer& b : bufs[s])
      if (b.p) LF_CUDA_WARN_IF_ERROR(cudaFree(b.p));
    if (ready[s]) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(ready[s]));
    if (released[s]) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(released[s]));
  }
  if (parser) nvjpegJpegStreamDestroy(parser);
  if (hw) nvjpegDestroy(hw);
  if (sw) nvjpegDestroy(sw);
  if (cuda_done) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(cuda_done));
  if (cuda_stream) LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(cuda_stream));
  if (stream) LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(stream));
}

Status NvJpegBatchDecoder::Impl::Ensure(int s, size_t i, size_t bytes) {
  if (bufs[s].size() <= i) bufs[s].resize(i + 1);
  DeviceBuffer& b = bufs[s][i];
  if (b.capacity >= bytes) return Status::Ok();
  // Grows only (to the largest image seen in this slot): after warm-up nothing is allocated.
  if (b.p) LF_CUDA_RETURN_IF_ERROR(cudaFree(b.p));
  b.p = nullptr;
  b.capacity = 0;
  const size_t cap = RoundUp(bytes + bytes / 8, kAllocGranule);  // headroom for size jitter
  LF_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.p, cap));
  b.capacity = cap;
  return Status::Ok();
}

Status NvJpegBatchDecoder::Impl::RunBatched(nvjpegHandle_t h, nvjpegJpegState_t st, int s,
                                            const std::vector<size_t>& idx,
                                            const std::vector<std::string_view>& jpegs,
                                            std::vector<DecodedImage>* out, cudaStream_t on,
                                            bool* failed) {
  *failed = false;
  if (idx.empty()) return Status::Ok();
  std::vector<const unsigned char*> data(idx.size());
  std::vector<size_t> lengths(idx.size());
  std::vector<nvjpegImage_t> dest(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    const size_t pitch = RoundUp(width[i], kPitchAlign);
    const size_t plane = pitch * height[i];
    LF_RETURN_IF_ERROR(Ensure(s, i, 3 * plane));
    auto* base = static_cast<unsigned char*>(bufs[s][i].p);
    nvjpegImage_t& d = dest[k];
    for (int c = 0; c < NVJPEG_MAX_COMPONENT; ++c) {
      d.channel[c] = c < 3 ? base + c * plane : nullptr;
      d.pitch[c] = c < 3 ? pitch : 0;
    }
    data[k] = reinterpret_cast<const unsigned char*>(jpegs[i].data());
    lengths[k] = jpegs[i].size();
    DecodedImage& o = (*out)[i];
    for (int c = 0; c < 3; ++c) o.plane[c] = base + c * plane;
    o.pitch = static_cast<int64_t>(pitch);
    o.pixel_stride = 1;
    o.width = static_cast<int32_t>(width[i]);
    o.height = static_cast<int32_t>(height[i]);
  }
  // max_cpu_threads = 1: the calling thread does the host part (0 is rejected by nvJPEG).
  nvjpegStatus_t rc =
      nvjpegDecodeBatchedInitialize(h, st, static_cast<int>(idx.size()), 1, NVJPEG_OUTPUT_RGB);
  if (rc == NVJPEG_STATUS_SUCCESS)
    rc = nvjpegDecodeBatched(h, st, data.data(), lengths.data(), dest.data(), on);
  if (rc != NVJPEG_STATUS_SUCCESS) {
    if (rc == NVJPEG_STATUS_ALLOCATOR_FAILURE || rc == NVJPEG_STATUS_EXECUTION_FAILED)
      return NvjpegError(rc, "nvjpegDecodeBatched");  // the device's fault, not the data's
    *failed = true;
    LF_LOG(WARNING) << "nvjpegDecodeBatched rejected a batch of " << idx.size()
                    << " images (NVJPEG_STATUS_" << NvjpegStatusName(rc)
                    << "): decoding them on the CPU";
    for (size_t i : idx) (*out)[i] = DecodedImage();
  }
  return Status::Ok();
}

Status NvJpegBatchDecoder::Impl::RunCpu(int s, const std::vector<size_t>& idx,
                                        const std::vector<std::string_view>& jpegs,
                                        const std::function<std::string(size_t)>& name_of,
                                        std::vector<DecodedImage>* out,
                                        std::vector<Status>* status) {
  if (idx.empty()) return Status::Ok();
  if (cpu_images.size() < jpegs.size()) cpu_images.resize(jpegs.size());
  std::vector<Status> results(idx.size());
  auto work = [&](size_t k) {
    thread_local JpegDecoder decoder;
    const size_t i = idx[k];
    // Full-size decode: the GPU path never uses DCT scaling, so both paths see the same pixels.
    results[k] = decoder.Decode(jpegs[i], 0, 0, &cpu_images[i], name_of(i));
  };
  if (opts.cpu_pool && idx.size() > 1) {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = idx.size();
    for (size_t k = 0; k < idx.size(); ++k) {
      auto task = [&, k] {
        work(k);
        std::lock_guard<std::mutex> lock(mu);
        if (--left == 0) cv.notify_all();
      };
      if (!opts.cpu_pool->Submit(task).ok()) task();  // pool shut down: decode here
    }
    std::unique_lock<std::mutex> lock(mu);
    // The tasks reference this frame, so this wait cannot give up; it reports a stall instead.
    while (
        !cv.wait_for(lock, std::chrono::milliseconds(opts.timeout_ms), [&] { return left == 0; }))
      LF_LOG(ERROR) << "nvJPEG decoder: CPU fallback decode of " << idx.size()
                    << " images has taken more than " << opts.timeout_ms << " ms";
  } else {
    for (size_t k = 0; k < idx.size(); ++k) work(k);
  }
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    if (!results[k].ok()) {
      (*status)[i] = std::move(results[k]);
      (*out)[i] = DecodedImage();
      continue;
    }
    const RgbImage& im = cpu_images[i];
    const size_t row = 3 * static_cast<size_t>(im.width);
    const size_t pitch = RoundUp(row, kPitchAlign);
    LF_RETURN_IF_ERROR(Ensure(s, i, pitch * im.height));
    auto* base = static_cast<uint8_t*>(bufs[s][i].p);
    // From pageable memory: returns once the bytes are staged, so cpu_images may be reused.
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(base, pitch, im.pixels.data(), row, row, im.height,
                                              cudaMemcpyHostToDevice, stream));
    DecodedImage& o = (*out)[i];
    for (int c = 0; c < 3; ++c) o.plane[c] = base + c;
    o.pitch = static_cast<int64_t>(pitch);
    o.pixel_stride = 3;
    o.width = im.width;
    o.height = im.height;
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<NvJpegBatchDecoder>> NvJpegBatchDecoder::Create(
    const NvJpegDecoderOptions& opts) {
  std::unique_ptr<NvJpegBatchDecoder> d(new NvJpegBatchDecoder());
  d->impl_ = std::make_unique<Impl>();
  Impl& im = *d->impl_;
  im.opts = opts;
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(opts.device));
  LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
  LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&im.cuda_stream, cudaStreamNonBlocking));
  LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.cuda_done, cudaEventDisableTiming));
  for (int s = 0; s < 2; ++s) {
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.ready[s], cudaEventDisableTiming));
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.released[s], cudaEventDisableTiming));
  }
  NvJpegDecoderInfo& info = im.info;
  if (opts.allow_hardware) {
    nvjpegStatus_t rc =
        nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &im.hw);
    if (rc == NVJPEG_STATUS_SUCCESS) {
      for (int s = 0; s < 2 && rc == NVJPEG_STATUS_SUCCESS; ++s)
        rc = nvjpegJpegStateCreate(im.hw, &im.hw_state[s]);
      if (rc != NVJPEG_STATUS_SUCCESS) {
        for (auto& st : im.hw_state)
          if (st) nvjpegJpegStateDestroy(st), st = nullptr;
        nvjpegDestroy(im.hw);
        im.hw = nullptr;
        info.reason = std::string("hardware backend state creation failed: NVJPEG_STATUS_") +
                      NvjpegStatusName(rc);
      } else {
        unsigned engines = 0, cores = 0;
        nvjpegGetHardwareDecoderInfo(im.hw, &engines, &cores);
        info.reason = "hardware JPEG engine in use (" + std::to_string(engines) + " engines x " +
                      std::to_string(cores) + " cores)";
      }
    } else {
      im.hw = nullptr;
      info.reason = std::string("nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE) failed: NVJPEG_STATUS_") +
                    NvjpegStatusName(rc) +
                    (rc == NVJPEG_STATUS_ARCH_MISMATCH ? " (this GPU has no JPEG engine)" : "");
    }
  } else {
    info.reason = "hardware decode disabled by option";
  }
  std::string sw_name = "gpu_hybrid";
  nvjpegStatus_t rc =
      nvjpegCreateEx(NVJPEG_BACKEND_GPU_HYBRID, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &im.sw);
  if (rc != NVJPEG_STATUS_SUCCESS) {
    im.sw = nullptr;
    sw_name = "default";
    rc = nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &im.sw);
    if (rc != NVJPEG_STATUS_SUCCESS) {
      im.sw = nullptr;
      return NvjpegError(rc, "nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT)");
    }
  }
  for (int s = 0; s < 2; ++s)
    LF_NVJPEG_RETURN_IF_ERROR(nvjpegJpegStateCreate(im.sw, &im.sw_state[s]));
  im.parse_handle = im.hw ? im.hw : im.sw;
  LF_NVJPEG_RETURN_IF_ERROR(nvjpegJpegStreamCreate(im.parse_handle, &im.parser));
  info.hw_available = im.hw != nullptr;
  info.backend = im.hw ? "hardware+" + sw_name : sw_name;
  if (!im.hw) {
    info.hw_ratio = 0.f;
  } else if (opts.hw_ratio >= 0.f) {
    info.hw_ratio = std::min(1.f, opts.hw_ratio);
  } else {
    info.hw_ratio = 1.f;
    im.auto_phase = 0;
  }
  return d;
}

NvJpegBatchDecoder::~NvJpegBatchDecoder() = default;

Status NvJpegBatchDecoder::Decode(const std::vector<std::string_view>& jpegs,
                                  const std::function<std::string(size_t)>& name_of,
                                  std::vector<DecodedImage>* out, std::vector<Status>* status) {
  Impl& im = *impl_;
  const int s = im.set ^ 1;
  if (im.released_recorded[s])
    LF_RETURN_IF_ERROR(WaitEvent(im.released[s], im.opts.timeout_ms,
                                 "nvJPEG decoder: waiting for the consumer of a buffer set"));
  const size_t n = jpegs.size();
  out->assign(n, DecodedImage());
  status->assign(n, Status::Ok());
  im.path.assign(n, Path::kCpu);
  im.width.assign(n, 0);
  im.height.assign(n, 0);
  std::vector<size_t> hw_idx, cuda_idx, cpu_idx;
  // Headers on the CPU: choose each image's path.
  for (size_t i = 0; i < n; ++i) {
    const std::string_view j = jpegs[i];
    Path p = Path::kCpu;
    if (j.size() >= 4 && static_cast<uint8_t>(j[0]) == 0xFF && static_cast<uint8_t>(j[1]) == 0xD8 &&
        HasEoi(j) &&
        nvjpegJpegStreamParseHeader(im.parse_handle,
                                    reinterpret_cast<const unsigned char*>(j.data()), j.size(),
                                    im.parser) == NVJPEG_STATUS_SUCCESS) {
      nvjpegJpegEncoding_t enc = NVJPEG_ENCODING_UNKNOWN;
      unsigned comps = 0, w = 0, h = 0;
      if (nvjpegJpegStreamGetJpegEncoding(im.parser, &enc) == NVJPEG_STATUS_SUCCESS &&
          (enc == NVJPEG_ENCODING_BASELINE_DCT ||
           enc == NVJPEG_ENCODING_EXTENDED_SEQUENTIAL_DCT_HUFFMAN) &&
          nvjpegJpegStreamGetComponentsNum(im.parser, &comps) == NVJPEG_STATUS_SUCCESS &&
          (comps == 1 || comps == 3) &&
          nvjpegJpegStreamGetFrameDimensions(im.parser, &w, &h) == NVJPEG_STATUS_SUCCESS && w > 0 &&
          h > 0 && w <= static_cast<unsigned>(kMaxSide) && h <= static_cast<unsigned>(kMaxSide)) {
        im.width[i] = w;
        im.height[i] = h;
        p = Path::kCuda;
        int unsupported = -1;
        if (im.hw &&
            nvjpegDecodeBatchedSupported(im.hw, im.parser, &unsupported) == NVJPEG_STATUS_SUCCESS &&
            unsupported == 0)
          p = Path::kHardware;
      }
    }
    im.path[i] = p;
    (p == Path::kHardware ? hw_idx : p == Path::kCuda ? cuda_idx : cpu_idx).push_back(i);
  }
  // Split the hardware-eligible images (Note [GPU decode paths]).
  const bool measure_hw = im.auto_phase == 1 && !hw_idx.empty();
  const bool measure_cuda = im.auto_phase == 2 && !hw_idx.empty();
  size_t keep_hw = hw_idx.size();
  if (measure_cuda)
    keep_hw = 0;
  else if (!measure_hw && im.auto_phase != 0)
    keep_hw = static_cast<size_t>(std::lround(im.info.hw_ratio * hw_idx.size()));
  cuda_idx.insert(cuda_idx.end(), hw_idx.begin() + keep_hw, hw_idx.end());
  hw_idx.resize(keep_hw);

  LF_RETURN_IF_ERROR(im.RunCpu(s, cpu_idx, jpegs, name_of, out, status));
  bool hw_failed = false, cuda_failed = false;
  // CUDA backend first, on its own stream: its host part runs before the engine's, and its
  // kernels overlap the engine's decode (which may hold this thread until it is done).
  auto t0 = std::chrono::steady_clock::now();
  LF_RETURN_IF_ERROR(
      im.RunBatched(im.sw, im.sw_state[s], s, cuda_idx, jpegs, out, im.cuda_stream, &cuda_failed));
  if (measure_cuda) LF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.cuda_stream));
  auto t1 = std::chrono::steady_clock::now();
  LF_RETURN_IF_ERROR(
      im.RunBatched(im.hw, im.hw_state[s], s, hw_idx, jpegs, out, im.stream, &hw_failed));
  if (measure_hw) LF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
  auto t2 = std::chrono::steady_clock::now();
  // Join the CUDA-backend stream into the main one (the ready event covers both).
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.cuda_done, im.cuda_stream));
  LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(im.stream, im.cuda_done, 0));
  if (hw_failed) LF_RETURN_IF_ERROR(im.RunCpu(s, hw_idx, jpegs, name_of, out, status));
  if (cuda_failed) LF_RETURN_IF_ERROR(im.RunCpu(s, cuda_idx, jpegs, name_of, out, status));

  std::lock_guard<std::mutex> lock(im.info_mu);
  NvJpegDecoderInfo& info = im.info;
  info.batch_retries += hw_failed + cuda_failed;
  (hw_failed ? info.images_cpu : info.images_hw) += static_cast<int64_t>(hw_idx.size());
  (cuda_failed ? info.images_cpu : info.images_cuda) += static_cast<int64_t>(cuda_idx.size());
  info.images_cpu += static_cast<int64_t>(cpu_idx.size());
  // Auto split: warm-up, then one measured batch per path.
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  if (im.auto_phase == 0 && !hw_idx.empty()) {
    im.auto_phase = 1;
  } else if (measure_hw && !hw_failed) {
    info.hw_ms_per_image = ms(t1, t2) / hw_idx.size();
    im.auto_phase = 2;
  } else if (measure_cuda && !cuda_failed && !cuda_idx.empty()) {
    info.cuda_ms_per_image = ms(t0, t1) / cuda_idx.size();
    const double r_hw = 1.0 / std::max(info.hw_ms_per_image, 1e-6);
    const double r_cuda = 1.0 / std::max(info.cuda_ms_per_image, 1e-6);
    info.hw_ratio = static_cast<float>(r_hw / (r_hw + r_cuda));
    info.ratio_measured = true;
    im.auto_phase = 3;
    LF_LOG(INFO) << "nvJPEG decoder: hardware " << info.hw_ms_per_image << " ms/image, cuda "
                 << info.cuda_ms_per_image << " ms/image: hw_ratio " << info.hw_ratio;
  }
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ready[s], im.stream));
  im.set = s;
  return Status::Ok();
}

Status NvJpegBatchDecoder::ReleaseAfter(cudaStream_t consumer) {
  Impl& im = *impl_;
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.released[im.set], consumer));
  im.released_recorded[im.set] = true;
  return Status::Ok();
}

cudaEvent_t NvJpegBatchDecoder::ready_event() const { return impl_->ready[impl_->set]; }
cudaStream_t NvJpegBatchDecoder::stream() const { return impl_->stream; }
NvJpegDecoderInfo NvJpegBatchDecoder::info() const {
  std::lock_guard<std::mutex> lock(impl_->info_mu);
  return impl_->info;
}

}  // namespace internal
}  // namespace loongforge
