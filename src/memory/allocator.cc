// MemAllocator: planned arena + pooled best-fit fallback (include/loongforge/memory.h).
//
// One file of about 1,300 lines on purpose: it is one MemAllocator::Impl, one state machine under
// one mutex, and the Notes below are its invariants, cited by the methods that keep them (the pool,
// the lent arena and the planned path all move the same blocks). Split across files, each piece
// would need the whole Impl to read. The planner (planner.cc), the backends (backend_cpu.cc,
// backend_cuda.cu) and the trace (trace.cc) already live apart.
//
// Note [Planned arena safety]
// A plan is a recorded step's allocations with offsets in one arena. While a step matches its
// plan, allocation k is served at arena + offset[k] in O(1). Slots are handed out in plan order
// (a cursor that only moves forward), each at its planned offset and never larger than planned,
// so the only way two live arena allocations could share a byte is that a slot's bytes are still
// held when it comes up. The live step may differ from the recorded one in three ways, each
// detected before anything unsafe is handed out:
//   - allocation k is larger than planned or on another stream -> the step diverges (a smaller
//     one is served from the planned bytes: Note [Envelope plans] in planner.cc);
//   - an earlier planned allocation sharing k's bytes (plan.must_be_free[k]) is still live,
//     because the live step freed it later than the recorded one, or k's bytes are held by an
//     occupant (Note [Arena occupants]) -> k alone comes from the pool (a planned skip; slot k
//     stays empty this step) and the step keeps its plan;
//   - several streams and last step's planned allocations still live at BeginStep -> this step
//     is not planned.
// A diverged step serves the rest of its allocations from the pool, which starts in the arena's
// free bytes (Note [Lent arena]; one planned miss counted); the planned allocations already
// handed out stay where they are and become allocated blocks of the lent arena. So no two live
// allocations ever share a byte, whatever the live step does. Allocations on different streams
// never share arena bytes (planner.cc, Note [Interval packing]), so arena reuse is always
// stream-ordered.
//
// Note [Arena occupants]
// With one stream, live allocations that hold arena bytes outside the current plan are occupants,
// kept as a short (offset, size) list: the previous step's planned allocations still live at
// BeginStep (a layer output or loss freed early in the next step), and pool allocations made in
// the lent arena that outlive their step. A planned slot that overlaps an occupant is skipped (its
// allocation comes from the pool); freeing the occupant frees its bytes for later slots. The
// check is a scan of the list, only when it is not empty. The arena is not resized while
// occupied: a plan larger than the occupied arena runs its step from the pool (lent arena).
//
// Note [First sight]
// A signature not seen while recording would otherwise run from the pool forever. So BeginStep of
// a signature without a plan (outside a recording) opens a one-step trace; EndStep (or the next
// BeginStep) closes it, plans it (outside the lock: planning is O(n^2) in the step's allocations,
// about a millisecond for 800), checks the plan and installs it. The step itself is served by the
// pool; the signature's next step is planned. The transient pool's fully free segments are then
// returned to the backend: the memory they held for this step is what the arena will serve from
// now on (on CUDA this is a cudaFree, which synchronizes the device: once per new signature).
// Plans are bounded by Options::max_plans (least recently used evicted) and share one arena sized
// to the largest cached plan, which is safe because only one step runs at a time and a step is
// planned only when no planned allocation of the previous step is live.
//
// Note [Lent arena]
// While a step runs unplanned (first sight, no plan, a plan evicted, or a planned step that
// diverged), the arena is idle or partly idle, yet all its bytes count as reserved. So the arena is
// lent to the transient pool as one more segment: its live allocations (planned ones already
// handed out, occupants) become allocated blocks, the gaps between them free blocks. The step
// boundary (EndStep or the next BeginStep) takes the segment back: what is still live there
// becomes an occupant (Note [Arena occupants]), the rest is arena again. Lending happens only
// while one stream has been seen (the arena's bytes were last used on it, so free blocks belong to
// it); if a second stream appears while the arena is lent and something there is still live, the
// pool keeps the bytes as an ordinary segment and the next planned step reserves a new arena.
// On real MoE steps (docs/memory.md, "Variable-size steps") this is what keeps a diverged step
// from reserving a pool beside the whole arena.
//
// Note [Lifetime-guided fallback]
// After a step diverged, its remaining allocations come from the pool, whose best fit alone
// fragments badly on steps like an MoE layer's (real n16-moe trace: 25% over the live bytes when a
// whole step ran best fit in a clean arena). But the plan it diverged from still forecasts the
// lifetimes: the step keeps moving its cursor, and allocation k is placed by the lifetime of slot
// k in the recorded step. Long-lived ones (more than an eighth of the step's allocations come and
// go meanwhile) go first fit from the lent arena's low end, short-lived ones first fit from its
// high end, so temporaries do not split the space saved activations need; when nothing in the
// arena fits, best fit over all segments as before. The forecast is positional: inserted or
// missing allocations shift it, which costs memory, never safety (placement only chooses among
// free blocks). Slower than best fit (a walk of the lent arena's blocks), and only after a
// divergence. On the real MoE trace this took the planned replay from 16.9% to 7.0% fragmentation
// (with other fractions than an eighth, from a half to a thirty-second: 10.5-12.5%).
//
// Note [Free segments while the arena is lent]
// A step that runs in the lent arena (diverged or unplanned) leaves the transient pool's own
// segments to what does not fit there: tensors that outlive a step (served by the pool, never
// planned) and requests no arena hole can hold. Such a segment often becomes fully free during
// the step (the previous step's outliving tensors are freed ~400 events into the next on the real
// MoE trace), yet it stays reserved while the step grows another segment beside it. So while the
// arena is lent, the pool returns its fully free segments to the backend before it grows, and the
// step boundary that takes the arena back does the same. Planned steps never do this (their pool
// keeps its segments: no cudaFree, which synchronizes the device, on the steady path). On the
// real MoE trace this took the planned replay from 6.67% to 5.02% fragmentation.
//
// Note [First-sight steps give free segments back]
// A first-sight step with no arena yet (the very first step) runs entirely from the pool, and with
// no forecast, best fit leaves segments that are fully free while the step grows new ones (an
// activation's own-size segment freed in backward, then a larger gradient). So a probing step,
// like a lent one, returns fully free pool segments to the backend before growing. On the real
// GR00T n16 trace the first step's reserved peak went from 8584 to 7678 MiB (7013 MiB live).
// Costs a cudaFree per released segment, only in a new signature's first step (about 28 per new
// signature there).
//
// Note [Arena for a new signature]
// Once a plan exists but no arena does (the arena is reserved by the first planned step), a new
// signature's first step would again run from fresh pool segments. Instead BeginStep reserves the
// arena for the largest cached plan and lends it (Note [Lent arena]); what does not fit grows the
// pool, and the next planned step grows the arena as before. Not when an earlier step left a
// tensor live (step_made_live > 0): it would likely land in the lent arena, become an occupant
// and keep the arena from growing for larger plans (real MoE trace: planned hits 206 -> 99, first
// sight 16.3% -> 17.3%). Real GR00T first sight: 5.80% -> 4.52%. Using another signature's plan
// as the lifetime forecast there (Note [Lifetime-guided fallback]) was measured worse (5.35%).
//
// Note [Stream-safe reuse]
// A pooled block freed by stream S may be reused at once by S (stream order makes that safe). For
// another stream T it must wait until S has passed the free: the free records a fence on S (only
// once the allocator has seen more than one stream; with one stream no fence is needed), and T
// takes the block only when the fence has passed. A block freed without a fence gets one recorded
// on demand when T first wants it: recorded later than the free, so waiting on it is conservative
// and still correct. Blocks whose fences have passed become usable by any stream and coalesce
// freely; a pending block coalesces only with neighbours of its own stream.
//
// Note [Out of memory in a step]
// A step that asks for more than the backend has fails with ResourceExhausted that says what a
// user needs to shrink the step: the step's signature, the bytes asked for (exact and readable),
// how the step was being served (planned; planned but diverged, and why; unplanned: first sight,
// recording, or no plan), what the backend had free of its capacity, and what was live. The step
// is then abandoned, so that a smaller step can follow cleanly (a batch-size search, or a retry
// with a smaller batch after torch raised):
//   - it is no longer planned: the rest of it (the exception's handling, a retry inside the same
//     step) comes from the pool, which starts in the arena's free bytes (Note [Lent arena]);
//   - it is not planned on first sight: a plan made from a step cut short would be wrong;
//   - while recording, its events are dropped from the trace (it was never a whole step) and the
//     later frees of its allocations are not traced, so PlanFromTrace never sees it;
//   - its allocations still live (torch frees them when the exception is dropped) stay valid and
//     are freed normally; those still live at the next BeginStep are occupants as usual.
// The next BeginStep starts clean. The same happens when BeginStep cannot reserve a planned
// step's arena (the error then names the arena's bytes), and on AbandonStep (the Python layer
// calls it when a step raised). What a failed step's recording drops also takes away the frees
// made in it of the previous step's carries: they then look persistent to the planner (served by
// the pool), which costs memory, never safety.
//
// Note [Shutdown]
// MemAllocator does not free what is live when destroyed (it warns: a leak). The process-wide
// allocators of the torch plug-in (torch_allocator.cc) are never destroyed at all: torch frees
// tensors that live to the end of the process (parameters, optimizer state held by globals)
// during or after interpreter shutdown, in no order we control, and possibly after static
// destructors ran; a destroyed allocator would then be freed into. So those allocators live
// until the process ends and the driver reclaims device memory with the context. An orderly end
// is Close(), which the caller runs after dropping its own tensors: it returns every cached byte
// and reports a leak (FailedPrecondition naming the live allocations) only if something is still
// live then, that is, something the caller still holds.
#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <unordered_map>

#include "loongforge/logging.h"
#include "loongforge/memory.h"
#include "memory/planner.h"

namespace loongforge {
namespace mem {
namespace {

constexpr size_t kLargeSegmentRoundBytes = size_t{2} << 20;
// Requests at least this large get a segment of their own size (rounded to 2 MiB) instead of a
// full Options::segment_bytes segment: on the real MoE trace the 25.5 MiB tensors that outlive
// each step held 32 MiB segments (6.5 MiB slack each). 16 MiB is the best of 4/16 MiB tried there
// (planned 7.04% -> 6.67%, first sight 44.5% -> 38.9%; GR00T first sight 17.4% -> 17.2%; 4 MiB
// makes GR00T's first sight worse, 21.9%). Smaller ones share segments as before.
constexpr size_t kOwnSegmentMinBytes = size_t{16} << 20;

size_t RoundUpTo2M(int64_t n) {
  return (static_cast<size_t>(n) + kLargeSegmentRoundBytes - 1) / kLargeSegmentRoundBytes *
         kLargeSegmentRoundBytes;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Segment;

struct Block {
  uintptr_t addr = 0;
  size_t size = 0;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address order within the segment
  Block* next = nullptr;
  bool allocated = false;
  StreamId stream = 0;      // owner: the stream that allocated it (and so last used it)
  bool any_stream = false;  // free and safe for every stream
  bool has_fence = false;
  FenceToken fence;
};

struct Segment {
  uintptr_t base = 0;
  size_t size = 0;
  PoolKind kind = PoolKind::kTransient;
  Block* head = nullptr;
  bool borrowed = false;  // the idle arena, lent to the transient pool (Note [Lent arena])
};

// Splits block `b` (out of any free set) at `offset`: `b` keeps [addr, addr + offset); the
// returned block, linked after it in the same segment with b's stream state and no fence, covers
// the rest.
Block* SplitAt(Block* b, size_t offset) {
  auto* r = new Block;
  r->addr = b->addr + offset;
  r->size = b->size - offset;
  r->segment = b->segment;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  r->stream = b->stream;
  r->any_stream = b->any_stream;
  b->size = offset;
  return r;
}

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
};

struct Pool {
  std::set<Block*, BlockLess> free_blocks;
  std::vector<Segment*> segments;
};

struct Live {
  Block* block = nullptr;  // null for planned (arena) allocations
  int32_t plan_index = -1;
  size_t size = 0;  // rounded
  int64_t requested = 0;
  StreamId stream = 0;
  PoolKind kind = PoolKind::kTransient;
  uint64_t id = 0;
  bool occupant = false;  // holds arena bytes outside any plan (Note [Arena occupants])
  bool in_step = false;   // allocated between BeginStep and the step's end (transient)
  bool untraced = false;  // made in an abandoned step: its free is not traced either
};

}  // namespace

struct MemAllocator::Impl {
  Options options;
  std::unique_ptr<MemoryBackend> backend;
  std::unique_ptr<StreamFence> fence;
  mutable std::mutex mu;

  Pool pools[2];
  std::unordered_map<uintptr_t, Live> live;
  std::set<StreamId> streams_seen;

  // Arena and the plan whose allocations it holds.
  Segment* lent = nullptr;  // the arena as a pool segment, while lent (Note [Lent arena])
  void* arena = nullptr;
  size_t arena_size = 0;
  std::shared_ptr<const Plan> arena_plan;
  std::vector<uint8_t> planned_live;
  int64_t planned_live_count = 0;
  // Note [Arena occupants]: live allocations holding arena bytes outside the current plan, as
  // (offset, size). Few (what outlived the last step), usually none.
  std::vector<std::pair<int64_t, int64_t>> occupants;
  bool step_planned = false;
  size_t cursor = 0;
  // Note [Lifetime-guided fallback]: the plan a diverged step left, and its position there.
  std::shared_ptr<const Plan> shadow_plan;
  int64_t shadow_long_events = 0;
  // Note [Carry zones] (planner.cc): the zone this step's carries went to (-1: none planned).
  int carry_zone_now = -1;
  int64_t first_sight_zone = 0;  // carry zone of first-sight plans: the largest seen so far
  // Note [Sibling plans] (planner.cc): the plan group the step began with (arena_plan is its
  // member group_index), and the step's transient allocs and frees so far.
  std::shared_ptr<const Plan> group_root;
  size_t group_index = 0;
  int64_t step_events = 0;

  bool recording = false;
  Trace trace;
  // Note [First sight]: the one-step trace of a signature without a plan.
  bool probing = false;
  // Note [Arena for a new signature]: whether a step is open, and how many transient
  // allocations made inside steps are live (at BeginStep: what earlier steps left behind).
  bool step_open = false;
  int64_t step_made_live = 0;
  // Note [Out of memory in a step]: the open step was abandoned; where its events begin in the
  // recording; the first allocation id it made.
  bool step_failed = false;
  size_t step_trace_start = 0;
  uint64_t step_first_id = 1;
  std::string step_unplanned_why;  // why the open step began without a plan (empty: it has one)
  int64_t abandoned_steps = 0;
  std::string probe_signature;
  Trace probe;
  int64_t first_sight_plans = 0;
  uint64_t next_id = 1;

  // Stats.
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
  int64_t persistent_allocated = 0;
  int64_t num_allocs = 0, num_frees = 0, planned_hits = 0, planned_misses = 0, planned_steps = 0,
          pool_allocs = 0, planned_skips = 0;
  std::string last_miss;       // AllocatorStats::last_miss
  std::string step_signature;  // of the open step (for last_miss)
  Histogram latency_ns;

  ~Impl() {
    for (auto& pool : pools) {
      for (Segment* s : pool.segments) {
        Block* b = s->head;
        while (b) {
          Block* n = b->next;
          if (b->has_fence && fence) fence->Release(b->fence);
          delete b;
          b = n;
        }
        if (!s->borrowed) backend->Release(reinterpret_cast<void*>(s->base), s->size);
        delete s;
      }
    }
    if (arena) backend->Release(arena, arena_size);
  }

  void AddReserved(int64_t d) {
    reserved += d;
    peak_reserved = std::max(peak_reserved, reserved);
  }
  void AddAllocated(int64_t d) {
    allocated += d;
    peak_allocated = std::max(peak_allocated, allocated);
  }

  // True if `stream` may take free block `b` now (settles passed fences on the way).
  bool Usable(Block* b, StreamId stream) {
    if (b->any_stream || b->stream == stream) return true;
    if (!fence) return false;
    if (!b->has_fence) {
      b->fence = fence->Record(b->stream);  // on demand: Note [Stream-safe reuse]
      b->has_fence = true;
    }
    if (fence->Passed(b->fence)) {
      fence->Release(b->fence);
      b->has_fence = false;
      b->any_stream = true;
      return true;
    }
    return false;
  }

  bool CanMerge(const Block* into, const Block* n) const {
    if (n == nullptr || n->allocated) return false;
    if (n->any_stream) return true;  // safe for everyone, so safe to join `into`'s stream
    return !into->any_stream && n->stream == into->stream;
  }

  // `b` absorbs its free neighbour `n`: b keeps one fence that covers both. b's own fence, if any,
  // was recorded later on the same stream (CanMerge) and so covers n's.
  void MergeFence(Block* b, Block* n) {
    if (!n->has_fence) return;
    if (b->has_fence) {
      fence->Release(n->fence);
    } else {
      b->fence = n->fence;
      b->has_fence = true;
    }
  }

  // Merges free neighbours into `b` (already out of the free set); returns the merged block.
  Block* Coalesce(Pool& pool, Block* b) {
    for (Block* n : {b->prev, b->next}) {
      if (!CanMerge(b, n)) continue;
      pool.free_blocks.erase(n);
      MergeFence(b, n);
      if (n == b->prev) {
        b->addr = n->addr;
        b->prev = n->prev;
        if (n->prev)
          n->prev->next = b;
        else
          b->segment->head = b;
      } else {
        b->next = n->next;
        if (n->next) n->next->prev = b;
      }
      b->size += n->size;
      delete n;
    }
    return b;
  }

  Block* FindFree(Pool& pool, size_t size, StreamId stream) {
    Block probe;
    probe.size = size;
    for (auto it = pool.free_blocks.lower_bound(&probe); it != pool.free_blocks.end(); ++it) {
      if (Usable(*it, stream)) return *it;
    }
    return nullptr;
  }

  // Settles every pending fence that has passed, then coalesces free neighbours segment by
  // segment. Slow path only (before growing): it walks every block.
  void SettlePending() {
    if (!fence) return;
    for (auto& pool : pools) {
      bool any = false;
      for (Block* b : pool.free_blocks) {
        // any_stream/has_fence do not take part in the set's order, so this is safe in place.
        if (b->has_fence && !b->any_stream && fence->Passed(b->fence)) {
          fence->Release(b->fence);
          b->has_fence = false;
          b->any_stream = true;
          any = true;
        }
      }
      if (!any) continue;
      for (Segment* s : pool.segments) {
        for (Block* b = s->head; b != nullptr; b = b->next) {
          while (!b->allocated && CanMerge(b, b->next)) {
            Block* n = b->next;
            pool.free_blocks.erase(b);
            pool.free_blocks.erase(n);
            MergeFence(b, n);
            b->next = n->next;
            if (n->next) n->next->prev = b;
            b->size += n->size;
            delete n;
            pool.free_blocks.insert(b);
          }
        }
      }
    }
  }

  Status Grow(Pool& pool, PoolKind kind, size_t size) {
    size_t seg_size = size <= options.segment_bytes && size < kOwnSegmentMinBytes
                          ? options.segment_bytes
                          : (size + kLargeSegmentRoundBytes - 1) / kLargeSegmentRoundBytes *
                                kLargeSegmentRoundBytes;
    StatusOr<void*> mem = backend->Reserve(seg_size);
    if (!mem.ok() && seg_size > size) {
      seg_size = size;  // a full segment does not fit: try just the request
      mem = backend->Reserve(seg_size);
    }
    if (!mem.ok()) return mem.status();
    auto* seg = new Segment;
    seg->base = reinterpret_cast<uintptr_t>(*mem);
    seg->size = seg_size;
    seg->kind = kind;
    auto* b = new Block;
    b->addr = seg->base;
    b->size = seg_size;
    b->segment = seg;
    b->any_stream = true;
    seg->head = b;
    pool.segments.push_back(seg);
    pool.free_blocks.insert(b);
    AddReserved(static_cast<int64_t>(seg_size));
    return Status::Ok();
  }

  // Returns `pool`'s fully free segments to the backend.
  void ReleaseFreeSegments(Pool& pool) {
    std::vector<Segment*> keep;
    for (Segment* s : pool.segments) {
      Block* b = s->head;
      // Any owner stream is fine here: MemoryBackend::Release makes pending use safe.
      if (!s->borrowed && !b->allocated && b->next == nullptr) {
        pool.free_blocks.erase(b);
        if (b->has_fence) fence->Release(b->fence);
        delete b;
        backend->Release(reinterpret_cast<void*>(s->base), s->size);
        reserved -= static_cast<int64_t>(s->size);
        delete s;
      } else {
        keep.push_back(s);
      }
    }
    pool.segments = std::move(keep);
  }

  void ReleaseArena() {
    if (!arena) return;
    backend->Release(arena, arena_size);
    reserved -= static_cast<int64_t>(arena_size);
    arena = nullptr;
    arena_size = 0;
    arena_plan.reset();
  }

  void ReleaseCachedLocked() {
    SettlePending();
    for (auto& pool : pools) ReleaseFreeSegments(pool);
    if (planned_live_count == 0 && occupants.empty() && !step_planned && lent == nullptr) {
      ReleaseArena();
    }
  }

  // Note [Lent arena]. Called when a step runs unplanned: at its start, or when a planned step
  // diverges. Live allocations in the arena (planned ones, occupants) become allocated blocks of
  // the lent segment; the gaps between them become free blocks the pool can serve from.
  void LendArena() {
    if (!arena || lent || streams_seen.size() > 1) return;
    const uintptr_t base = reinterpret_cast<uintptr_t>(arena);
    auto* seg = new Segment;
    seg->base = base;
    seg->size = arena_size;
    seg->kind = PoolKind::kTransient;
    seg->borrowed = true;
    std::vector<std::pair<uintptr_t, Live*>> inside;
    if (planned_live_count > 0 || !occupants.empty()) {
      for (auto& [addr, rec] : live) {
        if (rec.plan_index >= 0 || rec.occupant) inside.push_back({addr, &rec});
      }
      std::sort(inside.begin(), inside.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
    }
    Pool& pool = pools[static_cast<int>(PoolKind::kTransient)];
    Block* tail = nullptr;
    auto append = [&](uintptr_t addr, size_t size, bool allocated, StreamId stream) {
      auto* b = new Block;
      b->addr = addr;
      b->size = size;
      b->segment = seg;
      b->allocated = allocated;
      // Free bytes were last used on the one stream seen: that stream may take them at once,
      // another only after a fence (Note [Stream-safe reuse]).
      b->any_stream = !allocated && streams_seen.empty();
      b->stream = stream;
      b->prev = tail;
      if (tail) {
        tail->next = b;
      } else {
        seg->head = b;
      }
      tail = b;
      if (!allocated) pool.free_blocks.insert(b);
      return b;
    };
    const StreamId one = streams_seen.empty() ? 0 : *streams_seen.begin();
    uintptr_t at = base;
    for (auto& [addr, rec] : inside) {
      LF_CHECK(addr >= at && addr + rec->size <= base + arena_size)
          << "arena allocations overlap or lie outside the arena";
      if (addr > at) append(at, addr - at, false, one);
      rec->block = append(addr, rec->size, true, rec->stream);
      rec->plan_index = -1;
      rec->occupant = false;
      at = addr + rec->size;
    }
    if (at < base + arena_size) append(at, base + arena_size - at, false, one);
    pool.segments.push_back(seg);
    lent = seg;
    occupants.clear();
    planned_live_count = 0;
    step_planned = false;
    arena_plan.reset();
  }

  // Note [Lent arena]. Called at step boundaries. Allocations still live in the lent arena become
  // occupants (Note [Arena occupants]); the arena is the arena again.
  void ReclaimArena() {
    if (!lent) return;
    Pool& pool = pools[static_cast<int>(PoolKind::kTransient)];
    // Note [Free segments while the arena is lent]: the step that borrowed the arena is over.
    SettlePending();
    ReleaseFreeSegments(pool);
    if (streams_seen.size() > 1) {
      Block* b = lent->head;
      if (b->allocated || b->next != nullptr) {
        // A second stream appeared and the arena is in use: the pool keeps the bytes, reserved
        // unchanged, and the arena is forgotten (the next planned step reserves a new one).
        lent->borrowed = false;
        arena = nullptr;
        arena_size = 0;
        arena_plan.reset();
        lent = nullptr;
        return;
      }
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(arena);
    for (Block* b = lent->head; b != nullptr;) {
      Block* n = b->next;
      if (b->allocated) {
        auto it = live.find(b->addr);
        LF_CHECK(it != live.end()) << "allocated block in the lent arena without a live record";
        it->second.block = nullptr;
        it->second.occupant = true;
        occupants.push_back({static_cast<int64_t>(b->addr - base), static_cast<int64_t>(b->size)});
      } else {
        pool.free_blocks.erase(b);
      }
      if (b->has_fence) fence->Release(b->fence);
      delete b;
      b = n;
    }
    pool.segments.erase(std::find(pool.segments.begin(), pool.segments.end(), lent));
    delete lent;
    lent = nullptr;
  }

  // Note [Arena occupants]: the previous step's planned allocations still live at BeginStep.
  void PlannedToOccupants() {
    if (planned_live_count == 0) return;
    const uintptr_t base = reinterpret_cast<uintptr_t>(arena);
    for (auto& [addr, rec] : live) {
      if (rec.plan_index < 0) continue;
      rec.plan_index = -1;
      rec.occupant = true;
      occupants.push_back({static_cast<int64_t>(addr - base), static_cast<int64_t>(rec.size)});
    }
    planned_live_count = 0;
  }

  bool OverlapsOccupant(int64_t off, int64_t size) const {
    for (const auto& [o, n] : occupants) {
      if (o < off + size && off < o + n) return true;
    }
    return false;
  }

  void RemoveOccupant(uintptr_t addr) {
    const int64_t off = static_cast<int64_t>(addr - reinterpret_cast<uintptr_t>(arena));
    for (size_t i = 0; i < occupants.size(); ++i) {
      if (occupants[i].first == off) {
        occupants[i] = occupants.back();
        occupants.pop_back();
        return;
      }
    }
    LF_CHECK(false) << "freed occupant not in the arena's occupant list";
  }

  // Note [Lifetime-guided fallback]: first fit in the lent arena, from its low end (`low`: the
  // allocation is forecast to live long) or its high end (short-lived). nullptr if none fits.
  Block* FindInLent(size_t size, StreamId stream, bool low) {
    Block* b = lent->head;
    if (!low) {
      while (b->next) b = b->next;
    }
    for (; b != nullptr; b = low ? b->next : b->prev) {
      if (!b->allocated && b->size >= size && Usable(b, stream)) return b;
    }
    return nullptr;
  }

  StatusOr<void*> PoolAlloc(size_t size, StreamId stream, PoolKind kind, Live* rec,
                            int placement = 0) {
    Pool& pool = pools[static_cast<int>(kind)];
    Block* b = nullptr;
    if (placement != 0 && lent != nullptr) b = FindInLent(size, stream, placement < 0);
    if (b != nullptr && placement > 0 && b->size - size >= kAlignBytes) {
      // Short-lived: take the block's high end, leave the low part free.
      pool.free_blocks.erase(b);
      Block* r = SplitAt(b, b->size - size);
      pool.free_blocks.insert(b);
      b = r;
    } else if (b != nullptr) {
      pool.free_blocks.erase(b);
    }
    if (b != nullptr) {
      if (b->has_fence) {
        fence->Release(b->fence);
        b->has_fence = false;
      }
      return TakeBlock(pool, b, size, stream, rec);
    }
    b = FindFree(pool, size, stream);
    if (!b) {
      SettlePending();
      b = FindFree(pool, size, stream);
    }
    if (!b) {
      // Note [Free segments while the arena is lent] and Note [First-sight steps give free
      // segments back]: give back what the step no longer uses before reserving more.
      if ((lent != nullptr || probing) && kind == PoolKind::kTransient) {
        SettlePending();
        ReleaseFreeSegments(pool);
      }
      Status st = Grow(pool, kind, size);
      if (!st.ok()) {
        ReleaseCachedLocked();
        st = Grow(pool, kind, size);
      }
      if (!st.ok()) return ResourceExhaustedError(backend->Name() + ": " + st.message());
      b = FindFree(pool, size, stream);
      LF_CHECK(b != nullptr) << "fresh segment cannot serve " << size;
    }
    pool.free_blocks.erase(b);
    if (b->has_fence) {
      fence->Release(b->fence);
      b->has_fence = false;
    }
    return TakeBlock(pool, b, size, stream, rec);
  }

  // Allocates `size` bytes at the start of free block `b` (already out of the free set).
  void* TakeBlock(Pool& pool, Block* b, size_t size, StreamId stream, Live* rec) {
    size_t rest = b->size - size;
    if (rest >= options.min_split_bytes && rest >= kAlignBytes) {
      pool.free_blocks.insert(SplitAt(b, size));  // a pending rest gets a fence on demand
    }
    b->allocated = true;
    b->any_stream = false;
    b->stream = stream;
    rec->block = b;
    rec->size = b->size;
    ++pool_allocs;
    return reinterpret_cast<void*>(b->addr);
  }

  void PoolFree(Block* b, PoolKind kind) {
    Pool& pool = pools[static_cast<int>(kind)];
    b->allocated = false;
    if (fence && streams_seen.size() > 1) {
      b->fence = fence->Record(b->stream);
      b->has_fence = true;
    }
    pool.free_blocks.insert(Coalesce(pool, b));
  }

  // Note [Sibling plans] (planner.cc): the member of the step's plan group to serve allocation k
  // from, the current one included. It must fit the request and hold every planned allocation
  // live now at the same offset, no smaller (then its must_be_free lists hold for the step as it
  // is). Preferred: slot k recorded at this event count (the step's structure), then the
  // tightest slot. With `require_seq`, only members whose slot k was recorded at this count.
  // -1: none.
  int ChooseMember(size_t k, size_t size, StreamId stream, bool require_seq) const {
    const Plan& root = *group_root;
    const Plan& cur = *arena_plan;
    const size_t m = root.siblings.size() + 1;
    // Rank the members that fit by (recorded at this count, tightest slot), the current member
    // first among equals; only a member ranked above the current one needs the agreement scan,
    // which is O(k). (Scanning every candidate made steps with long shared prefixes quadratic:
    // the real trainer trace's steady steps share ~6600 slots with its last recorded step.)
    struct Cand {
      int j;
      bool seq;
      int64_t size;
    };
    Cand local[16];  // groups are small (one member per recorded structure): no heap here
    std::vector<Cand> spill;
    Cand* cands = local;
    if (m > 16) {
      spill.resize(m);
      cands = spill.data();
    }
    size_t n = 0;
    for (size_t j = 0; j < m; ++j) {
      const Plan& q = j == 0 ? root : *root.siblings[j - 1];
      if (k >= q.sizes.size() || q.streams[k] != stream || static_cast<size_t>(q.sizes[k]) < size ||
          static_cast<size_t>(q.peak_bytes) > arena_size) {
        continue;
      }
      const bool seq = k < q.alloc_seqs.size() && q.alloc_seqs[k] == step_events;
      if (require_seq && !seq) continue;
      cands[n++] = Cand{static_cast<int>(j), seq, q.sizes[k]};
    }
    std::stable_sort(cands, cands + n, [&](const Cand& x, const Cand& y) {
      if (x.seq != y.seq) return x.seq;
      if (x.size != y.size) return x.size < y.size;
      return static_cast<size_t>(x.j) == group_index && static_cast<size_t>(y.j) != group_index;
    });
    for (size_t r = 0; r < n; ++r) {
      const Cand& c = cands[r];
      if (static_cast<size_t>(c.j) == group_index) return c.j;
      const Plan& q = c.j == 0 ? root : *root.siblings[static_cast<size_t>(c.j) - 1];
      bool agree = true;
      for (size_t i = 0; i < k && agree; ++i) {
        agree = !planned_live[i] || (q.offsets[i] == cur.offsets[i] && q.sizes[i] >= cur.sizes[i]);
      }
      if (agree) return c.j;
    }
    return -1;
  }

  // Planned path; returns nullptr when the step diverges (Note [Planned arena safety]).
  void* TryPlanned(size_t size, StreamId stream, Live* rec, bool* pool_served) {
    *pool_served = false;
    size_t k = cursor;
    auto fits = [&](const Plan& q) {
      // No larger than planned (Note [Envelope plans] in planner.cc), on the planned stream.
      return k < q.sizes.size() && q.streams[k] == stream &&
             static_cast<size_t>(q.sizes[k]) >= size;
    };
    bool ok = fits(*arena_plan);
    if (!group_root->siblings.empty()) {
      // Before the members part ways, the tightest fitting one; after, another member only when
      // the current one cannot serve k, or when its slot k was recorded at another event count
      // and a member's was recorded at this one (the step took another branch).
      const bool choosing = static_cast<int64_t>(k) <= group_root->sibling_prefix;
      const bool seq_ok =
          k < arena_plan->alloc_seqs.size() && arena_plan->alloc_seqs[k] == step_events;
      int j = -1;
      if (choosing || !ok) {
        j = ChooseMember(k, size, stream, /*require_seq=*/false);
        ok = j >= 0;
      } else if (!seq_ok) {
        j = ChooseMember(k, size, stream, /*require_seq=*/true);
      }
      if (j >= 0 && static_cast<size_t>(j) != group_index) {
        group_index = static_cast<size_t>(j);
        arena_plan = j == 0 ? group_root : group_root->siblings[j - 1];
        if (planned_live.size() < arena_plan->sizes.size()) {
          planned_live.resize(arena_plan->sizes.size(), 0);
        }
      }
    }
    if (!ok) {
      const Plan& q = *arena_plan;
      if (k >= q.sizes.size()) return Diverge("more allocations than planned", size, 0);
      return Diverge(q.streams[k] != stream ? "another stream than planned" : "larger than planned",
                     size, q.sizes[k]);
    }
    const Plan& p = *arena_plan;
    ++cursor;
    // Slot k's bytes still held (the live step frees later than the recorded one, or something
    // from the last step occupies them): this allocation alone comes from the pool and slot k
    // stays empty; the rest of the step keeps its plan (Note [Planned arena safety]).
    bool held = false;
    for (int32_t j : p.must_be_free[k]) held = held || planned_live[j];
    if (held || (!occupants.empty() && p.offsets[k] != kNotPlanned &&
                 OverlapsOccupant(p.offsets[k], p.sizes[k]))) {
      ++planned_skips;
      *pool_served = true;
      return nullptr;
    }
    if (p.offsets[k] == kNotPlanned ||
        (!p.carries.empty() && p.carries[k] && streams_seen.size() > 1)) {
      // Several streams: a carry left live at BeginStep would block the next step's plan.
      *pool_served = true;
      return nullptr;
    }
    if (!p.carries.empty() && p.carries[k]) carry_zone_now = p.carry_zone;
    planned_live[k] = 1;
    ++planned_live_count;
    rec->plan_index = static_cast<int32_t>(k);
    rec->size = size;
    ++planned_hits;
    return static_cast<char*>(arena) + p.offsets[k];
  }

  // The rest of the step comes from the pool, which serves it from the arena's free bytes first
  // (Note [Lent arena]).
  void* Diverge(const char* why, size_t size, int64_t planned) {
    step_planned = false;
    ++planned_misses;
    last_miss = "step '" + step_signature + "' diverged at allocation " + std::to_string(cursor) +
                " of " + std::to_string(arena_plan->sizes.size()) + ": " + why + " (" +
                std::to_string(size) + " bytes requested, " + std::to_string(planned) + " planned)";
    shadow_plan = arena_plan;
    // Long-lived: more than an eighth of the step's allocations (about a sixteenth of its
    // events) come and go in its lifetime.
    shadow_long_events = static_cast<int64_t>(arena_plan->sizes.size() / 8);
    LendArena();
    return nullptr;
  }

  // Note [Out of memory in a step]: how the open step was being served when it ran out.
  std::string StepStateLocked() const {
    if (!step_open) return "outside any step";
    if (step_failed) return "already abandoned";
    if (step_planned) {
      // TryPlanned moved the cursor past the slot the pool was asked to serve.
      return "planned: allocation " + std::to_string(cursor > 0 ? cursor - 1 : 0) + " of " +
             std::to_string(arena_plan->sizes.size()) + ", served by the pool";
    }
    if (shadow_plan) {
      const size_t at = last_miss.find("diverged");
      return "planned, then " + (at == std::string::npos ? "diverged" : last_miss.substr(at));
    }
    if (probing) return "unplanned: first sight of this signature";
    if (recording) return "unplanned: being recorded";
    return "unplanned: " + step_unplanned_why;
  }

  // Note [Out of memory in a step]: the open step is no longer planned, first-sight planned or
  // traced. Counts once per step.
  void AbandonLocked() {
    if (!step_open || step_failed) return;
    step_failed = true;
    ++abandoned_steps;
    probing = false;
    probe.Clear();
    if (recording) trace.Truncate(step_trace_start);
    for (auto& [addr, rec] : live) {
      if (rec.in_step && rec.id >= step_first_id) rec.untraced = true;
    }
    if (step_planned) {
      step_planned = false;
      LendArena();
    }
    shadow_plan.reset();
  }

  // Closes the open step (abandoned or not) under the lock; the caller plans a first sight.
  void EndStepLocked() {
    step_planned = false;
    step_open = false;
    cursor = 0;
    shadow_plan.reset();
    ReclaimArena();
  }

  std::string DescribeLiveLocked(size_t top_n) const {
    std::vector<const Live*> v;
    v.reserve(live.size());
    for (const auto& [addr, l] : live) v.push_back(&l);
    size_t n = std::min(top_n, v.size());
    std::partial_sort(v.begin(), v.begin() + n, v.end(),
                      [](const Live* a, const Live* b) { return a->size > b->size; });
    int64_t largest_free = 0;
    for (const auto& pool : pools) {
      if (!pool.free_blocks.empty()) {
        largest_free = std::max<int64_t>(largest_free, (*pool.free_blocks.rbegin())->size);
      }
    }
    std::ostringstream os;
    os << "allocated " << FormatBytes(allocated) << " in " << live.size()
       << " live allocations (persistent " << FormatBytes(persistent_allocated) << ", planned "
       << planned_live_count << "), reserved " << FormatBytes(reserved) << " (arena "
       << FormatBytes(static_cast<int64_t>(arena_size)) << "), largest free block "
       << FormatBytes(largest_free) << "; top live:";
    for (size_t i = 0; i < n; ++i) {
      const Live* l = v[i];
      os << (i ? "," : "") << ' ' << FormatBytes(static_cast<int64_t>(l->size)) << " stream "
         << l->stream << ' '
         << (l->plan_index >= 0 ? "planned"
                                : (l->kind == PoolKind::kPersistent ? "persistent" : "transient"));
    }
    if (n == 0) os << " none";
    return os.str();
  }
};

MemAllocator::MemAllocator(Options options, std::unique_ptr<MemoryBackend> backend,
                           std::unique_ptr<StreamFence> fence)
    : impl_(std::make_unique<Impl>()) {
  LF_CHECK(backend != nullptr);
  if (options.segment_bytes < kAlignBytes) options.segment_bytes = kAlignBytes;
  options.segment_bytes = RoundUp(options.segment_bytes);
  impl_->options = options;
  plans_.set_max_plans(options.max_plans);
  impl_->backend = std::move(backend);
  impl_->fence = std::move(fence);
}

MemAllocator::~MemAllocator() {
  if (impl_ && !impl_->live.empty()) {
    LF_LOG(WARNING) << "MemAllocator destroyed with " << impl_->live.size() << " live allocations ("
                    << FormatBytes(impl_->allocated) << ")";
  }
}

StatusOr<void*> MemAllocator::Allocate(size_t bytes, StreamId stream, PoolKind kind) {
  Impl& m = *impl_;
  int64_t t0 = m.options.record_latency ? NowNs() : 0;
  size_t size = RoundUp(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.streams_seen.size() < 2) m.streams_seen.insert(stream);
    Live rec;
    rec.requested = static_cast<int64_t>(bytes);
    rec.stream = stream;
    rec.kind = kind;
    bool use_pool = true;
    if (m.step_planned && kind == PoolKind::kTransient) {
      bool pool_served = false;
      ptr = m.TryPlanned(size, stream, &rec, &pool_served);
      use_pool = (ptr == nullptr);
    }
    int placement = 0;
    if (use_pool && m.shadow_plan && m.lent && kind == PoolKind::kTransient) {
      // Note [Lifetime-guided fallback]: forecast from the diverged plan's slot at this position.
      const Plan& sp = *m.shadow_plan;
      size_t k = m.cursor++;
      bool long_lived = k < sp.lifetimes.size() && sp.lifetimes[k] > m.shadow_long_events;
      placement = long_lived ? -1 : 1;
    }
    if (use_pool) {
      StatusOr<void*> p = m.PoolAlloc(size, stream, kind, &rec, placement);
      if (!p.ok()) {
        // Note [Out of memory in a step].
        std::string what = std::to_string(bytes) + " bytes (" +
                           FormatBytes(static_cast<int64_t>(bytes)) + ") requested, " +
                           (kind == PoolKind::kPersistent ? "persistent" : "transient") +
                           ", stream " + std::to_string(stream) + ", from " + p.status().message() +
                           "; " + m.DescribeLiveLocked(5);
        if (!m.step_open) return ResourceExhaustedError("out of memory: " + what);
        std::string msg = "out of memory in step '" + m.step_signature + "' (" +
                          m.StepStateLocked() + "): " + what;
        if (!m.step_failed) {
          msg +=
              ". The step is abandoned (no longer planned or recorded); a smaller step may "
              "follow";
        }
        m.AbandonLocked();
        return ResourceExhaustedError(msg);
      }
      ptr = *p;
    }
    rec.id = m.next_id++;
    if (kind == PoolKind::kTransient && m.step_open) {
      rec.in_step = true;
      ++m.step_made_live;
      ++m.step_events;
    }
    // Only what a plan can serve is traced: transient allocations made while a step is open.
    // Those between steps (an optimizer step after EndStep, its temporaries and the state it
    // creates) always come from the pool; traced, they would be planned into the arena as well and
    // reserved twice.
    if (m.step_failed && m.step_open) rec.untraced = true;
    if (kind == PoolKind::kTransient && m.step_open && !m.step_failed &&
        (m.recording || m.probing)) {
      int64_t now = NowNs();
      if (m.recording) m.trace.AddAlloc(rec.id, static_cast<int64_t>(bytes), stream, now);
      if (m.probing) m.probe.AddAlloc(rec.id, static_cast<int64_t>(bytes), stream, now);
    }
    m.AddAllocated(static_cast<int64_t>(rec.size));
    if (kind == PoolKind::kPersistent) m.persistent_allocated += static_cast<int64_t>(rec.size);
    ++m.num_allocs;
    m.live.emplace(reinterpret_cast<uintptr_t>(ptr), rec);
  }
  if (m.options.record_latency) m.latency_ns.Record(static_cast<double>(NowNs() - t0));
  return ptr;
}

Status MemAllocator::Free(void* ptr, StreamId stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.live.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.live.end()) {
    return InvalidArgumentError("free of pointer " +
                                std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                                " that is not live in this allocator (foreign or double free)");
  }
  Live rec = it->second;
  m.live.erase(it);
  if (rec.in_step) --m.step_made_live;
  if (rec.kind == PoolKind::kTransient && m.step_open) ++m.step_events;
  // Frees of what steps made, traced or not (an earlier step's carry freed in this one is a
  // foreign free the carry zones depend on); not those of allocations made between steps.
  if (rec.in_step && !rec.untraced && (m.recording || m.probing)) {
    int64_t now = NowNs();
    if (m.recording) m.trace.AddFree(rec.id, stream, now);
    if (m.probing) m.probe.AddFree(rec.id, stream, now);
  }
  m.allocated -= static_cast<int64_t>(rec.size);
  if (rec.kind == PoolKind::kPersistent) m.persistent_allocated -= static_cast<int64_t>(rec.size);
  ++m.num_frees;
  if (rec.plan_index >= 0) {
    m.planned_live[rec.plan_index] = 0;
    --m.planned_live_count;
  } else if (rec.occupant) {
    m.RemoveOccupant(reinterpret_cast<uintptr_t>(ptr));
  } else {
    m.PoolFree(rec.block, rec.kind);
  }
  return Status::Ok();
}

Status MemAllocator::BeginStep(const std::string& signature) {
  Impl& m = *impl_;
  PlanFirstSight();  // the previous step's, when EndStep was not called
  std::shared_ptr<const Plan> plan = plans_.Get(signature);
  // The arena serves every cached plan (one step runs at a time): size it to the largest one.
  const int64_t max_peak = plans_.MaxPeakBytes();
  int64_t largest = plan ? std::max(plan->peak_bytes, max_peak) : 0;
  std::lock_guard<std::mutex> lock(m.mu);
  // Note [Carry zones]: the last step's carries are in carry_zone_now; this step puts its own in
  // the other zone.
  if (plan && plan->mirror && m.carry_zone_now == plan->carry_zone) plan = plan->mirror;
  m.carry_zone_now = -1;
  m.step_events = 0;
  m.step_failed = false;
  m.step_first_id = m.next_id;
  m.step_trace_start = m.trace.size();
  m.step_unplanned_why = "no plan for this signature";
  m.step_planned = false;
  m.step_open = true;
  m.step_signature = signature;
  m.cursor = 0;
  m.shadow_plan.reset();
  m.ReclaimArena();
  // One stream: what the last step left live in the arena just occupies its bytes (Note [Arena
  // occupants]); this step's plan is served around it.
  if (m.streams_seen.size() <= 1) m.PlannedToOccupants();
  if (m.recording) m.trace.MarkStep(signature, NowNs());
  if (!plan) {
    if (m.options.plan_unseen_signatures && !m.recording) {  // Note [First sight]
      m.probing = true;
      m.probe_signature = signature;
      m.probe.Clear();
      m.probe.MarkStep(signature, NowNs());
    }
    // Note [Arena for a new signature].
    if (m.arena == nullptr && max_peak > 0 && m.occupants.empty() && m.planned_live_count == 0 &&
        m.streams_seen.size() <= 1 && m.step_made_live == 0) {
      size_t want = RoundUpTo2M(max_peak);
      StatusOr<void*> a = m.backend->Reserve(want);
      if (a.ok()) {
        m.arena = *a;
        m.arena_size = want;
        m.AddReserved(static_cast<int64_t>(want));
      }
    }
    m.LendArena();
    return Status::Ok();
  }
  if (m.planned_live_count > 0) {
    // Several streams: last step's planned allocations still hold arena bytes, and no event
    // orders their streams before this step's: this step cannot reuse the arena.
    ++m.planned_misses;
    m.last_miss = "step '" + signature + "' not planned: " + std::to_string(m.planned_live_count) +
                  " planned allocations of the previous step still live";
    m.step_unplanned_why = "the previous step's planned allocations were still live";
    return Status::Ok();
  }
  auto round = [](int64_t n) {
    return (static_cast<size_t>(n) + kLargeSegmentRoundBytes - 1) / kLargeSegmentRoundBytes *
           kLargeSegmentRoundBytes;
  };
  // The step may move to any member of the plan's group (Note [Sibling plans]): all must fit.
  int64_t group_peak = plan->peak_bytes;
  for (const auto& sib : plan->siblings) group_peak = std::max(group_peak, sib->peak_bytes);
  size_t need = static_cast<size_t>(group_peak);
  size_t want = round(std::max(largest, group_peak));
  // Grow when this plan does not fit; shrink when the largest plan was evicted.
  if (!m.occupants.empty() && need > m.arena_size) {
    // The arena is too small for this plan but cannot move while occupied: run from the pool,
    // which starts in the arena's free bytes.
    ++m.planned_misses;
    m.last_miss = "step '" + signature + "' not planned: its plan needs " + std::to_string(need) +
                  " bytes, the occupied arena has " + std::to_string(m.arena_size);
    m.step_unplanned_why = "its plan did not fit the occupied arena";
    m.LendArena();
    return Status::Ok();
  }
  if (m.occupants.empty() && (need > m.arena_size || m.arena_size > want)) {
    m.ReleaseArena();
    StatusOr<void*> a = m.backend->Reserve(want);
    if (!a.ok()) {
      m.ReleaseCachedLocked();
      want = round(group_peak);  // at least this step's plans
      a = m.backend->Reserve(want);
    }
    if (!a.ok()) {
      // Note [Out of memory in a step]: the step never starts; a smaller one may follow.
      ++m.planned_misses;
      std::string msg =
          "out of memory in step '" + signature + "' (planned): its arena of " +
          std::to_string(want) + " bytes (" + FormatBytes(static_cast<int64_t>(want)) +
          ") could not be reserved from " + m.backend->Name() + ": " + a.status().message() + "; " +
          m.DescribeLiveLocked(5) + ". The step is abandoned; a smaller step may follow";
      m.AbandonLocked();
      return ResourceExhaustedError(msg);
    }
    m.arena = *a;
    m.arena_size = want;
    m.AddReserved(static_cast<int64_t>(want));
  }
  m.arena_plan = plan;
  m.group_root = plan;
  m.group_index = 0;
  m.planned_live.assign(plan->sizes.size(), 0);
  m.step_planned = true;
  ++m.planned_steps;
  return Status::Ok();
}

bool MemAllocator::EndStep() {
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    failed = impl_->step_failed;
    impl_->step_failed = false;
    impl_->EndStepLocked();
  }
  PlanFirstSight();  // a no-op after a failure: AbandonLocked stopped the probe
  return !failed;
}

void MemAllocator::AbandonStep() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->AbandonLocked();
  impl_->step_failed = false;
  impl_->EndStepLocked();
}

Status MemAllocator::Close() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  // Note [Shutdown]. An open step (a trailing one begun by an optimizer hook) is ended unplanned:
  // planning it would be wasted work, and counting it abandoned would be misleading.
  m.probing = false;
  m.probe.Clear();
  m.step_failed = false;
  m.EndStepLocked();
  m.recording = false;
  m.trace.Clear();
  m.ReleaseCachedLocked();
  if (m.live.empty()) return Status::Ok();
  return FailedPreconditionError("closed with " + std::to_string(m.live.size()) +
                                 " live allocations (" + FormatBytes(m.allocated) +
                                 ") still held by the caller: " + m.DescribeLiveLocked(5));
}

void MemAllocator::PlanFirstSight() {
  Impl& m = *impl_;
  Trace probe;
  std::string signature;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.probing) return;
    m.probing = false;
    probe = std::move(m.probe);
    m.probe = Trace();
    signature = m.probe_signature;
  }
  StatusOr<std::vector<LifetimeTable>> tables = probe.Lifetimes();
  if (!tables.ok()) {
    LF_LOG(WARNING) << "MemSculptor: step '" << signature
                    << "' not planned on first sight: " << tables.status();
    return;
  }
  if (tables->empty()) return;  // no allocations: nothing to plan
  // One step cannot tell carries (freed in the next step) from persistent tensors made during it
  // (a training loop's first step: gradients, optimizer state). Two zones double whatever they
  // hold, so when what outlives the step exceeds a quarter of its own live peak, none of it is a
  // carry: the pool keeps it (real eager trainer, n16 b16: 20 GiB outlive step 1, zones would
  // have reserved 40 GiB more).
  {
    LifetimeTable& t = tables->front();
    if (4 * CarryZoneBytes(*tables) > LowerBoundBytes(t, /*with_carries=*/false)) {
      for (Lifetime& lt : t.allocs) lt.persistent = !lt.freed_in_step;
    }
  }
  // Note [Carry zones] (planner.cc): zones as large as the largest carries seen on first sight
  // (plans made earlier with smaller zones cost skips, never safety).
  int64_t zone = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.first_sight_zone = std::max(m.first_sight_zone, CarryZoneBytes(*tables));
    zone = m.first_sight_zone;
  }
  Plan plan = PlanStepWithCarries(tables->front(), zone, 0, signature);
  if (plan.carry_zone >= 0) {
    plan.mirror =
        std::make_shared<const Plan>(PlanStepWithCarries(tables->front(), zone, 1, signature));
  }
  Status checked = CheckPlan(tables->front(), plan);
  if (!checked.ok()) {  // a planner bug: keep the pool serving this signature rather than abort
    LF_LOG(ERROR) << "MemSculptor: invalid plan for step '" << signature
                  << "' not installed: " << checked;
    return;
  }
  plans_.Put(std::move(plan));
  std::lock_guard<std::mutex> lock(m.mu);
  ++m.first_sight_plans;
  m.SettlePending();
  m.ReleaseFreeSegments(m.pools[static_cast<int>(PoolKind::kTransient)]);
}

void MemAllocator::StartRecording() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->trace.Clear();
  impl_->recording = true;
}

Trace MemAllocator::StopRecording() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->recording = false;
  Trace t = std::move(impl_->trace);
  impl_->trace = Trace();
  return t;
}

bool MemAllocator::recording() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->recording;
}

StatusOr<std::vector<Plan>> MemAllocator::PlanFromTrace(const Trace& trace) {
  LF_ASSIGN_OR_RETURN(std::vector<LifetimeTable> tables, trace.Lifetimes());
  // Steps of each signature in order; each is planned as an envelope (Note [Envelope plans]).
  std::map<std::string, std::vector<const LifetimeTable*>> by_sig;
  for (const auto& t : tables) by_sig[t.signature].push_back(&t);
  std::vector<Plan> out;
  // Note [Carry zones] (planner.cc): one zone size for every signature, so whichever step comes
  // next finds the last one's carries where its plan expects them.
  const int64_t carry_zone = CarryZoneBytes(tables);
  for (const auto& [sig, steps] : by_sig) {
    SignaturePlan sp = PlanSignature(steps, carry_zone);
    LF_RETURN_IF_ERROR_CTX(CheckSignaturePlan(sp), "plan for step '" + sig + "'");
    out.push_back(sp.plan);
    plans_.Put(std::move(sp.plan));
  }
  return out;
}

namespace {

// InstallPlan's checks, for a plan and (Note [Sibling plans], Note [Carry zones]) its siblings and
// mirror: tables of one length, every placed allocation inside the arena, must_be_free entries
// earlier, carry flags where carries are placed.
Status ValidatePlan(const Plan& plan, int depth) {
  size_t n = plan.sizes.size();
  if (plan.offsets.size() != n || plan.streams.size() != n || plan.must_be_free.size() != n ||
      (!plan.carries.empty() && plan.carries.size() != n) ||
      (!plan.alloc_seqs.empty() && plan.alloc_seqs.size() != n) ||
      (!plan.siblings.empty() && plan.alloc_seqs.size() != n)) {
    return InvalidArgumentError("plan '" + plan.signature + "' has inconsistent table sizes");
  }
  for (size_t i = 0; i < n; ++i) {
    if (plan.offsets[i] != kNotPlanned &&
        (plan.offsets[i] < 0 || plan.offsets[i] + plan.sizes[i] > plan.peak_bytes)) {
      return InvalidArgumentError("plan '" + plan.signature + "': allocation " + std::to_string(i) +
                                  " lies outside the arena");
    }
    for (int32_t j : plan.must_be_free[i]) {
      if (j < 0 || static_cast<size_t>(j) >= i) {
        return InvalidArgumentError("plan '" + plan.signature + "': bad must_be_free entry");
      }
    }
  }
  if (depth > 0 && (!plan.siblings.empty() || plan.mirror)) {
    return InvalidArgumentError("plan '" + plan.signature + "': nested sibling or mirror plans");
  }
  for (const auto& sib : plan.siblings) {
    if (sib == nullptr || sib->carry_zone != plan.carry_zone) {
      return InvalidArgumentError("plan '" + plan.signature + "': bad sibling plan");
    }
    LF_RETURN_IF_ERROR(ValidatePlan(*sib, depth + 1));
  }
  if (plan.mirror) {
    // The mirror is a group's base like the plan itself: it may have siblings of its own.
    if (depth > 0) return InvalidArgumentError("plan '" + plan.signature + "': nested mirror");
    Plan m = *plan.mirror;
    m.mirror.reset();
    LF_RETURN_IF_ERROR(ValidatePlan(m, 0));
  }
  return Status::Ok();
}

}  // namespace

Status MemAllocator::InstallPlan(Plan plan) {
  LF_RETURN_IF_ERROR(ValidatePlan(plan, 0));
  plans_.Put(std::move(plan));
  return Status::Ok();
}

void MemAllocator::ReleaseCached() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->ReleaseCachedLocked();
}

AllocatorStats MemAllocator::Stats() const {
  const Impl& m = *impl_;
  AllocatorStats s;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    s.allocated_bytes = m.allocated;
    s.reserved_bytes = m.reserved;
    s.peak_allocated_bytes = m.peak_allocated;
    s.peak_reserved_bytes = m.peak_reserved;
    s.fragmentation = m.peak_reserved > 0 ? 1.0 - static_cast<double>(m.peak_allocated) /
                                                      static_cast<double>(m.peak_reserved)
                                          : 0.0;
    for (const auto& pool : m.pools) {
      if (!pool.free_blocks.empty()) {
        s.largest_free_block_bytes =
            std::max<int64_t>(s.largest_free_block_bytes, (*pool.free_blocks.rbegin())->size);
      }
      s.segments += static_cast<int64_t>(pool.segments.size());
      for (const Block* b : pool.free_blocks) s.pending_fenced_blocks += b->has_fence ? 1 : 0;
    }
    s.live_allocations = static_cast<int64_t>(m.live.size());
    s.num_allocs = m.num_allocs;
    s.num_frees = m.num_frees;
    s.planned_hits = m.planned_hits;
    s.planned_misses = m.planned_misses;
    s.last_miss = m.last_miss;
    s.planned_skips = m.planned_skips;
    s.planned_steps = m.planned_steps;
    s.first_sight_plans = m.first_sight_plans;
    s.pool_allocs = m.pool_allocs;
    s.arena_bytes = static_cast<int64_t>(m.arena_size);
    s.persistent_allocated_bytes = m.persistent_allocated;
    s.abandoned_steps = m.abandoned_steps;
  }
  s.plans_cached = static_cast<int64_t>(plans_.size());
  s.plan_evictions = plans_.evictions();
  s.alloc_latency_ns = m.latency_ns.Summary();
  return s;
}

void MemAllocator::ResetPeaks() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->peak_allocated = impl_->allocated;
  impl_->peak_reserved = impl_->reserved;
  impl_->latency_ns.Reset();
}

std::string MemAllocator::DescribeLive(size_t top_n) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->DescribeLiveLocked(top_n);
}

}  // namespace mem
}  // namespace loongforge
