// POSIX Env for CheckpointVault: write(2) loops, fsync of files and directories.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/file_util.h"
#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {
namespace {

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(const void* data, size_t len) override {
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      ssize_t n = ::write(fd_, p, len);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "write " + path_);
      }
      p += n;
      len -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync " + path_);
    return Status::Ok();
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ErrnoToStatus(errno, "close " + path_);
    return Status::Ok();
  }

 private:
  int fd_;
  std::string path_;
};

class PosixEnv : public Env {
 public:
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    LF_ASSIGN_OR_RETURN(int fd, loongforge::internal::OpenNewFile(path));
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return ErrnoToStatus(errno, "rename " + from + " -> " + to);
    return Status::Ok();
  }
  Status SyncDir(const std::string& dir) override { return internal::SyncDir(dir); }
  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return ErrnoToStatus(errno, "remove " + path);
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<Env> Env::Posix() {
  static std::shared_ptr<Env> env = std::make_shared<PosixEnv>();
  return env;
}

}  // namespace ckpt
}  // namespace loongforge
