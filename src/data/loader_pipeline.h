// The loader's pipeline and the interface of its decode stages (Note [Loader pipeline] in
// loader.cc). The pipeline (loader.cc) samples, looks records up, stages stage 3's inputs and
// orders batches; a DecodeStage turns a looked-up batch into a published one:
//   CpuStage (loader_cpu_stage.cc): libjpeg-turbo decode tasks on the lf-decode pool, CPU image
//            ops and the stage-3 CPU twin, batches in host memory;
//   GpuStage (loader_gpu_stage.cc, builds with nvJPEG; loader_gpu_stage_stub.cc otherwise):
//            nvJPEG decode lanes, the fused image kernel and the stage-3 kernel, batches in
//            device memory (Note [GPU loader]).
// Batch buffers live in Slots allocated by the stage's SlotMemory, which the SlotPool owns: a
// published batch may outlive the loader, so the memory's owner must too.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "collate.h"
#include "common/queue.h"
#include "common/thread_pool.h"
#include "loongforge/dataset.h"
#include "loongforge/loader.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace data {
namespace internal {

inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Per-(seed, epoch, sample, camera) random stream for augmentation: the same sample in the same
// epoch always gets the same crop and jitter, whichever thread or stage decodes it.
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

// Memory for one batch at its maximum size. A stage may derive from it to keep its own buffers
// (the GPU stage's device copy and events).
struct Slot {
  virtual ~Slot() = default;
  size_t bytes = 0;
  uint8_t* base = nullptr;
  bool pinned = false;
  Batch batch;                 // pointers into base
  uint8_t* raw = nullptr;      // stage 3 staging (Note [Collate staging]); pinned on the GPU path
  Batch* published = nullptr;  // what the consumer gets: &batch, or the stage's device copy
};

// Sizes of one batch's arrays, and their layout (every array 256-byte aligned).
struct SlotShape {
  int b = 0, k = 0, l = 0, s = 0, a = 0, h = 0;  // rows, cameras, tokens, state, action, horizon
  int ih = 0, iw = 0;                            // image height, width
  size_t image_elem = 4;                         // bytes per image element
  size_t raw = 0;                                // stage 3 staging bytes (aligned)

  static size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }
  // Points b's non-image arrays into p (the layout both host and device copies use).
  void LayoutTail(uint8_t* p, Batch* out) const;
  size_t TailBytes() const;
};

// Allocates and frees the slots of one stage. Shared by the SlotPool (and so by every published
// batch): it lives as long as the last slot.
class SlotMemory {
 public:
  virtual ~SlotMemory() = default;
  virtual StatusOr<Slot*> Allocate(const SlotShape& shape) = 0;
  virtual void Free(Slot* s) = 0;
  // A published slot came back from the consumer, whose work is queued on `consumer_stream`
  // (GPU: Note [GPU loader], the slot's reuse waits for that work).
  virtual void Released(Slot* s, void* consumer_stream) {}
};

class SlotPool {
 public:
  SlotPool(const SlotShape& shape, std::shared_ptr<SlotMemory> memory)
      : shape_(shape), memory_(std::move(memory)) {}
  ~SlotPool();

  StatusOr<Slot*> Acquire();
  // Allocates slots up front (the pool still grows on demand past `n`), so the first batches of a
  // run do not pay for cudaMalloc/cudaHostAlloc on the pipeline's threads.
  Status Reserve(int n);
  void Release(Slot* s);
  void SetConsumerStream(void* stream) { consumer_stream_ = stream; }
  // A slot that never held a published batch (no consumer event to record).
  void ReturnUnused(Slot* s);
  size_t allocated_bytes() const;
  int slots() const;

 private:
  const SlotShape shape_;
  std::shared_ptr<SlotMemory> memory_;
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
  std::vector<std::string_view> task;  // per sample (Note [Task text]); empty without a source
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
struct CollatePlan {
  std::vector<int> keep;  // raw rows kept, in order (output row o <- keep[o])
  int dropped = 0, n = 0, rows = 0, len = 1, bucket = -1;
  int64_t total_tokens = 0;  // staged token ids of the whole batch
};

struct Pipeline;

// Stage 2 and the device side of stage 3: what differs between the CPU and the GPU loader.
// Called by the pipeline's threads as noted; a stage holds a reference to its Pipeline, which
// outlives it.
class DecodeStage {
 public:
  virtual ~DecodeStage() = default;
  // On lf-fetch, before its first batch (GPU: the thread's CUDA device).
  virtual void FetchThreadStart() {}
  // On lf-fetch, once a batch's records are looked up and staged; counted in fetch_ms.
  virtual void Fetched(Work& w) {}
  // On lf-fetch, after Fetched: sets w->pending to the decode tasks queued + 1 (the pipeline
  // drops the 1 once the batch is queued) and queues the tasks. false: the loader is shutting
  // down (w is cancelled and not queued).
  virtual bool QueueDecode(const WorkPtr& w) = 0;
  // lf-collate's loop: pops Work from work_q in sampler order, finishes each batch and pushes it
  // (or the error that stops the pipeline, or the end-of-epoch marker) to out_q.
  virtual void CollateLoop() = 0;
  // On the consumer's thread in Next(): waits (with the timeout) until `b` may be read.
  virtual Status WaitReady(const Batch& b) { return Status::Ok(); }
  // After the pipeline's threads stopped: no work of the stage stays queued on a device.
  virtual void Sync() {}
  virtual void FillInfo(LoaderDeviceInfo* info) const {}
};

// The CPU stage (libjpeg-turbo) and its slot memory (pageable, or pinned when `pin` and the build
// has CUDA).
std::unique_ptr<DecodeStage> CreateCpuStage(Pipeline& p);
std::shared_ptr<SlotMemory> CreateHostSlotMemory(bool pin);
// Page-locked host memory where the build has CUDA (cudaHostAlloc); nullptr otherwise or when the
// allocation fails. PinnedAvailable: whether this build can pin at all.
bool PinnedAvailable();
void* AllocPinned(size_t bytes);
void FreePinned(void* p);

// The GPU stage (nvJPEG) and its slot memory; Unavailable in builds without nvJPEG.
// GpuStageSupport: DataLoader::GpuSupport().
StatusOr<std::unique_ptr<DecodeStage>> CreateGpuStage(Pipeline& p);
std::shared_ptr<SlotMemory> CreateGpuSlotMemory(const LoaderOptions& o);
bool GpuStageSupport(int device_id, std::string* reason);

// The loader's state: options, record reader, sampler, queues, threads and metrics (Note [Loader
// pipeline]). Stage 1 and the parts of stage 3 every stage shares live here (loader.cc).
struct Pipeline {
  LoaderOptions opts;
  std::unique_ptr<RecordReader> reader;
  std::optional<Sampler> sampler;
  int max_tokens = 0;  // token capacity of a row: token_pad, the largest bucket or the schema's
  std::vector<int> buckets;  // Note [Static batches]
  bool static_shapes = false;
  bool truncate_ok = false;       // longer instructions are cut to max_tokens
  bool normalize = false;         // state/action normalized (Note [State normalization])
  bool clip_norm = false;         // ... and clamped to [-1, 1] (q01_q99)
  std::vector<float> norm_stats;  // staged with every batch: centre_s, scale_s, centre_a, scale_a
  CollateLayout s3;
  std::vector<std::string> camera_modality;
  // Note [Task text]: where each sample's text comes from; kLeRobot: task_index -> text.
  enum class TaskSource { kNone, kRecord, kLeRobot };
  TaskSource task_source = TaskSource::kNone;
  std::map<int64_t, std::string> lerobot_tasks;
  std::shared_ptr<SlotPool> pool;
  std::unique_ptr<ThreadPool> decode_pool;
  MetricsRegistry metrics;
  Histogram *h_fetch, *h_decode, *h_collate, *h_latency, *h_wait;
  Histogram* h_acquire = nullptr;                 // the part of fetch_ms spent getting a slot
  std::atomic<int64_t>* c_slots_grown = nullptr;  // slots allocated after Create
  std::atomic<int64_t>*c_images, *c_batches, *c_corrupt, *c_bytes;
  std::atomic<int64_t> tasks_in_flight{0};  // decode tasks queued or running
  // Note [Held by]: batches (not epoch markers) since the pipeline started that got a buffer,
  // left stage 1 and were published; and how many the consumer took (Next()'s thread only).
  std::atomic<int64_t> seq_started{0}, seq_read{0}, seq_published{0};
  int64_t seq_consumed = 0;
  RateLimiter corrupt_log{2000};
  int64_t consecutive_corrupt =
      0;                  // lf-collate: corrupt samples in a row (max_consecutive_corrupt)
  pid_t creator_pid = 0;  // Note [A loader across fork]

  std::unique_ptr<BoundedQueue<WorkPtr>> work_q;
  std::unique_ptr<BoundedQueue<Output>> out_q;
  std::thread fetch_thread, collate_thread;
  std::atomic<bool> stop{false};
  bool running = false;
  bool finished = false;  // end of epoch or error delivered
  bool failed = false;    // an error was delivered: the pipeline must restart
  int64_t epoch = 0, next_batch = 0;

  LoaderDeviceInfo cpu_info;
  // Last member: destroyed first, while the pools and the reader it uses are still alive.
  std::unique_ptr<DecodeStage> stage;

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(opts.timeout_ms); }

  void FetchLoop(int64_t ep, int64_t start);
  // Waits (with the timeout) until w's decode tasks finished or the loader stops; false after a
  // DeadlineExceeded naming the batch was delivered to the consumer.
  bool WaitDecoded(Work& w);
  void PackCollate(Work& w);
  Status PlanCollate(Work& w, CollatePlan* p);
  CollateDims Dims(const CollatePlan& p) const;
  void Publish(Work& w, const CollatePlan& p, std::shared_ptr<Batch>* out);
  void StopThreads();
};

}  // namespace internal
}  // namespace data
}  // namespace loongforge
