// Bindings for MemSculptor: the CPU analysis surface (traces, plans, and replay through the pooled
// / planned allocator over host memory) and, in CUDA builds, the control functions of the torch
// allocator this module hosts (_C.torch_allocator; python/loongforge/memory.py drives them).
#include <pybind11/stl.h>

#include "bindings.h"
#include "loongforge/memory.h"

namespace loongforge {
namespace {

using mem::Plan;
using mem::Trace;

// What every plan reports: its placement and peak against the lower bound.
py::dict PlanFields(const Plan& p) {
  py::dict d;
  d["signature"] = p.signature;
  d["algorithm"] = p.algorithm;
  d["allocations"] = p.sizes.size();
  int64_t placed = 0;
  for (int64_t o : p.offsets) placed += (o != mem::kNotPlanned);
  d["planned"] = placed;
  d["peak_bytes"] = p.peak_bytes;
  d["lower_bound_bytes"] = p.lower_bound_bytes;
  d["other_peak_bytes"] = p.other_peak_bytes;
  d["overhead"] = p.overhead();
  return d;
}

py::dict PlanToDict(const Plan& p, const mem::LifetimeTable& t, bool with_layout) {
  py::dict d = PlanFields(p);
  d["step"] = t.step;
  if (with_layout) {
    d["offsets"] = p.offsets;
    d["sizes"] = p.sizes;
    std::vector<int64_t> begin, end;
    for (const auto& lt : t.allocs) {
      begin.push_back(lt.alloc_seq);
      end.push_back(lt.free_seq);
    }
    d["begin"] = begin;
    d["end"] = end;
  }
  return d;
}

py::dict StatsToDict(const mem::AllocatorStats& s) {
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["peak_allocated_bytes"] = s.peak_allocated_bytes;
  d["peak_reserved_bytes"] = s.peak_reserved_bytes;
  d["fragmentation"] = s.fragmentation;
  d["largest_free_block_bytes"] = s.largest_free_block_bytes;
  d["live_allocations"] = s.live_allocations;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  d["planned_hits"] = s.planned_hits;
  d["planned_misses"] = s.planned_misses;
  d["last_miss"] = s.last_miss;
  d["planned_skips"] = s.planned_skips;
  d["planned_steps"] = s.planned_steps;
  d["pool_allocs"] = s.pool_allocs;
  d["segments"] = s.segments;
  d["arena_bytes"] = s.arena_bytes;
  d["plans_cached"] = s.plans_cached;
  d["first_sight_plans"] = s.first_sight_plans;
  d["plan_evictions"] = s.plan_evictions;
  d["persistent_allocated_bytes"] = s.persistent_allocated_bytes;
  d["abandoned_steps"] = s.abandoned_steps;
  py::dict lat;
  lat["count"] = s.alloc_latency_ns.count;
  lat["p50"] = s.alloc_latency_ns.p50;
  lat["p99"] = s.alloc_latency_ns.p99;
  lat["mean"] = s.alloc_latency_ns.mean;
  d["alloc_latency_ns"] = lat;
  return d;
}

void BindMemory(py::module_& m) {
  py::class_<Trace>(m, "MemTrace", "Alloc/free trace over one or more steps (MemSculptor).")
      .def(py::init<>())
      .def("mark_step", &Trace::MarkStep, py::arg("signature") = "", py::arg("time_ns") = 0)
      .def("add_alloc", &Trace::AddAlloc, py::arg("id"), py::arg("size"), py::arg("stream") = 0,
           py::arg("time_ns") = 0)
      .def("add_free", &Trace::AddFree, py::arg("id"), py::arg("stream") = 0,
           py::arg("time_ns") = 0)
      .def("__len__", &Trace::size)
      .def("to_text", &Trace::ToText)
      .def_static("from_text",
                  [](const std::string& s) { return ValueOrThrow(Trace::FromText(s)); })
      .def_static(
          "load",
          [](const std::string& path) {
            return ValueOrThrowWithoutGil([&] { return Trace::Load(path); });
          },
          py::arg("path"), "Reads a trace file: text, plain or zstd-compressed.")
      .def(
          "save",
          [](const Trace& t, const std::string& path, bool compress) {
            ThrowIfErrorWithoutGil([&] { return t.Save(path, compress); });
          },
          py::arg("path"), py::arg("compress") = true,
          "Writes the text form (zstd-compressed when compress) through a temp file + rename.")
      .def("lifetimes", [](const Trace& t) {
        return ListOf(ValueOrThrow(t.Lifetimes()), [](const mem::LifetimeTable& tb) {
          py::dict d;
          d["step"] = tb.step;
          d["signature"] = tb.signature;
          d["num_events"] = tb.num_events;
          d["foreign_frees"] = tb.foreign_frees;
          d["allocs"] = ListOf(tb.allocs, [](const auto& lt) {
            py::dict a;
            a["id"] = lt.id;
            a["size"] = lt.size;
            a["stream"] = lt.stream;
            a["alloc_seq"] = lt.alloc_seq;
            a["free_seq"] = lt.free_seq;
            a["freed_in_step"] = lt.freed_in_step;
            a["alloc_ns"] = lt.alloc_ns;
            a["free_ns"] = lt.free_ns;
            return a;
          });
          return d;
        });
      });

  m.def(
      "mem_plan_trace",
      [](const Trace& t, bool with_layout) {
        mem::TracePlans r = ValueOrThrowWithoutGil([&] { return mem::PlanTrace(t); });
        py::list out;
        for (size_t i = 0; i < r.steps.size(); ++i)
          out.append(PlanToDict(r.steps[i], r.tables[i], with_layout));
        return out;
      },
      py::arg("trace"), py::arg("with_layout") = false,
      "Plans every step of the trace; one dict per step (peak, lower bound, overhead, ...).");

  m.def(
      "mem_replay",
      [](const Trace& t, const std::string& mode, size_t capacity, size_t segment_bytes,
         size_t max_plans) {
        mem::ReplayOptions o;
        o.mode = ValueOrThrow(mem::ParseReplayMode(mode));
        o.capacity_bytes = capacity;
        o.segment_bytes = segment_bytes;
        o.max_plans = max_plans;
        return StatsToDict(ValueOrThrowWithoutGil([&] { return mem::ReplayTrace(t, o); }));
      },
      py::arg("trace"), py::arg("mode") = "planned", py::arg("capacity_bytes") = size_t{1} << 36,
      py::arg("segment_bytes") = size_t{32} << 20, py::arg("max_plans") = 64,
      "Replays the trace through MemSculptor's allocator over host memory; returns its stats. "
      "mode: pool, planned (plans from the whole trace first) or first_sight (online).");
}

#if LOONGFORGE_WITH_CUDA
// What MemSculptor.plans lists for each plan the torch allocator installed.
py::dict PlanSummary(const Plan& p) {
  py::dict d = PlanFields(p);
  d["sibling_plans"] = p.siblings.size();
  d["carry_zone_bytes"] = p.carry_zone_bytes;
  return d;
}

void BindTorchAllocator(py::module_& parent) {
  namespace tp = mem::torch_plugin;
  py::module_ m = parent.def_submodule(
      "torch_allocator",
      "MemSculptor as torch's CUDA allocator: this module's lf_alloc/lf_free, loaded with "
      "torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, 'lf_alloc', 'lf_free'), and the "
      "control functions of the same per-device allocators.");
  m.def(
      "set_limit_mb", [](int device, int64_t mb) { ThrowIfError(tp::SetLimitMb(device, mb)); },
      py::arg("device"), py::arg("mb"));
  m.def("set_persistent", &tp::SetPersistent, py::arg("on"));
  m.def(
      "begin_step",
      [](int device, const std::string& signature) {
        ThrowIfError(tp::BeginStep(device, signature));
      },
      py::arg("device"), py::arg("signature"));
  m.def(
      "end_step", [](int device) { return ValueOrThrow(tp::EndStep(device)); }, py::arg("device"),
      "False when the step was abandoned (it ran out of memory).");
  m.def("abandon_step", &tp::AbandonStep, py::arg("device"));
  m.def(
      "close", [](int device) { return ValueOrThrowWithoutGil([&] { return tp::Close(device); }); },
      py::arg("device"), "The number of allocations still live (0: a clean close).");
  m.def(
      "start_recording", [](int device) { ThrowIfError(tp::StartRecording(device)); },
      py::arg("device"));
  m.def(
      "stop_recording_and_plan",
      [](int device, const std::string& trace_path) {
        return ListOf(
            ValueOrThrowWithoutGil([&] { return tp::StopRecordingAndPlan(device, trace_path); }),
            PlanSummary);
      },
      py::arg("device"), py::arg("trace_path") = "");
  m.def(
      "stats", [](int device) { return StatsToDict(ValueOrThrow(tp::Stats(device))); },
      py::arg("device"));
  m.def("reset_peaks", &tp::ResetPeaks, py::arg("device"));
  m.def(
      "release_cached", [](int device) { CallWithoutGil([&] { tp::ReleaseCached(device); }); },
      py::arg("device"));
  m.def(
      "release_graph_memory",
      [](int device) { CallWithoutGil([&] { tp::ReleaseGraphMemory(device); }); },
      py::arg("device"));
  m.def("last_error", &tp::LastError);
}
#endif

void BindMemoryAll(py::module_& m) {
  BindMemory(m);
#if LOONGFORGE_WITH_CUDA
  BindTorchAllocator(m);
#endif
}

LF_REGISTER_BINDINGS(memory, BindMemoryAll);

}  // namespace
}  // namespace loongforge
