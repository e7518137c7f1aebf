// Tests of MemSculptor's trace and planner: lifetime tables, offset plans checked by an
// independent simulation on random traces, lower bounds, plan cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "loongforge/memory.h"
#include "memory/planner.h"

namespace loongforge {
namespace mem {
namespace {

// A random step: n allocations with sizes from a few KiB to a few MiB, frees interleaved at random,
// `escape` of them never freed, on `streams` streams.
Trace RandomTrace(std::mt19937_64& rng, int n, int streams, double escape = 0.0, int steps = 1) {
  Trace t;
  uint64_t id = 1;
  std::uniform_int_distribution<int> log_size(9, 22);
  std::uniform_real_distribution<double> u(0, 1);
  for (int s = 0; s < steps; ++s) {
    t.MarkStep("sig" + std::to_string(s));
    std::vector<uint64_t> live;
    int allocated = 0;
    while (allocated < n || !live.empty()) {
      bool do_alloc = allocated < n && (live.empty() || u(rng) < 0.55);
      if (do_alloc) {
        int64_t size = (int64_t{1} << log_size(rng)) + static_cast<int64_t>(u(rng) * 1000);
        StreamId st = static_cast<StreamId>(rng() % streams);
        t.AddAlloc(id, size, st, 0);
        if (u(rng) >= escape) live.push_back(id);
        ++id;
        ++allocated;
      } else {
        size_t k = rng() % live.size();
        t.AddFree(live[k], 0, 0);
        live.erase(live.begin() + static_cast<long>(k));
      }
    }
  }
  return t;
}

// Independent of CheckPlan: replays the step's events in order, keeping the live placed
// intervals, and fails if a new allocation's bytes overlap a live one's.
::testing::AssertionResult SimulateNoOverlap(const Trace& trace, const LifetimeTable& table,
                                             const Plan& plan) {
  std::map<uint64_t, size_t> index_of;
  for (size_t i = 0; i < table.allocs.size(); ++i) index_of[table.allocs[i].id] = i;
  std::map<int64_t, std::pair<int64_t, uint64_t>> live;  // offset -> (end, id)
  int step = -1;
  for (const auto& e : trace.events()) {
    if (e.kind == TraceEvent::kStep) {
      ++step;
      continue;
    }
    if (step != table.step - 1 && table.step != 0) continue;
    auto it = index_of.find(e.id);
    if (it == index_of.end()) continue;
    int64_t off = plan.offsets[it->second];
    if (off == kNotPlanned) continue;
    if (e.kind == TraceEvent::kAlloc) {
      int64_t end = off + plan.sizes[it->second];
      if (plan.sizes[it->second] < e.size) {
        return ::testing::AssertionFailure() << "allocation " << e.id << " got fewer bytes";
      }
      for (const auto& [o, v] : live) {
        if (o < end && off < v.first) {
          return ::testing::AssertionFailure()
                 << "allocation " << e.id << " [" << off << "," << end << ") overlaps live "
                 << v.second << " [" << o << "," << v.first << ")";
        }
      }
      live[off] = {end, e.id};
    } else {
      live.erase(off);
    }
  }
  return ::testing::AssertionSuccess();
}

// Guards the core property: on random traces no plan puts two live allocations on the same bytes,
// and no plan beats the lower bound (which would mean the bound or the checker is wrong).
TEST(MemPlanner, RandomTracesNeverOverlap) {
  std::mt19937_64 rng(42);
  double worst_overhead = 0;
  for (int round = 0; round < 60; ++round) {
    int n = 5 + static_cast<int>(rng() % 150);
    Trace t = RandomTrace(rng, n, 1 + round % 2, round % 3 == 0 ? 0.1 : 0.0);
    auto tables = t.Lifetimes();
    ASSERT_TRUE(tables.ok()) << tables.status();
    ASSERT_EQ(tables->size(), 1u);
    const LifetimeTable& table = (*tables)[0];
    for (const Plan& p : {PlanGreedyBySize(table), PlanGreedyByBreadth(table), PlanStep(table)}) {
      ASSERT_TRUE(CheckPlan(table, p).ok()) << p.algorithm << ": " << CheckPlan(table, p);
      ASSERT_TRUE(SimulateNoOverlap(t, table, p)) << p.algorithm << " round " << round;
      EXPECT_GE(p.peak_bytes, p.lower_bound_bytes);
    }
    Plan best = PlanStep(table);
    EXPECT_LE(best.peak_bytes, best.other_peak_bytes);
    if (round % 2 == 0) worst_overhead = std::max(worst_overhead, best.overhead());
  }
  // Single-stream random traces pack well; a regression in the gap search shows up here.
  EXPECT_LT(worst_overhead, 0.35);
}

// Guards the checker itself: a plan moved onto a live neighbour must be rejected.
TEST(MemPlanner, CheckerRejectsOverlap) {
  Trace t;
  t.AddAlloc(1, 4096, 0, 0);
  t.AddAlloc(2, 4096, 0, 0);
  t.AddFree(1, 0, 0);
  t.AddFree(2, 0, 0);
  auto tables = t.Lifetimes();
  ASSERT_TRUE(tables.ok());
  Plan p = PlanStep((*tables)[0]);
  ASSERT_TRUE(CheckPlan((*tables)[0], p).ok());
  EXPECT_EQ(p.peak_bytes, 8192);
  p.offsets[1] = p.offsets[0];
  Status s = CheckPlan((*tables)[0], p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s;
}

// Guards reuse: a stack-like (LIFO) step and a sequence of disjoint lifetimes pack to the bound.
TEST(MemPlanner, LifoAndDisjointReachLowerBound) {
  Trace t;
  for (uint64_t i = 1; i <= 8; ++i) t.AddAlloc(i, static_cast<int64_t>(i) * 10000, 0, 0);
  for (uint64_t i = 8; i >= 1; --i) t.AddFree(i, 0, 0);
  for (uint64_t i = 100; i < 110; ++i) {
    t.AddAlloc(i, 1 << 20, 0, 0);
    t.AddFree(i, 0, 0);
  }
  auto tables = t.Lifetimes();
  ASSERT_TRUE(tables.ok());
  Plan p = PlanStep((*tables)[0]);
  EXPECT_TRUE(CheckPlan((*tables)[0], p).ok());
  EXPECT_EQ(p.peak_bytes, p.lower_bound_bytes);
  EXPECT_EQ(p.overhead(), 0.0);
}

// Guards the stream rule: allocations on two streams with disjoint lifetimes still get disjoint
// addresses (reuse across streams would need an event).
TEST(MemPlanner, StreamsDoNotShareBytes) {
  Trace t;
  t.AddAlloc(1, 1 << 20, 0, 0);
  t.AddFree(1, 0, 0);
  t.AddAlloc(2, 1 << 20, 7, 0);
  t.AddFree(2, 7, 0);
  auto tables = t.Lifetimes();
  ASSERT_TRUE(tables.ok());
  Plan p = PlanStep((*tables)[0]);
  EXPECT_TRUE(CheckPlan((*tables)[0], p).ok());
  EXPECT_EQ(p.lower_bound_bytes, 1 << 20);
  EXPECT_EQ(p.peak_bytes, 2 << 20);
  EXPECT_NE(p.offsets[0], p.offsets[1]);
}

// Guards the lifetime table: steps split at MarkStep, escaping allocations and foreign frees.
TEST(MemTrace, LifetimesPerStep) {
  Trace t;
  t.AddAlloc(1, 100, 0, 10);  // step 0, never freed: escapes (a parameter)
  t.MarkStep("b64", 20);
  t.AddAlloc(2, 1000, 0, 30);
  t.AddAlloc(3, 513, 0, 40);
  t.AddFree(2, 0, 50);
  t.AddFree(1, 0, 60);  // foreign: allocated in step 0
  t.MarkStep("b128", 70);
  t.AddAlloc(4, 10, 0, 80);
  t.AddFree(4, 0, 90);
  auto tables = t.Lifetimes();
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 3u);
  const LifetimeTable& s1 = (*tables)[1];
  EXPECT_EQ(s1.signature, "b64");
  EXPECT_EQ(s1.num_events, 4);
  EXPECT_EQ(s1.foreign_frees, 1);
  ASSERT_EQ(s1.allocs.size(), 2u);
  EXPECT_EQ(s1.allocs[0].alloc_seq, 0);
  EXPECT_EQ(s1.allocs[0].free_seq, 2);
  EXPECT_TRUE(s1.allocs[0].freed_in_step);
  EXPECT_EQ(s1.allocs[0].free_ns - s1.allocs[0].alloc_ns, 20);
  EXPECT_FALSE(s1.allocs[1].freed_in_step);
  EXPECT_EQ(s1.allocs[1].free_seq, 4);
  Plan p = PlanStep(s1, "b64");
  EXPECT_EQ(p.offsets[1], kNotPlanned);
  EXPECT_EQ(p.peak_bytes, 1024);
  EXPECT_TRUE(CheckPlan(s1, p).ok());
}

// Guards input validation: a live id allocated again is an error naming the event.
TEST(MemTrace, DoubleAllocIsAnError) {
  Trace t;
  t.AddAlloc(5, 100, 0, 0);
  t.AddAlloc(5, 100, 0, 0);
  auto tables = t.Lifetimes();
  ASSERT_FALSE(tables.ok());
  EXPECT_EQ(tables.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tables.status().message().find("event 1"), std::string::npos);
}

// Guards the text format used by the CLI and Python: a round trip keeps every field.
TEST(MemTrace, TextRoundTrip) {
  std::mt19937_64 rng(7);
  Trace t = RandomTrace(rng, 30, 2, 0.1, 2);
  auto back = Trace::FromText(t.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToText(), t.ToText());
  auto bad = Trace::FromText("a 1 100 0 0\nx nonsense\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos);
}

// Guards the cache: plans are keyed by signature and replaced, not merged.
TEST(MemPlanner, PlanCacheBySignature) {
  PlanCache cache;
  Plan a;
  a.signature = "b64";
  a.peak_bytes = 1;
  Plan b;
  b.signature = "b128";
  b.peak_bytes = 2;
  cache.Put(a);
  cache.Put(b);
  EXPECT_EQ(cache.Get("b64")->peak_bytes, 1);
  EXPECT_EQ(cache.Get("b128")->peak_bytes, 2);
  EXPECT_EQ(cache.Get("b256"), nullptr);
  a.peak_bytes = 3;
  cache.Put(a);
  EXPECT_EQ(cache.Get("b64")->peak_bytes, 3);
  EXPECT_EQ(cache.size(), 2u);
}

// Guards the LRU bound: Get refreshes an entry, Contains does not, replacing an entry does not
// evict, the largest peak follows evictions, and lowering the bound evicts at once.
TEST(MemPlanner, PlanCacheLru) {
  PlanCache cache(2);
  auto put = [&](const std::string& sig, int64_t peak) {
    Plan p;
    p.signature = sig;
    p.peak_bytes = peak;
    cache.Put(p);
  };
  put("a", 30);
  put("b", 10);
  auto held = cache.Get("a");  // "a" is now more recent than "b"
  EXPECT_TRUE(cache.Contains("b"));
  put("c", 20);
  EXPECT_FALSE(cache.Contains("b"));
  EXPECT_TRUE(cache.Contains("a"));
  EXPECT_EQ(cache.MaxPeakBytes(), 30);
  put("c", 25);  // replace: no eviction
  EXPECT_EQ(cache.evictions(), 1);
  EXPECT_EQ(cache.size(), 2u);
  cache.set_max_plans(1);  // "a" is the least recent now
  EXPECT_EQ(cache.Signatures(), std::vector<std::string>{"c"});
  EXPECT_EQ(cache.MaxPeakBytes(), 25);
  EXPECT_EQ(held->peak_bytes, 30) << "an evicted plan stays valid while held";
  EXPECT_EQ(cache.evictions(), 2);
}

// Guards Trace::Save/Load: plain and zstd files give back the same events; the compressed file
// is smaller; a corrupt frame is DataLoss and a missing file NotFound, both naming the path.
TEST(MemTrace, SaveLoadPlainAndZstd) {
  Trace t;
  t.MarkStep("len64", 5);
  for (uint64_t i = 1; i <= 200; ++i) t.AddAlloc(i, static_cast<int64_t>(i * 1000), 7, i * 10);
  for (uint64_t i = 1; i <= 200; ++i) t.AddFree(i, 7, 5000 + i);
  std::string dir = ::testing::TempDir();
  std::string plain = dir + "/lf_trace_plain.trace", zst = dir + "/lf_trace.trace.zst";
  ASSERT_TRUE(t.Save(plain, false).ok());
  ASSERT_TRUE(t.Save(zst, true).ok());
  auto a = Trace::Load(plain);
  auto b = Trace::Load(zst);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->ToText(), t.ToText());
  EXPECT_EQ(b->ToText(), t.ToText());
  std::ifstream in(zst, std::ios::binary | std::ios::ate);
  EXPECT_LT(static_cast<size_t>(in.tellg()), t.ToText().size() / 3);
  // Corrupt the frame after the magic number.
  {
    std::fstream f(zst, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(6);
    f.write("\xff\xff\xff\xff\xff\xff", 6);
  }
  auto c = Trace::Load(zst);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss) << c.status();
  EXPECT_NE(c.status().message().find("lf_trace.trace.zst"), std::string::npos);
  auto d = Trace::Load(dir + "/lf_no_such.trace");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  std::remove(plain.c_str());
  std::remove(zst.c_str());
}

// Guards PlanSignature (Note [Envelope plans]): same-structure steps merge with per-allocation
// maximum sizes and the plan is valid for each of them; a step of another structure is left out.
// The base is the step with the most live bytes.
TEST(MemPlanner, EnvelopeOfSameStructureSteps) {
  auto step = [](int64_t a_size, int64_t b_size, bool extra) {
    Trace t;
    t.MarkStep("moe");
    t.AddAlloc(1, a_size, 0, 0);
    t.AddAlloc(2, b_size, 0, 0);
    t.AddFree(1, 0, 0);
    t.AddAlloc(3, 4096, 0, 0);
    t.AddFree(2, 0, 0);
    t.AddFree(3, 0, 0);
    if (extra) {
      t.AddAlloc(4, 512, 0, 0);
      t.AddFree(4, 0, 0);
    }
    return std::move(*t.Lifetimes())[0];
  };
  LifetimeTable s1 = step(100000, 8000, false), s2 = step(20000, 64000, false),
                s3 = step(4096, 4096, true);
  EXPECT_TRUE(SameStructure(s1, s2));
  EXPECT_FALSE(SameStructure(s1, s3));
  SignaturePlan sp = PlanSignature({&s3, &s1, &s2});
  EXPECT_EQ(sp.total_steps, 3);
  EXPECT_EQ(sp.merged_steps, 2);  // s3 differs in structure
  EXPECT_EQ(sp.envelope.allocs[0].size, 100000);
  EXPECT_EQ(sp.envelope.allocs[1].size, 64000);
  EXPECT_EQ(sp.max_step_lower_bound_bytes, LowerBoundBytes(s1));  // the largest step: the base
  ASSERT_TRUE(CheckPlan(sp.envelope, sp.plan).ok());
  // The envelope's plan, with each step's own sizes, never overlaps live allocations.
  for (const LifetimeTable* t : {&s1, &s2}) {
    Plan p = sp.plan;
    for (size_t i = 0; i < p.sizes.size(); ++i) {
      EXPECT_LE(static_cast<int64_t>(RoundUp(t->allocs[i].size)), p.sizes[i]);
      p.sizes[i] = static_cast<int64_t>(RoundUp(t->allocs[i].size));
    }
    EXPECT_TRUE(CheckPlan(*t, p).ok()) << CheckPlan(*t, p);
  }
  EXPECT_GE(sp.plan.peak_bytes, sp.max_step_lower_bound_bytes);
}

// Guards the base choice of PlanSignature: the plan is made for the signature's largest step (by
// lower bound), even when it is neither the last nor of the majority's structure, so the arena
// holds the largest step; its overhead is measured against that step's lower bound.
TEST(MemPlanner, SignaturePlanBaseIsLargestStep) {
  auto step = [](int64_t size, bool extra) {
    Trace t;
    t.MarkStep("moe");
    t.AddAlloc(1, size, 0, 0);
    if (extra) t.AddAlloc(9, 8192, 0, 0);
    t.AddAlloc(2, size / 2, 0, 0);
    t.AddFree(1, 0, 0);
    t.AddFree(2, 0, 0);
    if (extra) t.AddFree(9, 0, 0);
    return std::move(*t.Lifetimes())[0];
  };
  LifetimeTable small1 = step(10000, false), big = step(400000, true), small2 = step(20000, false);
  SignaturePlan sp = PlanSignature({&small1, &big, &small2});
  EXPECT_EQ(sp.merged_steps, 1);
  EXPECT_EQ(sp.envelope.allocs.size(), 3u);  // big's structure
  EXPECT_EQ(sp.max_step_lower_bound_bytes, LowerBoundBytes(big));
  EXPECT_GE(sp.plan.peak_bytes, LowerBoundBytes(big));
  EXPECT_TRUE(CheckPlan(sp.envelope, sp.plan).ok());
}

// Three steps of one signature: a carry-in from the step before (id 1000 + step, freed after two
// allocations), a carry-out (5) that outlives the step, and, in the "workspace" steps, an extra
// allocation inserted after the first expert buffer (the MoE layer's GEMM workspace).
std::vector<LifetimeTable> CarryWorkspaceSteps() {
  Trace t;
  t.AddAlloc(1000, 3000, 0, 0);  // before the first step: the first step's carry-in
  uint64_t id = 1;
  for (int s = 0; s < 3; ++s) {
    const bool workspace = s == 1;
    const int64_t expert = s == 0 ? 40000 : (s == 1 ? 90000 : 30000);
    t.MarkStep("moe");
    uint64_t in = 1000 + static_cast<uint64_t>(s), out = 1001 + static_cast<uint64_t>(s);
    t.AddAlloc(out, 3000, 0, 0);  // carry-out, allocated first
    uint64_t a = id++, b = id++, w = id++, c = id++;
    t.AddAlloc(a, 20000, 0, 0);   // saved activation
    t.AddAlloc(b, expert, 0, 0);  // expert buffer: size varies
    t.AddFree(in, 0, 0);          // the previous step's carry goes
    if (workspace) {
      t.AddAlloc(w, 8192, 0, 0);
      t.AddFree(w, 0, 0);
    }
    t.AddAlloc(c, 60000, 0, 0);  // gradient
    t.AddFree(b, 0, 0);
    t.AddFree(a, 0, 0);
    t.AddFree(c, 0, 0);
  }
  return std::move(*t.Lifetimes());
}

// Guards Note [Carry zones]: allocations that outlive the step are placed in zone 0 of two
// equal zones at the arena's bottom (zone 1 in the mirror plan); nothing of the step uses the
// other zone before the last foreign free, where the previous step's carries are; the plan
// counts its carries in its lower bound and stays valid (CheckSignaturePlan).
TEST(MemPlanner, CarriesPlannedInAlternatingZones) {
  std::vector<LifetimeTable> steps = CarryWorkspaceSteps();
  ASSERT_EQ(steps.size(), 4u);  // the events before the first mark are step 0
  std::vector<LifetimeTable> recorded(steps.begin() + 1, steps.end());
  const int64_t zone = CarryZoneBytes(recorded);
  EXPECT_EQ(zone, static_cast<int64_t>(RoundUp(3000)));
  SignaturePlan sp = PlanSignature({&recorded[0], &recorded[2]}, zone);
  ASSERT_TRUE(CheckSignaturePlan(sp).ok()) << CheckSignaturePlan(sp);
  ASSERT_NE(sp.plan.mirror, nullptr);
  const LifetimeTable& t = sp.envelope;
  for (const Plan* p : {static_cast<const Plan*>(&sp.plan), sp.plan.mirror.get()}) {
    ASSERT_EQ(p->carries.size(), t.allocs.size());
    const int z = p->carry_zone;
    EXPECT_EQ(z, p == &sp.plan ? 0 : 1);
    EXPECT_EQ(p->offsets[0], z * zone);  // the carry-out, in its zone
    EXPECT_TRUE(p->carries[0]);
    for (size_t i = 1; i < t.allocs.size(); ++i) {
      EXPECT_FALSE(p->carries[i]);
      // Live before the carry-in's free: not in the other zone.
      if (t.allocs[i].alloc_seq <= t.last_foreign_free_seq) {
        const int64_t other = (1 - z) * zone;
        EXPECT_TRUE(p->offsets[i] >= other + zone || p->offsets[i] + p->sizes[i] <= other) << i;
      }
    }
    EXPECT_GE(p->peak_bytes, LowerBoundBytes(t, /*with_carries=*/true));
  }
  EXPECT_GT(LowerBoundBytes(t, true), LowerBoundBytes(t));
  // Without a zone, carries are not placed (the pool serves them), as before.
  SignaturePlan plain = PlanSignature({&recorded[0]});
  EXPECT_EQ(plain.plan.offsets[0], kNotPlanned);
  EXPECT_EQ(plain.plan.mirror, nullptr);
}

// Guards Lifetime::persistent: a tensor that outlives its step is a carry when the next step
// frees it, persistent when it is still live at the next step's end (a training loop's gradients
// and optimizer state, made in step 1); persistent ones get neither a carry zone nor an arena
// slot, and do not size the zones. The last recorded step cannot tell: its outliving tensors stay
// carries.
TEST(MemPlanner, PersistentTensorsAreNotCarries) {
  Trace t;
  t.MarkStep("s", 0);
  t.AddAlloc(1, 64 << 20, 0, 0);  // optimizer state: never freed
  t.AddAlloc(2, 4096, 0, 0);      // the loss: freed in the next step
  t.AddAlloc(3, 8192, 0, 0);      // a temporary
  t.AddFree(3, 0, 0);
  t.MarkStep("s", 0);
  t.AddFree(2, 0, 0);
  t.AddAlloc(4, 4096, 0, 0);  // this step's loss, freed in the third
  t.AddAlloc(5, 8192, 0, 0);
  t.AddFree(5, 0, 0);
  t.MarkStep("s", 0);
  t.AddFree(4, 0, 0);
  t.AddAlloc(6, 4096, 0, 0);  // outlives the last recorded step
  auto tables = t.Lifetimes();
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 3u);
  const auto& s1 = (*tables)[0].allocs;
  EXPECT_TRUE(s1[0].persistent && !IsCarry(s1[0]));
  EXPECT_TRUE(!s1[1].persistent && IsCarry(s1[1]));
  EXPECT_FALSE(s1[2].persistent || IsCarry(s1[2]));
  EXPECT_TRUE(IsCarry((*tables)[1].allocs[0]));
  EXPECT_TRUE(IsCarry((*tables)[2].allocs[0]));
  // The zones hold one step's carries (4 KiB), not the 64 MiB state.
  const int64_t zone = CarryZoneBytes(*tables);
  EXPECT_EQ(zone, static_cast<int64_t>(RoundUp(4096)));
  SignaturePlan sp = PlanSignature({&(*tables)[0]}, zone);
  ASSERT_TRUE(CheckSignaturePlan(sp).ok()) << CheckSignaturePlan(sp);
  EXPECT_EQ(sp.plan.offsets[0], kNotPlanned);  // the pool serves it
  EXPECT_NE(sp.plan.offsets[1], kNotPlanned);  // the carry, in its zone
  EXPECT_LT(sp.plan.peak_bytes, 64 << 20);
}

// Guards Note [Sibling plans]: steps of one signature with another structure (an inserted
// workspace) get their own plans, planned together with the base: the allocations the steps
// share from the start have the same offsets in every plan, each plan is valid for its own
// structure (CheckSignaturePlan), and no sizes are widened across structures.
TEST(MemPlanner, SiblingPlansShareTheirCommonPrefix) {
  std::vector<LifetimeTable> all = CarryWorkspaceSteps();
  std::vector<LifetimeTable> recorded(all.begin() + 1, all.end());
  const int64_t zone = CarryZoneBytes(recorded);
  SignaturePlan sp = PlanSignature({&recorded[0], &recorded[1], &recorded[2]}, zone);
  ASSERT_TRUE(CheckSignaturePlan(sp).ok()) << CheckSignaturePlan(sp);
  EXPECT_EQ(sp.structures, 2);
  EXPECT_EQ(sp.merged_steps, 1);  // the base: step 1 (workspace, the largest); 0 and 2 merge
  ASSERT_EQ(sp.plan.siblings.size(), 1u);
  ASSERT_EQ(sp.sibling_envelopes.size(), 1u);
  const Plan& base = sp.plan;
  const Plan& sib = *sp.plan.siblings[0];
  EXPECT_EQ(base.sizes.size(), 4u + 1u);  // carry, a, b, workspace, c
  EXPECT_EQ(sib.sizes.size(), 4u);
  // Slots 0 and 1 (carry-out, saved activation) agree in size, so in offset; slot 2 (the
  // expert buffer) differs in size: each plan has its own.
  EXPECT_EQ(base.offsets[0], sib.offsets[0]);
  EXPECT_EQ(base.offsets[1], sib.offsets[1]);
  EXPECT_EQ(sib.sizes[2],
            static_cast<int64_t>(RoundUp(40000)));  // its own envelope (40000 > 30000)
  EXPECT_EQ(base.sizes[2], static_cast<int64_t>(RoundUp(90000)));
  EXPECT_EQ(sp.plan.mirror->siblings.size(), 1u);
  EXPECT_GE(sp.group_peak_bytes, std::max(base.peak_bytes, sib.peak_bytes));
  EXPECT_EQ(sp.max_step_lower_bound_bytes, LowerBoundBytes(recorded[1], true));
}

}  // namespace
}  // namespace mem
}  // namespace loongforge
