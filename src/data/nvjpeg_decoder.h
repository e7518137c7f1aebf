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
// Both nvJPEG paths are batched (nvjpegDecodeBatched) and run on the decoder's own stream.
// The hardware/cuda split follows DALI's hw_decoder_load: `hw_ratio` of the hardware-eligible
// images go to the engine and the rest to the CUDA backend, so both finish together. Auto mode
// (hw_ratio < 0) measures per-image latency of each path on the first batches (one warm-up batch,
// one all-hardware, one all-cuda) and sets hw_ratio = r_hw / (r_hw + r_cuda) from the rates.
//
// Output buffers are per image slot, double-buffered (two sets), grown to the largest image seen
// and reused: device memory is flat after the first batches. Decode() waits (host side, with a
// timeout) until the consumer released the set it is about to overwrite (ReleaseAfter()).
#pragma once

#if defined(LOONGFORGE_WITH_CUDA) && defined(LOONGFORGE_WITH_NVJPEG)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "image_kernels.h"
#include "loongforge/status.h"
#include "loongforge/thread_pool.h"

namespace loongforge {
namespace internal {

struct NvJpegDecoderOptions {
  int device = 0;
  // Share of hardware-eligible images decoded by the JPEG engine; < 0: measured (auto).
  float hw_ratio = -1.f;
  bool allow_hardware = true;
  ThreadPool* cpu_pool = nullptr;  // CPU fallbacks run here in parallel; nullptr: inline
  int64_t timeout_ms = 60000;
};

struct NvJpegDecoderInfo {
  bool hw_available = false;  // a NVJPEG_BACKEND_HARDWARE handle was created
  std::string backend;        // "hardware+gpu_hybrid", "gpu_hybrid", "default", ...
  std::string reason;         // why the hardware engine is or is not used
  float hw_ratio = 0.f;       // current split
  bool ratio_measured = false;
  double hw_ms_per_image = 0, cuda_ms_per_image = 0;  // from the auto measurement
  int64_t images_hw = 0, images_cuda = 0, images_cpu = 0, batch_retries = 0;
};

// One decoded image in device memory, as GpuImageTask wants it (planar from nvJPEG, interleaved
// from the CPU fallback). Valid until the next-but-one Decode().
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

  // Decodes `jpegs` (host memory that must stay valid until ready_event() completes) into the
  // next buffer set. (*status)[i] is DataLoss naming `name_of(i)` for a corrupt image, whose
  // (*out)[i] is then empty. Returns a non-OK Status only for device/library failures that are
  // not the data's fault. GPU work is queued on stream(); ready_event() marks its end.
  // Not thread-safe: one caller thread.
  Status Decode(const std::vector<std::string_view>& jpegs,
                const std::function<std::string(size_t)>& name_of, std::vector<DecodedImage>* out,
                std::vector<Status>* status);
  // The consumer has queued its last read of the last Decode()'s images on `consumer`; that set
  // is overwritten only after this point of `consumer` is reached.
  Status ReleaseAfter(cudaStream_t consumer);
  cudaEvent_t ready_event() const;
  cudaStream_t stream() const;
  NvJpegDecoderInfo info() const;

 private:
  NvJpegBatchDecoder() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace internal
}  // namespace loongforge

#endif  // LOONGFORGE_WITH_CUDA && LOONGFORGE_WITH_NVJPEG
