// MemSculptor: planned memory for training steps (ARCHITECTURE.md, MemSculptor).
//
// Four layers, each usable on its own and all plain C++ over an address range (so they run and are
// tested on a CPU; the CUDA backing is one implementation of MemoryBackend/StreamFence):
//
//   Trace        one or more steps of alloc/free events (size, order, stream, time) -> a lifetime
//                table per step. Captured by MemAllocator, or built from torch's memory snapshot
//                (python/loongforge/memory.py converts it).
//   Planner      offline offset assignment for one step's lifetimes: best of greedy-by-size
//                (best-fit gaps) and greedy-by-breadth; reports the lower bound (max live bytes).
//   MemAllocator a planned arena that serves a step's allocations in recorded order in O(1) while
//                the step matches its plan, and a pooled best-fit allocator (splitting, coalescing,
//                512 B alignment, persistent vs transient pools, stream-safe reuse) for the rest.
//   Backends     HostBackend (a malloc'd range standing in for device memory) and CpuFence (a
//                counter-based fence) on the CPU; CudaBackend (cudaMalloc'd segments) and CudaFence
//                (cudaEvent) with CUDA.
//
// See Note [Planned arena safety] in src/memory/allocator.cc for why a planned step cannot hand out
// overlapping live memory even when the live step diverges from the recorded one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loongforge/metrics.h"
#include "loongforge/status.h"

namespace loongforge {
namespace mem {

// A stream handle as an integer (cudaStream_t cast to uintptr_t; 0 is the default stream).
using StreamId = uint64_t;

// Every block size and offset is a multiple of this.
inline constexpr size_t kAlignBytes = 512;
inline size_t RoundUp(size_t bytes) {
  return bytes == 0 ? kAlignBytes : (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}

// ----------------------------------------------------------------------------------------------
// Trace
// ----------------------------------------------------------------------------------------------

struct TraceEvent {
  enum Kind : uint8_t { kAlloc = 0, kFree = 1, kStep = 2 };
  Kind kind = kAlloc;
  uint64_t id = 0;      // allocation id, unique within the trace (not an address: addresses recur)
  int64_t size = 0;     // requested bytes (kAlloc only)
  StreamId stream = 0;  // stream of the allocation (kAlloc) or of the free (kFree)
  int64_t time_ns = 0;  // caller's clock; only differences are meaningful
  std::string signature;  // kStep only: the shape signature of the step that begins here
};

// One allocation of one step. Sequence numbers count events within the step (allocs and frees),
// so [alloc_seq, free_seq) is the allocation's lifetime in the step's event order.
struct Lifetime {
  uint64_t id = 0;
  int64_t size = 0;  // requested bytes
  StreamId stream = 0;
  int64_t alloc_seq = 0;
  int64_t free_seq = 0;  // == LifetimeTable::num_events when not freed in this step
  bool freed_in_step = false;
  // Not freed in this step and still live at the end of the next recorded step: a persistent
  // tensor made during a step (gradients and optimizer state on the first training step), not a
  // carry (Note [Carry zones] in src/memory/planner.cc). Plans leave it to the pool.
  bool persistent = false;
  int64_t alloc_ns = 0, free_ns = 0;  // free_ns = -1 when not freed in this step
};

// Outlives its step but is freed in the next one (Note [Carry zones]).
inline bool IsCarry(const Lifetime& lt) { return !lt.freed_in_step && !lt.persistent; }

struct LifetimeTable {
  int step = 0;
  std::string signature;
  int64_t num_events = 0;        // allocs + frees in this step
  std::vector<Lifetime> allocs;  // in allocation order
  // Frees in this step of allocations made before it (persistent tensors, last step's outputs).
  int64_t foreign_frees = 0;
  // Sequence number of the last such free (-1 when none): until then the previous step's carried
  // tensors are live (Note [Carry zones] in src/memory/planner.cc).
  int64_t last_foreign_free_seq = -1;
};

// An alloc/free trace over one or more steps. Not thread-safe (MemAllocator locks around it).
class Trace {
 public:
  // Starts a new step; events before the first MarkStep belong to step 0 (signature "").
  void MarkStep(const std::string& signature = "", int64_t time_ns = 0);
  void AddAlloc(uint64_t id, int64_t size, StreamId stream, int64_t time_ns);
  void AddFree(uint64_t id, StreamId stream, int64_t time_ns);

  const std::vector<TraceEvent>& events() const { return events_; }
  size_t size() const { return events_.size(); }
  void Clear() { events_.clear(); }
  // Drops the events from index `size` on (a step abandoned after running out of memory: Note
  // [Out of memory in a step] in src/memory/allocator.cc). No-op when `size` >= size().
  void Truncate(size_t size) {
    if (size < events_.size()) events_.resize(size);
  }

  // One table per step (steps without events are dropped). Errors (InvalidArgument, naming the
  // event index): an id allocated twice while live, a negative size. A free of an id never
  // allocated in the trace is counted in foreign_frees (it was allocated before recording began).
  StatusOr<std::vector<LifetimeTable>> Lifetimes() const;

  // Text form, one event per line: "a ID SIZE STREAM TIME_NS", "f ID STREAM TIME_NS",
  // "s TIME_NS SIGNATURE". Parse errors name the line.
  std::string ToText() const;
  static StatusOr<Trace> FromText(const std::string& text);

  // A trace file: the text form, plain or zstd-compressed (told apart by zstd's magic number, so
  // the file name does not matter; ".trace.zst" by convention). Errors: NotFound (cannot open),
  // DataLoss (a corrupt or truncated zstd frame), InvalidArgument (a bad line, named); each names
  // the path.
  static StatusOr<Trace> Load(const std::string& path);
  // Writes the text form to `path`, zstd-compressed (level 19: traces are written once, read
  // often) when `compress`, through a temporary file renamed into place. Internal on I/O errors.
  Status Save(const std::string& path, bool compress) const;

 private:
  std::vector<TraceEvent> events_;
};

// ----------------------------------------------------------------------------------------------
// Planner
// ----------------------------------------------------------------------------------------------

// Offset for allocations the plan does not place (they outlive the step: served by the pool).
inline constexpr int64_t kNotPlanned = -1;

struct Plan {
  std::string signature;
  std::string algorithm;  // "greedy_by_size" or "greedy_by_breadth"
  // Per allocation, in allocation order.
  std::vector<int64_t> sizes;  // rounded bytes (RoundUp of the requested size)
  std::vector<StreamId> streams;
  std::vector<int64_t> offsets;  // kNotPlanned for allocations not freed in the step
  // Events each allocation lived in the recorded step (free_seq - alloc_seq; to the step's end
  // for those not freed in it): a lifetime forecast for the pool once a step diverged
  // (Note [Lifetime-guided fallback] in src/memory/allocator.cc).
  std::vector<int64_t> lifetimes;
  // Event sequence number of each allocation in the recorded step (allocs and frees counted from
  // the step's start): tells a live step's structure apart at a branch (Note [Sibling plans]).
  std::vector<int64_t> alloc_seqs;
  // For allocation k: earlier planned allocations whose address ranges overlap k's. They must all
  // be freed before k is handed out (Note [Planned arena safety]).
  std::vector<std::vector<int32_t>> must_be_free;
  int64_t peak_bytes = 0;         // arena size
  int64_t lower_bound_bytes = 0;  // max over time of live planned bytes (no plan can beat it)
  int64_t other_peak_bytes = 0;   // the peak of the algorithm not chosen
  // Note [Carry zones] (src/memory/planner.cc): allocations that outlive the step ("carries") are
  // placed in zone `carry_zone` (0 or 1) of two zones of `carry_zone_bytes` at the bottom of the
  // arena, [z * carry_zone_bytes, (z + 1) * carry_zone_bytes); the other zone holds the previous
  // step's carries until its last foreign free. -1: carries are not placed (the pool serves them).
  int carry_zone = -1;
  int64_t carry_zone_bytes = 0;
  std::vector<uint8_t> carries;  // per allocation: 1 when it outlives the step (empty: none)
  // The same step planned with its carries in the other zone (null without carry zones): the
  // allocator alternates the two so a step's carries never land on the previous step's.
  std::shared_ptr<const Plan> mirror;
  // Note [Sibling plans] (src/memory/planner.cc): plans of the same signature for steps of other
  // structures (say, a workspace allocated only above some load), planned together with this
  // one and set on it (a group's first plan): each allocation that is live where two structures
  // branch has the same offset in both, so a step can switch plans there.
  std::vector<std::shared_ptr<const Plan>> siblings;
  // The most leading slots two members of the group have in common (same offset, size, stream):
  // up to there the step still chooses among them.
  int64_t sibling_prefix = 0;
  // (peak - lower bound) / lower bound; 0 when lower bound is 0.
  double overhead() const {
    return lower_bound_bytes > 0
               ? static_cast<double>(peak_bytes - lower_bound_bytes) / lower_bound_bytes
               : 0.0;
  }
};

// Envelope plans (Note [Envelope plans] in src/memory/planner.cc). Two steps have the same
// structure when they have as many events and allocation k has the same lifetime [alloc_seq,
// free_seq), freed_in_step and stream in both: only sizes differ (an MoE layer whose experts get
// other token counts, a ragged batch under one padding bucket).
// What PlanSignature (src/memory/planner.h) gives for one signature.
struct SignaturePlan {
  Plan plan;  // planned over `envelope`
  // The base step (the one with the most live bytes), each size widened to the largest of the
  // merged steps.
  LifetimeTable envelope;
  int merged_steps = 0;  // steps covered by the base plan (the base and same-structure steps)
  int structures = 0;    // step structures planned: the base plan and its siblings
  // The largest peak among the plan, its siblings and its mirror's group: the arena it needs.
  int64_t group_peak_bytes = 0;
  // The tables plan.siblings[j] were planned over (for CheckPlan), in order.
  std::vector<LifetimeTable> sibling_envelopes;
  int total_steps = 0;  // steps given
  // Largest LowerBoundBytes among all the steps given (the base's): what the arena must hold.
  // With carry zones, carries count (LowerBoundBytes(t, true)).
  int64_t max_step_lower_bound_bytes = 0;
};

// Plans keyed by shape signature (e.g. the padding bucket), bounded by `max_plans` (0 = no bound):
// putting a new signature into a full cache evicts the least recently used one (Get and Put both
// count as a use). Thread-safe.
class PlanCache {
 public:
  explicit PlanCache(size_t max_plans = 0) : max_plans_(max_plans) {}
  void Put(Plan plan);
  // nullptr when absent. Marks the entry as recently used. The plan stays valid for as long as the
  // caller holds the pointer, even if it is evicted or replaced meanwhile.
  std::shared_ptr<const Plan> Get(const std::string& signature) const;
  bool Contains(const std::string& signature) const;  // does not count as a use
  std::vector<std::string> Signatures() const;        // sorted
  size_t size() const;
  size_t max_plans() const;
  // Changes the bound; evicts least recently used entries beyond it.
  void set_max_plans(size_t max_plans);
  int64_t evictions() const;
  // The largest peak_bytes among the cached plans (0 when empty): the arena every plan fits in.
  int64_t MaxPeakBytes() const;

 private:
  struct Entry {
    std::shared_ptr<const Plan> plan;
    uint64_t last_use = 0;
  };
  void EvictLocked();
  mutable std::mutex mu_;
  size_t max_plans_;
  mutable uint64_t clock_ = 0;
  int64_t evictions_ = 0;
  mutable std::map<std::string, Entry> plans_;
};

// ----------------------------------------------------------------------------------------------
// Backends: where segments come from, and how a stream says "I have passed this point".
// ----------------------------------------------------------------------------------------------

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // Returns `bytes` (a multiple of kAlignBytes) of memory aligned to kAlignBytes, or
  // ResourceExhausted. Called with the allocator lock held.
  virtual StatusOr<void*> Reserve(size_t bytes) = 0;
  // Returns a segment. Streams may still be using it: the backend makes that safe (cudaFree
  // synchronizes the device; host memory has no streams).
  virtual void Release(void* ptr, size_t bytes) = 0;
  virtual std::string Name() const = 0;
};

// Host memory standing in for a device: one malloc'd range of `capacity_bytes`, carved into
// segments first-fit (released segments are reused). Exhaustion beyond the capacity is
// ResourceExhausted, as cudaMalloc's would be.
std::unique_ptr<MemoryBackend> CreateHostBackend(size_t capacity_bytes);

// A token for "the stream has passed the point where this was recorded".
struct FenceToken {
  StreamId stream = 0;
  uint64_t value = 0;      // 0 = no fence (always passed)
  void* handle = nullptr;  // implementation data (a cudaEvent_t for CudaFence)
};

class StreamFence {
 public:
  virtual ~StreamFence() = default;
  // Records a fence on `stream` now. Called with the allocator lock held.
  virtual FenceToken Record(StreamId stream) = 0;
  // True once the stream has passed the token (never blocks).
  virtual bool Passed(const FenceToken& token) = 0;
  // Returns the token's resources; called exactly once per recorded token.
  virtual void Release(const FenceToken& token) = 0;
};

// CPU twin of a CUDA event: each stream has a counter of recorded fences and one of completed
// ones. Complete(stream) plays the part of the stream finishing all its queued work. Thread-safe.
class CpuFence : public StreamFence {
 public:
  FenceToken Record(StreamId stream) override;
  bool Passed(const FenceToken& token) override;
  void Release(const FenceToken& token) override {}
  // Marks every fence recorded so far on `stream` as passed.
  void Complete(StreamId stream);

 private:
  std::mutex mu_;
  std::map<StreamId, uint64_t> recorded_, completed_;
};

// CUDA implementations (Unavailable when built without CUDA or when no device is present).
StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaBackend(int device, size_t limit_bytes = 0);
StatusOr<std::unique_ptr<StreamFence>> CreateCudaFence(int device);

// ----------------------------------------------------------------------------------------------
// Allocator
// ----------------------------------------------------------------------------------------------

enum class PoolKind : int { kTransient = 0, kPersistent = 1 };

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // live, rounded, planned + pooled
  int64_t reserved_bytes = 0;   // segments held from the backend (arena included)
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  // 1 - peak_allocated / peak_reserved (0 when nothing was reserved).
  double fragmentation = 0;
  int64_t largest_free_block_bytes = 0;  // in the pools (the arena is not counted)
  int64_t live_allocations = 0;
  int64_t num_allocs = 0, num_frees = 0;
  int64_t planned_hits = 0;    // allocations served from a plan's arena
  int64_t planned_misses = 0;  // planned steps that diverged and fell back to the pool
  // Why the latest planned miss happened, e.g. "step 'B16' diverged at allocation 14 of 812:
  // 2097152 bytes requested, 1048576 planned" (empty: none yet). For diagnosis only.
  std::string last_miss;
  // Allocations of planned steps served by the pool because their planned bytes were still held
  // (by a late free, or by an arena occupant); the step keeps its plan (Note [Arena occupants]).
  int64_t planned_skips = 0;
  int64_t planned_steps = 0;      // steps that began with a plan
  int64_t plans_cached = 0;       // plans in the cache now (at most Options::max_plans)
  int64_t first_sight_plans = 0;  // signatures planned from their first step (Note [First sight])
  int64_t plan_evictions = 0;     // plans evicted from the cache (least recently used first)
  int64_t pool_allocs = 0;        // allocations served by the pools
  int64_t segments = 0;
  int64_t arena_bytes = 0;
  int64_t persistent_allocated_bytes = 0;
  int64_t pending_fenced_blocks = 0;  // freed blocks waiting for another stream's fence
  // Steps abandoned: ran out of memory, or ended by AbandonStep (Note [Out of memory in a step]).
  int64_t abandoned_steps = 0;
  HistogramSummary alloc_latency_ns;
};

class MemAllocator {
 public:
  struct Options {
    // Pool segments are at least this large (bigger requests get their own segment).
    size_t segment_bytes = size_t{32} << 20;
    // Split a free block only when the rest is at least this large (smaller rests stay with the
    // block, as internal slack, so tiny slivers do not accumulate).
    size_t min_split_bytes = kAlignBytes;
    // Record each allocation's latency into the histogram (two clock reads per call).
    bool record_latency = true;
    // A step whose signature has no plan (and is not being recorded) is recorded on its own and
    // planned at its end, so the signature's next step is planned (Note [First sight] in
    // src/memory/allocator.cc).
    bool plan_unseen_signatures = true;
    // Bound on cached plans (0 = none); the least recently used plan is evicted beyond it. All
    // plans share one arena sized to the largest cached plan.
    size_t max_plans = 64;
  };

  // `fence` may be null when all allocations use one stream (cross-stream reuse is then refused
  // until the block is coalesced into a fully free segment... see Note [Stream-safe reuse]).
  MemAllocator(Options options, std::unique_ptr<MemoryBackend> backend,
               std::unique_ptr<StreamFence> fence);
  ~MemAllocator();
  MemAllocator(const MemAllocator&) = delete;
  MemAllocator& operator=(const MemAllocator&) = delete;

  // Returns RoundUp(bytes) bytes aligned to kAlignBytes. ResourceExhausted names what was live.
  // Thread-safe.
  StatusOr<void*> Allocate(size_t bytes, StreamId stream, PoolKind kind = PoolKind::kTransient);
  // `stream` is where the memory was last used (the caller's current stream). InvalidArgument for
  // a pointer this allocator did not hand out (or freed twice).
  Status Free(void* ptr, StreamId stream);

  // Step boundaries. BeginStep ends the previous step; if a plan exists for `signature` and the
  // arena is free of last step's planned allocations, this step is served from the plan. The arena
  // is (re)reserved here when it does not match the largest cached plan; ResourceExhausted if
  // that fails (the step then runs from the pool). With Options::plan_unseen_signatures, a step
  // of a signature without a plan is recorded and planned when it ends (EndStep, or the next
  // BeginStep if EndStep is not called); planning runs on the caller's thread, outside the lock.
  //
  // Out of memory inside a step (Note [Out of memory in a step] in src/memory/allocator.cc): the
  // ResourceExhausted names the step's signature, the bytes asked for, whether the step was
  // planned, and what the backend had free; the step is then abandoned (no longer planned, traced
  // or planned on first sight) and the next BeginStep starts clean, so a smaller step can follow.
  // A failed arena reservation in BeginStep abandons the step the same way.
  Status BeginStep(const std::string& signature);
  // Returns false when the step was abandoned (it ran out of memory).
  bool EndStep();
  // Ends the open step (if any) and abandons it: a step that failed for any reason (an exception
  // in the training loop) is neither planned on first sight nor kept in a recording.
  void AbandonStep();

  // Note [Shutdown] in src/memory/allocator.cc. Ends an open step without planning it, stops
  // recording, and returns every cached segment and an idle arena to the backend. OK when nothing
  // is live (reserved is then 0); FailedPrecondition naming what is still live otherwise: a leak,
  // those allocations are still held by the caller. The allocator stays usable: frees of what is
  // live stay valid, and later allocations reserve anew. Thread-safe.
  Status Close();

  // Recording: every alloc/free and step boundary goes into the trace until StopRecording.
  void StartRecording();
  Trace StopRecording();
  bool recording() const;

  // Plans each signature of `trace` (PlanSignature: its largest recorded step, widened by the
  // steps of the same structure, with sibling plans for other structures and carry zones sized
  // by CarryZoneBytes over the whole trace) and installs the plans. Returns the plans installed.
  StatusOr<std::vector<Plan>> PlanFromTrace(const Trace& trace);
  Status InstallPlan(Plan plan);
  const PlanCache& plans() const { return plans_; }

  // Returns fully free pool segments (and an idle arena) to the backend.
  void ReleaseCached();
  AllocatorStats Stats() const;
  void ResetPeaks();
  // "allocated 1.2 GiB in 42 live allocations (...); top live: 256.0 MiB stream 0 transient, ..."
  std::string DescribeLive(size_t top_n = 5) const;

 private:
  // Plans and installs the step recorded on first sight, if one is open (Note [First sight]).
  void PlanFirstSight();

  struct Impl;
  std::unique_ptr<Impl> impl_;
  PlanCache plans_;
};

// ----------------------------------------------------------------------------------------------
// Replay: a trace through a MemAllocator over host memory (analysis, CLI, benchmarks)
// ----------------------------------------------------------------------------------------------

struct ReplayOptions {
  enum class Mode {
    kPool,        // no steps, no plans: the pool alone
    kPlanned,     // plan each signature from the whole trace first (PlanSignature)
    kFirstSight,  // no plans up front: each signature is planned from its first step (online)
    kCaching,     // the baseline: a model of torch's caching allocator (src/memory/caching_model.h)
  };
  Mode mode = Mode::kPlanned;
  size_t capacity_bytes = size_t{1} << 36;  // the host range standing in for device memory
  size_t segment_bytes = size_t{32} << 20;  // MemAllocator's; the caching model has its own
  size_t max_plans = 64;
};

// Replays every event of `trace` (frees of ids allocated before the trace are skipped) and returns
// the allocator's stats. Errors: the trace's own (Lifetimes), ResourceExhausted past the capacity.
StatusOr<AllocatorStats> ReplayTrace(const Trace& trace, const ReplayOptions& options);

// Every step of `trace` planned on its own (as MemAllocator's first plan of a step would be),
// and the plans MemAllocator installs from it: one per signature, the envelope of its steps with
// carry zones sized over every step (as PlanFromTrace). Each plan is checked by the independent
// checker; its error names the step or the signature. The planner's algorithms themselves are
// private to src/memory (planner.h); this is how the CLI and the bindings reach them.
struct TracePlans {
  std::vector<LifetimeTable> tables;           // the trace's steps, in order
  std::vector<Plan> steps;                     // one per table
  std::vector<std::string> signatures;         // sorted
  std::vector<SignaturePlan> signature_plans;  // one per signature, in that order
};
StatusOr<TracePlans> PlanTrace(const Trace& trace);
// "pool", "planned", "first_sight", "caching"; InvalidArgument for anything else.
StatusOr<ReplayOptions::Mode> ParseReplayMode(const std::string& name);

// "1.5 GiB", "512 B"
std::string FormatBytes(int64_t bytes);

// ----------------------------------------------------------------------------------------------
// MemSculptor as torch's CUDA allocator (CUDA builds: src/memory/torch_allocator.cc, compiled into
// the Python module loongforge._C, whose exported lf_alloc/lf_free torch loads with
// torch.cuda.memory.CUDAPluggableAllocator(loongforge._C.__file__, "lf_alloc", "lf_free")).
// One MemAllocator per device over cudaMalloc'd segments and cudaEvent fences, created at the
// device's first use with the LOONGFORGE_MEM_* knobs (a bad knob fails that creation with the
// variable named); the functions below reach the same allocators torch allocates from. Every
// function is thread-safe. A call on a device whose allocator could not be created returns the
// error that stopped it (no device, a bad knob); InvalidArgument for a device index out of range.
// ----------------------------------------------------------------------------------------------
namespace torch_plugin {

// The cap on what `device` reserves, MiB (0: none), in place of LOONGFORGE_MEM_LIMIT_MB's.
// InvalidArgument for a device index or cap out of range; FailedPrecondition once the device is
// set up (the cap is read at its first allocation).
Status SetLimitMb(int device, int64_t mb);
// true: allocations from now on go to the persistent pool (parameters, optimizer state).
void SetPersistent(bool on);
// ResourceExhausted ("CUDA out of memory (MemSculptor, cuda:N): ...") when the step's planned
// arena cannot be reserved: the step is abandoned (Note [Out of memory in a step]).
Status BeginStep(int device, const std::string& signature);
// true; false when the step was abandoned (it ran out of memory).
StatusOr<bool> EndStep(int device);
void AbandonStep(int device);
// Note [Shutdown] in src/memory/allocator.cc: the number of allocations still live (0: a clean
// close; otherwise a leak, logged as a warning and described by LastError()).
StatusOr<int64_t> Close(int device);
Status StartRecording(int device);
// Stops recording, plans each recorded signature and installs the plans; writes the trace as
// text to `trace_path` first when it is not empty.
StatusOr<std::vector<Plan>> StopRecordingAndPlan(int device, const std::string& trace_path);
StatusOr<AllocatorStats> Stats(int device);
void ResetPeaks(int device);
// Returns fully free segments (and an idle arena) to CUDA.
void ReleaseCached(int device);
// Returns the bytes held for CUDA graphs captured earlier (Note [Graph capture] in
// torch_allocator.cc); call only once those graphs are destroyed.
void ReleaseGraphMemory(int device);
// The last error any entry point set (lf_alloc's exhaustion included).
std::string LastError();

}  // namespace torch_plugin

}  // namespace mem
}  // namespace loongforge
