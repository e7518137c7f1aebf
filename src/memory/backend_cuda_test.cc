// GPU tests of MemSculptor: the CUDA backend and fence under MemAllocator, and the exported
// lf_alloc/lf_free and the control functions of the torch plug-in (torch_allocator.cc).
// Built only with CUDA (CMake); skipped without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <sys/types.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cuda_check.h"
#include "loongforge/memory.h"

namespace loongforge {
namespace mem {
namespace {

bool HaveDevice() { return ::loongforge::internal::CudaDevicePresent(); }

// Guards the CUDA backing: device memory from the pool is writable and reads back, and a block
// freed on one stream is reused by another only after its event has completed.
TEST(MemCuda, AllocatorOnDevice) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto backend = CreateCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto fence = CreateCudaFence(0);
  ASSERT_TRUE(fence.ok()) << fence.status();
  MemAllocator::Options o;
  o.segment_bytes = size_t{1} << 20;
  MemAllocator a(o, std::move(*backend), std::move(*fence));
  cudaStream_t s1, s2;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&s2), cudaSuccess);
  auto id1 = reinterpret_cast<StreamId>(s1), id2 = reinterpret_cast<StreamId>(s2);
  void* keep = *a.Allocate(1 << 20, id2);
  auto x = a.Allocate(1 << 20, id1);
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_EQ(cudaMemsetAsync(*x, 0x5a, 1 << 20, s1), cudaSuccess);
  std::vector<unsigned char> host(1 << 20);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), *x, host.size(), cudaMemcpyDeviceToHost, s1), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  EXPECT_EQ(host[12345], 0x5a);
  ASSERT_TRUE(a.Free(*x, id1).ok());
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);  // the event recorded at the free completes
  void* y = *a.Allocate(1 << 20, id2);
  EXPECT_EQ(y, *x) << "after the event passed, stream 2 may reuse stream 1's block";
  ASSERT_TRUE(a.Free(y, id2).ok());
  ASSERT_TRUE(a.Free(keep, id2).ok());
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// torch's two entry points (src/memory/torch_allocator.cc, linked into this binary as into _C).
extern "C" void* lf_alloc(ssize_t size, int device, cudaStream_t stream);
extern "C" void lf_free(void* ptr, ssize_t size, int device, cudaStream_t stream);

// The plug-in as torch and the bindings drive it: torch's entry points and the control functions.
// Its device state lives until process exit, like torch's allocator.
struct AllocLib {
  void* (*alloc)(ssize_t, int, cudaStream_t) = lf_alloc;
  void (*free)(void*, ssize_t, int, cudaStream_t) = lf_free;

  // A 256 MiB cap, read at the device's first use (the first test to get here sets it up).
  AllocLib() { setenv("LOONGFORGE_MEM_LIMIT_MB", "256", 1); }
  static std::string Stats(int device) {
    StatusOr<AllocatorStats> s = torch_plugin::Stats(device);
    if (!s.ok()) return s.status().ToString();
    return "reserved_bytes " + std::to_string(s->reserved_bytes) + " planned_hits " +
           std::to_string(s->planned_hits) + " planned_misses " + std::to_string(s->planned_misses);
  }
};

// Guards the torch plug-in ABI: lf_alloc/lf_free with torch's signatures work on the device,
// steps are planned after recording, and exhaustion throws with what was live.
TEST(MemCuda, PluggableAllocatorEntryPoints) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  AllocLib lib;

  auto step = [&](const char* sig) {
    EXPECT_TRUE(torch_plugin::BeginStep(0, sig).ok());
    void* a = lib.alloc(3 << 20, 0, nullptr);
    void* b = lib.alloc(1 << 20, 0, nullptr);
    EXPECT_EQ(cudaMemset(a, 1, 3 << 20), cudaSuccess);
    lib.free(a, 3 << 20, 0, nullptr);
    void* c = lib.alloc(2 << 20, 0, nullptr);
    EXPECT_EQ(cudaMemset(c, 2, 2 << 20), cudaSuccess);
    lib.free(b, 1 << 20, 0, nullptr);
    lib.free(c, 2 << 20, 0, nullptr);
  };
  ASSERT_TRUE(torch_plugin::StartRecording(0).ok());
  step("s");
  StatusOr<std::vector<Plan>> plans = torch_plugin::StopRecordingAndPlan(0, "");
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 1u);
  EXPECT_EQ((*plans)[0].signature, "s");
  step("s");
  step("s");
  std::string stats = AllocLib::Stats(0);
  EXPECT_NE(stats.find("planned_hits 6 "), std::string::npos) << stats;
  EXPECT_NE(stats.find("planned_misses 0"), std::string::npos) << stats;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  bool threw = false;
  try {
    lib.alloc(size_t{1} << 30, 0, nullptr);
  } catch (const std::bad_alloc& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(threw);
}

// Guards OOM on the device: an out-of-memory inside a step throws with the step's signature
// and the bytes asked for, the step is abandoned (EndStep says so), a smaller step follows,
// and Close returns every byte, reporting a leak only while an allocation is still held.
TEST(MemCuda, OutOfMemoryInStepThenClose) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  AllocLib lib;

  ASSERT_TRUE(torch_plugin::BeginStep(0, "oom").ok());
  void* a = lib.alloc(8 << 20, 0, nullptr);
  std::string what;
  try {
    lib.alloc(ssize_t{1} << 30, 0, nullptr);
  } catch (const std::bad_alloc& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("out of memory in step 'oom'"), std::string::npos) << what;
  EXPECT_NE(what.find("1073741824 bytes (1.0 GiB) requested"), std::string::npos) << what;
  lib.free(a, 8 << 20, 0, nullptr);
  StatusOr<bool> ended = torch_plugin::EndStep(0);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_FALSE(*ended) << "the step was abandoned";
  ASSERT_TRUE(torch_plugin::BeginStep(0, "small").ok());
  void* b = lib.alloc(1 << 20, 0, nullptr);
  EXPECT_EQ(cudaMemset(b, 3, 1 << 20), cudaSuccess);
  lib.free(b, 1 << 20, 0, nullptr);
  ended = torch_plugin::EndStep(0);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(*ended);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto closed = [] {
    StatusOr<int64_t> n = torch_plugin::Close(0);
    return n.ok() ? *n : int64_t{-1};
  };
  EXPECT_EQ(closed(), 0);
  std::string stats = AllocLib::Stats(0);
  EXPECT_NE(stats.find("reserved_bytes 0 "), std::string::npos) << stats;
  void* held = lib.alloc(1 << 20, 0, nullptr);
  EXPECT_EQ(closed(), 1);
  std::string last = torch_plugin::LastError();
  EXPECT_NE(last.find("closed with 1 live allocations"), std::string::npos) << last;
  lib.free(held, 1 << 20, 0, nullptr);
  EXPECT_EQ(closed(), 0);
}

// Run only as the child of NormalExitWithLiveAllocationIsQuiet: allocates, keeps the allocation
// and lets the process exit normally.
TEST(MemCuda, ExitWithLiveAllocationChild) {
  if (std::getenv("LF_MEM_EXIT_CHILD") == nullptr) GTEST_SKIP() << "child of another test";
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  AllocLib lib;
  ASSERT_NE(lib.alloc(4 << 20, 0, nullptr), nullptr);
  std::printf("child holds a live allocation at exit\n");
}

// Guards clean shutdown: a process that exits with allocations still live (tensors
// that live to the end) logs no live-allocation warning: the allocator state is never destroyed
// (Note [Process-lifetime state] in torch_allocator.cc).
TEST(MemCuda, NormalExitWithLiveAllocationIsQuiet) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  char exe[PATH_MAX] = {0};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof(exe) - 1), 0);
  std::string cmd = std::string("LF_MEM_EXIT_CHILD=1 '") + exe +
                    "' --gtest_filter=MemCuda.ExitWithLiveAllocationChild 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  int status = pclose(f);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("child holds a live allocation at exit"), std::string::npos) << out;
  EXPECT_EQ(out.find("live allocations"), std::string::npos) << out;
}

}  // namespace
}  // namespace mem
}  // namespace loongforge
