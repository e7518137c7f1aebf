// Tests of the foundation: Status, metrics, bounded queue, thread pool.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/file_util.h"
#include "loongforge/metrics.h"
#include "loongforge/queue.h"
#include "loongforge/status.h"
#include "loongforge/thread_pool.h"

namespace loongforge {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  LF_ASSIGN_OR_RETURN(int h, Half(x));
  LF_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

// Guards the macros: an error deep in a chain arrives unchanged at the top.
TEST(Status, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
  EXPECT_EQ(s.WithContext("file a.jpg").ToString(), "InvalidArgument: file a.jpg: odd: 3");
}

TEST(Status, ErrnoMapping) {
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open x").code(), StatusCode::kNotFound);
  EXPECT_NE(ErrnoToStatus(ENOENT, "open x").message().find("open x"), std::string::npos);
}

// Guards the percentile maths against off-by-one interpolation.
TEST(Histogram, PercentilesAndStd) {
  Histogram h;
  for (int i = 1; i <= 101; ++i) h.Record(i);
  auto s = h.Summary();
  EXPECT_EQ(s.count, 101);
  EXPECT_DOUBLE_EQ(s.p50, 51);
  EXPECT_DOUBLE_EQ(s.p99, 100);
  EXPECT_DOUBLE_EQ(s.mean, 51);
  EXPECT_NEAR(s.std, 29.1548, 1e-3);
}

TEST(Histogram, ReservoirKeepsBoundedMemory) {
  Histogram h(100);
  for (int i = 0; i < 100000; ++i) h.Record(i % 10);
  auto s = h.Summary();
  EXPECT_EQ(s.count, 100000);
  EXPECT_GE(s.p50, 3);
  EXPECT_LE(s.p50, 6);
  EXPECT_EQ(s.max, 9);
}

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

// Guards Note [Outputs are created, never followed]: a planted symlink at the target is
// replaced, the file it points to is untouched, and no temporary file is left behind.
TEST(FileUtil, WriteFileAtomicReplacesSymlinkWithoutFollowing) {
  std::string dir = testing::TempDir() + "/lf_file_util_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string victim = dir + "/victim";
  ASSERT_TRUE(internal::WriteFileAtomic(victim, "keep").ok());
  std::string target = dir + "/out";
  ASSERT_EQ(::symlink(victim.c_str(), target.c_str()), 0);
  ASSERT_TRUE(internal::WriteFileAtomic(target, "new").ok());
  struct stat st;
  ASSERT_EQ(::lstat(target.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  std::ifstream v(victim), t(target);
  std::string vs((std::istreambuf_iterator<char>(v)), {}),
      ts((std::istreambuf_iterator<char>(t)), {});
  EXPECT_EQ(vs, "keep");
  EXPECT_EQ(ts, "new");
  DIR* d = ::opendir(dir.c_str());
  int entries = 0;
  while (dirent* e = ::readdir(d)) entries += e->d_name[0] != '.';
  ::closedir(d);
  EXPECT_EQ(entries, 2);  // victim and out; no .out.tmp.* left
  std::filesystem::remove_all(dir);
}

// Guards OpenNewFile's contract: it never opens an existing path or writes through a symlink.
TEST(FileUtil, OpenNewFileRefusesExistingPathAndSymlink) {
  std::string dir = testing::TempDir() + "/lf_open_new_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string link = dir + "/link";
  ASSERT_EQ(::symlink((dir + "/elsewhere").c_str(), link.c_str()), 0);
  auto r = internal::OpenNewFile(link);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(r.status().message().find(link), std::string::npos);
  EXPECT_NE(::access((dir + "/elsewhere").c_str(), F_OK), 0);  // nothing created through it
  auto ok = internal::OpenNewFile(dir + "/fresh");
  ASSERT_TRUE(ok.ok());
  ::close(*ok);
  std::filesystem::remove_all(dir);
}

// Guards TempFile's clean-up: a temporary file that is not published leaves nothing behind.
TEST(FileUtil, DiscardedTempFileLeavesNothing) {
  std::string dir = testing::TempDir() + "/lf_tmp_discard_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string path;
  {
    auto t = internal::TempFile::CreateNextTo(dir + "/x.bin");
    ASSERT_TRUE(t.ok());
    path = t->path();
    ASSERT_TRUE(t->Write("partial").ok());
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loongforge
