// CUDA implementations of MemoryBackend (cudaMalloc'd segments) and StreamFence (cudaEvent).
// CPU twins: backend_cpu.cc. No kernels here.
#include <cuda_runtime_api.h>

#include <vector>

#include "common/cuda_check.h"
#include "loongforge/memory.h"

namespace loongforge {
namespace mem {
namespace {

// Sets `device` current for the scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

class CudaBackend : public MemoryBackend {
 public:
  CudaBackend(int device, size_t limit) : device_(device), limit_(limit) {}

  StatusOr<void*> Reserve(size_t bytes) override {
    if (limit_ > 0 && used_ + bytes > limit_) {
      return ResourceExhaustedError("MemSculptor limit of " + FormatBytes(limit_) +
                                    " on cuda:" + std::to_string(device_) + " reached (" +
                                    FormatBytes(used_) + " reserved)");
    }
    DeviceGuard g(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky, but clear it so later checks do not see it
      // Note [Out of memory in a step] (allocator.cc): say what the device had free.
      size_t free_bytes = 0, total_bytes = 0;
      std::string on_device;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        on_device = ", " + FormatBytes(static_cast<int64_t>(free_bytes)) + " free of " +
                    FormatBytes(static_cast<int64_t>(total_bytes));
      } else {
        cudaGetLastError();
      }
      return ResourceExhaustedError("cudaMalloc of " + FormatBytes(static_cast<int64_t>(bytes)) +
                                    " on cuda:" + std::to_string(device_) + " failed (" +
                                    FormatBytes(static_cast<int64_t>(used_)) +
                                    " reserved by MemSculptor" + on_device + ")");
    }
    if (err != cudaSuccess) {
      return ::loongforge::internal::CudaErrorToStatus(err, "cudaMalloc", __FILE__, __LINE__);
    }
    used_ += bytes;
    return p;
  }

  void Release(void* ptr, size_t bytes) override {
    DeviceGuard g(device_);
    LF_CUDA_WARN_IF_ERROR(cudaFree(ptr));  // synchronizes the device: no pending use survives
    used_ -= bytes;
  }

  std::string Name() const override {
    return "cuda:" + std::to_string(device_) + " (cudaMalloc, " + FormatBytes(used_) + " reserved" +
           (limit_ ? ", limit " + FormatBytes(limit_) : std::string()) + ")";
  }

 private:
  int device_;
  size_t limit_;
  size_t used_ = 0;
};

class CudaFence : public StreamFence {
 public:
  explicit CudaFence(int device) : device_(device) {}
  ~CudaFence() override {
    DeviceGuard g(device_);
    for (cudaEvent_t e : free_events_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(e));
  }

  FenceToken Record(StreamId stream) override {
    FenceToken t;
    t.stream = stream;
    DeviceGuard g(device_);
    cudaEvent_t e = nullptr;
    if (!free_events_.empty()) {
      e = free_events_.back();
      free_events_.pop_back();
    } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      // Without an event, fall back to the safest answer: the block waits for a device sync.
      LF_CUDA_WARN_IF_ERROR(cudaDeviceSynchronize());
      return t;  // value 0: passed
    }
    if (cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)) != cudaSuccess) {
      cudaGetLastError();
      LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
      free_events_.push_back(e);
      return t;
    }
    t.value = 1;
    t.handle = e;
    return t;
  }

  bool Passed(const FenceToken& t) override {
    if (t.value == 0) return true;
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(t.handle));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    if (err != cudaSuccess) cudaGetLastError();
    return true;
  }

  void Release(const FenceToken& t) override {
    if (t.handle) free_events_.push_back(static_cast<cudaEvent_t>(t.handle));
  }

 private:
  int device_;
  std::vector<cudaEvent_t> free_events_;  // guarded by the allocator's lock
};

}  // namespace

StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaBackend(int device, size_t limit_bytes) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return UnavailableError("MemSculptor: no CUDA device present");
  }
  if (device < 0 || device >= n) {
    return InvalidArgumentError("MemSculptor: device " + std::to_string(device) + " of " +
                                std::to_string(n));
  }
  return std::unique_ptr<MemoryBackend>(new CudaBackend(device, limit_bytes));
}

StatusOr<std::unique_ptr<StreamFence>> CreateCudaFence(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return UnavailableError("MemSculptor: no CUDA device present");
  }
  return std::unique_ptr<StreamFence>(new CudaFence(device));
}

}  // namespace mem
}  // namespace loongforge
