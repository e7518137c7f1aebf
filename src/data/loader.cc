// DataFusion CPU loader.
//
// Note [Loader pipeline]
// ----------------------
// Three stages linked by bounded queues, so at most `prefetch` batches are in flight:
//
//   lf-fetch ──work_q──► lf-collate ──out_q──► Next()
//      │                    ▲
//      └─ per-image tasks ─►│ lf-decode* (ThreadPool) decrement Work::pending
//
// Stage 1 (lf-fetch) takes a free buffer slot, opens a read transaction, resolves every record of
// the batch as a zero-copy view into LMDB's memory map, validates record sizes, and submits one
// decode task per (sample, camera) that writes straight into the slot's image buffer. It then
// pushes the Work to work_q in sampler order. Stage 3 (lf-collate) pops Work in that same order and
// waits until its images are done, so batches leave in sampler order whatever the thread count or
// timing. The transaction lives in the Work: views stay valid until the batch is collated.
//
// Buffers: a Slot holds every array of one batch at its maximum size. Slots are recycled through
// a SlotPool shared with the consumer: a published Batch is a shared_ptr whose deleter returns the
// slot, so memory stays flat as long as the consumer drops its batches.
//
// Corrupt data: each sample carries the first error met while reading or decoding it. Under
// `skip` the sample is dropped (the batch is compacted) and counted; under `error` the pipeline
// stops and Next() returns that Status, which names the record key.
//
// Note [Static batches]
// ---------------------
// For CUDA graphs and planned memory (issue 9) a trainer wants few distinct shapes. With
// static_shapes (or token_buckets), every batch has batch_size rows and tokens padded to one of
// a small sorted set of lengths: the smallest bucket >= the longest instruction kept in the
// batch. Samples dropped as corrupt leave padding rows at the end (zero images/arrays, masks off,
// sample_index -1), so `size` counts the real ones. Camera count, horizon and image size are
// fixed by the schema and options. Batch::token_bucket says which bucket; the buffers are the
// slot pool's preallocated ones (a fixed set after warm-up, allocated at Create on the GPU).
// An instruction longer than the largest bucket is not corruption (the data is fine, the
// configuration is not): it stops the loader with InvalidArgument naming the record whatever
// the corrupt policy, unless truncate_tokens cuts it; Create already refuses when the schema's
// max_tokens says some instruction is too long.
//
// Note [GPU loader]
// -----------------
// With device = kCuda, stage 1 is unchanged (no decode tasks are queued) and lf-collate becomes
// the GPU stage. For each batch, in sampler order:
//   2a. nvJPEG batched decode on a decoder lane's stream into that lane's device images (Note
//       [GPU decode paths] and Note [Decode lanes] in nvjpeg_decoder.h): lf-collate submits up
//       to `decode_lanes` batches ahead, so the decode of batch k+1 runs on its own lane thread
//       while lf-collate finishes batch k; failed images mark their sample corrupt. The lanes
//       take turns for their nvJPEG calls (Note [Decode turns]), so batches leave evenly spaced.
//       (LOONGFORGE_LOADER_DISABLE=async_decode: one batch at a time, decoded on lf-collate.)
//   2b. the transform stream waits for the decode (event) and for the slot's `released` event,
//       then one fused kernel per batch crops/resizes/jitters/normalizes every kept image straight
//       into the slot's device image buffer, at its compacted index; the decoder's buffer set is
//       released after that kernel (event).
//   3.  stage 3 on the transform stream: lf-fetch already packed the batch's raw records into the
//       slot's pinned staging (Note [Stage 3 staging] in stage3.h); lf-collate adds which samples
//       survived, one async copy moves the raw ids/lengths/records to the device, and one kernel
//       pads tokens, builds the masks and normalizes state/action into the slot's device arrays
//       (static shapes: padding rows zeroed too); the slot's `ready` event is recorded after it.
//       (LOONGFORGE_LOADER_DISABLE=stage3_device runs the CPU twin and copies the arrays.)
// Next() waits (with the timeout) for `ready` before handing the batch out, so a consumer on any
// stream sees complete data. When the consumer drops the batch, the slot's `released` event is
// recorded on the consumer's stream (SetConsumerStream; torch's current stream in Python), and the
// next batch written into that slot waits for it on the GPU: the record_stream discipline, so the
// consumer's queued kernels never read a slot being rewritten. The Work of a batch (its LMDB read
// transaction, whose pages nvJPEG reads) is kept until `lanes` later batches have been decoded:
// by then its decode has finished (a lane decodes again only after its last consumer ran).
#include <sys/mman.h>

#include <cerrno>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "image_ops.h"
#include "loongforge/loader.h"
#include "loongforge/logging.h"
#include "loongforge/queue.h"
#include "loongforge/thread_pool.h"
#include "stage3.h"

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#include "image_kernels.h"
#endif
#ifdef LOONGFORGE_WITH_NVJPEG
#include "nvjpeg_decoder.h"
#endif

namespace loongforge {
namespace {

// madvise(MADV_POPULATE_READ), Linux 5.14; older kernels fail it with EINVAL.
#ifdef MADV_POPULATE_READ
constexpr int kMadvPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kMadvPopulateRead = 22;
#endif

using internal::CropBox;
using internal::Jitter;
using internal::JpegDecoder;
using internal::RgbImage;

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Per-(seed, epoch, sample, camera) random stream for augmentation: the same sample in the same
// epoch always gets the same crop and jitter, whichever thread decodes it.
struct SampleRng {
  uint64_t s;
  SampleRng(uint64_t seed, int64_t epoch, int64_t sample, int camera)
      : s(Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(sample)) ^
          static_cast<uint64_t>(camera)) {}
  float Uniform() {  // [0, 1)
    s = Mix(s);
    return static_cast<float>(s >> 40) / static_cast<float>(1ULL << 24);
  }
  float Range(float lo, float hi) { return lo + (hi - lo) * Uniform(); }
};

// Memory for one batch at its maximum size.
struct Slot {
  size_t bytes = 0;
  uint8_t* base = nullptr;
  bool pinned = false;
  Batch batch;             // pointers into base
  uint8_t* raw = nullptr;  // stage 3 staging (Note [Stage 3 staging]); pinned on the GPU path
#ifdef LOONGFORGE_WITH_CUDA
  // GPU loader: `base` (pinned) holds stage 3's host staging and the kernel's task list; the
  // batch itself lives at dev_base. The non-image arrays have the same layout in both.
  uint8_t* dev_base = nullptr;
  Batch dev_batch;  // pointers into dev_base
  uint8_t *host_tail = nullptr, *dev_tail = nullptr;
  size_t tail_bytes = 0;
  internal::GpuImageTask *host_tasks = nullptr, *dev_tasks = nullptr;
  uint8_t* dev_raw = nullptr;  // device copy of `raw`, read by the stage-3 kernel
  cudaEvent_t ready = nullptr, released = nullptr;
#endif
};

class SlotPool {
 public:
  SlotPool(int batch_size, int cameras, int image_size, int max_tokens, int state_dim,
           int action_dim, int horizon, bool pin, bool gpu, size_t image_elem_bytes,
           size_t raw_bytes)
      : b_(batch_size),
        k_(cameras),
        hw_(image_size),
        l_(max_tokens),
        s_(state_dim),
        a_(action_dim),
        h_(horizon),
        pin_(pin),
        gpu_(gpu),
        image_elem_(image_elem_bytes),
        raw_(Align(raw_bytes)) {}
  ~SlotPool() {
    for (Slot* s : all_) {
      Free(s);
      delete s;
    }
  }

  StatusOr<Slot*> Acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      Slot* s = free_.back();
      free_.pop_back();
      return s;
    }
    auto slot = Allocate();
    if (!slot.ok()) return slot.status();
    all_.push_back(*slot);
    return *slot;
  }
  // Allocates slots up front (the pool still grows on demand past `n`), so the first batches of a
  // run do not pay for cudaMalloc/cudaHostAlloc on the pipeline's threads.
  Status Reserve(int n) {
    std::vector<Slot*> got;
    for (int i = 0; i < n; ++i) {
      auto slot = Acquire();
      if (!slot.ok()) {
        for (Slot* s : got) ReturnUnused(s);
        return slot.status();
      }
      got.push_back(*slot);
    }
    for (Slot* s : got) ReturnUnused(s);
    return Status::Ok();
  }
  void Release(Slot* s) {
#ifdef LOONGFORGE_WITH_CUDA
    if (s->released) {  // Note [GPU loader]: reuse waits for the consumer's queued work
      auto consumer = static_cast<cudaStream_t>(consumer_stream_.load());
      if (cudaEventRecord(s->released, consumer) != cudaSuccess) {
        cudaGetLastError();
        LF_CUDA_WARN_IF_ERROR(cudaEventRecord(s->released, nullptr));
      }
    }
#endif
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }
  void SetConsumerStream(void* stream) { consumer_stream_ = stream; }
  // A slot that never held a published batch (no consumer event to record).
  void ReturnUnused(Slot* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }
  size_t allocated_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (Slot* s : all_) n += s->bytes;
    return n;
  }
  int slots() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(all_.size());
  }

 private:
  static size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

  // Points b's non-image arrays into p (the layout both host and device copies use).
  void LayoutTail(uint8_t* p, Batch* b) const {
    b->tokens = reinterpret_cast<int64_t*>(p);
    p += Align(sizeof(int64_t) * b_ * l_);
    b->attention_mask = p;
    p += Align(static_cast<size_t>(b_) * l_);
    b->state = reinterpret_cast<float*>(p);
    p += Align(sizeof(float) * b_ * s_);
    b->action = reinterpret_cast<float*>(p);
    p += Align(sizeof(float) * b_ * h_ * a_);
    b->action_mask = p;
    p += Align(static_cast<size_t>(b_) * h_);
    b->sample_index = reinterpret_cast<int64_t*>(p);
  }
  size_t TailBytes() const {
    return Align(sizeof(int64_t) * b_ * l_) + Align(static_cast<size_t>(b_) * l_) +
           Align(sizeof(float) * b_ * s_) + Align(sizeof(float) * b_ * h_ * a_) +
           Align(static_cast<size_t>(b_) * h_) + Align(sizeof(int64_t) * b_);
  }

#ifdef LOONGFORGE_WITH_CUDA
  StatusOr<Slot*> AllocateGpu() {
    const size_t img = Align(image_elem_ * b_ * k_ * 3 * hw_ * hw_);
    const size_t tail = TailBytes();
    const size_t tasks = Align(sizeof(internal::GpuImageTask) * b_ * k_);
    const size_t raw = raw_;
    auto* slot = new Slot();
    auto fail = [&](Status s) {
      Free(slot);
      delete slot;
      return s.WithContext("loader: allocating a GPU batch buffer");
    };
    slot->bytes = tail + tasks + raw;
    void* h = nullptr;
    cudaError_t e = cudaHostAlloc(&h, slot->bytes, cudaHostAllocDefault);
    if (e != cudaSuccess)
      return fail(internal::CudaErrorToStatus(e, "cudaHostAlloc", __FILE__, __LINE__));
    slot->base = static_cast<uint8_t*>(h);
    slot->pinned = true;
    void* d = nullptr;
    e = cudaMalloc(&d, img + tail + tasks + raw);
    if (e != cudaSuccess)
      return fail(internal::CudaErrorToStatus(e, "cudaMalloc", __FILE__, __LINE__));
    slot->dev_base = static_cast<uint8_t*>(d);
    e = cudaEventCreateWithFlags(&slot->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&slot->released, cudaEventDisableTiming);
    if (e != cudaSuccess)
      return fail(internal::CudaErrorToStatus(e, "cudaEventCreate", __FILE__, __LINE__));
    LayoutTail(slot->base, &slot->batch);
    slot->batch.images = nullptr;
    slot->batch.pinned = true;
    slot->host_tail = slot->base;
    slot->host_tasks = reinterpret_cast<internal::GpuImageTask*>(slot->base + tail);
    slot->dev_batch.images = reinterpret_cast<float*>(slot->dev_base);
    LayoutTail(slot->dev_base + img, &slot->dev_batch);
    slot->dev_tail = slot->dev_base + img;
    slot->tail_bytes = tail;
    slot->dev_tasks = reinterpret_cast<internal::GpuImageTask*>(slot->dev_base + img + tail);
    slot->raw = slot->base + tail + tasks;
    slot->dev_raw = slot->dev_base + img + tail + tasks;
    return slot;
  }
#endif

  StatusOr<Slot*> Allocate() {
#ifdef LOONGFORGE_WITH_CUDA
    if (gpu_) return AllocateGpu();
#endif
    size_t img = Align(sizeof(float) * b_ * k_ * 3 * hw_ * hw_);
    size_t tok = Align(sizeof(int64_t) * b_ * l_);
    size_t am = Align(static_cast<size_t>(b_) * l_);
    size_t st = Align(sizeof(float) * b_ * s_);
    size_t ac = Align(sizeof(float) * b_ * h_ * a_);
    size_t amk = Align(static_cast<size_t>(b_) * h_);
    size_t idx = Align(sizeof(int64_t) * b_);
    auto* slot = new Slot();
    slot->bytes = img + tok + am + st + ac + amk + idx + raw_;
#ifdef LOONGFORGE_WITH_CUDA
    if (pin_) {
      void* p = nullptr;
      if (cudaHostAlloc(&p, slot->bytes, cudaHostAllocDefault) == cudaSuccess) {
        slot->base = static_cast<uint8_t*>(p);
        slot->pinned = true;
      } else {
        cudaGetLastError();
      }
    }
#endif
    if (!slot->base) {
      void* p = nullptr;
      if (posix_memalign(&p, 4096, slot->bytes) != 0) {
        Status err = ResourceExhaustedError(
            "loader: cannot allocate a " + std::to_string(slot->bytes >> 20) + " MiB batch buffer");
        delete slot;
        return err;
      }
      slot->base = static_cast<uint8_t*>(p);
      // Fault the pages in now, once, on the fetch thread: first-touch faults inside the decode
      // workers showed up as batch-interval jitter (a fresh GiB costs seconds on some VMs).
      std::memset(slot->base, 0, slot->bytes);
    }
    uint8_t* p = slot->base;
    Batch& b = slot->batch;
    b.images = reinterpret_cast<float*>(p);
    p += img;
    b.tokens = reinterpret_cast<int64_t*>(p);
    p += tok;
    b.attention_mask = p;
    p += am;
    b.state = reinterpret_cast<float*>(p);
    p += st;
    b.action = reinterpret_cast<float*>(p);
    p += ac;
    b.action_mask = p;
    p += amk;
    b.sample_index = reinterpret_cast<int64_t*>(p);
    p += idx;
    slot->raw = p;
    b.pinned = slot->pinned;
    return slot;
  }

  void Free(Slot* s) {
#ifdef LOONGFORGE_WITH_CUDA
    if (s->dev_base) LF_CUDA_WARN_IF_ERROR(cudaFree(s->dev_base));
    if (s->ready) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(s->ready));
    if (s->released) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(s->released));
    if (s->pinned) {
      cudaFreeHost(s->base);
      return;
    }
#endif
    std::free(s->base);
  }

  const int b_, k_, hw_, l_, s_, a_, h_;
  const bool pin_, gpu_;
  const size_t image_elem_, raw_;
  std::atomic<void*> consumer_stream_{nullptr};
  mutable std::mutex mu_;
  std::vector<Slot*> all_, free_;
};

// One batch travelling through the pipeline.
struct Work {
  int64_t epoch = 0, index = 0;
  bool epoch_end = false;  // marker between epochs (Note [Epoch continuation])
  std::vector<int64_t> samples;
  Slot* slot = nullptr;
  std::shared_ptr<SlotPool> pool;
  std::optional<RecordReader::Txn> txn;
  std::vector<std::string_view> tokens, state, action, amask;
  std::vector<std::string_view> jpeg;  // [sample * cameras + camera]
  std::vector<Status> sample_status;   // first error of each sample
  Status fatal;  // stops the pipeline whatever the corrupt policy (an instruction too long for
                 // the largest token bucket)
  std::mutex mu;
  std::condition_variable done_cv;
  int pending = 0;
  std::atomic<bool> cancelled{false};
  double t_start = 0;

  ~Work() {
    txn.reset();
    if (slot) pool->Release(slot);
  }
  void SetError(size_t i, Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (sample_status[i].ok()) sample_status[i] = std::move(s);
  }
  void TaskDone() {
    std::lock_guard<std::mutex> lock(mu);
    if (--pending == 0) done_cv.notify_all();
  }
};

using WorkPtr = std::shared_ptr<Work>;
using Output = StatusOr<std::shared_ptr<Batch>>;

// What stage 3 does with one batch.
struct Stage3Plan {
  std::vector<int> keep;  // raw rows kept, in order (output row o <- keep[o])
  int dropped = 0, n = 0, rows = 0, len = 1, bucket = -1;
  int64_t total_tokens = 0;  // staged token ids of the whole batch
};

// Throughput switches for A/B runs on the GPU machine: LOONGFORGE_LOADER_DISABLE is a comma list
// of these names (unknown names are an error at Create). Defaults are all on.
struct TuningSwitches {
  bool stage3_device = true;  // stage 3 by the CUDA kernel (off: host twin + copy of the arrays)
  bool prefault = true;       // lf-fetch touches the batch's JPEG pages before nvJPEG reads them
  // LOONGFORGE_LOADER_PREFAULT=populate: madvise(MADV_POPULATE_READ) per record (Linux >= 5.14;
  // touch: one read per page).
  bool prefault_populate = false;
  bool reserve = true;  // GPU slots allocated at Create instead of by the first batches
  // Note [Decode lanes] (nvjpeg_decoder.h): lane threads keep `decode_lanes` batches in nvJPEG
  // (off: lf-collate decodes each batch itself, then launches its kernels).
  bool async_decode = true;
  // nvJPEG states initialized once per batch size, pre-allocated and padded (off: initialized
  // before every batch).
  bool decode_reuse = true;
  int decode_lanes = 2;  // LOONGFORGE_LOADER_DECODE_LANES (async_decode only)
  // LOONGFORGE_LOADER_DECODE_STAGGER in [0, 1]: when a lane's nvJPEG calls may start (Note
  // [Decode turns] in nvjpeg_decoder.h; 1: after the previous batch's calls returned).
  float decode_stagger = 1.f;
  // LOONGFORGE_LOADER_DECODE_HW_HANDLE_PER_LANE=1: one hardware nvJPEG handle per lane.
  bool hw_handle_per_lane = false;
  // LOONGFORGE_LOADER_DECODE_INTERLEAVED=1: nvJPEG writes interleaved RGB (RGBI).
  bool interleaved = false;
};

StatusOr<TuningSwitches> ReadTuningSwitches() {
  TuningSwitches t;
  if (const char* lanes = std::getenv("LOONGFORGE_LOADER_DECODE_LANES")) {
    char* end = nullptr;
    const long v = std::strtol(lanes, &end, 10);
    if (end == lanes || *end != '\0' || v < 2 || v > 16)
      return InvalidArgumentError(std::string("LOONGFORGE_LOADER_DECODE_LANES: '") + lanes +
                                  "' is not a lane count in [2, 16]");
    t.decode_lanes = static_cast<int>(v);
  }
  if (const char* st = std::getenv("LOONGFORGE_LOADER_DECODE_STAGGER")) {
    char* end = nullptr;
    const float v = std::strtof(st, &end);
    if (end == st || *end != '\0' || !(v >= 0.f && v <= 1.f))
      return InvalidArgumentError(std::string("LOONGFORGE_LOADER_DECODE_STAGGER: '") + st +
                                  "' is not a fraction in [0, 1]");
    t.decode_stagger = v;
  }
  if (const char* pf = std::getenv("LOONGFORGE_LOADER_PREFAULT")) {
    const std::string v(pf);
    if (v != "populate" && v != "touch" && !v.empty())
      return InvalidArgumentError("LOONGFORGE_LOADER_PREFAULT: '" + v +
                                  "' (known: touch, populate)");
    t.prefault_populate = v == "populate";
  }
  if (const char* h = std::getenv("LOONGFORGE_LOADER_DECODE_HW_HANDLE_PER_LANE"))
    t.hw_handle_per_lane = std::string(h) == "1";
  if (const char* h = std::getenv("LOONGFORGE_LOADER_DECODE_INTERLEAVED"))
    t.interleaved = std::string(h) == "1";
  const char* env = std::getenv("LOONGFORGE_LOADER_DISABLE");
  if (!env) return t;
  std::string list(env);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(pos, end - pos);
    if (name == "stage3_device")
      t.stage3_device = false;
    else if (name == "prefault")
      t.prefault = false;
    else if (name == "reserve")
      t.reserve = false;
    else if (name == "async_decode")
      t.async_decode = false;
    else if (name == "decode_reuse")
      t.decode_reuse = false;
    else if (!name.empty())
      return InvalidArgumentError(
          "LOONGFORGE_LOADER_DISABLE: unknown switch '" + name +
          "' (known: stage3_device, prefault, reserve, async_decode, decode_reuse)");
    pos = end + 1;
  }
  return t;
}

}  // namespace

struct DataLoader::Impl {
  LoaderOptions opts;
  std::unique_ptr<RecordReader> reader;
  std::optional<Sampler> sampler;
  int max_tokens = 0;  // token capacity of a row: token_pad, the largest bucket or the schema's
  std::vector<int> buckets;  // Note [Static batches]
  bool static_shapes = false;
  bool truncate_ok = false;       // longer instructions are cut to max_tokens
  bool normalize = false;         // state/action normalized (option on and statistics present)
  std::vector<float> norm_stats;  // staged with every batch: mean_s, std_s, mean_a, std_a
  internal::Stage3Layout s3;
  TuningSwitches tuning;
  std::atomic<uint32_t> prefault_sink{0};
  std::atomic<bool> populate_ok{true};  // MADV_POPULATE_READ works on this kernel
  std::vector<std::string> camera_modality;
  std::shared_ptr<SlotPool> pool;
  std::unique_ptr<ThreadPool> decode_pool;
  MetricsRegistry metrics;
  Histogram *h_fetch, *h_decode, *h_collate, *h_latency, *h_wait;
  Histogram* h_prefault = nullptr;                // GPU: the part of fetch_ms spent in Prefault()
  Histogram* h_acquire = nullptr;                 // the part of fetch_ms spent getting a slot
  std::atomic<int64_t>* c_slots_grown = nullptr;  // slots allocated after Create
  std::atomic<int64_t>*c_images, *c_batches, *c_corrupt, *c_bytes;
  std::atomic<int64_t> tasks_in_flight{0};  // decode tasks queued or running
  RateLimiter corrupt_log{2000};

  std::unique_ptr<BoundedQueue<WorkPtr>> work_q;
  std::unique_ptr<BoundedQueue<Output>> out_q;
  std::thread fetch_thread, collate_thread;
  std::atomic<bool> stop{false};
  bool running = false;
  bool finished = false;  // end of epoch or error delivered
  bool failed = false;    // an error was delivered: the pipeline must restart
  int64_t epoch = 0, next_batch = 0;

  bool gpu = false;  // device == kCuda (Note [GPU loader])
  LoaderDeviceInfo cpu_info;
#ifdef LOONGFORGE_WITH_NVJPEG
  std::unique_ptr<internal::NvJpegBatchDecoder> decoder;
  cudaStream_t xform = nullptr;  // "transform" stream: fused kernel + stage-3 copy
  Histogram *h_gpu_decode = nullptr, *h_gpu_wait = nullptr, *h_gpu_submit = nullptr;
  // A batch handed to the decoder (Note [Decode lanes]): its Work and the (sample, camera) of
  // each submitted image.
  struct GpuPending {
    WorkPtr w;
    std::shared_ptr<std::vector<std::pair<int, int>>> who;
  };
  Status GpuSubmit(const WorkPtr& w, GpuPending* p);
  Status GpuFinish(Work& w, const std::vector<std::pair<int, int>>& who,
                   std::shared_ptr<Batch>* out);
  void GpuCollateLoop();
#endif

  ~Impl() {
#ifdef LOONGFORGE_WITH_NVJPEG
    if (xform) {
      LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(xform));
      LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(xform));
    }
#endif
  }

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(opts.timeout_ms); }

  void FetchLoop(int64_t ep, int64_t start);
  void CollateLoop(int64_t ep, int64_t start);
  // Waits (with the timeout) until w's decode tasks finished or the loader stops; false after a
  // DeadlineExceeded naming the batch was delivered to the consumer.
  bool WaitDecoded(Work& w);
  void DecodeImage(const WorkPtr& w, int sample, int camera);
  void PackStage3(Work& w);
  void Prefault(const Work& w);
  Status PlanStage3(Work& w, Stage3Plan* p);
  internal::Stage3Dims Dims(const Stage3Plan& p) const;
  Status Collate(Work& w, std::shared_ptr<Batch>* out);
  void Publish(Work& w, const Stage3Plan& p, std::shared_ptr<Batch>* out);
  void StopThreads();
  void SyncDevice();
};

// ---------------------------------------------------------------------------------------------
// Stage 1

void DataLoader::Impl::FetchLoop(int64_t ep, int64_t start) {
#ifdef LOONGFORGE_WITH_CUDA
  if (gpu) LF_CUDA_WARN_IF_ERROR(cudaSetDevice(opts.device_id));  // slots are allocated here
#endif
  const Schema& sc = reader->schema();
  const int cams = static_cast<int>(sc.cameras.size());
  const int64_t nb = sampler->batches_per_epoch();
  // Note [Epoch continuation]: after the last batch of an epoch, a marker goes down the pipeline
  // and fetching goes on with the next epoch, so a consumer that starts epoch e+1 right after
  // finishing e finds its first batches ready instead of an empty pipeline (the restart gap was
  // the largest batch-interval outlier). Start() keeps the running pipeline in that case.
  for (;; ep += 1, start = 0) {
    for (int64_t b = start; b < nb && !stop.load(); ++b) {
      // Record lookups only; time blocked on back-pressure below is not fetch work.
      std::optional<ScopedTimerMs> timer(std::in_place, h_fetch);
      auto w = std::make_shared<Work>();
      w->t_start = NowSeconds();
      w->epoch = ep;
      w->index = b;
      w->samples = sampler->Batch(ep, b);
      w->pool = pool;
      const int slots_before = pool->slots();
      auto slot = [&] {
        ScopedTimerMs acquire_timer(h_acquire);
        return pool->Acquire();
      }();
      if (pool->slots() > slots_before) c_slots_grown->fetch_add(pool->slots() - slots_before);
      if (!slot.ok()) {
        out_q->Push(slot.status(), timeout()).IgnoreError();
        return;
      }
      w->slot = *slot;
      auto txn = reader->Begin();
      if (!txn.ok()) {
        out_q->Push(txn.status(), timeout()).IgnoreError();
        return;
      }
      w->txn.emplace(std::move(txn).value());
      const size_t n = w->samples.size();
      w->tokens.resize(n);
      w->state.resize(n);
      w->action.resize(n);
      w->amask.resize(n);
      w->jpeg.resize(n * cams);
      w->sample_status.assign(n, Status::Ok());
      int64_t bytes = 0;
      for (size_t i = 0; i < n; ++i) {
        const int64_t id = w->samples[i];
        auto get = [&](std::string_view modality, size_t expect_bytes, std::string_view* v) {
          if (!w->sample_status[i].ok()) return;
          std::string key = SampleKey(id, modality);
          auto r = w->txn->Get(key);
          if (!r.ok()) {
            w->sample_status[i] = r.status();
            return;
          }
          if (expect_bytes && r->size() != expect_bytes) {
            w->sample_status[i] = DataLossError(reader->path() + ": record '" + key + "' has " +
                                                std::to_string(r->size()) + " bytes, expected " +
                                                std::to_string(expect_bytes) + " (truncated?)");
            return;
          }
          const size_t ntok = r->size() / 4;
          if (modality == "tokens" &&
              (r->size() % 4 != 0 || (ntok > static_cast<size_t>(max_tokens) && !truncate_ok))) {
            if (r->size() % 4 == 0 && static_shapes) {  // Note [Static batches]: not corruption
              if (w->fatal.ok())
                w->fatal = InvalidArgumentError(
                    reader->path() + ": record '" + key + "' has " + std::to_string(ntok) +
                    " tokens, more than the largest token bucket (" + std::to_string(max_tokens) +
                    "): add a bucket of at least " + std::to_string(ntok) +
                    " or set truncate_tokens");
              return;
            }
            w->sample_status[i] = DataLossError(reader->path() + ": record '" + key + "' has " +
                                                std::to_string(r->size()) +
                                                " bytes: not a token "
                                                "list of at most " +
                                                std::to_string(max_tokens));
            return;
          }
          *v = *r;
          bytes += static_cast<int64_t>(r->size());
        };
        get("tokens", 0, &w->tokens[i]);
        get("state", sizeof(float) * sc.state_dim, &w->state[i]);
        get("action", sizeof(float) * sc.action_dim * sc.action_horizon, &w->action[i]);
        get("amask", static_cast<size_t>(sc.action_horizon), &w->amask[i]);
        for (int c = 0; c < cams; ++c) get(camera_modality[c], 0, &w->jpeg[i * cams + c]);
      }
      c_bytes->fetch_add(bytes);
      PackStage3(*w);
      if (gpu && tuning.prefault) {
        ScopedTimerMs prefault_timer(h_prefault);
        Prefault(*w);
      }
      timer.reset();
      int tasks = 0;
      for (size_t i = 0; i < n && !gpu; ++i)
        if (w->sample_status[i].ok()) tasks += cams;
      w->pending = tasks + 1;  // +1 released below, after every task is queued
      for (size_t i = 0; i < n && !stop.load() && !gpu; ++i) {  // GPU: stage 2 decodes the batch
        if (!w->sample_status[i].ok()) continue;
        for (int c = 0; c < cams; ++c) {
          tasks_in_flight.fetch_add(1);
          Status s = decode_pool->Submit([this, w, i, c] {
            DecodeImage(w, static_cast<int>(i), c);
            tasks_in_flight.fetch_sub(1);
          });
          if (!s.ok()) {
            tasks_in_flight.fetch_sub(1);
            w->cancelled = true;
            return;  // pool shut down: the loader is being destroyed
          }
        }
      }
      w->TaskDone();
      if (stop.load()) {
        w->cancelled = true;
        return;
      }
      if (!work_q->Push(std::move(w), std::chrono::hours(24 * 365)).ok()) return;  // closed: stop
    }
    if (stop.load()) return;
    auto marker = std::make_shared<Work>();
    marker->epoch = ep;
    marker->epoch_end = true;
    if (!work_q->Push(std::move(marker), std::chrono::hours(24 * 365)).ok()) return;
  }
}

bool DataLoader::Impl::WaitDecoded(Work& w) {
  std::unique_lock<std::mutex> lock(w.mu);
  if (w.done_cv.wait_for(lock, timeout(), [&] { return w.pending == 0 || stop.load(); }))
    return true;
  lock.unlock();
  out_q
      ->Push(DeadlineExceededError("loader: decoding batch " + std::to_string(w.index) +
                                   " took longer than " + std::to_string(opts.timeout_ms) + " ms"),
             timeout())
      .IgnoreError();
  return false;
}

// Note [Stage 3 staging]: the batch's raw non-image records into the slot's staging buffer.
void DataLoader::Impl::PackStage3(Work& w) {
  const internal::Stage3Layout& L = s3;
  uint8_t* raw = w.slot->raw;
  auto* off = reinterpret_cast<int32_t*>(raw + L.off_token_offset);
  auto* sidx = reinterpret_cast<int64_t*>(raw + L.off_sample_index);
  auto* st = reinterpret_cast<float*>(raw + L.off_state);
  auto* ac = reinterpret_cast<float*>(raw + L.off_action);
  uint8_t* am = raw + L.off_amask;
  auto* ids = reinterpret_cast<int32_t*>(raw + L.off_tokens);
  const size_t S = L.state_dim, HA = static_cast<size_t>(L.horizon) * L.action_dim;
  const size_t H = L.horizon;
  int32_t total = 0;
  for (size_t i = 0; i < w.samples.size(); ++i) {
    off[i] = total;
    sidx[i] = w.samples[i];
    if (!w.sample_status[i].ok()) continue;  // never a src_row
    // Sizes were validated by the lookups; ids beyond the capacity are cut (truncate_tokens).
    const int nt = static_cast<int>(std::min<size_t>(w.tokens[i].size() / 4, L.max_tokens));
    std::memcpy(ids + total, w.tokens[i].data(), sizeof(int32_t) * nt);  // LMDB: maybe unaligned
    total += nt;
    std::memcpy(st + i * S, w.state[i].data(), sizeof(float) * S);
    std::memcpy(ac + i * HA, w.action[i].data(), sizeof(float) * HA);
    std::memcpy(am + i * H, w.amask[i].data(), H);
  }
  off[w.samples.size()] = total;
  if (!norm_stats.empty())
    std::memcpy(raw + L.off_norm, norm_stats.data(), sizeof(float) * norm_stats.size());
}

// Reads one byte of every page of the batch's JPEG bytes, so the page faults of LMDB's map (read
// ahead is off: MDB_NORDAHEAD) are taken here, ahead of time, and not inside nvJPEG's copy of
// the bitstreams on the GPU stage's thread, which feeds the JPEG engine.
void DataLoader::Impl::Prefault(const Work& w) {
  const size_t cams = camera_modality.size();
  if (tuning.prefault_populate && populate_ok.load(std::memory_order_relaxed)) {
    // One call per record maps its pages without a fault per page.
    bool ok = true;
    for (size_t i = 0; i < w.samples.size() && ok; ++i) {
      if (!w.sample_status[i].ok()) continue;
      for (size_t c = 0; c < cams && ok; ++c) {
        const std::string_view v = w.jpeg[i * cams + c];
        if (v.empty()) continue;
        const auto a = reinterpret_cast<uintptr_t>(v.data()) & ~uintptr_t{4095};
        const size_t len = reinterpret_cast<uintptr_t>(v.data()) + v.size() - a;
        if (madvise(reinterpret_cast<void*>(a), len, kMadvPopulateRead) != 0) {
          ok = false;
          if (populate_ok.exchange(false))
            LF_LOG(WARNING) << "loader: madvise(MADV_POPULATE_READ) failed ("
                            << std::strerror(errno) << "): touching pages instead";
        }
      }
    }
    if (ok) return;
  }
  uint32_t sink = 0;
  for (size_t i = 0; i < w.samples.size(); ++i) {
    if (!w.sample_status[i].ok()) continue;
    for (size_t c = 0; c < cams; ++c) {
      const std::string_view v = w.jpeg[i * cams + c];
      for (size_t o = 0; o < v.size(); o += 4096) sink += static_cast<uint8_t>(v[o]);
      if (!v.empty()) sink += static_cast<uint8_t>(v.back());
    }
  }
  prefault_sink.fetch_add(sink, std::memory_order_relaxed);  // keeps the reads
}

// ---------------------------------------------------------------------------------------------
// Stage 2

void DataLoader::Impl::DecodeImage(const WorkPtr& w, int sample, int camera) {
  if (!w->cancelled.load()) {
    ScopedTimerMs timer(h_decode);
    thread_local JpegDecoder decoder;
    thread_local RgbImage rgb;
    const Schema& sc = reader->schema();
    const int cams = static_cast<int>(sc.cameras.size());
    const int out = opts.image_size;
    const std::string_view jpeg = w->jpeg[static_cast<size_t>(sample) * cams + camera];
    const int64_t id = w->samples[sample];
    // Ask the decoder for an image whose crop is still >= the output size.
    int min_w = 0, min_h = 0;
    if (opts.dct_scaling) {
      min_w = static_cast<int>(std::ceil(out / opts.crop_fraction));
      min_h = min_w;
    }
    Status s = decoder.Decode(
        jpeg, min_w, min_h, &rgb,
        reader->path() + ": record '" + SampleKey(id, camera_modality[camera]) + "'");
    if (s.ok()) {
      SampleRng rng(opts.seed, w->epoch, id, camera);
      CropBox box;
      box.w = rgb.width * opts.crop_fraction;
      box.h = rgb.height * opts.crop_fraction;
      float fx = opts.train ? rng.Uniform() : 0.5f, fy = opts.train ? rng.Uniform() : 0.5f;
      // Integer offsets in source pixels, as torchvision's RandomCrop/CenterCrop.
      box.x0 = std::floor((rgb.width - box.w) * fx);
      box.y0 = std::floor((rgb.height - box.h) * fy);
      Jitter j;
      float gray = 0;
      if (opts.color_jitter) {
        j.enabled = true;
        j.brightness = rng.Range(0.7f, 1.3f);
        j.contrast = rng.Range(0.6f, 1.4f);
        j.saturation = rng.Range(0.5f, 1.5f);
        gray = internal::MeanGray(rgb, box, 4);
      }
      internal::NormalizeParams norm{opts.mean, opts.std};
      float* dst =
          w->slot->batch.images + (static_cast<size_t>(sample) * cams + camera) * 3 * out * out;
      internal::CropResizeNormalize(rgb, box, out, out, j, gray, norm, dst);
      c_images->fetch_add(1);
    } else {
      w->SetError(static_cast<size_t>(sample), std::move(s));
    }
  }
  w->TaskDone();
}

// ---------------------------------------------------------------------------------------------
// Stage 3

// Which samples a batch keeps, its shape, and stage 3's src_row (Note [Stage 3 staging]).
Status DataLoader::Impl::PlanStage3(Work& w, Stage3Plan* p) {
  if (!w.fatal.ok()) return w.fatal;
  // Compact away corrupt samples (skip policy) or stop on the first (error policy).
  p->keep.clear();
  p->dropped = 0;  // counted when the batch is handed out (Next), not when prefetched
  for (size_t i = 0; i < w.samples.size(); ++i) {
    if (w.sample_status[i].ok()) {
      p->keep.push_back(static_cast<int>(i));
      continue;
    }
    if (opts.on_corrupt == CorruptPolicy::kError) return w.sample_status[i];
    ++p->dropped;
    int64_t suppressed = 0;
    if (corrupt_log.Allow(&suppressed))
      LF_LOG(WARNING) << "skipping corrupt sample " << w.samples[i] << ": "
                      << w.sample_status[i].message()
                      << (suppressed ? " (" + std::to_string(suppressed) + " more not shown)" : "");
  }
  uint8_t* raw = w.slot->raw;
  const auto* off = reinterpret_cast<const int32_t*>(raw + s3.off_token_offset);
  auto* src_row = reinterpret_cast<int32_t*>(raw + s3.off_src_row);
  p->n = static_cast<int>(p->keep.size());
  int longest = 1;
  for (int o = 0; o < p->n; ++o) {
    const int i = p->keep[o];
    src_row[o] = i;
    longest = std::max(longest, off[i + 1] - off[i]);
  }
  p->total_tokens = off[w.samples.size()];
  p->bucket = -1;
  if (static_shapes) {
    // Note [Static batches]: the smallest bucket that holds the longest kept instruction.
    auto it = std::lower_bound(buckets.begin(), buckets.end(), longest);
    LF_CHECK(it != buckets.end());  // fetch cut or rejected anything longer than the last one
    p->bucket = static_cast<int>(it - buckets.begin());
    p->len = *it;
    p->rows = opts.batch_size;
  } else {
    p->len = opts.token_pad > 0 ? opts.token_pad : longest;
    p->rows = p->n;
  }
  return Status::Ok();
}

internal::Stage3Dims DataLoader::Impl::Dims(const Stage3Plan& p) const {
  internal::Stage3Dims d;
  d.n = p.n;
  d.rows = p.rows;
  d.len = p.len;
  d.normalize = normalize;
  return d;
}

// Stage 3 of the CPU loader: compaction, padding rows, the stage-3 CPU twin, publication.
Status DataLoader::Impl::Collate(Work& w, std::shared_ptr<Batch>* out) {
  const Schema& sc = reader->schema();
  const int cams = static_cast<int>(sc.cameras.size());
  const size_t img_elems = static_cast<size_t>(3) * opts.image_size * opts.image_size;
  Batch& b = w.slot->batch;
  Stage3Plan p;
  LF_RETURN_IF_ERROR(PlanStage3(w, &p));
  for (int o = 0; o < p.n; ++o) {
    const size_t i = static_cast<size_t>(p.keep[o]);
    // Move decoded images down over a skipped sample.
    if (static_cast<size_t>(o) != i)
      std::memmove(b.images + static_cast<size_t>(o) * cams * img_elems,
                   b.images + i * cams * img_elems, sizeof(float) * cams * img_elems);
  }
  if (p.rows > p.n)  // static shapes: padding rows are zero
    std::memset(b.images + static_cast<size_t>(p.n) * cams * img_elems, 0,
                sizeof(float) * (p.rows - p.n) * cams * img_elems);
  internal::Stage3Out o3;
  o3.tokens = b.tokens;
  o3.attention_mask = b.attention_mask;
  o3.state = b.state;
  o3.action = b.action;
  o3.action_mask = b.action_mask;
  o3.sample_index = b.sample_index;
  internal::Stage3Reference(s3, w.slot->raw, Dims(p), o3);
  Publish(w, p, out);
  return Status::Ok();
}

void DataLoader::Impl::Publish(Work& w, const Stage3Plan& p, std::shared_ptr<Batch>* out) {
  const Schema& sc = reader->schema();
  Batch& b = w.slot->batch;
  b.epoch = w.epoch;
  b.index = w.index;
  b.size = p.n;
  b.rows = p.rows;
  b.token_bucket = p.bucket;
  b.corrupt_skipped = p.dropped;
  b.cameras = static_cast<int>(sc.cameras.size());
  b.height = b.width = opts.image_size;
  b.tokens_len = p.len;
  b.state_dim = sc.state_dim;
  b.action_dim = sc.action_dim;
  b.horizon = sc.action_horizon;
  b.latency_ms = (NowSeconds() - w.t_start) * 1e3;
  // Hand the slot to the consumer: the Batch keeps the pool alive and returns the slot on release.
  Slot* slot = w.slot;
  w.slot = nullptr;
  std::shared_ptr<SlotPool> pool = w.pool;
  Batch* pub = &slot->batch;
#ifdef LOONGFORGE_WITH_CUDA
  if (slot->dev_base) {  // GPU: publish the device copy, with the host copy's metadata
    Batch& d = slot->dev_batch;
    Batch ptrs = d;
    d = b;
    d.images = ptrs.images;
    d.tokens = ptrs.tokens;
    d.attention_mask = ptrs.attention_mask;
    d.state = ptrs.state;
    d.action = ptrs.action;
    d.action_mask = ptrs.action_mask;
    d.sample_index = ptrs.sample_index;
    d.pinned = false;
    d.device_type = 2;
    d.device_id = opts.device_id;
    d.image_layout = opts.layout;
    d.image_dtype = opts.dtype;
    d.ready_event = slot->ready;
    pub = &d;
  }
#endif
  *out = std::shared_ptr<Batch>(pub, [pool, slot](Batch*) { pool->Release(slot); });
}

void DataLoader::Impl::CollateLoop(int64_t ep, int64_t start) {
#ifdef LOONGFORGE_WITH_NVJPEG
  if (gpu) {
    GpuCollateLoop();
    return;
  }
#endif
  WorkPtr w;
  while (!stop.load()) {
    Status s = work_q->Pop(&w, std::chrono::hours(24 * 365));
    if (!s.ok()) break;  // closed: stop
    if (w->epoch_end) {
      if (!out_q
               ->Push(OutOfRangeError("end of epoch " + std::to_string(w->epoch)),
                      std::chrono::hours(24 * 365))
               .ok())
        return;
      continue;
    }
    if (!WaitDecoded(*w)) return;
    if (stop.load()) break;
    std::shared_ptr<Batch> batch;
    Status cs;
    {
      ScopedTimerMs timer(h_collate);
      cs = Collate(*w, &batch);
    }
    w.reset();  // ends the read transaction
    if (!cs.ok()) {
      out_q->Push(cs, std::chrono::hours(24 * 365)).IgnoreError();
      return;
    }
    h_latency->Record(batch->latency_ms);
    c_batches->fetch_add(1);
    if (!out_q->Push(std::move(batch), std::chrono::hours(24 * 365)).ok()) return;
  }
}

void DataLoader::Impl::StopThreads() {
  stop = true;
  if (work_q) work_q->Close();
  if (out_q) out_q->Close();
  if (fetch_thread.joinable()) fetch_thread.join();
  if (collate_thread.joinable()) collate_thread.join();
  SyncDevice();  // GPU: queued copies into slots finish before the slots can be reused
  // Drop queued Work (their decode tasks see `cancelled` and finish fast), then wait for the
  // decode tasks still queued or running, so a stopped loader is quiet (bounded wait).
  if (work_q) {
    WorkPtr w;
    while (work_q->TryPop(&w)) w->cancelled = true;
  }
  for (int i = 0; i < 10000 && tasks_in_flight.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  running = false;
}

void DataLoader::Impl::SyncDevice() {
#ifdef LOONGFORGE_WITH_NVJPEG
  // The decoder first: its lanes may wait for `released` events recorded on xform's work.
  if (decoder) {
    Status s = decoder->Drain();
    if (!s.ok()) LF_LOG(ERROR) << "loader: draining the nvJPEG decoder: " << s;
  }
  if (xform) LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(xform));
#endif
}

#ifdef LOONGFORGE_WITH_NVJPEG
// Stage 2 and 3 of the GPU loader (Note [GPU loader]), with the decode of up to `decode_lanes`
// batches in flight (Note [Decode lanes] in nvjpeg_decoder.h): lf-collate submits batch k+1 to
// the decoder before it finishes batch k (collects its images, launches its kernels, publishes
// it), so the JPEG engines always have a batch while the host works on another. Batches are
// finished in submission order, which is sampler order. With async_decode off there is one
// batch in flight and the decoder decodes it inside Submit(), as before lanes existed.
void DataLoader::Impl::GpuCollateLoop() {
  LF_CUDA_WARN_IF_ERROR(cudaSetDevice(opts.device_id));  // this thread's CUDA calls
  const size_t depth = tuning.async_decode ? static_cast<size_t>(tuning.decode_lanes) : 1;
  // A finished batch's Work (its LMDB transaction, whose pages nvJPEG reads) is kept until
  // `lanes` later batches were collected: by then its lane decoded again, which it does only
  // after the batch's consumer kernels (and so its decode) finished. On exit the decoder is
  // drained and the device synchronized before Works are dropped (lanes may still read them).
  const size_t lanes = tuning.async_decode ? static_cast<size_t>(tuning.decode_lanes) : 2;
  std::deque<WorkPtr> retire;
  std::deque<GpuPending> inflight;
  struct Drain {
    Impl* im;
    std::deque<WorkPtr>* retire;
    std::deque<GpuPending>* inflight;
    ~Drain() {
      if (!retire->empty() || !inflight->empty()) im->SyncDevice();
      inflight->clear();
      retire->clear();
    }
  } drain{this, &retire, &inflight};
  // Finishes the oldest batch in flight; false: stop (error delivered or queue closed).
  auto finish_oldest = [&]() -> bool {
    GpuPending p = std::move(inflight.front());
    inflight.pop_front();
    if (p.w->epoch_end)  // after the epoch's last batch, before the next epoch's first
      return out_q
          ->Push(OutOfRangeError("end of epoch " + std::to_string(p.w->epoch)),
                 std::chrono::hours(24 * 365))
          .ok();
    std::shared_ptr<Batch> batch;
    Status cs;
    {
      ScopedTimerMs timer(h_collate);
      cs = GpuFinish(*p.w, *p.who, &batch);
    }
    retire.push_back(std::move(p.w));
    while (retire.size() > lanes) retire.pop_front();
    if (!cs.ok()) {
      out_q->Push(cs, std::chrono::hours(24 * 365)).IgnoreError();
      return false;
    }
    h_latency->Record(batch->latency_ms);
    c_batches->fetch_add(1);
    return out_q->Push(std::move(batch), std::chrono::hours(24 * 365)).ok();
  };
  while (!stop.load()) {
    // Batches in the decoder (epoch-end markers in `inflight` hold no lane).
    if (static_cast<size_t>(decoder->in_flight()) >= depth) {
      if (!finish_oldest()) return;
      continue;
    }
    WorkPtr w;
    if (inflight.empty()) {
      if (!work_q->Pop(&w, std::chrono::hours(24 * 365)).ok()) break;  // closed: stop
    } else if (!work_q->TryPop(&w)) {
      // Nothing fetched yet: finish what is in flight instead of waiting with it.
      if (!finish_oldest()) return;
      continue;
    }
    if (w->epoch_end) {
      // In order with the batches (Note [Epoch continuation]): the next epoch's first batches are
      // submitted while this epoch's last ones are still being decoded.
      inflight.push_back(GpuPending{std::move(w), nullptr});
      continue;
    }
    // GPU Works have no decode tasks (pending is 0 once queued); kept for symmetry.
    if (!WaitDecoded(*w)) return;
    if (stop.load()) break;
    GpuPending p;
    Status s = GpuSubmit(w, &p);
    if (!s.ok()) {
      out_q->Push(s, std::chrono::hours(24 * 365)).IgnoreError();
      return;
    }
    inflight.push_back(std::move(p));
  }
}

Status DataLoader::Impl::GpuSubmit(const WorkPtr& wp, GpuPending* p) {
  const Work& w = *wp;
  const int cams = static_cast<int>(reader->schema().cameras.size());
  const size_t n = w.samples.size();
  std::vector<std::string_view> views;
  auto who = std::make_shared<std::vector<std::pair<int, int>>>();  // (sample, camera) per view
  views.reserve(n * cams);
  who->reserve(n * cams);
  for (size_t i = 0; i < n; ++i) {
    if (!w.sample_status[i].ok()) continue;
    for (int c = 0; c < cams; ++c) {
      views.push_back(w.jpeg[i * cams + c]);
      who->emplace_back(static_cast<int>(i), c);
    }
  }
  // Called on a decoder lane for corrupt images: reads only what stays constant while the Work
  // is in flight (Work and `who` outlive the decode: GpuCollateLoop).
  const Work* wr = &w;
  const std::vector<std::pair<int, int>>* whor = who.get();
  auto name_of = [this, wr, whor](size_t k) {
    return reader->path() + ": record '" +
           SampleKey(wr->samples[(*whor)[k].first], camera_modality[(*whor)[k].second]) + "'";
  };
  p->w = wp;
  p->who = std::move(who);
  ScopedTimerMs timer(h_gpu_decode);
  return decoder->Submit(std::move(views), std::move(name_of));
}

Status DataLoader::Impl::GpuFinish(Work& w, const std::vector<std::pair<int, int>>& who,
                                   std::shared_ptr<Batch>* out) {
  const Schema& sc = reader->schema();
  const int cams = static_cast<int>(sc.cameras.size());
  const size_t n = w.samples.size();
  internal::NvJpegBatchDecoder::Result res;
  {
    ScopedTimerMs timer(h_gpu_wait);
    LF_RETURN_IF_ERROR(decoder->Collect(&res));
  }
  std::vector<internal::DecodedImage>& decoded = res.images;
  std::vector<Status>& dstatus = res.status;
  for (size_t k = 0; k < who.size(); ++k)
    if (!dstatus[k].ok()) w.SetError(static_cast<size_t>(who[k].first), std::move(dstatus[k]));
  // Which samples stay (corrupt policy), the batch's shape, and the compacted output index of
  // each kept sample.
  Stage3Plan plan;
  LF_RETURN_IF_ERROR(PlanStage3(w, &plan));
  std::vector<int> rank(n, -1);
  for (int o = 0; o < plan.n; ++o) rank[plan.keep[o]] = o;
  Slot* slot = w.slot;
  internal::GpuImageTask* tasks = slot->host_tasks;  // pinned: the task copy is truly async
  int nt = 0;
  for (size_t k = 0; k < who.size(); ++k) {
    const auto [i, c] = who[k];
    if (rank[i] < 0) continue;
    const internal::DecodedImage& d = decoded[k];
    internal::GpuImageTask t;
    for (int ch = 0; ch < 3; ++ch) t.plane[ch] = d.plane[ch];
    t.pitch = d.pitch;
    t.pixel_stride = d.pixel_stride;
    t.width = d.width;
    t.height = d.height;
    // Same random stream and draws, in the same order, as DecodeImage() (the CPU path).
    SampleRng rng(opts.seed, w.epoch, w.samples[i], c);
    t.box_w = d.width * opts.crop_fraction;
    t.box_h = d.height * opts.crop_fraction;
    float fx = opts.train ? rng.Uniform() : 0.5f, fy = opts.train ? rng.Uniform() : 0.5f;
    t.box_x0 = std::floor((d.width - t.box_w) * fx);
    t.box_y0 = std::floor((d.height - t.box_h) * fy);
    if (opts.color_jitter) {
      t.jitter = 1;
      t.brightness = rng.Range(0.7f, 1.3f);
      t.contrast = rng.Range(0.6f, 1.4f);
      t.saturation = rng.Range(0.5f, 1.5f);
    }
    t.gray_mean = -1.f;  // computed on the device
    t.out_index = rank[i] * cams + c;
    tasks[nt++] = t;
  }
  c_images->fetch_add(nt);
  {
    ScopedTimerMs timer(h_gpu_submit);
    LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(xform, res.ready, 0));
    LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(xform, slot->released, 0));
    internal::GpuResizeParams p;
    p.out_w = p.out_h = opts.image_size;
    p.out_count = std::max<int>(1, static_cast<int>(n) * cams);
    p.layout =
        opts.layout == ImageLayout::kNHWC ? internal::OutLayout::kNHWC : internal::OutLayout::kNCHW;
    p.dtype = opts.dtype == ImageDType::kBFloat16 ? internal::OutDType::kBFloat16
                                                  : internal::OutDType::kFloat32;
    p.antialias = opts.antialias;
    for (int ch = 0; ch < 3; ++ch) p.mean[ch] = opts.mean[ch], p.std[ch] = opts.std[ch];
    LF_RETURN_IF_ERROR(internal::LaunchCropResizeNormalize(tasks, nt, slot->dev_tasks, p,
                                                           slot->dev_batch.images, xform));
    LF_RETURN_IF_ERROR(decoder->ReleaseAfter(xform));
  }
  // Static shapes: rows past the kept samples are zero images.
  if (plan.rows > plan.n) {
    const size_t img_bytes = static_cast<size_t>(cams) * 3 * opts.image_size * opts.image_size *
                             (opts.dtype == ImageDType::kBFloat16 ? 2 : 4);
    LF_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(reinterpret_cast<uint8_t*>(slot->dev_batch.images) + plan.n * img_bytes, 0,
                        (plan.rows - plan.n) * img_bytes, xform));
  }
  // Stage 3 (Note [Stage 3 staging]), ordered after the slot's `released` wait above.
  if (tuning.stage3_device) {
    // Raw ids, lengths and records only; the kernel pads, masks and normalizes on the device.
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot->dev_raw, slot->raw, s3.Bytes(plan.total_tokens),
                                            cudaMemcpyHostToDevice, xform));
    internal::Stage3Out o3;
    o3.tokens = slot->dev_batch.tokens;
    o3.attention_mask = slot->dev_batch.attention_mask;
    o3.state = slot->dev_batch.state;
    o3.action = slot->dev_batch.action;
    o3.action_mask = slot->dev_batch.action_mask;
    o3.sample_index = slot->dev_batch.sample_index;
    LF_RETURN_IF_ERROR(internal::LaunchStage3(s3, slot->dev_raw, Dims(plan), o3, xform));
  } else {
    // A/B switch off: the CPU twin into the pinned staging of the arrays, then one copy.
    internal::Stage3Out o3;
    const Batch& hb = slot->batch;
    o3.tokens = hb.tokens;
    o3.attention_mask = hb.attention_mask;
    o3.state = hb.state;
    o3.action = hb.action;
    o3.action_mask = hb.action_mask;
    o3.sample_index = hb.sample_index;
    internal::Stage3Reference(s3, slot->raw, Dims(plan), o3);
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot->dev_tail, slot->host_tail, slot->tail_bytes,
                                            cudaMemcpyHostToDevice, xform));
  }
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->ready, xform));
  Publish(w, plan, out);
  return Status::Ok();
}
#endif  // LOONGFORGE_WITH_NVJPEG

// ---------------------------------------------------------------------------------------------
// DataLoader

bool DataLoader::GpuSupport(int device_id, std::string* reason) {
#if !defined(LOONGFORGE_WITH_CUDA)
  *reason = "this build has no CUDA";
  return false;
#elif !defined(LOONGFORGE_WITH_NVJPEG)
  *reason = "this build has no nvJPEG (nvjpeg.h / libnvjpeg not found at configure time)";
  return false;
#else
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    *reason = std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
    return false;
  }
  if (device_id < 0 || device_id >= n) {
    *reason = "CUDA device " + std::to_string(device_id) + " does not exist (" + std::to_string(n) +
              " devices)";
    return false;
  }
  *reason = "CUDA and nvJPEG available";
  return true;
#endif
}

StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(const LoaderOptions& o) {
  if (o.batch_size <= 0) return InvalidArgumentError("batch_size must be > 0");
  if (o.image_size <= 0 || o.image_size > 4096)
    return InvalidArgumentError("image_size out of range");
  if (!(o.crop_fraction > 0.f && o.crop_fraction <= 1.f))
    return InvalidArgumentError("crop_fraction must be in (0, 1]");
  if (o.threads <= 0) return InvalidArgumentError("threads must be > 0");
  if (o.prefetch <= 0) return InvalidArgumentError("prefetch must be > 0");
  for (int c = 0; c < 3; ++c)
    if (!(o.std[c] > 0)) return InvalidArgumentError("normalize std must be > 0");
  if (!(o.hw_decode_ratio <= 1.f)) return InvalidArgumentError("hw_decode_ratio must be <= 1");
  if (o.token_pad < 0) return InvalidArgumentError("token_pad must be >= 0");
  std::vector<int> buckets = o.token_buckets;
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  if (!buckets.empty() && buckets.front() <= 0)
    return InvalidArgumentError("token_buckets must be positive lengths");
  if (!buckets.empty() && o.token_pad > 0)
    return InvalidArgumentError(
        "token_pad and token_buckets are exclusive (token_pad=N is token_buckets=[N])");
  LF_ASSIGN_OR_RETURN(TuningSwitches tuning, ReadTuningSwitches());
  const bool gpu = o.device == LoaderDevice::kCuda;
  if (!gpu && (o.layout != ImageLayout::kNCHW || o.dtype != ImageDType::kFloat32 || o.antialias))
    return InvalidArgumentError(
        "layout NHWC, dtype bfloat16 and antialias need device=cuda (the CPU loader writes "
        "float32 NCHW)");
  if (gpu) {
    std::string why;
    if (!GpuSupport(o.device_id, &why)) return UnavailableError("loader: device=cuda: " + why);
  }
  std::unique_ptr<DataLoader> dl(new DataLoader());
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  // Readers: decode threads do not open transactions; fetch holds up to prefetch + 2 at once.
  LF_ASSIGN_OR_RETURN(impl->reader, RecordReader::Open(o.db_path, 2 * o.prefetch + 16));
  const Schema& sc = impl->reader->schema();
  SamplerOptions so;
  so.num_samples = sc.num_samples;
  so.batch_size = o.batch_size;
  so.seed = o.seed;
  so.rank = o.rank;
  so.world_size = o.world_size;
  so.shuffle = o.shuffle;
  so.drop_last = o.drop_last;
  auto sampler = Sampler::Create(so);
  if (!sampler.ok()) return sampler.status().WithContext(o.db_path);
  impl->sampler.emplace(std::move(sampler).value());
  impl->tuning = tuning;
  // Note [Static batches]
  impl->static_shapes = o.static_shapes || !buckets.empty();
  if (impl->static_shapes && buckets.empty())
    buckets.push_back(o.token_pad > 0 ? o.token_pad : std::max(1, sc.max_tokens));
  impl->buckets = buckets;
  impl->max_tokens = std::max(1, sc.max_tokens);
  if (o.token_pad > 0) impl->max_tokens = o.token_pad;
  if (impl->static_shapes) impl->max_tokens = buckets.back();
  impl->truncate_ok = o.truncate_tokens && (impl->static_shapes || o.token_pad > 0);
  if ((impl->static_shapes || o.token_pad > 0) && sc.max_tokens > impl->max_tokens &&
      !o.truncate_tokens)
    return InvalidArgumentError(
        std::string(impl->static_shapes ? "largest token bucket " : "token_pad ") +
        std::to_string(impl->max_tokens) + " is shorter than the longest instruction in " +
        o.db_path + " (" + std::to_string(sc.max_tokens) +
        " tokens): add a longer bucket or set truncate_tokens");
  // State/action statistics, staged with every batch (std ~0: leave the dimension centred).
  impl->normalize = o.normalize_state && sc.state_mean.size() == size_t(sc.state_dim) &&
                    sc.state_std.size() == size_t(sc.state_dim) &&
                    sc.action_mean.size() == size_t(sc.action_dim) &&
                    sc.action_std.size() == size_t(sc.action_dim);
  if (impl->normalize) {
    auto& ns = impl->norm_stats;
    auto eff = [](float s) { return s > 1e-6f ? s : 1.f; };
    ns.insert(ns.end(), sc.state_mean.begin(), sc.state_mean.end());
    for (float s : sc.state_std) ns.push_back(eff(s));
    ns.insert(ns.end(), sc.action_mean.begin(), sc.action_mean.end());
    for (float s : sc.action_std) ns.push_back(eff(s));
  }
  impl->s3 = internal::Stage3Layout::Make(o.batch_size, impl->max_tokens, sc.state_dim,
                                          sc.action_dim, sc.action_horizon);
  for (const auto& c : sc.cameras) impl->camera_modality.push_back(CameraModality(c));
  bool pin = o.pin_memory;
#ifndef LOONGFORGE_WITH_CUDA
  if (pin) LF_LOG(INFO) << "pin_memory requested but this build has no CUDA: using pageable memory";
  pin = false;
#endif
  impl->gpu = gpu;
  impl->pool = std::make_shared<SlotPool>(
      o.batch_size, static_cast<int>(sc.cameras.size()), o.image_size, impl->max_tokens,
      sc.state_dim, sc.action_dim, sc.action_horizon, pin && !gpu, gpu,
      o.dtype == ImageDType::kBFloat16 ? 2 : 4, impl->s3.capacity_bytes);
  // Enough queued decode tasks to keep every worker busy across two batches. (GPU: the pool only
  // decodes the images nvJPEG cannot.)
  size_t task_cap = static_cast<size_t>(o.batch_size) * sc.cameras.size() * 2;
  impl->decode_pool = std::make_unique<ThreadPool>(o.threads, "lf-decode", task_cap);
  impl->cpu_info.reason = "device=cpu: libjpeg-turbo on " + std::to_string(o.threads) + " threads";
#ifdef LOONGFORGE_WITH_NVJPEG
  if (gpu) {
    LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device_id));
    internal::NvJpegDecoderOptions dopt;
    dopt.device = o.device_id;
    dopt.allow_hardware = o.hw_decode;
    dopt.hw_ratio = o.hw_decode_ratio;
    dopt.cpu_pool = impl->decode_pool.get();
    dopt.timeout_ms = o.timeout_ms;
    dopt.async = tuning.async_decode;
    dopt.lanes = tuning.async_decode ? tuning.decode_lanes : 2;
    dopt.reuse_state = tuning.decode_reuse;
    dopt.hw_handle_per_lane = tuning.hw_handle_per_lane;
    dopt.interleaved = tuning.interleaved;
    dopt.stagger = tuning.decode_stagger;
    LF_ASSIGN_OR_RETURN(impl->decoder, internal::NvJpegBatchDecoder::Create(dopt));
    LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->xform, cudaStreamNonBlocking));
    // Slots for every batch that can be in flight: lf-fetch's, work_q, lf-collate's (one per
    // decode lane with async_decode), out_q and two held by the consumer. More are allocated on
    // demand.
    const int collating = tuning.async_decode ? tuning.decode_lanes : 1;
    if (tuning.reserve) LF_RETURN_IF_ERROR(impl->pool->Reserve(2 * o.prefetch + 3 + collating));
    // Host time handing a batch to the decoder (async_decode off: the whole decode) and waiting
    // for its decoded images.
    impl->h_gpu_decode = impl->metrics.GetHistogram("gpu_decode_submit_ms");
    impl->h_gpu_wait = impl->metrics.GetHistogram("gpu_decode_wait_ms");
    impl->h_gpu_submit = impl->metrics.GetHistogram("gpu_kernel_submit_ms");
  }
#endif
  auto& m = impl->metrics;
  impl->h_fetch = m.GetHistogram("fetch_ms");
  if (gpu) impl->h_prefault = m.GetHistogram("fetch_prefault_ms");
  impl->h_acquire = m.GetHistogram("fetch_slot_ms");
  impl->c_slots_grown = m.GetCounter("slots_allocated_on_demand");
  impl->h_decode = m.GetHistogram("decode_ms");
  impl->h_collate = m.GetHistogram("collate_ms");
  impl->h_latency = m.GetHistogram("batch_latency_ms");
  impl->h_wait = m.GetHistogram("consumer_wait_ms");
  impl->c_images = m.GetCounter("images_decoded");
  impl->c_batches = m.GetCounter("batches");
  impl->c_corrupt = m.GetCounter("corrupt_skipped");
  impl->c_bytes = m.GetCounter("record_bytes_read");
  dl->impl_ = std::move(impl);
  return dl;
}

DataLoader::~DataLoader() {
  if (!impl_) return;
  impl_->StopThreads();
  impl_->decode_pool->Shutdown();  // runs (cancelled) tasks still queued, joins the workers
}

const Schema& DataLoader::schema() const { return impl_->reader->schema(); }
int64_t DataLoader::batches_per_epoch() const { return impl_->sampler->batches_per_epoch(); }
int64_t DataLoader::epoch() const { return impl_->epoch; }
int64_t DataLoader::next_batch() const { return impl_->next_batch; }
const std::vector<int>& DataLoader::token_buckets() const { return impl_->buckets; }
MetricsRegistry& DataLoader::metrics() { return impl_->metrics; }
int64_t DataLoader::corrupt_skipped() const { return impl_->c_corrupt->load(); }

Status DataLoader::Start(int64_t epoch, int64_t start_batch) {
  Impl& im = *impl_;
  // The pipeline is already fetching this epoch (Note [Epoch continuation]).
  if (im.running && im.finished && !im.failed && epoch == im.epoch + 1 && start_batch == 0) {
    im.epoch = epoch;
    im.next_batch = 0;
    im.finished = false;
    return Status::Ok();
  }
  im.StopThreads();
  if (epoch < 0) return InvalidArgumentError("epoch must be >= 0");
  if (start_batch < 0 || start_batch > batches_per_epoch())
    return OutOfRangeError("start batch " + std::to_string(start_batch) + " outside epoch of " +
                           std::to_string(batches_per_epoch()) + " batches");
  im.stop = false;
  im.finished = false;
  im.failed = false;
  im.epoch = epoch;
  im.next_batch = start_batch;
  im.work_q = std::make_unique<BoundedQueue<WorkPtr>>(im.opts.prefetch, "lf-work");
  im.out_q = std::make_unique<BoundedQueue<Output>>(im.opts.prefetch, "lf-out");
  im.fetch_thread = std::thread([&im, epoch, start_batch] { im.FetchLoop(epoch, start_batch); });
  pthread_setname_np(im.fetch_thread.native_handle(), "lf-fetch");
  im.collate_thread =
      std::thread([&im, epoch, start_batch] { im.CollateLoop(epoch, start_batch); });
  pthread_setname_np(im.collate_thread.native_handle(), "lf-collate");
  im.running = true;
  return Status::Ok();
}

StatusOr<std::shared_ptr<Batch>> DataLoader::Next() {
  Impl& im = *impl_;
  if (!im.running) return FailedPreconditionError("loader: Next() before Start()");
  if (im.finished) return OutOfRangeError("end of epoch");
  Output item = OutOfRangeError("end of epoch");
  {
    ScopedTimerMs timer(im.h_wait);
    Status s = im.out_q->Pop(&item, im.timeout());
    if (!s.ok()) {
      im.finished = true;
      im.failed = true;
      if (s.code() == StatusCode::kDeadlineExceeded)
        return DeadlineExceededError("loader: no batch within " +
                                     std::to_string(im.opts.timeout_ms) + " ms");
      return s;
    }
  }
  if (!item.ok()) {
    im.finished = true;
    if (item.status().code() != StatusCode::kOutOfRange) im.failed = true;
    return item.status();
  }
#ifdef LOONGFORGE_WITH_CUDA
  if ((*item)->ready_event) {  // GPU: hand out complete batches only (Note [GPU loader])
    ScopedTimerMs timer(im.h_wait);
    Status s =
        internal::WaitEvent(static_cast<cudaEvent_t>((*item)->ready_event), im.opts.timeout_ms,
                            "loader: batch " + std::to_string((*item)->index));
    if (!s.ok()) {
      im.finished = true;
      im.failed = true;
      return s;
    }
  }
#endif
  im.next_batch = (*item)->index + 1;
  im.c_corrupt->fetch_add((*item)->corrupt_skipped);
  return item;
}

LoaderDeviceInfo DataLoader::device_info() const {
  LoaderDeviceInfo info = impl_->cpu_info;
#ifdef LOONGFORGE_WITH_NVJPEG
  if (impl_->decoder) {
    internal::NvJpegDecoderInfo d = impl_->decoder->info();
    info.gpu = true;
    info.hw_decode = d.hw_available && d.hw_ratio > 0.f;
    info.decode_backend = "nvjpeg:" + d.backend;
    info.reason = d.reason;
    info.hw_ratio = d.hw_ratio;
    info.ratio_measured = d.ratio_measured;
    info.images_hw = d.images_hw;
    info.images_cuda = d.images_cuda;
    info.images_cpu = d.images_cpu;
    info.stage3_on_device = impl_->tuning.stage3_device;
    info.decode_lanes = d.async ? d.lanes : 1;
    info.decode_stagger = d.stagger;
    info.decoded_batches = d.batches;
    info.decode_release_wait_ms = d.release_wait_ms;
    info.decode_prepare_ms = d.prepare_ms;
    info.decode_turn_wait_ms = d.turn_wait_ms;
    info.decode_call_ms = d.call_ms;
  }
#endif
  return info;
}

void DataLoader::SetConsumerStream(void* stream) { impl_->pool->SetConsumerStream(stream); }

void DataLoader::Stop() { impl_->StopThreads(); }

}  // namespace loongforge
