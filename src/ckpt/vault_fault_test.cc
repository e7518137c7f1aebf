// Tests of CheckpointVault under faults on the CPU: injected write and fsync errors (ENOSPC), a
// writer held busy, a real full filesystem, and a writer killed with SIGKILL mid-save. The plain
// behaviour (round trips, incremental saves, lifecycle) is in vault_test.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>

#include "loongforge/ckpt.h"
#include "test_dataset.h"

#include "ckpt/ckpt_test_util.h"

namespace loongforge {
namespace ckpt {
namespace {
namespace fs = std::filesystem;

// The POSIX Env with hooks a test overrides to inject faults into segment files: OnAppend before
// each append, OnSync before each fsync (an error from either is returned instead of writing).
class FaultEnv : public Env {
 public:
  virtual Status OnAppend(size_t /*n*/) { return Status::Ok(); }
  virtual Status OnSync() { return Status::Ok(); }

  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p) override {
    LF_ASSIGN_OR_RETURN(auto f, Env::Posix()->NewWritableFile(p));
    return std::unique_ptr<WritableFile>(new File(std::move(f), this));
  }
  Status Rename(const std::string& a, const std::string& b) override {
    return Env::Posix()->Rename(a, b);
  }
  Status SyncDir(const std::string& d) override { return Env::Posix()->SyncDir(d); }
  Status Remove(const std::string& p) override { return Env::Posix()->Remove(p); }

 private:
  class File : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> f, FaultEnv* env) : f_(std::move(f)), env_(env) {}
    Status Append(const void* d, size_t n) override {
      LF_RETURN_IF_ERROR(env_->OnAppend(n));
      return f_->Append(d, n);
    }
    Status Sync() override {
      LF_RETURN_IF_ERROR(env_->OnSync());
      return f_->Sync();
    }
    Status Close() override { return f_->Close(); }

   private:
    std::unique_ptr<WritableFile> f_;
    FaultEnv* env_;
  };
};

// A disk that holds `budget` more bytes, then fails appends with ENOSPC.
class FullDiskEnv : public FaultEnv {
 public:
  explicit FullDiskEnv(int64_t budget) : budget_(budget) {}
  Status OnAppend(size_t n) override {
    if (budget_ < static_cast<int64_t>(n)) return ErrnoToStatus(ENOSPC, "write (injected)");
    budget_ -= static_cast<int64_t>(n);
    return Status::Ok();
  }
  std::atomic<int64_t> budget_;
};

// Guards full-disk handling: ResourceExhausted on the next call, older checkpoints intact, and
// the save after the error is complete (not referencing chunks that were never written).
TEST(CkptVault, InjectedEnospcKeepsOlderCheckpoints) {
  std::string dir = TempDir("enospc");
  auto env = std::make_shared<FullDiskEnv>(40000);
  VaultOptions o = SmallOpts();
  o.env = env;
  State s;
  s.Add("w", "f32", {8192}, 1);  // 32 KiB
  auto v = CheckpointVault::Open(dir, o);
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  State first = s;
  for (auto& b : s.ts[0].bytes) b ^= 0xff;  // all chunks change: 32 KiB more does not fit
  ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
  Status w = (*v)->Wait();
  ASSERT_EQ(w.code(), StatusCode::kResourceExhausted) << w;
  EXPECT_NE(w.message().find("older checkpoints are intact"), std::string::npos) << w;
  EXPECT_EQ((*v)->Latest(), std::optional<int64_t>(1));
  ExpectRestores(v->get(), 1, first);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir + "/segments"), fs::directory_iterator()), 1);
  env->budget_ = 1 << 30;
  ASSERT_TRUE((*v)->Save(3, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestores(v->get(), 3, s);
}

// Holds every segment fsync until Release(): a writer that cannot keep up, without timing.
class GatedSyncEnv : public FaultEnv {
 public:
  Status OnSync() override {
    gate_.wait();
    return Status::Ok();
  }
  void Release() { open_.set_value(); }

 private:
  std::promise<void> open_;
  std::shared_future<void> gate_ = open_.get_future().share();
};

// Guards --ckpt-when-busy skip: TrySave while the writer is still writing returns false at once
// (no wait, nothing queued, the committed checkpoint untouched), the skipped step can be saved
// later, and each committed save reports its bytes and durable time.
TEST(CkptVault, TrySaveSkipsWhileWriterBusyAndKeepsLastCommitted) {
  std::string dir = TempDir("trysave");
  auto env = std::make_shared<GatedSyncEnv>();
  VaultOptions o = SmallOpts();
  o.env = env;
  State s;
  s.Add("w", "f32", {8192}, 1);
  auto v = CheckpointVault::Open(dir, o);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE((*v)->Busy());
  auto first = (*v)->TrySave(1, s.Refs());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  EXPECT_TRUE((*v)->Busy());  // the writer is held in fsync: step 1 cannot commit yet
  State saved = s;
  for (auto& b : s.ts[0].bytes) b ^= 0x5a;
  auto second = (*v)->TrySave(2, s.Refs());  // would wait forever if it waited
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(*second);
  EXPECT_TRUE((*v)->TakeCommittedStats().empty());
  env->Release();
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_FALSE((*v)->Busy());
  EXPECT_EQ((*v)->Latest(), std::optional<int64_t>(1));  // step 2 was never queued
  ExpectRestores(v->get(), 1, saved);
  std::vector<SaveStats> done = (*v)->TakeCommittedStats();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].step, 1);
  EXPECT_EQ(done[0].bytes_written, 8192 * 4);
  EXPECT_GT(done[0].durable_s, 0);
  EXPECT_GE(done[0].durable_s, done[0].write_s);
  auto again = (*v)->TrySave(2, s.Refs());  // the skipped step is still free
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestores(v->get(), 2, s);
  EXPECT_EQ((*v)->TakeCommittedStats().size(), 1u);
}

// Guards the error path on a real full filesystem (a 1 MiB tmpfs; skipped if mount is denied).
TEST(CkptVault, RealFullTmpfs) {
  std::string dir = TempDir("tmpfs");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount tmpfs here: " << std::strerror(errno);
  {
    State s;
    s.Add("w", "u8", {600 * 1024}, 1);
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
    State first = s;
    for (auto& b : s.ts[0].bytes) b ^= 0xff;
    ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
    Status w = (*v)->Wait();
    EXPECT_EQ(w.code(), StatusCode::kResourceExhausted) << w;
    EXPECT_NE(w.message().find(dir + "/segments/seg-000000000002-"), std::string::npos) << w;
    ExpectRestores(v->get(), 1, first);
  }
  ::umount2(dir.c_str(), MNT_DETACH);
}

// Guards crash consistency: a writer killed with SIGKILL at a random moment leaves the latest
// committed checkpoint restorable and exact.
TEST(CkptVault, KillNineDuringWriteKeepsLastCommitted) {
  std::string dir = TempDir("kill");
  auto make_state = [](int64_t step) {
    State s;
    s.Add("w", "f32", {256 * 1024}, static_cast<uint64_t>(step));  // 1 MiB, all new each step
    return s;
  };
  int checked = 0;
  for (int round = 0; round < 3; ++round) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      VaultOptions o;
      o.chunk_bytes = 64 * 1024;
      auto v = CheckpointVault::Open(dir, o);
      if (!v.ok()) ::_exit(3);
      int64_t start = (*v)->Latest().value_or(0) + 1;
      for (int64_t step = start;; ++step) {
        State s = make_state(step);
        if (!(*v)->Save(step, s.Refs()).ok()) ::_exit(4);
        if (!(*v)->Wait().ok()) ::_exit(5);
      }
    }
    ::usleep(150000 + 70000 * round);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);
    VaultOptions o;
    o.chunk_bytes = 64 * 1024;
    auto v = CheckpointVault::Open(dir, o);  // the lock died with the child
    ASSERT_TRUE(v.ok()) << v.status();
    auto latest = (*v)->Latest();
    if (!latest) continue;  // killed before the first commit: nothing to check yet
    ExpectRestores(v->get(), *latest, make_state(*latest));
    auto gc = (*v)->Gc();  // removes the half-written segment, keeps everything referenced
    ASSERT_TRUE(gc.ok()) << gc.status();
    ASSERT_TRUE((*v)->Verify(*latest).ok());
    ++checked;
  }
  EXPECT_GT(checked, 0) << "the child never committed a checkpoint before being killed";
}

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
