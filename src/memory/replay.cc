// ReplayTrace: a recorded trace through MemAllocator over host memory
// (include/loongforge/memory.h).
#include <chrono>
#include <unordered_map>

#include "loongforge/memory.h"
#include "memory/caching_model.h"

namespace loongforge {
namespace mem {

StatusOr<ReplayOptions::Mode> ParseReplayMode(const std::string& name) {
  if (name == "pool") return ReplayOptions::Mode::kPool;
  if (name == "planned") return ReplayOptions::Mode::kPlanned;
  if (name == "first_sight" || name == "first-sight") return ReplayOptions::Mode::kFirstSight;
  if (name == "caching") return ReplayOptions::Mode::kCaching;
  return InvalidArgumentError("replay mode '" + name +
                              "': expected pool, planned, first_sight or caching");
}

namespace {

// The baseline: the trace through the model of torch's caching allocator (caching_model.h). It
// keeps no latency histogram of its own, so each call is timed here with two steady_clock reads,
// as MemAllocator times itself (Options::record_latency).
StatusOr<AllocatorStats> ReplayCaching(const Trace& trace, const ReplayOptions& options) {
  LF_RETURN_IF_ERROR(trace.Lifetimes().status());  // the same validation as the other modes
  internal::CachingAllocatorModel m(CreateHostBackend(options.capacity_bytes));
  Histogram latency;
  std::unordered_map<uint64_t, void*> live;
  int64_t allocs = 0, frees = 0;
  const auto& events = trace.events();
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    if (e.kind == TraceEvent::kAlloc) {
      auto t0 = std::chrono::steady_clock::now();
      StatusOr<void*> p = m.Allocate(static_cast<size_t>(e.size), e.stream);
      auto t1 = std::chrono::steady_clock::now();
      if (!p.ok()) return p.status().WithContext("trace event " + std::to_string(i));
      latency.Record(static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
      live[e.id] = *p;
      ++allocs;
    } else if (e.kind == TraceEvent::kFree) {
      auto it = live.find(e.id);
      if (it == live.end()) continue;  // allocated before the trace began
      LF_RETURN_IF_ERROR_CTX(m.Free(it->second), "trace event " + std::to_string(i));
      live.erase(it);
      ++frees;
    }
  }
  AllocatorStats s = m.Stats();
  s.num_allocs = allocs;
  s.num_frees = frees;
  s.pool_allocs = allocs;
  s.alloc_latency_ns = latency.Summary();
  for (const auto& [id, p] : live) m.Free(p).IgnoreError();  // outlived the trace
  return s;
}

}  // namespace

StatusOr<AllocatorStats> ReplayTrace(const Trace& trace, const ReplayOptions& options) {
  using Mode = ReplayOptions::Mode;
  if (options.mode == Mode::kCaching) return ReplayCaching(trace, options);
  MemAllocator::Options o;
  o.segment_bytes = options.segment_bytes;
  o.plan_unseen_signatures = options.mode == Mode::kFirstSight;
  o.max_plans = options.max_plans;
  MemAllocator a(o, CreateHostBackend(options.capacity_bytes), std::make_unique<CpuFence>());
  if (options.mode == Mode::kPlanned) {
    LF_RETURN_IF_ERROR_CTX(a.PlanFromTrace(trace).status(), "planning the trace");
  } else {
    LF_RETURN_IF_ERROR(trace.Lifetimes().status());  // the same validation in every mode
  }
  const bool steps = options.mode != Mode::kPool;
  bool in_step = false;
  std::unordered_map<uint64_t, void*> live;
  const auto& events = trace.events();
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    switch (e.kind) {
      case TraceEvent::kStep:
        if (steps) {
          if (in_step) a.EndStep();
          LF_RETURN_IF_ERROR(a.BeginStep(e.signature));
          in_step = true;
        }
        break;
      case TraceEvent::kAlloc: {
        StatusOr<void*> p = a.Allocate(static_cast<size_t>(e.size), e.stream);
        if (!p.ok()) return p.status().WithContext("trace event " + std::to_string(i));
        live[e.id] = *p;
        break;
      }
      case TraceEvent::kFree: {
        auto it = live.find(e.id);
        if (it == live.end()) break;  // allocated before the trace began
        LF_RETURN_IF_ERROR_CTX(a.Free(it->second, e.stream), "trace event " + std::to_string(i));
        live.erase(it);
        break;
      }
    }
  }
  if (in_step) a.EndStep();
  AllocatorStats s = a.Stats();
  for (const auto& [id, p] : live) a.Free(p, 0).IgnoreError();  // outlived the trace
  return s;
}

}  // namespace mem
}  // namespace loongforge
