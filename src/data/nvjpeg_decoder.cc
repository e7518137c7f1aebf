// nvJPEG batched decode with hardware/CUDA split and CPU fallback: Note [GPU decode paths] in
// nvjpeg_decoder.h.
#include "nvjpeg_decoder.h"

#include <nvjpeg.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "common/cuda_check.h"
#include "decode_turns.h"
#include "gpu_util.h"
#include "image_ops.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace data {
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

// Pinned host staging of a batch's JPEG bitstreams (Note [Pinned bitstreams]).
struct PinnedBuffer {
  void* p = nullptr;
  size_t capacity = 0;
};

}  // namespace

// One lane: Note [Decode lanes].
struct NvJpegLane {
  enum class State : uint8_t { kFree, kQueued, kDone };
  int id = 0;
  cudaStream_t stream = nullptr;       // hardware decode, CPU-path uploads, ready events
  cudaStream_t cuda_stream = nullptr;  // CUDA-backend decode, so it overlaps the engine's work
  cudaEvent_t cuda_done = nullptr, ready = nullptr, released = nullptr;
  bool released_recorded = false;
  nvjpegHandle_t hw = nullptr;      // the hardware handle this lane decodes with
  nvjpegHandle_t own_hw = nullptr;  // hw_handle_per_lane: owned by the lane
  nvjpegJpegState_t hw_state = nullptr, sw_state = nullptr;
  nvjpegJpegStream_t parser = nullptr;
  int hw_batch = -1, sw_batch = -1;     // batch size the state was initialized for; -1: re-init
  int pre_n = 0, pre_w = 0, pre_h = 0;  // hardware pre-allocation made for
  std::vector<DeviceBuffer> bufs;
  PinnedBuffer pin_hw, pin_sw;  // bitstreams of the hardware / CUDA-backend calls
  // Per-batch scratch, reused.
  std::vector<Path> path;
  std::vector<uint32_t> width, height;
  std::vector<RgbImage> cpu_images;
  // The batch (guarded by Impl::mu while queued; the lane owns it while it runs).
  State state = State::kFree;
  uint64_t seq = 0;  // submission index of the batch (Note [Decode turns])
  std::vector<std::string_view> jpegs;
  std::function<std::string(size_t)> name_of;
  NvJpegBatchDecoder::Result result;
  Status job_status;
  std::thread thread;
};

struct NvJpegBatchDecoder::Impl {
  NvJpegDecoderOptions opts;
  nvjpegHandle_t hw = nullptr, sw = nullptr, parse_handle = nullptr;
  std::vector<std::unique_ptr<NvJpegLane>> lanes;
  uint64_t submitted = 0;
  std::deque<int> fifo;   // lanes of the submitted, not yet collected batches, in order
  int collected = -1;     // lane of the last collected batch
  mutable std::mutex mu;  // lane states and fifo
  std::condition_variable work_cv, done_cv;
  bool stop = false;
  int running = 0;     // lane jobs running right now
  int auto_phase = 3;  // 0 warm-up, 1 measure hardware, 2 measure cuda, 3 fixed ratio
  std::unique_ptr<DecodeTurns> turns;  // Note [Decode turns]
  bool prealloc_warned = false;
  mutable std::mutex info_mu;  // info and auto_phase, read by other threads (metrics)
  NvJpegDecoderInfo info;

  ~Impl();
  Status CreateLane(int id);
  void LaneLoop(NvJpegLane* L);
  Status RunJob(NvJpegLane& L);
  Status Ensure(NvJpegLane& L, size_t i, size_t bytes);
  Status EnsurePinned(PinnedBuffer& b, size_t bytes);
  // Runs one nvjpegDecodeBatched over `idx`. *failed: nvJPEG rejected the batch (the caller
  // retries those images on the CPU); a non-OK return is a device failure.
  Status RunBatched(NvJpegLane& L, nvjpegHandle_t h, nvjpegJpegState_t st, int* inited,
                    const std::vector<size_t>& idx, cudaStream_t on, bool* failed);
  Status RunCpu(NvJpegLane& L, const std::vector<size_t>& idx);
  // Waits until no lane job is queued or running (reports stalls; cannot give up: the jobs read
  // the caller's memory).
  void WaitIdle(std::unique_lock<std::mutex>& lock, const char* what);
};

NvJpegBatchDecoder::Impl::~Impl() {
  {
    std::unique_lock<std::mutex> lock(mu);
    stop = true;
    work_cv.notify_all();
    WaitIdle(lock, "shutdown");
  }
  for (auto& L : lanes)
    if (L->thread.joinable()) L->thread.join();
  // States are destroyed after their streams are idle.
  for (auto& L : lanes) {
    if (L->stream) LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(L->stream));
    if (L->cuda_stream) LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(L->cuda_stream));
  }
  for (auto& L : lanes) {
    if (L->hw_state) nvjpegJpegStateDestroy(L->hw_state);
    if (L->sw_state) nvjpegJpegStateDestroy(L->sw_state);
    if (L->parser) nvjpegJpegStreamDestroy(L->parser);
    if (L->own_hw) nvjpegDestroy(L->own_hw);
    for (DeviceBuffer& b : L->bufs)
      if (b.p) LF_CUDA_WARN_IF_ERROR(cudaFree(b.p));
    for (PinnedBuffer* b : {&L->pin_hw, &L->pin_sw})
      if (b->p) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(b->p));
    for (cudaEvent_t e : {L->cuda_done, L->ready, L->released})
      if (e) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(e));
    if (L->cuda_stream) LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(L->cuda_stream));
    if (L->stream) LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(L->stream));
  }
  if (hw) nvjpegDestroy(hw);
  if (sw) nvjpegDestroy(sw);
}

void NvJpegBatchDecoder::Impl::WaitIdle(std::unique_lock<std::mutex>& lock, const char* what) {
  auto idle = [&] {
    if (running > 0) return false;
    // A queued job is picked up by its lane thread (which runs it even when stopping).
    for (auto& L : lanes)
      if (L->state == NvJpegLane::State::kQueued && L->thread.joinable()) return false;
    return true;
  };
  while (!done_cv.wait_for(lock, std::chrono::milliseconds(opts.timeout_ms), idle))
    LF_LOG(ERROR) << "nvJPEG decoder (" << what << "): a lane's batch has been in nvJPEG for more "
                  << "than " << opts.timeout_ms << " ms";
}

Status NvJpegBatchDecoder::Impl::CreateLane(int id) {
  auto L = std::make_unique<NvJpegLane>();
  L->id = id;
  LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&L->stream, cudaStreamNonBlocking));
  LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&L->cuda_stream, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&L->cuda_done, &L->ready, &L->released})
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  NvJpegLane* raw = L.get();
  lanes.push_back(std::move(L));  // owned from here: ~Impl destroys what was created
  raw->hw = hw;
  if (hw && opts.hw_handle_per_lane && id > 0) {
    LF_NVJPEG_RETURN_IF_ERROR(nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr,
                                             NVJPEG_FLAGS_DEFAULT, &raw->own_hw));
    raw->hw = raw->own_hw;
    if (opts.reuse_state) {
      if (opts.device_padding) nvjpegSetDeviceMemoryPadding(opts.device_padding, raw->hw);
      if (opts.pinned_padding) nvjpegSetPinnedMemoryPadding(opts.pinned_padding, raw->hw);
    }
  }
  if (raw->hw) LF_NVJPEG_RETURN_IF_ERROR(nvjpegJpegStateCreate(raw->hw, &raw->hw_state));
  LF_NVJPEG_RETURN_IF_ERROR(nvjpegJpegStateCreate(sw, &raw->sw_state));
  LF_NVJPEG_RETURN_IF_ERROR(nvjpegJpegStreamCreate(parse_handle, &raw->parser));
  return Status::Ok();
}

void NvJpegBatchDecoder::Impl::LaneLoop(NvJpegLane* L) {
  LF_CUDA_WARN_IF_ERROR(cudaSetDevice(opts.device));
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    // Woken by Submit or shutdown; the timeout only bounds each wait.
    work_cv.wait_for(lock, std::chrono::milliseconds(200),
                     [&] { return stop || L->state == NvJpegLane::State::kQueued; });
    if (L->state != NvJpegLane::State::kQueued) {
      if (stop) return;
      continue;
    }
    ++running;
    lock.unlock();
    Status s = RunJob(*L);
    lock.lock();
    L->job_status = std::move(s);
    L->state = NvJpegLane::State::kDone;
    --running;
    done_cv.notify_all();
  }
}

Status NvJpegBatchDecoder::Impl::Ensure(NvJpegLane& L, size_t i, size_t bytes) {
  if (L.bufs.size() <= i) L.bufs.resize(i + 1);
  DeviceBuffer& b = L.bufs[i];
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

// Note [Pinned bitstreams]
// nvjpegDecodeBatched copies each JPEG's bytes to the device with cudaMemcpyAsync. From pageable
// memory (the record store's map) such a copy is synchronous for the calling thread; from pinned
// memory it is DMA queued on the lane's stream. The lane first copies the batch's bitstreams into
// its own pinned buffer (about 1 ms for 128 JPEGs of 90 KB). A buffer is rewritten only by the
// lane's next job, which starts after its `released` event, so after the device read the previous
// bytes. Measured at n16 batch 64 on an H200 (bench/e2e/diag_stall.sh): alone it did not change
// the trainer's data wait (28.9%); with 32 hardware queues (Note [Hardware queues], python/
// loongforge/_cuda_env.py) the wait fell to 0.05%. That pair is what was measured and is kept.
Status NvJpegBatchDecoder::Impl::EnsurePinned(PinnedBuffer& b, size_t bytes) {
  if (b.capacity >= bytes) return Status::Ok();
  // Grows only: after the first batches nothing is allocated.
  if (b.p) LF_CUDA_RETURN_IF_ERROR(cudaFreeHost(b.p));
  b.p = nullptr;
  b.capacity = 0;
  const size_t cap = RoundUp(bytes + bytes / 4, kAllocGranule);
  LF_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&b.p, cap, cudaHostAllocDefault));
  b.capacity = cap;
  return Status::Ok();
}

Status NvJpegBatchDecoder::Impl::RunBatched(NvJpegLane& L, nvjpegHandle_t h, nvjpegJpegState_t st,
                                            int* inited, const std::vector<size_t>& idx,
                                            cudaStream_t on, bool* failed) {
  *failed = false;
  if (idx.empty()) return Status::Ok();
  std::vector<DecodedImage>& out = L.result.images;
  std::vector<const unsigned char*> data(idx.size());
  std::vector<size_t> lengths(idx.size());
  std::vector<nvjpegImage_t> dest(idx.size());
  int max_w = 0, max_h = 0;
  const bool inter = opts.interleaved;
  const nvjpegOutputFormat_t fmt = inter ? NVJPEG_OUTPUT_RGBI : NVJPEG_OUTPUT_RGB;
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    // Planar: 3 planes of `pitch` x height; interleaved: one plane of RGB triplets.
    const size_t pitch = RoundUp((inter ? 3 : 1) * static_cast<size_t>(L.width[i]), kPitchAlign);
    const size_t plane = pitch * L.height[i];
    LF_RETURN_IF_ERROR(Ensure(L, i, (inter ? 1 : 3) * plane));
    auto* base = static_cast<unsigned char*>(L.bufs[i].p);
    nvjpegImage_t& d = dest[k];
    for (int c = 0; c < NVJPEG_MAX_COMPONENT; ++c) {
      const bool used = inter ? c == 0 : c < 3;
      d.channel[c] = used ? base + c * plane : nullptr;
      d.pitch[c] = used ? pitch : 0;
    }
    data[k] = reinterpret_cast<const unsigned char*>(L.jpegs[i].data());
    lengths[k] = L.jpegs[i].size();
    DecodedImage& o = out[i];
    for (int c = 0; c < 3; ++c) o.plane[c] = inter ? base + c : base + c * plane;
    o.pitch = static_cast<int64_t>(pitch);
    o.pixel_stride = inter ? 3 : 1;
    o.width = static_cast<int32_t>(L.width[i]);
    o.height = static_cast<int32_t>(L.height[i]);
    max_w = std::max(max_w, o.width);
    max_h = std::max(max_h, o.height);
  }
  // Note [Pinned bitstreams]
  size_t total = 0;
  for (size_t k = 0; k < idx.size(); ++k) total += RoundUp(lengths[k], 64);
  PinnedBuffer& pin = h == L.hw ? L.pin_hw : L.pin_sw;
  LF_RETURN_IF_ERROR(EnsurePinned(pin, total));
  {
    auto* dst = static_cast<unsigned char*>(pin.p);
    for (size_t k = 0; k < idx.size(); ++k) {
      std::memcpy(dst, data[k], lengths[k]);
      data[k] = dst;
      dst += RoundUp(lengths[k], 64);
    }
  }
  const int n = static_cast<int>(idx.size());
  nvjpegStatus_t rc = NVJPEG_STATUS_SUCCESS;
  // Hardware states: pre-allocated for the largest batch and frame seen (a hint; nvJPEG still
  // grows its buffers if needed), before the (re-)initialization it forces.
  if (opts.reuse_state && h == L.hw && (n > L.pre_n || max_w > L.pre_w || max_h > L.pre_h)) {
    L.pre_n = std::max(L.pre_n, n);
    L.pre_w = std::max(L.pre_w, max_w);
    L.pre_h = std::max(L.pre_h, max_h);
    nvjpegStatus_t pr =
        nvjpegDecodeBatchedPreAllocate(h, st, L.pre_n, L.pre_w, L.pre_h, NVJPEG_CSS_444, fmt);
    if (pr != NVJPEG_STATUS_SUCCESS) {
      std::lock_guard<std::mutex> lock(info_mu);
      if (!prealloc_warned)
        LF_LOG(WARNING) << "nvjpegDecodeBatchedPreAllocate failed (NVJPEG_STATUS_"
                        << NvjpegStatusName(pr) << "): nvJPEG allocates on demand";
      prealloc_warned = true;
    }
    *inited = -1;
  }
  // nvJPEG's contract: initialize once per batch size, and again after a failed batch.
  if (!opts.reuse_state || *inited != n) {
    *inited = -1;
    // max_cpu_threads = 1: the calling thread does the host part (0 is rejected by nvJPEG).
    rc = nvjpegDecodeBatchedInitialize(h, st, n, 1, fmt);
    if (rc == NVJPEG_STATUS_SUCCESS) *inited = n;
    std::lock_guard<std::mutex> lock(info_mu);
    ++info.state_inits;
  }
  if (rc == NVJPEG_STATUS_SUCCESS)
    rc = nvjpegDecodeBatched(h, st, data.data(), lengths.data(), dest.data(), on);
  if (rc != NVJPEG_STATUS_SUCCESS) {
    *inited = -1;
    if (rc == NVJPEG_STATUS_ALLOCATOR_FAILURE || rc == NVJPEG_STATUS_EXECUTION_FAILED)
      return NvjpegError(rc, "nvjpegDecodeBatched");  // the device's fault, not the data's
    *failed = true;
    LF_LOG(WARNING) << "nvjpegDecodeBatched rejected a batch of " << idx.size()
                    << " images (NVJPEG_STATUS_" << NvjpegStatusName(rc)
                    << "): decoding them on the CPU";
    for (size_t i : idx) out[i] = DecodedImage();
  }
  return Status::Ok();
}

Status NvJpegBatchDecoder::Impl::RunCpu(NvJpegLane& L, const std::vector<size_t>& idx) {
  if (idx.empty()) return Status::Ok();
  const std::vector<std::string_view>& jpegs = L.jpegs;
  std::vector<DecodedImage>* out = &L.result.images;
  std::vector<Status>* status = &L.result.status;
  if (L.cpu_images.size() < jpegs.size()) L.cpu_images.resize(jpegs.size());
  std::vector<Status> results(idx.size());
  auto work = [&](size_t k) {
    thread_local JpegDecoder decoder;
    const size_t i = idx[k];
    // Full-size decode: the GPU path never uses DCT scaling, so both paths see the same pixels.
    results[k] =
        decoder.Decode(jpegs[i], 0, 0, &L.cpu_images[i], L.name_of(i), opts.max_frame_pixels);
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
    const RgbImage& im = L.cpu_images[i];
    const size_t row = 3 * static_cast<size_t>(im.width);
    const size_t pitch = RoundUp(row, kPitchAlign);
    LF_RETURN_IF_ERROR(Ensure(L, i, pitch * im.height));
    auto* base = static_cast<uint8_t*>(L.bufs[i].p);
    // From pageable memory: returns once the bytes are staged, so cpu_images may be reused.
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(base, pitch, im.pixels.data(), row, row, im.height,
                                              cudaMemcpyHostToDevice, L.stream));
    DecodedImage& o = (*out)[i];
    for (int c = 0; c < 3; ++c) o.plane[c] = base + c;
    o.pitch = static_cast<int64_t>(pitch);
    o.pixel_stride = 3;
    o.width = im.width;
    o.height = im.height;
  }
  return Status::Ok();
}

// One batch on lane L (the body of the former Decode()).
Status NvJpegBatchDecoder::Impl::RunJob(NvJpegLane& L) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  DecodeTurn turn(turns.get(), L.seq);  // passed on however this job ends
  const Clock::time_point t_start = Clock::now();
  if (L.released_recorded)
    LF_RETURN_IF_ERROR(WaitEvent(L.released, opts.timeout_ms,
                                 "nvJPEG decoder: waiting for the consumer of a buffer set"));
  const Clock::time_point t_released = Clock::now();
  const std::vector<std::string_view>& jpegs = L.jpegs;
  const size_t n = jpegs.size();
  L.result.images.assign(n, DecodedImage());
  L.result.status.assign(n, Status::Ok());
  L.result.ready = L.ready;
  L.result.stream = L.stream;
  L.result.lane = L.id;
  L.path.assign(n, Path::kCpu);
  L.width.assign(n, 0);
  L.height.assign(n, 0);
  // The auto split's warm-up and measured batches run alone (timed without the other lanes'
  // decodes): they hold the turn for the whole job.
  int phase = 3;
  float hw_ratio = 0.f;
  {
    std::lock_guard<std::mutex> lock(info_mu);
    phase = auto_phase;
  }
  if (phase != 3) LF_RETURN_IF_ERROR(turn.Take(/*whole=*/true));
  {
    std::lock_guard<std::mutex> lock(info_mu);
    phase = auto_phase;
    hw_ratio = info.hw_ratio;
  }
  std::vector<size_t> hw_idx, cuda_idx, cpu_idx;
  // Headers on the CPU: choose each image's path.
  for (size_t i = 0; i < n; ++i) {
    const std::string_view j = jpegs[i];
    Path p = Path::kCpu;
    if (j.size() >= 4 && static_cast<uint8_t>(j[0]) == 0xFF && static_cast<uint8_t>(j[1]) == 0xD8 &&
        HasEoi(j) &&
        nvjpegJpegStreamParseHeader(parse_handle, reinterpret_cast<const unsigned char*>(j.data()),
                                    j.size(), L.parser) == NVJPEG_STATUS_SUCCESS) {
      nvjpegJpegEncoding_t enc = NVJPEG_ENCODING_UNKNOWN;
      unsigned comps = 0, w = 0, h = 0;
      if (nvjpegJpegStreamGetJpegEncoding(L.parser, &enc) == NVJPEG_STATUS_SUCCESS &&
          (enc == NVJPEG_ENCODING_BASELINE_DCT ||
           enc == NVJPEG_ENCODING_EXTENDED_SEQUENTIAL_DCT_HUFFMAN) &&
          nvjpegJpegStreamGetComponentsNum(L.parser, &comps) == NVJPEG_STATUS_SUCCESS &&
          (comps == 1 || comps == 3) &&
          nvjpegJpegStreamGetFrameDimensions(L.parser, &w, &h) == NVJPEG_STATUS_SUCCESS && w > 0 &&
          h > 0 && w <= static_cast<unsigned>(kMaxSide) && h <= static_cast<unsigned>(kMaxSide) &&
          static_cast<int64_t>(w) * h <= opts.max_frame_pixels) {
        L.width[i] = w;
        L.height[i] = h;
        p = Path::kCuda;
        int unsupported = -1;
        if (hw &&
            nvjpegDecodeBatchedSupported(hw, L.parser, &unsupported) == NVJPEG_STATUS_SUCCESS &&
            unsupported == 0)
          p = Path::kHardware;
      }
    }
    L.path[i] = p;
    (p == Path::kHardware ? hw_idx : p == Path::kCuda ? cuda_idx : cpu_idx).push_back(i);
  }
  // Split the hardware-eligible images (Note [GPU decode paths]).
  const bool measure_hw = phase == 1 && !hw_idx.empty();
  const bool measure_cuda = phase == 2 && !hw_idx.empty();
  size_t keep_hw = hw_idx.size();
  if (measure_cuda)
    keep_hw = 0;
  else if (!measure_hw && phase != 0)
    keep_hw = static_cast<size_t>(std::lround(hw_ratio * hw_idx.size()));
  cuda_idx.insert(cuda_idx.end(), hw_idx.begin() + keep_hw, hw_idx.end());
  hw_idx.resize(keep_hw);

  LF_RETURN_IF_ERROR(RunCpu(L, cpu_idx));
  const Clock::time_point t_prepared = Clock::now();
  if (!turn.taken() && (!hw_idx.empty() || !cuda_idx.empty()))
    LF_RETURN_IF_ERROR(turn.Take(/*whole=*/false));
  bool hw_failed = false, cuda_failed = false;
  // CUDA backend first, on its own stream: its host part runs before the engine's, and its
  // kernels overlap the engine's decode (which may hold this thread until it is done).
  auto t0 = std::chrono::steady_clock::now();
  LF_RETURN_IF_ERROR(
      RunBatched(L, sw, L.sw_state, &L.sw_batch, cuda_idx, L.cuda_stream, &cuda_failed));
  if (measure_cuda) LF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(L.cuda_stream));
  auto t1 = std::chrono::steady_clock::now();
  LF_RETURN_IF_ERROR(RunBatched(L, L.hw, L.hw_state, &L.hw_batch, hw_idx, L.stream, &hw_failed));
  if (measure_hw) LF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(L.stream));
  auto t2 = std::chrono::steady_clock::now();
  if (turn.taken()) turn.End(hw_failed || cuda_failed ? -1.0 : ms(t0, t2));
  // Join the CUDA-backend stream into the main one (the ready event covers both).
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(L.cuda_done, L.cuda_stream));
  LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(L.stream, L.cuda_done, 0));
  if (hw_failed) LF_RETURN_IF_ERROR(RunCpu(L, hw_idx));
  if (cuda_failed) LF_RETURN_IF_ERROR(RunCpu(L, cuda_idx));

  {
    std::lock_guard<std::mutex> lock(info_mu);
    NvJpegDecoderInfo& in = info;
    in.batch_retries += hw_failed + cuda_failed;
    ++in.batches;
    in.release_wait_ms += ms(t_start, t_released);
    in.prepare_ms += ms(t_released, t_prepared);
    in.turn_wait_ms += ms(t_prepared, t0);
    in.call_ms += ms(t0, t2);
    (hw_failed ? in.images_cpu : in.images_hw) += static_cast<int64_t>(hw_idx.size());
    (cuda_failed ? in.images_cpu : in.images_cuda) += static_cast<int64_t>(cuda_idx.size());
    in.images_cpu += static_cast<int64_t>(cpu_idx.size());
    // Auto split: warm-up, then one measured batch per path.
    if (phase == 0 && auto_phase == 0 && !hw_idx.empty()) {
      auto_phase = 1;
    } else if (measure_hw && auto_phase == 1 && !hw_failed) {
      in.hw_ms_per_image = ms(t1, t2) / hw_idx.size();
      auto_phase = 2;
    } else if (measure_cuda && auto_phase == 2 && !cuda_failed && !cuda_idx.empty()) {
      in.cuda_ms_per_image = ms(t0, t1) / cuda_idx.size();
      const double r_hw = 1.0 / std::max(in.hw_ms_per_image, 1e-6);
      const double r_cuda = 1.0 / std::max(in.cuda_ms_per_image, 1e-6);
      in.hw_ratio = static_cast<float>(r_hw / (r_hw + r_cuda));
      in.ratio_measured = true;
      auto_phase = 3;
      LF_LOG(INFO) << "nvJPEG decoder: hardware " << in.hw_ms_per_image << " ms/image, cuda "
                   << in.cuda_ms_per_image << " ms/image: hw_ratio " << in.hw_ratio;
    }
  }
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(L.ready, L.stream));
  return Status::Ok();
}

StatusOr<std::unique_ptr<NvJpegBatchDecoder>> NvJpegBatchDecoder::Create(
    const NvJpegDecoderOptions& opts) {
  LF_RETURN_IF_ERROR(CheckLanesAndStagger(opts.lanes, opts.stagger, "nvJPEG decoder: "));
  std::unique_ptr<NvJpegBatchDecoder> d(new NvJpegBatchDecoder());
  d->impl_ = std::make_unique<Impl>();
  Impl& im = *d->impl_;
  im.opts = opts;
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(opts.device));
  NvJpegDecoderInfo& info = im.info;
  if (opts.allow_hardware) {
    nvjpegStatus_t rc =
        nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &im.hw);
    if (rc == NVJPEG_STATUS_SUCCESS) {
      // A state can be created (the engine is usable), else the CUDA backend alone.
      nvjpegJpegState_t probe = nullptr;
      rc = nvjpegJpegStateCreate(im.hw, &probe);
      if (probe) nvjpegJpegStateDestroy(probe);
      if (rc != NVJPEG_STATUS_SUCCESS) {
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
  if (opts.reuse_state) {
    // Padded allocations: buffers that grow by a few KB between batches are not re-allocated.
    for (nvjpegHandle_t h : {im.hw, im.sw}) {
      if (!h) continue;
      if (opts.device_padding) nvjpegSetDeviceMemoryPadding(opts.device_padding, h);
      if (opts.pinned_padding) nvjpegSetPinnedMemoryPadding(opts.pinned_padding, h);
    }
  }
  im.parse_handle = im.hw ? im.hw : im.sw;
  for (int l = 0; l < opts.lanes; ++l) LF_RETURN_IF_ERROR(im.CreateLane(l));
  info.hw_available = im.hw != nullptr;
  info.backend = im.hw ? "hardware+" + sw_name : sw_name;
  info.lanes = opts.lanes;
  info.async = opts.async;
  info.stagger = opts.stagger;
  im.turns = std::make_unique<DecodeTurns>(opts.stagger, opts.timeout_ms);
  if (!im.hw) {
    info.hw_ratio = 0.f;
  } else if (opts.hw_ratio >= 0.f) {
    info.hw_ratio = std::min(1.f, opts.hw_ratio);
  } else {
    info.hw_ratio = 1.f;
    im.auto_phase = 0;
  }
  if (opts.async) {
    for (auto& L : im.lanes) {
      NvJpegLane* lane = L.get();
      L->thread = std::thread([&im, lane] { im.LaneLoop(lane); });
      pthread_setname_np(L->thread.native_handle(), "lf-nvjpeg");
    }
  }
  return d;
}

NvJpegBatchDecoder::~NvJpegBatchDecoder() = default;

Status NvJpegBatchDecoder::Submit(std::vector<std::string_view> jpegs,
                                  std::function<std::string(size_t)> name_of) {
  Impl& im = *impl_;
  NvJpegLane& L = *im.lanes[im.submitted % im.lanes.size()];
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (L.state != NvJpegLane::State::kFree)
      return FailedPreconditionError("nvJPEG decoder: more than " +
                                     std::to_string(im.lanes.size()) +
                                     " batches submitted and not collected");
    if (im.stop) return CancelledError("nvJPEG decoder: shutting down");
    L.jpegs = std::move(jpegs);
    L.name_of = std::move(name_of);
    L.job_status = Status::Ok();
    L.seq = im.submitted++;
    im.fifo.push_back(L.id);
    if (im.opts.async) {
      L.state = NvJpegLane::State::kQueued;
      im.work_cv.notify_all();
      return Status::Ok();
    }
  }
  // Synchronous: decode here.
  L.job_status = im.RunJob(L);
  L.state = NvJpegLane::State::kDone;
  return Status::Ok();
}

Status NvJpegBatchDecoder::Collect(Result* out) {
  Impl& im = *impl_;
  std::unique_lock<std::mutex> lock(im.mu);
  if (im.fifo.empty()) return FailedPreconditionError("nvJPEG decoder: nothing submitted");
  NvJpegLane& L = *im.lanes[im.fifo.front()];
  if (!im.done_cv.wait_for(lock, std::chrono::milliseconds(im.opts.timeout_ms),
                           [&] { return L.state == NvJpegLane::State::kDone; }))
    return DeadlineExceededError("nvJPEG decoder: a batch of " + std::to_string(L.jpegs.size()) +
                                 " images was not decoded within " +
                                 std::to_string(im.opts.timeout_ms) + " ms");
  im.fifo.pop_front();
  L.state = NvJpegLane::State::kFree;
  im.collected = L.id;
  L.jpegs.clear();
  L.name_of = nullptr;
  Status s = std::move(L.job_status);
  *out = std::move(L.result);
  L.result = Result();
  return s;
}

int NvJpegBatchDecoder::in_flight() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int>(impl_->fifo.size());
}

Status NvJpegBatchDecoder::Drain() {
  Impl& im = *impl_;
  {
    std::unique_lock<std::mutex> lock(im.mu);
    im.WaitIdle(lock, "drain");
    for (int l : im.fifo) {
      NvJpegLane& L = *im.lanes[l];
      L.state = NvJpegLane::State::kFree;
      L.jpegs.clear();
      L.name_of = nullptr;
      L.result = Result();
    }
    im.fifo.clear();
  }
  Status first;
  for (auto& L : im.lanes) {
    Status s;
    if (cudaEventRecord(L->cuda_done, L->cuda_stream) != cudaSuccess ||
        cudaStreamWaitEvent(L->stream, L->cuda_done, 0) != cudaSuccess ||
        cudaEventRecord(L->ready, L->stream) != cudaSuccess)
      s = InternalError(std::string("nvJPEG decoder: drain: ") +
                        cudaGetErrorString(cudaGetLastError()));
    else
      s = WaitEvent(L->ready, im.opts.timeout_ms, "nvJPEG decoder: drain");
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Status NvJpegBatchDecoder::Decode(const std::vector<std::string_view>& jpegs,
                                  const std::function<std::string(size_t)>& name_of,
                                  std::vector<DecodedImage>* out, std::vector<Status>* status) {
  LF_RETURN_IF_ERROR(Submit(jpegs, name_of));
  Result r;
  Status s = Collect(&r);
  *out = std::move(r.images);
  *status = std::move(r.status);
  return s;
}

Status NvJpegBatchDecoder::ReleaseAfter(cudaStream_t consumer) {
  Impl& im = *impl_;
  if (im.collected < 0) return FailedPreconditionError("nvJPEG decoder: nothing collected");
  NvJpegLane& L = *im.lanes[im.collected];
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(L.released, consumer));
  L.released_recorded = true;
  return Status::Ok();
}

cudaEvent_t NvJpegBatchDecoder::ready_event() const {
  const Impl& im = *impl_;
  return im.lanes[std::max(im.collected, 0)]->ready;
}
cudaStream_t NvJpegBatchDecoder::stream() const {
  const Impl& im = *impl_;
  return im.lanes[std::max(im.collected, 0)]->stream;
}
NvJpegDecoderInfo NvJpegBatchDecoder::info() const {
  std::lock_guard<std::mutex> lock(impl_->info_mu);
  return impl_->info;
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
