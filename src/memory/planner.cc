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
// signature produced: steps of another structure (on real MoE traces, a workspace allocated only
// for experts above some load) diverge and run from the pool inside the arena (allocator.cc,
// Note [Lent arena]), which works only if the arena is large enough. The overhead reported for a
// signature is against the lower bound of its largest step, merged or not.
// MemAllocator serves allocation k from the plan when its size is at most the planned one (the
// slack is reserved, not allocated, so it shows up as fragmentation, honestly). Lifetimes are the
// same in every merged step, so a plan that is valid for the envelope (CheckPlan) is valid for each
// of them: every pair that is live together in one is live together in the envelope.
#include <algorithm>
#include <numeric>

#include "loongforge/logging.h"
#include "loongforge/memory.h"

namespace loongforge {
namespace mem {
namespace {

struct Item {
  int32_t index;  // in table.allocs
  int64_t size;   // rounded
  int64_t begin, end;
  StreamId stream;
};

bool Conflict(const Item& a, const Item& b) {
  return a.stream != b.stream || (a.begin < b.end && b.begin < a.end);
}

std::vector<Item> PlacedItems(const LifetimeTable& t) {
  std::vector<Item> items;
  for (size_t i = 0; i < t.allocs.size(); ++i) {
    const Lifetime& lt = t.allocs[i];
    if (!lt.freed_in_step) continue;
    items.push_back(Item{static_cast<int32_t>(i), static_cast<int64_t>(RoundUp(lt.size)),
                         lt.alloc_seq, lt.free_seq, lt.stream});
  }
  return items;
}

// Places items one by one in `order`; `placed` holds (offset, item) sorted by offset.
class Packer {
 public:
  explicit Packer(const std::vector<Item>& items) : items_(items), offsets_(items.size(), -1) {}

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

Plan MakePlan(const LifetimeTable& t, const std::vector<Item>& items, const Packer& packer,
              const char* algorithm) {
  Plan p;
  p.algorithm = algorithm;
  p.signature = t.signature;
  size_t n = t.allocs.size();
  p.sizes.resize(n);
  p.streams.resize(n);
  p.offsets.assign(n, kNotPlanned);
  p.must_be_free.resize(n);
  p.lifetimes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    p.sizes[i] = static_cast<int64_t>(RoundUp(t.allocs[i].size));
    p.streams[i] = t.allocs[i].stream;
    p.lifetimes[i] = t.allocs[i].free_seq - t.allocs[i].alloc_seq;
  }
  for (size_t i = 0; i < items.size(); ++i) p.offsets[items[i].index] = packer.offsets()[i];
  p.peak_bytes = packer.peak();
  p.lower_bound_bytes = LowerBoundBytes(t);
  // must_be_free: for each placed k, the earlier placed allocations sharing any of its bytes.
  // items are in allocation order, so a < b means a was allocated first.
  for (size_t b = 0; b < items.size(); ++b) {
    int64_t ob = packer.offsets()[b];
    for (size_t a = 0; a < b; ++a) {
      int64_t oa = packer.offsets()[a];
      if (oa < ob + items[b].size && ob < oa + items[a].size) {
        p.must_be_free[items[b].index].push_back(items[a].index);
      }
    }
  }
  return p;
}

}  // namespace

int64_t LowerBoundBytes(const LifetimeTable& t) {
  std::vector<std::pair<int64_t, int64_t>> deltas;  // (seq, +/- size)
  for (const auto& lt : t.allocs) {
    if (!lt.freed_in_step) continue;
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

Plan PlanGreedyBySize(const LifetimeTable& t) {
  std::vector<Item> items = PlacedItems(t);
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].size != items[b].size) return items[a].size > items[b].size;
    return (items[a].end - items[a].begin) > (items[b].end - items[b].begin);
  });
  Packer packer(items);
  for (size_t i : order) packer.Place(i);
  return MakePlan(t, items, packer, "greedy_by_size");
}

Plan PlanGreedyByBreadth(const LifetimeTable& t) {
  std::vector<Item> items = PlacedItems(t);
  // Time points: each allocation's start (the live set only grows there). Breadth by sweep.
  size_t n = items.size();
  std::vector<int64_t> breadth(n, 0);
  {
    std::vector<std::pair<int64_t, int64_t>> deltas;
    for (const auto& it : items) {
      deltas.push_back({it.begin, it.size});
      deltas.push_back({it.end, -it.size});
    }
    std::sort(deltas.begin(), deltas.end());
    // items are in allocation order, so their begins ascend: walk both together.
    int64_t live = 0;
    size_t d = 0;
    for (size_t i = 0; i < n; ++i) {
      while (d < deltas.size() && deltas[d].first <= items[i].begin) live += deltas[d++].second;
      breadth[i] = live;
    }
  }
  std::vector<size_t> points(n);
  std::iota(points.begin(), points.end(), 0);
  std::stable_sort(points.begin(), points.end(),
                   [&](size_t a, size_t b) { return breadth[a] > breadth[b]; });
  // Items sorted by size once; at each point we walk them and take the live, unplaced ones.
  std::vector<size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return items[a].size > items[b].size; });
  Packer packer(items);
  size_t remaining = n;
  for (size_t p : points) {
    if (remaining == 0) break;
    int64_t t_point = items[p].begin;
    for (size_t i : by_size) {
      if (packer.placed(i)) continue;
      if (items[i].begin <= t_point && t_point < items[i].end) {
        packer.Place(i);
        --remaining;
      }
    }
  }
  return MakePlan(t, items, packer, "greedy_by_breadth");
}

Plan PlanStep(const LifetimeTable& table, const std::string& signature) {
  Plan a = PlanGreedyBySize(table);
  Plan b = PlanGreedyByBreadth(table);
  Plan& best = b.peak_bytes < a.peak_bytes ? b : a;
  Plan& other = b.peak_bytes < a.peak_bytes ? a : b;
  best.other_peak_bytes = other.peak_bytes;
  if (!signature.empty()) best.signature = signature;
  return std::move(best);
}

bool SameStructure(const LifetimeTable& a, const LifetimeTable& b) {
  if (a.num_events != b.num_events || a.allocs.size() != b.allocs.size()) return false;
  for (size_t i = 0; i < a.allocs.size(); ++i) {
    const Lifetime& x = a.allocs[i];
    const Lifetime& y = b.allocs[i];
    if (x.alloc_seq != y.alloc_seq || x.free_seq != y.free_seq ||
        x.freed_in_step != y.freed_in_step || x.stream != y.stream) {
      return false;
    }
  }
  return true;
}

SignaturePlan PlanSignature(const std::vector<const LifetimeTable*>& steps) {
  LF_CHECK(!steps.empty()) << "PlanSignature needs at least one step";
  SignaturePlan sp;
  // The base is the step with the most live bytes (the last such one): the arena the plan sizes
  // must hold the signature's largest step, whatever its structure (Note [Envelope plans]).
  const LifetimeTable* base = steps.back();
  int64_t base_bound = LowerBoundBytes(*base);
  for (const LifetimeTable* t : steps) {
    int64_t b = LowerBoundBytes(*t);
    sp.max_step_lower_bound_bytes = std::max(sp.max_step_lower_bound_bytes, b);
    if (b > base_bound) {
      base = t;
      base_bound = b;
    }
  }
  sp.envelope = *base;
  sp.total_steps = static_cast<int>(steps.size());
  for (const LifetimeTable* t : steps) {
    if (t != base && !SameStructure(*t, *base)) continue;
    ++sp.merged_steps;
    for (size_t i = 0; i < t->allocs.size(); ++i) {
      sp.envelope.allocs[i].size = std::max(sp.envelope.allocs[i].size, t->allocs[i].size);
    }
  }
  sp.plan = PlanStep(sp.envelope, base->signature);
  return sp;
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
    if (!lt.freed_in_step) {
      if (p.offsets[i] != kNotPlanned) {
        return InvalidArgumentError("allocation " + std::to_string(i) +
                                    " outlives the step but was placed in the arena");
      }
      continue;
    }
    int64_t off = p.offsets[i];
    if (off < 0 || off % static_cast<int64_t>(kAlignBytes) != 0 || off + size > p.peak_bytes) {
      return InvalidArgumentError("allocation " + std::to_string(i) + " at offset " +
                                  std::to_string(off) + " size " + std::to_string(size) +
                                  " is unaligned or outside the arena of " +
                                  std::to_string(p.peak_bytes));
    }
    items.push_back(Item{static_cast<int32_t>(i), size, lt.alloc_seq, lt.free_seq, lt.stream});
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
  int64_t lb = LowerBoundBytes(t);
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
  for (const auto& [k, e] : plans_) m = std::max(m, e.plan->peak_bytes);
  return m;
}

}  // namespace mem
}  // namespace loongforge
