// Baseline model of torch's CUDA caching allocator; see caching_model.h for what it keeps.
#include "memory/caching_model.h"

#include <vector>

#include "loongforge/logging.h"

namespace loongforge {
namespace mem {
namespace internal {
namespace {
constexpr size_t kSmallSize = size_t{1} << 20;       // largest "small" allocation
constexpr size_t kSmallBuffer = size_t{2} << 20;     // small pool segment
constexpr size_t kLargeBuffer = size_t{20} << 20;    // large pool segment for < 10 MiB
constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // at or above: own segment
constexpr size_t kRoundLarge = size_t{2} << 20;
}  // namespace

struct CachingAllocatorModel::Block {
  uintptr_t addr = 0;
  size_t size = 0;
  StreamId stream = 0;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  size_t segment_size = 0;  // on the segment's first block only
  bool is_small = false;
};

namespace {
struct Less {
  template <typename B>
  bool operator()(const B* a, const B* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};
}  // namespace

struct CachingAllocatorModel::Pool {
  bool small = false;
  std::set<Block*, Less> free_blocks;
  std::vector<Block*> segment_heads;
};

CachingAllocatorModel::CachingAllocatorModel(std::unique_ptr<MemoryBackend> backend)
    : backend_(std::move(backend)), small_(new Pool), large_(new Pool) {
  small_->small = true;
}

CachingAllocatorModel::~CachingAllocatorModel() {
  for (Pool* p : {small_.get(), large_.get()}) {
    for (Block* head : p->segment_heads) {
      backend_->Release(reinterpret_cast<void*>(head->addr), head->segment_size);
      Block* b = head;
      while (b) {
        Block* n = b->next;
        delete b;
        b = n;
      }
    }
  }
}

CachingAllocatorModel::Block* CachingAllocatorModel::FindFree(Pool& pool, size_t size,
                                                              StreamId stream) {
  Block probe;
  probe.stream = stream;
  probe.size = size;
  auto it = pool.free_blocks.lower_bound(&probe);
  if (it == pool.free_blocks.end() || (*it)->stream != stream) return nullptr;
  return *it;
}

Status CachingAllocatorModel::NewSegment(Pool& pool, size_t size, StreamId stream) {
  size_t seg = pool.small
                   ? kSmallBuffer
                   : (size < kMinLargeAlloc ? kLargeBuffer
                                            : (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge);
  StatusOr<void*> mem = backend_->Reserve(seg);
  if (!mem.ok()) {
    ReleaseCachedSegments();
    mem = backend_->Reserve(seg);
  }
  if (!mem.ok()) return mem.status();
  auto* b = new Block;
  b->addr = reinterpret_cast<uintptr_t>(*mem);
  b->size = seg;
  b->segment_size = seg;
  b->stream = stream;
  b->is_small = pool.small;
  pool.segment_heads.push_back(b);
  pool.free_blocks.insert(b);
  reserved_ += static_cast<int64_t>(seg);
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++segments_;
  return Status::Ok();
}

void CachingAllocatorModel::ReleaseCachedSegments() {
  for (Pool* p : {small_.get(), large_.get()}) {
    std::vector<Block*> keep;
    for (Block* head : p->segment_heads) {
      if (!head->allocated && head->next == nullptr) {
        p->free_blocks.erase(head);
        backend_->Release(reinterpret_cast<void*>(head->addr), head->segment_size);
        reserved_ -= static_cast<int64_t>(head->segment_size);
        --segments_;
        delete head;
      } else {
        keep.push_back(head);
      }
    }
    p->segment_heads = std::move(keep);
  }
}

StatusOr<void*> CachingAllocatorModel::Allocate(size_t bytes, StreamId stream) {
  size_t size = RoundUp(bytes);
  Pool& pool = size <= kSmallSize ? *small_ : *large_;
  Block* b = FindFree(pool, size, stream);
  if (!b) {
    LF_RETURN_IF_ERROR(NewSegment(pool, size, stream));
    b = FindFree(pool, size, stream);
    LF_CHECK(b != nullptr);
  }
  pool.free_blocks.erase(b);
  size_t rest = b->size - size;
  bool split = pool.small ? rest >= kAlignBytes : rest > kSmallSize;
  if (split) {
    auto* r = new Block;
    r->addr = b->addr + size;
    r->size = rest;
    r->stream = stream;
    r->is_small = b->is_small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.free_blocks.insert(r);
  }
  b->allocated = true;
  live_[b->addr] = b;
  allocated_ += static_cast<int64_t>(b->size);
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return reinterpret_cast<void*>(b->addr);
}

Status CachingAllocatorModel::Free(void* ptr) {
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end()) return InvalidArgumentError("caching model: free of unknown pointer");
  Block* b = it->second;
  live_.erase(it);
  allocated_ -= static_cast<int64_t>(b->size);
  b->allocated = false;
  Pool& pool = b->is_small ? *small_ : *large_;
  for (Block* n : {b->prev, b->next}) {
    if (!n || n->allocated) continue;
    pool.free_blocks.erase(n);
    if (n == b->prev) {
      b->addr = n->addr;
      b->prev = n->prev;
      if (n->prev) n->prev->next = b;
      if (n->segment_size) {  // n headed the segment: b takes its place
        b->segment_size = n->segment_size;
        for (Block*& h : pool.segment_heads) {
          if (h == n) h = b;
        }
      }
    } else {
      b->next = n->next;
      if (n->next) n->next->prev = b;
    }
    b->size += n->size;
    delete n;
  }
  pool.free_blocks.insert(b);
  return Status::Ok();
}

void CachingAllocatorModel::ResetPeaks() {
  peak_allocated_ = allocated_;
  peak_reserved_ = reserved_;
}

AllocatorStats CachingAllocatorModel::Stats() const {
  AllocatorStats s;
  s.allocated_bytes = allocated_;
  s.reserved_bytes = reserved_;
  s.peak_allocated_bytes = peak_allocated_;
  s.peak_reserved_bytes = peak_reserved_;
  s.fragmentation = peak_reserved_ > 0 ? 1.0 - static_cast<double>(peak_allocated_) /
                                                   static_cast<double>(peak_reserved_)
                                       : 0.0;
  for (const Pool* p : {small_.get(), large_.get()}) {
    for (const Block* b : p->free_blocks) {
      s.largest_free_block_bytes = std::max<int64_t>(s.largest_free_block_bytes, b->size);
    }
  }
  s.segments = segments_;
  s.live_allocations = static_cast<int64_t>(live_.size());
  return s;
}

}  // namespace internal
}  // namespace mem
}  // namespace loongforge
