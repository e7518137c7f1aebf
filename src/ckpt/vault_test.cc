// Tests of CheckpointVault on the CPU: hashing, round trips, incremental saves, corruption,
// lifecycle (faults and crashes: vault_fault_test.cc).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/device.h"
#include "ckpt/xxh3_lanes.h"
#include "loongforge/ckpt.h"
#include "test_dataset.h"

#include "ckpt/ckpt_test_util.h"

namespace loongforge {
namespace ckpt {
namespace {
namespace fs = std::filesystem;

// Guards the GPU kernel's algorithm: the lane-by-lane XXH3-128 it runs equals libxxhash's.
TEST(CkptHash, LaneDecompositionMatchesXxh3) {
  static const uint8_t kSecret[] = LF_XXH3_SECRET_BYTES;
  std::mt19937_64 rng(7);
  std::vector<size_t> lens = {241, 255, 256, 1023, 1024, 1025, 1087, 4096, 65537, 4 << 20};
  for (int i = 0; i < 30; ++i) lens.push_back(241 + rng() % 50000);
  for (size_t len : lens) {
    auto data = RandomBytes(len + 3, len);
    for (size_t misalign : {size_t{0}, size_t{3}}) {
      const uint8_t* p = data.data() + misalign;
      uint64_t acc[8];
      for (int lane = 0; lane < 8; ++lane) acc[lane] = xxh3::LongLoopLane(p, len, kSecret, lane);
      Hash128 h;
      xxh3::Finalize128(acc, len, kSecret, &h.lo, &h.hi);
      EXPECT_EQ(h, HashBytes(p, len)) << "len " << len << " misalign " << misalign;
    }
  }
}

// Guards dtype handling: every dtype (bf16 included), empty and scalar tensors survive a round
// trip.
TEST(CkptVault, RoundTripEveryDtype) {
  std::string dir = TempDir("dtypes");
  State s;
  uint64_t seed = 1;
  for (const char* dt : {"bool", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"})
    s.Add(std::string("t_") + dt, dt, {3, 1000}, seed++);
  s.Add("empty", "f32", {0, 5}, seed++);
  s.Add("scalar", "f64", {}, seed++);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
    ExpectRestores(v->get(), 1, s);
  }
  // Reopened read-only, the same.
  VaultOptions ro = SmallOpts();
  ro.read_only = true;
  auto v = CheckpointVault::Open(dir, ro);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRestores(v->get(), 1, s);
  EXPECT_EQ((*v)->Latest(), std::optional<int64_t>(1));
  EXPECT_EQ((*v)->Save(2, s.Refs()).code(), StatusCode::kFailedPrecondition);
}

// Guards change detection: an unchanged state writes nothing; one changed chunk writes one chunk.
TEST(CkptVault, WritesOnlyChangedChunks) {
  std::string dir = TempDir("change");
  State s;
  s.Add("w", "f32", {16, 1024}, 1);  // 64 KiB = 16 chunks of 4 KiB
  s.Add("b", "f32", {100}, 2);
  auto v = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_EQ((*v)->last_stats().chunks_written, 17);
  ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_EQ((*v)->last_stats().chunks_written, 0);
  EXPECT_EQ((*v)->last_stats().bytes_copied, 0);
  s.ts[0].bytes[5 * 4096 + 17] ^= 1;
  ASSERT_TRUE((*v)->Save(3, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  SaveStats st = (*v)->last_stats();
  EXPECT_EQ(st.chunks_written, 1);
  EXPECT_EQ(st.bytes_written, 4096);
  EXPECT_EQ(st.chunks_skipped, 16);
  ExpectRestores(v->get(), 3, s);
  // A reopened vault compares with the latest manifest: still incremental.
  v->reset();
  v = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE(v.ok());
  s.ts[1].bytes[0] ^= 1;
  ASSERT_TRUE((*v)->Save(4, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_EQ((*v)->last_stats().chunks_written, 1);
  EXPECT_EQ((*v)->Save(4, s.Refs()).code(), StatusCode::kInvalidArgument);  // steps increase
}

// Guards the one-pass restore: 50 incremental saves, each restorable exactly, without replay.
// Guards ReserveDeviceStaging on a host-only state: nothing is allocated, the reason is given,
// and the vault saves as before.
TEST(CkptVault, ReserveDeviceStagingOfHostStateReservesNothing) {
  State s;
  s.Add("w", "f32", {16, 1024}, 5);
  auto v = CheckpointVault::Open(TempDir("reservehost"), SmallOpts());
  ASSERT_TRUE(v.ok()) << v.status();
  std::string why;
  auto r = (*v)->ReserveDeviceStaging(s.Refs(), &why);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 0);
  EXPECT_FALSE(why.empty());
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_EQ((*v)->last_stats().chunks_written, 16);
}

TEST(CkptVault, ChainOfFiftyRestoresExactly) {
  std::string dir = TempDir("chain");
  State s;
  s.Add("a", "f32", {8, 1024}, 1);
  s.Add("b", "bf16", {3000}, 2);
  s.Add("c", "u8", {777}, 3);
  std::vector<State> history;
  VaultOptions o = SmallOpts();
  o.max_inflight = 3;
  auto v = CheckpointVault::Open(dir, o);
  ASSERT_TRUE(v.ok());
  std::mt19937_64 rng(5);
  for (int step = 1; step <= 50; ++step) {
    auto& t = s.ts[rng() % s.ts.size()];
    for (int k = 0; k < 3; ++k) t.bytes[rng() % t.bytes.size()] ^= 0x5a;
    ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
    history.push_back(s);
  }
  ASSERT_TRUE((*v)->Wait().ok());
  auto steps = (*v)->List();
  ASSERT_EQ(steps->size(), 50u);
  for (int step = 1; step <= 50; ++step) ExpectRestores(v->get(), step, history[step - 1]);
  EXPECT_GT((*v)->Summary(50)->num_segments, 1);
}

// Guards checksum verification: a flipped byte in a chunk gives DataLoss naming the tensor.
TEST(CkptVault, FlippedByteIsDataLossNamingTensor) {
  std::string dir = TempDir("flip");
  State s;
  s.Add("layer.0.weight", "f32", {4096}, 1);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(7, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
  }
  std::string seg;
  for (auto& e : fs::directory_iterator(dir + "/segments")) seg = e.path().string();
  {
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 * 2 + 100);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(4096 * 2 + 100);
    f.write(&c, 1);
  }
  auto v = CheckpointVault::Open(dir, SmallOpts());
  auto r = (*v)->Restore(7);
  ASSERT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("tensor 'layer.0.weight' chunk 2"), std::string::npos)
      << r.status();
  Status vs = (*v)->Verify(7);
  EXPECT_EQ(vs.code(), StatusCode::kDataLoss);
}

// Guards manifest integrity: a truncated or edited manifest is DataLoss naming the file.
TEST(CkptVault, TruncatedOrTamperedManifestIsDataLoss) {
  std::string dir = TempDir("trunc");
  State s;
  s.Add("w", "f32", {2048}, 1);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(3, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
  }
  const std::string man = dir + "/manifests/ckpt-000000000003.manifest";
  std::string body;
  {
    std::ifstream f(man, std::ios::binary);
    body.assign(std::istreambuf_iterator<char>(f), {});
  }
  VaultOptions ro = SmallOpts();
  ro.read_only = true;
  std::ofstream(man, std::ios::binary | std::ios::trunc) << body.substr(0, body.size() - 10);
  auto v = CheckpointVault::Open(dir, ro);
  auto r = (*v)->Restore(3);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(man), std::string::npos) << r.status();
  std::string tampered = body;
  tampered[tampered.size() - 5] ^= 1;
  std::ofstream(man, std::ios::binary | std::ios::trunc) << tampered;
  EXPECT_EQ((*v)->Restore(3).status().code(), StatusCode::kDataLoss);
}

// Guards gc and retention: unreferenced segments go, referenced ones never do.
TEST(CkptVault, GcNeverDeletesReferencedChunks) {
  std::string dir = TempDir("gc");
  VaultOptions o = SmallOpts();
  o.keep_last = 2;
  o.keep_every = 5;
  State s;
  s.Add("frozen", "f32", {4096}, 1);  // never changes: its chunks stay in segment 1
  s.Add("hot", "f32", {1024}, 2);
  std::map<int64_t, State> hist;
  auto v = CheckpointVault::Open(dir, o);
  for (int step = 1; step <= 12; ++step) {
    s.ts[1].bytes[step] ^= 1;
    ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
    hist[step] = s;
  }
  std::ofstream(dir + "/segments/seg-000000000099-deadbeef.lfs") << "stray";
  auto st = (*v)->Gc();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->segments_deleted, 1);
  auto steps = *(*v)->List();
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 10, 11, 12}));
  for (int64_t step : steps) ExpectRestores(v->get(), step, hist[step]);
  // Segment of step 1 (frozen weights) is still referenced by step 12.
  bool seg1 = false;
  for (auto& e : fs::directory_iterator(dir + "/segments"))
    seg1 |= e.path().filename().string().rfind("seg-000000000001-", 0) == 0;
  EXPECT_TRUE(seg1);
}

// Guards merge: the merged checkpoint restores exactly what restore gave, from one segment, and
// survives deleting every other checkpoint.
TEST(CkptVault, MergeEqualsRestore) {
  std::string dir = TempDir("merge");
  VaultOptions o = SmallOpts();
  o.compress = true;
  State s;
  s.Add("a", "f32", {4096}, 1);
  s.Add("b", "i64", {1000}, 2);
  auto v = CheckpointVault::Open(dir, o);
  for (int step = 1; step <= 6; ++step) {
    s.ts[step % 2].bytes[step * 100] ^= 3;
    ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
  }
  ASSERT_TRUE((*v)->Wait().ok());
  auto before = (*v)->Restore(6);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE((*v)->Merge(6).ok());
  EXPECT_EQ((*v)->Summary(6)->num_segments, 1);
  EXPECT_EQ((*v)->Summary(6)->parent, -1);
  for (int step = 1; step <= 5; ++step)
    fs::remove(dir + "/manifests/ckpt-00000000000" + std::to_string(step) + ".manifest");
  ASSERT_TRUE((*v)->Gc().ok());
  auto after = (*v)->Restore(6);
  ASSERT_TRUE(after.ok()) << after.status();
  for (size_t i = 0; i < before->size(); ++i) EXPECT_TRUE((*before)[i].data == (*after)[i].data);
  // Saving after a merge of the latest step stays incremental and correct.
  s.ts[0].bytes[0] ^= 1;
  ASSERT_TRUE((*v)->Save(7, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_EQ((*v)->last_stats().chunks_written, 1);
  ExpectRestores(v->get(), 7, s);
}

// Guards the codecs: zstd and XOR-delta chunks are chosen when they pay and restore exactly.
TEST(CkptVault, CompressionAndXorDeltaRoundTrip) {
  std::string dir = TempDir("codec");
  VaultOptions o = SmallOpts();
  o.compress = true;
  o.xor_delta = true;
  State s;
  s.Add("noise", "u8", {16384}, 1);
  s.ts.push_back({"zeros", "f32", {4096}, std::vector<uint8_t>(16384, 0)});
  auto v = CheckpointVault::Open(dir, o);
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_GE((*v)->last_stats().chunks_compressed, 1);  // zeros compress, noise does not
  for (size_t i = 0; i < s.ts[0].bytes.size(); i += 97) s.ts[0].bytes[i] ^= 1;  // sparse change
  ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  SaveStats st = (*v)->last_stats();
  EXPECT_EQ(st.chunks_delta, 4);
  EXPECT_LT(st.bytes_written, 16384 / 2);
  ExpectRestores(v->get(), 2, s);
  ASSERT_TRUE((*v)->Verify(2).ok());
}

// Guards the parallel read pass: many runs over several segments with raw, zstd and XOR-delta
// chunks restore exactly into caller buffers with 4 workers; progress is monotone and complete.
TEST(CkptVault, ParallelRestoreIntoAcrossSegmentsAndCodecs) {
  std::string dir = TempDir("par");
  VaultOptions o = SmallOpts();
  o.compress = true;
  o.xor_delta = true;
  o.io_threads = 4;
  State s;
  for (int i = 0; i < 6; ++i) s.Add("noise" + std::to_string(i), "u8", {int64_t{2} << 20}, 10 + i);
  s.ts.push_back({"zeros", "f32", {int64_t{1} << 18}, std::vector<uint8_t>(int64_t{1} << 20, 0)});
  auto v = CheckpointVault::Open(dir, o);
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  for (size_t i = 0; i < s.ts[1].bytes.size(); i += 997) s.ts[1].bytes[i] ^= 1;  // -> xor deltas
  s.ts[3].bytes = RandomBytes(s.ts[3].bytes.size(), 99);                         // -> raw rewrite
  ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  EXPECT_GT((*v)->last_stats().chunks_delta, 0);
  std::vector<std::vector<uint8_t>> out(s.ts.size());
  std::map<std::string, RestoreTarget> targets;
  int64_t total = 0;
  for (size_t i = 0; i < s.ts.size(); ++i) {
    out[i].resize(s.ts[i].bytes.size());
    targets[s.ts[i].name] = {out[i].data(), static_cast<int64_t>(out[i].size()), -1};
    total += static_cast<int64_t>(out[i].size());
  }
  int64_t last = 0;
  bool monotone = true;
  ASSERT_TRUE((*v)->RestoreInto(2, targets,
                                [&](int64_t done) {
                                  monotone = monotone && done > last;
                                  last = done;
                                })
                  .ok());
  EXPECT_TRUE(monotone);
  EXPECT_EQ(last, total);
  for (size_t i = 0; i < s.ts.size(); ++i) EXPECT_TRUE(out[i] == s.ts[i].bytes) << s.ts[i].name;
  ASSERT_TRUE((*v)->Verify(2).ok());
}

// Guards error determinism of the parallel pass: with two corrupt chunks, every restore with 4
// workers reports the one that comes first in the segment, never the later one.
TEST(CkptVault, ParallelRestoreReportsFirstCorruptChunk) {
  std::string dir = TempDir("parerr");
  VaultOptions o = SmallOpts();
  o.io_threads = 4;
  State s;
  s.Add("w", "u8", {int64_t{12} << 20}, 5);  // 3072 chunks -> several runs
  {
    auto v = CheckpointVault::Open(dir, o);
    ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
  }
  std::string seg;
  for (auto& e : fs::directory_iterator(dir + "/segments")) seg = e.path().string();
  for (int64_t off : {int64_t{2500} * 4096 + 7, int64_t{1500} * 4096 + 3}) {
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(off);
    char c;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(off);
    f.write(&c, 1);
  }
  auto v = CheckpointVault::Open(dir, o);
  for (int rep = 0; rep < 3; ++rep) {
    Status st = (*v)->Verify(1);
    ASSERT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_NE(st.message().find("tensor 'w' chunk 1500 "), std::string::npos) << st;
  }
}

// Guards the snapshot contract: once Save() returns, overwriting the source tensors does not
// change what is committed, for the fused first save and for incremental saves, with 4 workers.
TEST(CkptVault, SourceMutatedRightAfterSaveDoesNotLeakIntoCheckpoint) {
  std::string dir = TempDir("mut");
  VaultOptions o = SmallOpts();
  o.io_threads = 4;
  o.max_inflight = 2;
  State s;
  for (int i = 0; i < 5; ++i) s.Add("t" + std::to_string(i), "f32", {40000 + i}, 20 + i);
  auto v = CheckpointVault::Open(dir, o);
  std::vector<State> expect;
  for (int step = 1; step <= 4; ++step) {
    ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
    expect.push_back(s);
    // Mutate every tensor immediately (the writer may not have started yet).
    for (auto& t : s.ts)
      for (size_t i = 0; i < t.bytes.size(); i += (step == 2 ? 4096 * 3 : 61)) t.bytes[i] ^= 0x5a;
  }
  ASSERT_TRUE((*v)->Wait().ok());
  for (int step = 1; step <= 4; ++step) ExpectRestores(v->get(), step, expect[step - 1]);
}

// Guards staging reuse: the first save allocates staging, later saves (incremental or a full
// rewrite) recycle it; the first save after reopening copies only the changed chunks.
TEST(CkptVault, StagingIsRecycledAndSizedByChangedChunks) {
  std::string dir = TempDir("stage");
  State s;
  for (int i = 0; i < 10; ++i) s.Add("t" + std::to_string(i), "u8", {4096 * 128}, 40 + i);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
    EXPECT_GE((*v)->last_stats().staging_allocated, 10 * 4096 * 128);
    s.ts[3].bytes[5] ^= 1;
    ASSERT_TRUE((*v)->Save(2, s.Refs()).ok());
    EXPECT_EQ((*v)->last_stats().staging_allocated, 0);
    EXPECT_EQ((*v)->last_stats().bytes_copied, 4096);
    for (auto& t : s.ts) t.bytes[0] ^= 1;
    ASSERT_TRUE((*v)->Save(3, s.Refs()).ok());
    EXPECT_EQ((*v)->last_stats().staging_allocated, 0);
    EXPECT_EQ((*v)->last_stats().bytes_copied, 10 * 4096);
    ASSERT_TRUE((*v)->Wait().ok());
  }
  auto v = CheckpointVault::Open(dir, SmallOpts());
  s.ts[7].bytes[4096 * 5] ^= 1;
  ASSERT_TRUE((*v)->Save(4, s.Refs()).ok());
  EXPECT_EQ((*v)->last_stats().bytes_copied, 4096);
  EXPECT_LT((*v)->last_stats().staging_allocated, 10 * 4096 * 128);
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestores(v->get(), 4, s);
}

// Guards the fused first-save layout: thousands of tiny tensors (optimizer step counters) stage
// back to back, not one chunk each (that would reserve 5000 x 4 MiB).
TEST(CkptVault, ManyTinyTensorsStageCompactly) {
  std::string dir = TempDir("tiny");
  State s;
  for (int i = 0; i < 5000; ++i) s.Add("opt.step." + std::to_string(i), "i64", {1}, 300 + i);
  auto v = CheckpointVault::Open(dir);  // default 4 MiB chunks
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  EXPECT_LE((*v)->last_stats().staging_allocated, int64_t{4} << 20);
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestores(v->get(), 1, s);
}

// Guards export: the safetensors file has the documented header and the exact tensor bytes.
TEST(CkptVault, ExportSafetensors) {
  std::string dir = TempDir("export");
  State s;
  s.Add("x.weight", "bf16", {3, 5000}, 1);
  s.Add("y", "i32", {7}, 2);
  auto v = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  const std::string out = dir + "/out.safetensors";
  ASSERT_TRUE((*v)->ExportSafetensors(1, out).ok());
  std::ifstream f(out, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), {});
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= static_cast<uint64_t>(static_cast<uint8_t>(all[i])) << (8 * i);
  EXPECT_EQ(hl % 8, 0u);
  auto h = nlohmann::json::parse(all.substr(8, hl));
  EXPECT_EQ(h["x.weight"]["dtype"], "BF16");
  EXPECT_EQ(h["x.weight"]["shape"], nlohmann::json({3, 5000}));
  for (const auto& t : s.ts) {
    auto off = h[t.name]["data_offsets"];
    size_t b = 8 + hl + off[0].get<size_t>(), e = 8 + hl + off[1].get<size_t>();
    EXPECT_EQ(std::string(t.bytes.begin(), t.bytes.end()), all.substr(b, e - b));
  }
  EXPECT_EQ(all.size(), 8 + hl + 30000 + 28);
}

// Guards single-writer locking: a second writable opener gets Unavailable.
TEST(CkptVault, SecondWriterIsUnavailable) {
  std::string dir = TempDir("lock");
  auto a = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE(a.ok());
  auto b = CheckpointVault::Open(dir, SmallOpts());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
}

// Guards input validation: views that are not contiguous, not valid or named twice, and size
// mismatches on restore, are caller errors naming the tensor (checked in Save), not crashes.
TEST(CkptVault, RejectsBadInput) {
  std::string dir = TempDir("bad");
  auto v = CheckpointVault::Open(dir, SmallOpts());
  uint8_t x[4] = {};
  TensorView strided = TensorView::Contiguous(x, DType::kUInt8, {2, 2});
  strided.strides = {1, 2};
  Status s = (*v)->Save(1, {{"a", strided}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'a' is not contiguous"), std::string::npos) << s;
  s = (*v)->Save(1, {HostRef("a", DType::kUInt8, {-1}, x)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'a' has a negative dimension"), std::string::npos) << s;
  s = (*v)->Save(1, {HostRef("a", DType::kUInt8, {4}, nullptr)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'a' has no data pointer"), std::string::npos) << s;
  EXPECT_EQ(
      (*v)->Save(1, {HostRef("a", DType::kUInt8, {4}, x), HostRef("a", DType::kUInt8, {4}, x)})
          .code(),
      StatusCode::kInvalidArgument);
  ASSERT_TRUE((*v)->Save(1, {HostRef("a", DType::kUInt8, {4}, x)}).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  uint8_t y[8];
  EXPECT_EQ((*v)->RestoreInto(1, {{"a", {y, 8, -1}}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*v)->RestoreInto(1, {{"nope", {y, 4, -1}}}).code(), StatusCode::kNotFound);
  EXPECT_EQ((*v)->Restore(9).status().code(), StatusCode::kNotFound);
  VaultOptions bad = SmallOpts();
  bad.chunk_bytes = 1000;
  EXPECT_EQ(CheckpointVault::Open(TempDir("bad2"), bad).status().code(),
            StatusCode::kInvalidArgument);
}

// Guards steps of 10^12 and more (timestamps): listed, loaded and kept by gc, sorted by value;
// names the vault does not write (overflowing, extra zeros) are ignored, not parsed by throwing.
TEST(CkptVault, StepsOfAnyWidthListLoadAndSurviveGc) {
  std::string dir = TempDir("wide");
  const std::vector<int64_t> steps = {7, 999999999999, 1000000000000, 1700000000123,
                                      int64_t{1} << 62};
  std::map<int64_t, State> hist;
  State s;
  s.Add("w", "f32", {2048}, 1);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE(v.ok()) << v.status();
    for (int64_t step : steps) {
      s.ts[0].bytes[static_cast<size_t>(step % 1000)] ^= 1;
      ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
      ASSERT_TRUE((*v)->Wait().ok());
      hist[step] = s;
    }
  }
  EXPECT_TRUE(fs::exists(dir + "/manifests/ckpt-1000000000000.manifest"));
  std::ofstream(dir + "/manifests/ckpt-99999999999999999999999.manifest") << "overflow";
  std::ofstream(dir + "/manifests/ckpt-0000000000007.manifest") << "not our spelling";
  auto v = CheckpointVault::Open(dir, SmallOpts());  // reopens at the largest step
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*(*v)->List(), steps);
  EXPECT_EQ((*v)->Latest(), std::optional<int64_t>(steps.back()));
  auto st = (*v)->Gc();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->segments_deleted, 0);
  for (int64_t step : steps) ExpectRestores(v->get(), step, hist[step]);
  EXPECT_EQ((*v)->Save(steps.back(), s.Refs()).code(), StatusCode::kInvalidArgument);
}

// Guards the message for a negative step: it says what a step must be.
TEST(CkptVault, NegativeStepIsAClearError) {
  auto v = CheckpointVault::Open(TempDir("neg"), SmallOpts());
  uint8_t x[4] = {};
  Status s = (*v)->Save(-1, {HostRef("a", DType::kUInt8, {4}, x)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be >= 0, got -1"), std::string::npos) << s;
  EXPECT_EQ((*v)->Restore(-1).status().code(), StatusCode::kInvalidArgument);
}

// Guards against one damaged manifest disabling the vault: every step is still listed, Latest
// (resume) falls back to the newest good one, a writer can reopen the vault, and an explicit load
// of the damaged step is DataLoss naming the file.
TEST(CkptVault, DamagedManifestFallsBackToNewestGood) {
  std::string dir = TempDir("damaged");
  State s;
  s.Add("w", "f32", {2048}, 1);
  std::map<int64_t, State> hist;
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    for (int64_t step = 1; step <= 3; ++step) {
      s.ts[0].bytes[static_cast<size_t>(step)] ^= 1;
      ASSERT_TRUE((*v)->Save(step, s.Refs()).ok());
      ASSERT_TRUE((*v)->Wait().ok());
      hist[step] = s;
    }
  }
  const std::string bad = dir + "/manifests/ckpt-000000000003.manifest";
  std::string body = ReadFile(bad);
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << body.substr(0, body.size() / 2);
  std::ofstream(dir + "/manifests/ckpt-000000000001.manifest", std::ios::trunc) << "garbage";
  VaultOptions ro = SmallOpts();
  ro.read_only = true;
  auto r = CheckpointVault::Open(dir, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*(*r)->List(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ((*r)->Latest(), std::optional<int64_t>(2));
  ExpectRestores(r->get(), 2, hist[2]);
  Status e = (*r)->Restore(3).status();
  EXPECT_EQ(e.code(), StatusCode::kDataLoss);
  EXPECT_NE(e.message().find(bad), std::string::npos) << e;
  EXPECT_EQ((*r)->Summary(1).status().code(), StatusCode::kDataLoss);
  auto w = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Save(3, s.Refs()).ok());  // redoing step 3 replaces the damaged manifest
  ASSERT_TRUE((*w)->Wait().ok());
  ExpectRestores(w->get(), 3, s);
}

// Guards Note [Outputs are created, never followed]: symlinks planted where the vault commits a
// manifest or export writes its temp file (the old fixed names) or its output are never written
// through.
TEST(CkptVault, CommitAndExportNeverWriteThroughSymlinks) {
  std::string dir = TempDir("symlink");
  std::string victim = TempDir("symlink_victim") + "/victim";
  std::ofstream(victim) << "precious";
  State s;
  s.Add("w", "f32", {2048}, 1);
  auto v = CheckpointVault::Open(dir, SmallOpts());
  fs::create_symlink(victim, dir + "/manifests/ckpt-000000000001.manifest.tmp");
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  const std::string out = dir + "/x.safetensors";
  fs::create_symlink(victim, out + ".tmp");
  ASSERT_TRUE((*v)->ExportSafetensors(1, out).ok());
  // A symlink at the output is refused, even with replace: its target is never written.
  fs::create_symlink(victim, dir + "/y.safetensors");
  EXPECT_EQ((*v)->ExportSafetensors(1, dir + "/y.safetensors", /*replace=*/true).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_TRUE(fs::is_symlink(dir + "/y.safetensors"));
  ExpectRestores(v->get(), 1, s);
  // gc leaves the planted link alone (not a file the vault wrote).
  ASSERT_TRUE((*v)->Gc().ok());
  EXPECT_TRUE(fs::is_symlink(dir + "/manifests/ckpt-000000000001.manifest.tmp"));
}

// Guards gc against deleting what is not the vault's: notes, dotfiles, symlinks and folders in
// segments/ stay (and are reported); gc does not stop at a folder; a stray segment still goes.
TEST(CkptVault, GcDeletesOnlyItsOwnSegmentFiles) {
  std::string dir = TempDir("gcown");
  std::string outside = TempDir("gcown_outside") + "/data";
  std::ofstream(outside) << "keep";
  State s;
  s.Add("w", "f32", {2048}, 1);
  auto v = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  const std::string seg = dir + "/segments/";
  std::ofstream(seg + "notes.txt") << "mine";
  std::ofstream(seg + ".hidden") << "mine";
  fs::create_directories(seg + "sub");
  std::ofstream(seg + "sub/file") << "mine";
  fs::create_symlink(outside, seg + "seg-000000000077-0badf00d.lfs");
  std::ofstream(seg + "seg-000000000099-deadbeef.lfs") << "stray";
  auto st = (*v)->Gc();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->segments_deleted, 1);
  EXPECT_EQ(st->segments_live, 1);
  EXPECT_EQ(st->skipped.size(), 4u);
  EXPECT_FALSE(fs::exists(seg + "seg-000000000099-deadbeef.lfs"));
  EXPECT_TRUE(fs::exists(seg + "notes.txt"));
  EXPECT_TRUE(fs::exists(seg + ".hidden"));
  EXPECT_TRUE(fs::exists(seg + "sub/file"));
  EXPECT_TRUE(fs::is_symlink(seg + "seg-000000000077-0badf00d.lfs"));
  EXPECT_EQ(ReadFile(outside), "keep");
  ExpectRestores(v->get(), 1, s);
}

// Guards restore into a directory: a non-empty OUT is refused unless asked, then only restore's
// own files are replaced (a planted symlink is replaced, not followed); a failed restore leaves
// nothing behind.
TEST(CkptVault, RestoreToDirectoryRefusesNonEmptyAndLeavesNothingOnFailure) {
  std::string dir = TempDir("rdir");
  std::string victim = TempDir("rdir_victim") + "/victim";
  std::ofstream(victim) << "precious";
  State s;
  s.Add("a", "f32", {2048}, 1);
  s.Add("b", "u8", {100}, 2);
  auto v = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  const std::string out = dir + "/out";
  ASSERT_TRUE((*v)->RestoreToDirectory(1, out).ok());
  EXPECT_EQ(ReadFile(out + "/0.bin"), std::string(s.ts[0].bytes.begin(), s.ts[0].bytes.end()));
  auto index = nlohmann::json::parse(ReadFile(out + "/tensors.json"));
  EXPECT_EQ(index[1]["name"], "b");
  EXPECT_EQ(index[1]["file"], "1.bin");
  const std::string user = TempDir("rdir_user");
  std::ofstream(user + "/keep.txt") << "mine";
  fs::create_symlink(victim, user + "/0.bin");
  Status refused = (*v)->RestoreToDirectory(1, user);
  EXPECT_EQ(refused.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(refused.message().find(user), std::string::npos) << refused;
  EXPECT_FALSE(fs::exists(user + "/tensors.json"));
  ASSERT_TRUE((*v)->RestoreToDirectory(1, user, /*replace=*/true).ok());
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(user + "/0.bin")));
  EXPECT_EQ(ReadFile(user + "/keep.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(user), fs::directory_iterator()), 4);
  // A damaged chunk: DataLoss, and the new directory is gone again.
  for (auto& e : fs::directory_iterator(dir + "/segments")) fs::resize_file(e.path(), 100);
  Status bad = (*v)->RestoreToDirectory(1, dir + "/out2");
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss) << bad;
  EXPECT_FALSE(fs::exists(dir + "/out2"));
}

// Guards restore on a real full filesystem: ResourceExhausted naming a file, nothing left.
TEST(CkptVault, RestoreToDirectoryOnFullDiskLeavesNothing) {
  std::string dir = TempDir("rfull");
  std::string mnt = TempDir("rfull_mnt");
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount tmpfs here: " << std::strerror(errno);
  State s;
  s.Add("a", "u8", {600 * 1024}, 1);
  s.Add("b", "u8", {600 * 1024}, 2);
  {
    auto v = CheckpointVault::Open(dir, SmallOpts());
    ASSERT_TRUE((*v)->Save(1, s.Refs()).ok());
    ASSERT_TRUE((*v)->Wait().ok());
    std::ofstream(mnt + "/keep.txt") << "mine";
    Status st = (*v)->RestoreToDirectory(1, mnt, /*replace=*/true);
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find(mnt), std::string::npos) << st;
    std::vector<std::string> left;
    for (auto& e : fs::directory_iterator(mnt)) left.push_back(e.path().filename().string());
    EXPECT_EQ(left, std::vector<std::string>{"keep.txt"});
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
}

// Guards the abort (exit 134) on a vault path that cannot be entered (a symlink loop, a file as a
// directory): a Status naming the path.
TEST(CkptVault, UnreadableVaultPathIsAStatusNotAnAbort) {
  std::string base = TempDir("unreadable");
  fs::create_symlink("loop", base + "/loop");
  VaultOptions ro = SmallOpts();
  ro.read_only = true;
  auto a = CheckpointVault::Open(base + "/loop", ro);
  EXPECT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find(base + "/loop"), std::string::npos) << a.status();
  std::ofstream(base + "/file") << "x";
  EXPECT_FALSE(CheckpointVault::Open(base + "/file/vault", ro).ok());
  EXPECT_FALSE(CheckpointVault::Open(base + "/file/vault", SmallOpts()).ok());
}

// Guards the error class of a directory the user cannot enter: PermissionDenied naming it (was
// NotFound, or an abort).
TEST(CkptVault, UnreadableVaultIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root bypasses directory permissions";
  std::string base = TempDir("locked");
  VaultOptions ro = SmallOpts();
  ro.read_only = true;
  fs::create_directories(base + "/locked/manifests");
  fs::permissions(base + "/locked", fs::perms::none);
  auto p = CheckpointVault::Open(base + "/locked", ro);
  fs::permissions(base + "/locked", fs::perms::owner_all);
  EXPECT_EQ(p.status().code(), StatusCode::kPermissionDenied) << p.status();
  EXPECT_NE(p.status().message().find(base + "/locked"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
