// CheckpointVault: opening and closing a vault, the read path (list, restore, verify, describe)
// and the public wrappers. Save is in snapshot.cc, the background writer in writer.cc, merge /
// gc / retention / export in lifecycle.cc (the map is in vault_impl.h, with Note [Vault layout]).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <new>

#include "ckpt/names.h"
#include "ckpt/vault_impl.h"
#include "common/file_util.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace ckpt {
using internal::ChunkRec;
using internal::Manifest;
using internal::TensorRec;

namespace internal {

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  return loongforge::internal::ReadRegularFile(path, static_cast<size_t>(kMaxManifestBytes));
}

StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, "open directory " + dir);
  std::vector<std::string> out;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoToStatus(err, "read directory " + dir);
  return out;
}

}  // namespace internal

CheckpointVault::Impl::Impl(std::string dir, VaultOptions opts)
    : dir_(std::move(dir)),
      opts_(std::move(opts)),
      queue_(std::max(1, opts_.max_inflight), "ckpt-writer") {
  if (!opts_.env) opts_.env = Env::Posix();
  man_dir_ = dir_ + "/manifests";
  seg_dir_ = dir_ + "/segments";
  encoder_ = std::make_unique<internal::ChunkEncoder>(internal::ChunkEncoder::Options{
      opts_.compress, opts_.compress_level, opts_.compress_max_ratio});
}

CheckpointVault::Impl::~Impl() {
  Status s = Close();
  if (!s.ok()) LF_LOG(ERROR) << "CheckpointVault " << dir_ << ": " << s;
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

namespace {

// Every VaultOptions field a caller sets, checked before anything is opened or created.
Status CheckOptions(const VaultOptions& o) {
  if (o.chunk_bytes < internal::kMinChunkBytes || o.chunk_bytes > internal::kMaxChunkBytes ||
      o.chunk_bytes % 64 != 0)
    return InvalidArgumentError(
        "chunk_bytes must be in [4096, 1073741824] and a multiple of 64, got " +
        std::to_string(o.chunk_bytes));
  if (o.compress_level < 1 || o.compress_level > ZSTD_maxCLevel())
    return InvalidArgumentError("compress_level must be in [1, " +
                                std::to_string(ZSTD_maxCLevel()) + "] (zstd's levels), got " +
                                std::to_string(o.compress_level));
  if (!(o.compress_max_ratio > 0 && o.compress_max_ratio <= 1))
    return InvalidArgumentError("compress_max_ratio must be in (0, 1], got " +
                                std::to_string(o.compress_max_ratio));
  if (o.keep_last < 0) return InvalidArgumentError("keep_last must be >= 0");
  if (o.keep_every < 0) return InvalidArgumentError("keep_every must be >= 0");
  if (o.max_inflight < 1) return InvalidArgumentError("max_inflight must be >= 1");
  if (o.io_threads < 0) return InvalidArgumentError("io_threads must be >= 0");
  if (o.wait_timeout_ms <= 0) return InvalidArgumentError("wait_timeout_ms must be > 0");
  if (o.device_staging_max_bytes < 0)
    return InvalidArgumentError("device_staging_max_bytes must be >= 0");
  if (o.d2h_buffer_bytes <= 0) return InvalidArgumentError("d2h_buffer_bytes must be > 0");
  return Status::Ok();
}

}  // namespace

Status CheckpointVault::Impl::Init() {
  LF_RETURN_IF_ERROR_CTX(CheckOptions(opts_), "checkpoint vault " + dir_);
  io_threads_ = opts_.io_threads > 0 ? opts_.io_threads : internal::DefaultIoThreads();
  if (!opts_.read_only) LF_RETURN_IF_ERROR(ChooseWriter());
  if (opts_.read_only) {
    // stat(2), not std::filesystem's throwing calls: an unreadable or odd path is a Status
    // naming it (EACCES -> PermissionDenied), never an exception.
    struct stat sb;
    if (::stat(man_dir_.c_str(), &sb) != 0) {
      if (errno == ENOENT)
        return NotFoundError(dir_ + " is not a checkpoint vault (no manifests/ directory)");
      return ErrnoToStatus(errno, "open checkpoint vault " + dir_ + " (stat " + man_dir_ + ")");
    }
    if (!S_ISDIR(sb.st_mode))
      return NotFoundError(dir_ + " is not a checkpoint vault (" + man_dir_ +
                           " is not a directory)");
    return Status::Ok();
  }
  std::error_code ec;
  std::filesystem::create_directories(man_dir_, ec);
  if (!ec) std::filesystem::create_directories(seg_dir_, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create vault directories in " + dir_);
  const std::string lock_path = dir_ + "/LOCK";
  // O_NOFOLLOW: a symlink planted at LOCK is refused, not opened (or created) at its target.
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return ErrnoToStatus(errno, "open " + lock_path);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return UnavailableError("checkpoint vault " + dir_ +
                            " is open for writing by another process (LOCK is held)");
  if (cufile_) LF_RETURN_IF_ERROR(ProbeCufile());
  // Seed change detection and the writer's chunk index from the latest committed checkpoint.
  if (auto latest = Latest()) {
    LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(*latest));
    IndexFrom(m, /*seed_known=*/true);
    last_step_ = *latest;
  }
  if (io_threads_ > 1) snap_pool_ = std::make_unique<ThreadPool>(io_threads_ - 1, "ckpt-snap");
  writer_ = std::thread([this] { WriterLoop(); });
  return Status::Ok();
}

// Note [cuFile writer] (chunk_sink.h): resolves opts_.writer into cufile_ and the stats text.
Status CheckpointVault::Impl::ChooseWriter() {
  switch (opts_.writer) {
    case Writer::kPosix:
      writer_reason_ = "writer=posix";
      return Status::Ok();
    case Writer::kAuto:
      writer_reason_ = internal::CufileCompiled()
                           ? "writer=auto: POSIX unless writer=cufile is asked for"
                           : "writer=auto: cufile: not built";
      return Status::Ok();
    case Writer::kCufile: {
      auto session = internal::OpenCufileSession();
      if (!session.ok()) return session.status().WithContext("writer=cufile");
      cufile_ = std::move(session).value();
      writer_reason_ = "writer=cufile, " + cufile_->mode();
      return Status::Ok();
    }
  }
  return InvalidArgumentError("unknown writer");
}

// writer=cufile: cuFile must take a file in the segments directory, or Open fails now instead
// of every checkpoint failing later in the background. libcufile refuses files on some volumes
// even in compat mode (e.g. in containers without udev data for the block device: cufile.log
// then says "unable to get volume attributes").
Status CheckpointVault::Impl::ProbeCufile() {
  // A random name: the sink creates a new file (O_EXCL), so a stale probe cannot block Open.
  const std::string probe = seg_dir_ + "/.cufile-probe-" + internal::NewSegmentName(0, "p");
  auto sink = cufile_->NewSink(probe);
  Status s = sink.ok() ? (*sink)->Close() : sink.status();
  ::unlink(probe.c_str());
  if (s.ok()) return s;
  return UnavailableError("writer=cufile: cuFile cannot write files in " + seg_dir_ + " (" +
                          s.message() +
                          "); cufile.log in the working directory has cuFile's reason; "
                          "use writer=posix or writer=auto");
}

// Frees a device staging arena (deregistering it from cuFile first).
void CheckpointVault::Impl::FreeDeviceArena(std::unique_ptr<internal::DeviceArena> a) {
  if (a && cufile_) cufile_->DeregisterBuffer(a->data());
  a.reset();
}

Status CheckpointVault::Impl::Wait() {
  std::lock_guard<std::mutex> api(api_mu_);
  return WaitLocked();
}

Status CheckpointVault::Impl::WaitLocked() {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, std::chrono::milliseconds(opts_.wait_timeout_ms),
                    [&] { return inflight_ == 0; }))
    return DeadlineExceededError("checkpoint writer still busy after " +
                                 std::to_string(opts_.wait_timeout_ms) + " ms");
  Status e = error_;
  if (!e.ok()) {
    error_ = Status::Ok();
    known_.clear();
  }
  return e;
}

Status CheckpointVault::Impl::Close() {
  std::lock_guard<std::mutex> api(api_mu_);
  if (closed_) return Status::Ok();
  Status s = writer_.joinable() ? WaitLocked() : Status::Ok();
  queue_.Close();
  if (writer_.joinable()) writer_.join();
  closed_ = true;
  // Device memory goes back now (the writer has stopped; no save is in flight).
  readers_.clear();
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [dev, fl] : free_dev_arenas_)
      for (auto& a : fl) FreeDeviceArena(std::move(a));
    free_dev_arenas_.clear();
  }
  device_snaps_.clear();
  cufile_.reset();      // deregisters what is left, closes the cuFile driver
  if (lock_fd_ >= 0) {  // let another writer in (and the file system be unmounted)
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  return s;
}

// Every committed step by manifest name, damaged manifests included (Summary / LoadManifest
// say what is wrong with one). Steps sort numerically, whatever the width of their names.
StatusOr<std::vector<int64_t>> CheckpointVault::Impl::List() const {
  LF_ASSIGN_OR_RETURN(auto names, internal::ListDirectory(man_dir_));
  std::vector<int64_t> steps;
  for (const auto& name : names) {
    int64_t step;
    if (internal::ParseManifestName(name, &step)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The newest step whose manifest loads. A damaged (or unreadable) newer manifest is skipped with
// a warning that names it and says why, so one bad file does not disable the vault (resume falls
// back to the newest good checkpoint).
std::optional<int64_t> CheckpointVault::Impl::Latest() const {
  auto l = List();
  if (!l.ok()) {
    LF_LOG(WARNING) << "checkpoint vault " << dir_ << ": " << l.status();
    return std::nullopt;
  }
  for (auto it = l->rbegin(); it != l->rend(); ++it) {
    auto m = LoadManifest(*it);
    if (m.ok()) return *it;
    LF_LOG(WARNING) << "checkpoint vault " << dir_ << ": skipping checkpoint " << *it << " ("
                    << m.status() << "); using an older checkpoint";
  }
  return std::nullopt;
}

StatusOr<Manifest> CheckpointVault::Impl::LoadManifest(int64_t step) const {
  if (step < 0)
    return InvalidArgumentError("checkpoint step must be >= 0, got " + std::to_string(step));
  const std::string path = man_dir_ + "/" + internal::ManifestName(step);
  auto bytes = internal::ReadWholeFile(path);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound)
      return NotFoundError("checkpoint " + std::to_string(step) + " not found in " + dir_);
    return bytes.status();
  }
  LF_ASSIGN_OR_RETURN(Manifest m, internal::ParseManifest(*bytes, path));
  if (m.step != step)
    return DataLossError("manifest " + path + ": step is " + std::to_string(m.step) +
                         " but the file name says " + std::to_string(step));
  return m;
}

// Decodes every chunk of `m` (or of the tensors in `only`) in one parallel pass (Note [Parallel
// read pass]). `dst(tensor)` gives the host address of a tensor's bytes, or null to decode into
// staging; `done(tensor, chunk, offset, data)` runs after each chunk's checksum verified.
template <typename DstFn, typename DoneFn>
Status CheckpointVault::Impl::ReadAll(const Manifest& m, const std::set<std::string>* only,
                                      DstFn dst, DoneFn done, const ProgressFn& progress,
                                      bool pinned_staging, bool prefault_dst) const {
  std::vector<internal::ReadItem> items;
  for (const auto& t : m.tensors) {
    if (only && !only->count(t.name)) continue;
    uint8_t* base = dst(t);
    int64_t off = 0;
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      items.push_back({&t, ci, off, base ? base + off : nullptr});
      off += t.chunks[ci].raw;
    }
  }
  internal::ReadPassOptions ro;
  ro.seg_dir = seg_dir_;
  ro.step = m.step;
  ro.threads = io_threads_;
  ro.pinned_staging = pinned_staging;
  ro.prefault_dst = prefault_dst;
  return internal::ParallelReadPass(
      std::move(items), ro,
      [&](const internal::ReadItem& it, const uint8_t* data) {
        return done(*it.t, it.ci, it.offset, data);
      },
      progress);
}

StatusOr<std::vector<HostTensor>> CheckpointVault::Impl::Restore(int64_t step,
                                                                 const ProgressFn& progress) const {
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  std::vector<HostTensor> out(m.tensors.size());
  std::unordered_map<const TensorRec*, HostTensor*> by;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    out[i].info = Info(m.tensors[i]);
    // nbytes was checked against shape and dtype, not against this machine's memory.
    LF_RETURN_IF_ERROR(internal::CheckHostBytes(
        m.tensors[i].nbytes,
        "restore checkpoint " + std::to_string(step) + ": tensor '" + m.tensors[i].name + "'"));
    try {
      out[i].data.resize(static_cast<size_t>(m.tensors[i].nbytes));
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("restore checkpoint " + std::to_string(step) + ": tensor '" +
                                    m.tensors[i].name + "' needs " +
                                    std::to_string(m.tensors[i].nbytes) +
                                    " bytes of host memory, which could not be allocated");
    }
    by[&m.tensors[i]] = &out[i];
  }
  LF_RETURN_IF_ERROR(ReadAll(
      m, nullptr, [&](const TensorRec& t) { return by[&t]->data.data(); },
      [](const TensorRec&, size_t, int64_t, const uint8_t*) { return Status::Ok(); }, progress));
  return out;
}

Status CheckpointVault::Impl::RestoreInto(int64_t step,
                                          const std::map<std::string, RestoreTarget>& targets,
                                          const ProgressFn& progress) const {
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  std::set<std::string> only;
  std::unordered_map<const TensorRec*, const RestoreTarget*> by;
  bool any_device = false;
  for (const auto& t : m.tensors) {
    auto it = targets.find(t.name);
    if (it == targets.end()) continue;
    if (it->second.nbytes != t.nbytes)
      return InvalidArgumentError("restore target for tensor '" + t.name + "' has " +
                                  std::to_string(it->second.nbytes) + " bytes, checkpoint has " +
                                  std::to_string(t.nbytes));
    if (t.nbytes > 0 && it->second.data == nullptr)
      return InvalidArgumentError("restore target for tensor '" + t.name + "' is null");
    if (it->second.device >= 0) {
      if (!internal::DeviceSupportCompiled())
        return UnimplementedError("restore target for tensor '" + t.name +
                                  "' is on a CUDA device but CUDA support is not compiled in");
      any_device = true;
    } else if (t.nbytes > 0) {
      internal::AdviseHugePages(it->second.data, static_cast<size_t>(t.nbytes));
    }
    only.insert(t.name);
    by[&t] = &it->second;
  }
  for (const auto& [name, _] : targets)
    if (!only.count(name))
      return NotFoundError("tensor '" + name + "' is not in checkpoint " + std::to_string(step));
  return ReadAll(
      m, &only,
      [&](const TensorRec& t) -> uint8_t* {
        const RestoreTarget* tg = by[&t];
        return tg->device >= 0 ? nullptr : static_cast<uint8_t*>(tg->data);
      },
      [&](const TensorRec& t, size_t ci, int64_t off, const uint8_t* p) -> Status {
        const RestoreTarget* tg = by[&t];
        if (tg->device < 0) return Status::Ok();
        return internal::HostToDevice(static_cast<uint8_t*>(tg->data) + off, p,
                                      static_cast<size_t>(t.chunks[ci].raw), tg->device);
      },
      progress, /*pinned_staging=*/any_device, /*prefault_dst=*/true);
}

Status CheckpointVault::Impl::Verify(int64_t step, const ProgressFn& progress) const {
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  return ReadAll(
      m, nullptr, [](const TensorRec&) -> uint8_t* { return nullptr; },
      [](const TensorRec&, size_t, int64_t, const uint8_t*) { return Status::Ok(); }, progress);
}

TensorInfo CheckpointVault::Impl::Info(const TensorRec& t) {
  return {t.name, DTypeName(t.dtype), t.shape, t.nbytes, static_cast<int64_t>(t.chunks.size())};
}

StatusOr<CheckpointSummary> CheckpointVault::Impl::Summary(int64_t step) const {
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  CheckpointSummary s;
  s.step = m.step;
  s.parent = m.parent;
  s.num_tensors = static_cast<int64_t>(m.tensors.size());
  s.created_unix = m.created_unix;
  auto segs = m.Segments();
  s.num_segments = static_cast<int64_t>(segs.size());
  char prefix[32];
  std::snprintf(prefix, sizeof(prefix), "seg-%012lld-", static_cast<long long>(step));
  std::set<std::pair<std::string, int64_t>> own;
  for (const auto& t : m.tensors) {
    s.bytes_total += t.nbytes;
    for (const auto& c : t.chunks)
      if (c.loc.seg.rfind(prefix, 0) == 0 && own.insert({c.loc.seg, c.loc.off}).second)
        s.bytes_own += c.loc.len;
  }
  return s;
}

SaveStats CheckpointVault::Impl::last_stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return last_stats_;
}

// ---------------- public wrappers ----------------

StatusOr<DeviceStaging> ParseDeviceStaging(const std::string& name) {
  if (name == "auto") return DeviceStaging::kAuto;
  if (name == "on") return DeviceStaging::kOn;
  if (name == "off") return DeviceStaging::kOff;
  return InvalidArgumentError("device_staging must be auto, on or off, got '" + name + "'");
}

StatusOr<Writer> ParseWriter(const std::string& name) {
  if (name == "auto") return Writer::kAuto;
  if (name == "posix") return Writer::kPosix;
  if (name == "cufile") return Writer::kCufile;
  return InvalidArgumentError("writer must be auto, posix or cufile, got '" + name + "'");
}

CheckpointVault::CheckpointVault(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointVault::~CheckpointVault() = default;

StatusOr<std::unique_ptr<CheckpointVault>> CheckpointVault::Open(const std::string& dir,
                                                                 const VaultOptions& opts) {
  auto impl = std::make_unique<Impl>(dir, opts);
  LF_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CheckpointVault>(new CheckpointVault(std::move(impl)));
}

Status CheckpointVault::Save(int64_t step, const std::vector<TensorRef>& t) {
  return impl_->Save(step, t);
}
StatusOr<bool> CheckpointVault::TrySave(int64_t step, const std::vector<TensorRef>& t) {
  bool queued = false;
  LF_RETURN_IF_ERROR(impl_->Save(step, t, /*wait_for_slot=*/false, &queued));
  return queued;
}
bool CheckpointVault::Busy() const { return impl_->Busy(); }
StatusOr<int64_t> CheckpointVault::ReserveDeviceStaging(const std::vector<TensorRef>& t,
                                                        std::string* why) {
  return impl_->ReserveDeviceStaging(t, why);
}
std::vector<SaveStats> CheckpointVault::TakeCommittedStats() { return impl_->TakeCommittedStats(); }
Status CheckpointVault::Wait() { return impl_->Wait(); }
Status CheckpointVault::Close() { return impl_->Close(); }
StatusOr<std::vector<int64_t>> CheckpointVault::List() const { return impl_->List(); }
std::optional<int64_t> CheckpointVault::Latest() const { return impl_->Latest(); }
StatusOr<CheckpointSummary> CheckpointVault::Summary(int64_t step) const {
  return impl_->Summary(step);
}
StatusOr<std::vector<TensorInfo>> CheckpointVault::Describe(int64_t step) const {
  LF_ASSIGN_OR_RETURN(Manifest m, impl_->LoadManifest(step));
  std::vector<TensorInfo> out;
  for (const auto& t : m.tensors) out.push_back(Impl::Info(t));
  return out;
}
StatusOr<std::vector<HostTensor>> CheckpointVault::Restore(int64_t step,
                                                           const ProgressFn& p) const {
  return impl_->Restore(step, p);
}
Status CheckpointVault::RestoreInto(int64_t step,
                                    const std::map<std::string, RestoreTarget>& targets,
                                    const ProgressFn& p) const {
  return impl_->RestoreInto(step, targets, p);
}
Status CheckpointVault::Verify(int64_t step, const ProgressFn& p) const {
  return impl_->Verify(step, p);
}
Status CheckpointVault::ExportSafetensors(int64_t step, const std::string& path, bool replace,
                                          const ProgressFn& p) const {
  ExportOptions opts;
  opts.replace = replace;
  return impl_->ExportSafetensors(step, path, opts, p);
}
Status CheckpointVault::ExportSafetensors(int64_t step, const std::string& path,
                                          const ExportOptions& opts, const ProgressFn& p) const {
  return impl_->ExportSafetensors(step, path, opts, p);
}
Status CheckpointVault::RestoreToDirectory(int64_t step, const std::string& out_dir, bool replace,
                                           const ProgressFn& p) const {
  return impl_->RestoreToDirectory(step, out_dir, replace, p);
}
Status CheckpointVault::Merge(int64_t step, const ProgressFn& p) { return impl_->Merge(step, p); }
Status CheckpointVault::ApplyRetention() { return impl_->ApplyRetention(); }
StatusOr<GcStats> CheckpointVault::Gc(bool dry_run) { return impl_->Gc(dry_run); }
SaveStats CheckpointVault::last_stats() const { return impl_->last_stats(); }
const std::string& CheckpointVault::dir() const { return impl_->dir(); }

}  // namespace ckpt
}  // namespace loongforge
