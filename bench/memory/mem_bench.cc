// MemSculptor CPU benchmark: replays synthetic GR00T-shaped training steps with variable text
// length through (a) a model of torch's caching allocator (src/memory/caching_model.h),
// (b) MemSculptor's pool alone, (c) MemSculptor planned + pool fallback, over host memory.
// Reports peak allocated/reserved, fragmentation at peak, largest free block and allocation
// latency p50/p99 (ns, timed around each call the same way for all three). Prints a table, writes
// JSON. Usage: loongforge_mem_bench [--steps N] [--warmup N] [--batch B] [--seed S] [--json PATH]
//                                   [--no-first-sight] [--max-plans N]
// --no-first-sight turns off planning of signatures unseen during warm-up (Note [First sight] in
// src/memory/allocator.cc), to show what a missed bucket costs.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "loongforge/memory.h"
#include "loongforge/metrics.h"
#include "memory/caching_model.h"

namespace loongforge {
namespace mem {
namespace {

// ---- synthetic step ------------------------------------------------------------------------
// One event of a step: alloc `slot` of `bytes`, or free `slot`.
struct Op {
  bool alloc;
  int slot;
  size_t bytes;
};

// A GR00T-N1.6-shaped step (bf16): 2 cameras x 256 vision tokens + `text` tokens through a
// 16-layer language backbone (hidden 2048, MLP 8192; bottom 12 frozen under no_grad, top 4
// trained), then a 32-layer DiT action head (hidden 1024, MLP 4096, 17 action/state tokens per
// sample) with cross-attention K/V over the vision-language tokens, then backward.
std::vector<Op> Gr00tStep(int batch, int text) {
  std::vector<Op> ops;
  int next_slot = 0;
  auto A = [&](size_t bytes) {
    ops.push_back({true, next_slot, bytes});
    return next_slot++;
  };
  auto F = [&](int slot) { ops.push_back({false, slot, 0}); };
  const size_t B = batch, T = 512 + text, d = 2048, ffn = 8192, heads = 16, bf = 2;
  const size_t btd = B * T * d * bf;
  std::vector<std::pair<int, size_t>> saved;  // (slot, bytes), in forward order
  int x = A(btd);                             // embeddings
  for (int l = 0; l < 16; ++l) {
    bool train = l >= 12;
    int ln = A(btd), qkv = A(3 * btd);
    if (!train) F(ln);
    int att = A(btd), lse = A(B * heads * T * 4);
    if (!train) {
      F(qkv);
      F(lse);
    }
    int o = A(btd);
    if (!train) F(att);
    int x1 = A(btd);
    F(o);
    if (!train) F(x);
    int ln2 = A(btd), up = A(B * T * ffn * bf);
    if (!train) F(ln2);
    int act = A(B * T * ffn * bf);
    if (!train) F(up);
    int down = A(btd);
    if (!train) F(act);
    int x2 = A(btd);
    F(down);
    if (!train) F(x1);
    if (train) {
      saved.push_back({x, btd});  // the layer's input, for the residual's backward
      for (auto [s, b] : {std::pair<int, size_t>{ln, btd},
                          {qkv, 3 * btd},
                          {att, btd},
                          {lse, B * heads * T * 4},
                          {x1, btd},
                          {ln2, btd},
                          {up, B * T * ffn * bf},
                          {act, B * T * ffn * bf}}) {
        saved.push_back({s, b});
      }
    }
    x = x2;
  }
  saved.push_back({x, btd});  // VL features, kept for the action head
  const size_t dd = 1024, dffn = 4096, BA = B * 17;
  int h = A(BA * dd * bf);
  for (int l = 0; l < 32; ++l) {
    int kv = A(B * T * 2 * dd * bf);  // cross-attention K/V over the VL tokens
    int n1 = A(BA * dd * bf), q = A(BA * 3 * dd * bf), sa = A(BA * dd * bf);
    int n2 = A(BA * dd * bf), ca = A(BA * dd * bf), mlp = A(BA * dffn * bf),
        act = A(BA * dffn * bf);
    int out = A(BA * dd * bf);
    for (auto [s, b] : {std::pair<int, size_t>{kv, B * T * 2 * dd * bf},
                        {n1, BA * dd * bf},
                        {q, BA * 3 * dd * bf},
                        {sa, BA * dd * bf},
                        {n2, BA * dd * bf},
                        {ca, BA * dd * bf},
                        {mlp, BA * dffn * bf},
                        {act, BA * dffn * bf},
                        {h, BA * dd * bf}}) {
      saved.push_back({s, b});
    }
    h = out;
  }
  int loss = A(BA * 32 * 4);
  F(h);
  // Backward: walk saved tensors in reverse; each makes a gradient of its size and frees itself.
  int g = A(BA * 32 * 4);
  F(loss);
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    int gs = A(it->second);
    F(it->first);
    F(g);
    g = gs;
  }
  F(g);
  return ops;
}

// ---- drivers ------------------------------------------------------------------------------
struct Result {
  std::string name;
  AllocatorStats stats;
  HistogramSummary lat;
  int64_t allocs = 0;
};

using AllocFn = std::function<void*(size_t)>;
using FreeFn = std::function<void(void*)>;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs `ops`; times each allocation into `lat` when given.
void RunOps(const std::vector<Op>& ops, const AllocFn& alloc, const FreeFn& free_fn, Histogram* lat,
            int64_t* allocs) {
  std::unordered_map<int, void*> live;
  live.reserve(ops.size());
  for (const Op& op : ops) {
    if (op.alloc) {
      int64_t t0 = NowNs();
      void* p = alloc(op.bytes);
      int64_t t1 = NowNs();
      if (lat) lat->Record(static_cast<double>(t1 - t0));
      ++*allocs;
      live[op.slot] = p;
    } else {
      free_fn(live[op.slot]);
      live.erase(op.slot);
    }
  }
}

[[noreturn]] void Die(const Status& s) {
  std::fprintf(stderr, "loongforge_mem_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// m.Allocate(n, 0) as RunOps' AllocFn; an error ends the bench.
template <typename Allocator>
AllocFn AllocateOrDie(Allocator& m) {
  return [&m](size_t n) {
    auto p = m.Allocate(n, 0);
    if (!p.ok()) Die(p.status());
    return *p;
  };
}

// m.Free(p, free_args...) as RunOps' FreeFn; an error ends the bench.
template <typename Allocator, typename... Args>
FreeFn FreeOrDie(Allocator& m, Args... free_args) {
  return [&m, free_args...](void* p) {
    Status s = m.Free(p, free_args...);
    if (!s.ok()) Die(s);
  };
}

}  // namespace
}  // namespace mem
}  // namespace loongforge

int main(int argc, char** argv) {
  using namespace loongforge;
  using namespace loongforge::mem;
  int steps = 200, warmup = 24, batch = 16;
  bool first_sight = true;
  int max_plans = 64;
  uint64_t seed = 1;
  std::string json_path = "results/bench_memory.json";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps")
      steps = std::atoi(next());
    else if (a == "--warmup")
      warmup = std::atoi(next());
    else if (a == "--batch")
      batch = std::atoi(next());
    else if (a == "--seed")
      seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--json")
      json_path = next();
    else if (a == "--no-first-sight")
      first_sight = false;
    else if (a == "--max-plans")
      max_plans = std::atoi(next());
    else {
      std::fprintf(stderr,
                   "usage: %s [--steps N] [--warmup N] [--batch B] [--seed S] [--json P] "
                   "[--no-first-sight] [--max-plans N]\n",
                   argv[0]);
      return 2;
    }
  }
  // Text lengths: padding buckets of 32 tokens from 32 to 256, drawn uniformly per step.
  std::vector<int> buckets;
  for (int t = 32; t <= 256; t += 32) buckets.push_back(t);
  std::mt19937_64 rng(seed);
  std::vector<int> schedule(warmup + steps);
  for (auto& s : schedule) s = buckets[rng() % buckets.size()];
  std::unordered_map<int, std::vector<Op>> step_ops;
  for (int t : buckets) step_ops[t] = Gr00tStep(batch, t);

  const size_t kCapacity = size_t{1} << 40;  // host range standing in for device memory
  std::vector<Result> results;

  {  // (a) torch caching allocator model
    loongforge::mem::internal::CachingAllocatorModel m(CreateHostBackend(kCapacity));
    Result r{"torch caching allocator (model)"};
    Histogram lat(size_t{1} << 22);
    const AllocFn alloc = AllocateOrDie(m);
    const FreeFn fr = FreeOrDie(m);
    int64_t dummy = 0;
    for (int i = 0; i < warmup; ++i) RunOps(step_ops[schedule[i]], alloc, fr, nullptr, &dummy);
    m.ResetPeaks();
    for (int i = warmup; i < warmup + steps; ++i)
      RunOps(step_ops[schedule[i]], alloc, fr, &lat, &r.allocs);
    r.stats = m.Stats();
    r.lat = lat.Summary();
    results.push_back(r);
  }
  int64_t max_lower_bound = 0;
  for (bool planned : {false, true}) {  // (b) pool only, (c) planned + pool
    MemAllocator::Options o;
    o.record_latency = false;  // timed by the driver, like the baseline
    o.plan_unseen_signatures = planned && first_sight;
    o.max_plans = static_cast<size_t>(max_plans);
    MemAllocator m(o, CreateHostBackend(kCapacity), std::make_unique<CpuFence>());
    Result r{planned ? "MemSculptor planned + pool" : "MemSculptor pool only"};
    Histogram lat(size_t{1} << 22);
    const AllocFn alloc = AllocateOrDie(m);
    const FreeFn fr = FreeOrDie(m, StreamId{0});
    auto sig = [](int t) { return "text" + std::to_string(t); };
    int64_t dummy = 0;
    if (planned) m.StartRecording();
    for (int i = 0; i < warmup; ++i) {
      if (!m.BeginStep(sig(schedule[i])).ok()) Die(InternalError("BeginStep"));
      RunOps(step_ops[schedule[i]], alloc, fr, nullptr, &dummy);
      m.EndStep();
    }
    if (planned) {
      auto plans = m.PlanFromTrace(m.StopRecording());
      if (!plans.ok()) Die(plans.status());
      std::printf("planned %zu buckets:\n", plans->size());
      for (const Plan& p : *plans) {
        max_lower_bound = std::max(max_lower_bound, p.lower_bound_bytes);
        std::printf(
            "  %-8s %5zu allocs  peak %10s  lower bound %10s  overhead %5.2f%%  (%s; other "
            "%s)\n",
            p.signature.c_str(), p.sizes.size(), FormatBytes(p.peak_bytes).c_str(),
            FormatBytes(p.lower_bound_bytes).c_str(), 100 * p.overhead(), p.algorithm.c_str(),
            FormatBytes(p.other_peak_bytes).c_str());
      }
      m.ReleaseCached();  // the recording's pool segments are no longer needed
    }
    m.ResetPeaks();
    for (int i = warmup; i < warmup + steps; ++i) {
      if (!m.BeginStep(sig(schedule[i])).ok()) Die(InternalError("BeginStep"));
      RunOps(step_ops[schedule[i]], alloc, fr, &lat, &r.allocs);
      m.EndStep();
    }
    r.stats = m.Stats();
    r.lat = lat.Summary();
    if (planned) {
      std::printf(
          "planned on first sight during the measured steps: %lld signature(s); plans cached %lld "
          "(max %d), evicted %lld; arena %s\n",
          static_cast<long long>(r.stats.first_sight_plans),
          static_cast<long long>(r.stats.plans_cached), max_plans,
          static_cast<long long>(r.stats.plan_evictions), FormatBytes(r.stats.arena_bytes).c_str());
    }
    results.push_back(r);
  }

  std::printf(
      "\nGR00T-shaped step, batch %d, text length in %zu buckets (32..256), %d steps after "
      "%d warm-up, %zu..%zu allocations per step\n",
      batch, buckets.size(), steps, warmup, step_ops[32].size() / 2, step_ops[256].size() / 2);
  std::printf("max live bytes of any step (lower bound): %s\n\n",
              FormatBytes(max_lower_bound).c_str());
  std::printf("%-32s %12s %12s %8s %12s %9s %9s %8s %8s\n", "allocator", "peak alloc", "peak resv",
              "frag", "largest free", "p50 ns", "p99 ns", "hits", "misses");
  for (const Result& r : results) {
    std::printf("%-32s %12s %12s %7.2f%% %12s %9.0f %9.0f %8lld %8lld\n", r.name.c_str(),
                FormatBytes(r.stats.peak_allocated_bytes).c_str(),
                FormatBytes(r.stats.peak_reserved_bytes).c_str(), 100 * r.stats.fragmentation,
                FormatBytes(r.stats.largest_free_block_bytes).c_str(), r.lat.p50, r.lat.p99,
                static_cast<long long>(r.stats.planned_hits),
                static_cast<long long>(r.stats.planned_misses));
  }
  FILE* f = std::fopen(json_path.c_str(), "w");
  if (f) {
    std::fprintf(f,
                 "{\"batch\": %d, \"steps\": %d, \"warmup\": %d, \"seed\": %llu, "
                 "\"first_sight\": %s, \"max_plans\": %d, \"max_lower_bound_bytes\": %lld, "
                 "\"results\": [",
                 batch, steps, warmup, static_cast<unsigned long long>(seed),
                 first_sight ? "true" : "false", max_plans,
                 static_cast<long long>(max_lower_bound));
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "%s{\"allocator\": \"%s\", \"peak_allocated_bytes\": %lld, "
                   "\"peak_reserved_bytes\": %lld, \"fragmentation\": %.6f, "
                   "\"largest_free_block_bytes\": %lld, \"allocs\": %lld, \"planned_hits\": %lld, "
                   "\"planned_misses\": %lld, \"first_sight_plans\": %lld, "
                   "\"pool_allocs\": %lld, \"latency_ns\": %s}",
                   i ? ", " : "", r.name.c_str(),
                   static_cast<long long>(r.stats.peak_allocated_bytes),
                   static_cast<long long>(r.stats.peak_reserved_bytes), r.stats.fragmentation,
                   static_cast<long long>(r.stats.largest_free_block_bytes),
                   static_cast<long long>(r.allocs), static_cast<long long>(r.stats.planned_hits),
                   static_cast<long long>(r.stats.planned_misses),
                   static_cast<long long>(r.stats.first_sight_plans),
                   static_cast<long long>(r.stats.pool_allocs), SummaryToJson(r.lat).c_str());
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
    std::printf("\nwrote %s\n", json_path.c_str());
  } else {
    std::fprintf(stderr, "cannot write %s (the table above stands)\n", json_path.c_str());
  }
  return 0;
}
