// A model of torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings),
// used as the baseline in MemSculptor's benchmarks and `loongforge mem replay`. Private.
//
// What it keeps from torch (defaults: no max_split_size, no expandable segments, no GC threshold):
//   - sizes round up to 512 B (kMinBlockSize);
//   - two pools: small (<= 1 MiB) served from 2 MiB segments, large (> 1 MiB) served from 20 MiB
//     segments when the request is < 10 MiB, else from a segment of the request rounded to 2 MiB;
//   - best fit: the smallest cached block of the same stream that is large enough;
//   - splitting: a small block splits if >= 512 B remain, a large one if > 1 MiB remains;
//   - on free, a block merges with free neighbours of its own segment (never across segments or
//     pools); cached segments are returned only when a segment allocation fails (then retried).
// What it leaves out: events for cross-stream use (record_stream), graph pools, statistics per
// pool, garbage-collection thresholds. None of these act in a single-stream training loop with
// default settings.
#pragma once

#include <memory>
#include <set>
#include <unordered_map>

#include "loongforge/memory.h"

namespace loongforge {
namespace mem {
namespace internal {

class CachingAllocatorModel {
 public:
  explicit CachingAllocatorModel(std::unique_ptr<MemoryBackend> backend);
  ~CachingAllocatorModel();
  StatusOr<void*> Allocate(size_t bytes, StreamId stream);
  Status Free(void* ptr);
  void ResetPeaks();
  // allocated/reserved/peaks/fragmentation/largest free block/segments; the rest stay zero.
  AllocatorStats Stats() const;

 private:
  struct Block;
  struct Pool;
  Block* FindFree(Pool& pool, size_t size, StreamId stream);
  Status NewSegment(Pool& pool, size_t size, StreamId stream);
  void ReleaseCachedSegments();

  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<Pool> small_, large_;
  std::unordered_map<uintptr_t, Block*> live_;
  int64_t allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  int64_t segments_ = 0;
};

}  // namespace internal
}  // namespace mem
}  // namespace loongforge
