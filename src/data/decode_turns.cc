// Note [Decode turns] (nvjpeg_decoder.h): the lanes' turns for their nvJPEG calls.
#include "decode_turns.h"

#include <algorithm>
#include <string>

namespace loongforge {
namespace data {
namespace internal {

Status CheckLanesAndStagger(int lanes, float stagger, const std::string& prefix) {
  if (lanes < 2 || lanes > 16)
    return InvalidArgumentError(prefix + "lanes must be in [2, 16], got " + std::to_string(lanes));
  if (!(stagger >= 0.f && stagger <= 1.f))
    return InvalidArgumentError(prefix + "stagger must be in [0, 1], got " +
                                std::to_string(stagger));
  return Status::Ok();
}

void DecodeTurns::Advance(uint64_t past) {
  next_ = past + 1;
  while (!passed_.empty() && *passed_.begin() == next_) {
    passed_.erase(passed_.begin());
    ++next_;
  }
  cv_.notify_all();
}

Status DecodeTurns::Take(uint64_t seq, bool whole) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const Clock::time_point now = Clock::now();
    Clock::time_point until = deadline;
    if (next_ == seq) {
      if (prev_done_ || (!whole && stagger_ <= 0.f)) break;
      if (!whole && stagger_ < 1.f) {
        const auto after =
            prev_start_ +
            std::chrono::microseconds(static_cast<int64_t>(1000.0 * stagger_ * call_ms_ewma_));
        if (now >= after) break;
        until = std::min(until, after);
      }
    }
    if (now >= deadline)
      return DeadlineExceededError("nvJPEG decoder: batch " + std::to_string(seq) +
                                   " waited more than " + std::to_string(timeout_ms_) +
                                   " ms for the previous batch's decode");
    cv_.wait_until(lock, until);
  }
  prev_seq_ = seq;
  prev_start_ = Clock::now();
  prev_done_ = false;
  Advance(seq);
  return Status::Ok();
}

void DecodeTurns::End(uint64_t seq, double call_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (prev_seq_ == seq) prev_done_ = true;  // else a later batch already started
  if (call_ms >= 0)
    call_ms_ewma_ = call_ms_ewma_ == 0 ? call_ms : 0.8 * call_ms_ewma_ + 0.2 * call_ms;
  cv_.notify_all();
}

void DecodeTurns::Pass(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq < next_) return;
  if (seq == next_)
    Advance(seq);  // prev_done_ stays with the batch that took a turn last
  else
    passed_.insert(seq);
}

double DecodeTurns::call_ms_ewma() const {
  std::lock_guard<std::mutex> lock(mu_);
  return call_ms_ewma_;
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
