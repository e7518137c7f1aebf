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

// A new temporary file in the directory of `target`, named ".<basename>.tmp.<pid>@<host>.XXXXXX"
// (see Note [Outputs are created, never followed]). Owns its descriptor; a TempFile that was not
// published removes its file when destroyed, so a failed write leaves nothing behind. A process
// killed before that leaves its file; the owner in the name lets the next CreateNextTo for the same
// target remove it once that process is gone (same host, pid no longer running), so a killed
// export costs its retry nothing. Files of live owners and of other hosts are left alone.
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

// Note [Only regular files are opened as files]
// A path read from a file or a command line may name a FIFO, a device, a socket or a directory.
// open() of a FIFO blocks until a writer appears, read() of a device never ends, and a directory
// reads as an I/O error deep inside a parser. Readers therefore open with O_NONBLOCK (so that
// open() of a FIFO returns at once), fstat() the descriptor (not the path, which could be swapped
// between the check and the open), refuse anything that is not a regular file naming the path and
// its kind, then clear O_NONBLOCK for ordinary reads.

// Opens `path` for reading and checks that it is a regular file (Note [Only regular files are
// opened as files]). Errors: NotFound, PermissionDenied (EACCES), InvalidArgument for a directory,
// FIFO, device or socket, each naming the path. Returns the descriptor; the caller closes it.
StatusOr<int> OpenRegularFile(const std::string& path);

// Reads all of the regular file `path` (OpenRegularFile's checks). A file larger than `max_bytes`
// is refused with ResourceExhausted naming the path and both sizes, before anything is allocated.
StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max_bytes);

// What an output path may be replaced by a tool's rename(): nothing, or (with `force`) a regular
// file. A directory, device, FIFO or socket is refused (InvalidArgument naming the path and its
// kind); an existing regular file without `force` is AlreadyExists. A symlink at `path` is refused
// too: rename() would replace the link, which surprises a user who meant its target.
Status CheckReplaceableOutput(const std::string& path, bool force);

// The kind of file `mode` describes, for errors: "directory", "FIFO", "character device", ...
const char* FileKindName(unsigned mode);

// This machine's host name ("unknown" when it has none). With a pid it names the owner of a
// staging file or directory, so that a later run can tell a dead owner's leftovers from a live one.
std::string HostName();

// Whether the staging owner "<pid>@<host>" (as written by a process of this library) is a process
// of this host that is no longer running. False for a live or unknown owner, or another host.
bool OwnerIsGone(std::string_view owner);

// The directory part of `path` ("." when it has none).
std::string DirName(const std::string& path);

}  // namespace internal
}  // namespace loongforge
