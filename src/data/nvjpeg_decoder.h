// nvJPEG batched JPEG decode of the GPU loader (only in builds with nvJPEG: the .cc is compiled
// only when nvjpeg.h and libnvjpeg are found, and everything here is LOONGFORGE_WITH_NVJPEG).
//
// Note [GPU decode paths]
// -----------------------
// Headers are parsed on the CPU (nvjpegJpegStreamParseHeader). Each image then takes one path:
//   hardware  baseline JPEGs the GPU's JPEG engine supports (nvjpegDecodeBatchedSupported), on a
//             handle created with NVJPEG_BACKEND_HARDWARE (A100/H100/H200 have the engine);
//   cuda      other baseline/extended-sequential JPEGs, and a share of the hardware-eligible ones
//             (below), on a NVJPEG_BACKEND_GPU_HYBRID handle (DEFAULT if that fails);
//   cpu       progressive/lossless JPEGs, anything nvJPEG cannot parse, streams without an EOI
//             marker (truncated), and whole sub-batches nvJPEG rejected: decoded per image by
//             libjpeg-turbo (the CPU loader's JpegDecoder, same errors) and uploaded.
// Both nvJPEG paths are batched (nvjpegDecodeBatched) and run on their lane's own streams
// (Note [Decode lanes]).
// The hardware/cuda split follows DALI's hw_decoder_load: `hw_ratio` of the hardware-eligible
// images go to the engine and the rest to the CUDA backend, so both finish together. Auto mode
// (hw_ratio < 0) measures per-image latency of each path on the first batches (one warm-up batch,
// one all-hardware, one all-cuda) and sets hw_ratio = r_hw / (r_hw + r_cuda) from the rates.
//
// Output buffers are per image slot, one set per lane (below), grown to the largest image seen
// and reused: device memory is flat after the first batches. A lane waits (host side, with a
// timeout) until the consumer released the set it is about to overwrite (ReleaseAfter()).
//
// Note [Decode lanes]
// -------------------
// The hardware backend's nvjpegDecodeBatched() holds the calling thread for about the whole
// decode of its batch (measured on the H200: 9-12 ms of host time per 256-image batch, the batch
// interval itself), so with one caller the JPEG engines idle while the host parses and stages
// the next batch, and at every batch's tail. A lane is one nvJPEG state pair (hardware + CUDA
// backend), one header parser, one output buffer set and one CUDA stream pair. Batch k runs on
// lane k % lanes. Synchronous mode (async = false, lanes = 2): Submit() decodes in the caller's
// thread, as Decode() always did. Asynchronous mode (async = true): every lane has a thread
// ("lf-nvjpeg"), Submit() hands the batch over and returns at once, and up to `lanes` batches
// are in nvJPEG at the same time, so batch k+1 is parsed and submitted while batch k is still in
// the engines and while its consumer's kernels run. Collect() returns batches in submission
// order. At most `lanes` batches may be submitted and not collected (FailedPrecondition
// otherwise); a lane's next batch waits for its previous consumer (ReleaseAfter()).
// Per-state reuse (reuse_state): nvjpegDecodeBatchedInitialize() runs only when a state's batch
// size changes or after a rejected batch (nvJPEG's documented contract), the hardware states are
// pre-allocated for the largest frame seen (nvjpegDecodeBatchedPreAllocate()), and the handles
// pad their allocations (DALI's 16 MiB device / 8 MiB pinned), so nvJPEG does not re-initialize
// or re-allocate (cudaFree synchronizes the device) per batch.
//
// Note [Decode turns]
// -------------------
// Two lanes whose nvJPEG calls start together share the JPEG engines and finish together: the
// consumer then gets batches in pairs (measured on the H200 at 3c094f1: p99/p50 of the batch
// interval 2.0-2.6), and each caller spins a core inside nvJPEG (2.0-2.1 cores). So the lanes
// take turns for their nvJPEG calls, in submission order (`stagger`):
//   1    (default) a batch's calls start when the previous batch's calls returned. One thread
//        is in nvJPEG at a time; what overlaps is everything else of the next batch (waiting for
//        its buffers, header parsing, CPU fallbacks, the consumer's kernels).
//   0..1 they start once the previous batch's calls have run for this fraction of their usual
//        duration (an EWMA): lanes overlap in the engines, with starts spread over the interval.
//   0    they start as soon as the lane is ready (the order of starts is still kept).
// The auto split's warm-up and measured batches hold the turn for their whole job, so they run
// alone. A job that fails before its turn passes it on, so no later batch waits for it.
// Measured on the H200 (docs/BENCHMARKS.md; loader, batch 256 of 640x480): stagger 1
// 26.0-34.3k img/s, p99/p50 1.07-1.36, 1.38-1.44 cores; stagger 0 28.3-29.3k, 2.4-2.6, 2.0-2.1
// cores. The CUDA scheduling flags do not change the cores: nvJPEG's hardware decode polls.
#pragma once

#if defined(LOONGFORGE_WITH_CUDA) && defined(LOONGFORGE_WITH_NVJPEG)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/thread_pool.h"
#include "image_kernels.h"
#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

struct NvJpegDecoderOptions {
  int device = 0;
  // Share of hardware-eligible images decoded by the JPEG engine; < 0: measured (auto).
  float hw_ratio = -1.f;
  bool allow_hardware = true;
  ThreadPool* cpu_pool = nullptr;  // CPU fallbacks run here in parallel; nullptr: inline
  int64_t timeout_ms = 60000;
  // An image whose header claims more pixels than this goes to the CPU path, which refuses it
  // with DataLoss (CheckFramePixels in image_ops.h) before allocating: no device buffer is sized
  // from an unchecked header.
  int64_t max_frame_pixels = int64_t{64} << 20;
  // Note [Decode lanes]: lane threads and `lanes` batches in flight (off: decode in the caller's
  // thread on two alternating lanes, the behaviour before lanes existed).
  bool async = false;
  int lanes = 2;  // >= 2
  // Each lane gets its own NVJPEG_BACKEND_HARDWARE handle (else one handle shared by the lanes,
  // which nvJPEG allows: only states, streams and buffers must be per thread). For A/B runs, in
  // case the library serializes hardware decodes per handle.
  bool hw_handle_per_lane = false;
  // nvJPEG writes interleaved RGB (NVJPEG_OUTPUT_RGBI, one plane; the fused kernel reads it with
  // pixel_stride 3, as the CPU fallback's images) instead of planar RGB. For A/B runs.
  bool interleaved = false;
  // Initialize/pre-allocate a state only when needed (off: nvjpegDecodeBatchedInitialize before
  // every batch and no padding or pre-allocation, the behaviour before this option).
  bool reuse_state = true;
  size_t device_padding = size_t{16} << 20;  // nvjpegSetDeviceMemoryPadding (reuse_state only)
  size_t pinned_padding = size_t{8} << 20;   // nvjpegSetPinnedMemoryPadding (reuse_state only)
  // Note [Decode turns]: when a batch's nvJPEG calls may start, in [0, 1].
  float stagger = 1.f;
};

struct NvJpegDecoderInfo {
  bool hw_available = false;  // a NVJPEG_BACKEND_HARDWARE handle was created
  std::string backend;        // "hardware+gpu_hybrid", "gpu_hybrid", "default", ...
  std::string reason;         // why the hardware engine is or is not used
  float hw_ratio = 0.f;       // current split
  bool ratio_measured = false;
  double hw_ms_per_image = 0, cuda_ms_per_image = 0;  // from the auto measurement
  int64_t images_hw = 0, images_cuda = 0, images_cpu = 0, batch_retries = 0;
  int lanes = 0;
  bool async = false;
  int64_t state_inits = 0;  // nvjpegDecodeBatchedInitialize calls (reuse_state: a few in all)
  float stagger = 1.f;
  // Host time of the decoded batches, summed (ms; divide by `batches`): waiting for the
  // consumer to release the lane's buffers, header parsing and CPU fallbacks, waiting for the
  // turn (Note [Decode turns]), and inside the nvJPEG calls.
  int64_t batches = 0;
  double release_wait_ms = 0, prepare_ms = 0, turn_wait_ms = 0, call_ms = 0;
};

// One decoded image in device memory, as GpuImageTask wants it (planar from nvJPEG, interleaved
// from the CPU fallback). Valid until its lane decodes again (Note [Decode lanes]).
struct DecodedImage {
  const uint8_t* plane[3] = {nullptr, nullptr, nullptr};
  int64_t pitch = 0;
  int32_t pixel_stride = 1;
  int32_t width = 0, height = 0;
};

class NvJpegBatchDecoder {
 public:
  // Unavailable (with the nvJPEG status) if no nvJPEG handle can be created on `device`.
  static StatusOr<std::unique_ptr<NvJpegBatchDecoder>> Create(const NvJpegDecoderOptions& opts);
  ~NvJpegBatchDecoder();
  NvJpegBatchDecoder(const NvJpegBatchDecoder&) = delete;
  NvJpegBatchDecoder& operator=(const NvJpegBatchDecoder&) = delete;

  // One decoded batch, in submission order (Collect()).
  struct Result {
    std::vector<DecodedImage> images;  // valid until this lane's next batch (ReleaseAfter())
    std::vector<Status> status;        // DataLoss naming name_of(i) for a corrupt image
    cudaEvent_t ready = nullptr;       // the batch's GPU work ends here
    cudaStream_t stream = nullptr;     // the lane's stream (ready is recorded on it)
    int lane = -1;
  };
  // Queues `jpegs` for decode on the next lane (Note [Decode lanes]). The bytes (host memory) and
  // whatever `name_of` reads must stay valid until the batch's ready event completed (or Drain()
  // returned). (*status)[i] of the Result is DataLoss naming `name_of(i)` for a
  // corrupt image, whose image is then empty. A non-OK Status (here or from Collect()) is a
  // device/library failure that is not the data's fault. Submit/Collect/ReleaseAfter/Drain: one
  // caller thread.
  Status Submit(std::vector<std::string_view> jpegs, std::function<std::string(size_t)> name_of);
  // Waits (with the timeout) for the oldest submitted batch and hands it out.
  Status Collect(Result* out);
  // Batches submitted and not yet collected.
  int in_flight() const;
  // Waits for every submitted batch, drops the ones not collected (their lanes become free) and
  // waits for the lanes' streams: after it no nvJPEG call runs and no GPU work is queued.
  Status Drain();
  // Submit + Collect of one batch (synchronous callers: tests, the binding's decode()).
  Status Decode(const std::vector<std::string_view>& jpegs,
                const std::function<std::string(size_t)>& name_of, std::vector<DecodedImage>* out,
                std::vector<Status>* status);
  // The consumer has queued its last read of the last collected batch's images on `consumer`;
  // that lane's buffer set is overwritten only after this point of `consumer` is reached.
  Status ReleaseAfter(cudaStream_t consumer);
  cudaEvent_t ready_event() const;  // of the last collected batch
  cudaStream_t stream() const;      // of the last collected batch's lane
  NvJpegDecoderInfo info() const;

 private:
  NvJpegBatchDecoder() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace internal
}  // namespace data
}  // namespace loongforge

#endif  // LOONGFORGE_WITH_CUDA && LOONGFORGE_WITH_NVJPEG
