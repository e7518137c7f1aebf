// Turns of the nvJPEG decode lanes (Note [Decode turns] in nvjpeg_decoder.h): batches, numbered
// in submission order from 0, take turns to make their nvJPEG calls. Plain C++ (no CUDA), so the
// ordering is tested on any machine (decode_turns_test.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

// The decoder's lane count and stagger (DecodeTurns), checked once for the loader's options and
// the decoder's: InvalidArgument "<prefix>lanes must be in [2, 16], got N" unless 2 <= lanes <= 16,
// likewise "<prefix>stagger ..." unless 0 <= stagger <= 1.
Status CheckLanesAndStagger(int lanes, float stagger, const std::string& prefix);

class DecodeTurns {
 public:
  // stagger in [0, 1] (checked by the caller): 1 = a batch's calls start when the previous
  // batch's calls ended; 0 < f < 1 = once the previous batch's calls have run for f of their
  // usual duration (EWMA of End()'s call_ms); 0 = as soon as it is the batch's turn. Every wait
  // gives up after timeout_ms.
  DecodeTurns(float stagger, int64_t timeout_ms) : stagger_(stagger), timeout_ms_(timeout_ms) {}

  // Waits until batch `seq` may start its calls (whole: until the previous batch's calls ended,
  // whatever the stagger) and takes the turn. DeadlineExceeded (naming the batch) after the
  // timeout; the turn is then not taken. Every seq must be taken or passed exactly once.
  Status Take(uint64_t seq, bool whole);
  // Batch `seq`, which took its turn, ended its calls after call_ms (< 0: failed or not timed).
  void End(uint64_t seq, double call_ms);
  // Batch `seq` gives its turn up without having taken it (it failed before its calls): later
  // batches do not wait for it.
  void Pass(uint64_t seq);
  double call_ms_ewma() const;

 private:
  void Advance(uint64_t past);  // mu_ held

  const float stagger_;
  const int64_t timeout_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;                                   // the batch whose turn comes next
  std::set<uint64_t> passed_;                           // later batches that gave up their turn
  uint64_t prev_seq_ = ~uint64_t{0};                    // the batch that took a turn last,
  std::chrono::steady_clock::time_point prev_start_{};  // when it took it,
  bool prev_done_ = true;                               // and whether its calls ended
  double call_ms_ewma_ = 0;
};

// One batch's turn, passed on however the batch's job ends: Pass() if never taken, End(-1) if
// taken and not ended.
class DecodeTurn {
 public:
  DecodeTurn(DecodeTurns* turns, uint64_t seq) : turns_(turns), seq_(seq) {}
  ~DecodeTurn() {
    if (!taken_)
      turns_->Pass(seq_);
    else if (!ended_)
      turns_->End(seq_, -1);
  }
  DecodeTurn(const DecodeTurn&) = delete;
  DecodeTurn& operator=(const DecodeTurn&) = delete;

  Status Take(bool whole) {
    Status s = turns_->Take(seq_, whole);
    taken_ = s.ok();
    return s;
  }
  void End(double call_ms) {
    turns_->End(seq_, call_ms);
    ended_ = true;
  }
  bool taken() const { return taken_; }

 private:
  DecodeTurns* turns_;
  uint64_t seq_;
  bool taken_ = false, ended_ = false;
};

}  // namespace internal
}  // namespace data
}  // namespace loongforge
