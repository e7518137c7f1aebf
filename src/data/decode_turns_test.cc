// Tests of the decode lanes' turns (Note [Decode turns] in nvjpeg_decoder.h), on the CPU: the
// ordering the GPU decoder relies on, without nvJPEG.
#include "decode_turns.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace loongforge {
namespace data {
namespace internal {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Guards the order: threads that reach Take() in reverse order still take their turns in batch
// order, and with stagger 1 no two batches' calls overlap.
TEST(DecodeTurns, TakenInBatchOrderAndSerialWithStaggerOne) {
  DecodeTurns turns(1.f, 10000);
  constexpr int kBatches = 6;
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> in_calls{0}, max_in_calls{0};
  std::vector<std::thread> threads;
  for (int b = kBatches - 1; b >= 0; --b) {
    threads.emplace_back([&, b] {
      DecodeTurn turn(&turns, b);
      ASSERT_TRUE(turn.Take(false).ok());
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(b);
      }
      const int now = ++in_calls;
      int seen = max_in_calls.load();
      while (now > seen && !max_in_calls.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      --in_calls;
      turn.End(5.0);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // later batches arrive first
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(order.size(), static_cast<size_t>(kBatches));
  for (int b = 0; b < kBatches; ++b) EXPECT_EQ(order[b], b);
  EXPECT_EQ(max_in_calls.load(), 1);
  EXPECT_NEAR(turns.call_ms_ewma(), 5.0, 1e-9);
}

// Guards stagger 0: a batch starts as soon as it is its turn, while the previous one's calls
// still run (the order of starts is kept).
TEST(DecodeTurns, StaggerZeroOverlapsCalls) {
  DecodeTurns turns(0.f, 10000);
  ASSERT_TRUE(turns.Take(0, false).ok());
  const auto t = Clock::now();
  ASSERT_TRUE(turns.Take(1, false).ok());  // batch 0 has not ended
  EXPECT_LT(MsSince(t), 50.0);
  turns.End(0, 10.0);
  turns.End(1, 10.0);
}

// Guards a stagger between 0 and 1: the next batch starts about stagger x the usual call time
// after the previous one started, before that one ended.
TEST(DecodeTurns, StaggerHalfStartsMidway) {
  DecodeTurns turns(0.5f, 10000);
  ASSERT_TRUE(turns.Take(0, false).ok());
  turns.End(0, 200.0);  // the usual call: 200 ms
  ASSERT_TRUE(turns.Take(1, false).ok());
  const auto t = Clock::now();
  ASSERT_TRUE(turns.Take(2, false).ok());  // batch 1 still in its calls
  const double waited = MsSince(t);
  EXPECT_GE(waited, 90.0);   // ~100 ms after batch 1 started
  EXPECT_LT(waited, 190.0);  // and not until it ended
  turns.End(1, 200.0);
  turns.End(2, 200.0);
}

// Guards `whole` (the auto split's measured batches): the batch waits for the previous batch's
// calls to end even with stagger 0.
TEST(DecodeTurns, WholeWaitsForThePreviousBatchToEnd) {
  DecodeTurns turns(0.f, 10000);
  ASSERT_TRUE(turns.Take(0, false).ok());
  std::atomic<bool> ended{false};
  std::thread ender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    ended = true;
    turns.End(0, 60.0);
  });
  ASSERT_TRUE(turns.Take(1, true).ok());
  EXPECT_TRUE(ended.load());
  ender.join();
  turns.End(1, 1.0);
}

// Guards failures: a batch that fails before its turn passes it on, in or out of order, so later
// batches do not wait for it; a DecodeTurn that is dropped untaken passes its turn, and one
// dropped after Take() ends it.
TEST(DecodeTurns, FailedBatchesPassTheirTurns) {
  DecodeTurns turns(1.f, 2000);
  turns.Pass(1);  // batch 1 fails before batch 0 took its turn
  {
    DecodeTurn t0(&turns, 0);
    ASSERT_TRUE(t0.Take(false).ok());
  }  // dropped after Take: ends the turn (as a failed call)
  {
    DecodeTurn t2(&turns, 2);  // batch 1 was passed: batch 2 goes next
    const auto t = Clock::now();
    ASSERT_TRUE(t2.Take(false).ok());
    EXPECT_LT(MsSince(t), 500.0);
    t2.End(3.0);
  }
  { DecodeTurn t3(&turns, 3); }  // dropped untaken: passes its turn
  const auto t = Clock::now();
  ASSERT_TRUE(turns.Take(4, false).ok());
  EXPECT_LT(MsSince(t), 500.0);
  turns.End(4, 3.0);
  EXPECT_NEAR(turns.call_ms_ewma(), 3.0, 1e-9);  // failed calls (-1) are not averaged in
}

// Guards the timeout: a batch whose predecessor never ends gets DeadlineExceeded naming it,
// instead of waiting forever.
TEST(DecodeTurns, WaitGivesUpAfterTheTimeout) {
  DecodeTurns turns(1.f, 100);
  ASSERT_TRUE(turns.Take(0, false).ok());  // never ended
  const auto t = Clock::now();
  Status s = turns.Take(1, false);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("batch 1"), std::string::npos) << s;
  EXPECT_GE(MsSince(t), 90.0);
  // Batch 0 ends late; batch 1, which gave up, passes its turn; batch 2 proceeds.
  turns.End(0, 1.0);
  turns.Pass(1);
  EXPECT_TRUE(turns.Take(2, false).ok());
}

}  // namespace
}  // namespace internal
}  // namespace data
}  // namespace loongforge
