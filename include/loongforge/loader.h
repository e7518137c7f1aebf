// DataFusion loader: LMDB records -> JPEG decode -> fused crop/resize/jitter/normalize into the
// batch buffer -> padded, masked, model-ready batches. Decode runs on the CPU (libjpeg-turbo with
// DCT-domain scaling) or, with device = kCuda, on the GPU (nvJPEG + CUDA kernels).
//
// Threads (all owned by the loader, joined on Stop()/destruction; Note [Loader pipeline] in
// src/data/loader.cc):
//   "lf-fetch"    stage 1: samples the next batch, looks its records up zero-copy, queues decode
//                 tasks
//   "lf-decode*"  stage 2: `threads` workers decoding one image per task into the batch buffer
//                 (GPU loader: only the images nvJPEG cannot decode)
//   "lf-collate"  stage 3: waits for a batch's images (in batch order), pads tokens, builds masks,
//                 copies and normalizes state/action, and publishes the batch (GPU loader: drives
//                 the nvJPEG decode and the kernels, Note [GPU loader])
// Batches are delivered in sampler order whatever the thread count. At most `prefetch` batches are
// in flight; their buffers come from a recycled pool, so memory is flat across epochs.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/dataset.h"
#include "loongforge/metrics.h"
#include "loongforge/status.h"
#include "loongforge/tensor.h"

namespace loongforge {
namespace data {

// Maps (seed, epoch, rank, world) to this rank's batches. Every rank gets the same number of
// batches; the order depends only on these numbers (not on thread count or timing).
struct SamplerOptions {
  int64_t num_samples = 0;
  int batch_size = 32;
  uint64_t seed = 0;
  int rank = 0, world_size = 1;
  bool shuffle = true;
  // true: drop the tail that does not fill a batch on every rank. false: pad by wrapping around.
  bool drop_last = true;
};

class Sampler {
 public:
  static StatusOr<Sampler> Create(const SamplerOptions& opts);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Sample indices of batch `b` (0 <= b < batches_per_epoch) of `epoch`, in order.
  std::vector<int64_t> Batch(int64_t epoch, int64_t b) const;
  // This rank's full order for `epoch` (batches_per_epoch * batch_size indices).
  std::vector<int64_t> EpochOrder(int64_t epoch) const;
  const SamplerOptions& options() const { return opts_; }

 private:
  SamplerOptions opts_;
  int64_t per_rank_ = 0, batches_per_epoch_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

enum class CorruptPolicy { kSkip, kError };

// Where stage 2/3 run and batches live. kCuda: nvJPEG batched decode (hardware JPEG engine where
// the GPU has one) + one fused CUDA kernel per batch, batches in device memory (Note [GPU loader]
// in src/data/loader_gpu_stage.cc). Needs a build with CUDA and nvJPEG: see
// DataLoader::GpuSupport().
enum class LoaderDevice { kCpu, kCuda };
enum class ImageLayout { kNCHW, kNHWC };
// How the crop meets an output of another aspect ratio (LoaderOptions::resize): kStretch resizes
// crop_fraction of each side to (H, W) as it is; kCrop takes crop_fraction of the largest
// rectangle of the output's aspect inside the frame (GR00T's and torchvision's crop, then resize);
// kPad resizes crop_fraction of each side into the largest rectangle of its own aspect inside
// (H, W), centred, the rest black (pixel 0) as a letterbox (openpi's resize_with_pad; CPU loader).
enum class ResizeMode { kStretch, kCrop, kPad };  // images [n, cams, 3, H, W] or [n, cams, H, W, 3]
// GPU loader: how lf-fetch faults the LMDB pages of a batch's JPEG bytes in before nvJPEG reads
// them (Note [GPU loader] in src/data/loader_gpu_stage.cc). kPopulate: one
// madvise(MADV_POPULATE_READ) per record (Linux >= 5.14; falls back to kTouch where the kernel
// refuses it); kTouch: one read per page; kOff: nvJPEG takes the faults.
enum class PrefaultMode { kOff, kTouch, kPopulate };
// How state and action are normalized by the schema's statistics, per dimension (Note [State
// normalization] in src/data/loader.cc): kMeanStd (x - mean) / std; kMinMax 2 (x - min) /
// (max - min) - 1; kQ01Q99 as kMinMax on [q01, q99], clipped to [-1, 1] (GR00T's "q99" mode);
// kNone: raw values.
enum class StateNormalization { kNone, kMeanStd, kMinMax, kQ01Q99 };

// Upper bound of LoaderOptions::threads: decode workers past the cores only add contention, and
// thousands of threads exhaust the process's limits.
constexpr int kMaxLoaderThreads = 256;

struct LoaderOptions {
  std::string db_path;
  int batch_size = 32;
  // Output (height, width), each in 1..4096 (Python: image_size=N for N x N, or (H, W)).
  std::array<int, 2> image_size = {224, 224};
  float crop_fraction = 0.95f;               // side fraction kept by the (random or centre) crop
  ResizeMode resize = ResizeMode::kStretch;  // output of another aspect ratio than the frame
  bool train = true;                         // random crop offsets (train) or centre crop (eval)
  bool color_jitter = false;  // GR00T: brightness 0.3, contrast 0.4, saturation 0.5, hue 0.08
  std::array<float, 3> mean = {0.5f, 0.5f, 0.5f};
  std::array<float, 3> std = {0.5f, 0.5f, 0.5f};
  bool dct_scaling = true;      // let libjpeg-turbo downscale in the DCT domain when it can
  bool normalize_state = true;  // false: raw state/action whatever `normalize` says
  // Create refuses with InvalidArgument, naming the DB and the statistic, a mode whose
  // statistics the schema lacks (q01/q99: packs made by `pack --from-lerobot`).
  StateNormalization normalize = StateNormalization::kMeanStd;
  uint64_t seed = 0;
  int rank = 0, world_size = 1;
  bool shuffle = true, drop_last = true;
  int threads = 2;    // decode workers, 1..kMaxLoaderThreads
  int prefetch = 4;   // batches in flight (pipeline depth)
  int token_pad = 0;  // 0: pad to the batch max; >0: fixed length (longer is an error)
  // Static batches (Note [Static batches] in src/data/loader.cc). Non-empty token_buckets turns
  // static_shapes on: every batch has batch_size rows (samples skipped as corrupt leave zero
  // rows with masks off and sample_index -1) and its tokens are padded to the smallest bucket
  // >= the batch's longest instruction. static_shapes alone: one bucket, token_pad or the
  // dataset's max_tokens. Instructions longer than the largest bucket are an error naming the
  // record (InvalidArgument at Create when the schema already says so), or are cut to it with
  // truncate_tokens (which also lets token_pad be shorter than the dataset's longest).
  std::vector<int> token_buckets;  // sorted and deduplicated by Create; exclusive with token_pad
  bool static_shapes = false;
  bool truncate_tokens = false;
  CorruptPolicy on_corrupt = CorruptPolicy::kSkip;
  // Under kSkip: this many corrupt samples in a row (in sampler order, across batches) stop the
  // loader with DataLoss naming the last one, so a DB that is unreadable throughout ends the run
  // instead of being skipped forever. 0: no limit.
  int max_consecutive_corrupt = 64;
  // A record whose JPEG header claims more than this many pixels (width x height) is corrupt:
  // DataLoss naming the DB, record, size and bound, checked before any pixel buffer is allocated
  // (skipped under on_corrupt = kSkip). >= 1; the default is 64 Mi pixels (8192 x 8192).
  int64_t max_frame_pixels = int64_t{64} << 20;
  bool pin_memory = false;     // page-locked batch buffers (needs CUDA at run time)
  int64_t timeout_ms = 60000;  // every wait inside the pipeline; must be > 0
  // GPU loader (device = kCuda). layout/dtype/antialias other than the defaults need kCuda.
  LoaderDevice device = LoaderDevice::kCpu;
  int device_id = 0;
  ImageLayout layout = ImageLayout::kNCHW;
  // Element type of Batch::images: DType::kFloat32 or DType::kBFloat16 (kCuda only), normalized
  // by mean/std; or DType::kUInt8 (kCpu only): the decoded, cropped, resized (and jittered)
  // pixels 0..255, rounded, without normalization. Create refuses any other with InvalidArgument
  // naming the option.
  DType dtype = DType::kFloat32;
  bool antialias = false;  // triangle filter widened by the downscale factor
  bool hw_decode = true;   // use the JPEG engine when the GPU has one
  // Share of engine-eligible images decoded by the hardware engine; < 0: measured split. Default
  // all-engine: on an H200 the engine alone gave 23.2k model-ready img/s against 12.3k for the
  // measured split (docs/BENCHMARKS.md), since the CUDA backend competes with the transform.
  float hw_decode_ratio = 1.f;
  // GPU loader tuning, for A/B runs (docs/data.md, "Tuning the GPU loader"); the defaults are the
  // measured best. Create refuses values out of range with InvalidArgument naming the field.
  bool async_decode = true;  // decoder lanes keep decode_lanes batches in nvJPEG (Note [Decode
                             // lanes] in src/data/nvjpeg_decoder.h); off: one batch at a time,
                             // decoded on lf-collate
  int decode_lanes = 2;      // in [2, 16]; used with async_decode
  // In [0, 1]: when a lane's nvJPEG calls may start (Note [Decode turns] in nvjpeg_decoder.h;
  // 1: after the previous batch's calls returned, 0: as soon as the lane is ready).
  float decode_stagger = 1.f;
  bool decode_reuse = true;  // nvJPEG states initialized once per batch size, pre-allocated
  bool decode_hw_handle_per_lane = false;  // one hardware nvJPEG handle per lane (else shared)
  bool decode_interleaved = false;         // nvJPEG writes interleaved RGB (RGBI)
  bool stage3_on_device = true;            // stage 3 by the CUDA kernel (off: host twin + one copy)
  bool reserve_slots = true;  // GPU batch buffers allocated at Create, not by the first batches
  PrefaultMode prefault = PrefaultMode::kTouch;
};

// Token buckets (Note [Static batches] in src/data/loader.cc), the one definition the loader and
// the trainer's step runner share. SortTokenBuckets: sorted and deduplicated, InvalidArgument
// naming the first length that is not positive. TokenBucketFor: index of the smallest bucket
// >= `length` in sorted `buckets`, or -1 when the length exceeds every bucket.
// Note [Held by]: the stage the oldest unconsumed batch is in, from the pipeline's counts of
// batches that got a buffer (`started`), left stage 1 (`read`) and were published, against the
// number the consumer took (`consumed`). One of "ready", "decode", "read", "buffers".
const char* HeldBy(int64_t started, int64_t read, int64_t published, int64_t consumed);

StatusOr<std::vector<int>> SortTokenBuckets(std::vector<int> buckets);
int TokenBucketFor(const std::vector<int>& buckets, int length);

// Checks `dtype` as LoaderOptions::dtype: DType::kFloat32, DType::kBFloat16 or DType::kUInt8,
// else InvalidArgument naming the option (which device writes which: LoaderOptions::dtype). Create
// checks it; a binding checks a caller's value with it.
Status CheckImageDType(DType dtype);

// One model-ready batch. Buffers are owned by the loader's pool; a batch returns to the pool when
// the last shared_ptr to it is dropped (the Python side holds it through DLPack deleters).
struct Batch {
  int64_t epoch = 0, index = 0;  // index within the epoch
  int size = 0;                  // valid samples (< batch_size only when corrupt ones were skipped)
  int rows = 0;  // rows of every array: == size, or batch_size with static shapes (rows >= size
                 // are padding: zero, masks off, sample_index -1)
  int token_bucket = -1;  // static shapes: index into token_buckets (tokens_len == that bucket)
  int cameras = 0, height = 0, width = 0;
  int tokens_len = 0, state_dim = 0, action_dim = 0, horizon = 0;
  float* images = nullptr;            // [rows, cameras, 3, height, width] of image_dtype
  int64_t* tokens = nullptr;          // [rows, tokens_len], 0-padded
  uint8_t* attention_mask = nullptr;  // [rows, tokens_len]
  float* state = nullptr;             // [rows, state_dim]
  float* action = nullptr;            // [rows, horizon, action_dim]
  uint8_t* action_mask = nullptr;     // [rows, horizon]
  int64_t* sample_index = nullptr;    // [rows]
  bool pinned = false;
  double latency_ms = 0;  // stage-1 start to publication
  // Where this batch was when the consumer asked for it (Note [Held by] in src/data/loader.cc):
  // "ready" (published), "device" (published, Next() waited for its GPU work), "decode" (stages
  // 2-3: image decode, transforms, collation), "read" (stage 1: record reads and checks),
  // "buffers" (stage 1 had no free batch buffer for it yet). A static string.
  const char* held_by = "ready";
  double wait_ms = 0;       // how long Next() waited for it
  int corrupt_skipped = 0;  // samples of this batch dropped under the skip policy
  // Per row, the task (instruction) text the DB stores for the sample ("" for padding rows);
  // empty when the DB stores none (Note [Task text] in src/data/loader.cc). Host memory always.
  std::vector<std::string> task;
  // GPU loader: every pointer above is device memory of `device_id` (DLPack device_type 2), and
  // `images` holds `image_dtype` elements (bf16 bits when DType::kBFloat16) in `image_layout`. The
  // batch is complete when Next() returns it (Next() waits for its `ready_event`).
  int device_type = 1;  // DLPack: 1 CPU, 2 CUDA
  int device_id = 0;
  ImageLayout image_layout = ImageLayout::kNCHW;
  DType image_dtype = DType::kFloat32;  // LoaderOptions::dtype
  void* ready_event = nullptr;          // cudaEvent_t

  // The arrays above as views, named as the Python batch keys: "images" (image_dtype, in
  // image_layout), "tokens" (i64), "attention_mask" (u8), "state" (f32), "action" (f32),
  // "action_mask" (u8), "sample_index" (i64); each [rows, ...] as documented above, on the
  // batch's device. They borrow the batch's buffers: valid while the batch is held.
  std::vector<std::pair<std::string, TensorView>> Tensors() const;
};

// What the loader decodes with, for metrics: "hw_decode", "decode_backend", "reason".
struct LoaderDeviceInfo {
  bool gpu = false;
  bool hw_decode = false;
  std::string decode_backend = "libjpeg-turbo";  // or "hardware+gpu_hybrid", "gpu_hybrid", ...
  std::string reason;
  float hw_ratio = 0.f;
  bool ratio_measured = false;
  bool stage3_on_device = false;  // GPU loader: stage 3 by the CUDA kernel (else host + copy)
  int64_t images_hw = 0, images_cuda = 0, images_cpu = 0;
  // GPU decoder: lanes in flight, their stagger (Note [Decode turns] in nvjpeg_decoder.h), and
  // host time of the decoded batches, summed in ms: waiting for the consumer to release the
  // lane's buffers, header parsing and CPU fallbacks, waiting for the turn, inside nvJPEG.
  int decode_lanes = 0;
  float decode_stagger = 0.f;
  int64_t decoded_batches = 0;
  double decode_release_wait_ms = 0, decode_prepare_ms = 0, decode_turn_wait_ms = 0,
         decode_call_ms = 0;
};

class DataLoader {
 public:
  static StatusOr<std::unique_ptr<DataLoader>> Create(const LoaderOptions& opts);
  ~DataLoader();

  const Schema& schema() const;
  int64_t batches_per_epoch() const;
  // Starts (or restarts) the pipeline at batch `start_batch` of `epoch`. Stops a running epoch.
  Status Start(int64_t epoch, int64_t start_batch = 0);
  // Next batch of the epoch: the batch, OutOfRange at the end of the epoch, or the error that
  // stopped the pipeline (DataLoss/NotFound naming the record under the `error` policy).
  StatusOr<std::shared_ptr<Batch>> Next();
  // Stops the pipeline threads; queued work is discarded; pool buffers stay for reuse.
  void Stop();

  // Map-style access (Note [Sample access] in src/data/loader.cc): sample `sample` of the DB
  // (0 <= sample < schema().num_samples, whatever rank/world_size/shuffle say) as a batch of one
  // row, bit for bit the row this loader gives it in `epoch` (its crop and jitter are drawn from
  // (seed, epoch, sample, camera)). Tokens are padded as a batch of one: to the sample's own
  // length, token_pad or its bucket. OutOfRange naming the sample and the DB's length; a corrupt
  // sample is DataLoss/NotFound naming the record whatever on_corrupt says. Independent of the
  // pipeline Start()/Next() run; calls are serialized. Consecutive samples are prefetched.
  StatusOr<std::shared_ptr<Batch>> GetSample(int64_t sample, int64_t epoch = 0);

  // Resumable position: the next batch Next() would return.
  int64_t epoch() const;
  int64_t next_batch() const;
  // Static shapes: the token buckets in use (sorted), empty otherwise. Batch::token_bucket indexes
  // this list; a trainer keys CUDA graphs / memory plans on (token_bucket) or tokens_len.
  const std::vector<int>& token_buckets() const;
  // Whether batches carry Batch::task: the DB stores task text (Note [Task text] in
  // src/data/loader.cc).
  bool has_task_text() const;

  MetricsRegistry& metrics();
  int64_t corrupt_skipped() const;

  // Decode backend in use and why.
  LoaderDeviceInfo device_info() const;
  // Whether this build and machine can run device = kCuda; `reason` says why not (or what runs).
  static bool GpuSupport(int device_id, std::string* reason);
  // GPU loader: the CUDA stream (cudaStream_t) the consumer reads batches on. A released batch's
  // device buffers are rewritten only after the work queued on that stream before the release has
  // run (as torch's record_stream). Default 0: the legacy default stream.
  void SetConsumerStream(void* stream);

 private:
  DataLoader() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace data
}  // namespace loongforge
