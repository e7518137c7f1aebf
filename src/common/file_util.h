// Small POSIX file helpers shared by the modules that publish files crash-consistently.
//
// Note [Outputs are created, never followed]
// Every file a tool writes is first created as a new temporary file next to its target, opened with
// O_CREAT | O_EXCL | O_NOFOLLOW (the name is random and must not exist yet, so neither a planted
// file nor a planted symlink is ever written through), filled, fsync()ed, then rename()d onto the
// target and the directory fsync()ed. rename() replaces a symlink at the target by the file; it
// does not write into the link's target. A tool deletes or replaces only paths of its own kind
// (a DB, a vault) and only when the user asked for it.
#pragma once

#include <string>
#include <string_view>

#include "loongforge/status.h"

namespace loongforge {
namespace internal {

// fsync()s directory `dir`, so that a rename or create inside it is durable. Errors name the
// directory (ENOSPC -> ResourceExhausted, ...).
Status SyncDir(const std::string& dir);

// Opens `path` as a new file for writing: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
// mode 0644 (umask applies). Fails with AlreadyExists if anything (a file, a directory, a symlink,
// dangling or not) is at `path`. Returns the file descriptor; the caller closes it.
StatusOr<int> OpenNewFile(const std::string& path);

// A new temporary file in the directory of `target`, named ".<basename>.tmp.XXXXXX" (see
// Note [Outputs are created, never followed]). Owns its descriptor; a TempFile that was not
// published removes its file when destroyed, so a failed write leaves nothing behind.
class TempFile {
 public:
  static StatusOr<TempFile> CreateNextTo(const std::string& target);
  TempFile(TempFile&& other) noexcept;
  TempFile& operator=(TempFile&& other) noexcept;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Writes all of `data` (retrying short writes and EINTR). Errors name the target.
  Status Write(std::string_view data);
  // fsync()s and closes the file, renames it onto `target` and fsync()s the directory. After
  // success the TempFile is empty. On failure the temporary file is removed.
  Status Publish(const std::string& target);
  // Closes and removes the temporary file now (also done by the destructor).
  void Discard();

 private:
  TempFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// Writes `data` to `path` through a TempFile: the file at `path` is either the old content or all
// of `data`, never a part, and a symlink at `path` is replaced, not followed.
Status WriteFileAtomic(const std::string& path, std::string_view data);

// The directory part of `path` ("." when it has none).
std::string DirName(const std::string& path);

}  // namespace internal
}  // namespace loongforge
