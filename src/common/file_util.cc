#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace loongforge {
namespace internal {

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open directory " + dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, "fsync directory " + dir);
  return Status::Ok();
}

StatusOr<int> OpenNewFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "create " + path);
  return fd;
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

StatusOr<TempFile> TempFile::CreateNextTo(const std::string& target) {
  size_t slash = target.find_last_of('/');
  std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  std::string prefix = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  if (base.empty()) return InvalidArgumentError("no file name in output path '" + target + "'");
  std::string templ = prefix + "." + base + ".tmp.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  // mkostemp creates with O_EXCL: a planted file or symlink of the same name makes it pick
  // another name, never open the planted one.
  int fd = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "create a temporary file next to " + target);
  ::fchmod(fd, 0644);
  return TempFile(fd, std::string(buf.data()));
}

TempFile::TempFile(TempFile&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
  other.path_.clear();
}

TempFile& TempFile::operator=(TempFile&& other) noexcept {
  if (this != &other) {
    Discard();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
    other.path_.clear();
  }
  return *this;
}

TempFile::~TempFile() { Discard(); }

void TempFile::Discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
}

Status TempFile::Write(std::string_view data) {
  if (fd_ < 0) return FailedPreconditionError("write to a closed temporary file " + path_);
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write " + path_);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status TempFile::Publish(const std::string& target) {
  if (fd_ < 0) return FailedPreconditionError("publish of a closed temporary file " + path_);
  if (::fsync(fd_) != 0) {
    Status s = ErrnoToStatus(errno, "fsync " + path_);
    Discard();
    return s;
  }
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    Status s = ErrnoToStatus(errno, "close " + path_);
    Discard();
    return s;
  }
  if (::rename(path_.c_str(), target.c_str()) != 0) {
    Status s = ErrnoToStatus(errno, "rename " + path_ + " to " + target);
    Discard();
    return s;
  }
  path_.clear();
  return SyncDir(DirName(target));
}

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  LF_ASSIGN_OR_RETURN(TempFile tmp, TempFile::CreateNextTo(path));
  LF_RETURN_IF_ERROR(tmp.Write(data));
  return tmp.Publish(path);
}

}  // namespace internal
}  // namespace loongforge
