// Tests of BoundedQueue (include/common/queue.h) and ThreadPool (src/common/thread_pool.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/queue.h"
#include "common/thread_pool.h"

namespace loongforge {
namespace {

TEST(BoundedQueue, TimeoutAndClose) {
  BoundedQueue<int> q(2, "t");
  EXPECT_TRUE(q.Push(1).ok());
  EXPECT_TRUE(q.Push(2).ok());
  Status s = q.Push(3, std::chrono::milliseconds(20));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("'t'"), std::string::npos);
  q.Close();
  int v = 0;
  EXPECT_TRUE(q.Pop(&v).ok());  // drains after close
  EXPECT_EQ(v, 1);
  EXPECT_TRUE(q.Pop(&v).ok());
  EXPECT_EQ(q.Pop(&v).code(), StatusCode::kCancelled);
  EXPECT_EQ(q.Push(4).code(), StatusCode::kCancelled);
}

TEST(BoundedQueue, ProducersConsumersLoseNothing) {
  BoundedQueue<int> q(4, "mpmc");
  std::atomic<long> sum{0};
  std::vector<std::thread> th;
  for (int p = 0; p < 3; ++p)
    th.emplace_back([&, p] {
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q.Push(p * 1000 + i).ok());
    });
  std::vector<std::thread> cons;
  for (int c = 0; c < 2; ++c)
    cons.emplace_back([&] {
      int v;
      while (q.Pop(&v).ok()) sum += v;
    });
  for (auto& t : th) t.join();
  q.Close();
  for (auto& t : cons) t.join();
  EXPECT_EQ(sum.load(), 3 * (999 * 1000 / 2) + 1000 * (0 + 1000 + 2000));
}

// Guards orderly shutdown: work queued before Shutdown() is never dropped.
TEST(ThreadPool, ShutdownRunsQueuedWork) {
  std::atomic<int> n{0};
  {
    ThreadPool pool(2, "tp", 64);
    for (int i = 0; i < 50; ++i)
      ASSERT_TRUE(pool.Submit([&] {
                        std::this_thread::sleep_for(std::chrono::microseconds(100));
                        ++n;
                      })
                      .ok());
    auto f = pool.Async([] { return 7; });
    EXPECT_EQ(f.get(), 7);
  }
  EXPECT_EQ(n.load(), 50);
}

TEST(ThreadPool, SubmitAfterShutdownIsCancelled) {
  ThreadPool pool(1, "tp");
  pool.Shutdown();
  EXPECT_EQ(pool.Submit([] {}).code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace loongforge
