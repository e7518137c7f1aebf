// Tests of CheckpointVault against hostile vaults and outputs: manifests whose fields lie (sizes,
// shapes, dtypes, names, steps, non-integer numbers), manifests and segments that are not regular
// files, and export / restore outputs that must not be replaced.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/ckpt_test_util.h"

namespace loongforge {
namespace ckpt {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

const char kMan[] = "/manifests/ckpt-000000000003.manifest";

// A vault with checkpoint 3 of tensors "w" (f32 [2048], two 4 KiB chunks) and "b" (u8 [100]).
std::string MakeVault(const std::string& name, VaultOptions o = SmallOpts()) {
  std::string dir = TempDir(name);
  State s;
  s.Add("w", "f32", {2048}, 1);
  s.Add("b", "u8", {100}, 2);
  auto v = CheckpointVault::Open(dir, o);
  EXPECT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE((*v)->Save(3, s.Refs()).ok());
  EXPECT_TRUE((*v)->Wait().ok());
  return dir;
}

// Rewrites the manifest at `path` through `edit` with a valid header (length and checksum), so
// that only the field checks can catch the lie. `raw_body` replaces the JSON text when set.
void Rewrite(const std::string& path, const std::function<void(json&)>& edit,
             const std::string* raw_body = nullptr) {
  const std::string bytes = ReadFile(path);
  const size_t nl = bytes.find('\n');
  json j = json::parse(bytes.substr(nl + 1));
  edit(j);
  const std::string body = raw_body ? *raw_body : j.dump();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << "LFCKPT1 " << HashBytes(body.data(), body.size()).ToHex() << " " << body.size() << "\n"
      << body;
}

std::unique_ptr<CheckpointVault> OpenRo(const std::string& dir) {
  VaultOptions o = SmallOpts();
  o.read_only = true;
  auto v = CheckpointVault::Open(dir, o);
  EXPECT_TRUE(v.ok()) << v.status();
  return std::move(v).value();
}

// Every read path refuses the manifest with DataLoss naming the file and containing `want`.
void ExpectRefused(const std::string& dir, const std::string& want) {
  auto v = OpenRo(dir);
  const std::string man = dir + kMan;
  std::vector<std::pair<const char*, Status>> got = {
      {"describe", v->Describe(3).status()},
      {"summary", v->Summary(3).status()},
      {"verify", v->Verify(3)},
      {"restore", v->Restore(3).status()},
      {"export", v->ExportSafetensors(3, dir + "/x.safetensors")},
      {"restore-dir", v->RestoreToDirectory(3, dir + "/out")},
  };
  for (const auto& [what, s] : got) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << what << ": " << s;
    EXPECT_NE(s.message().find(man), std::string::npos) << what << ": " << s;
    EXPECT_NE(s.message().find(want), std::string::npos) << what << ": " << s;
  }
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

json& Tensor(json& j, const std::string& name) {
  for (auto& t : j["tensors"])
    if (t["name"] == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// Guards against a manifest that lies about sizes: nbytes of 1 TiB, shapes that do not match
// nbytes ([1e6, 1e6], [3], negative dims), a dtype whose size does not match, too many dims.
TEST(CkptHostile, SizeAndShapeLiesAreDataLoss) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"1 TiB nbytes", [](json& j) { Tensor(j, "w")["nbytes"] = int64_t{1} << 40; }, "nbytes"},
      {"shape [1e6,1e6]",
       [](json& j) {
         Tensor(j, "w")["shape"] = {1000000, 1000000};
       },
       "needs 4000000000000"},
      {"shape [3]", [](json& j) { Tensor(j, "w")["shape"] = {3}; }, "needs 12"},
      {"negative dims",
       [](json& j) {
         Tensor(j, "w")["shape"] = {-1, -2048};
       },
       "shape[0]"},
      {"overflowing shape",
       [](json& j) {
         Tensor(j, "w")["shape"] = {int64_t{1} << 62, 1 << 20};
       },
       "2^63-1"},
      {"dtype mismatch", [](json& j) { Tensor(j, "w")["dtype"] = "f64"; }, "needs 16384"},
      {"unknown dtype", [](json& j) { Tensor(j, "w")["dtype"] = "f128"; }, "tensor 'w'"},
      {"17 dims", [](json& j) { Tensor(j, "b")["shape"] = json(std::vector<int>(17, 1)); },
       "17 dimensions"},
      {"chunk raw above chunk_bytes",
       [](json& j) {
         auto& t = Tensor(j, "w");
         t["chunks"][0][1] = 8192;
         t["chunks"].erase(1);
       },
       "1 chunks"},
      {"chunk sizes overflow",
       [](json& j) {
         auto& t = Tensor(j, "w");
         t["chunks"][0][1] = INT64_MAX;
         t["chunks"][1][1] = INT64_MAX;
       },
       "raw size"},
      {"missing chunk", [](json& j) { Tensor(j, "w")["chunks"].erase(1); }, "1 chunks"},
      {"duplicate name", [](json& j) { Tensor(j, "b")["name"] = "w"; }, "more than once"},
      {"step differs from file name", [](json& j) { j["step"] = 4; }, "file name says 3"},
      {"negative chunk_bytes", [](json& j) { j["chunk_bytes"] = -4096; }, "chunk_bytes"},
      {"huge chunk_bytes", [](json& j) { j["chunk_bytes"] = int64_t{1} << 40; }, "chunk_bytes"},
      {"float step", [](json& j) { j["step"] = 1e300; }, "step must be an integer"},
      {"float nbytes", [](json& j) { Tensor(j, "w")["nbytes"] = 8192.5; }, "must be an integer"},
      {"unsigned huge offset", [](json& j) { Tensor(j, "w")["chunks"][0][4] = UINT64_MAX; },
       "offset"},
      {"segment index out of range", [](json& j) { Tensor(j, "w")["chunks"][0][3] = 7; },
       "segment index"},
      {"codec out of range", [](json& j) { Tensor(j, "w")["chunks"][0][2] = 9; }, "codec"},
      {"chunk past the segment end", [](json& j) { Tensor(j, "w")["chunks"][1][4] = 1 << 20; },
       "the manifest says a chunk"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string dir = MakeVault("lies");
    Rewrite(dir + kMan, c.edit);
    if (std::string(c.what) == "chunk past the segment end") {
      // Parses (the offset is a plausible number); the segment's real size refuses it.
      auto v = OpenRo(dir);
      for (Status s :
           {v->Verify(3), v->Restore(3).status(), v->ExportSafetensors(3, dir + "/x.safetensors"),
            v->RestoreToDirectory(3, dir + "/out")}) {
        EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
        EXPECT_NE(s.message().find(c.want), std::string::npos) << s;
      }
      EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
      continue;
    }
    ExpectRefused(dir, c.want);
  }
}

// Guards the export heap overflow: a chunk whose raw size exceeds chunk_bytes (with a shape
// and nbytes that agree) used to be preadv'ed into a chunk_bytes scratch buffer.
TEST(CkptHostile, ExportOfOversizedChunkIsDataLossNotOverflow) {
  const std::string dir = MakeVault("export_overflow");
  Rewrite(dir + kMan, [](json& j) {
    auto& t = Tensor(j, "w");
    t["chunks"][0][1] = 8192;
    t["chunks"][0][5] = 8192;
    t["chunks"].erase(1);
  });
  auto v = OpenRo(dir);
  Status s = v->ExportSafetensors(3, dir + "/x.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("tensor 'w'"), std::string::npos) << s;
}

// Guards chunk_bytes when a vault is created: negative or huge values are InvalidArgument.
TEST(CkptHostile, ChunkBytesOutOfRangeIsRefusedAtOpen) {
  for (int64_t cb : {int64_t{-4096}, int64_t{0}, int64_t{1} << 31}) {
    VaultOptions o = SmallOpts();
    o.chunk_bytes = cb;
    auto v = CheckpointVault::Open(TempDir("cb"), o);
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << cb << ": " << v.status();
    EXPECT_NE(v.status().message().find(std::to_string(cb)), std::string::npos) << v.status();
  }
}

// Guards the hang: a FIFO as manifest or segment is refused at once, naming it.
TEST(CkptHostile, FifoManifestAndSegmentAreRefusedNotBlockedOn) {
  std::string dir = MakeVault("fifo");
  const std::string man = dir + kMan;
  fs::remove(man);
  ASSERT_EQ(::mkfifo(man.c_str(), 0644), 0);
  {
    auto v = OpenRo(dir);
    for (Status s : {v->Describe(3).status(), v->Verify(3), v->Restore(3).status(),
                     v->ExportSafetensors(3, dir + "/x.safetensors")}) {
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.message().find(man), std::string::npos) << s;
      EXPECT_NE(s.message().find("FIFO"), std::string::npos) << s;
    }
    EXPECT_FALSE(v->Latest().has_value());
  }
  dir = MakeVault("fifo_seg");
  std::string seg;
  for (auto& e : fs::directory_iterator(dir + "/segments")) seg = e.path().string();
  fs::remove(seg);
  ASSERT_EQ(::mkfifo(seg.c_str(), 0644), 0);
  Status s = OpenRo(dir)->Verify(3);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(seg), std::string::npos) << s;
}

// Guards restore of a tensor too large for memory: ResourceExhausted naming it, not bad_alloc.
TEST(CkptHostile, HugeTensorRestoreIsResourceExhausted) {
  const std::string dir = MakeVault("huge");
  // A consistent manifest of a 2^47-byte tensor (128 TiB, more address space than a process has,
  // whatever the overcommit policy): 2^17 chunks of 1 GiB, all pointing at one stored chunk
  // (never read: the allocation fails first).
  Rewrite(dir + kMan, [](json& j) {
    j["chunk_bytes"] = int64_t{1} << 30;
    auto& t = Tensor(j, "b");
    t["shape"] = {int64_t{1} << 47};
    t["nbytes"] = int64_t{1} << 47;
    json c = t["chunks"][0];
    c[1] = int64_t{1} << 30;
    c[5] = int64_t{1} << 30;
    t["chunks"] = json::array();
    for (int i = 0; i < (1 << 17); ++i) t["chunks"].push_back(c);
    j["tensors"] = json::array({t});
  });
  auto v = OpenRo(dir);
  auto r = v->Restore(3);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("tensor 'b'"), std::string::npos) << r.status();
  Status s = v->RestoreToDirectory(3, dir + "/out");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

// Guards export's output: a FIFO or directory at --out is refused, an existing file is replaced
// only with `replace`, a symlink is refused and its target untouched.
TEST(CkptHostile, ExportReplacesOnlyARegularFileWhenAsked) {
  const std::string dir = MakeVault("export_out");
  auto v = OpenRo(dir);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  Status s = v->ExportSafetensors(3, fifo, /*replace=*/true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("FIFO"), std::string::npos) << s;
  EXPECT_EQ(v->ExportSafetensors(3, dir + "/segments", true).code(), StatusCode::kInvalidArgument);
  const std::string out = dir + "/x.safetensors";
  std::ofstream(out) << "old";
  s = v->ExportSafetensors(3, out);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(ReadFile(out), "old");
  ASSERT_TRUE(v->ExportSafetensors(3, out, true).ok());
  EXPECT_GT(fs::file_size(out), 100u);
  const std::string victim = dir + "/victim";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, dir + "/link.safetensors");
  s = v->ExportSafetensors(3, dir + "/link.safetensors", true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_TRUE(fs::is_symlink(dir + "/link.safetensors"));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// Guards restore's output: a symlink at OUT (to a directory) is refused and the directory it
// points at stays empty; a FIFO at OUT is refused naming its kind.
TEST(CkptHostile, RestoreRefusesSymlinkAndFifoOut) {
  const std::string dir = MakeVault("restore_out");
  auto v = OpenRo(dir);
  const std::string target = TempDir("restore_out_target");
  fs::create_symlink(target, dir + "/link");
  Status s = v->RestoreToDirectory(3, dir + "/link", /*replace=*/true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("symlink"), std::string::npos) << s;
  EXPECT_TRUE(fs::is_empty(target));
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
  s = v->RestoreToDirectory(3, dir + "/fifo", true);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("FIFO"), std::string::npos) << s;
}

// Guards the retry after a restore killed with SIGKILL: its private directory (owner dead on this
// host) is cleared and the retry succeeds without --force; a live owner's directory is kept.
TEST(CkptHostile, RestoreAfterKillNineClearsStaleStagingOnly) {
  const std::string dir = MakeVault("restore_kill");
  const std::string out = dir + "/out";
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipefd[0]);
    auto v = OpenRo(dir);
    // Stop inside the restore (after its private directory exists) until killed.
    v->RestoreToDirectory(3, out, false, [&](int64_t) {
       char c = 1;
       if (::write(pipefd[1], &c, 1) == 1) {
       }
       for (;;) ::pause();
     }).IgnoreError();
    ::_exit(0);
  }
  ::close(pipefd[1]);
  char c;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 1);
  ::close(pipefd[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int st;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  int stale = 0;
  for (auto& e : fs::directory_iterator(out))
    stale += e.path().filename().string().rfind(".restore.", 0) == 0;
  ASSERT_EQ(stale, 1);
  // A live owner's directory (this process) is not touched, so OUT stays non-empty.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string live =
      dir + "/out2/.restore." + std::to_string(::getpid()) + "@" + host + ".abcdef";
  fs::create_directories(live);
  auto v = OpenRo(dir);
  EXPECT_EQ(v->RestoreToDirectory(3, dir + "/out2").code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(fs::exists(live));
  ASSERT_TRUE(v->RestoreToDirectory(3, out).ok());
  for (auto& e : fs::directory_iterator(out))
    EXPECT_NE(e.path().filename().string().rfind(".restore.", 0), 0u) << e.path();
  EXPECT_TRUE(fs::exists(out + "/tensors.json"));
}

// Guards export to output names of 241-255 characters: the temporary name next to the output
// must still fit NAME_MAX.
TEST(CkptHostile, ExportToLongestLegalNames) {
  const std::string dir = MakeVault("export_long");
  auto v = OpenRo(dir);
  for (size_t n : {241u, 250u, 255u}) {
    const std::string out = dir + "/" + std::string(n - 12, 'n') + ".safetensors";
    Status s = v->ExportSafetensors(3, out);
    EXPECT_TRUE(s.ok()) << n << ": " << s;
    EXPECT_TRUE(fs::is_regular_file(out)) << n;
  }
}

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
