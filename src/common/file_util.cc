#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace internal
}  // namespace loongforge
