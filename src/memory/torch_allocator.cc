// libloongforge_alloc.so: MemSculptor behind torch's CUDAPluggableAllocator.
//
//   torch.cuda.memory.CUDAPluggableAllocator(path, "lf_alloc", "lf_free")
//
// One MemAllocator per device (cudaMalloc'd segments grown on demand, cudaEvent fences), created
// on first use. The control functions (lf_begin_step, lf_start_recording, ...) are called by
// python/loongforge/memory.py through ctypes on the same loaded library. Every entry point is
// thread-safe (autograd's backward thread allocates too).
//
// Note [Exhaustion]
// torch's pluggable allocator does not check for a null return, so on exhaustion lf_alloc throws
// LfOutOfMemory (a std::bad_alloc whose what() says what was live). torch turns it into a Python
// exception carrying that message; the same message stays readable with lf_last_error. Inside a
// step the message names the step's signature and the bytes asked for, and the step is abandoned
// so that a smaller one can follow (Note [Out of memory in a step] in allocator.cc).
//
// Note [Process-lifetime state]
// The per-device allocators, their graph bookkeeping and the last error are one LibState that is
// created on first use and intentionally never destroyed (as PyTorch leaks its CUDA hooks object,
// for the same reason). torch frees tensors that live to the end of the process (parameters and
// optimizer state held by module globals, the autograd engine's caches) during interpreter
// shutdown or from its own static destructors, whose order relative to ours no one controls; and
// by then the CUDA runtime may be unloading, so cudaFree itself can fail. A static MemAllocator
// was destroyed first: it warned "destroyed with N live allocations" at every normal exit and
// left later lf_free calls to a dead object. Leaked, every lf_free finds a live allocator, and the
// driver reclaims the device memory with the context. The orderly end is lf_close (Note
// [Shutdown] in allocator.cc), which MemSculptor.close() runs after the caller dropped its
// tensors; it reports a leak only when something is still live then.
//
// Note [Graph capture]
// An allocation made while its stream is capturing a CUDA graph must keep its bytes for the
// graph's life: graph replays reuse them after capture ends. Such allocations come from the
// persistent pool, are never planned, and their frees are deferred forever (the bytes stay held
// until lf_release_graph_memory after the graph is destroyed). This is safe but not frugal; say so.
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <unordered_set>

#include "loongforge/env_knobs.h"
#include "loongforge/logging.h"
#include "loongforge/memory.h"

#define LF_EXPORT extern "C" __attribute__((visibility("default")))

namespace loongforge {
namespace mem {
namespace {

constexpr int kMaxDevices = 64;

class LfOutOfMemory : public std::bad_alloc {
 public:
  explicit LfOutOfMemory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

struct DeviceState {
  std::once_flag once;
  std::atomic<bool> initialized{false};
  std::atomic<int64_t> limit_mb{-1};  // lf_set_limit_mb's cap; -1: LOONGFORGE_MEM_LIMIT_MB's
  std::unique_ptr<MemAllocator> alloc;
  Status init_status;
  std::mutex graph_mu;
  std::unordered_set<void*> graph_live, graph_held;
};

// Note [Process-lifetime state].
struct LibState {
  std::array<DeviceState, kMaxDevices> devices;
  std::mutex err_mu;
  std::string last_error;
};

LibState& State() {
  static LibState* state = new LibState;  // never deleted: Note [Process-lifetime state]
  return *state;
}

std::atomic<int> g_persistent{0};

void SetError(const std::string& e) {
  LibState& st = State();
  std::lock_guard<std::mutex> lock(st.err_mu);
  st.last_error = e;
}

std::string LastError() {
  LibState& st = State();
  std::lock_guard<std::mutex> lock(st.err_mu);
  return st.last_error;
}

// The allocator's knobs (src/common/env_knobs.cc declares their ranges: a size in MiB that fits
// 64 bits of bytes, a non-negative count). A bad value fails the device's initialization with the
// variable named, rather than running with a limit nobody asked for.
struct AllocKnobs {
  size_t limit_bytes = 0;
  MemAllocator::Options options;
};

StatusOr<AllocKnobs> ReadAllocKnobs() {
  AllocKnobs k;
  StatusOr<int64_t> limit = ParseEnvInt("LOONGFORGE_MEM_LIMIT_MB");
  if (!limit.ok()) return limit.status();
  StatusOr<int64_t> segment = ParseEnvInt("LOONGFORGE_MEM_SEGMENT_MB");
  if (!segment.ok()) return segment.status();
  StatusOr<int64_t> plans = ParseEnvInt("LOONGFORGE_MEM_MAX_PLANS");
  if (!plans.ok()) return plans.status();
  StatusOr<bool> unseen = ParseEnvBool("LOONGFORGE_MEM_PLAN_UNSEEN");
  if (!unseen.ok()) return unseen.status();
  k.limit_bytes = static_cast<size_t>(*limit) << 20;
  k.options.segment_bytes = static_cast<size_t>(*segment) << 20;
  k.options.max_plans = static_cast<size_t>(*plans);
  k.options.plan_unseen_signatures = *unseen;
  return k;
}

MemAllocator* Get(int device) {
  if (device < 0 || device >= kMaxDevices) {
    SetError("MemSculptor: device index " + std::to_string(device) + " out of range");
    return nullptr;
  }
  DeviceState& d = State().devices[device];
  std::call_once(d.once, [&] {
    d.initialized.store(true);
    StatusOr<AllocKnobs> knobs = ReadAllocKnobs();
    if (!knobs.ok()) {
      d.init_status = knobs.status();
      return;
    }
    if (d.limit_mb.load() >= 0) knobs->limit_bytes = static_cast<size_t>(d.limit_mb.load()) << 20;
    auto backend = CreateCudaBackend(device, knobs->limit_bytes);
    if (!backend.ok()) {
      d.init_status = backend.status();
      return;
    }
    auto fence = CreateCudaFence(device);
    if (!fence.ok()) {
      d.init_status = fence.status();
      return;
    }
    d.alloc =
        std::make_unique<MemAllocator>(knobs->options, std::move(*backend), std::move(*fence));
  });
  if (!d.alloc) SetError(d.init_status.ToString());
  return d.alloc.get();
}

bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

int CopyOut(const std::string& s, char* buf, size_t len) {
  if (buf && len > 0) {
    size_t n = std::min(len - 1, s.size());
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(s.size());
}

std::string PlansJson(const std::vector<Plan>& plans) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = plans[i];
    int64_t placed = 0;
    for (int64_t o : p.offsets) placed += (o != kNotPlanned);
    os << (i ? ", " : "") << "{\"signature\": \"" << p.signature << "\", \"algorithm\": \""
       << p.algorithm << "\", \"allocations\": " << p.sizes.size() << ", \"planned\": " << placed
       << ", \"peak_bytes\": " << p.peak_bytes << ", \"lower_bound_bytes\": " << p.lower_bound_bytes
       << ", \"other_peak_bytes\": " << p.other_peak_bytes << ", \"overhead\": " << p.overhead()
       << ", \"sibling_plans\": " << p.siblings.size()
       << ", \"carry_zone_bytes\": " << p.carry_zone_bytes << "}";
  }
  os << "]";
  return os.str();
}

}  // namespace
}  // namespace mem
}  // namespace loongforge

using loongforge::Status;         // NOLINT
using namespace loongforge::mem;  // NOLINT: the exported C surface below

LF_EXPORT void* lf_alloc(ssize_t size, int device, cudaStream_t stream) {
  MemAllocator* a = Get(device);
  if (!a) throw LfOutOfMemory(LastError());
  bool capturing = Capturing(stream);
  PoolKind kind = (capturing || g_persistent.load(std::memory_order_relaxed))
                      ? PoolKind::kPersistent
                      : PoolKind::kTransient;
  auto p = a->Allocate(static_cast<size_t>(size), reinterpret_cast<StreamId>(stream), kind);
  if (!p.ok()) {
    std::string msg = "CUDA out of memory (MemSculptor, cuda:" + std::to_string(device) +
                      "): " + p.status().message();
    SetError(msg);
    throw LfOutOfMemory(msg);
  }
  if (capturing) {
    DeviceState& d = State().devices[device];
    std::lock_guard<std::mutex> lock(d.graph_mu);
    d.graph_live.insert(*p);
  }
  return *p;
}

LF_EXPORT void lf_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  MemAllocator* a = Get(device);
  if (!a || ptr == nullptr) return;
  DeviceState& d = State().devices[device];
  {
    std::lock_guard<std::mutex> lock(d.graph_mu);
    auto it = d.graph_live.find(ptr);
    if (it != d.graph_live.end()) {  // Note [Graph capture]
      d.graph_live.erase(it);
      d.graph_held.insert(ptr);
      return;
    }
  }
  Status s = a->Free(ptr, reinterpret_cast<StreamId>(stream));
  if (!s.ok()) {
    SetError(s.ToString());
    LF_LOG(ERROR) << "lf_free: " << s;
  }
}

// Returns the bytes held for graphs captured earlier; call only once those graphs are destroyed.
LF_EXPORT void lf_release_graph_memory(int device) {
  MemAllocator* a = Get(device);
  if (!a) return;
  DeviceState& d = State().devices[device];
  std::lock_guard<std::mutex> lock(d.graph_mu);
  for (void* p : d.graph_held) a->Free(p, 0).IgnoreError();
  d.graph_held.clear();
}

// The cap on what `device` reserves, MiB (0: none), in place of LOONGFORGE_MEM_LIMIT_MB's: a
// caller's parameter (the trainer's --memory-cap-gib) arrives here, not through the environment.
// Returns 0; -1 when the device is already set up (the cap is read once, at its first use) or
// `mb` is out of range (lf_last_error says which).
LF_EXPORT int lf_set_limit_mb(int device, int64_t mb) {
  if (device < 0 || device >= kMaxDevices) {
    SetError("MemSculptor: device index " + std::to_string(device) + " out of range");
    return -1;
  }
  if (mb < 0 || mb > (int64_t{1} << 43)) {
    SetError("MemSculptor: memory cap " + std::to_string(mb) + " MiB is out of range (0..2^43)");
    return -1;
  }
  DeviceState& d = State().devices[device];
  if (d.initialized.load()) {
    SetError("MemSculptor: device " + std::to_string(device) +
             " is already set up; its memory cap is read at its first allocation");
    return -1;
  }
  d.limit_mb.store(mb);
  return 0;
}

// 1: allocations from now on go to the persistent pool (parameters, optimizer state); 0: back.
LF_EXPORT void lf_set_persistent(int on) { g_persistent.store(on ? 1 : 0); }

// Returns 0; -2 when the step's planned arena could not be reserved (out of memory: the step is
// abandoned, Note [Out of memory in a step]); -1 on any other error. lf_last_error says why.
LF_EXPORT int lf_begin_step(int device, const char* signature) {
  MemAllocator* a = Get(device);
  if (!a) return -1;
  Status s = a->BeginStep(signature ? signature : "");
  if (!s.ok()) {
    bool oom = s.code() == loongforge::StatusCode::kResourceExhausted;
    SetError(oom ? "CUDA out of memory (MemSculptor, cuda:" + std::to_string(device) +
                       "): " + s.message()
                 : s.ToString());
    return oom ? -2 : -1;
  }
  return 0;
}

// Returns 0, or 1 when the step was abandoned (it ran out of memory); -1 without an allocator.
LF_EXPORT int lf_end_step(int device) {
  MemAllocator* a = Get(device);
  if (!a) return -1;
  return a->EndStep() ? 0 : 1;
}

// Ends the open step and abandons it (a step that raised): neither planned nor recorded.
LF_EXPORT void lf_abandon_step(int device) {
  if (MemAllocator* a = Get(device)) a->AbandonStep();
}

// Note [Shutdown] in allocator.cc: ends the open step, returns every cached byte of `device` to
// CUDA, and returns the number of allocations still live (0: a clean close), or -1 with
// lf_last_error set. Live allocations are a leak (the caller still holds them): they are logged as
// a warning and described in lf_last_error. Memory held for CUDA graphs counts as live until
// lf_release_graph_memory. The allocator stays usable afterwards.
LF_EXPORT int lf_close(int device) {
  MemAllocator* a = Get(device);
  if (!a) return -1;
  Status s = a->Close();
  if (s.ok()) return 0;
  std::string msg = "MemSculptor on cuda:" + std::to_string(device) + " " + s.message();
  SetError(msg);
  LF_LOG(WARNING) << msg;
  return static_cast<int>(a->Stats().live_allocations);
}

LF_EXPORT int lf_start_recording(int device) {
  MemAllocator* a = Get(device);
  if (!a) return -1;
  a->StartRecording();
  return 0;
}

// Stops recording, plans the last recorded step of each signature and installs the plans. Writes
// a JSON list of plan summaries into buf; returns its full length, or -1 with lf_last_error set.
// Also writes the trace as text to `trace_path` when it is not null or empty.
LF_EXPORT int lf_stop_recording_and_plan(int device, char* buf, size_t len,
                                         const char* trace_path) {
  MemAllocator* a = Get(device);
  if (!a) return -1;
  Trace t = a->StopRecording();
  if (trace_path && *trace_path) {
    FILE* f = std::fopen(trace_path, "w");
    if (f) {
      std::string text = t.ToText();
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  }
  auto plans = a->PlanFromTrace(t);
  if (!plans.ok()) {
    SetError(plans.status().ToString());
    return -1;
  }
  return CopyOut(PlansJson(*plans), buf, len);
}

LF_EXPORT int lf_stats_json(int device, char* buf, size_t len) {
  MemAllocator* a = Get(device);
  if (!a) return -1;
  AllocatorStats s = a->Stats();
  std::ostringstream os;
  os << "{\"allocated_bytes\": " << s.allocated_bytes
     << ", \"reserved_bytes\": " << s.reserved_bytes
     << ", \"peak_allocated_bytes\": " << s.peak_allocated_bytes
     << ", \"peak_reserved_bytes\": " << s.peak_reserved_bytes
     << ", \"fragmentation\": " << s.fragmentation
     << ", \"largest_free_block_bytes\": " << s.largest_free_block_bytes
     << ", \"live_allocations\": " << s.live_allocations << ", \"num_allocs\": " << s.num_allocs
     << ", \"num_frees\": " << s.num_frees << ", \"planned_hits\": " << s.planned_hits
     << ", \"planned_misses\": " << s.planned_misses << ", \"last_miss\": \"" << s.last_miss
     << "\", \"planned_skips\": " << s.planned_skips << ", \"planned_steps\": " << s.planned_steps
     << ", \"plans_cached\": " << s.plans_cached
     << ", \"first_sight_plans\": " << s.first_sight_plans
     << ", \"plan_evictions\": " << s.plan_evictions << ", \"pool_allocs\": " << s.pool_allocs
     << ", \"segments\": " << s.segments << ", \"arena_bytes\": " << s.arena_bytes
     << ", \"persistent_allocated_bytes\": " << s.persistent_allocated_bytes
     << ", \"abandoned_steps\": " << s.abandoned_steps
     << ", \"alloc_latency_ns\": " << loongforge::SummaryToJson(s.alloc_latency_ns) << "}";
  return CopyOut(os.str(), buf, len);
}

LF_EXPORT void lf_reset_peaks(int device) {
  if (MemAllocator* a = Get(device)) a->ResetPeaks();
}

LF_EXPORT void lf_release_cached(int device) {
  if (MemAllocator* a = Get(device)) a->ReleaseCached();
}

LF_EXPORT int lf_last_error(char* buf, size_t len) { return CopyOut(LastError(), buf, len); }
