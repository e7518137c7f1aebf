// Deterministic distributed sampler. The permutation is a Fisher-Yates shuffle driven by our own
// splitmix64 stream with Lemire's bounded draw, so it is identical across platforms and standard
// libraries (std::uniform_int_distribution is not specified bit-exactly).
#include "loongforge/loader.h"

namespace loongforge {
namespace data {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias.
uint64_t Bounded(uint64_t* state, uint64_t bound) {
  uint64_t x = SplitMix64(state);
  __uint128_t m = static_cast<__uint128_t>(x) * bound;
  uint64_t l = static_cast<uint64_t>(m);
  if (l < bound) {
    uint64_t t = -bound % bound;
    while (l < t) {
      x = SplitMix64(state);
      m = static_cast<__uint128_t>(x) * bound;
      l = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace

StatusOr<Sampler> Sampler::Create(const SamplerOptions& o) {
  if (o.num_samples <= 0) return InvalidArgumentError("sampler: dataset has no samples");
  if (o.batch_size <= 0) return InvalidArgumentError("sampler: batch_size must be > 0");
  if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size)
    return InvalidArgumentError("sampler: rank " + std::to_string(o.rank) + " not in world of " +
                                std::to_string(o.world_size));
  Sampler s;
  s.opts_ = o;
  if (o.drop_last) {
    s.per_rank_ = o.num_samples / o.world_size;
    s.batches_per_epoch_ = s.per_rank_ / o.batch_size;
  } else {
    s.per_rank_ = (o.num_samples + o.world_size - 1) / o.world_size;
    s.batches_per_epoch_ = (s.per_rank_ + o.batch_size - 1) / o.batch_size;
  }
  if (s.batches_per_epoch_ == 0)
    return InvalidArgumentError("sampler: " + std::to_string(o.num_samples) +
                                " samples give no full batch of " + std::to_string(o.batch_size) +
                                " for each of " + std::to_string(o.world_size) + " ranks");
  return s;
}

std::vector<int64_t> Sampler::EpochOrder(int64_t epoch) const {
  if (epoch == cached_epoch_) return cached_order_;
  const int64_t n = opts_.num_samples;
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  if (opts_.shuffle) {
    uint64_t st = opts_.seed;
    uint64_t mix = SplitMix64(&st) ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL);
    uint64_t state = mix;
    for (int64_t i = n - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(Bounded(&state, static_cast<uint64_t>(i + 1)));
      std::swap(perm[i], perm[j]);
    }
  }
  // Rank r takes positions r, r + world, ... of the (wrapped) global order.
  std::vector<int64_t> order;
  order.reserve(per_rank_);
  for (int64_t k = 0; k < per_rank_; ++k) {
    int64_t pos = k * opts_.world_size + opts_.rank;
    order.push_back(perm[pos % n]);
  }
  int64_t keep = opts_.drop_last ? batches_per_epoch_ * opts_.batch_size : per_rank_;
  order.resize(keep);
  cached_epoch_ = epoch;
  cached_order_ = order;
  return order;
}

std::vector<int64_t> Sampler::Batch(int64_t epoch, int64_t b) const {
  if (epoch != cached_epoch_) EpochOrder(epoch);
  int64_t begin = b * opts_.batch_size;
  int64_t end = std::min<int64_t>(begin + opts_.batch_size, cached_order_.size());
  if (begin >= end) return {};
  return std::vector<int64_t>(cached_order_.begin() + begin, cached_order_.begin() + end);
}

}  // namespace data
}  // namespace loongforge
