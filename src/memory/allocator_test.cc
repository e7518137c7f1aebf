// Tests of MemAllocator on the CPU (HostBackend + CpuFence): pooled best-fit with splitting and
// coalescing, alignment, persistent vs transient pools, stream-safe reuse, threads, exhaustion,
// and the planned path (hits, divergence, late frees).
//
// Over 900 lines on purpose: the tests follow allocator.cc's Notes in order and share its fixtures
// (MakeAllocator, Tracked/Intact, LayerStep); split, the fixtures would need a header of their own
// for one test binary.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "loongforge/memory.h"
#include "memory/planner.h"

namespace loongforge {
namespace mem {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::unique_ptr<MemAllocator> MakeAllocator(size_t capacity, size_t segment,
                                            CpuFence** fence_out = nullptr) {
  MemAllocator::Options o;
  o.segment_bytes = segment;
  auto fence = std::make_unique<CpuFence>();
  if (fence_out) *fence_out = fence.get();
  return std::make_unique<MemAllocator>(o, CreateHostBackend(capacity), std::move(fence));
}

// Writes a per-allocation byte pattern over the whole block and checks it later: overlapping
// live blocks corrupt each other's pattern.
struct Tracked {
  void* p;
  size_t n;
  uint8_t tag;
};
void Fill(const Tracked& t) { std::memset(t.p, t.tag, t.n); }
bool Intact(const Tracked& t) {
  const auto* b = static_cast<const uint8_t*>(t.p);
  for (size_t i = 0; i < t.n; i += 61) {
    if (b[i] != t.tag) return false;
  }
  return b[t.n - 1] == t.tag;
}

// Guards alignment and rounding: every pointer is 512-aligned and sizes round up to 512.
TEST(MemAllocator, AlignmentAndRounding) {
  auto a = MakeAllocator(64 * kMiB, 4 * kMiB);
  std::vector<void*> ptrs;
  for (size_t sz : {1, 511, 512, 513, 1000, 4097, 0}) {
    auto p = a->Allocate(sz, 0);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % kAlignBytes, 0u);
    ptrs.push_back(*p);
  }
  // 512*3 + 1024 + 1024 + 4608 + 512
  EXPECT_EQ(a->Stats().allocated_bytes, 512 * 3 + 1024 + 1024 + 4608 + 512);
  for (void* p : ptrs) ASSERT_TRUE(a->Free(p, 0).ok());
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards splitting, best-fit and coalescing: holes are reused by size, neighbours merge back into
// one free block spanning the segment.
TEST(MemAllocator, SplitBestFitCoalesce) {
  auto a = MakeAllocator(64 * kMiB, 4 * kMiB);
  void* x = *a->Allocate(256 * 1024, 0);
  void* y = *a->Allocate(64 * 1024, 0);
  void* z = *a->Allocate(512 * 1024, 0);
  void* w = *a->Allocate(32 * 1024, 0);
  void* v = *a->Allocate(128 * 1024, 0);
  EXPECT_EQ(a->Stats().segments, 1);
  ASSERT_TRUE(a->Free(y, 0).ok());  // 64 KiB hole
  ASSERT_TRUE(a->Free(w, 0).ok());  // 32 KiB hole
  void* q = *a->Allocate(30 * 1024, 0);
  EXPECT_EQ(q, w) << "best fit takes the 32 KiB hole, not the 64 KiB one";
  void* r = *a->Allocate(60 * 1024, 0);
  EXPECT_EQ(r, y);
  for (void* p : {x, z, q, r, v}) ASSERT_TRUE(a->Free(p, 0).ok());
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.largest_free_block_bytes, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.live_allocations, 0);
  a->ReleaseCached();
  EXPECT_EQ(a->Stats().reserved_bytes, 0);
}

// Guards pool separation: a freed transient block is never handed to a persistent allocation
// (parameters must not land in activation segments, and vice versa).
TEST(MemAllocator, PersistentAndTransientPoolsAreSeparate) {
  auto a = MakeAllocator(64 * kMiB, 2 * kMiB);
  void* t = *a->Allocate(1024, 0, PoolKind::kTransient);
  ASSERT_TRUE(a->Free(t, 0).ok());
  void* p = *a->Allocate(1024, 0, PoolKind::kPersistent);
  EXPECT_NE(p, t);
  auto d = reinterpret_cast<uintptr_t>(p) > reinterpret_cast<uintptr_t>(t)
               ? reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(t)
               : reinterpret_cast<uintptr_t>(t) - reinterpret_cast<uintptr_t>(p);
  EXPECT_GE(d, 2 * kMiB) << "persistent block inside the transient segment";
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.segments, 2);
  EXPECT_EQ(s.persistent_allocated_bytes, 1024);
  void* t2 = *a->Allocate(1024, 0, PoolKind::kTransient);
  EXPECT_EQ(t2, t);
  ASSERT_TRUE(a->Free(p, 0).ok());
  ASSERT_TRUE(a->Free(t2, 0).ok());
}

// Guards stream-ordered reuse: a block freed on stream 1 is reused at once by stream 1, by
// stream 2 only after stream 1 passes the fence recorded at the free.
TEST(MemAllocator, StreamSafeReuse) {
  CpuFence* fence = nullptr;
  // One block per segment, so the only candidate for reuse is the freed block itself.
  auto a = MakeAllocator(64 * kMiB, kMiB, &fence);
  void* other = *a->Allocate(kMiB, 2);  // stream 2 is now known: frees record fences
  void* x = *a->Allocate(kMiB, 1);
  ASSERT_TRUE(a->Free(x, 1).ok());
  void* same = *a->Allocate(kMiB, 1);
  EXPECT_EQ(same, x) << "same stream may reuse at once";
  ASSERT_TRUE(a->Free(same, 1).ok());
  void* y = *a->Allocate(kMiB, 2);
  EXPECT_NE(y, x) << "stream 2 reused a block stream 1 may still be using";
  EXPECT_EQ(a->Stats().pending_fenced_blocks, 1);
  fence->Complete(1);
  void* z = *a->Allocate(kMiB, 2);
  EXPECT_EQ(z, x) << "after the fence passed the block is free for stream 2";
  EXPECT_EQ(a->Stats().segments, 3);
  for (void* p : {other, y, z}) ASSERT_TRUE(a->Free(p, 2).ok());
}

// Guards the on-demand fence: with one stream seen, frees record nothing; a second stream wanting
// the block must still wait for a fence on the owner.
TEST(MemAllocator, OnDemandFenceForLateSecondStream) {
  CpuFence* fence = nullptr;
  auto a = MakeAllocator(64 * kMiB, kMiB, &fence);
  void* x = *a->Allocate(kMiB, 1);
  ASSERT_TRUE(a->Free(x, 1).ok());
  EXPECT_EQ(a->Stats().pending_fenced_blocks, 0);
  void* y = *a->Allocate(kMiB, 5);
  EXPECT_NE(y, x);
  fence->Complete(1);
  void* z = *a->Allocate(kMiB, 5);
  EXPECT_EQ(z, x);
  ASSERT_TRUE(a->Free(y, 5).ok());
  ASSERT_TRUE(a->Free(z, 5).ok());
}

// Guards the fallback against a reference: random alloc/free sequences keep every live block's
// bytes intact (no overlap), and allocated bytes equal the reference sum of rounded sizes.
TEST(MemAllocator, RandomSequenceMatchesReference) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  std::mt19937_64 rng(3);
  std::vector<Tracked> live;
  int64_t ref_allocated = 0;
  for (int i = 0; i < 4000; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      size_t n = 1 + rng() % (rng() % 8 == 0 ? 3 * kMiB : 64 * 1024);
      auto p = a->Allocate(n, 0, rng() % 10 == 0 ? PoolKind::kPersistent : PoolKind::kTransient);
      ASSERT_TRUE(p.ok()) << p.status();
      Tracked t{*p, n, static_cast<uint8_t>(i)};
      Fill(t);
      live.push_back(t);
      ref_allocated += static_cast<int64_t>(RoundUp(n));
    } else {
      size_t k = rng() % live.size();
      ASSERT_TRUE(Intact(live[k])) << "block overwritten by a neighbour";
      ASSERT_TRUE(a->Free(live[k].p, 0).ok());
      ref_allocated -= static_cast<int64_t>(RoundUp(live[k].n));
      live.erase(live.begin() + static_cast<long>(k));
    }
    ASSERT_EQ(a->Stats().allocated_bytes, ref_allocated);
  }
  for (auto& t : live) {
    ASSERT_TRUE(Intact(t));
    ASSERT_TRUE(a->Free(t.p, 0).ok());
  }
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
  EXPECT_LE(s.peak_allocated_bytes, s.peak_reserved_bytes);
  EXPECT_EQ(s.alloc_latency_ns.count, s.num_allocs);
  // Everything free again: every segment is one block (coalescing complete), so all go back.
  a->ReleaseCached();
  EXPECT_EQ(a->Stats().reserved_bytes, 0);
}

// Guards the error path: a double free and a foreign pointer are InvalidArgument, not a crash.
TEST(MemAllocator, BadFreeIsAnError) {
  auto a = MakeAllocator(16 * kMiB, 2 * kMiB);
  void* x = *a->Allocate(100, 0);
  ASSERT_TRUE(a->Free(x, 0).ok());
  EXPECT_EQ(a->Free(x, 0).code(), StatusCode::kInvalidArgument);
  int local = 0;
  EXPECT_EQ(a->Free(&local, 0).code(), StatusCode::kInvalidArgument);
}

// Guards thread-safety: four threads allocating and freeing concurrently never share bytes and
// leave consistent totals.
TEST(MemAllocator, ThreadSafe) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<Tracked> live;
      for (int i = 0; i < 3000; ++i) {
        if (live.empty() || rng() % 2 == 0) {
          size_t n = 1 + rng() % 100000;
          auto p = a->Allocate(n, static_cast<StreamId>(t % 2));
          if (!p.ok()) {
            ++failures;
            return;
          }
          Tracked tr{*p, n, static_cast<uint8_t>(t * 50 + i % 50)};
          Fill(tr);
          live.push_back(tr);
        } else {
          size_t k = rng() % live.size();
          if (!Intact(live[k])) ++failures;
          if (!a->Free(live[k].p, static_cast<StreamId>(t % 2)).ok()) ++failures;
          live.erase(live.begin() + static_cast<long>(k));
        }
      }
      for (auto& tr : live) {
        if (!Intact(tr) || !a->Free(tr.p, static_cast<StreamId>(t % 2)).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.live_allocations, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
}

// Guards the out-of-memory report: ResourceExhausted that says what was live (largest first).
TEST(MemAllocator, ExhaustionSaysWhatWasLive) {
  auto a = MakeAllocator(8 * kMiB, 2 * kMiB);
  void* big = *a->Allocate(3 * kMiB, 0, PoolKind::kPersistent);
  void* mid = *a->Allocate(kMiB, 0);
  auto fail = a->Allocate(6 * kMiB, 0);
  ASSERT_FALSE(fail.ok());
  EXPECT_EQ(fail.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = fail.status().message();
  EXPECT_NE(m.find("out of memory: 6291456 bytes (6.0 MiB) requested"), std::string::npos) << m;
  EXPECT_NE(m.find("2 live allocations"), std::string::npos) << m;
  EXPECT_NE(m.find("top live: 3.0 MiB stream 0 persistent"), std::string::npos) << m;
  EXPECT_NE(m.find("persistent"), std::string::npos) << m;
  ASSERT_TRUE(a->Free(big, 0).ok());
  ASSERT_TRUE(a->Free(mid, 0).ok());
  // With the memory back, a retry succeeds (cached segments are released on the way).
  auto ok = a->Allocate(6 * kMiB, 0);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(a->Free(*ok, 0).ok());
}

// A step's allocation pattern: a small transformer-layer-like sequence with sizes scaled by `seq`.
struct StepOp {
  bool alloc;
  int slot;
  size_t size;
};
std::vector<StepOp> LayerStep(size_t seq) {
  std::vector<StepOp> ops;
  // forward: 4 layers each keep an activation, with temporaries freed inside the layer
  for (int l = 0; l < 4; ++l) {
    ops.push_back({true, 10 + l, seq * 4096});  // saved activation
    ops.push_back({true, 20, seq * 12288});     // qkv temp
    ops.push_back({true, 21, seq * 16384});     // mlp temp
    ops.push_back({false, 20, 0});
    ops.push_back({true, 22, seq * 4096});
    ops.push_back({false, 21, 0});
    ops.push_back({false, 22, 0});
  }
  for (int l = 3; l >= 0; --l) {  // backward
    ops.push_back({true, 30, seq * 8192});
    ops.push_back({false, 10 + l, 0});
    ops.push_back({false, 30, 0});
  }
  return ops;
}

// Runs one step; returns false if any live block's pattern broke.
bool RunStep(MemAllocator* a, const std::vector<StepOp>& ops, const std::string& sig,
             std::vector<void*>* out_ptrs = nullptr) {
  EXPECT_TRUE(a->BeginStep(sig).ok());
  std::map<int, Tracked> live;
  bool ok = true;
  uint8_t tag = 1;
  for (const auto& op : ops) {
    if (op.alloc) {
      auto p = a->Allocate(op.size, 0);
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) return false;
      Tracked t{*p, op.size, tag++};
      Fill(t);
      live[op.slot] = t;
      if (out_ptrs) out_ptrs->push_back(*p);
    } else {
      ok = ok && Intact(live[op.slot]);
      EXPECT_TRUE(a->Free(live[op.slot].p, 0).ok());
      live.erase(op.slot);
    }
  }
  for (auto& [s, t] : live) ok = ok && Intact(t);
  a->EndStep();
  return ok;
}

// Guards the planned path: after recording, a matching step is served entirely from the arena
// (no pool allocations), its bytes stay intact, and the arena is the plan's size.
TEST(MemAllocator, PlannedStepHitsArena) {
  auto a = MakeAllocator(256 * kMiB, 8 * kMiB);
  auto ops = LayerStep(64);
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "b64"));
  Trace t = a->StopRecording();
  auto plans = a->PlanFromTrace(t);
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 1u);
  const Plan& p = (*plans)[0];
  EXPECT_EQ(p.signature, "b64");
  EXPECT_LE(p.peak_bytes, p.lower_bound_bytes * 105 / 100);
  AllocatorStats before = a->Stats();
  std::vector<void*> ptrs1, ptrs2;
  ASSERT_TRUE(RunStep(a.get(), ops, "b64", &ptrs1));
  ASSERT_TRUE(RunStep(a.get(), ops, "b64", &ptrs2));
  AllocatorStats s = a->Stats();
  int64_t n_allocs = 0;
  for (const auto& op : ops) n_allocs += op.alloc;
  EXPECT_EQ(s.planned_hits, 2 * n_allocs);
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.pool_allocs, before.pool_allocs);
  EXPECT_EQ(s.planned_steps, 2);
  EXPECT_EQ(ptrs1, ptrs2) << "a planned step hands out the same addresses every time";
  EXPECT_GE(s.arena_bytes, p.peak_bytes);
}

// Guards divergence on size: a step with another shape under the same signature falls back to
// the pool for the rest of the step, counts one miss, and corrupts nothing.
TEST(MemAllocator, SizeMismatchFallsBack) {
  auto a = MakeAllocator(256 * kMiB, 8 * kMiB);
  auto ops = LayerStep(64);
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "b64"));
  ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
  auto other = ops;
  other[8].size += 4096;  // the second layer's activation differs
  AllocatorStats before = a->Stats();
  ASSERT_TRUE(RunStep(a.get(), other, "b64"));
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_misses, 1);
  EXPECT_EQ(s.planned_hits - before.planned_hits, 5);  // the allocations before op 8
  EXPECT_GT(s.pool_allocs, before.pool_allocs);
  // The miss says where and why (the trainer's figures carry it for diagnosis).
  EXPECT_NE(s.last_miss.find("step 'b64' diverged at allocation 5"), std::string::npos)
      << s.last_miss;
  EXPECT_NE(s.last_miss.find("larger than planned"), std::string::npos) << s.last_miss;
  // The next matching step is planned again.
  ASSERT_TRUE(RunStep(a.get(), ops, "b64"));
  EXPECT_EQ(a->Stats().planned_misses, 1);
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards Note [Planned arena safety]: a tensor freed later than recorded must not be overwritten
// by the allocation the plan put on its bytes; that allocation alone comes from the pool (a skip)
// and the step keeps its plan.
TEST(MemAllocator, LateFreeSkipsHeldSlot) {
  auto a = MakeAllocator(256 * kMiB, 8 * kMiB);
  std::vector<StepOp> ops = {{true, 1, 1 * kMiB}, {false, 1, 0},   {true, 2, 1 * kMiB},
                             {false, 2, 0},       {true, 3, kMiB}, {false, 3, 0}};
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  auto plans = a->PlanFromTrace(a->StopRecording());
  ASSERT_TRUE(plans.ok());
  EXPECT_EQ((*plans)[0].peak_bytes, static_cast<int64_t>(kMiB));  // all three share the bytes
  // Live step: slot 1 is freed only at the end.
  std::vector<StepOp> late = {{true, 1, kMiB}, {true, 2, kMiB}, {false, 2, 0},
                              {true, 3, kMiB}, {false, 3, 0},   {false, 1, 0}};
  ASSERT_TRUE(RunStep(a.get(), late, "s")) << "a live planned block was overwritten";
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.planned_skips, 2);  // slots 2 and 3 share slot 1's bytes
  EXPECT_EQ(s.planned_hits, 1);
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  EXPECT_EQ(a->Stats().planned_hits, 4) << "the next matching step is planned in full";
}

// Guards Note [Arena occupants]: a planned block still live at the next BeginStep occupies its
// bytes; that step keeps its plan but serves the allocation whose bytes are occupied from the
// pool, never the live bytes.
TEST(MemAllocator, ArenaOccupiedAtStepBoundary) {
  auto a = MakeAllocator(256 * kMiB, 8 * kMiB);
  std::vector<StepOp> ops = {{true, 1, kMiB}, {false, 1, 0}, {true, 2, kMiB}, {false, 2, 0}};
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
  ASSERT_TRUE(a->BeginStep("s").ok());
  void* kept = *a->Allocate(kMiB, 0);  // planned, and kept past the step
  Tracked t{kept, kMiB, 0x5A};
  Fill(t);
  a->EndStep();
  ASSERT_TRUE(a->BeginStep("s").ok());
  void* next = *a->Allocate(kMiB, 0);
  EXPECT_NE(next, kept);
  EXPECT_TRUE(Intact(t));
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.planned_skips, 1);
  ASSERT_TRUE(a->Free(kept, 0).ok());  // the occupant leaves: the plan's bytes are free again
  ASSERT_TRUE(a->Free(next, 0).ok());
  void* third = *a->Allocate(kMiB, 0);
  EXPECT_EQ(a->Stats().planned_hits, s.planned_hits + 1);
  ASSERT_TRUE(a->Free(third, 0).ok());
  a->EndStep();
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards per-signature plans: two padding buckets each get their own plan and both hit.
TEST(MemAllocator, PlansPerSignature) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "b64"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "b128"));
  auto plans = a->PlanFromTrace(a->StopRecording());
  ASSERT_TRUE(plans.ok());
  EXPECT_EQ(plans->size(), 2u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "b128"));
    ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "b64"));
  }
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.planned_steps, 6);
  // One arena sized for the larger bucket serves both.
  EXPECT_EQ(s.arena_bytes,
            (std::max((*plans)[0].peak_bytes, (*plans)[1].peak_bytes) + (int64_t{2} << 20) - 1) /
                (int64_t{2} << 20) * (int64_t{2} << 20));
}

std::unique_ptr<MemAllocator> MakeAllocatorWith(MemAllocator::Options o, size_t capacity) {
  return std::make_unique<MemAllocator>(o, CreateHostBackend(capacity),
                                        std::make_unique<CpuFence>());
}

// An allocator with 8 MiB segments that caches at most two plans (the plan-cache bound tests).
std::unique_ptr<MemAllocator> MakeTwoPlanAllocator(size_t capacity) {
  MemAllocator::Options o;
  o.segment_bytes = 8 * kMiB;
  o.max_plans = 2;
  return MakeAllocatorWith(o, capacity);
}

int64_t CountAllocs(const std::vector<StepOp>& ops) {
  int64_t n = 0;
  for (const auto& op : ops) n += op.alloc;
  return n;
}

int64_t ArenaRound(int64_t n) {
  constexpr int64_t k2MiB = int64_t{2} << 20;
  return (n + k2MiB - 1) / k2MiB * k2MiB;
}

// Guards Note [First sight]: a signature never recorded is planned from its first step, so its
// second step is served entirely from the arena (before, it ran from the pool forever).
TEST(MemAllocator, FirstSightPlansNextStep) {
  auto a = MakeAllocator(256 * kMiB, 8 * kMiB);
  auto ops = LayerStep(64);
  std::vector<void*> p1, p2, p3;
  ASSERT_TRUE(RunStep(a.get(), ops, "new", &p1));
  AllocatorStats s1 = a->Stats();
  EXPECT_EQ(s1.planned_hits, 0);
  EXPECT_EQ(s1.first_sight_plans, 1);
  EXPECT_EQ(s1.plans_cached, 1);
  EXPECT_TRUE(a->plans().Contains("new"));
  EXPECT_EQ(s1.segments, 0) << "the first step's free pool segments go back to the backend";
  ASSERT_TRUE(RunStep(a.get(), ops, "new", &p2));
  ASSERT_TRUE(RunStep(a.get(), ops, "new", &p3));
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_hits, 2 * CountAllocs(ops));
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.pool_allocs, s1.pool_allocs);
  EXPECT_EQ(s.first_sight_plans, 1) << "a planned signature is not recorded again";
  EXPECT_EQ(p2, p3);
  EXPECT_LE(a->plans().Get("new")->peak_bytes,
            a->plans().Get("new")->lower_bound_bytes * 105 / 100);
}

// Guards the switch: with plan_unseen_signatures off, an unrecorded signature stays unplanned.
TEST(MemAllocator, FirstSightCanBeTurnedOff) {
  MemAllocator::Options o;
  o.segment_bytes = 8 * kMiB;
  o.plan_unseen_signatures = false;
  auto a = MakeAllocatorWith(o, 256 * kMiB);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "new"));
  EXPECT_EQ(a->Stats().planned_hits, 0);
  EXPECT_EQ(a->Stats().plans_cached, 0);
}

// Guards first sight without EndStep: the next BeginStep closes and plans the open step.
TEST(MemAllocator, FirstSightClosedByNextBeginStep) {
  auto a = MakeAllocator(256 * kMiB, 8 * kMiB);
  ASSERT_TRUE(a->BeginStep("x").ok());
  void* p = *a->Allocate(kMiB, 0);
  ASSERT_TRUE(a->Free(p, 0).ok());
  ASSERT_TRUE(a->BeginStep("x").ok());  // no EndStep before it
  void* q = *a->Allocate(kMiB, 0);
  EXPECT_EQ(a->Stats().planned_hits, 1);
  ASSERT_TRUE(a->Free(q, 0).ok());
  a->EndStep();
}

// Guards Note [Free segments while the arena is lent] on first sight: a step with no arena and no
// plan gives a fully free pool segment back before growing, instead of holding it beside the new
// one.
TEST(MemAllocator, FirstSightReleasesFreeSegmentsBeforeGrowing) {
  auto a = MakeAllocator(256 * kMiB, 32 * kMiB);
  ASSERT_TRUE(a->BeginStep("new").ok());
  void* p = *a->Allocate(20 * kMiB, 0);  // >= 16 MiB: a 20 MiB segment of its own
  ASSERT_TRUE(a->Free(p, 0).ok());
  void* q = *a->Allocate(24 * kMiB, 0);  // does not fit the free 20 MiB segment
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(24 * kMiB))
      << "the free 20 MiB segment stayed reserved beside the new 24 MiB one";
  EXPECT_EQ(s.segments, 1);
  ASSERT_TRUE(a->Free(q, 0).ok());
  a->EndStep();
  // Outside a step (pool only) the free segment is kept: no release on the steady path.
  auto b = MakeAllocator(256 * kMiB, 32 * kMiB);
  void* r = *b->Allocate(20 * kMiB, 0);
  ASSERT_TRUE(b->Free(r, 0).ok());
  void* t = *b->Allocate(24 * kMiB, 0);
  EXPECT_EQ(b->Stats().peak_reserved_bytes, static_cast<int64_t>(44 * kMiB));
  ASSERT_TRUE(b->Free(t, 0).ok());
}

// Guards Note [Arena for a new signature]: once a plan exists, a new signature's first step runs
// in an arena reserved for the largest plan and lent to the pool, not in fresh pool segments.
TEST(MemAllocator, NewSignatureRunsInLentArena) {
  auto a = MakeAllocator(256 * kMiB, 32 * kMiB);
  ASSERT_TRUE(a->BeginStep("a").ok());
  void* p = *a->Allocate(20 * kMiB, 0);
  ASSERT_TRUE(a->Free(p, 0).ok());
  a->EndStep();  // plans "a" (20 MiB) and gives its segment back
  ASSERT_EQ(a->Stats().reserved_bytes, 0);
  a->ResetPeaks();
  ASSERT_TRUE(a->BeginStep("b").ok());  // first sight of "b"
  EXPECT_EQ(a->Stats().arena_bytes, static_cast<int64_t>(20 * kMiB));
  void* x = *a->Allocate(12 * kMiB, 0);  // from the pool these would take a 32 MiB segment
  void* y = *a->Allocate(8 * kMiB, 0);
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.peak_reserved_bytes, static_cast<int64_t>(20 * kMiB));
  EXPECT_EQ(s.segments, 1) << "only the lent arena";
  ASSERT_TRUE(a->Free(x, 0).ok());
  ASSERT_TRUE(a->Free(y, 0).ok());
  a->EndStep();
  EXPECT_EQ(a->Stats().first_sight_plans, 2);
  ASSERT_TRUE(a->BeginStep("b").ok());  // now planned, in the same arena
  x = *a->Allocate(12 * kMiB, 0);
  y = *a->Allocate(8 * kMiB, 0);
  EXPECT_EQ(a->Stats().planned_hits, 2);
  ASSERT_TRUE(a->Free(x, 0).ok());
  ASSERT_TRUE(a->Free(y, 0).ok());
  a->EndStep();
  EXPECT_EQ(a->Stats().peak_reserved_bytes, static_cast<int64_t>(20 * kMiB));
}

// Guards the real MoE trace's first sight: when an earlier step left a tensor live, a new
// signature gets no early arena (that tensor would pin an arena too small for the plans to come).
TEST(MemAllocator, NoEarlyArenaWhileAStepTensorIsLive) {
  auto a = MakeAllocator(256 * kMiB, 32 * kMiB);
  ASSERT_TRUE(a->BeginStep("a").ok());
  void* p = *a->Allocate(20 * kMiB, 0);
  void* keep = *a->Allocate(kMiB, 0);  // outlives the step
  ASSERT_TRUE(a->Free(p, 0).ok());
  a->EndStep();
  ASSERT_TRUE(a->BeginStep("b").ok());
  EXPECT_EQ(a->Stats().arena_bytes, 0);
  ASSERT_TRUE(a->Free(keep, 0).ok());
  a->EndStep();
}

// Guards the LRU bound: the least recently used plan is evicted, a recently used one is kept.
TEST(MemAllocator, PlanCacheIsLruBounded) {
  auto a = MakeTwoPlanAllocator(512 * kMiB);
  ASSERT_TRUE(RunStep(a.get(), LayerStep(16), "a"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(32), "b"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(16), "a"));  // planned: "a" is now the most recent
  ASSERT_TRUE(RunStep(a.get(), LayerStep(48), "c"));  // first sight: evicts "b"
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.plans_cached, 2);
  EXPECT_EQ(s.plan_evictions, 1);
  EXPECT_TRUE(a->plans().Contains("a"));
  EXPECT_FALSE(a->plans().Contains("b"));
  EXPECT_TRUE(a->plans().Contains("c"));
  // "b" comes back: served by the pool once, planned again (evicting "a").
  int64_t hits = a->Stats().planned_hits;
  ASSERT_TRUE(RunStep(a.get(), LayerStep(32), "b"));
  EXPECT_EQ(a->Stats().planned_hits, hits);
  ASSERT_TRUE(RunStep(a.get(), LayerStep(32), "b"));
  EXPECT_EQ(a->Stats().planned_hits, hits + CountAllocs(LayerStep(32)));
  EXPECT_EQ(a->Stats().first_sight_plans, 4);
}

// Guards the arena bound: every plan shares one arena sized to the largest cached plan; when
// that plan is evicted, the arena shrinks to the largest remaining one.
TEST(MemAllocator, OneArenaSizedToLargestCachedPlan) {
  auto a = MakeTwoPlanAllocator(1024 * kMiB);
  ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "big"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "mid"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "mid"));  // planned: arena for the largest plan
  const int64_t big = a->plans().Get("big")->peak_bytes;
  const int64_t mid = a->plans().Get("mid")->peak_bytes;
  ASSERT_GT(big, mid);
  EXPECT_EQ(a->Stats().arena_bytes, ArenaRound(big));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "big"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "mid"));
  EXPECT_EQ(a->Stats().arena_bytes, ArenaRound(big)) << "one arena, not one per plan";
  ASSERT_TRUE(RunStep(a.get(), LayerStep(16), "small"));  // evicts "big" (least recent)
  EXPECT_FALSE(a->plans().Contains("big"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "mid"));
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.arena_bytes, ArenaRound(mid));
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.reserved_bytes, ArenaRound(mid) + s.segments * static_cast<int64_t>(8 * kMiB));
}

// Guards Note [Lent arena]: an unplanned step borrows the idle arena instead of reserving new
// segments, and the arena comes back for the next planned step.
TEST(MemAllocator, UnplannedStepBorrowsIdleArena) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "big"));  // first sight
  ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "big"));  // planned: the arena is reserved
  AllocatorStats before = a->Stats();
  ASSERT_GT(before.arena_bytes, 0);
  ASSERT_EQ(before.reserved_bytes, before.arena_bytes);
  a->ResetPeaks();
  ASSERT_TRUE(RunStep(a.get(), LayerStep(32), "small"));  // first sight, fits in the arena
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.peak_reserved_bytes, before.reserved_bytes) << "no new segment was needed";
  EXPECT_EQ(s.arena_bytes, before.arena_bytes);
  EXPECT_EQ(s.pool_allocs - before.pool_allocs, CountAllocs(LayerStep(32)));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(128), "big"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(32), "small"));
  EXPECT_EQ(a->Stats().planned_misses, 0);
  EXPECT_EQ(a->Stats().reserved_bytes, before.reserved_bytes);
}

// Guards Note [Lent arena] and Note [Arena occupants] when an allocation made in the lent arena
// outlives its step: it stays an occupant of the arena (no second arena is reserved), and the
// next planned step never overwrites it (the slots on its bytes are served by the pool).
TEST(MemAllocator, LentArenaKeptByLiveAllocation) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  auto ops = LayerStep(64);
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));  // planned; arena reserved
  const int64_t arena = a->Stats().arena_bytes;
  ASSERT_TRUE(a->BeginStep("other").ok());  // unplanned: arena lent
  void* kept = *a->Allocate(4 * kMiB, 0);
  Tracked t{kept, 4 * kMiB, 0xA5};
  Fill(t);
  a->EndStep();
  AllocatorStats before = a->Stats();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  AllocatorStats s = a->Stats();
  EXPECT_TRUE(Intact(t)) << "a planned step overwrote an allocation living in the lent arena";
  EXPECT_EQ(s.arena_bytes, arena);
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_GT(s.planned_skips, before.planned_skips);
  EXPECT_EQ((s.planned_hits - before.planned_hits) + (s.planned_skips - before.planned_skips),
            CountAllocs(ops));
  ASSERT_TRUE(a->Free(kept, 0).ok());
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  EXPECT_EQ(a->Stats().planned_hits, s.planned_hits + CountAllocs(ops));
}

// Guards Note [Lent arena] on divergence: when a planned step diverges (an allocation larger than
// planned), the rest of it is served from the arena's free bytes around the live planned blocks,
// so it reserves nothing new, and nothing live is overwritten.
TEST(MemAllocator, DivergedStepServedFromArena) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  auto ops = LayerStep(64);
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
  a->ReleaseCached();  // the recording step's pool segments
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  a->ResetPeaks();
  const int64_t reserved = a->Stats().reserved_bytes;
  ASSERT_EQ(reserved, a->Stats().arena_bytes);
  auto grown = ops;
  grown[8].size += 4096;  // the second layer's activation grew: diverges there
  for (auto& op : grown) {
    if (op.alloc && op.slot == 30) op.size /= 2;  // and the backward temps shrank
  }
  ASSERT_TRUE(RunStep(a.get(), grown, "s")) << "a live block was overwritten";
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_misses, 1);
  EXPECT_EQ(s.peak_reserved_bytes, reserved) << "the diverged step reserved new memory";
  EXPECT_EQ(s.allocated_bytes, 0);
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));  // the arena is back: planned in full
  EXPECT_EQ(a->Stats().planned_misses, 1);
  EXPECT_EQ(a->Stats().planned_hits, s.planned_hits + CountAllocs(ops));
}

// Guards Note [Lifetime-guided fallback]: once a step diverged, an allocation whose slot in the
// plan lived long is placed at the lent arena's low end and a short-lived one at its high end, so
// short-lived blocks do not split the space long-lived ones need.
TEST(MemAllocator, DivergedStepPlacesByForecastLifetime) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  // Slot 0 diverges; slot 1 is short-lived, slot 2 lives to the end (long), then temporaries.
  // Best fit alone would put the short one first, low, and the long one above it.
  std::vector<StepOp> ops = {
      {true, 1, kMiB}, {false, 1, 0}, {true, 3, kMiB}, {true, 2, kMiB}, {false, 3, 0}};
  for (int i = 0; i < 19; ++i) {
    ops.push_back({true, 100 + i, kMiB});
    ops.push_back({false, 100 + i, 0});
  }
  ops.push_back({false, 2, 0});
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
  ASSERT_TRUE(a->BeginStep("s").ok());
  void* first = *a->Allocate(2 * kMiB, 0);  // larger than planned: diverges
  ASSERT_TRUE(a->Free(first, 0).ok());
  void* short_lived = *a->Allocate(kMiB, 0);
  void* long_lived = *a->Allocate(kMiB, 0);
  EXPECT_EQ(a->Stats().planned_misses, 1);
  EXPECT_LT(long_lived, short_lived);
  ASSERT_TRUE(a->Free(short_lived, 0).ok());
  ASSERT_TRUE(a->Free(long_lived, 0).ok());
  a->EndStep();
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards Note [Free segments while the arena is lent]: a pool segment that became fully free
// during a diverged step is given back before the step grows another one (without it the peak
// holds both), and the boundary that takes the arena back gives back what the step grew; a
// planned step keeps its pool's free segments.
TEST(MemAllocator, DivergedStepReleasesFreeSegmentsBeforeGrowing) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  std::vector<StepOp> ops = {{true, 1, 4 * kMiB}, {false, 1, 0}};
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
  a->ReleaseCached();
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));  // planned: the 4 MiB arena is reserved
  const int64_t arena = a->Stats().arena_bytes;
  ASSERT_EQ(a->Stats().reserved_bytes, arena);
  // A tensor from before the step (say, the last step's output) holds an 8 MiB pool segment.
  void* carried = *a->Allocate(6 * kMiB, 0);
  ASSERT_EQ(a->Stats().reserved_bytes, arena + static_cast<int64_t>(8 * kMiB));
  // A planned step keeps the pool's segments, even when fully free.
  ASSERT_TRUE(a->BeginStep("s").ok());
  void* planned = *a->Allocate(4 * kMiB, 0);
  ASSERT_TRUE(a->Free(carried, 0).ok());
  ASSERT_TRUE(a->Free(planned, 0).ok());
  a->EndStep();
  EXPECT_EQ(a->Stats().reserved_bytes, arena + static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(a->Stats().planned_misses, 0);
  carried = *a->Allocate(6 * kMiB, 0);
  a->ResetPeaks();
  ASSERT_TRUE(a->BeginStep("s").ok());
  ASSERT_TRUE(a->Free(carried, 0).ok());   // its segment is now fully free
  void* big = *a->Allocate(12 * kMiB, 0);  // larger than planned: diverges, fits nowhere
  EXPECT_EQ(a->Stats().planned_misses, 1);
  EXPECT_EQ(a->Stats().peak_reserved_bytes, arena + static_cast<int64_t>(12 * kMiB))
      << "the free 8 MiB segment stayed reserved beside the new one";
  ASSERT_TRUE(a->Free(big, 0).ok());
  a->EndStep();
  EXPECT_EQ(a->Stats().reserved_bytes, arena) << "the diverged step's segment was kept";
  ASSERT_TRUE(RunStep(a.get(), ops, "s"));
  EXPECT_EQ(a->Stats().planned_misses, 1);
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards Note [Planned arena safety], [Lent arena] and [Arena occupants] together: random live
// steps that differ from the recorded ones (sizes grown or shrunk, extra allocations, frees
// reordered, allocations kept into the next step) never hand out live bytes, and the stats add up.
TEST(MemAllocator, RandomPerturbedStepsNeverOverlap) {
  std::mt19937 rng(7);
  int64_t misses = 0, skips = 0;
  for (int round = 0; round < 6; ++round) {
    auto a = MakeAllocator(1024 * kMiB, 4 * kMiB);
    auto base = LayerStep(32 + 16 * round);
    a->StartRecording();
    ASSERT_TRUE(RunStep(a.get(), base, "s"));
    ASSERT_TRUE(RunStep(a.get(), LayerStep(16), "t"));
    ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
    std::map<int, Tracked> carried;  // kept from the previous step
    uint8_t tag = 1;
    int next_key = 0;
    int64_t live_bytes = 0;
    for (int step = 0; step < 20; ++step) {
      ASSERT_TRUE(a->BeginStep(rng() % 4 ? "s" : "t").ok());
      std::vector<Tracked> live;
      auto check_all = [&] {
        for (const auto& t : live) ASSERT_TRUE(Intact(t)) << "round " << round << " step " << step;
        for (const auto& [k, t] : carried) ASSERT_TRUE(Intact(t)) << "carried, step " << step;
      };
      for (const auto& op : base) {
        if (op.alloc || live.empty() || rng() % 3 == 0) {
          size_t size = op.alloc ? op.size : 4096;
          if (rng() % 8 == 0) size = size * (1 + rng() % 3) / 2 + 512;  // perturbed size
          auto p = a->Allocate(size, 0);
          ASSERT_TRUE(p.ok()) << p.status();
          live.push_back(Tracked{*p, size, tag++});
          Fill(live.back());
          live_bytes += static_cast<int64_t>(RoundUp(size));
        }
        if (!op.alloc && !live.empty()) {
          size_t i = rng() % live.size();  // frees in a shuffled order
          live_bytes -= static_cast<int64_t>(RoundUp(live[i].n));
          ASSERT_TRUE(a->Free(live[i].p, 0).ok());
          live.erase(live.begin() + static_cast<long>(i));
        }
        if (!carried.empty() && rng() % 5 == 0) {  // last step's leftovers freed mid-step
          auto it = carried.begin();
          live_bytes -= static_cast<int64_t>(RoundUp(it->second.n));
          ASSERT_TRUE(a->Free(it->second.p, 0).ok());
          carried.erase(it);
        }
        check_all();
      }
      for (auto& t : live) {
        if (rng() % 4 == 0) {
          carried[next_key++] = t;  // outlives the step
        } else {
          live_bytes -= static_cast<int64_t>(RoundUp(t.n));
          ASSERT_TRUE(a->Free(t.p, 0).ok());
        }
      }
      a->EndStep();
      AllocatorStats s = a->Stats();
      ASSERT_EQ(s.allocated_bytes, live_bytes);
      ASSERT_EQ(s.live_allocations, static_cast<int64_t>(carried.size()));
      ASSERT_LE(s.allocated_bytes, s.reserved_bytes);
    }
    for (auto& [k, t] : carried) {
      ASSERT_TRUE(Intact(t));
      ASSERT_TRUE(a->Free(t.p, 0).ok());
    }
    EXPECT_EQ(a->Stats().allocated_bytes, 0);
    EXPECT_GT(a->Stats().planned_hits, 0);
    misses += a->Stats().planned_misses;
    skips += a->Stats().planned_skips;
  }
  EXPECT_GT(misses, 0) << "no step diverged: the lent-arena path went untested";
  EXPECT_GT(skips, 0) << "no slot was held: the occupant path went untested";
}

// Guards Note [Envelope plans]: steps of one signature whose sizes differ but whose structure is
// the same (an MoE layer's expert buffers) are served from one plan widened to the largest size
// at each position; the patterns stay intact, and a step larger than every recorded one still
// diverges safely.
TEST(MemAllocator, EnvelopePlanServesSameStructureSteps) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  auto small = LayerStep(64), big = LayerStep(64);
  for (auto& op : big) {
    if (op.alloc && op.slot == 21) op.size *= 2;  // the MLP temp grew in the second step
  }
  auto other = small;
  for (auto& op : other) {
    if (op.alloc && op.slot == 30) op.size /= 2;  // the backward temp shrank
  }
  a->StartRecording();
  ASSERT_TRUE(RunStep(a.get(), small, "moe"));
  ASSERT_TRUE(RunStep(a.get(), big, "moe"));
  auto plans = a->PlanFromTrace(a->StopRecording());
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 1u);
  const int64_t n_allocs = CountAllocs(small);
  AllocatorStats before = a->Stats();
  ASSERT_TRUE(RunStep(a.get(), small, "moe"));
  ASSERT_TRUE(RunStep(a.get(), big, "moe"));
  ASSERT_TRUE(RunStep(a.get(), other, "moe"));
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_hits - before.planned_hits, 3 * n_allocs);
  EXPECT_EQ(s.planned_misses, 0);
  EXPECT_EQ(s.allocated_bytes, 0);
  auto huge = big;
  for (auto& op : huge) {
    if (op.alloc && op.slot == 21) op.size *= 2;  // beyond anything recorded
  }
  ASSERT_TRUE(RunStep(a.get(), huge, "moe"));
  EXPECT_EQ(a->Stats().planned_misses, 1);
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// An MoE-like step: a carry-out allocated first that outlives the step, expert buffers of
// `expert` bytes, the previous step's carry freed after the first expert, and, when
// `workspace`, a GEMM workspace inserted after the second expert (allocated and freed at once).
struct MoeStep {
  size_t expert;
  bool workspace;
  int workspace_at = 1;   // after which expert
  int carry_free_at = 0;  // the previous step's carry is freed after this expert
};

// Runs one MoE-like step; `carried` holds the previous step's carry on entry and this step's on
// exit. Returns false if any live block's pattern broke; appends the carry's address to `carries`.
bool RunMoeStep(MemAllocator* a, const MoeStep& st, std::vector<Tracked>* carried,
                std::vector<void*>* carries) {
  EXPECT_TRUE(a->BeginStep("moe").ok());
  bool ok = true;
  uint8_t tag = 1;
  auto alloc = [&](size_t n) {
    auto p = a->Allocate(n, 0);
    EXPECT_TRUE(p.ok()) << p.status();
    Tracked t{*p, n, tag++};
    Fill(t);
    return t;
  };
  auto free = [&](const Tracked& t) {
    ok = ok && Intact(t);
    EXPECT_TRUE(a->Free(t.p, 0).ok());
  };
  Tracked out = alloc(3 * kMiB);  // the carry-out
  carries->push_back(out.p);
  std::vector<Tracked> saved;
  for (int e = 0; e < 4; ++e) {
    saved.push_back(alloc(st.expert + static_cast<size_t>(e) * 64 * 1024));
    Tracked tmp = alloc(2 * kMiB);
    if (e == st.carry_free_at) {
      for (const Tracked& c : *carried) free(c);
      carried->clear();
    }
    if (e == st.workspace_at && st.workspace) free(alloc(kMiB));
    free(tmp);
  }
  std::vector<Tracked> grads;
  for (int e = 3; e >= 0; --e) {
    grads.push_back(alloc(4 * kMiB));
    free(saved[static_cast<size_t>(e)]);
  }
  for (const Tracked& g : grads) free(g);
  ok = ok && Intact(out);
  carried->push_back(out);
  a->EndStep();
  return ok;
}

// Guards Note [Carry zones] and Note [Sibling plans] together, on the MoE trace's pattern: steps
// of one signature whose expert sizes differ and some of which insert a workspace are each served
// wholly from the arena (no miss, no pool allocation: the old allocator diverged on the
// workspace steps and served every carry from a pool segment); the carries alternate between
// two addresses (the two zones), and nothing is reserved beyond the arena.
TEST(MemAllocator, SiblingPlansAndCarryZonesKeepMoeStepsPlanned) {
  MemAllocator::Options o;
  o.segment_bytes = 8 * kMiB;
  o.plan_unseen_signatures = false;  // the warm-up step stays unplanned: recorded plans only
  auto a = MakeAllocatorWith(o, 512 * kMiB);
  const std::vector<MoeStep> kinds = {{6 * kMiB, false}, {9 * kMiB, true}, {5 * kMiB, false}};
  std::vector<Tracked> carried;
  std::vector<void*> carries;
  ASSERT_TRUE(RunMoeStep(a.get(), kinds[0], &carried, &carries));  // warm-up: leaves a carry
  a->StartRecording();
  for (const MoeStep& st : kinds) ASSERT_TRUE(RunMoeStep(a.get(), st, &carried, &carries));
  auto plans = a->PlanFromTrace(a->StopRecording());
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 1u);
  EXPECT_EQ((*plans)[0].siblings.size(), 1u);  // two structures: with and without a workspace
  EXPECT_NE((*plans)[0].mirror, nullptr);
  // The first planned step frees the last pooled carry; then nothing is pooled any more.
  ASSERT_TRUE(RunMoeStep(a.get(), kinds[1], &carried, &carries));
  a->ReleaseCached();
  a->ResetPeaks();
  const AllocatorStats before = a->Stats();
  carries.clear();
  const std::vector<int> order = {0, 1, 2, 1, 0, 2, 2, 1};
  for (int k : order) {
    ASSERT_TRUE(RunMoeStep(a.get(), kinds[static_cast<size_t>(k)], &carried, &carries));
  }
  const AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_hits - before.planned_hits, 13 * 5 + 14 * 3);
  EXPECT_EQ(s.planned_misses, before.planned_misses);
  EXPECT_EQ(s.planned_skips, before.planned_skips);
  EXPECT_EQ(s.pool_allocs, before.pool_allocs);  // carries included
  EXPECT_EQ(s.segments, 0);
  EXPECT_EQ(s.peak_reserved_bytes, s.arena_bytes);
  for (size_t i = 2; i < carries.size(); ++i) {
    EXPECT_EQ(carries[i], carries[i - 2]) << "step " << i;
    EXPECT_NE(carries[i], carries[i - 1]) << "step " << i;
  }
  // A step of a structure never recorded (a workspace in another place, a larger expert) still
  // runs safely: it diverges into the lent arena.
  ASSERT_TRUE(RunMoeStep(a.get(), {12 * kMiB, true}, &carried, &carries));
  EXPECT_EQ(a->Stats().planned_misses, before.planned_misses + 1);
  for (const Tracked& c : carried) ASSERT_TRUE(a->Free(c.p, 0).ok());
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards InstallPlan's checks on plan groups: a sibling whose slot lies outside its arena, or
// whose tables disagree in length, is refused before it can hand out memory.
TEST(MemAllocator, InstallPlanValidatesSiblings) {
  auto a = MakeAllocator(64 * kMiB, 4 * kMiB);
  Trace t;
  t.MarkStep("g");
  t.AddAlloc(1, 4096, 0, 0);
  t.AddAlloc(2, 8192, 0, 0);
  t.AddFree(1, 0, 0);
  t.AddFree(2, 0, 0);
  LifetimeTable table = std::move(*t.Lifetimes())[0];
  Plan base = PlanStep(table, "g");
  Plan sib = base;
  sib.offsets[1] = sib.peak_bytes;  // past the end of its arena
  base.siblings.push_back(std::make_shared<const Plan>(sib));
  EXPECT_EQ(a->InstallPlan(base).code(), StatusCode::kInvalidArgument);
  base.siblings[0] = std::make_shared<const Plan>(PlanStep(table, "g"));
  base.alloc_seqs.pop_back();  // a group needs every slot's event count
  EXPECT_EQ(a->InstallPlan(base).code(), StatusCode::kInvalidArgument);
  base.alloc_seqs = PlanStep(table, "g").alloc_seqs;
  EXPECT_TRUE(a->InstallPlan(base).ok());
}

// Guards the safety of sibling switching and carry zones: random MoE-like steps (expert sizes,
// workspace position, when the last step's carry is freed), recorded or not, never hand out
// overlapping live bytes, and every byte is accounted for.
TEST(MemAllocator, RandomSiblingStepsNeverOverlap) {
  std::mt19937 rng(11);
  int64_t hits = 0, misses = 0;
  auto random_step = [&] {
    MoeStep st{static_cast<size_t>(2 + rng() % 8) * kMiB, rng() % 2 == 0};
    st.workspace_at = static_cast<int>(rng() % 4);
    st.carry_free_at = static_cast<int>(rng() % 4);
    return st;
  };
  for (int round = 0; round < 4; ++round) {
    auto a = MakeAllocator(1024 * kMiB, 4 * kMiB);
    std::vector<Tracked> carried;
    std::vector<void*> carries;
    std::vector<MoeStep> recorded;
    for (int i = 0; i < 4; ++i) recorded.push_back(random_step());
    ASSERT_TRUE(RunMoeStep(a.get(), recorded[0], &carried, &carries));
    a->StartRecording();
    for (const MoeStep& st : recorded) ASSERT_TRUE(RunMoeStep(a.get(), st, &carried, &carries));
    ASSERT_TRUE(a->PlanFromTrace(a->StopRecording()).ok());
    for (int step = 0; step < 16; ++step) {
      MoeStep st = rng() % 3 ? recorded[rng() % recorded.size()] : random_step();
      ASSERT_TRUE(RunMoeStep(a.get(), st, &carried, &carries)) << "round " << round;
      ASSERT_EQ(a->Stats().allocated_bytes, static_cast<int64_t>(RoundUp(3 * kMiB)));
      ASSERT_LE(a->Stats().allocated_bytes, a->Stats().reserved_bytes);
    }
    for (const Tracked& c : carried) ASSERT_TRUE(a->Free(c.p, 0).ok());
    EXPECT_EQ(a->Stats().allocated_bytes, 0);
    hits += a->Stats().planned_hits;
    misses += a->Stats().planned_misses;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 0) << "no step diverged: the fallback went untested";
}

// Guards what a recording traces: transient allocations made while a step is open (the ones a
// plan can serve) and the frees of what steps made. An optimizer step between EndStep and the
// next BeginStep (its temporaries and the state it creates) always runs from the pool; traced, it
// would be planned into the arena too and reserved twice.
TEST(MemAllocator, RecordingTracesOnlyOpenSteps) {
  auto a = MakeAllocator(512 * kMiB, 8 * kMiB);
  a->StartRecording();
  void* state = nullptr;
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(a->BeginStep("s").ok());
    void* act = *a->Allocate(4 * kMiB, 0);
    void* tmp = *a->Allocate(1 * kMiB, 0);
    ASSERT_TRUE(a->Free(tmp, 0).ok());
    ASSERT_TRUE(a->Free(act, 0).ok());
    a->EndStep();
    void* opt_tmp = *a->Allocate(64 * kMiB, 0);  // the optimizer, outside the step
    if (state == nullptr) state = *a->Allocate(32 * kMiB, 0);
    ASSERT_TRUE(a->Free(opt_tmp, 0).ok());
  }
  Trace t = a->StopRecording();
  int allocs = 0;
  for (const auto& e : t.events()) allocs += e.kind == TraceEvent::kAlloc ? 1 : 0;
  EXPECT_EQ(allocs, 4);          // two per step, none of the optimizer's
  EXPECT_EQ(t.size(), 2u * 5u);  // per step: a mark, two allocations, two frees
  auto plans = a->PlanFromTrace(t);
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_FALSE(plans->empty());
  for (const Plan& p : *plans) EXPECT_LE(p.peak_bytes, static_cast<int64_t>(8 * kMiB));
  ASSERT_TRUE(a->Free(state, 0).ok());
}

// Allocates `n` blocks of `bytes` each (all live) and returns them; stops at the first failure.
std::vector<void*> AllocN(MemAllocator* a, int n, size_t bytes, Status* failure = nullptr) {
  std::vector<void*> out;
  for (int i = 0; i < n; ++i) {
    auto p = a->Allocate(bytes, 0);
    if (!p.ok()) {
      if (failure) *failure = p.status();
      break;
    }
    out.push_back(*p);
  }
  return out;
}

void FreeAll(MemAllocator* a, std::vector<void*>* ptrs) {
  for (void* p : *ptrs) EXPECT_TRUE(a->Free(p, 0).ok());
  ptrs->clear();
}

// Guards out of memory inside a planned step: the error names the step's signature,
// the bytes asked for, that the step was planned and diverged, and what the backend had free;
// the step is abandoned, a smaller step then runs, the plans stay intact and no byte leaks.
TEST(MemAllocator, OutOfMemoryInPlannedStepNamesStepAndBytes) {
  auto a = MakeAllocator(16 * kMiB, kMiB);
  for (int i = 0; i < 2; ++i) {  // first sight, then planned
    ASSERT_TRUE(a->BeginStep("b4").ok());
    auto v = AllocN(a.get(), 4, kMiB);
    ASSERT_EQ(v.size(), 4u);
    FreeAll(a.get(), &v);
    EXPECT_TRUE(a->EndStep());
  }
  ASSERT_EQ(a->Stats().planned_steps, 1);
  ASSERT_TRUE(a->BeginStep("b4").ok());
  auto v = AllocN(a.get(), 4, kMiB);
  ASSERT_EQ(a->Stats().planned_hits, 8);
  auto big = a->Allocate(13 * kMiB, 0);  // beyond the plan, and beyond what the range has left
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = big.status().message();
  EXPECT_NE(m.find("out of memory in step 'b4'"), std::string::npos) << m;
  EXPECT_NE(m.find("13631488 bytes (13.0 MiB) requested"), std::string::npos) << m;
  EXPECT_NE(m.find("planned, then diverged at allocation 4 of 4"), std::string::npos) << m;
  EXPECT_NE(m.find("12.0 MiB free of 16.0 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("The step is abandoned"), std::string::npos) << m;
  EXPECT_EQ(a->Stats().abandoned_steps, 1);
  FreeAll(a.get(), &v);  // torch drops the failed step's tensors with the exception
  EXPECT_FALSE(a->EndStep()) << "EndStep says the step was abandoned";

  // A smaller step follows: first sight, then planned.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a->BeginStep("b2").ok());
    auto w = AllocN(a.get(), 2, kMiB);
    ASSERT_EQ(w.size(), 2u);
    FreeAll(a.get(), &w);
    EXPECT_TRUE(a->EndStep());
  }
  ASSERT_TRUE(a->BeginStep("b4").ok());  // the failed step did not touch b4's plan
  auto again = AllocN(a.get(), 4, kMiB);
  ASSERT_EQ(again.size(), 4u);
  FreeAll(a.get(), &again);
  EXPECT_TRUE(a->EndStep());
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.planned_steps, 4);         // b4 twice (the failed step began planned), b2, b4
  EXPECT_EQ(s.planned_hits, 8 + 2 + 4);  // the 8 before the failure, b2, b4
  EXPECT_EQ(s.plans_cached, 2);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.live_allocations, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
  EXPECT_TRUE(a->Close().ok());
  EXPECT_EQ(a->Stats().reserved_bytes, 0);
}

// Guards out of memory in an unplanned step: a first-sight step cut short by the
// failure is not planned, and a recording keeps only whole steps, so the next plans are sound.
TEST(MemAllocator, OutOfMemoryInUnplannedStepIsNeitherPlannedNorRecorded) {
  auto a = MakeAllocator(16 * kMiB, kMiB);
  ASSERT_TRUE(a->BeginStep("b16").ok());
  Status failure;
  auto v = AllocN(a.get(), 20, kMiB, &failure);
  ASSERT_EQ(failure.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(failure.message().find("out of memory in step 'b16' (unplanned: first sight"),
            std::string::npos)
      << failure;
  EXPECT_NE(failure.message().find("1048576 bytes (1.0 MiB) requested"), std::string::npos)
      << failure;
  FreeAll(a.get(), &v);
  EXPECT_FALSE(a->EndStep());
  EXPECT_FALSE(a->plans().Contains("b16")) << "a step cut short must not be planned";

  a->StartRecording();
  ASSERT_TRUE(a->BeginStep("b8").ok());
  v = AllocN(a.get(), 8, kMiB);
  FreeAll(a.get(), &v);
  a->EndStep();
  ASSERT_TRUE(a->BeginStep("b16").ok());
  v = AllocN(a.get(), 20, kMiB, &failure);
  EXPECT_NE(failure.message().find("(unplanned: being recorded)"), std::string::npos) << failure;
  FreeAll(a.get(), &v);  // frees of the failed step's allocations are not traced either
  EXPECT_FALSE(a->EndStep());
  ASSERT_TRUE(a->BeginStep("b8").ok());
  v = AllocN(a.get(), 8, kMiB);
  FreeAll(a.get(), &v);
  a->EndStep();
  ASSERT_TRUE(a->BeginStep("b4").ok());  // a step that raised for another reason
  v = AllocN(a.get(), 3, kMiB);
  FreeAll(a.get(), &v);
  a->AbandonStep();
  Trace t = a->StopRecording();
  auto tables = t.Lifetimes();
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 2u);
  for (const auto& table : *tables) {
    EXPECT_EQ(table.signature, "b8");
    EXPECT_EQ(table.allocs.size(), 8u);
    EXPECT_EQ(table.foreign_frees, 0);
  }
  auto plans = a->PlanFromTrace(t);
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 1u);
  AllocatorStats s = a->Stats();
  EXPECT_EQ(s.abandoned_steps, 3);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
}

// Guards a failed arena reservation: a planned step whose arena cannot be reserved fails at
// BeginStep with the step's signature and the arena's bytes, and a smaller step then runs.
TEST(MemAllocator, ArenaReservationFailureNamesStep) {
  auto big = MakeAllocator(64 * kMiB, kMiB);
  big->StartRecording();
  ASSERT_TRUE(big->BeginStep("b32").ok());
  auto v = AllocN(big.get(), 20, kMiB);
  FreeAll(big.get(), &v);
  big->EndStep();
  auto plans = big->PlanFromTrace(big->StopRecording());
  ASSERT_TRUE(plans.ok()) << plans.status();
  auto a = MakeAllocator(16 * kMiB, kMiB);
  ASSERT_TRUE(a->InstallPlan((*plans)[0]).ok());
  Status s = a->BeginStep("b32");
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("out of memory in step 'b32' (planned): its arena of 20971520 bytes"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("free of 16.0 MiB"), std::string::npos) << s;
  ASSERT_TRUE(a->BeginStep("b8").ok());
  v = AllocN(a.get(), 8, kMiB);
  EXPECT_EQ(v.size(), 8u);
  FreeAll(a.get(), &v);
  EXPECT_TRUE(a->EndStep());
  EXPECT_EQ(a->Stats().abandoned_steps, 1);
  EXPECT_EQ(a->Stats().allocated_bytes, 0);
}

// Guards clean shutdown: with nothing live, Close returns every byte (pools and arena)
// without a leak report, and the allocator still serves afterwards.
TEST(MemAllocator, CloseWithNothingLiveReleasesEverything) {
  auto a = MakeAllocator(64 * kMiB, 2 * kMiB);
  void* param = *a->Allocate(3 * kMiB, 0, PoolKind::kPersistent);
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "b64"));
  ASSERT_TRUE(RunStep(a.get(), LayerStep(64), "b64"));  // planned: an arena is reserved
  ASSERT_GT(a->Stats().arena_bytes, 0);
  ASSERT_TRUE(a->BeginStep("b64").ok());  // a trailing step left open (an optimizer hook's)
  ASSERT_TRUE(a->Free(param, 0).ok());
  Status s = a->Close();
  EXPECT_TRUE(s.ok()) << s;
  AllocatorStats st = a->Stats();
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_EQ(st.segments, 0);
  EXPECT_EQ(st.arena_bytes, 0);
  auto p = a->Allocate(kMiB, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(a->Free(*p, 0).ok());
}

// Guards clean shutdown: a tensor the caller still holds at Close is reported as a
// leak (FailedPrecondition naming it), stays valid, and can still be freed; then Close is clean.
TEST(MemAllocator, CloseReportsWhatTheCallerStillHolds) {
  auto a = MakeAllocator(64 * kMiB, 2 * kMiB);
  void* held = *a->Allocate(3 * kMiB, 0, PoolKind::kPersistent);
  void* gone = *a->Allocate(kMiB, 0);
  ASSERT_TRUE(a->Free(gone, 0).ok());
  Status s = a->Close();
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("closed with 1 live allocations (3.0 MiB)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("3.0 MiB stream 0 persistent"), std::string::npos) << s;
  EXPECT_EQ(a->Stats().reserved_bytes, static_cast<int64_t>(4 * kMiB)) << "only held segment kept";
  std::memset(held, 0x11, 3 * kMiB);  // still valid memory
  ASSERT_TRUE(a->Free(held, 0).ok());
  EXPECT_TRUE(a->Close().ok());
  EXPECT_EQ(a->Stats().reserved_bytes, 0);
}

}  // namespace
}  // namespace mem
}  // namespace loongforge
