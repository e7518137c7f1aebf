// Offline offset assignment for one step's allocations (include/loongforge/memory.h).
//
// Note [Interval packing]
// Each allocation freed within the step is a rectangle: its lifetime [alloc_seq, free_seq) in the
// step's event order by its rounded size. We place rectangles at offsets so that two that are live
// at the same time never overlap in address (dynamic storage allocation; NP-hard, so heuristics).
// Both heuristics place one allocation at a time at the best-fitting gap among the already-placed
// allocations that conflict with it (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural
// Net Inference", 2020):
//   greedy-by-size     places the largest allocations first;
//   greedy-by-breadth  visits the time points with the most live bytes first and, at each, places
//                      its unplaced allocations largest first.
// Neither dominates, so PlanStep runs both and keeps the smaller peak. Allocations on different
// streams are made to conflict regardless of time: the arena is then reused only in stream order,
// within a step and from one step to the next, with no events needed.
//
// Note [Envelope plans]
// A signature (a padding bucket) fixes the order of a step's allocations but not always their
// sizes: an MoE layer's per-expert buffers follow the router's token counts, which change every
// step under the same total token count. A plan of one such step would diverge on the next at the
// first expert buffer that grew. So PlanSignature picks a base step, the one with the most live
// bytes (LowerBoundBytes; the last of equals), takes every recorded step of the signature that has
// the same structure as the base (SameStructure: same events, same lifetimes, same streams) and
// plans the base with each size widened to the largest seen at that position. The base is the
// largest step, not the last, because the arena every plan shares must hold the largest step the
// signature produced. Recorded steps of another structure (on real MoE traces, a workspace
// allocated only for experts above some load) get plans of their own (Note [Sibling plans]);
// steps that match no plan diverge and run from the pool inside the arena (allocator.cc, Note
// [Lent arena]), which works only if the arena is large enough. The overhead reported for a
// signature is against the lower bound of its largest step, merged or not.
// MemAllocator serves allocation k from the plan when its size is at most the planned one (the
// slack is reserved, not allocated, so it shows up as fragmentation, honestly). Lifetimes are the
// same in every merged step, so a plan that is valid for the envelope (CheckPlan) is valid for each
// of them: every pair that is live together in one is live together in the envelope.
//
// Note [Carry zones]
// Some allocations outlive their step: the layer's input and its gradient, the loss, freed only
// some way into the next step (on the real MoE trace, two fp32 [tokens x dim] tensors of 12.75 to
// 25.5 MiB, allocated third in a step and freed ~400 events into the next). Unplaced, they took
// pool segments beside the arena, and at each step boundary two generations of them are live:
// 51-89 MiB of segments over a 1366 MiB arena, 4.1% fragmentation even with every step planned.
// So plans place them too, in one of two zones of equal size Z at the arena's bottom, [0, Z) and
// [Z, 2Z), Z being the largest sum of one recorded step's carries (CarryZoneBytes, the same for
// every signature). A plan puts its carries, in allocation order, in its zone and keeps the other
// zone free until its last foreign free (an obstacle item: the previous step's carries are there
// until then; after it the zone is ordinary space, used by the backward's peak). Each signature
// has two plans, one per zone (`mirror`); BeginStep picks the one whose zone the previous step's
// carries are not in, so carries alternate between the zones and a step's never land on the
// last one's. The carries count in the lower bound (LowerBoundBytes(t, true)): they are live
// bytes of the step. Safety does not rest on the zones: the previous step's carries are arena
// occupants (allocator.cc, Note [Arena occupants]), so a slot over one still live is skipped.
// With several streams, carries are served by the pool as before (a carry live at BeginStep
// would keep the next step off its plan). Plans made on first sight (allocator.cc, Note [First
// sight]) use zones as large as the largest carries seen so far on first sight.
//
// Note [Sibling plans]
// One signature may produce steps of several structures: on the MoE trace, an expert's GEMM
// allocates a workspace only above some load, so T4352's three steps have 909, 913 and 909
// allocations. A plan for one of them lets the others diverge at the first expert buffer that is
// larger (allocation ~55) and run the rest from the lent arena, which left 36 MiB gradients
// without a hole and took segments of their own (5.02%). So PlanSignature plans every structure
// (each the envelope of its same-structure steps) and installs them as one group: the base (the
// largest step's structure) and its siblings. The group is packed together (PlanMembers): an
// allocation the structures share from the start, with the same size (CommonPrefixSlots), is
// one item with one offset, live wherever any of them has it live; the rest are each
// structure's own items, which never conflict with another structure's. So up to where two
// structures part, their plans agree slot for slot. MemAllocator starts a step on the base and,
// at each slot up to the group's longest common prefix, serves from the member whose slot fits
// the request most tightly (preferring one whose slot was recorded at the step's current event
// count: the step's structure); later it moves to another member only when the current one
// cannot serve the slot or the event counts show the step took another branch. A move is safe
// whatever the planner did: it requires every planned allocation live at that moment to have the
// same offset and no smaller size in the new member (allocator.cc, ChooseMember), so the new
// member's must_be_free lists describe the arena as it is. Nothing is widened across
// structures: a step that matches no member still diverges into the lent arena, as before. The
// arena is the largest member's peak (mirrors included); `mem plan` reports it per signature.
// On the real MoE trace every step stays planned: 1428 MiB reserved for 1396 MiB live, 2.23%.
#include <algorithm>
#include <map>
#include <numeric>

#include "loongforge/logging.h"
#include "loongforge/memory.h"
#include "memory/planner.h"

namespace loongforge {
namespace mem {
namespace {

// Where an item is live in one of the steps (structures) planned together.
struct Span {
  int32_t s;  // structure
  int64_t begin, end;
};

struct Item {
  Item(int32_t index, int64_t size, StreamId stream, int64_t fixed = -1)
      : index(index), size(size), stream(stream), fixed(fixed) {}
  int32_t index;  // allocation index in its structures' tables; -1: carry-in obstacle
  int64_t size;   // rounded
  StreamId stream;
  int64_t fixed = -1;       // pre-placed at this offset (carries, obstacles); -1: to be placed
  std::vector<Span> spans;  // one per structure that has this allocation (Note [Sibling plans])
  int64_t longest() const {
    int64_t l = 0;
    for (const Span& x : spans) l = std::max(l, x.end - x.begin);
    return l;
  }
};

// Two items conflict when one structure has both, live at the same time or on different streams
// (the obstacle stands for the previous step's carries, whatever their streams: time only).
bool Conflict(const Item& a, const Item& b) {
  for (const Span& x : a.spans) {
    for (const Span& y : b.spans) {
      if (x.s != y.s) continue;
      if (x.begin < y.end && y.begin < x.end) return true;
      if (a.index >= 0 && b.index >= 0 && a.stream != b.stream) return true;
    }
  }
  return false;
}

// The items of a group of structures (tables[0] the base). ev[s][r]: the allocations structures
// s and r have in common from the start (CommonPrefixSlots: same events, same sizes). Allocation
// i < ev[s][r] of the same kind in both (freed in the step, or a carry) is one item of both, so
// it has one offset and a step can move from one plan to the other (Note [Sibling plans]);
// everything else is each structure's own. item_of[s][i]: the item of allocation i of structure
// s, -1 when not placed (a carry beyond the zone). With zone_bytes > 0, carries are pre-placed in
// zone `zone` in allocation order and each structure's obstacle in the other zone (Note [Carry
// zones]). Shared items take the larger size (equal by construction; kept for safety).
std::vector<Item> GroupItems(const std::vector<LifetimeTable*>& tables,
                             const std::vector<std::vector<int64_t>>& ev, int64_t zone_bytes,
                             int zone, std::vector<std::vector<int32_t>>* item_of) {
  std::vector<Item> items;
  const size_t m = tables.size();
  item_of->assign(m, {});
  for (size_t s = 0; s < m; ++s) {
    const LifetimeTable& t = *tables[s];
    auto& of = (*item_of)[s];
    of.assign(t.allocs.size(), -1);
    int64_t carry_at = zone * zone_bytes;
    for (size_t i = 0; i < t.allocs.size(); ++i) {
      const Lifetime& lt = t.allocs[i];
      if (lt.persistent) continue;  // left to the pool (Lifetime::persistent)
      const bool carry = IsCarry(lt);
      const int64_t end = carry ? t.num_events : lt.free_seq;
      const int64_t size = static_cast<int64_t>(RoundUp(lt.size));
      int32_t shared = -1;
      for (size_t r = 0; r < s && shared < 0; ++r) {
        const LifetimeTable& o = *tables[r];
        if (static_cast<int64_t>(i) < ev[s][r] && o.allocs[i].freed_in_step == !carry &&
            !o.allocs[i].persistent) {
          shared = (*item_of)[r][i];
          if (shared < 0) break;  // not placed there either
        }
      }
      if (shared >= 0 && items[shared].fixed >= 0 && size > items[shared].size) shared = -1;
      if (shared >= 0) {
        Item& it = items[shared];
        it.size = std::max(it.size, size);
        it.spans.push_back(Span{static_cast<int32_t>(s), lt.alloc_seq, end});
        of[i] = shared;
        if (carry) carry_at = it.fixed + it.size;
        continue;
      }
      Item it(static_cast<int32_t>(i), size, lt.stream);
      it.spans.push_back(Span{static_cast<int32_t>(s), lt.alloc_seq, end});
      if (carry) {
        if (zone_bytes <= 0 || carry_at + it.size > (zone + 1) * zone_bytes) continue;
        it.fixed = carry_at;
        carry_at += it.size;
      }
      of[i] = static_cast<int32_t>(items.size());
      items.push_back(std::move(it));
    }
    if (zone_bytes > 0 && t.last_foreign_free_seq >= 0) {
      Item ob(-1, zone_bytes, 0, (1 - zone) * zone_bytes);
      ob.spans.push_back(Span{static_cast<int32_t>(s), 0, t.last_foreign_free_seq + 1});
      items.push_back(std::move(ob));
    }
  }
  // Shared items take the largest size: the tables' requested sizes follow (CheckPlan compares).
  for (size_t s = 0; s < m; ++s) {
    for (size_t i = 0; i < tables[s]->allocs.size(); ++i) {
      int32_t k = (*item_of)[s][i];
      if (k >= 0 && static_cast<int64_t>(RoundUp(tables[s]->allocs[i].size)) < items[k].size) {
        tables[s]->allocs[i].size = items[k].size;
      }
    }
  }
  return items;
}

// Places items one by one in `order`; `placed` holds (offset, item) sorted by offset.
class Packer {
 public:
  explicit Packer(const std::vector<Item>& items) : items_(items), offsets_(items.size(), -1) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].fixed < 0) continue;
      offsets_[i] = items[i].fixed;
      placed_.push_back({items[i].fixed, i});
      peak_ = std::max(peak_, items[i].fixed + items[i].size);
    }
    std::sort(placed_.begin(), placed_.end());
  }

  void Place(size_t i) {
    const Item& it = items_[i];
    int64_t prev_end = 0;
    int64_t best_offset = -1;
    int64_t best_gap = INT64_MAX;
    for (const auto& [off, j] : placed_) {
      const Item& other = items_[j];
      if (!Conflict(it, other)) continue;
      int64_t gap = off - prev_end;
      if (gap >= it.size && gap < best_gap) {
        best_gap = gap;
        best_offset = prev_end;
      }
      prev_end = std::max(prev_end, off + other.size);
    }
    if (best_offset < 0) best_offset = prev_end;
    offsets_[i] = best_offset;
    auto pos = std::upper_bound(placed_.begin(), placed_.end(), std::make_pair(best_offset, i));
    placed_.insert(pos, {best_offset, i});
    peak_ = std::max(peak_, best_offset + it.size);
  }
  bool placed(size_t i) const { return offsets_[i] >= 0; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t peak() const { return peak_; }

 private:
  const std::vector<Item>& items_;
  std::vector<int64_t> offsets_;
  std::vector<std::pair<int64_t, size_t>> placed_;
  int64_t peak_ = 0;
};

void PackBySize(const std::vector<Item>& items, Packer* packer) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].size != items[b].size) return items[a].size > items[b].size;
    return items[a].longest() > items[b].longest();
  });
  for (size_t i : order) {
    if (!packer->placed(i)) packer->Place(i);
  }
}

void PackByBreadth(const std::vector<Item>& items, size_t structures, Packer* packer) {
  // Time points: each item's start in each structure (the live set only grows there), by the
  // live bytes of that structure there.
  struct Point {
    int32_t s;
    int64_t t, breadth;
  };
  std::vector<Point> points;
  for (size_t s = 0; s < structures; ++s) {
    std::vector<std::pair<int64_t, int64_t>> deltas, begins;  // (seq, +/- size), (seq, -)
    for (const Item& it : items) {
      for (const Span& x : it.spans) {
        if (x.s != static_cast<int32_t>(s)) continue;
        deltas.push_back({x.begin, it.size});
        deltas.push_back({x.end, -it.size});
        if (it.index >= 0) begins.push_back({x.begin, 0});
      }
    }
    std::sort(deltas.begin(), deltas.end());
    std::stable_sort(begins.begin(), begins.end());
    int64_t live = 0;
    size_t d = 0;
    for (const auto& [b, unused] : begins) {
      while (d < deltas.size() && deltas[d].first <= b) live += deltas[d++].second;
      points.push_back(Point{static_cast<int32_t>(s), b, live});
    }
  }
  std::stable_sort(points.begin(), points.end(),
                   [](const Point& a, const Point& b) { return a.breadth > b.breadth; });
  // Items sorted by size once; at each point we walk them and take the live, unplaced ones.
  std::vector<size_t> by_size(items.size());
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return items[a].size > items[b].size; });
  size_t remaining = 0;
  for (size_t i = 0; i < items.size(); ++i) remaining += !packer->placed(i);
  for (const Point& p : points) {
    if (remaining == 0) break;
    for (size_t i : by_size) {
      if (packer->placed(i)) continue;
      for (const Span& x : items[i].spans) {
        if (x.s == p.s && x.begin <= p.t && p.t < x.end) {
          packer->Place(i);
          --remaining;
          break;
        }
      }
    }
  }
}

// Structure s's plan out of a packed group.
Plan MemberPlan(const LifetimeTable& t, int32_t s, const std::vector<Item>& items,
                const std::vector<int32_t>& item_of, const Packer& packer, const char* algorithm,
                int64_t zone_bytes, int zone) {
  Plan p;
  p.algorithm = algorithm;
  p.signature = t.signature;
  size_t n = t.allocs.size();
  p.sizes.resize(n);
  p.streams.resize(n);
  p.offsets.assign(n, kNotPlanned);
  p.must_be_free.resize(n);
  p.lifetimes.resize(n);
  p.alloc_seqs.resize(n);
  bool any_carry = false;
  int64_t peak = 0;
  for (size_t i = 0; i < n; ++i) {
    p.alloc_seqs[i] = t.allocs[i].alloc_seq;
    p.sizes[i] = static_cast<int64_t>(RoundUp(t.allocs[i].size));
    p.streams[i] = t.allocs[i].stream;
    p.lifetimes[i] = t.allocs[i].free_seq - t.allocs[i].alloc_seq;
    if (item_of[i] < 0) continue;
    p.offsets[i] = packer.offsets()[item_of[i]];
    peak = std::max(peak, p.offsets[i] + p.sizes[i]);
    any_carry = any_carry || IsCarry(t.allocs[i]);
  }
  for (size_t j = 0; j < items.size(); ++j) {  // this structure's obstacle
    if (items[j].index < 0 && items[j].spans[0].s == s) {
      peak = std::max(peak, packer.offsets()[j] + items[j].size);
    }
  }
  if (any_carry) {
    p.carries.assign(n, 0);
    for (size_t i = 0; i < n; ++i) p.carries[i] = IsCarry(t.allocs[i]);
    p.carry_zone = zone;
    p.carry_zone_bytes = zone_bytes;
  }
  p.peak_bytes = peak;
  p.lower_bound_bytes = LowerBoundBytes(t, any_carry);
  // must_be_free: for each placed k, the earlier placed allocations sharing any of its bytes.
  std::vector<size_t> placed;
  for (size_t i = 0; i < n; ++i) {
    if (p.offsets[i] != kNotPlanned) placed.push_back(i);
  }
  for (size_t bi = 0; bi < placed.size(); ++bi) {
    size_t b = placed[bi];
    for (size_t ai = 0; ai < bi; ++ai) {
      size_t a = placed[ai];
      if (p.offsets[a] < p.offsets[b] + p.sizes[b] && p.offsets[b] < p.offsets[a] + p.sizes[a]) {
        p.must_be_free[b].push_back(static_cast<int32_t>(a));
      }
    }
  }
  return p;
}

// Plans a group of structures of one signature together (Note [Sibling plans]), by both
// algorithms; keeps the one whose largest member peak is smaller. Returns the members' plans.
// `tables` may be widened (shared items take the largest size).
std::vector<Plan> PlanMembers(const std::vector<LifetimeTable*>& tables,
                              const std::vector<std::vector<int64_t>>& ev, int64_t zone_bytes,
                              int zone, int only_algorithm = -1) {
  std::vector<std::vector<int32_t>> item_of;
  std::vector<Item> items = GroupItems(tables, ev, zone_bytes, zone, &item_of);
  std::vector<Plan> best;
  int64_t best_peak = INT64_MAX, other_peak = 0;
  for (int algo = 0; algo < 2; ++algo) {
    if (only_algorithm >= 0 && algo != only_algorithm) continue;
    Packer packer(items);
    if (algo == 0) {
      PackBySize(items, &packer);
    } else {
      PackByBreadth(items, tables.size(), &packer);
    }
    std::vector<Plan> plans;
    int64_t peak = 0;
    for (size_t s = 0; s < tables.size(); ++s) {
      plans.push_back(MemberPlan(*tables[s], static_cast<int32_t>(s), items, item_of[s], packer,
                                 algo == 0 ? "greedy_by_size" : "greedy_by_breadth", zone_bytes,
                                 zone));
      peak = std::max(peak, plans.back().peak_bytes);
    }
    // Ties go to greedy-by-size, as before.
    if (peak < best_peak) {
      other_peak = best_peak == INT64_MAX ? peak : best_peak;
      best_peak = peak;
      best = std::move(plans);
    } else {
      other_peak = peak;
    }
  }
  for (Plan& p : best) p.other_peak_bytes = other_peak;
  return best;
}

std::vector<std::vector<int64_t>> NoPrefix(size_t m) {
  return std::vector<std::vector<int64_t>>(m, std::vector<int64_t>(m, 0));
}

}  // namespace

int64_t LowerBoundBytes(const LifetimeTable& t, bool with_carries) {
  std::vector<std::pair<int64_t, int64_t>> deltas;  // (seq, +/- size)
  for (const auto& lt : t.allocs) {
    if (lt.persistent || (!lt.freed_in_step && !with_carries)) continue;
    int64_t s = static_cast<int64_t>(RoundUp(lt.size));
    deltas.push_back({lt.alloc_seq, s});
    deltas.push_back({lt.free_seq, -s});
  }
  // At equal seq (only possible for hand-built tables) frees go first: [begin, end) is half-open.
  std::sort(deltas.begin(), deltas.end());
  int64_t live = 0, peak = 0;
  for (const auto& [seq, d] : deltas) {
    live += d;
    peak = std::max(peak, live);
  }
  return peak;
}

namespace {

// One structure: nothing shared, so the table is not widened.
Plan PlanOne(const LifetimeTable& t, int64_t zone_bytes, int zone, int only_algorithm) {
  LifetimeTable copy = t;
  return std::move(PlanMembers({&copy}, NoPrefix(1), zone_bytes, zone, only_algorithm)[0]);
}

}  // namespace

Plan PlanGreedyBySize(const LifetimeTable& t) { return PlanOne(t, 0, 0, 0); }
Plan PlanGreedyByBreadth(const LifetimeTable& t) { return PlanOne(t, 0, 0, 1); }

Plan PlanStepWithCarries(const LifetimeTable& table, int64_t zone_bytes, int out_zone,
                         const std::string& signature) {
  Plan p = PlanOne(table, zone_bytes, out_zone, -1);
  if (!signature.empty()) p.signature = signature;
  return p;
}

Plan PlanStep(const LifetimeTable& table, const std::string& signature) {
  return PlanStepWithCarries(table, 0, 0, signature);
}

int64_t CarryZoneBytes(const std::vector<LifetimeTable>& tables) {
  int64_t zone = 0;
  for (const auto& t : tables) {
    int64_t sum = 0;
    for (const auto& lt : t.allocs) {
      if (IsCarry(lt)) sum += static_cast<int64_t>(RoundUp(lt.size));
    }
    zone = std::max(zone, sum);
  }
  return zone;
}

bool SameStructure(const LifetimeTable& a, const LifetimeTable& b) {
  if (a.num_events != b.num_events || a.allocs.size() != b.allocs.size()) return false;
  for (size_t i = 0; i < a.allocs.size(); ++i) {
    const Lifetime& x = a.allocs[i];
    const Lifetime& y = b.allocs[i];
    if (x.alloc_seq != y.alloc_seq || x.free_seq != y.free_seq ||
        x.freed_in_step != y.freed_in_step || x.persistent != y.persistent ||
        x.stream != y.stream) {
      return false;
    }
  }
  return true;
}

namespace {

// Allocations two steps have in common from the start: the events agree until then (which
// allocation is made or freed, on which stream) and so do the allocations' rounded sizes.
int64_t CommonPrefixSlots(const LifetimeTable& a, const LifetimeTable& b) {
  auto events = [](const LifetimeTable& t) {
    std::vector<int64_t> ev(static_cast<size_t>(t.num_events), -1);  // -1: a foreign free
    for (size_t i = 0; i < t.allocs.size(); ++i) {
      ev[t.allocs[i].alloc_seq] = 2 * static_cast<int64_t>(i);
      if (t.allocs[i].freed_in_step) ev[t.allocs[i].free_seq] = 2 * static_cast<int64_t>(i) + 1;
    }
    return ev;
  };
  std::vector<int64_t> ea = events(a), eb = events(b);
  int64_t slots = 0;
  for (size_t e = 0; e < std::min(ea.size(), eb.size()) && ea[e] == eb[e]; ++e) {
    if (ea[e] >= 0 && ea[e] % 2 == 0) {
      const Lifetime& x = a.allocs[static_cast<size_t>(ea[e] / 2)];
      const Lifetime& y = b.allocs[static_cast<size_t>(ea[e] / 2)];
      if (x.stream != y.stream || RoundUp(x.size) != RoundUp(y.size)) break;
      ++slots;
    }
  }
  return slots;
}

// Leading slots two plans have in common: same offset, size, stream and carry flag.
int64_t SharedSlots(const Plan& a, const Plan& b) {
  size_t n = std::min(a.sizes.size(), b.sizes.size());
  size_t k = 0;
  auto carry = [](const Plan& p, size_t i) { return !p.carries.empty() && p.carries[i]; };
  while (k < n && a.offsets[k] == b.offsets[k] && a.sizes[k] == b.sizes[k] &&
         a.streams[k] == b.streams[k] && carry(a, k) == carry(b, k)) {
    ++k;
  }
  return static_cast<int64_t>(k);
}

// Plans the structures (envelopes) of one signature in one zone, together: the base plan with
// the others as its siblings. Widens `envs` where they share slots.
Plan PlanGroup(std::vector<LifetimeTable>* envs, const std::vector<std::vector<int64_t>>& ev,
               int64_t zone_bytes, int zone, const std::string& signature) {
  const size_t m = envs->size();
  std::vector<LifetimeTable*> tables;
  for (auto& e : *envs) tables.push_back(&e);
  std::vector<Plan> plans = PlanMembers(tables, ev, zone_bytes, zone);
  for (Plan& p : plans) p.signature = signature;
  Plan root = std::move(plans[0]);
  for (size_t a = 0; a < m; ++a) {
    for (size_t b = a + 1; b < m; ++b) {
      root.sibling_prefix =
          std::max(root.sibling_prefix, SharedSlots(a == 0 ? root : plans[a], plans[b]));
    }
  }
  for (size_t s = 1; s < m; ++s) {
    root.siblings.push_back(std::make_shared<const Plan>(std::move(plans[s])));
  }
  return root;
}

}  // namespace

SignaturePlan PlanSignature(const std::vector<const LifetimeTable*>& steps,
                            int64_t carry_zone_bytes) {
  LF_CHECK(!steps.empty()) << "PlanSignature needs at least one step";
  const bool carries = carry_zone_bytes > 0;
  SignaturePlan sp;
  // The base is the step with the most live bytes (the last such one): the arena the plan sizes
  // must hold the signature's largest step, whatever its structure (Note [Envelope plans]).
  const LifetimeTable* base = steps.back();
  int64_t base_bound = LowerBoundBytes(*base, carries);
  for (const LifetimeTable* t : steps) {
    int64_t b = LowerBoundBytes(*t, carries);
    sp.max_step_lower_bound_bytes = std::max(sp.max_step_lower_bound_bytes, b);
    if (b > base_bound) {
      base = t;
      base_bound = b;
    }
  }
  sp.total_steps = static_cast<int>(steps.size());
  // Structures: the base's first, then the others in step order, each the envelope of its
  // same-structure steps.
  std::vector<const LifetimeTable*> reps = {base};
  std::vector<LifetimeTable> envs = {*base};
  std::vector<int> merged = {0};
  for (const LifetimeTable* t : steps) {
    size_t r = 0;
    while (r < reps.size() && reps[r] != t && !SameStructure(*t, *reps[r])) ++r;
    if (r == reps.size()) {
      reps.push_back(t);
      envs.push_back(*t);
      merged.push_back(0);
    }
    ++merged[r];
    for (size_t i = 0; i < t->allocs.size(); ++i) {
      envs[r].allocs[i].size = std::max(envs[r].allocs[i].size, t->allocs[i].size);
    }
  }
  const size_t m = envs.size();
  std::vector<std::vector<int64_t>> ev(m, std::vector<int64_t>(m, 0));
  for (size_t a = 0; a < m; ++a) {
    for (size_t b = a + 1; b < m; ++b) ev[a][b] = ev[b][a] = CommonPrefixSlots(envs[a], envs[b]);
  }
  sp.merged_steps = merged[0];
  sp.structures = static_cast<int>(m);
  sp.plan = PlanGroup(&envs, ev, carry_zone_bytes, 0, base->signature);
  if (sp.plan.carry_zone >= 0) {
    sp.plan.mirror =
        std::make_shared<const Plan>(PlanGroup(&envs, ev, carry_zone_bytes, 1, base->signature));
  }
  sp.envelope = envs[0];
  sp.sibling_envelopes.assign(envs.begin() + 1, envs.end());
  for (const Plan* root : {static_cast<const Plan*>(&sp.plan), sp.plan.mirror.get()}) {
    if (root == nullptr) continue;
    sp.group_peak_bytes = std::max(sp.group_peak_bytes, root->peak_bytes);
    for (const auto& sib : root->siblings) {
      sp.group_peak_bytes = std::max(sp.group_peak_bytes, sib->peak_bytes);
    }
  }
  return sp;
}

Status CheckSignaturePlan(const SignaturePlan& sp) {
  for (const Plan* root : {&sp.plan, sp.plan.mirror.get()}) {
    if (root == nullptr) continue;
    const char* which = root == &sp.plan ? "" : " (mirror)";
    LF_RETURN_IF_ERROR_CTX(CheckPlan(sp.envelope, *root), std::string("base plan") + which);
    if (root->siblings.size() != sp.sibling_envelopes.size()) {
      return InvalidArgumentError("plan has " + std::to_string(root->siblings.size()) +
                                  " siblings for " + std::to_string(sp.sibling_envelopes.size()) +
                                  " structures");
    }
    for (size_t j = 0; j < root->siblings.size(); ++j) {
      LF_RETURN_IF_ERROR_CTX(CheckPlan(sp.sibling_envelopes[j], *root->siblings[j]),
                             "sibling plan " + std::to_string(j + 1) + which);
    }
  }
  return Status::Ok();
}

Status CheckPlan(const LifetimeTable& t, const Plan& p) {
  size_t n = t.allocs.size();
  if (p.offsets.size() != n || p.sizes.size() != n) {
    return InvalidArgumentError("plan has " + std::to_string(p.offsets.size()) +
                                " offsets for a step of " + std::to_string(n) + " allocations");
  }
  std::vector<Item> items;
  std::vector<int64_t> offs;
  for (size_t i = 0; i < n; ++i) {
    const Lifetime& lt = t.allocs[i];
    int64_t size = static_cast<int64_t>(RoundUp(lt.size));
    if (p.sizes[i] != size) {
      return InvalidArgumentError("plan size of allocation " + std::to_string(i) + " is " +
                                  std::to_string(p.sizes[i]) + ", expected " +
                                  std::to_string(size));
    }
    if (!lt.freed_in_step && p.offsets[i] == kNotPlanned) continue;
    if (!lt.freed_in_step && (p.carry_zone < 0 || p.carries.size() != n || !p.carries[i])) {
      return InvalidArgumentError("allocation " + std::to_string(i) +
                                  " outlives the step but was placed outside a carry zone");
    }
    int64_t off = p.offsets[i];
    if (off < 0 || off % static_cast<int64_t>(kAlignBytes) != 0 || off + size > p.peak_bytes) {
      return InvalidArgumentError("allocation " + std::to_string(i) + " at offset " +
                                  std::to_string(off) + " size " + std::to_string(size) +
                                  " is unaligned or outside the arena of " +
                                  std::to_string(p.peak_bytes));
    }
    Item it(static_cast<int32_t>(i), size, lt.stream);
    it.spans.push_back(Span{0, lt.alloc_seq, lt.free_seq});
    items.push_back(std::move(it));
    offs.push_back(off);
  }
  for (size_t a = 0; a < items.size(); ++a) {
    for (size_t b = a + 1; b < items.size(); ++b) {
      if (!Conflict(items[a], items[b])) continue;
      if (offs[a] < offs[b] + items[b].size && offs[b] < offs[a] + items[a].size) {
        return InvalidArgumentError(
            "allocations " + std::to_string(items[a].index) + " and " +
            std::to_string(items[b].index) + " are live together (or on different streams) and " +
            "overlap at offsets " + std::to_string(offs[a]) + " and " + std::to_string(offs[b]));
      }
    }
  }
  int64_t lb = LowerBoundBytes(t, p.carry_zone >= 0);
  if (p.peak_bytes < lb) {
    return InvalidArgumentError("plan peak " + std::to_string(p.peak_bytes) +
                                " is below the lower bound " + std::to_string(lb));
  }
  return Status::Ok();
}

void PlanCache::Put(Plan plan) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string sig = plan.signature;
  Entry& e = plans_[sig];
  e.plan = std::make_shared<const Plan>(std::move(plan));
  e.last_use = ++clock_;
  EvictLocked();
}

void PlanCache::EvictLocked() {
  // O(size) per eviction; caches hold tens of plans and evict at most once per new signature.
  while (max_plans_ > 0 && plans_.size() > max_plans_) {
    auto oldest = plans_.begin();
    for (auto it = plans_.begin(); it != plans_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    plans_.erase(oldest);
    ++evictions_;
  }
}

std::shared_ptr<const Plan> PlanCache::Get(const std::string& signature) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(signature);
  if (it == plans_.end()) return nullptr;
  it->second.last_use = ++clock_;
  return it->second.plan;
}

bool PlanCache::Contains(const std::string& signature) const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count(signature) > 0;
}

std::vector<std::string> PlanCache::Signatures() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [k, v] : plans_) out.push_back(k);
  return out;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

size_t PlanCache::max_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_plans_;
}

void PlanCache::set_max_plans(size_t max_plans) {
  std::lock_guard<std::mutex> lock(mu_);
  max_plans_ = max_plans;
  EvictLocked();
}

int64_t PlanCache::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}

int64_t PlanCache::MaxPeakBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t m = 0;
  for (const auto& [k, e] : plans_) {
    for (const Plan* p : {e.plan.get(), e.plan->mirror.get()}) {
      if (p == nullptr) continue;
      m = std::max(m, p->peak_bytes);
      for (const auto& s : p->siblings) m = std::max(m, s->peak_bytes);
    }
  }
  return m;
}

StatusOr<TracePlans> PlanTrace(const Trace& trace) {
  TracePlans out;
  LF_ASSIGN_OR_RETURN(out.tables, trace.Lifetimes());
  for (const LifetimeTable& t : out.tables) {
    Plan p = PlanStep(t, t.signature);
    LF_RETURN_IF_ERROR_CTX(CheckPlan(t, p), "step " + std::to_string(t.step));
    out.steps.push_back(std::move(p));
  }
  std::map<std::string, std::vector<const LifetimeTable*>> by_sig;
  for (const LifetimeTable& t : out.tables) by_sig[t.signature].push_back(&t);
  const int64_t carry_zone = CarryZoneBytes(out.tables);  // as MemAllocator::PlanFromTrace
  for (const auto& [sig, steps] : by_sig) {
    SignaturePlan sp = PlanSignature(steps, carry_zone);
    LF_RETURN_IF_ERROR_CTX(CheckSignaturePlan(sp), "signature '" + sig + "'");
    out.signatures.push_back(sig);
    out.signature_plans.push_back(std::move(sp));
  }
  return out;
}

}  // namespace mem
}  // namespace loongforge
