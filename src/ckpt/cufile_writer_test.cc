// Tests of the vault's writer option (Note [cuFile writer] in src/ckpt/chunk_sink.h): the cuFile
// writer's segments are byte-identical to the POSIX writer's, and builds without cuFile refuse
// writer=cufile clearly. The CkptCufile tests need a CUDA device and a cuFile build.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "ckpt/ckpt_test_util.h"
#include "loongforge/build_info.h"
#include "loongforge/ckpt.h"
#include "test_dataset.h"

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loongforge {
namespace ckpt {
namespace {
namespace fs = std::filesystem;

std::string CufileTempDir(const std::string& name) { return testing::TempDir("cufile_" + name); }

// Guards the option parser: the three names parse, anything else is InvalidArgument naming them.
TEST(CkptCufileCpu, ParseWriter) {
  EXPECT_EQ(*ParseWriter("auto"), Writer::kAuto);
  EXPECT_EQ(*ParseWriter("posix"), Writer::kPosix);
  EXPECT_EQ(*ParseWriter("cufile"), Writer::kCufile);
  auto bad = ParseWriter("gds");
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, posix or cufile"), std::string::npos);
}

// Guards the documented fallback: writer=auto runs the POSIX writer and says why in the stats;
// without cuFile in the build, writer=cufile fails at Open with "cufile: not built".
TEST(CkptCufileCpu, AutoIsPosixAndExplicitCufileNeedsTheBuild) {
  std::string dir = CufileTempDir("auto");
  std::vector<uint8_t> bytes(10000, 7);
  {
    VaultOptions o;
    o.chunk_bytes = 4096;
    auto v = CheckpointVault::Open(dir, o);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(
        (*v)->Save(1, {{"w", TensorView::Contiguous(bytes.data(), DType::kUInt8, {10000})}}).ok());
    ASSERT_TRUE((*v)->Wait().ok());
    SaveStats st = (*v)->last_stats();
    EXPECT_EQ(st.writer, "posix");
    EXPECT_NE(st.writer_reason.find("writer=auto"), std::string::npos) << st.writer_reason;
    EXPECT_EQ(st.chunks_cufile, 0);
    if (!GetBuildInfo().cufile)
      EXPECT_NE(st.writer_reason.find("cufile: not built"), std::string::npos) << st.writer_reason;
  }
  if (GetBuildInfo().cufile)
    GTEST_SKIP() << "cuFile is built in; the GPU tests cover writer=cufile";
  VaultOptions o;
  o.writer = Writer::kCufile;
  auto v = CheckpointVault::Open(CufileTempDir("explicit"), o);
  ASSERT_EQ(v.status().code(), StatusCode::kUnimplemented) << v.status();
  EXPECT_NE(v.status().message().find("cufile: not built"), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find("writer=cufile"), std::string::npos) << v.status();
  // A read-only open never starts a writer, so it ignores the option.
  o.read_only = true;
  EXPECT_TRUE(CheckpointVault::Open(dir, o).ok());
}

#ifdef LOONGFORGE_WITH_CUDA
bool HaveCufileDevice(std::string* why) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    *why = "no CUDA device";
    return false;
  }
  if (!GetBuildInfo().cufile) {
    *why = "cuFile is not built in";
    return false;
  }
  // Where libcufile refuses to register files here (Open probes it), the writer cannot run: the
  // refusal itself is checked by CkptCufile.OpenFailsClearlyWhereCufileCannotWrite.
  VaultOptions o;
  o.writer = Writer::kCufile;
  auto v = CheckpointVault::Open(CufileTempDir("probe"), o);
  if (!v.ok()) {
    *why = "cuFile cannot write files on this machine: " + v.status().ToString();
    return false;
  }
  return true;
}

// The segment file of `step` in vault `dir` ("" if none).
std::string SegmentOf(const std::string& dir, int64_t step) {
  char prefix[32];
  std::snprintf(prefix, sizeof(prefix), "seg-%012lld-", static_cast<long long>(step));
  for (const auto& e : fs::directory_iterator(dir + "/segments"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path().string();
  return "";
}

// Random tensors on device 0 plus one CPU tensor (its chunks go through the host path of the
// same segment file).
struct DevState {
  struct T {
    std::string name;
    int64_t nbytes;
    void* d = nullptr;
    std::vector<uint8_t> host;
  };
  std::vector<T> ts;
  std::vector<uint8_t> cpu;
  explicit DevState(const std::vector<int64_t>& sizes, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < sizes.size(); ++i) {
      T t{"layer" + std::to_string(i), sizes[i], nullptr, std::vector<uint8_t>(sizes[i])};
      for (auto& b : t.host) b = static_cast<uint8_t>(rng());
      EXPECT_EQ(cudaMalloc(&t.d, static_cast<size_t>(t.nbytes)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(t.d, t.host.data(), t.host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ts.push_back(std::move(t));
    }
    cpu.resize(50001);
    for (auto& b : cpu) b = static_cast<uint8_t>(rng());
  }
  ~DevState() {
    for (auto& t : ts) cudaFree(t.d);
  }
  // Changes `n` bytes at `off` of tensor i (host copy and device).
  void Touch(size_t i, int64_t off, int64_t n) {
    for (int64_t k = 0; k < n; ++k) t(i).host[static_cast<size_t>(off + k)] ^= 0x5a;
    EXPECT_EQ(cudaMemcpy(static_cast<uint8_t*>(t(i).d) + off, t(i).host.data() + off,
                         static_cast<size_t>(n), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  T& t(size_t i) { return ts[i]; }
  std::vector<TensorRef> Refs() const {
    std::vector<TensorRef> r{
        {"cpu_meta",
         TensorView::Contiguous(cpu.data(), DType::kUInt8, {static_cast<int64_t>(cpu.size())})}};
    for (const auto& t : ts)
      r.push_back({t.name, TensorView::Contiguous(t.d, DType::kUInt8, {t.nbytes},
                                                  Device{DeviceType::kCUDA, 0})});
    return r;
  }
};

std::unique_ptr<CheckpointVault> OpenWith(const std::string& dir, Writer w, int64_t chunk,
                                          bool compress = false, int64_t d2h_bytes = 0) {
  VaultOptions o;
  if (d2h_bytes > 0) o.d2h_buffer_bytes = d2h_bytes;  // also the cap on one cuFileWrite run
  o.chunk_bytes = chunk;
  o.writer = w;
  o.compress = compress;
  o.device_staging = DeviceStaging::kOn;
  auto v = CheckpointVault::Open(dir, o);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? std::move(v).value() : nullptr;
}

void ExpectRestoresExactly(CheckpointVault* v, int64_t step, DevState& s) {
  auto host = v->Restore(step);
  ASSERT_TRUE(host.ok()) << host.status();
  for (const auto& ht : *host) {
    if (ht.info.name == "cpu_meta") {
      EXPECT_EQ(ht.data, s.cpu);
      continue;
    }
    bool found = false;
    for (auto& t : s.ts)
      if (t.name == ht.info.name) {
        EXPECT_EQ(ht.data, t.host) << t.name;
        found = true;
      }
    EXPECT_TRUE(found) << ht.info.name;
  }
  ASSERT_TRUE(v->Verify(step).ok());
}

// Guards byte-identity of the cuFile writer: the same device state saved through cuFile and
// through POSIX gives identical segment files, for several chunk sizes (incl. tails that are not
// a multiple of 4 KiB; runs of adjacent chunks capped at 3 chunks for one size), and restores
// exactly.
TEST(CkptCufile, FullSaveIsByteIdenticalToPosix) {
  std::string why;
  if (!HaveCufileDevice(&why)) GTEST_SKIP() << why;
  DevState s({3 * 1048576 + 4097, 1000003, 64, 8 * 4096}, 11);
  for (int64_t chunk : {int64_t{4096}, int64_t{65600}, int64_t{1} << 20}) {
    SCOPED_TRACE("chunk_bytes=" + std::to_string(chunk));
    std::string dp = CufileTempDir("full_posix"), dc = CufileTempDir("full_cufile");
    const int64_t d2h = chunk == 65600 ? 3 * chunk : 0;
    auto vp = OpenWith(dp, Writer::kPosix, chunk, false, d2h);
    auto vc = OpenWith(dc, Writer::kCufile, chunk, false, d2h);
    ASSERT_TRUE(vp && vc);
    ASSERT_TRUE(vp->Save(1, s.Refs()).ok());
    ASSERT_TRUE(vc->Save(1, s.Refs()).ok());
    ASSERT_TRUE(vp->Wait().ok());
    Status w = vc->Wait();
    ASSERT_TRUE(w.ok()) << w;
    SaveStats sp = vp->last_stats(), sc = vc->last_stats();
    EXPECT_EQ(sp.writer, "posix");
    EXPECT_EQ(sc.writer, "cufile") << sc.writer_reason;
    EXPECT_EQ(sc.snapshot_path, "device") << sc.snapshot_reason;
    EXPECT_GT(sc.chunks_cufile, 0);
    EXPECT_EQ(sc.chunks_cufile + 1 + (static_cast<int64_t>(s.cpu.size()) - 1) / chunk,
              sc.chunks_written);  // everything but the CPU tensor's chunks
    EXPECT_EQ(sp.bytes_written, sc.bytes_written);
    std::string a = ReadFile(SegmentOf(dp, 1)), b = ReadFile(SegmentOf(dc, 1));
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "segments differ: " << a.size() << " vs " << b.size() << " bytes";
    ExpectRestoresExactly(vc.get(), 1, s);
  }
}

// Guards the fine-tune path through cuFile: a second save writes only the changed chunks (same
// segment bytes as POSIX), both steps restore exactly, and with compress on cuFile is bypassed
// (chunks are encoded on the host) with identical output.
TEST(CkptCufile, IncrementalSaveAndCompressFallback) {
  std::string why;
  if (!HaveCufileDevice(&why)) GTEST_SKIP() << why;
  const int64_t chunk = 65536;
  DevState s({2 * 1048576 + 100, 1048576, 777777}, 23);
  std::string dp = CufileTempDir("inc_posix"), dc = CufileTempDir("inc_cufile");
  auto vp = OpenWith(dp, Writer::kPosix, chunk);
  auto vc = OpenWith(dc, Writer::kCufile, chunk);
  ASSERT_TRUE(vp && vc);
  for (auto* v : {vp.get(), vc.get()}) {
    ASSERT_TRUE(v->Save(1, s.Refs()).ok());
    ASSERT_TRUE(v->Wait().ok());
  }
  std::vector<uint8_t> first0 = s.t(0).host, first2 = s.t(2).host;
  s.Touch(0, 5, 3);                  // one chunk of layer0
  s.Touch(2, 777777 - 10, 10);       // layer2's short tail chunk
  s.Touch(2, 3 * chunk + 1, chunk);  // two chunks of layer2
  for (auto* v : {vp.get(), vc.get()}) {
    ASSERT_TRUE(v->Save(2, s.Refs()).ok());
    Status w = v->Wait();
    ASSERT_TRUE(w.ok()) << w;
  }
  SaveStats sc = vc->last_stats();
  EXPECT_EQ(sc.writer, "cufile");
  EXPECT_EQ(sc.chunks_written, 4) << sc.writer_reason;
  EXPECT_EQ(sc.chunks_cufile, 4);
  EXPECT_EQ(ReadFile(SegmentOf(dp, 2)), ReadFile(SegmentOf(dc, 2)));
  ExpectRestoresExactly(vc.get(), 2, s);
  // Step 1 is still intact and exact.
  auto h1 = vc->Restore(1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  for (const auto& ht : *h1) {
    if (ht.info.name == "layer0") EXPECT_EQ(ht.data, first0);
    if (ht.info.name == "layer2") EXPECT_EQ(ht.data, first2);
  }
  vp.reset();
  vc.reset();
  // compress=true: the writer decides on host bytes, so cuFile writes nothing; same bytes on disk.
  std::string zp = CufileTempDir("z_posix"), zc = CufileTempDir("z_cufile");
  auto zvp = OpenWith(zp, Writer::kPosix, chunk, /*compress=*/true);
  auto zvc = OpenWith(zc, Writer::kCufile, chunk, /*compress=*/true);
  ASSERT_TRUE(zvp && zvc);
  for (auto* v : {zvp.get(), zvc.get()}) {
    ASSERT_TRUE(v->Save(1, s.Refs()).ok());
    ASSERT_TRUE(v->Wait().ok());
  }
  SaveStats zs = zvc->last_stats();
  EXPECT_EQ(zs.chunks_cufile, 0);
  EXPECT_NE(zs.writer_reason.find("compress"), std::string::npos) << zs.writer_reason;
  EXPECT_EQ(ReadFile(SegmentOf(zp, 1)), ReadFile(SegmentOf(zc, 1)));
  ExpectRestoresExactly(zvc.get(), 1, s);
}

// Guards orderly shutdown with registered arenas: several vaults opened and closed in turn (each
// a cuFile driver session, arenas registered then deregistered before cudaFree), with arena
// growth in between, keep working.
TEST(CkptCufile, ReopenAndArenaGrowth) {
  std::string why;
  if (!HaveCufileDevice(&why)) GTEST_SKIP() << why;
  std::string dir = CufileTempDir("reopen");
  for (int round = 0; round < 3; ++round) {
    DevState s({int64_t{1} << 20 << round, 4096 + 17}, 100 + static_cast<uint64_t>(round));
    auto v = OpenWith(dir, Writer::kCufile, 65536);
    ASSERT_TRUE(v);
    int64_t step = v->Latest().value_or(0) + 1;
    ASSERT_TRUE(v->Save(step, s.Refs()).ok());
    s.Touch(0, 0, 1);
    DevState bigger({(int64_t{3} << 20 << round) + 64}, 7);  // forces a larger arena
    auto refs = bigger.Refs();
    ASSERT_TRUE(v->Save(step + 1, refs).ok());
    Status w = v->Wait();
    ASSERT_TRUE(w.ok()) << w;
    ExpectRestoresExactly(v.get(), step + 1, bigger);
    ASSERT_TRUE(v->Close().ok());
  }
}
// Guards ENOSPC through cuFile: on a full 1 MiB tmpfs the failed save is ResourceExhausted naming
// the segment and chunk, leaves no partial segment, and step 1 still restores (skipped if mount is
// denied).
TEST(CkptCufile, DiskFullIsResourceExhaustedAndKeepsOlderCheckpoints) {
  std::string why;
  if (!HaveCufileDevice(&why)) GTEST_SKIP() << why;
  std::string dir = CufileTempDir("tmpfs");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount tmpfs here: " << std::strerror(errno);
  {
    DevState s({600 * 1024}, 5);
    s.cpu.resize(10);
    auto v = OpenWith(dir, Writer::kCufile, 65536);
    ASSERT_TRUE(v);
    ASSERT_TRUE(v->Save(1, s.Refs()).ok());
    ASSERT_TRUE(v->Wait().ok());
    std::vector<uint8_t> first = s.t(0).host;
    s.Touch(0, 0, 600 * 1024);
    ASSERT_TRUE(v->Save(2, s.Refs()).ok());
    Status w = v->Wait();
    EXPECT_EQ(w.code(), StatusCode::kResourceExhausted) << w;
    EXPECT_NE(w.message().find("older checkpoints are intact"), std::string::npos) << w;
    EXPECT_NE(w.message().find("chunk"), std::string::npos) << w;
    EXPECT_EQ(v->Latest(), std::optional<int64_t>(1));
    EXPECT_EQ(SegmentOf(dir, 2), "");
    auto h = v->Restore(1);
    ASSERT_TRUE(h.ok()) << h.status();
    for (const auto& ht : *h)
      if (ht.info.name == "layer0") EXPECT_EQ(ht.data, first);
  }
  ::umount2(dir.c_str(), MNT_DETACH);
}

// True if segments/ of `dir` holds a probe file (".cufile-probe-<random>").
bool HasProbeFile(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir + "/segments"))
    if (e.path().filename().string().rfind(".cufile-probe", 0) == 0) return true;
  return false;
}

// Guards the Open-time probe: writer=cufile either opens (and leaves no probe file behind) or,
// where libcufile refuses files in the vault (the H200 container: no udev data for its disk),
// fails at Open with Unavailable naming the directory and pointing at cufile.log, while
// writer=auto still works on the same directory.
TEST(CkptCufile, OpenFailsClearlyWhereCufileCannotWrite) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  if (!GetBuildInfo().cufile) GTEST_SKIP() << "cuFile is not built in";
  std::string dir = CufileTempDir("openprobe");
  {
    VaultOptions o;
    o.writer = Writer::kCufile;
    auto v = CheckpointVault::Open(dir, o);
    if (v.ok()) {
      EXPECT_FALSE(HasProbeFile(dir));
      return;
    }
    EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status();
    EXPECT_NE(v.status().message().find(dir + "/segments"), std::string::npos) << v.status();
    EXPECT_NE(v.status().message().find("cufile.log"), std::string::npos) << v.status();
    EXPECT_FALSE(HasProbeFile(dir));
  }
  VaultOptions o;
  auto v = CheckpointVault::Open(dir, o);  // the failed Open released the vault's lock
  ASSERT_TRUE(v.ok()) << v.status();
  std::vector<uint8_t> bytes(10000, 3);
  ASSERT_TRUE(
      (*v)->Save(1, {{"w", TensorView::Contiguous(bytes.data(), DType::kUInt8, {10000})}}).ok());
  ASSERT_TRUE((*v)->Wait().ok());
}
#endif  // LOONGFORGE_WITH_CUDA

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
