// CPU twins of the device pieces: HostBackend (an mmap'd range standing in for device memory) and
// CpuFence (a counter per stream standing in for cudaEvent). The CUDA twins are backend_cuda.cu
// (or, in builds without CUDA, the stand-ins of backend_cuda_stub.cc).
#include <sys/mman.h>

#include <cerrno>
#include <map>

#include "loongforge/logging.h"
#include "loongforge/memory.h"

namespace loongforge {
namespace mem {
namespace {

class HostBackend : public MemoryBackend {
 public:
  explicit HostBackend(size_t capacity) : capacity_(RoundUp(capacity)) {
    // MAP_NORESERVE: untouched pages cost nothing, so a large range can stand in for a GPU.
    void* p = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    LF_CHECK(p != MAP_FAILED) << "mmap of " << capacity_ << " bytes failed: errno " << errno;
    base_ = static_cast<char*>(p);
    free_[0] = capacity_;
  }
  ~HostBackend() override { ::munmap(base_, capacity_); }

  StatusOr<void*> Reserve(size_t bytes) override {
    bytes = RoundUp(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      size_t off = it->first, len = it->second;
      free_.erase(it);
      if (len > bytes) free_[off + bytes] = len - bytes;
      used_ += bytes;
      return static_cast<void*>(base_ + off);
    }
    return ResourceExhaustedError("host range exhausted: " + FormatBytes(bytes) + " requested, " +
                                  FormatBytes(capacity_ - used_) + " free of " +
                                  FormatBytes(capacity_) + " (fragmented into " +
                                  std::to_string(free_.size()) + " ranges)");
  }

  void Release(void* ptr, size_t bytes) override {
    bytes = RoundUp(bytes);
    size_t off = static_cast<size_t>(static_cast<char*>(ptr) - base_);
    LF_CHECK(off + bytes <= capacity_) << "release outside the host range";
    used_ -= bytes;
    auto [it, inserted] = free_.emplace(off, bytes);
    LF_CHECK(inserted) << "double release at offset " << off;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

  std::string Name() const override { return "host range of " + FormatBytes(capacity_); }

 private:
  size_t capacity_;
  char* base_ = nullptr;
  size_t used_ = 0;
  std::map<size_t, size_t> free_;  // offset -> length, coalesced
};

}  // namespace

std::unique_ptr<MemoryBackend> CreateHostBackend(size_t capacity_bytes) {
  return std::make_unique<HostBackend>(capacity_bytes);
}

FenceToken CpuFence::Record(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  FenceToken t;
  t.stream = stream;
  t.value = ++recorded_[stream];
  return t;
}

bool CpuFence::Passed(const FenceToken& token) {
  if (token.value == 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return completed_[token.stream] >= token.value;
}

void CpuFence::Complete(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  completed_[stream] = recorded_[stream];
}

}  // namespace mem
}  // namespace loongforge
