// LMDB-backed record store: zero-copy reads from the memory map, atomic publication of new DBs.
// See include/loongforge/dataset.h for the layout.
#include <dirent.h>
#include <fcntl.h>
#include <lmdb.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>
#include <vector>

#include "common/file_util.h"
#include "dataset/lmdb_file.h"
#include "loongforge/dataset.h"
#include "loongforge/logging.h"

namespace loongforge::data {
namespace fs = std::filesystem;
namespace {

using internal::LmdbError;

template <typename T>
Status ReadVec(const nlohmann::json& j, const char* field, std::vector<T>* out,
               const std::string& where) {
  if (!j.contains(field)) return Status::Ok();
  if (!j[field].is_array())
    return DataLossError(where + ": schema field '" + field + "' is not a list");
  for (size_t i = 0; i < j[field].size(); ++i)
    if (!j[field][i].is_number())
      return DataLossError(where + ": schema field '" + field + "' item " + std::to_string(i) +
                           " is a " + j[field][i].type_name() + ", not a number");
  *out = j[field].get<std::vector<T>>();
  return Status::Ok();
}

// Field `field` of schema object `j` as a T, or `fallback` when absent (required: DataLoss). A
// value of another JSON type, or a number outside T, is DataLoss naming the field and the value.
template <typename T>
Status ReadField(const nlohmann::json& j, const char* field, T* out, const std::string& where,
                 bool required) {
  auto it = j.find(field);
  if (it == j.end()) {
    if (required) return DataLossError(where + ": schema record lacks the field '" + field + "'");
    return Status::Ok();
  }
  const nlohmann::json& v = *it;
  auto wrong = [&](const char* want) {
    std::string shown = v.dump();
    if (shown.size() > 80) shown = shown.substr(0, 80) + "...";
    return DataLossError(where + ": schema field '" + field + "' is " + shown + " (a " +
                         v.type_name() + "), expected " + want);
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return wrong("a string");
    *out = v.get<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return wrong("a number");
    *out = v.get<T>();
  } else {
    if (!v.is_number_integer()) return wrong("an integer");
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return wrong("a smaller integer");
      *out = static_cast<T>(u);
    } else {
      const int64_t x = v.get<int64_t>();
      if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          x > static_cast<int64_t>(std::numeric_limits<T>::max()))
        return wrong("a smaller integer");
      *out = static_cast<T>(x);
    }
  }
  return Status::Ok();
}

constexpr char kDataFile[] = "data.mdb";
constexpr char kLmdbLockFile[] = "lock.mdb";
constexpr char kWriterLockMarker[] = "loongforge record-store lock\n";

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `path` without trailing slashes; InvalidArgument for paths that cannot name a new directory.
StatusOr<std::string> OutputPath(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::string base = BaseName(p);
  if (p.empty() || p == "/" || base == "." || base == "..")
    return InvalidArgumentError("'" + path +
                                "': the output must name a new directory (or a LoongForge "
                                "dataset to replace), not '.', '..' or '/'");
  return p;
}

// The name a writer's lock file and staging directories beside output `base` start with: `base`
// itself, or, when "<base>.partial.XXXXXX" would not fit NAME_MAX, ".lf-" and the 16 hex digits
// of base's 64-bit FNV-1a hash (deterministic, so every writer of one output finds one lock).
std::string SidecarBase(const std::string& base) {
  if (base.size() + std::strlen(".partial.XXXXXX") <= NAME_MAX) return base;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : base) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return std::string(".lf-") + hex;
}

// `out`'s sidecar path: its folder, SidecarBase of its name, then `suffix`.
std::string SidecarPath(const std::string& out, const std::string& suffix) {
  const size_t slash = out.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : out.substr(0, slash + 1);
  return dir + SidecarBase(BaseName(out)) + suffix;
}

// Names a staging directory of `path` would have: SidecarBase + ".partial." + 6 mkdtemp
// characters.
bool IsStagingName(const std::string& name, const std::string& base) {
  const std::string prefix = SidecarBase(base) + ".partial.";
  return name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0;
}

// Entries of directory `dir` (no "." and ".."); errno-based Status naming it.
StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return ErrnoToStatus(errno, "list " + dir);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  int err = errno;
  ::closedir(d);
  if (err) return ErrnoToStatus(err, "list " + dir);
  return names;
}

// Ok if directory `dir` holds nothing but regular files named data.mdb / lock.mdb, i.e. only what
// LMDB writes; otherwise a reason naming the first other entry.
Status HoldsOnlyLmdbFiles(const std::string& dir) {
  LF_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  for (const auto& n : names) {
    struct stat st;
    std::string p = dir + "/" + n;
    if ((n != kDataFile && n != kLmdbLockFile) || ::lstat(p.c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode))
      return FailedPreconditionError("it holds '" + n + "', which pack does not write");
  }
  return Status::Ok();
}

// Removes a directory the writer created (a staging directory) or may replace (a verified DB):
// only LMDB's two files are unlinked, so anything else found inside keeps the directory, and that
// is reported rather than deleted.
Status RemoveLmdbDir(const std::string& dir) {
  for (const char* f : {kDataFile, kLmdbLockFile}) {
    std::string p = dir + "/" + f;
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "remove " + p);
  }
  if (::rmdir(dir.c_str()) != 0) return ErrnoToStatus(errno, "remove directory " + dir);
  return Status::Ok();
}

// The __schema__ JSON of the LMDB environment `path` (read-only, no lock file), without keeping
// the environment open.
StatusOr<std::string> ReadSchemaRecord(const std::string& path) {
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc) return LmdbError(rc, "mdb_env_create");
  struct EnvCloser {
    MDB_env* env;
    ~EnvCloser() { mdb_env_close(env); }
  } closer{env};
  rc = mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOLOCK | MDB_NORDAHEAD, 0444);
  if (rc) return LmdbError(rc, "open " + path);
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  if (rc) return LmdbError(rc, "begin read transaction on " + path);
  MDB_dbi dbi;
  MDB_val k{std::strlen(kSchemaKey), const_cast<char*>(kSchemaKey)}, v;
  rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  if (!rc) rc = mdb_get(txn, dbi, &k, &v);
  std::string json =
      rc ? std::string() : std::string(static_cast<const char*>(v.mv_data), v.mv_size);
  mdb_txn_abort(txn);
  if (rc) return LmdbError(rc, "read __schema__ of " + path);
  return json;
}

// Ok if `path` (which exists) is a LoongForge DB that overwrite may replace; AlreadyExists saying
// why not otherwise (RecordWriter's contract in dataset.h).
Status CheckReplaceable(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return AlreadyExistsError(path + " exists and is not a LoongForge dataset (" + why +
                              "); overwrite replaces only a dataset written by pack, never other "
                              "files: choose another output or remove it yourself");
  };
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  if (S_ISLNK(st.st_mode)) return refuse("it is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("it is not a directory");
  Status only = HoldsOnlyLmdbFiles(path);
  if (!only.ok()) return refuse(only.message());
  const std::string data = path + "/" + kDataFile;
  if (::lstat(data.c_str(), &st) != 0) return refuse("it has no data.mdb");
  auto file = internal::CheckLmdbDataFile(data);
  if (!file.ok()) return refuse("its data.mdb is damaged: " + file.status().message());
  auto schema = ReadSchemaRecord(path);
  if (!schema.ok()) return refuse("no readable __schema__ record: " + schema.status().message());
  nlohmann::json j = nlohmann::json::parse(*schema, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("format_version"))
    return refuse("its __schema__ record is not a LoongForge schema");
  return Status::Ok();
}

// The permission bits a plain mkdir would give (0777 minus the umask), read without changing
// the process umask (which other threads may rely on).
mode_t DirModeFromUmask() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Umask:", 0) == 0)
      return 0777 & ~static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  return 0755;
}

// This host's name, as the writer lock records it.
std::string LockHost() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  return host;
}

// The line after the marker of a writer lock: "pid <pid> host <hostname>\n".
std::string LockOwnerLine() {
  return "pid " + std::to_string(::getpid()) + " host " + LockHost() + "\n";
}

// Takes the writer lock of `out`: flock on "<out>.lock" (see RecordWriter). Returns the locked
// descriptor. The lock file is created with a marker line; an existing one is reused only if it
// is empty or carries the marker (a lock left by a killed writer), never a user's file.
StatusOr<int> LockOutput(const std::string& out, const std::string& lock) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    bool created = true;
    int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
      created = false;
      fd = ::open(lock.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) continue;  // its writer removed it just now
    }
    if (fd < 0) {
      if (errno == ELOOP)
        return AlreadyExistsError(lock +
                                  " is a symbolic link, not a LoongForge lock file: "
                                  "remove or rename it");
      return ErrnoToStatus(errno, "create lock file " + lock);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return AlreadyExistsError(lock +
                                " exists and is not a LoongForge lock file: remove or "
                                "rename it");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      char buf[512] = {};
      const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      const size_t m = std::strlen(kWriterLockMarker);
      holder = holder.compare(0, m, kWriterLockMarker) == 0 ? holder.substr(m) : "";
      if (!holder.empty() && holder.back() == '\n') holder.pop_back();
      ::close(fd);
      if (err == EWOULDBLOCK)
        return UnavailableError(out + " is being written by another pack or writer (its lock " +
                                lock + " is held" + (holder.empty() ? "" : " by " + holder) +
                                "): wait for it to finish or choose another output");
      return ErrnoToStatus(err, "lock " + lock);
    }
    // The previous holder removes the file before releasing it: hold the lock only if the name
    // still refers to the file we locked.
    struct stat now;
    if (::stat(lock.c_str(), &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev) {
      ::close(fd);
      continue;
    }
    const std::string owner = LockOwnerLine();
    if (!created && st.st_size > 0) {
      char buf[512] = {};
      ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      const std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      if (text.compare(0, std::strlen(kWriterLockMarker), kWriterLockMarker) != 0) {
        ::close(fd);
        return AlreadyExistsError(lock +
                                  " exists and is not a LoongForge lock file: remove or "
                                  "rename it");
      }
      // We hold the flock, so its writer on this host is gone (a killed pack): the lock is
      // stale and is taken over. One written on another host may belong to a live writer whose
      // flock this host does not see (NFS): refused, naming it.
      const std::string prev = text.substr(std::strlen(kWriterLockMarker));
      const size_t host_at = prev.find(" host ");
      const std::string prev_host = host_at == std::string::npos
                                        ? ""
                                        : prev.substr(host_at + 6, prev.find('\n') - host_at - 6);
      if (!prev_host.empty() && prev_host != LockHost()) {
        ::close(fd);
        return UnavailableError(out + " may be being written on host " + prev_host + " (its lock " +
                                lock + " says '" + prev.substr(0, prev.find('\n')) +
                                "'): remove the lock if no pack runs there");
      }
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, (kWriterLockMarker + owner).data(),
                   std::strlen(kWriterLockMarker) + owner.size(), 0) < 0) {
        Status s = ErrnoToStatus(errno, "write lock file " + lock);
        ::close(fd);
        return s;
      }
    } else if (::pwrite(fd, (kWriterLockMarker + owner).data(),
                        std::strlen(kWriterLockMarker) + owner.size(), 0) < 0) {
      Status s = ErrnoToStatus(errno, "write lock file " + lock);
      ::unlink(lock.c_str());
      ::close(fd);
      return s;
    }
    return fd;
  }
  return UnavailableError("could not lock " + lock + " (it was replaced repeatedly)");
}

void UnlockOutput(const std::string& lock, int fd) {
  if (fd < 0) return;
  ::unlink(lock.c_str());  // while still held: see LockOutput
  ::close(fd);
}

// Renames `from` to `to` only if `to` does not exist (renameat2 RENAME_NOREPLACE; on a
// filesystem without it, a check then rename(), safe here because the writer lock is held).
int RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) {
    errno = EEXIST;
    return -1;
  }
  return ::rename(from.c_str(), to.c_str());
}

// Staging directories of `out` left by a killed writer: removed under the writer lock, so none
// of them can belong to a live writer. Only directories of the staging name holding nothing but
// LMDB's files are removed.
void RemoveStaleStaging(const std::string& out) {
  const std::string dir = loongforge::internal::DirName(out), base = BaseName(out);
  auto names = ListDir(dir);
  if (!names.ok()) return;
  for (const auto& n : *names) {
    if (!IsStagingName(n, base)) continue;
    const std::string p = dir + "/" + n;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || !HoldsOnlyLmdbFiles(p).ok())
      continue;
    if (RemoveLmdbDir(p).ok())
      LF_LOG(WARNING) << "removed " << p << ", left by an interrupted pack";
  }
}

}  // namespace

std::string SampleKey(int64_t sample_id, std::string_view modality) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%08lld_", static_cast<long long>(sample_id));
  return std::string(buf).append(modality);
}

std::string CameraModality(std::string_view camera) { return std::string("cam_").append(camera); }

std::string Schema::ToJson() const {
  nlohmann::json j;
  j["format_version"] = format_version;
  j["num_samples"] = num_samples;
  j["num_episodes"] = num_episodes;
  j["cameras"] = cameras;
  j["image_width"] = image_width;
  j["image_height"] = image_height;
  j["state_dim"] = state_dim;
  j["action_dim"] = action_dim;
  j["action_horizon"] = action_horizon;
  j["tokenizer"] = tokenizer;
  j["vocab_size"] = vocab_size;
  j["max_tokens"] = max_tokens;
  j["state_mean"] = state_mean;
  j["state_std"] = state_std;
  j["state_min"] = state_min;
  j["state_max"] = state_max;
  j["action_mean"] = action_mean;
  j["action_std"] = action_std;
  j["action_min"] = action_min;
  j["action_max"] = action_max;
  j["source"] = source;
  if (!source_format.empty()) {
    j["source_format"] = source_format;
    j["fps"] = fps;
    j["state_q01"] = state_q01;
    j["state_q99"] = state_q99;
    j["action_q01"] = action_q01;
    j["action_q99"] = action_q99;
    j["source_meta"] = nlohmann::json::parse(source_meta.empty() ? "{}" : source_meta);
  }
  return j.dump(2);
}

StatusOr<Schema> Schema::FromJson(std::string_view json, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return DataLossError(where + ": schema record is not valid JSON");
  Schema s;
  LF_RETURN_IF_ERROR(ReadField(j, "format_version", &s.format_version, where, true));
  if (s.format_version != kDatasetFormatVersion)
    return FailedPreconditionError(where + ": dataset format version " +
                                   std::to_string(s.format_version) + ", this build reads " +
                                   std::to_string(kDatasetFormatVersion));
  LF_RETURN_IF_ERROR(ReadField(j, "num_samples", &s.num_samples, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "num_episodes", &s.num_episodes, where, false));
  if (!j.contains("cameras") || !j["cameras"].is_array())
    return DataLossError(where + ": schema field 'cameras' is missing or not a list");
  for (size_t i = 0; i < j["cameras"].size(); ++i) {
    if (!j["cameras"][i].is_string())
      return DataLossError(where + ": schema field 'cameras' item " + std::to_string(i) + " is a " +
                           j["cameras"][i].type_name() + ", not a camera name");
    s.cameras.push_back(j["cameras"][i].get<std::string>());
  }
  LF_RETURN_IF_ERROR(ReadField(j, "image_width", &s.image_width, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "image_height", &s.image_height, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "state_dim", &s.state_dim, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "action_dim", &s.action_dim, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "action_horizon", &s.action_horizon, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "tokenizer", &s.tokenizer, where, true));
  LF_RETURN_IF_ERROR(ReadField(j, "vocab_size", &s.vocab_size, where, false));
  LF_RETURN_IF_ERROR(ReadField(j, "max_tokens", &s.max_tokens, where, false));
  LF_RETURN_IF_ERROR(ReadField(j, "source", &s.source, where, false));
  LF_RETURN_IF_ERROR(ReadField(j, "source_format", &s.source_format, where, false));
  LF_RETURN_IF_ERROR(ReadField(j, "fps", &s.fps, where, false));
  if (j.contains("source_meta"))
    s.source_meta =
        j.at("source_meta").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  LF_RETURN_IF_ERROR(ReadVec(j, "state_mean", &s.state_mean, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "state_std", &s.state_std, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "state_min", &s.state_min, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "state_max", &s.state_max, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_mean", &s.action_mean, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_std", &s.action_std, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_min", &s.action_min, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_max", &s.action_max, where));
  if (!s.source_format.empty()) {
    LF_RETURN_IF_ERROR(ReadVec(j, "state_q01", &s.state_q01, where));
    LF_RETURN_IF_ERROR(ReadVec(j, "state_q99", &s.state_q99, where));
    LF_RETURN_IF_ERROR(ReadVec(j, "action_q01", &s.action_q01, where));
    LF_RETURN_IF_ERROR(ReadVec(j, "action_q99", &s.action_q99, where));
  }
  if (s.num_samples < 0 || s.state_dim < 0 || s.action_dim < 0 || s.action_horizon <= 0 ||
      s.cameras.empty() || s.vocab_size < 0 || s.max_tokens < 0)
    return DataLossError(where + ": schema record has invalid dimensions");
  std::set<std::string> names;
  for (const auto& c : s.cameras) {
    if (c.empty()) return DataLossError(where + ": schema field 'cameras' has an empty name");
    if (!names.insert(c).second)
      return DataLossError(where + ": schema field 'cameras' names camera '" + c +
                           "' twice (every camera is one record per sample)");
  }
  // A vocabulary of 0 ids admits no token: every sample would be refused one by one.
  if (j.contains("vocab_size") && s.vocab_size == 0 && s.num_samples > 0)
    return DataLossError(where + ": schema field 'vocab_size' is 0 for " +
                         std::to_string(s.num_samples) + " samples of tokenizer '" + s.tokenizer +
                         "': no token id would be valid");
  return s;
}

// ---------------------------------------------------------------------------------------------
// RecordReader

StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path,
                                                           int max_readers) {
  std::error_code ec;
  const std::string data = (fs::path(path) / kDataFile).string();
  struct stat data_st;
  if (::stat(data.c_str(), &data_st) != 0 && (errno == EACCES || errno == EPERM)) {
    // A folder the user may not search is not a missing dataset.
    return ErrnoToStatus(errno, path + ": cannot read the dataset (" + data +
                                    "); check the permissions of the folder and its parents");
  }
  if (!fs::exists(data, ec)) {
    // A writer stages the DB next to `path` (RecordWriter): say so rather than "not found".
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    auto names = ListDir(loongforge::internal::DirName(p));
    if (names.ok())
      for (const auto& n : *names)
        if (IsStagingName(n, BaseName(p)))
          return FailedPreconditionError(
              path + ": dataset is still being written (" + n +
              " exists next to it) or its packing was interrupted; re-run pack");
    if (!fs::exists(path, ec)) return NotFoundError(path + ": no LoongForge dataset here");
    return NotFoundError(path + ": no LoongForge dataset (missing data.mdb)");
  }
  // Note [Validating data.mdb before mapping]: a truncated file would raise SIGBUS later.
  LF_ASSIGN_OR_RETURN(internal::LmdbFileInfo file, internal::CheckLmdbDataFile(data));
  // Note [Walking the tree before a cursor does]: every lookup below follows page numbers LMDB
  // does not check, so the tree is walked once here; Begin() then refuses a file that changed.
  LF_RETURN_IF_ERROR(internal::CheckLmdbTree(data, file));
  std::unique_ptr<RecordReader> r(new RecordReader());
  r->path_ = path;
  r->data_file_ = data;
  r->opened_bytes_ = file.file_bytes;
  r->opened_txnid_ = file.meta[file.current].txnid;
  r->opened_last_page_ = file.meta[file.current].last_page;
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc) return LmdbError(rc, "mdb_env_create");
  r->env_ = env;
  mdb_env_set_maxreaders(env, static_cast<unsigned>(max_readers));
  // Read-only, no lock file: the DB is immutable once packed, so readers need no coordination,
  // and a process forked from the opener can open its own environment without touching locks.
  // MDB_NOTLS lets one thread hold several transactions.
  rc = mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS | MDB_NORDAHEAD, 0444);
  if (rc) return LmdbError(rc, "open dataset " + path);
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  if (rc) return LmdbError(rc, "begin read transaction on " + path);
  MDB_dbi dbi;
  rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  if (rc) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "open main database of " + path);
  }
  r->dbi_ = dbi;
  MDB_val k{std::strlen(kSchemaKey), const_cast<char*>(kSchemaKey)}, v;
  rc = mdb_get(txn, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) {
    mdb_txn_abort(txn);
    return FailedPreconditionError(path +
                                   ": dataset is incomplete (no __schema__ record); re-run pack");
  }
  if (rc) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "read __schema__ of " + path);
  }
  auto schema =
      Schema::FromJson(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size), path);
  if (!schema.ok()) {
    mdb_txn_abort(txn);
    return schema.status();
  }
  Status records = CheckSchemaRecords(txn, dbi, *schema, path);
  mdb_txn_abort(txn);
  LF_RETURN_IF_ERROR(records);
  r->schema_ = std::move(schema).value();
  return r;
}

// Note [Schema against the records]: num_samples sizes the sampler's permutation and every
// per-sample lookup, so a schema claiming more samples than the DB holds would allocate for
// samples that do not exist (1e12 of them: bad_alloc) or fail record by record. Each sample has
// at least its token, state, action, action-mask and camera records; the count is checked
// against the DB's entries, and the last sample's records must exist.
Status RecordReader::CheckSchemaRecords(void* txn, unsigned dbi, const Schema& s,
                                        const std::string& path) {
  MDB_stat st;
  int rc = mdb_stat(static_cast<MDB_txn*>(txn), dbi, &st);
  if (rc) return LmdbError(rc, "stat main database of " + path);
  if (s.num_samples == 0) return Status::Ok();
  const uint64_t per_sample = 4 + s.cameras.size();
  const uint64_t records = st.ms_entries > 0 ? st.ms_entries - 1 : 0;  // without __schema__
  if (static_cast<uint64_t>(s.num_samples) > records / per_sample)
    return DataLossError(path + ": schema field 'num_samples' is " + std::to_string(s.num_samples) +
                         " but the DB holds " + std::to_string(records) +
                         " records, enough for at most " + std::to_string(records / per_sample) +
                         " samples of " + std::to_string(per_sample) + " records");
  std::vector<std::string> mods = {"tokens", "state", "action", "amask"};
  for (const auto& c : s.cameras) mods.push_back(CameraModality(c));
  for (const auto& m : mods) {
    const std::string key = SampleKey(s.num_samples - 1, m);
    MDB_val k{key.size(), const_cast<char*>(key.data())}, v;
    rc = mdb_get(static_cast<MDB_txn*>(txn), dbi, &k, &v);
    if (rc == MDB_NOTFOUND)
      return DataLossError(path + ": schema field 'num_samples' is " +
                           std::to_string(s.num_samples) + " but the last sample's record '" + key +
                           "' does not exist");
    if (rc) return LmdbError(rc, path + ": read record '" + key + "'");
  }
  return Status::Ok();
}

// Note [A DB changed under its reader]: the map is read-only and LMDB trusts it; a data.mdb cut
// short under a live reader raises SIGBUS on the first page past the new end, one overwritten
// (zeros, another pack copied over it) makes LMDB assert or read garbage. Before every read
// transaction the reader compares the file with what it opened (size, the current meta page's
// txnid and last page, and the meta checks of Note [Validating data.mdb before mapping]): any
// change is DataLoss naming data.mdb, raised before a page is touched. Residual race: a change
// after the check and before the transaction's reads end still faults; the check narrows the
// window to one batch's reads, it cannot close it (a copy-on-write snapshot or a private copy
// would).
Status RecordReader::CheckUnchanged() const {
  auto file = internal::CheckLmdbDataFile(data_file_);
  if (!file.ok())
    return DataLossError(path_ + ": data.mdb changed while the dataset was open (" +
                         file.status().message() +
                         "); a DB must not be rewritten or truncated "
                         "while a loader reads it");
  const auto& m = file->meta[file->current];
  if (file->file_bytes != opened_bytes_ || m.txnid != opened_txnid_ ||
      m.last_page != opened_last_page_)
    return DataLossError(data_file_ + ": changed while the dataset was open (size " +
                         std::to_string(opened_bytes_) + " -> " + std::to_string(file->file_bytes) +
                         " bytes, LMDB txnid " + std::to_string(opened_txnid_) + " -> " +
                         std::to_string(m.txnid) +
                         "); a DB must not be rewritten or truncated while a loader reads it");
  return Status::Ok();
}

RecordReader::~RecordReader() {
  if (env_) mdb_env_close(static_cast<MDB_env*>(env_));
}

int64_t RecordReader::size_bytes() const {
  std::error_code ec;
  auto n = fs::file_size(fs::path(path_) / "data.mdb", ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

StatusOr<RecordReader::Txn> RecordReader::Begin() const {
  LF_RETURN_IF_ERROR(CheckUnchanged());
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(static_cast<MDB_env*>(env_), nullptr, MDB_RDONLY, &txn);
  if (rc) return LmdbError(rc, "begin read transaction on " + path_);
  return Txn(txn, dbi_, &path_, this);
}

RecordReader::Txn::~Txn() {
  if (txn_) mdb_txn_abort(static_cast<MDB_txn*>(txn_));
}

RecordReader::Txn::Txn(Txn&& o) noexcept
    : txn_(o.txn_), dbi_(o.dbi_), path_(o.path_), reader_(o.reader_) {
  o.txn_ = nullptr;
}

StatusOr<std::string_view> RecordReader::Txn::Get(std::string_view key) const {
  MDB_val k{key.size(), const_cast<char*>(key.data())}, v;
  int rc = mdb_get(static_cast<MDB_txn*>(txn_), dbi_, &k, &v);
  if (rc == MDB_NOTFOUND)
    return NotFoundError(*path_ + ": missing record '" + std::string(key) + "'");
  if (rc) return LmdbError(rc, *path_ + ": read record '" + std::string(key) + "'");
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

Status RecordReader::Txn::Renew() {
  if (reader_) LF_RETURN_IF_ERROR(reader_->CheckUnchanged());
  mdb_txn_reset(static_cast<MDB_txn*>(txn_));
  int rc = mdb_txn_renew(static_cast<MDB_txn*>(txn_));
  if (rc) return LmdbError(rc, "renew read transaction on " + *path_);
  return Status::Ok();
}

StatusOr<std::vector<std::string>> RecordReader::Keys() const {
  // Note [Walking the tree before a cursor does]
  LF_ASSIGN_OR_RETURN(internal::LmdbFileInfo file, internal::CheckLmdbDataFile(data_file_));
  LF_RETURN_IF_ERROR(internal::CheckLmdbTree(data_file_, file));
  LF_ASSIGN_OR_RETURN(Txn txn, Begin());
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(static_cast<MDB_txn*>(txn.txn_), dbi_, &cur);
  if (rc) return LmdbError(rc, "open cursor on " + path_);
  std::vector<std::string> keys;
  MDB_val k, v;
  while ((rc = mdb_cursor_get(cur, &k, &v, keys.empty() ? MDB_FIRST : MDB_NEXT)) == 0)
    keys.emplace_back(static_cast<const char*>(k.mv_data), k.mv_size);
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND) return LmdbError(rc, "iterate keys of " + path_);
  return keys;
}

// ---------------------------------------------------------------------------------------------
// RecordWriter

StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Create(const std::string& path,
                                                             bool overwrite,
                                                             int64_t map_size_bytes) {
  LF_ASSIGN_OR_RETURN(std::string out, OutputPath(path));
  // Missing parent folders are made, as `mkdir -p` would (the lock file and the staging
  // directory live beside the output).
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec)
    return ErrnoToStatus(ec.value(), "create the folder " + parent.string() + " of " + out);
  std::unique_ptr<RecordWriter> w(new RecordWriter());
  w->path_ = out;
  w->overwrite_ = overwrite;
  w->lock_path_ = SidecarPath(out, ".lock");
  LF_ASSIGN_OR_RETURN(w->lock_fd_, LockOutput(out, w->lock_path_));
  // From here the destructor releases the lock and removes the staging directory.
  struct stat st;
  if (::lstat(out.c_str(), &st) == 0) {
    if (!overwrite)
      return AlreadyExistsError(out +
                                " already exists (use --overwrite / overwrite=True to "
                                "replace a LoongForge dataset)");
    LF_RETURN_IF_ERROR(CheckReplaceable(out));
  } else if (errno != ENOENT) {
    return ErrnoToStatus(errno, "stat " + out);
  }
  RemoveStaleStaging(out);
  std::string templ = SidecarPath(out, ".partial.XXXXXX");
  if (!::mkdtemp(templ.data()))
    return ErrnoToStatus(errno, "create a staging directory for " + out);
  w->staging_ = templ;
  ::chmod(w->staging_.c_str(), DirModeFromUmask());  // mkdtemp makes it 0700
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc) return LmdbError(rc, "mdb_env_create");
  w->env_ = env;
  mdb_env_set_mapsize(env, static_cast<size_t>(map_size_bytes));
  // MDB_NOSYNC during the bulk load: Commit() does one mdb_env_sync(force) before publishing.
  rc = mdb_env_open(env, w->staging_.c_str(), MDB_NOSYNC | MDB_NOMETASYNC, 0644);
  if (rc) return w->WriteError(rc, "create dataset in " + w->staging_);
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env, nullptr, 0, &txn);
  if (rc) return LmdbError(rc, "begin write transaction");
  MDB_dbi dbi;
  rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  if (rc) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "open main database");
  }
  w->dbi_ = dbi;
  w->txn_ = txn;
  return w;
}

RecordWriter::~RecordWriter() {
  if (txn_) mdb_txn_abort(static_cast<MDB_txn*>(txn_));
  if (env_) mdb_env_close(static_cast<MDB_env*>(env_));
  if (!committed_ && !staging_.empty()) {
    Status s = RemoveLmdbDir(staging_);
    if (!s.ok()) LF_LOG(WARNING) << "could not remove the staging directory: " << s;
  }
  UnlockOutput(lock_path_, lock_fd_);
}

Status RecordWriter::WriteError(int rc, const std::string& what) const {
  int fd = -1;
  if (env_) mdb_env_get_fd(static_cast<MDB_env*>(env_), &fd);
  return internal::LmdbWriteError(
      rc, fd, what + " (" + staging_ + "/" + kDataFile + ", staged for " + path_ + ")");
}

Status RecordWriter::FlushTxn() {
  int rc = mdb_txn_commit(static_cast<MDB_txn*>(txn_));
  txn_ = nullptr;
  if (rc) return WriteError(rc, "commit records");
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(static_cast<MDB_env*>(env_), nullptr, 0, &txn);
  if (rc) return LmdbError(rc, "begin write transaction");
  txn_ = txn;
  pending_ = 0;
  return Status::Ok();
}

Status RecordWriter::Put(std::string_view key, std::string_view value) {
  if (committed_ || !txn_) return FailedPreconditionError("RecordWriter used after Commit/failure");
  if (key == kSchemaKey) return InvalidArgumentError("the schema record is written by Commit()");
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  int rc = mdb_put(static_cast<MDB_txn*>(txn_), dbi_, &k, &v, 0);
  if (rc) {
    mdb_txn_abort(static_cast<MDB_txn*>(txn_));
    txn_ = nullptr;
    return WriteError(rc, "write record '" + std::string(key) + "'");
  }
  bytes_ += static_cast<int64_t>(key.size() + value.size());
  if (++pending_ >= 512) return FlushTxn();
  return Status::Ok();
}

Status RecordWriter::Commit(const Schema& schema) {
  if (committed_ || !txn_) return FailedPreconditionError("RecordWriter used after Commit/failure");
  std::string js = schema.ToJson();
  MDB_val k{std::strlen(kSchemaKey), const_cast<char*>(kSchemaKey)};
  MDB_val v{js.size(), js.data()};
  int rc = mdb_put(static_cast<MDB_txn*>(txn_), dbi_, &k, &v, 0);
  if (rc) return WriteError(rc, "write the schema record");
  rc = mdb_txn_commit(static_cast<MDB_txn*>(txn_));
  txn_ = nullptr;
  if (rc) return WriteError(rc, "commit");
  // Note [Validating data.mdb before mapping]: readers require the file to hold every page up to
  // mm_last_pg; LMDB leaves it shorter when the last pages are free, so extend it (sparse).
  MDB_env* env = static_cast<MDB_env*>(env_);
  MDB_envinfo info;
  MDB_stat stat;
  int fd = -1;
  mdb_env_info(env, &info);
  mdb_env_stat(env, &stat);
  mdb_env_get_fd(env, &fd);
  const off_t need = static_cast<off_t>((info.me_last_pgno + 1) * stat.ms_psize);
  struct stat st;
  if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_size < need && ::ftruncate(fd, need) != 0)
    return WriteError(errno, "extend to " + std::to_string(need) + " bytes");
  rc = mdb_env_sync(env, 1);
  if (rc) return WriteError(rc, "sync");
  mdb_env_close(env);
  env_ = nullptr;
  // The lock file is not part of the dataset (readers open with MDB_NOLOCK).
  const std::string lmdb_lock = staging_ + "/" + kLmdbLockFile;
  if (::unlink(lmdb_lock.c_str()) != 0 && errno != ENOENT)
    return ErrnoToStatus(errno, "remove " + lmdb_lock);
  LF_RETURN_IF_ERROR(loongforge::internal::SyncDir(staging_));
  LF_RETURN_IF_ERROR(Publish());
  return loongforge::internal::SyncDir(loongforge::internal::DirName(path_));
}

// Renames the staging directory to path_ (the writer lock is held, so only a user can have
// changed path_ since Create: it is checked again).
Status RecordWriter::Publish() {
  struct stat st;
  if (::lstat(path_.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, "stat " + path_);
    if (RenameNoReplace(staging_, path_) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY)
        return AlreadyExistsError(path_ +
                                  " appeared while the dataset was written; the new "
                                  "dataset was not published");
      return ErrnoToStatus(errno, "rename " + staging_ + " to " + path_);
    }
    committed_ = true;
    return Status::Ok();
  }
  if (!overwrite_)
    return AlreadyExistsError(path_ +
                              " appeared while the dataset was written; the new dataset "
                              "was not published");
  LF_RETURN_IF_ERROR(CheckReplaceable(path_));
  // Swap atomically: path_ gets the new DB, staging_ the old one, which is then removed.
  std::string old = staging_;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS)
      return ErrnoToStatus(errno, "exchange " + staging_ + " and " + path_);
    // No RENAME_EXCHANGE on this filesystem: move the old DB aside onto a new empty directory
    // (rename replaces an empty directory), then move the new one in.
    std::string aside = path_ + ".old.XXXXXX";
    if (!::mkdtemp(aside.data()))
      return ErrnoToStatus(errno, "create a directory next to " + path_);
    if (::rename(path_.c_str(), aside.c_str()) != 0) {
      Status s = ErrnoToStatus(errno, "rename " + path_ + " to " + aside);
      ::rmdir(aside.c_str());
      return s;
    }
    if (::rename(staging_.c_str(), path_.c_str()) != 0) {
      Status s = ErrnoToStatus(errno, "rename " + staging_ + " to " + path_);
      ::rename(aside.c_str(), path_.c_str());  // put the old DB back
      return s;
    }
    old = aside;
  }
  committed_ = true;
  Status removed = RemoveLmdbDir(old);
  if (!removed.ok()) LF_LOG(WARNING) << "the replaced dataset was not removed: " << removed;
  return Status::Ok();
}

Status CheckTokens(std::string_view record, const Schema& schema, const std::string& db_path,
                   std::string_view key) {
  if (record.size() % sizeof(int32_t) != 0)
    return DataLossError(db_path + ": record '" + std::string(key) + "' has " +
                         std::to_string(record.size()) +
                         " bytes, not a whole number of int32 token ids");
  const size_t n = record.size() / sizeof(int32_t);
  for (size_t i = 0; i < n; ++i) {
    int32_t id;
    std::memcpy(&id, record.data() + i * sizeof(int32_t), sizeof(id));  // maybe unaligned
    if (id < 0 || (schema.vocab_size > 0 && id >= schema.vocab_size))
      return DataLossError(db_path + ": record '" + std::string(key) + "': token id " +
                           std::to_string(id) + " at position " + std::to_string(i) +
                           " is outside the vocabulary [0, " + std::to_string(schema.vocab_size) +
                           ") of tokenizer '" + schema.tokenizer + "'");
  }
  return Status::Ok();
}

}  // namespace loongforge::data
