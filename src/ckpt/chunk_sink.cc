// POSIX chunk sink, and the cuFile session's stand-in where cuFile is not built.
#include "ckpt/chunk_sink.h"

namespace loongforge {
namespace ckpt {
namespace internal {
namespace {

class PosixChunkSink : public ChunkSink {
 public:
  explicit PosixChunkSink(std::unique_ptr<WritableFile> f) : f_(std::move(f)) {}
  Status AppendHost(const void* data, size_t len) override { return f_->Append(data, len); }
  Status AppendDevice(const void*, size_t, const std::string& what) override {
    return FailedPreconditionError("the POSIX writer cannot write device memory (" + what + ")");
  }
  Status Sync() override { return f_->Sync(); }
  Status Close() override { return f_->Close(); }

 private:
  std::unique_ptr<WritableFile> f_;
};

}  // namespace

std::unique_ptr<ChunkSink> NewPosixChunkSink(std::unique_ptr<WritableFile> file) {
  return std::make_unique<PosixChunkSink>(std::move(file));
}

#ifndef LOONGFORGE_WITH_CUFILE
bool CufileCompiled() { return false; }
StatusOr<std::unique_ptr<CufileSession>> OpenCufileSession() {
  return UnimplementedError(
      "cufile: not built (cufile.h / libcufile were not found when this build was configured)");
}
#endif

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
