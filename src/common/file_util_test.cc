// Tests of the output helpers of src/common/file_util.cc: atomic replace, exclusive create, temp
// files.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/file_util.h"

namespace loongforge {
namespace {

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

// Guards the owner in temp names: what a killed writer left next to the target is removed by the
// next writer of that target; a live owner's file, another host's and other names stay.
TEST(FileUtil, TempFileOfGoneOwnerIsRemovedOnNextCreate) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir() + "/lf_file_util_stale_" + std::to_string(::getpid());
  fs::remove_all(dir);
  ASSERT_TRUE(fs::create_directories(dir));
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // `child` is now a pid no process has
  const std::string host = internal::HostName();
  const std::string gone = dir + "/.out.bin.tmp." + std::to_string(child) + "@" + host + ".aB3dE9";
  const std::string live =
      dir + "/.out.bin.tmp." + std::to_string(::getpid()) + "@" + host + ".xY7zQ1";
  const std::string other_host =
      dir + "/.out.bin.tmp." + std::to_string(child) + "@not-" + host + ".kL0mN2";
  const std::string other_target =
      dir + "/.other.bin.tmp." + std::to_string(child) + "@" + host + ".pQ4rS5";
  for (const auto& p : {gone, live, other_host, other_target}) std::ofstream(p) << "partial";
  EXPECT_TRUE(internal::OwnerIsGone(std::to_string(child) + "@" + host));
  EXPECT_FALSE(internal::OwnerIsGone(std::to_string(::getpid()) + "@" + host));
  {
    auto t = internal::TempFile::CreateNextTo(dir + "/out.bin");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_NE(t->path().find(std::to_string(::getpid()) + "@" + host), std::string::npos)
        << t->path();
  }
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other_host));
  EXPECT_TRUE(fs::exists(other_target));
  fs::remove_all(dir);
}

// Guards NAME_MAX: the temp name of a target with a 255-byte name still fits.
TEST(FileUtil, TempFileOfLongestNameFits) {
  const std::string dir = testing::TempDir();
  auto t = internal::TempFile::CreateNextTo(dir + "/" + std::string(255, 'n'));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_LE(t->path().size() - t->path().find_last_of('/') - 1, 255u) << t->path();
}

// A FIFO nobody writes to must be refused at open, not block the reader forever; a directory
// must be refused naming the path, not surface later as a read error inside a parser.
TEST(FileUtil, OpenRegularFileRefusesFifoAndDirectoryWithoutBlocking) {
  std::string dir = testing::TempDir() + "/lf_file_util_reg_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  StatusOr<int> f = internal::OpenRegularFile(fifo);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find(fifo), std::string::npos);
  EXPECT_NE(f.status().message().find("FIFO"), std::string::npos);
  StatusOr<std::string> d = internal::ReadRegularFile(dir, 1 << 20);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("directory"), std::string::npos);
  StatusOr<int> missing = internal::OpenRegularFile(dir + "/none");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

// A length read from the file system decides no allocation past the caller's bound.
TEST(FileUtil, ReadRegularFileBoundsSize) {
  std::string dir = testing::TempDir() + "/lf_file_util_sz_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string p = dir + "/f";
  ASSERT_TRUE(internal::WriteFileAtomic(p, std::string(100, 'x')).ok());
  StatusOr<std::string> ok = internal::ReadRegularFile(p, 100);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 100u);
  StatusOr<std::string> big = internal::ReadRegularFile(p, 99);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find(p), std::string::npos);
  std::filesystem::remove_all(dir);
}

// An output must never be renamed over a device, FIFO or directory, and replaces an existing
// regular file only when asked.
TEST(FileUtil, CheckReplaceableOutputRefusesSpecialFiles) {
  std::string dir = testing::TempDir() + "/lf_file_util_out_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  EXPECT_TRUE(internal::CheckReplaceableOutput(dir + "/new", false).ok());
  std::string reg = dir + "/reg";
  ASSERT_TRUE(internal::WriteFileAtomic(reg, "x").ok());
  EXPECT_EQ(internal::CheckReplaceableOutput(reg, false).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(internal::CheckReplaceableOutput(reg, true).ok());
  EXPECT_EQ(internal::CheckReplaceableOutput(dir, true).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(internal::CheckReplaceableOutput("/dev/null", true).code(),
            StatusCode::kInvalidArgument);
  std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(internal::CheckReplaceableOutput(fifo, true).code(), StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loongforge
