#include "common/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "loongforge/logging.h"

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

std::string HostName() {
  char h[256] = {};
  if (::gethostname(h, sizeof(h) - 1) != 0 || h[0] == '\0') return "unknown";
  return h;
}

bool OwnerIsGone(std::string_view owner) {
  const size_t at = owner.find('@');
  if (at == 0 || at == std::string_view::npos || at > 9) return false;
  const std::string_view pid_s = owner.substr(0, at);
  if (pid_s.find_first_not_of("0123456789") != std::string_view::npos) return false;
  if (owner.substr(at + 1) != HostName()) return false;
  const pid_t pid = static_cast<pid_t>(std::strtol(std::string(pid_s).c_str(), nullptr, 10));
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

namespace {

// Removes the regular files "<stem><pid>@<host>.XXXXXX" in `dir` whose owner is gone
// (OwnerIsGone): what a killed writer of the same target left.
void RemoveStaleTempFiles(const std::string& dir, const std::string& stem) {
  DIR* d = ::opendir(dir.empty() ? "." : dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (name.size() <= stem.size() + 7 || name.compare(0, stem.size(), stem) != 0) continue;
    const std::string_view owner = name.substr(stem.size(), name.size() - stem.size() - 7);
    if (name[name.size() - 7] == '.' && OwnerIsGone(owner)) stale.emplace_back(name);
  }
  ::closedir(d);
  for (const auto& n : stale) {
    const std::string p = dir + n;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(p.c_str()) == 0)
      LF_LOG(WARNING) << "removed " << p << ", left by a writer that is no longer running";
  }
}

}  // namespace

StatusOr<TempFile> TempFile::CreateNextTo(const std::string& target) {
  size_t slash = target.find_last_of('/');
  std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  std::string prefix = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  if (base.empty()) return InvalidArgumentError("no file name in output path '" + target + "'");
  const std::string owner = std::to_string(::getpid()) + "@" + HostName();
  // The temporary name must fit NAME_MAX for any legal target name: a long base is cut
  // (mkostemp's random suffix keeps it unique). A host name is at most 64 bytes.
  const size_t fixed = std::string_view(".").size() + std::string_view(".tmp.").size() +
                       owner.size() + std::string_view(".XXXXXX").size();
  if (base.size() + fixed > NAME_MAX) base.resize(NAME_MAX - std::min<size_t>(fixed, NAME_MAX - 1));
  RemoveStaleTempFiles(prefix, "." + base + ".tmp.");
  std::string templ = prefix + "." + base + ".tmp." + owner + ".XXXXXX";
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
