// POSIX chunk sink (the cuFile one is cufile_writer.cc, or its stand-in cufile_writer_stub.cc).
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

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
