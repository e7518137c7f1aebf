// CheckpointVault: snapshot, background writer, restore, lifecycle.
//
// Note [Vault layout]
//   DIR/LOCK                           flock'ed by the one writable opener
//   DIR/manifests/ckpt-<step:012>.manifest   committed checkpoints (self-checking, see manifest.h)
//   DIR/segments/seg-<step:012>-<rand>.lfs   packed, append-only chunk data of one save (or merge)
// A save appends the chunks no earlier checkpoint stores (by XXH3-128) to one new segment, fsyncs
// it and the directory, then commits the manifest: write temp, fsync, rename, fsync directory. A
// segment no manifest references is garbage (a crashed save); gc deletes it. Restore reads every
// chunk's stored location directly (no replay); an XOR-delta chunk names its full base chunk, so a
// restore reads at most two stored chunks for one. Segments give one data file (one fsync) per
// save and sequential reads on restore; gc works per segment, and merge rewrites a checkpoint into
// one segment of its own so that older ones can be dropped.
//
// Note [Snapshot]
// Save() must return only once its copy of the state is consistent: the caller may overwrite its
// tensors right after. The snapshot therefore hashes every chunk straight from the caller's memory
// (CPU tensors on io_threads workers, device tensors with the batched device snapshot, Note
// [Device snapshot] in device.h), then copies only the chunks the previous snapshot did not have
// (first occurrence only) into a staging arena. Arenas are recycled (at most max_inflight exist)
// and are sized by the bytes copied, so steady-state saves touch no new memory; a fresh arena is
// pre-faulted in bulk by the worker that fills it (Note [Fresh memory] in chunk_io.cc). When
// nothing is known (first save into an empty vault, or after a failed save) every chunk is copied,
// so hash and copy are fused into one pass over the source. Device snapshots stage into pinned
// memory with asynchronous copies ordered after the producer's stream.
//
// Note [Device staging]
// Hashing device tensors before Save() returns costs a host wait for the GPU, and copying the
// changed chunks to the host costs a PCIe transfer of them (3.2 s for 6.4 GB of fine-tune state on
// an H200). With device staging Save() instead only enqueues, on the vault's stream of each
// device (ordered after the producer streams, Note [Device snapshot] in device.h), one
// device-to-device copy per tensor into a recycled DeviceArena (tensors back to back, 256-byte
// aligned), records the arena's ready event and returns. The copy runs at HBM speed (~3 ms per
// 6.4 GB on an H200), so every device tensor is copied, frozen ones included: hashing first would
// need either a host wait for the hashes or a caller stream that waits for the hash kernel too.
// The writer thread then hashes the staged copy on the device (StagingReader, its own stream,
// after the ready event), resolves the hashes against the latest committed manifest and copies
// only the chunks it must write to the host, through two pinned buffers of d2h_buffer_bytes
// (double-buffered: the next batch transfers while the current one is compressed and written).
// So a fine-tune save still writes only changed chunks, and host pinned memory stays bounded.
//   Arenas: one per device per queued save, taken by Save() and returned by the writer after
//   its last read of them (the reader waits for its transfers), so at most max_inflight arenas
//   per device exist and none is overwritten while a writer reads it; recycled across saves
//   (grown, never shrunk) and freed by Close(). device_staging (auto|on|off) and
//   device_staging_max_bytes choose the path; stats name it (snapshot_path, snapshot_reason).
//
// Note [Caller stream waits]
// Save() returns before the device-to-device copy ran. The contract lets the caller modify its
// tensors right after Save() returns, and its next kernels go to the same stream (TensorRef::
// stream, the current stream in Python). So Publish makes each producer stream wait for the
// arena's ready event (cudaStreamWaitEvent): the host is not blocked, but the caller's later work
// on that stream starts only after the snapshot copy finished, a few milliseconds of GPU time.
// Work the caller queues on other streams is not ordered by this (documented in ckpt.h).
//
// Note [Change detection]
// Save() hashes every chunk on the caller's thread and copies only chunks whose hash the previous
// snapshot did not contain (the first save after Open compares with the latest committed manifest).
// The writer resolves every hash against the chunks of the latest committed manifest, so an
// unchanged chunk costs one hash and no copy. If a save fails, the next Save() snapshots in full.
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/chunk_io.h"
#include "ckpt/chunk_sink.h"
#include "ckpt/device.h"
#include "ckpt/manifest.h"
#include "loongforge/ckpt.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"
#include "loongforge/queue.h"
#include "loongforge/thread_pool.h"

namespace loongforge {
namespace ckpt {
namespace fs = std::filesystem;
using internal::ChunkDecoder;
using internal::ChunkLoc;
using internal::ChunkRec;
using internal::ChunkWhat;
using internal::Codec;
using internal::Manifest;
using internal::TensorRec;

namespace {

struct HashKey {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
};

std::string ManifestName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ckpt-%012lld.manifest", static_cast<long long>(step));
  return buf;
}

bool ParseManifestName(const std::string& name, int64_t* step) {
  if (name.size() != 5 + 12 + 9 || name.compare(0, 5, "ckpt-") != 0 ||
      name.compare(17, 9, ".manifest") != 0)
    return false;
  for (size_t i = 5; i < 17; ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  *step = std::stoll(name.substr(5, 12));
  return true;
}

std::string NewSegmentName(int64_t step, const char* kind) {
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(NowSeconds() * 1e9));
  static std::mutex mu;
  uint32_t r;
  {
    std::lock_guard<std::mutex> l(mu);
    r = static_cast<uint32_t>(rng());
  }
  char buf[80];
  std::snprintf(buf, sizeof(buf), "seg-%012lld-%s%08x.lfs", static_cast<long long>(step), kind, r);
  return buf;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Staging memory for one snapshot, recycled across saves (Note [Snapshot]).
struct StagingArena {
  internal::HostBuffer buf;
  size_t populated = 0;  // leading bytes already faulted in
  // Grows the arena if needed; `*allocated` gets the bytes newly allocated (0 if recycled).
  bool Reserve(size_t n, bool want_pinned, int64_t* allocated) {
    uint8_t* old = buf.data();
    if (!buf.Reserve(n, want_pinned)) return false;
    if (buf.data() != old) {
      populated = buf.pinned() ? buf.capacity() : 0;  // pinned memory is resident
      *allocated += static_cast<int64_t>(buf.capacity());
    }
    return true;
  }
};

struct PendingChunk {
  Hash128 hash;
  int64_t raw = 0;
  const uint8_t* staged = nullptr;  // null: unchanged since the previous snapshot
};
struct PendingTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
  std::vector<PendingChunk> chunks;
  int device = -1;       // device staging: the CUDA device whose arena holds the tensor ...
  int64_t dev_off = -1;  // ... at this offset (-1: host staging; hashes known at snapshot time)
};
struct Job {
  int64_t step = -1;
  std::vector<PendingTensor> tensors;
  std::unique_ptr<StagingArena> arena;
  std::vector<std::unique_ptr<internal::DeviceArena>> dev_arenas;  // Note [Device staging]
  SaveStats stats;
};

constexpr int64_t kArenaAlign = 256;
int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

}  // namespace

class CheckpointVault::Impl {
 public:
  Impl(std::string dir, VaultOptions opts)
      : dir_(std::move(dir)),
        opts_(std::move(opts)),
        queue_(std::max(1, opts_.max_inflight), "ckpt-writer") {
    if (!opts_.env) opts_.env = Env::Posix();
    man_dir_ = dir_ + "/manifests";
    seg_dir_ = dir_ + "/segments";
  }
  ~Impl() {
    Status s = Close();
    if (!s.ok()) LF_LOG(ERROR) << "CheckpointVault " << dir_ << ": " << s;
    if (cctx_) ZSTD_freeCCtx(cctx_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  Status Init() {
    if (opts_.chunk_bytes < 4096 || opts_.chunk_bytes % 64 != 0)
      return InvalidArgumentError("chunk_bytes must be >= 4096 and a multiple of 64, got " +
                                  std::to_string(opts_.chunk_bytes));
    if (opts_.max_inflight < 1) return InvalidArgumentError("max_inflight must be >= 1");
    if (opts_.io_threads < 0) return InvalidArgumentError("io_threads must be >= 0");
    if (opts_.device_staging_max_bytes < 0)
      return InvalidArgumentError("device_staging_max_bytes must be >= 0");
    if (opts_.d2h_buffer_bytes <= 0) return InvalidArgumentError("d2h_buffer_bytes must be > 0");
    io_threads_ = opts_.io_threads > 0 ? opts_.io_threads : internal::DefaultIoThreads();
    if (!opts_.read_only) LF_RETURN_IF_ERROR(ChooseWriter());
    if (opts_.read_only) {
      if (!fs::is_directory(man_dir_))
        return NotFoundError(dir_ + " is not a checkpoint vault (no manifests/ directory)");
      return Status::Ok();
    }
    std::error_code ec;
    fs::create_directories(man_dir_, ec);
    if (!ec) fs::create_directories(seg_dir_, ec);
    if (ec) return ErrnoToStatus(ec.value(), "create vault directories in " + dir_);
    const std::string lock_path = dir_ + "/LOCK";
    lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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
  Status ChooseWriter() {
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
  Status ProbeCufile() {
    const std::string probe = seg_dir_ + "/.cufile-probe";
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
  void FreeDeviceArena(std::unique_ptr<internal::DeviceArena> a) {
    if (a && cufile_) cufile_->DeregisterBuffer(a->data());
    a.reset();
  }

  // ---------------- save path ----------------

  Status Save(int64_t step, const std::vector<TensorRef>& tensors) {
    std::lock_guard<std::mutex> api(api_mu_);
    const double t0 = NowSeconds();
    if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
    if (closed_) return FailedPreconditionError("vault " + dir_ + " is closed");
    // Back-pressure: wait for a free in-flight slot.
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_for(l, std::chrono::milliseconds(opts_.wait_timeout_ms),
                        [&] { return inflight_ < opts_.max_inflight; }))
        return DeadlineExceededError("checkpoint save: writer did not free a slot within " +
                                     std::to_string(opts_.wait_timeout_ms) + " ms");
      if (!error_.ok()) {
        Status e = error_;
        error_ = Status::Ok();
        known_.clear();  // Note [Change detection]: the next save is full
        return e;
      }
    }
    if (step <= last_step_)
      return InvalidArgumentError("checkpoint step " + std::to_string(step) +
                                  " is not greater than the last step " +
                                  std::to_string(last_step_));
    auto job = std::make_unique<Job>();
    job->step = step;
    // Validate and size.
    std::set<std::string> names;
    for (const auto& t : tensors) {
      const DType dt = t.dtype;
      if (t.name.empty()) return InvalidArgumentError("tensor with an empty name");
      if (!names.insert(t.name).second)
        return InvalidArgumentError("tensor name '" + t.name + "' appears twice");
      int64_t n = DTypeSize(dt);
      for (int64_t d : t.shape) {
        if (d < 0) return InvalidArgumentError("tensor '" + t.name + "' has a negative dimension");
        n *= d;
      }
      if (n > 0 && t.data == nullptr)
        return InvalidArgumentError("tensor '" + t.name + "' has no data pointer");
      if (t.device >= 0) {
        if (!internal::DeviceSupportCompiled())
          return UnimplementedError("tensor '" + t.name +
                                    "' is on a CUDA device but CUDA support is not compiled in");
      }
      PendingTensor pt{t.name, dt, t.shape, n, {}};
      job->tensors.push_back(std::move(pt));
    }
    // Snapshot: Note [Snapshot].
    SaveStats& st = job->stats;
    st.step = step;
    st.writer = cufile_ ? "cufile" : "posix";  // the writer adds details (Note [cuFile writer])
    st.writer_reason = writer_reason_;
    const double ts0 = NowSeconds();
    const int64_t cb = opts_.chunk_bytes;
    const size_t nt = tensors.size();
    std::vector<int64_t> first_slot(nt), byte_off(nt);
    int64_t nslots = 0, total_bytes = 0;
    std::map<int, std::vector<size_t>> by_dev;          // device -> its tensors
    std::vector<std::pair<size_t, int64_t>> cpu_slots;  // (tensor, chunk) of CPU tensors
    for (size_t ti = 0; ti < nt; ++ti) {
      const int64_t nchunks = (job->tensors[ti].nbytes + cb - 1) / cb;
      job->tensors[ti].device = tensors[ti].device;
      first_slot[ti] = nslots;
      byte_off[ti] = total_bytes;  // fused layout: the tensors back to back
      nslots += nchunks;
      total_bytes += job->tensors[ti].nbytes;
      if (tensors[ti].device >= 0) {
        by_dev[tensors[ti].device].push_back(ti);
      } else {
        for (int64_t c = 0; c < nchunks; ++c) cpu_slots.push_back({ti, c});
      }
      job->tensors[ti].chunks.resize(static_cast<size_t>(nchunks));
    }
    std::vector<Hash128> hashes(static_cast<size_t>(nslots));
    auto chunk_src = [&](size_t ti, int64_t c) {
      return static_cast<const uint8_t*>(tensors[ti].data) + c * cb;
    };
    auto chunk_len = [&](size_t ti, int64_t c) {
      return std::min(cb, job->tensors[ti].nbytes - c * cb);
    };
    // Note [Device staging]: copy the device tensors into device arenas and move on.
    bool dev_staged = false;
    st.snapshot_path = "host";
    st.snapshot_reason = by_dev.empty() ? "no device tensors" : "";
    if (!by_dev.empty()) {
      LF_ASSIGN_OR_RETURN(dev_staged, TakeDeviceArenas(job.get(), by_dev, &st));
    }
    if (dev_staged) {
      st.snapshot_path = "device";
      for (auto& [dev, tis] : by_dev) {
        internal::DeviceArena* arena = nullptr;
        for (auto& a : job->dev_arenas)
          if (a->device() == dev) arena = a.get();
        Status s = StageOnDevice(dev, tis, tensors, arena, job.get());
        if (!s.ok())
          return FailSnapshot(
              job.get(), false,
              s.WithContext("device staging on CUDA device " + std::to_string(dev)));
      }
      by_dev.clear();  // nothing left for the host-staging device path below
    }
    // Device tensors (host staging): one hash kernel per device queued on its snapshot stream
    // (it runs while the host hashes the CPU tensors).
    std::vector<std::pair<int, internal::DeviceSnapshot*>> dsnaps;
    for (auto& [dev, tis] : by_dev) {
      LF_ASSIGN_OR_RETURN(internal::DeviceSnapshot * ds, GetDeviceSnapshot(dev));
      int64_t dslots = 0;
      std::vector<void*> streams;
      for (size_t ti : tis) {
        dslots += (job->tensors[ti].nbytes + cb - 1) / cb;
        if (std::find(streams.begin(), streams.end(), tensors[ti].stream) == streams.end())
          streams.push_back(tensors[ti].stream);
      }
      LF_RETURN_IF_ERROR_CTX(ds->Begin(dslots, static_cast<int64_t>(tis.size()), streams),
                             "snapshot on CUDA device " + std::to_string(dev));
      int64_t k = 0;
      for (size_t ti : tis) {
        LF_RETURN_IF_ERROR_CTX(ds->EnqueueHash(tensors[ti].data, job->tensors[ti].nbytes, cb, k),
                               "hash tensor '" + tensors[ti].name + "' on device");
        k += (job->tensors[ti].nbytes + cb - 1) / cb;
      }
      LF_RETURN_IF_ERROR_CTX(ds->SubmitHashes(),
                             "hash tensors on CUDA device " + std::to_string(dev));
      dsnaps.push_back({dev, ds});
    }
    job->arena = TakeArena();
    // Fused first snapshot: with nothing known every chunk is copied, so hash and copy each chunk
    // in one pass over the source (it is read once, and is in cache for the copy).
    const bool fused = known_.empty() && by_dev.empty() && !dev_staged;
    internal::HostBuffer& arena = job->arena->buf;
    if (fused) {
      if (!job->arena->Reserve(static_cast<size_t>(std::max<int64_t>(total_bytes, 1)), false,
                               &st.staging_allocated))
        return FailSnapshot(job.get(), false,
                            ResourceExhaustedError("out of host memory for a checkpoint snapshot"));
      const size_t pop = job->arena->populated;
      ParallelFor(cpu_slots.size(), [&](size_t i) {
        auto [ti, c] = cpu_slots[i];
        const size_t len = static_cast<size_t>(chunk_len(ti, c));
        uint8_t* dst = arena.data() + byte_off[ti] + c * cb;
        hashes[static_cast<size_t>(first_slot[ti] + c)] = HashBytes(chunk_src(ti, c), len);
        if (static_cast<size_t>(dst - arena.data()) + len > pop)
          internal::PrefaultForWrite(dst, len);
        std::memcpy(dst, chunk_src(ti, c), len);
      });
      job->arena->populated = std::max(pop, static_cast<size_t>(total_bytes));
    } else {
      ParallelFor(cpu_slots.size(), [&](size_t i) {
        auto [ti, c] = cpu_slots[i];
        hashes[static_cast<size_t>(first_slot[ti] + c)] =
            HashBytes(chunk_src(ti, c), static_cast<size_t>(chunk_len(ti, c)));
      });
    }
    for (auto& [dev, ds] : dsnaps) {
      std::vector<Hash128> dh;
      Status s = ds->FetchHashes(&dh, opts_.wait_timeout_ms);
      if (!s.ok())
        return FailSnapshot(job.get(), false,
                            s.WithContext("hash tensors on CUDA device " + std::to_string(dev)));
      int64_t k = 0;
      for (size_t ti : by_dev[dev])
        for (int64_t c = 0; c < static_cast<int64_t>(job->tensors[ti].chunks.size()); ++c)
          hashes[static_cast<size_t>(first_slot[ti] + c)] = dh[static_cast<size_t>(k++)];
    }
    const double ts1 = NowSeconds();
    st.hash_s = ts1 - ts0;
    // Decide which chunks to stage: those the previous snapshot did not have (first copy only).
    std::unordered_set<Hash128, HashKey> now;
    struct Copy {
      size_t ti;
      int64_t c;
      size_t dst_off;
    };
    std::vector<Copy> copies;
    size_t staged_bytes = 0;
    for (size_t ti = 0; ti < nt; ++ti) {
      PendingTensor& pt = job->tensors[ti];
      if (pt.dev_off >= 0) {  // device staged: hashed and resolved by the writer
        for (int64_t c = 0; c < static_cast<int64_t>(pt.chunks.size()); ++c)
          pt.chunks[static_cast<size_t>(c)].raw = chunk_len(ti, c);
        st.chunks_total += static_cast<int64_t>(pt.chunks.size());
        st.bytes_total += pt.nbytes;
        st.bytes_copied += pt.nbytes;
        continue;
      }
      for (int64_t c = 0; c < static_cast<int64_t>(pt.chunks.size()); ++c) {
        PendingChunk& pc = pt.chunks[static_cast<size_t>(c)];
        pc.raw = chunk_len(ti, c);
        pc.hash = hashes[static_cast<size_t>(first_slot[ti] + c)];
        if (!known_.count(pc.hash) && now.insert(pc.hash).second) {
          if (fused) {
            pc.staged = arena.data() + byte_off[ti] + c * cb;
          } else {
            copies.push_back({ti, c, staged_bytes});
            staged_bytes += static_cast<size_t>(pc.raw);
          }
          st.bytes_copied += pc.raw;
        } else {
          now.insert(pc.hash);
        }
        ++st.chunks_total;
      }
      st.bytes_total += pt.nbytes;
    }
    if (!fused) {
      const bool want_pinned = !by_dev.empty();
      if (staged_bytes > 0 &&
          !job->arena->Reserve(staged_bytes, want_pinned, &st.staging_allocated))
        return FailSnapshot(
            job.get(), false,
            ResourceExhaustedError("out of host memory for a " + std::to_string(staged_bytes) +
                                   "-byte checkpoint snapshot"));
      // Device copies first (asynchronous, runs of adjacent chunks merged), then CPU copies on
      // the workers while the DMA engines run, then wait for the device copies.
      for (size_t i = 0; i < copies.size();) {
        const Copy& cp = copies[i];
        const int dev = tensors[cp.ti].device;
        size_t len = static_cast<size_t>(chunk_len(cp.ti, cp.c));
        size_t j = i + 1;
        while (dev >= 0 && j < copies.size() && copies[j].ti == cp.ti &&
               copies[j].c == copies[j - 1].c + 1) {
          len += static_cast<size_t>(chunk_len(copies[j].ti, copies[j].c));
          ++j;
        }
        if (dev >= 0) {
          internal::DeviceSnapshot* ds = nullptr;
          for (auto& [d, p] : dsnaps)
            if (d == dev) ds = p;
          Status s = ds->EnqueueCopy(arena.data() + cp.dst_off, chunk_src(cp.ti, cp.c), len);
          if (!s.ok())
            return FailSnapshot(
                job.get(), true,
                s.WithContext("copy tensor '" + tensors[cp.ti].name + "' from device"));
        }
        i = j;
      }
      const size_t pop = job->arena->populated;
      ParallelFor(copies.size(), [&](size_t i) {
        const Copy& cp = copies[i];
        if (tensors[cp.ti].device >= 0) return;
        const size_t len = static_cast<size_t>(chunk_len(cp.ti, cp.c));
        uint8_t* dst = arena.data() + cp.dst_off;
        if (cp.dst_off + len > pop) internal::PrefaultForWrite(dst, len);
        std::memcpy(dst, chunk_src(cp.ti, cp.c), len);
      });
      job->arena->populated = std::max(pop, staged_bytes);
      for (auto& [dev, ds] : dsnaps) {
        Status s = ds->Finish(opts_.wait_timeout_ms);
        if (!s.ok())
          return FailSnapshot(
              job.get(), true,
              s.WithContext("snapshot copies on CUDA device " + std::to_string(dev)));
      }
      for (const Copy& cp : copies)
        job->tensors[cp.ti].chunks[static_cast<size_t>(cp.c)].staged = arena.data() + cp.dst_off;
    }
    st.copy_s = NowSeconds() - ts1;
    known_ = std::move(now);
    last_step_ = step;
    st.snapshot_s = NowSeconds() - ts0;
    {
      std::lock_guard<std::mutex> l(mu_);
      ++inflight_;
    }
    st.blocking_s = NowSeconds() - t0;
    {
      std::lock_guard<std::mutex> l(mu_);
      last_stats_ = st;
    }
    Status s = queue_.Push(std::move(job), std::chrono::milliseconds(opts_.wait_timeout_ms));
    if (!s.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      --inflight_;
      cv_.notify_all();
      return s.WithContext("queue checkpoint " + std::to_string(step));
    }
    return Status::Ok();
  }

  Status Wait() {
    std::lock_guard<std::mutex> api(api_mu_);
    return WaitLocked();
  }

  Status WaitLocked() {
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

  Status Close() {
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

  // ---------------- writer ----------------

  void WriterLoop() {
    pthread_setname_np(pthread_self(), "ckpt-writer");
    while (true) {
      std::unique_ptr<Job> job;
      Status s = queue_.Pop(&job, std::chrono::hours(24 * 365));
      if (!s.ok()) {
        if (s.code() == StatusCode::kCancelled) break;
        continue;
      }
      Status w;
      {
        std::lock_guard<std::mutex> wl(writer_mu_);
        const double t0 = NowSeconds();
        w = WriteJob(job.get());
        job->stats.write_s = NowSeconds() - t0;
        if (w.ok()) {
          Status r = RetentionLocked();
          if (!r.ok()) LF_LOG(WARNING) << "checkpoint retention: " << r;
        }
      }
      ReturnArena(std::move(job->arena));
      ReturnDeviceArenas(&job->dev_arenas);  // the reader's transfers from them have completed
      std::lock_guard<std::mutex> l(mu_);
      if (!w.ok()) {
        LF_LOG(ERROR) << "checkpoint " << job->step << " failed: " << w;
        if (error_.ok()) error_ = w;
      } else if (last_stats_.step == job->stats.step) {
        last_stats_ = job->stats;
      }
      --inflight_;
      cv_.notify_all();
    }
  }

  // Writes one segment and commits the manifest. Runs under writer_mu_.
  Status WriteJob(Job* job) {
    const std::string seg_name = NewSegmentName(job->step, "");
    const std::string seg_path = seg_dir_ + "/" + seg_name;
    Manifest m;
    m.step = job->step;
    m.parent = latest_committed_;
    m.chunk_bytes = opts_.chunk_bytes;
    m.created_unix =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::unique_ptr<internal::ChunkSink> file;
    int64_t seg_off = 0;
    SaveStats& st = job->stats;
    // Note [cuFile writer]: raw device-staged chunks go straight from the arena with cuFileWrite;
    // a chunk that may be compressed or delta-coded is decided on host bytes (the POSIX way).
    const bool encode_on_host = opts_.compress || opts_.xor_delta;
    const bool cufile_direct = cufile_ && !encode_on_host;
    st.writer = cufile_ ? "cufile" : "posix";
    st.writer_reason = writer_reason_;
    if (cufile_ && encode_on_host)
      st.writer_reason +=
          "; compress/xor_delta on: chunks are encoded on the host and written "
          "with write(2)";
    auto open_file = [&]() -> Status {
      if (file) return Status::Ok();
      if (cufile_) {
        LF_ASSIGN_OR_RETURN(file, cufile_->NewSink(seg_path));
      } else {
        LF_ASSIGN_OR_RETURN(auto f, opts_.env->NewWritableFile(seg_path));
        file = internal::NewPosixChunkSink(std::move(f));
      }
      return Status::Ok();
    };
    auto fail = [&](const Status& s) {
      if (file) file->Close().IgnoreError();
      opts_.env->Remove(seg_path).IgnoreError();
      std::string hint = s.code() == StatusCode::kResourceExhausted
                             ? " (disk full? older checkpoints are intact)"
                             : " (older checkpoints are intact)";
      return s.WithContext("checkpoint " + std::to_string(job->step) + hint);
    };
    // Device-staged tensors: their hashes come from the staged copies (Note [Device staging]).
    if (!job->dev_arenas.empty()) {
      Status hs = HashStaged(job);
      if (!hs.ok()) return fail(hs);
    }
    // Plan: a chunk is written once, at the first occurrence of a hash the latest committed
    // checkpoint does not store; every other chunk refers to a stored or planned one.
    struct Slot {
      size_t ti, ci;
    };
    std::unordered_map<Hash128, Slot, HashKey> planned;
    std::vector<Slot> host_writes;
    std::map<int, std::vector<Slot>> dev_writes;  // device -> chunks to read from its arena
    std::vector<std::vector<const Slot*>> refs(job->tensors.size());  // to planned chunks
    m.tensors.reserve(job->tensors.size());
    for (size_t ti = 0; ti < job->tensors.size(); ++ti) {
      const PendingTensor& pt = job->tensors[ti];
      m.tensors.push_back({pt.name, pt.dtype, pt.shape, pt.nbytes, {}});
      m.tensors.back().chunks.resize(pt.chunks.size());
      refs[ti].assign(pt.chunks.size(), nullptr);
      for (size_t ci = 0; ci < pt.chunks.size(); ++ci) {
        const PendingChunk& pc = pt.chunks[ci];
        if (auto it = index_.find(pc.hash); it != index_.end()) {
          m.tensors[ti].chunks[ci] = it->second;
          ++st.chunks_skipped;
          continue;
        }
        auto [it, fresh] = planned.emplace(pc.hash, Slot{ti, ci});
        if (!fresh) {
          refs[ti][ci] = &it->second;
          ++st.chunks_skipped;
          continue;
        }
        if (pt.dev_off >= 0) {
          dev_writes[pt.device].push_back({ti, ci});
        } else if (pc.staged == nullptr) {
          return fail(FailedPreconditionError(
              "tensor '" + pt.name + "' chunk " + std::to_string(ci) +
              " was unchanged at snapshot time but its stored copy is gone (an earlier save "
              "failed); save again"));
        } else {
          host_writes.push_back({ti, ci});
        }
      }
    }
    std::vector<uint8_t> zbuf, xbuf, basebuf;
    std::unique_ptr<ChunkDecoder> decoder;
    // Compresses (or XOR-deltas) and appends one chunk; records where it went.
    auto write_chunk = [&](const Slot& w, const uint8_t* raw) -> Status {
      const PendingTensor& pt = job->tensors[w.ti];
      const PendingChunk& pc = pt.chunks[w.ci];
      const std::vector<ChunkRec>* prev_slots = nullptr;
      if (auto it = prev_slots_.find(pt.name); it != prev_slots_.end()) prev_slots = &it->second;
      ChunkRec rec;
      rec.hash = pc.hash;
      rec.raw = pc.raw;
      const uint8_t* payload = raw;
      int64_t payload_len = pc.raw;
      if (opts_.compress) {
        zbuf.resize(ZSTD_compressBound(static_cast<size_t>(pc.raw)));
        if (!cctx_) cctx_ = ZSTD_createCCtx();
        size_t z = ZSTD_compressCCtx(cctx_, zbuf.data(), zbuf.size(), raw,
                                     static_cast<size_t>(pc.raw), opts_.compress_level);
        if (!ZSTD_isError(z) && static_cast<double>(z) < opts_.compress_max_ratio * pc.raw) {
          rec.codec = Codec::kZstd;
          payload = zbuf.data();
          payload_len = static_cast<int64_t>(z);
        }
      }
      if (opts_.xor_delta && prev_slots && w.ci < prev_slots->size()) {
        const ChunkRec& base = (*prev_slots)[w.ci];
        if (base.raw == pc.raw && base.codec != Codec::kXorZstd) {
          if (!decoder) decoder = std::make_unique<ChunkDecoder>(seg_dir_);
          basebuf.resize(static_cast<size_t>(pc.raw));
          Status bs = decoder->Decode(
              base, basebuf.data(),
              "delta base of tensor '" + pt.name + "' chunk " + std::to_string(w.ci));
          if (bs.ok()) {
            for (int64_t i = 0; i < pc.raw; ++i) basebuf[i] ^= raw[i];
            xbuf.resize(ZSTD_compressBound(static_cast<size_t>(pc.raw)));
            if (!cctx_) cctx_ = ZSTD_createCCtx();
            size_t z = ZSTD_compressCCtx(cctx_, xbuf.data(), xbuf.size(), basebuf.data(),
                                         static_cast<size_t>(pc.raw), opts_.compress_level);
            if (!ZSTD_isError(z) && static_cast<int64_t>(z) < payload_len &&
                static_cast<double>(z) < opts_.compress_max_ratio * pc.raw) {
              rec.codec = Codec::kXorZstd;
              rec.base_codec = base.codec;
              rec.base_hash = base.hash;
              rec.base = base.loc;
              payload = xbuf.data();
              payload_len = static_cast<int64_t>(z);
            }
          } else {
            LF_LOG(WARNING) << bs << "; storing the chunk in full";
          }
        }
      }
      LF_RETURN_IF_ERROR(open_file());
      LF_RETURN_IF_ERROR(file->AppendHost(payload, static_cast<size_t>(payload_len)));
      rec.loc = {seg_name, seg_off, payload_len};
      seg_off += payload_len;
      st.bytes_written += payload_len;
      ++st.chunks_written;
      if (rec.codec == Codec::kZstd) ++st.chunks_compressed;
      if (rec.codec == Codec::kXorZstd) ++st.chunks_delta;
      m.tensors[w.ti].chunks[w.ci] = rec;
      return Status::Ok();
    };
    for (const Slot& w : host_writes) {
      Status s = write_chunk(w, job->tensors[w.ti].chunks[w.ci].staged);
      if (!s.ok()) return fail(s);
    }
    // Device-staged chunks to write: device -> host through the reader's pinned buffers, each
    // batch written while the next one transfers.
    for (auto& [dev, writes] : dev_writes) {
      internal::DeviceArena* arena = DeviceArenaOf(job, dev);
      if (cufile_direct) {
        Status s =
            WriteDeviceChunksCufile(job, arena, writes, seg_name, open_file, &file, &seg_off, &m);
        if (!s.ok())
          return fail(
              s.WithContext("write device-staged chunks of CUDA device " + std::to_string(dev)));
        continue;
      }
      auto reader = GetStagingReader(dev);
      if (!reader.ok()) return fail(reader.status());
      std::vector<internal::DeviceSpan> ranges;
      ranges.reserve(writes.size());
      for (const Slot& w : writes) {
        const PendingTensor& pt = job->tensors[w.ti];
        ranges.push_back({arena->data() + pt.dev_off + static_cast<int64_t>(w.ci) * m.chunk_bytes,
                          pt.chunks[w.ci].raw});
        st.bytes_d2h += pt.chunks[w.ci].raw;
      }
      double wait_s = 0;
      Status s = (*reader)->CopyOut(
          ranges, opts_.wait_timeout_ms,
          [&](size_t i, const uint8_t* p) { return write_chunk(writes[i], p); }, &wait_s);
      st.d2h_s += wait_s;
      if (!s.ok())
        return fail(
            s.WithContext("write device-staged chunks of CUDA device " + std::to_string(dev)));
    }
    for (size_t ti = 0; ti < refs.size(); ++ti)
      for (size_t ci = 0; ci < refs[ti].size(); ++ci)
        if (refs[ti][ci])
          m.tensors[ti].chunks[ci] = m.tensors[refs[ti][ci]->ti].chunks[refs[ti][ci]->ci];
    // Data first: the segment and its directory entry are durable before the manifest names them.
    if (file) {
      if (opts_.fsync) {
        Status s = file->Sync();
        if (!s.ok()) return fail(s);
      }
      Status s = file->Close();
      if (!s.ok()) return fail(s);
      if (opts_.fsync) {
        s = opts_.env->SyncDir(seg_dir_);
        if (!s.ok()) return fail(s);
      }
    }
    Status s = CommitManifest(m);
    if (!s.ok()) return fail(s);
    IndexFrom(m, /*seed_known=*/false);
    if (cufile_direct) {
      st.writer_reason += "; " + std::to_string(st.chunks_cufile) +
                          " chunks from device memory with cuFileWrite, " +
                          std::to_string(st.chunks_written - st.chunks_cufile) +
                          " from host memory";
    }
    return Status::Ok();
  }

  // Note [cuFile writer]: appends the raw chunks `writes` (Slot: tensor, chunk) of `arena` with
  // cuFileWrite (runs of adjacent chunks in one call), recording each chunk's location in `m`.
  // Writer thread.
  template <typename Slot, typename OpenFn>
  Status WriteDeviceChunksCufile(Job* job, internal::DeviceArena* arena,
                                 const std::vector<Slot>& writes, const std::string& seg_name,
                                 const OpenFn& open_file,
                                 std::unique_ptr<internal::ChunkSink>* file, int64_t* seg_off,
                                 Manifest* m) {
    SaveStats& st = job->stats;
    Status rs = cufile_->RegisterBuffer(arena->device(), arena->data(), arena->capacity());
    if (!rs.ok() && !warned_unregistered_) {
      LF_LOG(WARNING) << rs << "; cuFileWrite goes through cuFile's bounce buffers";
      warned_unregistered_ = true;
    }
    // The arena's snapshot copies must be complete before cuFile reads it: HashStaged waited for
    // the hash kernel, which ran after the arena's ready event on the reader's stream.
    LF_RETURN_IF_ERROR(open_file());
    const double t0 = NowSeconds();
    auto src_of = [&](const Slot& w) {
      return arena->data() + job->tensors[w.ti].dev_off +
             static_cast<int64_t>(w.ci) * m->chunk_bytes;
    };
    auto name_of = [&](const Slot& w) {
      return "tensor '" + job->tensors[w.ti].name + "' chunk " + std::to_string(w.ci);
    };
    // Chunks adjacent in the arena are adjacent in the file too (appended in order): one
    // cuFileWrite per run of them, up to max(d2h_buffer_bytes, chunk_bytes) bytes.
    const int64_t max_run = std::max(opts_.d2h_buffer_bytes, opts_.chunk_bytes);
    for (size_t i = 0; i < writes.size();) {
      const uint8_t* src = src_of(writes[i]);
      int64_t len = job->tensors[writes[i].ti].chunks[writes[i].ci].raw;
      size_t j = i + 1;
      while (j < writes.size()) {
        const int64_t next = job->tensors[writes[j].ti].chunks[writes[j].ci].raw;
        if (src_of(writes[j]) != src + len || len + next > max_run) break;
        len += next;
        ++j;
      }
      std::string what = name_of(writes[i]);
      if (j > i + 1) what += " .. " + name_of(writes[j - 1]);
      LF_RETURN_IF_ERROR((*file)->AppendDevice(
          src, static_cast<size_t>(len), what + " of checkpoint " + std::to_string(job->step)));
      for (; i < j; ++i) {
        const Slot& w = writes[i];
        const PendingChunk& pc = job->tensors[w.ti].chunks[w.ci];
        ChunkRec rec;
        rec.hash = pc.hash;
        rec.raw = pc.raw;
        rec.loc = {seg_name, *seg_off, pc.raw};
        *seg_off += pc.raw;
        st.bytes_written += pc.raw;
        st.bytes_cufile += pc.raw;
        ++st.chunks_written;
        ++st.chunks_cufile;
        m->tensors[w.ti].chunks[w.ci] = rec;
      }
    }
    st.cufile_s += NowSeconds() - t0;
    return Status::Ok();
  }

  // Fills the hashes of the device-staged tensors of `job` from their staged copies (one batched
  // kernel per device, Note [Device staging]). Writer thread.
  Status HashStaged(Job* job) {
    const double t0 = NowSeconds();
    for (const auto& arena : job->dev_arenas) {
      const int dev = arena->device();
      std::vector<internal::DeviceSpan> spans;
      std::vector<PendingTensor*> pts;
      for (PendingTensor& pt : job->tensors) {
        if (pt.dev_off < 0 || pt.device != dev) continue;
        spans.push_back({arena->data() + pt.dev_off, pt.nbytes});
        pts.push_back(&pt);
      }
      LF_ASSIGN_OR_RETURN(internal::StagingReader * reader, GetStagingReader(dev));
      std::vector<Hash128> hashes;
      LF_RETURN_IF_ERROR_CTX(
          reader->Hash(arena.get(), spans, opts_.chunk_bytes, &hashes, opts_.wait_timeout_ms),
          "hash device-staged tensors of CUDA device " + std::to_string(dev));
      size_t k = 0;
      for (PendingTensor* pt : pts)
        for (PendingChunk& pc : pt->chunks) pc.hash = hashes[k++];
    }
    job->stats.staged_hash_s = NowSeconds() - t0;
    return Status::Ok();
  }

  static internal::DeviceArena* DeviceArenaOf(Job* job, int dev) {
    for (auto& a : job->dev_arenas)
      if (a->device() == dev) return a.get();
    LF_CHECK(false) << "no staging arena for CUDA device " << dev;
    return nullptr;
  }

  // The writer's staging reader of `dev` (writer thread, or Close after the writer stopped).
  StatusOr<internal::StagingReader*> GetStagingReader(int dev) {
    auto it = readers_.find(dev);
    if (it != readers_.end()) return it->second.get();
    LF_ASSIGN_OR_RETURN(auto r, internal::NewStagingReader(
                                    dev, std::max(opts_.d2h_buffer_bytes, opts_.chunk_bytes)));
    return readers_.emplace(dev, std::move(r)).first->second.get();
  }

  Status CommitManifest(const Manifest& m) {
    const std::string body = internal::SerializeManifest(m);
    const std::string final_path = man_dir_ + "/" + ManifestName(m.step);
    const std::string tmp_path = final_path + ".tmp";
    LF_ASSIGN_OR_RETURN(auto f, opts_.env->NewWritableFile(tmp_path));
    Status s = f->Append(body.data(), body.size());
    if (s.ok() && opts_.fsync) s = f->Sync();
    Status c = f->Close();
    if (s.ok()) s = c;
    if (s.ok()) s = opts_.env->Rename(tmp_path, final_path);
    if (s.ok() && opts_.fsync) s = opts_.env->SyncDir(man_dir_);
    if (!s.ok()) {
      opts_.env->Remove(tmp_path).IgnoreError();
      return s.WithContext("commit manifest " + final_path);
    }
    return Status::Ok();
  }

  // Rebuilds the writer's chunk index from `m`. `seed_known` also resets the save-side hash set
  // (only with api_mu_ held: Init).
  void IndexFrom(const Manifest& m, bool seed_known) {
    index_.clear();
    prev_slots_.clear();
    if (seed_known) known_.clear();
    for (const auto& t : m.tensors) {
      for (const auto& c : t.chunks) {
        index_.emplace(c.hash, c);
        if (seed_known) known_.insert(c.hash);
      }
      prev_slots_[t.name] = t.chunks;
    }
    latest_committed_ = m.step;
  }

  // The free arena with the largest capacity (at most max_inflight arenas ever exist: one per
  // queued job plus the free ones, and Save() runs only when fewer than max_inflight are queued).
  std::unique_ptr<StagingArena> TakeArena() {
    std::lock_guard<std::mutex> l(mu_);
    if (free_arenas_.empty()) return std::make_unique<StagingArena>();
    auto best = std::max_element(
        free_arenas_.begin(), free_arenas_.end(),
        [](const auto& a, const auto& b) { return a->buf.capacity() < b->buf.capacity(); });
    auto a = std::move(*best);
    free_arenas_.erase(best);
    return a;
  }
  void ReturnArena(std::unique_ptr<StagingArena> a) {
    if (!a) return;
    std::lock_guard<std::mutex> l(mu_);
    free_arenas_.push_back(std::move(a));
  }

  // Ends a failed snapshot. With device copies enqueued, they must complete before the arena is
  // reused; if they cannot be waited for, the arena is leaked rather than handed out while a DMA
  // may still write into it.
  Status FailSnapshot(Job* job, bool copies_enqueued, Status s) {
    if (copies_enqueued) {
      for (auto& [dev, ds] : device_snaps_) {
        Status f = ds->Finish(opts_.wait_timeout_ms);
        if (!f.ok()) {
          LF_LOG(ERROR) << "checkpoint snapshot: device copies did not finish (" << f
                        << "); leaking the staging arena";
          job->arena.release();
          return s;
        }
      }
    }
    ReturnArena(std::move(job->arena));
    // Device staging copies may still run; the next user of the arena queues behind them on the
    // same snapshot stream.
    ReturnDeviceArenas(&job->dev_arenas);
    return s;
  }

  // Note [Device staging]: takes one arena per device for `job` (recycled, or grown/allocated)
  // and assigns each device tensor its offset. False (with the reason in st->snapshot_reason)
  // when the device tensors go through host staging instead; an error only for
  // device_staging=on.
  StatusOr<bool> TakeDeviceArenas(Job* job, const std::map<int, std::vector<size_t>>& by_dev,
                                  SaveStats* st) {
    if (opts_.device_staging == DeviceStaging::kOff) {
      st->snapshot_reason = "device_staging=off";
      return false;
    }
    std::string why, how;
    for (const auto& [dev, tis] : by_dev) {
      int64_t need = 0;
      for (size_t ti : tis) {
        job->tensors[ti].dev_off = need;
        need += AlignUp(job->tensors[ti].nbytes, kArenaAlign);
      }
      need = std::max(need, kArenaAlign);
      why = TakeDeviceArena(dev, need, job, st, &how);
      if (!why.empty()) break;
    }
    if (why.empty()) {
      st->snapshot_reason = how;
      return true;
    }
    for (const auto& [dev, tis] : by_dev)
      for (size_t ti : tis) job->tensors[ti].dev_off = -1;
    ReturnDeviceArenas(&job->dev_arenas);
    if (opts_.device_staging == DeviceStaging::kOn)
      return ResourceExhaustedError("device_staging=on but " + why);
    st->snapshot_reason = why + "; staged on the host";
    return false;
  }

  // One arena of >= `need` bytes on `dev` into job->dev_arenas; returns why not ("" = done).
  std::string TakeDeviceArena(int dev, int64_t need, Job* job, SaveStats* st, std::string* how) {
    const std::string where = "CUDA device " + std::to_string(dev);
    if (opts_.device_staging_max_bytes > 0 && need > opts_.device_staging_max_bytes)
      return "the device tensors on " + where + " need " + std::to_string(need) +
             " bytes of staging, more than device_staging_max_bytes " +
             std::to_string(opts_.device_staging_max_bytes);
    std::unique_ptr<internal::DeviceArena> a;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto& fl = free_dev_arenas_[dev];
      if (!fl.empty()) {
        auto best = std::max_element(fl.begin(), fl.end(), [](const auto& x, const auto& y) {
          return x->capacity() < y->capacity();
        });
        a = std::move(*best);
        fl.erase(best);
      }
    }
    if (a && a->capacity() >= need) {
      *how = "device staging (recycled arena)";
      job->dev_arenas.push_back(std::move(a));
      return "";
    }
    const int64_t old_cap = a ? a->capacity() : 0;
    if (opts_.device_staging == DeviceStaging::kAuto) {
      int64_t free_b = 0, total_b = 0;
      Status s = internal::DeviceMemInfo(dev, &free_b, &total_b);
      const int64_t margin = std::max<int64_t>(int64_t{1} << 30, total_b / 10);
      std::string no;
      if (!s.ok()) {
        no = "cudaMemGetInfo on " + where + " failed: " + s.ToString();
      } else if (free_b + old_cap - need < margin) {
        no = where + " has " + std::to_string(free_b) + " bytes free; a " + std::to_string(need) +
             "-byte staging arena would leave less than the " + std::to_string(margin) +
             "-byte margin";
      }
      if (!no.empty()) {
        if (a) {
          std::lock_guard<std::mutex> l(mu_);
          free_dev_arenas_[dev].push_back(std::move(a));
        }
        return no;
      }
    }
    FreeDeviceArena(std::move(a));  // the smaller one (cudaFree waits; only while arenas grow)
    auto na = internal::NewDeviceArena(dev, need);
    if (!na.ok())
      return "allocating a " + std::to_string(need) + "-byte staging arena on " + where +
             " failed: " + na.status().ToString();
    st->staging_allocated += need;
    *how = "device staging (new arena)";
    job->dev_arenas.push_back(std::move(na).value());
    return "";
  }

  void ReturnDeviceArenas(std::vector<std::unique_ptr<internal::DeviceArena>>* arenas) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& a : *arenas)
      if (a) free_dev_arenas_[a->device()].push_back(std::move(a));
    arenas->clear();
  }

  // Enqueues the device-to-device copies of `tis` into `arena` after the producers' work and
  // makes the producer streams wait for them (Notes [Device staging], [Caller stream waits]).
  Status StageOnDevice(int dev, const std::vector<size_t>& tis,
                       const std::vector<TensorRef>& tensors, internal::DeviceArena* arena,
                       Job* job) {
    LF_ASSIGN_OR_RETURN(internal::DeviceSnapshot * ds, GetDeviceSnapshot(dev));
    std::vector<void*> streams;
    for (size_t ti : tis)
      if (std::find(streams.begin(), streams.end(), tensors[ti].stream) == streams.end())
        streams.push_back(tensors[ti].stream);
    LF_RETURN_IF_ERROR(ds->Begin(0, 0, streams));
    for (size_t ti : tis) {
      const PendingTensor& pt = job->tensors[ti];
      LF_RETURN_IF_ERROR_CTX(ds->EnqueueDeviceCopy(arena->data() + pt.dev_off, tensors[ti].data,
                                                   static_cast<size_t>(pt.nbytes)),
                             "copy tensor '" + pt.name + "' into device staging");
    }
    return ds->Publish(arena, streams);
  }

  StatusOr<internal::DeviceSnapshot*> GetDeviceSnapshot(int device) {
    auto it = device_snaps_.find(device);
    if (it != device_snaps_.end()) return it->second.get();
    LF_ASSIGN_OR_RETURN(auto ds, internal::NewDeviceSnapshot(device));
    return device_snaps_.emplace(device, std::move(ds)).first->second.get();
  }

  // Runs fn(i) for i in [0, n) on the snapshot workers and the calling thread. The tasks are
  // bounded CPU work (hash/copy of one chunk) on memory the caller keeps alive, so the wait has no
  // timeout: it must not return before they end.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
    if (n == 0) return;
    std::atomic<size_t> next{0};
    auto body = [&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    };
    std::vector<std::future<void>> futs;
    if (snap_pool_)
      for (int k = 0; k < snap_pool_->size() && static_cast<size_t>(k + 1) < n; ++k)
        futs.push_back(snap_pool_->Async(body));
    body();
    for (auto& f : futs)
      if (f.valid()) f.wait();
  }

  // ---------------- read path ----------------

  StatusOr<std::vector<int64_t>> List() const {
    std::vector<int64_t> steps;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(man_dir_, ec)) {
      int64_t step;
      if (ParseManifestName(e.path().filename().string(), &step)) steps.push_back(step);
    }
    if (ec) return ErrnoToStatus(ec.value(), "list " + man_dir_);
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  std::optional<int64_t> Latest() const {
    auto l = List();
    if (!l.ok() || l->empty()) return std::nullopt;
    return l->back();
  }

  StatusOr<Manifest> LoadManifest(int64_t step) const {
    const std::string path = man_dir_ + "/" + ManifestName(step);
    auto bytes = ReadWholeFile(path);
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound)
        return NotFoundError("checkpoint " + std::to_string(step) + " not found in " + dir_);
      return bytes.status();
    }
    return internal::ParseManifest(*bytes, path);
  }

  // Decodes every chunk of `m` (or of the tensors in `only`) in one parallel pass (Note [Parallel
  // read pass]). `dst(tensor)` gives the host address of a tensor's bytes, or null to decode into
  // staging; `done(tensor, chunk, offset, data)` runs after each chunk's checksum verified.
  template <typename DstFn, typename DoneFn>
  Status ReadAll(const Manifest& m, const std::set<std::string>* only, DstFn dst, DoneFn done,
                 const ProgressFn& progress, bool pinned_staging = false,
                 bool prefault_dst = false) const {
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

  StatusOr<std::vector<HostTensor>> Restore(int64_t step, const ProgressFn& progress) const {
    LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
    std::vector<HostTensor> out(m.tensors.size());
    std::unordered_map<const TensorRec*, HostTensor*> by;
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      out[i].info = Info(m.tensors[i]);
      out[i].data.resize(static_cast<size_t>(m.tensors[i].nbytes));
      by[&m.tensors[i]] = &out[i];
    }
    LF_RETURN_IF_ERROR(ReadAll(
        m, nullptr, [&](const TensorRec& t) { return by[&t]->data.data(); },
        [](const TensorRec&, size_t, int64_t, const uint8_t*) { return Status::Ok(); }, progress));
    return out;
  }

  Status RestoreInto(int64_t step, const std::map<std::string, RestoreTarget>& targets,
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

  Status Verify(int64_t step, const ProgressFn& progress) const {
    LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
    return ReadAll(
        m, nullptr, [](const TensorRec&) -> uint8_t* { return nullptr; },
        [](const TensorRec&, size_t, int64_t, const uint8_t*) { return Status::Ok(); }, progress);
  }

  static TensorInfo Info(const TensorRec& t) {
    return {t.name, DTypeName(t.dtype), t.shape, t.nbytes, static_cast<int64_t>(t.chunks.size())};
  }

  Status ExportSafetensors(int64_t step, const std::string& path,
                           const ProgressFn& progress) const {
    LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}, {"loongforge_step", std::to_string(step)}};
    int64_t off = 0;
    for (const auto& t : m.tensors) {
      header[t.name] = {{"dtype", DTypeSafetensorsName(t.dtype)},
                        {"shape", t.shape},
                        {"data_offsets", {off, off + t.nbytes}}};
      off += t.nbytes;
    }
    std::string h = header.dump();
    while (h.size() % 8 != 0) h.push_back(' ');
    const std::string tmp = path + ".tmp";
    LF_ASSIGN_OR_RETURN(auto f, opts_.env->NewWritableFile(tmp));
    uint8_t len_le[8];
    uint64_t hl = h.size();
    for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(hl >> (8 * i));
    Status s = f->Append(len_le, 8);
    if (s.ok()) s = f->Append(h.data(), h.size());
    // Tensors in manifest order, chunks in order (safetensors data must be contiguous).
    std::vector<uint8_t> scratch(static_cast<size_t>(m.chunk_bytes));
    ChunkDecoder dec(seg_dir_);
    int64_t done = 0;
    for (const auto& t : m.tensors) {
      for (size_t ci = 0; s.ok() && ci < t.chunks.size(); ++ci) {
        const ChunkRec& c = t.chunks[ci];
        s = dec.Decode(c, scratch.data(), ChunkWhat(step, t.name, ci, c.loc));
        if (s.ok()) s = f->Append(scratch.data(), static_cast<size_t>(c.raw));
        done += c.raw;
        if (progress) progress(done);
      }
    }
    if (s.ok()) s = f->Sync();
    Status c = f->Close();
    if (s.ok()) s = c;
    if (s.ok()) s = opts_.env->Rename(tmp, path);
    if (!s.ok()) {
      opts_.env->Remove(tmp).IgnoreError();
      return s.WithContext("export checkpoint " + std::to_string(step) + " to " + path);
    }
    return Status::Ok();
  }

  // ---------------- lifecycle ----------------

  Status Merge(int64_t step, const ProgressFn& progress) {
    std::lock_guard<std::mutex> api(api_mu_);
    if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
    LF_RETURN_IF_ERROR(WaitLocked());
    std::lock_guard<std::mutex> wl(writer_mu_);
    LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
    const std::string seg_name = NewSegmentName(step, "m");
    const std::string seg_path = seg_dir_ + "/" + seg_name;
    LF_ASSIGN_OR_RETURN(auto file, opts_.env->NewWritableFile(seg_path));
    ChunkDecoder dec(seg_dir_);
    std::vector<uint8_t> raw(static_cast<size_t>(m.chunk_bytes)), z;
    std::unordered_map<Hash128, ChunkRec, HashKey> done_map;
    int64_t off = 0, done_bytes = 0;
    Status s;
    for (auto& t : m.tensors) {
      for (size_t ci = 0; s.ok() && ci < t.chunks.size(); ++ci) {
        ChunkRec& c = t.chunks[ci];
        done_bytes += c.raw;
        if (auto it = done_map.find(c.hash); it != done_map.end()) {
          c = it->second;
          continue;
        }
        s = dec.Decode(c, raw.data(), ChunkWhat(step, t.name, ci, c.loc));
        if (!s.ok()) break;
        ChunkRec n;
        n.hash = c.hash;
        n.raw = c.raw;
        const uint8_t* payload = raw.data();
        int64_t len = c.raw;
        if (opts_.compress) {
          z.resize(ZSTD_compressBound(static_cast<size_t>(c.raw)));
          if (!cctx_) cctx_ = ZSTD_createCCtx();
          size_t zn = ZSTD_compressCCtx(cctx_, z.data(), z.size(), raw.data(),
                                        static_cast<size_t>(c.raw), opts_.compress_level);
          if (!ZSTD_isError(zn) && static_cast<double>(zn) < opts_.compress_max_ratio * c.raw) {
            n.codec = Codec::kZstd;
            payload = z.data();
            len = static_cast<int64_t>(zn);
          }
        }
        s = file->Append(payload, static_cast<size_t>(len));
        n.loc = {seg_name, off, len};
        off += len;
        done_map.emplace(n.hash, n);
        c = n;
        if (progress) progress(done_bytes);
      }
    }
    if (s.ok() && opts_.fsync) s = file->Sync();
    Status cs = file->Close();
    if (s.ok()) s = cs;
    if (s.ok() && opts_.fsync) s = opts_.env->SyncDir(seg_dir_);
    m.parent = -1;
    if (s.ok()) s = CommitManifest(m);  // atomically replaces the old manifest of `step`
    if (!s.ok()) {
      opts_.env->Remove(seg_path).IgnoreError();
      return s.WithContext("merge checkpoint " + std::to_string(step) + " (it is unchanged)");
    }
    if (step == latest_committed_) IndexFrom(m, /*seed_known=*/false);
    return GcLocked(false).status();
  }

  Status ApplyRetention() {
    std::lock_guard<std::mutex> api(api_mu_);
    if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
    LF_RETURN_IF_ERROR(WaitLocked());
    std::lock_guard<std::mutex> wl(writer_mu_);
    return RetentionLocked();
  }

  Status RetentionLocked() {
    if (opts_.keep_last <= 0) return Status::Ok();
    LF_ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
    if (steps.empty()) return Status::Ok();
    std::set<int64_t> keep;
    for (size_t i = steps.size() > static_cast<size_t>(opts_.keep_last)
                        ? steps.size() - static_cast<size_t>(opts_.keep_last)
                        : 0;
         i < steps.size(); ++i)
      keep.insert(steps[i]);
    keep.insert(steps.back());
    bool removed = false;
    for (int64_t s : steps) {
      if (keep.count(s) || (opts_.keep_every > 0 && s % opts_.keep_every == 0)) continue;
      LF_RETURN_IF_ERROR(opts_.env->Remove(man_dir_ + "/" + ManifestName(s)));
      removed = true;
    }
    if (removed && opts_.fsync) LF_RETURN_IF_ERROR(opts_.env->SyncDir(man_dir_));
    if (removed) return GcLocked(false).status();
    return Status::Ok();
  }

  StatusOr<GcStats> Gc(bool dry_run) {
    std::lock_guard<std::mutex> api(api_mu_);
    if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
    LF_RETURN_IF_ERROR(WaitLocked());
    std::lock_guard<std::mutex> wl(writer_mu_);
    return GcLocked(dry_run);
  }

  // Runs with writer_mu_ held, so no segment is being written. A manifest that cannot be read
  // stops gc: nothing is deleted unless every manifest proves it unreferenced.
  StatusOr<GcStats> GcLocked(bool dry_run) {
    LF_ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
    std::set<std::string> live;
    for (int64_t s : steps) {
      auto m = LoadManifest(s);
      if (!m.ok()) return m.status().WithContext("gc stopped, nothing deleted");
      for (auto& seg : m->Segments()) live.insert(seg);
    }
    GcStats st;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(seg_dir_, ec)) {
      const std::string name = e.path().filename().string();
      const int64_t size = static_cast<int64_t>(e.file_size(ec));
      if (live.count(name)) {
        ++st.segments_live;
        st.bytes_live += size;
        continue;
      }
      ++st.segments_deleted;
      st.bytes_freed += size;
      if (!dry_run) LF_RETURN_IF_ERROR(opts_.env->Remove(e.path().string()));
    }
    for (const auto& e : fs::directory_iterator(man_dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 && !dry_run)
        LF_RETURN_IF_ERROR(opts_.env->Remove(e.path().string()));
    }
    if (!dry_run && st.segments_deleted > 0 && opts_.fsync)
      LF_RETURN_IF_ERROR(opts_.env->SyncDir(seg_dir_));
    return st;
  }

  StatusOr<CheckpointSummary> Summary(int64_t step) const {
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

  SaveStats last_stats() const {
    std::lock_guard<std::mutex> l(mu_);
    return last_stats_;
  }

  std::string dir_;
  VaultOptions opts_;
  std::string man_dir_, seg_dir_;
  int lock_fd_ = -1;
  bool closed_ = false;
  int io_threads_ = 1;  // workers of read passes and snapshots (opts_.io_threads resolved)

  std::mutex api_mu_;      // serializes Save / Wait / Close / Merge / Gc
  mutable std::mutex mu_;  // inflight_, error_, last_stats_, free_arenas_
  std::condition_variable cv_;
  int inflight_ = 0;
  Status error_;
  SaveStats last_stats_;
  std::vector<std::unique_ptr<StagingArena>> free_arenas_;
  // Device staging arenas not held by a queued save, per device (Note [Device staging]).
  std::map<int, std::vector<std::unique_ptr<internal::DeviceArena>>> free_dev_arenas_;
  // Save-side (api_mu_): snapshot workers ("ckpt-snap", io_threads - 1 of them; the caller is
  // the last) and one device snapshot per CUDA device used.
  std::unique_ptr<ThreadPool> snap_pool_;
  std::map<int, std::unique_ptr<internal::DeviceSnapshot>> device_snaps_;

  // Save-side (api_mu_): hashes of the previous snapshot, last step saved.
  std::unordered_set<Hash128, HashKey> known_;
  int64_t last_step_ = -1;

  // Writer-side (writer_mu_): chunks of the latest committed manifest.
  std::mutex writer_mu_;
  std::unordered_map<Hash128, ChunkRec, HashKey> index_;
  std::unordered_map<std::string, std::vector<ChunkRec>> prev_slots_;
  int64_t latest_committed_ = -1;
  ZSTD_CCtx* cctx_ = nullptr;
  // Writer=cufile: the cuFile driver session (Note [cuFile writer]); null for the POSIX writer.
  // Set by Init, used by the writer thread and (deregistration) by Save / Close; thread-safe.
  std::unique_ptr<internal::CufileSession> cufile_;
  std::string writer_reason_;         // SaveStats::writer_reason prefix
  bool warned_unregistered_ = false;  // writer thread: logged a cuFileBufRegister failure
  // Writer-side: one staging reader per device (stream, hash batch, two pinned buffers).
  std::map<int, std::unique_ptr<internal::StagingReader>> readers_;

  BoundedQueue<std::unique_ptr<Job>> queue_;
  std::thread writer_;  // "ckpt-writer", joined by Close()
};

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
Status CheckpointVault::ExportSafetensors(int64_t step, const std::string& path,
                                          const ProgressFn& p) const {
  return impl_->ExportSafetensors(step, path, p);
}
Status CheckpointVault::Merge(int64_t step, const ProgressFn& p) { return impl_->Merge(step, p); }
Status CheckpointVault::ApplyRetention() { return impl_->ApplyRetention(); }
StatusOr<GcStats> CheckpointVault::Gc(bool dry_run) { return impl_->Gc(dry_run); }
SaveStats CheckpointVault::last_stats() const { return impl_->last_stats(); }
const std::string& CheckpointVault::dir() const { return impl_->dir_; }

}  // namespace ckpt
}  // namespace loongforge
