// Tests of CheckpointVault with CUDA tensors (device hashing, device staging, ordering with the
// caller's stream); they skip without a device, and the file compiles only in CUDA builds.
#include <gtest/gtest.h>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/device.h"
#include "ckpt/xxh3_lanes.h"

namespace loongforge {
namespace ckpt {
namespace {
namespace fs = std::filesystem;

// Every test needs a CUDA device and skips without one.
class CkptCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) GTEST_SKIP() << "no CUDA device";
  }
};

// A TensorRef to `n` bytes of CUDA device 0, produced by the work queued on `stream`.
TensorRef DeviceRef(std::string name, int64_t n, void* data, cudaStream_t stream = nullptr) {
  TensorRef r{std::move(name),
              TensorView::Contiguous(data, DType::kUInt8, {n}, Device{DeviceType::kCUDA, 0})};
  r.view.stream = stream;
  return r;
}

// A copy of `host` in a new buffer of CUDA device 0, freed on destruction (or by Free()). Fails the
// test on a CUDA error (call Init under ASSERT_NO_FATAL_FAILURE).
struct DeviceBytes {
  void* ptr = nullptr;

  void Init(const std::vector<uint8_t>& host) {
    ASSERT_EQ(cudaMalloc(&ptr, host.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ptr, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void Free() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
  }
  ~DeviceBytes() { Free(); }
};

// A mixed state: one CPU tensor "cpu.w" and device tensors g0.. of `n` random bytes each (with
// their host copies) produced on a non-blocking `producer` stream; the device memory is freed and
// the stream destroyed on destruction.
struct MixedState {
  State cpu;
  int64_t n = 0;
  cudaStream_t producer = nullptr;
  std::vector<void*> dev;
  std::vector<std::vector<uint8_t>> host;

  // "cpu.w" of `cpu_floats` floats (seed `cpu_seed`), then `count` device tensors of `bytes`
  // bytes, tensor i filled from seed `seed + i`. Fails the test on a CUDA error (call under
  // ASSERT_NO_FATAL_FAILURE).
  void Init(int64_t cpu_floats, uint64_t cpu_seed, int count, int64_t bytes, uint64_t seed) {
    cpu.Add("cpu.w", "f32", {cpu_floats}, cpu_seed);
    n = bytes;
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
    dev.assign(count, nullptr);
    host.resize(count);
    for (int i = 0; i < count; ++i) {
      host[i] = RandomBytes(static_cast<size_t>(n), seed + i);
      ASSERT_EQ(cudaMalloc(&dev[i], n), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dev[i], host[i].data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~MixedState() {
    for (void* p : dev) cudaFree(p);
    if (producer) cudaStreamDestroy(producer);
  }
  // "cpu.w", then g0.. on the producer stream.
  std::vector<TensorRef> Refs() const {
    std::vector<TensorRef> r = cpu.Refs();
    for (size_t i = 0; i < dev.size(); ++i)
      r.push_back(DeviceRef("g" + std::to_string(i), n, dev[i], producer));
    return r;
  }
};

// Restores tensor `name` of `step` straight into device memory and checks it holds `want`.
void ExpectRestoresIntoDevice(const CheckpointVault& v, int64_t step, const std::string& name,
                              const std::vector<uint8_t>& want) {
  const int64_t n = static_cast<int64_t>(want.size());
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n), cudaSuccess);
  Status s = v.RestoreInto(step, {{name, {d, n, 0}}});
  std::vector<uint8_t> back(want.size());
  cudaError_t copied = cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost);
  cudaFree(d);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(copied, cudaSuccess);
  EXPECT_TRUE(back == want);
}

// Restores `step` and checks that it holds `s`'s CPU tensor, then `want[i]` as tensor g<i>.
void ExpectRestoresMixed(const CheckpointVault& v, int64_t step, const MixedState& s,
                         const std::vector<std::vector<uint8_t>>& want) {
  auto r = v.Restore(step);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), want.size() + 1);
  EXPECT_TRUE((*r)[0].data == s.cpu.ts[0].bytes);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE((*r)[i + 1].data == want[i]) << "step " << step << " tensor g" << i;
}

// Guards the CUDA hash kernel: same bytes, same XXH3-128 as the CPU, on random data and odd sizes.
TEST_F(CkptCuda, DeviceHashMatchesCpu) {
  for (int64_t chunk : {int64_t{4096}, int64_t{1} << 20}) {
    for (int64_t n : {int64_t{1}, int64_t{200}, int64_t{241}, int64_t{4096}, int64_t{4097 + 100},
                      int64_t{3 << 20} + 13, int64_t{9} << 20}) {
      auto host = RandomBytes(static_cast<size_t>(n), static_cast<uint64_t>(n));
      DeviceBytes d;
      ASSERT_NO_FATAL_FAILURE(d.Init(host));
      std::vector<Hash128> got;
      ASSERT_TRUE(internal::DeviceHashChunks(d.ptr, n, chunk, 0, &got).ok());
      ASSERT_EQ(static_cast<int64_t>(got.size()), (n + chunk - 1) / chunk);
      for (size_t i = 0; i < got.size(); ++i) {
        int64_t off = static_cast<int64_t>(i) * chunk, len = std::min(chunk, n - off);
        EXPECT_EQ(got[i], HashBytes(host.data() + off, static_cast<size_t>(len)))
            << "n " << n << " chunk " << i;
      }
    }
  }
}

// Guards the device save/restore path: a device tensor saved and restored into device memory.
TEST_F(CkptCuda, DeviceSaveAndRestoreInto) {
  std::string dir = TempDir("cuda");
  const int64_t n = 3 * 4096 + 100;
  auto host = RandomBytes(n, 3);
  DeviceBytes d;
  ASSERT_NO_FATAL_FAILURE(d.Init(host));
  auto v = CheckpointVault::Open(dir, SmallOpts());
  ASSERT_TRUE((*v)->Save(1, {DeviceRef("g", n, d.ptr)}).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestoresIntoDevice(**v, 1, "g", host);
}

// Guards the batched asynchronous device snapshot: it orders after work still queued on the
// producer's stream (no host sync by the caller), it is complete when Save() returns (the caller
// overwrites right after), mixed CPU/device states work, odd sizes with short tails hash like the
// CPU, and a second save copies only the chunks that changed (60% of the tensors).
TEST_F(CkptCuda, BatchedSnapshotOrdersAfterProducerStreamAndCopiesOnlyChanged) {
  const int kTensors = 10;
  const int64_t n = 64 * 4096 + 100;  // 65 chunks, the last one a 100-byte short tail
  MixedState t;
  ASSERT_NO_FATAL_FAILURE(t.Init(5000, 7, kTensors, n, 100));
  // Keep the producer stream busy, then queue the final contents of tensor 0 behind it.
  const size_t kBusyBytes = size_t{256} << 20;
  void *busy_a = nullptr, *busy_b = nullptr;
  ASSERT_EQ(cudaMalloc(&busy_a, kBusyBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&busy_b, kBusyBytes), cudaSuccess);
  uint8_t* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), n), cudaSuccess);
  t.host[0] = RandomBytes(static_cast<size_t>(n), 999);
  std::memcpy(pinned, t.host[0].data(), n);
  for (int r = 0; r < 8; ++r)
    ASSERT_EQ(cudaMemcpyAsync(busy_b, busy_a, kBusyBytes, cudaMemcpyDeviceToDevice, t.producer),
              cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(t.dev[0], pinned, n, cudaMemcpyHostToDevice, t.producer), cudaSuccess);
  VaultOptions o = SmallOpts();
  o.max_inflight = 2;
  o.device_staging = DeviceStaging::kOff;  // this test covers the host-staging device path
  auto v = CheckpointVault::Open(TempDir("cudabatch"), o);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE((*v)->Save(1, t.Refs()).ok());
  EXPECT_EQ((*v)->last_stats().snapshot_path, "host");
  EXPECT_EQ((*v)->last_stats().snapshot_reason, "device_staging=off");
  // Overwrite right after Save() returned: must not reach checkpoint 1.
  ASSERT_EQ(cudaMemsetAsync(t.dev[1], 0xab, n, t.producer), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(t.producer), cudaSuccess);
  std::vector<std::vector<uint8_t>> expect1 = t.host;
  t.host[1].assign(static_cast<size_t>(n), 0xab);
  ASSERT_EQ(cudaMemcpy(t.dev[1], t.host[1].data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  // Step 2: 6 of 10 tensors change in one chunk (chunk 3), plus tensor 1 changed in full above.
  for (int i = 2; i < 8; ++i) {
    t.host[i][3 * 4096 + 17] ^= 0xff;
    ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(t.dev[i]) + 3 * 4096, t.host[i].data() + 3 * 4096,
                         4096, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ASSERT_TRUE((*v)->Save(2, t.Refs()).ok());
  SaveStats st = (*v)->last_stats();
  // Tensor 1: 64 chunks of 0xab are one distinct chunk + the tail; tensors 2..7: one chunk each.
  EXPECT_EQ(st.bytes_copied, 4096 + 100 + 6 * 4096);
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestoresMixed(**v, 1, t, expect1);
  ExpectRestoresMixed(**v, 2, t, t.host);
  ExpectRestoresIntoDevice(**v, 2, "g4", t.host[4]);  // straight into device memory
  cudaFreeHost(pinned);
}

// Guards device staging (Notes [Device staging], [Caller stream waits]): Save() returns while the
// producer stream is still busy (no host wait for the GPU), a kernel the caller queues on its
// stream right after Save() cannot reach the checkpoint, mixed CPU/device states work, the second
// save recycles the arena (nothing allocated) and writes only the changed chunks.
TEST_F(CkptCuda, DeviceStagingOrdersCallerStreamAfterCopyAndRecyclesArena) {
  const int kTensors = 8;
  const int64_t n = 32 * 4096 + 100;  // 33 chunks, the last one a 100-byte short tail
  MixedState t;
  ASSERT_NO_FATAL_FAILURE(t.Init(3000, 8, kTensors, n, 300));
  VaultOptions o = SmallOpts();
  o.device_staging = DeviceStaging::kOn;
  o.d2h_buffer_bytes = 3 * 4096;  // several double-buffer rounds per save
  auto v = CheckpointVault::Open(TempDir("cudastage"), o);
  ASSERT_TRUE(v.ok()) << v.status();
  // Reserved first, as the trainer does: the arena, and the snapshot stream whose creation loads
  // the copy kernels (Note [Kernel loading] in device_cuda.cu: loading may wait for the device).
  std::string why;
  auto reserved = (*v)->ReserveDeviceStaging(t.Refs(), &why);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_GT(*reserved, kTensors * n) << why;
  // The producer stream is held by a host function until the test opens the gate, so "Save()
  // returned while the stream was busy" does not depend on how fast Save() runs (a stream kept
  // busy by ~4 ms of copies was not enough under a parallel ctest on the H200).
  struct Gate {
    std::promise<void> open;
    std::shared_future<void> opened{open.get_future().share()};
  } gate;
  ASSERT_EQ(
      cudaLaunchHostFunc(
          t.producer,
          [](void* p) { static_cast<Gate*>(p)->opened.wait_for(std::chrono::seconds(60)); }, &gate),
      cudaSuccess);
  struct OpenOnExit {  // an ASSERT that returns early must not leave the stream held
    Gate* g;
    bool done = false;
    void Open() {
      if (!done) g->open.set_value();
      done = true;
    }
    ~OpenOnExit() { Open(); }
  } release{&gate};
  ASSERT_TRUE((*v)->Save(1, t.Refs()).ok());
  EXPECT_EQ(cudaStreamQuery(t.producer), cudaErrorNotReady) << "Save() waited for the GPU";
  // The caller overwrites right after Save() on its stream: must not reach checkpoint 1.
  for (int i = 0; i < kTensors; ++i)
    ASSERT_EQ(cudaMemsetAsync(t.dev[i], 0x5a, n, t.producer), cudaSuccess);
  SaveStats st1 = (*v)->last_stats();
  EXPECT_EQ(st1.snapshot_path, "device");
  // The device arena is the reserved one (staging_allocated counts the CPU tensor's host staging).
  EXPECT_NE(st1.snapshot_reason.find("recycled"), std::string::npos) << st1.snapshot_reason;
  release.Open();
  ASSERT_TRUE((*v)->Wait().ok());
  ASSERT_EQ(cudaStreamSynchronize(t.producer), cudaSuccess);
  ExpectRestoresMixed(**v, 1, t, t.host);
  // Step 2: restore the original bytes, then change one chunk in 3 of 8 tensors.
  for (int i = 0; i < kTensors; ++i) {
    if (i < 3) t.host[i][5 * 4096 + 9] ^= 0xff;
    ASSERT_EQ(cudaMemcpy(t.dev[i], t.host[i].data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ASSERT_TRUE((*v)->Save(2, t.Refs()).ok());
  ASSERT_TRUE((*v)->Wait().ok());
  SaveStats st2 = (*v)->last_stats();
  EXPECT_EQ(st2.snapshot_path, "device");
  EXPECT_EQ(st2.staging_allocated, 0);  // the arena (and host staging) were recycled
  EXPECT_EQ(st2.chunks_written, 3);
  EXPECT_EQ(st2.bytes_written, 3 * 4096);
  EXPECT_EQ(st2.bytes_d2h, 3 * 4096);
  ExpectRestoresMixed(**v, 2, t, t.host);
}

// Guards Note [Batched device copies]: a state of more tensors than one launch's parameter block
// holds (several launches), tensors of several pieces, unaligned sources (the byte path) and empty
// tensors, all views into one random device buffer, restore byte for byte.
TEST_F(CkptCuda, DeviceStagingBatchesThousandsOfTensors) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> off, len;
  int64_t total = 0;
  for (int i = 0; i < 2600; ++i) {
    const int64_t n = i % 500 == 7  ? (int64_t{5} << 20) + 77  // several 1 MiB pieces
                      : i % 97 == 3 ? 0
                                    : static_cast<int64_t>(rng() % 3000) + 1;
    const int64_t skew = i % 13 == 5 ? 3 : 0;  // unaligned source
    off.push_back(total + skew);
    len.push_back(n);
    total += (n + skew + 255) / 256 * 256;
  }
  auto host = RandomBytes(total, 29);
  DeviceBytes d;
  ASSERT_NO_FATAL_FAILURE(d.Init(host));
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < off.size(); ++i)
    refs.push_back(
        DeviceRef("t" + std::to_string(i), len[i], static_cast<uint8_t*>(d.ptr) + off[i]));
  VaultOptions o = SmallOpts();
  o.device_staging = DeviceStaging::kOn;
  auto v = CheckpointVault::Open(TempDir("cudabatch"), o);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE((*v)->Save(1, refs).ok());
  EXPECT_EQ((*v)->last_stats().snapshot_path, "device");
  ASSERT_TRUE((*v)->Wait().ok());
  d.Free();  // the restore below reads the checkpoint, not the device
  auto r = (*v)->Restore(1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), off.size());
  for (const HostTensor& t : *r) {
    const size_t i = std::stoul(t.info.name.substr(1));
    const auto* want = host.data() + off[i];
    ASSERT_TRUE(t.data == std::vector<uint8_t>(want, want + len[i])) << "tensor " << t.info.name;
  }
}

// Guards the fallback: with the arena above device_staging_max_bytes, auto stages on the host and
// says why; on refuses with ResourceExhausted and queues nothing.
// Guards the trainer's first-save latency: staging reserved ahead is what the first Save() takes
// (no allocation inside it), a second reservation allocates nothing, and the save restores.
TEST_F(CkptCuda, ReservedStagingIsTakenByTheFirstSave) {
  const int64_t n = 3 * 4096 + 100;
  auto host = RandomBytes(n, 91);
  DeviceBytes dev;
  ASSERT_NO_FATAL_FAILURE(dev.Init(host));
  void* d = dev.ptr;
  VaultOptions o = SmallOpts();
  o.device_staging = DeviceStaging::kOn;
  auto v = CheckpointVault::Open(TempDir("cudareserve"), o);
  ASSERT_TRUE(v.ok()) << v.status();
  std::string why;
  auto r = (*v)->ReserveDeviceStaging({DeviceRef("g", n, d)}, &why);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(*r, n) << why;
  EXPECT_EQ(why, "");
  r = (*v)->ReserveDeviceStaging({DeviceRef("g", n, d)}, &why);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 0);
  EXPECT_NE(why.find("large enough"), std::string::npos) << why;
  // "u" starts 3 bytes into the buffer (an unaligned source), and the second save needs more
  // arena than was reserved: the arena grows.
  ASSERT_TRUE((*v)->Save(1, {DeviceRef("g", n, d)}).ok());
  SaveStats st = (*v)->last_stats();
  EXPECT_EQ(st.snapshot_path, "device");
  EXPECT_EQ(st.staging_allocated, 0);
  EXPECT_NE(st.snapshot_reason.find("recycled"), std::string::npos) << st.snapshot_reason;
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestoresIntoDevice(**v, 1, "g", host);
  ASSERT_TRUE(
      (*v)->Save(2, {DeviceRef("g", n, d), DeviceRef("u", n - 3, static_cast<uint8_t*>(d) + 3)})
          .ok());
  ASSERT_TRUE((*v)->Wait().ok());
  ExpectRestoresIntoDevice(**v, 2, "g", host);
  ExpectRestoresIntoDevice(**v, 2, "u", std::vector<uint8_t>(host.begin() + 3, host.end()));
}

TEST_F(CkptCuda, DeviceStagingCapFallsBackToHostWithReason) {
  const int64_t n = 4 * 4096;
  auto host = RandomBytes(n, 77);
  DeviceBytes dev;
  ASSERT_NO_FATAL_FAILURE(dev.Init(host));
  void* d = dev.ptr;
  VaultOptions o = SmallOpts();
  o.device_staging_max_bytes = 4096;
  {
    auto v = CheckpointVault::Open(TempDir("cudacap"), o);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE((*v)->Save(1, {DeviceRef("g", n, d)}).ok());
    SaveStats st = (*v)->last_stats();
    EXPECT_EQ(st.snapshot_path, "host");
    EXPECT_NE(st.snapshot_reason.find("device_staging_max_bytes"), std::string::npos)
        << st.snapshot_reason;
    ASSERT_TRUE((*v)->Wait().ok());
    auto r = (*v)->Restore(1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE((*r)[0].data == host);
  }
  o.device_staging = DeviceStaging::kOn;
  auto v = CheckpointVault::Open(TempDir("cudacapon"), o);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)->Save(1, {DeviceRef("g", n, d)}).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE((*v)->Wait().ok());
  EXPECT_FALSE((*v)->Latest().has_value());
}

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
