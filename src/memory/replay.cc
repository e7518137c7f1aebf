// ReplayTrace: a recorded trace through MemAllocator over host memory
// (include/loongforge/memory.h).
#include <unordered_map>

#include "loongforge/memory.h"

namespace loongforge {
namespace mem {

StatusOr<ReplayOptions::Mode> ParseReplayMode(const std::string& name) {
  if (name == "pool") return ReplayOptions::Mode::kPool;
  if (name == "planned") return ReplayOptions::Mode::kPlanned;
  if (name == "first_sight" || name == "first-sight") return ReplayOptions::Mode::kFirstSight;
  return InvalidArgumentError("replay mode '" + name + "': expected pool, planned or first_sight");
}

StatusOr<AllocatorStats> ReplayTrace(const Trace& trace, const ReplayOptions& options) {
  using Mode = ReplayOptions::Mode;
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
