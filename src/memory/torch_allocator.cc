// MemSculptor behind torch's CUDAPluggableAllocator, compiled into the Python module
// loongforge._C (one copy of the core in the process):
//
//   torch.cuda.memory.CUDAPluggableAllocator(loongforge._C.__file__, "lf_alloc", "lf_free")
//
// lf_alloc and lf_free, with torch's signatures, are the only symbols exported for it: dlopen of
// the module's path returns the module already loaded, so torch's allocator and the bindings of
// the control functions (torch_plugin:: in loongforge/memory.h) share one state. One MemAllocator
// per device (cudaMalloc'd segments grown on demand, cudaEvent fences), created on first use.
// Every entry point is thread-safe (autograd's backward thread allocates too).
//
// Note [Exhaustion]
// torch's pluggable allocator does not check for a null return, so on exhaustion lf_alloc throws
// LfOutOfMemory (a std::bad_alloc whose what() says what was live). torch turns it into a Python
// exception carrying that message; the same message stays readable with torch_plugin::LastError.
// Inside a step the message names the step's signature and the bytes asked for, and the step is
// abandoned so that a smaller one can follow (Note [Out of memory in a step] in allocator.cc).
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
// driver reclaims the device memory with the context. The orderly end is torch_plugin::Close (Note
// [Shutdown] in allocator.cc), which MemSculptor.close() runs after the caller dropped its
// tensors; it reports a leak only when something is still live then.
//
// Note [Graph capture]
// An allocation made while its stream is capturing a CUDA graph must keep its bytes for the
// graph's life: graph replays reuse them after capture ends. Such allocations come from the
// persistent pool, are never planned, and their frees are deferred forever (the bytes stay held
// until torch_plugin::ReleaseGraphMemory after the graph is destroyed). This is safe but not
// frugal; say so.
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
  std::atomic<int64_t> limit_mb{-1};  // SetLimitMb's cap; -1: LOONGFORGE_MEM_LIMIT_MB's
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

std::string LastErrorText() {
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

}  // namespace
}  // namespace mem
}  // namespace loongforge

using loongforge::Status;         // NOLINT
using namespace loongforge::mem;  // NOLINT: torch's two entry points below

LF_EXPORT void* lf_alloc(ssize_t size, int device, cudaStream_t stream) {
  MemAllocator* a = Get(device);
  if (!a) throw LfOutOfMemory(LastErrorText());
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

namespace loongforge {
namespace mem {
namespace torch_plugin {
namespace {

// The device's allocator, or the error that kept it from being created.
StatusOr<MemAllocator*> Require(int device) {
  if (MemAllocator* a = Get(device)) return a;
  if (device < 0 || device >= kMaxDevices) return InvalidArgumentError(LastErrorText());
  return State().devices[device].init_status;
}

}  // namespace

void ReleaseGraphMemory(int device) {
  MemAllocator* a = Get(device);
  if (!a) return;
  DeviceState& d = State().devices[device];
  std::lock_guard<std::mutex> lock(d.graph_mu);
  for (void* p : d.graph_held) a->Free(p, 0).IgnoreError();
  d.graph_held.clear();
}

Status SetLimitMb(int device, int64_t mb) {
  if (device < 0 || device >= kMaxDevices)
    return InvalidArgumentError("MemSculptor: device index " + std::to_string(device) +
                                " out of range");
  if (mb < 0 || mb > (int64_t{1} << 43))
    return InvalidArgumentError("MemSculptor: memory cap " + std::to_string(mb) +
                                " MiB is out of range (0..2^43)");
  DeviceState& d = State().devices[device];
  if (d.initialized.load())
    return FailedPreconditionError("MemSculptor: device " + std::to_string(device) +
                                   " is already set up; its memory cap is read at its first "
                                   "allocation");
  d.limit_mb.store(mb);
  return Status();
}

void SetPersistent(bool on) { g_persistent.store(on ? 1 : 0); }

Status BeginStep(int device, const std::string& signature) {
  StatusOr<MemAllocator*> a = Require(device);
  if (!a.ok()) return a.status();
  Status s = (*a)->BeginStep(signature);
  if (s.ok()) return s;
  if (s.code() != StatusCode::kResourceExhausted) return s;
  std::string msg =
      "CUDA out of memory (MemSculptor, cuda:" + std::to_string(device) + "): " + s.message();
  SetError(msg);
  return ResourceExhaustedError(msg);
}

StatusOr<bool> EndStep(int device) {
  StatusOr<MemAllocator*> a = Require(device);
  if (!a.ok()) return a.status();
  return (*a)->EndStep();
}

void AbandonStep(int device) {
  if (MemAllocator* a = Get(device)) a->AbandonStep();
}

StatusOr<int64_t> Close(int device) {
  StatusOr<MemAllocator*> a = Require(device);
  if (!a.ok()) return a.status();
  Status s = (*a)->Close();
  if (s.ok()) return int64_t{0};
  std::string msg = "MemSculptor on cuda:" + std::to_string(device) + " " + s.message();
  SetError(msg);
  LF_LOG(WARNING) << msg;
  return static_cast<int64_t>((*a)->Stats().live_allocations);
}

Status StartRecording(int device) {
  StatusOr<MemAllocator*> a = Require(device);
  if (!a.ok()) return a.status();
  (*a)->StartRecording();
  return Status();
}

StatusOr<std::vector<Plan>> StopRecordingAndPlan(int device, const std::string& trace_path) {
  StatusOr<MemAllocator*> a = Require(device);
  if (!a.ok()) return a.status();
  Trace t = (*a)->StopRecording();
  if (!trace_path.empty()) {
    Status saved = t.Save(trace_path, /*compress=*/false);
    if (!saved.ok()) return saved;
  }
  return (*a)->PlanFromTrace(t);
}

StatusOr<AllocatorStats> Stats(int device) {
  StatusOr<MemAllocator*> a = Require(device);
  if (!a.ok()) return a.status();
  return (*a)->Stats();
}

void ResetPeaks(int device) {
  if (MemAllocator* a = Get(device)) a->ResetPeaks();
}

void ReleaseCached(int device) {
  if (MemAllocator* a = Get(device)) a->ReleaseCached();
}

std::string LastError() { return LastErrorText(); }

}  // namespace torch_plugin
}  // namespace mem
}  // namespace loongforge
