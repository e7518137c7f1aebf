// `loongforge mem plan|replay TRACE`: MemSculptor's planner and allocator over a recorded trace
// (the text format of mem::Trace::ToText, e.g. written by MemSculptor.record(trace_path=...)).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "loongforge/memory.h"

namespace loongforge {
namespace cli {
namespace {

// The options of `mem plan` and `mem replay`; each subcommand declares the ones it reads.
struct Args {
  bool json = false;
  std::string mode = "all";
  int64_t segment_mb = 32, capacity_gb = 64, max_plans = 64;
};

StatusOr<mem::Trace> LoadTrace(const std::string& path) { return mem::Trace::Load(path); }

int64_t Placed(const mem::Plan& p) {
  int64_t n = 0;
  for (int64_t o : p.offsets) n += (o != mem::kNotPlanned);
  return n;
}

Status RunPlan(const Args& a, const std::string& path) {
  LF_ASSIGN_OR_RETURN(mem::Trace trace, LoadTrace(path));
  StatusOr<mem::TracePlans> planned = mem::PlanTrace(trace);
  if (!planned.ok()) return planned.status().WithContext(path);
  const std::vector<mem::LifetimeTable>& tables = planned->tables;
  if (tables.empty()) return InvalidArgumentError(path + ": the trace has no allocations");
  const std::vector<mem::Plan>& plans = planned->steps;
  int64_t peak = 0, bound = 0;
  for (const mem::Plan& p : plans) {
    peak = std::max(peak, p.peak_bytes);
    bound = std::max(bound, p.lower_bound_bytes);
  }
  const double overhead = bound > 0 ? static_cast<double>(peak - bound) / bound : 0.0;
  // The plans the allocator installs: one per signature, over the envelope of its steps.
  const std::vector<mem::SignaturePlan>& sig_plans = planned->signature_plans;
  auto vs_steps = [](const mem::SignaturePlan& sp) {
    return sp.max_step_lower_bound_bytes > 0
               ? static_cast<double>(sp.group_peak_bytes - sp.max_step_lower_bound_bytes) /
                     sp.max_step_lower_bound_bytes
               : 0.0;
  };
  if (a.json) {
    nlohmann::json j;
    j["trace"] = path;
    j["events"] = trace.size();
    j["peak_bytes"] = peak;
    j["lower_bound_bytes"] = bound;
    j["overhead"] = overhead;
    j["steps"] = nlohmann::json::array();
    for (size_t i = 0; i < plans.size(); ++i) {
      const mem::Plan& p = plans[i];
      j["steps"].push_back({{"step", tables[i].step},
                            {"signature", p.signature},
                            {"algorithm", p.algorithm},
                            {"allocations", p.sizes.size()},
                            {"planned", Placed(p)},
                            {"peak_bytes", p.peak_bytes},
                            {"lower_bound_bytes", p.lower_bound_bytes},
                            {"other_peak_bytes", p.other_peak_bytes},
                            {"overhead", p.overhead()}});
    }
    j["signatures"] = nlohmann::json::array();
    for (const auto& sp : sig_plans) {
      j["signatures"].push_back({{"signature", sp.plan.signature},
                                 {"steps", sp.total_steps},
                                 {"merged_steps", sp.merged_steps},
                                 {"structures", sp.structures},
                                 {"group_peak_bytes", sp.group_peak_bytes},
                                 {"algorithm", sp.plan.algorithm},
                                 {"peak_bytes", sp.plan.peak_bytes},
                                 {"lower_bound_bytes", sp.plan.lower_bound_bytes},
                                 {"max_step_lower_bound_bytes", sp.max_step_lower_bound_bytes},
                                 {"overhead", sp.plan.overhead()},
                                 {"overhead_vs_steps", vs_steps(sp)}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return Status::Ok();
  }
  std::printf("%s: %zu events, %zu steps\n", path.c_str(), trace.size(), plans.size());
  std::printf("%6s %-16s %8s %8s %12s %12s %9s  %-18s %12s\n", "step", "signature", "allocs",
              "planned", "lower bound", "peak", "overhead", "algorithm", "other peak");
  for (size_t i = 0; i < plans.size(); ++i) {
    const mem::Plan& p = plans[i];
    std::printf("%6d %-16s %8zu %8lld %12s %12s %8.2f%%  %-18s %12s\n", tables[i].step,
                p.signature.empty() ? "-" : p.signature.c_str(), p.sizes.size(),
                static_cast<long long>(Placed(p)), mem::FormatBytes(p.lower_bound_bytes).c_str(),
                mem::FormatBytes(p.peak_bytes).c_str(), 100 * p.overhead(), p.algorithm.c_str(),
                mem::FormatBytes(p.other_peak_bytes).c_str());
  }
  std::printf("largest step: lower bound %s, peak %s, overhead %.2f%%\n",
              mem::FormatBytes(bound).c_str(), mem::FormatBytes(peak).c_str(), 100 * overhead);
  std::printf(
      "\nper signature (the plans the allocator installs: one per step structure, each the envelope"
      " of its steps; vs steps: the largest of them, carry-zone mirrors included, against the"
      " largest step's bound)\n");
  std::printf("%-16s %6s %7s %6s %12s %12s %9s %14s %9s\n", "signature", "steps", "merged", "plans",
              "lower bound", "peak", "overhead", "max step bound", "vs steps");
  for (const auto& sp : sig_plans) {
    std::printf("%-16s %6d %7d %6d %12s %12s %8.2f%% %14s %8.2f%%\n",
                sp.plan.signature.empty() ? "-" : sp.plan.signature.c_str(), sp.total_steps,
                sp.merged_steps, sp.structures, mem::FormatBytes(sp.plan.lower_bound_bytes).c_str(),
                mem::FormatBytes(sp.plan.peak_bytes).c_str(), 100 * sp.plan.overhead(),
                mem::FormatBytes(sp.max_step_lower_bound_bytes).c_str(), 100 * vs_steps(sp));
  }
  return Status::Ok();
}

nlohmann::json StatsJson(const std::string& mode, const mem::AllocatorStats& s) {
  return {{"mode", mode},
          {"peak_allocated_bytes", s.peak_allocated_bytes},
          {"peak_reserved_bytes", s.peak_reserved_bytes},
          {"fragmentation", s.fragmentation},
          {"largest_free_block_bytes", s.largest_free_block_bytes},
          {"num_allocs", s.num_allocs},
          {"pool_allocs", s.pool_allocs},
          {"planned_hits", s.planned_hits},
          {"planned_misses", s.planned_misses},
          {"planned_skips", s.planned_skips},
          {"planned_steps", s.planned_steps},
          {"first_sight_plans", s.first_sight_plans},
          {"plans_cached", s.plans_cached},
          {"plan_evictions", s.plan_evictions},
          {"arena_bytes", s.arena_bytes},
          {"alloc_latency_ns",
           {{"count", s.alloc_latency_ns.count},
            {"p50", s.alloc_latency_ns.p50},
            {"p99", s.alloc_latency_ns.p99},
            {"mean", s.alloc_latency_ns.mean}}}};
}

Status RunReplay(const Args& a, const std::string& path) {
  mem::ReplayOptions o;
  const int64_t segment_mb = a.segment_mb, capacity_gb = a.capacity_gb, max_plans = a.max_plans;
  if (segment_mb < 1) return InvalidArgumentError("--segment-mb must be at least 1");
  if (capacity_gb < 1) return InvalidArgumentError("--capacity-gb must be at least 1");
  if (max_plans < 0) return InvalidArgumentError("--max-plans must be >= 0 (0 = no bound)");
  o.segment_bytes = static_cast<size_t>(segment_mb) << 20;
  o.capacity_bytes = static_cast<size_t>(capacity_gb) << 30;
  o.max_plans = static_cast<size_t>(max_plans);
  std::vector<std::string> modes;
  if (a.mode == "all") {
    modes = {"pool", "planned", "first_sight", "caching"};
  } else {
    LF_RETURN_IF_ERROR(mem::ParseReplayMode(a.mode).status());
    modes = {a.mode};
  }
  LF_ASSIGN_OR_RETURN(mem::Trace trace, LoadTrace(path));
  std::vector<std::pair<std::string, mem::AllocatorStats>> results;
  for (const std::string& m : modes) {
    LF_ASSIGN_OR_RETURN(o.mode, mem::ParseReplayMode(m));
    StatusOr<mem::AllocatorStats> s = mem::ReplayTrace(trace, o);
    if (!s.ok()) return s.status().WithContext(path + " (mode " + m + ")");
    results.emplace_back(m, *s);
  }
  if (a.json) {
    nlohmann::json j;
    j["trace"] = path;
    j["events"] = trace.size();
    j["segment_bytes"] = o.segment_bytes;
    j["max_plans"] = o.max_plans;
    j["results"] = nlohmann::json::array();
    for (const auto& [m, s] : results) j["results"].push_back(StatsJson(m, s));
    std::printf("%s\n", j.dump(2).c_str());
    return Status::Ok();
  }
  std::printf("%s: %zu events, host replay (segments %lld MiB)\n", path.c_str(), trace.size(),
              static_cast<long long>(segment_mb));
  std::printf("%-12s %12s %12s %8s %12s %9s %9s %8s %8s %8s\n", "mode", "peak alloc", "peak resv",
              "frag", "largest free", "p50 ns", "p99 ns", "hits", "misses", "1st-sight");
  for (const auto& [m, s] : results) {
    std::printf("%-12s %12s %12s %7.2f%% %12s %9.0f %9.0f %8lld %8lld %8lld\n", m.c_str(),
                mem::FormatBytes(s.peak_allocated_bytes).c_str(),
                mem::FormatBytes(s.peak_reserved_bytes).c_str(), 100 * s.fragmentation,
                mem::FormatBytes(s.largest_free_block_bytes).c_str(), s.alloc_latency_ns.p50,
                s.alloc_latency_ns.p99, static_cast<long long>(s.planned_hits),
                static_cast<long long>(s.planned_misses),
                static_cast<long long>(s.first_sight_plans));
  }
  return Status::Ok();
}

void AddMem(CLI::App& root) {
  CLI::App* mem = AddCommand(root, "mem", "MemSculptor plans and allocator over a recorded trace");
  mem->footer(
      "TRACE lines: 'a ID SIZE STREAM TIME_NS', 'f ID STREAM TIME_NS', 's TIME_NS SIGNATURE'; the "
      "file may be zstd-compressed (e.g. bench/traces/*.trace.zst), as MemSculptor.record("
      "trace_path=...) writes it.");
  for (const char* name : {"plan", "replay"}) {
    auto a = std::make_shared<Args>();
    auto path = std::make_shared<std::string>();
    const bool replay = std::string(name) == "replay";
    CLI::App* app = AddCommand(
        *mem, name,
        replay ? "run the trace through MemSculptor's allocator over host memory: peak "
                 "allocated/reserved, fragmentation, planned hits/misses, latency"
               : "plan every step: lower bound (max live bytes), peak, overhead, algorithm",
        [replay, a, path] { return replay ? RunReplay(*a, *path) : RunPlan(*a, *path); });
    app->add_option("TRACE", *path, "trace file (text, or .zst)")->required();
    app->add_flag("--json", a->json, "print JSON instead of a table");
    if (!replay) continue;
    app->add_option("--mode", a->mode,
                    "pool, planned, first_sight, caching (a model of torch's caching allocator, "
                    "the baseline) or all, side by side")
        ->capture_default_str();
    // Bounded so that the byte sizes (MiB << 20, GiB << 30) cannot overflow.
    app->add_option("--segment-mb", a->segment_mb, "pool segment size in MiB")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
        ->capture_default_str();
    app->add_option("--capacity-gb", a->capacity_gb,
                    "host range standing in for device memory, GiB")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
    app->add_option("--max-plans", a->max_plans, "bound on cached plans (0 = none)")
        ->check(CLI::Range(int64_t{0}, INT64_MAX))
        ->capture_default_str();
  }
}

}  // namespace
LF_CLI_COMMAND(AddMem);
}  // namespace cli
}  // namespace loongforge
