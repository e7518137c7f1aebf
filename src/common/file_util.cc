#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
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

const char* FileKindName(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "regular file";
    case S_IFDIR:
      return "directory";
    case S_IFIFO:
      return "FIFO";
    case S_IFCHR:
      return "character device";
    case S_IFBLK:
      return "block device";
    case S_IFSOCK:
      return "socket";
    case S_IFLNK:
      return "symlink";
    default:
      return "special file";
  }
}

StatusOr<int> OpenRegularFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + " is a " + FileKindName(st.st_mode) +
                                ", not a regular file");
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "fcntl " + path);
  }
  return fd;
}

StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max_bytes) {
  LF_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "stat " + path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return ResourceExhaustedError(path + ": " + std::to_string(size) + " bytes, more than the " +
                                  std::to_string(max_bytes) + " a file of this kind may have");
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "read " + path);
    }
    if (n == 0) break;  // shrank since fstat: return what is there
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

Status CheckReplaceableOutput(const std::string& path, bool force) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoToStatus(errno, "stat " + path);
  }
  if (S_ISREG(st.st_mode)) {
    if (force) return Status::Ok();
    return AlreadyExistsError(path + " exists; pass --force to replace it");
  }
  return InvalidArgumentError("output " + path + " is a " + FileKindName(st.st_mode) +
                              "; only a regular file may be replaced");
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
  // The temporary name must fit NAME_MAX (255) for any legal target name: a long base is cut
  // (mkostemp's random suffix keeps it unique).
  if (base.size() > 200) base.resize(200);
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
