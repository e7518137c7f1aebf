// Tests of `loongforge ckpt`: the subcommands, exit codes and damaged vaults.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ckpt/ckpt_test_util.h"
#include "test_cli.h"

namespace loongforge {
namespace ckpt {
namespace {
namespace fs = std::filesystem;

// `loongforge ARGS`: the exit code, and its stdout + stderr in *out when given.
int RunCli(const std::string& args, std::string* out = nullptr) {
  testing::CliResult r = testing::RunCli(args);
  if (out) *out = r.output;
  return r.exit_code;
}

// Guards the CLI: ls/show/verify/export/merge/gc/restore run, and corruption gives exit code 4.
TEST(CkptCli, SubcommandsAndDataLossExitCode) {
  std::string dir = TempDir("cli");
  State s;
  s.Add("w", "f32", {4096}, 1);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
    s.ts[0].bytes[0] ^= 1;
    ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
  }
  EXPECT_EQ(RunCli("ckpt ls " + dir), 0);
  EXPECT_EQ(RunCli("ckpt show " + dir + " --step 1"), 0);
  EXPECT_EQ(RunCli("ckpt verify " + dir + " --all"), 0);
  EXPECT_EQ(RunCli("ckpt export " + dir + " --out " + dir + "/x.safetensors"), 0);
  EXPECT_TRUE(fs::exists(dir + "/x.safetensors"));
  EXPECT_EQ(RunCli("ckpt restore " + dir + " --out " + dir + "/r"), 0);
  EXPECT_EQ(fs::file_size(dir + "/r/0.bin"), 4096u * 4);
  EXPECT_EQ(RunCli("ckpt merge " + dir + " --step 2"), 0);
  EXPECT_EQ(RunCli("ckpt gc " + dir), 0);
  EXPECT_EQ(RunCli("ckpt show " + dir + " --step 9"), 3);
  std::string seg;
  for (auto& e : fs::directory_iterator(dir + "/segments")) seg = e.path().string();
  fs::resize_file(seg, fs::file_size(seg) - 1);  // either live segment: --all must catch it
  EXPECT_EQ(RunCli("ckpt verify " + dir + " --all"), 4);
}

// Guards the CLI on damaged and odd vaults: ls lists every step and marks the damaged one, an
// unreadable path is a one-line error below 128 (was an abort, 134), restore refuses a non-empty
// --out unless --force, and gc reports what it leaves alone.
TEST(CkptCli, DamagedVaultsAndUserFiles) {
  std::string dir = TempDir("cli2");
  State s;
  s.Add("w", "f32", {4096}, 1);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    for (int64_t step : {int64_t{1}, int64_t{2}, int64_t{1000000000000}}) {
      s.ts[0].bytes[static_cast<size_t>(step % 100)] ^= 1;
      ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
    }
    ASSERT_TRUE((*v)->Wait().ok());
  }
  std::ofstream(dir + "/manifests/ckpt-000000000001.manifest", std::ios::trunc) << "garbage";
  std::string out;
  EXPECT_EQ(RunCli("ckpt ls " + dir, &out), 0) << out;
  EXPECT_NE(out.find("DAMAGED"), std::string::npos) << out;
  EXPECT_NE(out.find("ckpt-000000000001.manifest"), std::string::npos) << out;
  EXPECT_NE(out.find("1000000000000"), std::string::npos) << out;
  fs::create_symlink("loop", dir + "/loop");
  const int rc = RunCli("ckpt ls " + dir + "/loop", &out);
  EXPECT_GT(rc, 0);
  EXPECT_LT(rc, 128) << out;
  EXPECT_NE(out.find(dir + "/loop"), std::string::npos) << out;
  const std::string user = TempDir("cli2_user");
  std::ofstream(user + "/keep.txt") << "mine";
  EXPECT_NE(RunCli("ckpt restore " + dir + " --out " + user, &out), 0);
  EXPECT_NE(out.find("--force"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(user + "/0.bin"));
  EXPECT_EQ(RunCli("ckpt restore " + dir + " --out " + user + " --force", &out), 0) << out;
  EXPECT_EQ(fs::file_size(user + "/0.bin"), 4096u * 4);
  EXPECT_EQ(ReadFile(user + "/keep.txt"), "mine");
  std::ofstream(dir + "/segments/notes.txt") << "mine";
  fs::remove(dir + "/manifests/ckpt-000000000001.manifest");  // gc stops at a damaged one
  EXPECT_EQ(RunCli("ckpt gc " + dir, &out), 0) << out;
  EXPECT_NE(out.find("notes.txt"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir + "/segments/notes.txt"));
  EXPECT_EQ(RunCli("ckpt verify " + dir + " --all", &out), 0) << out;
}

// Guards --step parsing and export's output: an empty or non-integer --step is refused (it was
// read as step 0), export over an existing file needs --force, a FIFO at --out is refused.
TEST(CkptCli, StrictStepAndExportOutput) {
  std::string dir = TempDir("cli3");
  State s;
  s.Add("w", "f32", {4096}, 1);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(0, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
  }
  std::string out;
  for (const char* bad : {"''", "1.5", "-1", "0x", "' 0'"}) {
    const int rc = RunCli("ckpt show " + dir + " --step " + bad, &out);
    EXPECT_NE(rc, 0) << bad << ": " << out;
    EXPECT_LT(rc, 128) << bad << ": " << out;
    EXPECT_NE(out.find("--step"), std::string::npos) << bad << ": " << out;
  }
  EXPECT_EQ(RunCli("ckpt show " + dir + " --step 0", &out), 0) << out;
  const std::string x = dir + "/x.safetensors";
  std::ofstream(x) << "old";
  EXPECT_NE(RunCli("ckpt export " + dir + " --out " + x, &out), 0) << out;
  EXPECT_NE(out.find("--force"), std::string::npos) << out;
  EXPECT_EQ(ReadFile(x), "old");
  EXPECT_EQ(RunCli("ckpt export " + dir + " --out " + x + " --force", &out), 0) << out;
  EXPECT_NE(ReadFile(x), "old");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NE(RunCli("ckpt export " + dir + " --out " + fifo + " --force", &out), 0) << out;
  EXPECT_NE(out.find("FIFO"), std::string::npos) << out;
}

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
