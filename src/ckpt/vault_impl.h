// CheckpointVault::Impl, shared by the files of the vault (private to src/ckpt):
//   vault.cc      open/close, the read path (list, restore, verify, describe), public wrappers
//   snapshot.cc   Save(): one function per snapshot path (host tensors, device tensors staged on
//                 the host, device staging), staging arenas
//   writer.cc     the background writer: segment write, manifest commit, chunk index
//   lifecycle.cc  merge, retention, gc, export, restore into a directory
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
// one segment of its own so that older ones can be dropped. Steps of 10^12 and more have names
// with more than 12 digits (names.h). Only files named by these patterns are the vault's: gc and
// retention never touch anything else (Note [Outputs are created, never followed]).
#pragma once

#include <zstd.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckpt/chunk_io.h"
#include "ckpt/chunk_sink.h"
#include "ckpt/device.h"
#include "ckpt/manifest.h"
#include "common/queue.h"
#include "common/thread_pool.h"
#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {
namespace internal {

struct HashKey {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
};

// Staging memory for one snapshot, recycled across saves (Note [Snapshot] in snapshot.cc).
struct StagingArena {
  HostBuffer buf;
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
// One save, from the snapshot to the writer.
struct Job {
  int64_t step = -1;
  std::vector<PendingTensor> tensors;
  std::unique_ptr<StagingArena> arena;
  std::vector<std::unique_ptr<DeviceArena>> dev_arenas;  // Note [Device staging]
  SaveStats stats;
  double t_save = 0;  // NowSeconds() when Save() was called (SaveStats::durable_s)
};
// A chunk of a job: tensor index, chunk index.
struct Slot {
  size_t ti, ci;
};

struct SnapshotPlan;  // snapshot.cc

// The largest manifest file read (a bound on the allocation a hostile file can cause).
constexpr int64_t kMaxManifestBytes = int64_t{1} << 30;
// Reads a whole manifest file; anything but a regular file (a FIFO, a device) is refused at once,
// never blocked on. Errors name the file.
StatusOr<std::string> ReadWholeFile(const std::string& path);
// Names in `dir`, except "." and "..". Errors name the directory (EACCES -> PermissionDenied).
StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir);

}  // namespace internal

class CheckpointVault::Impl {
 public:
  Impl(std::string dir, VaultOptions opts);
  ~Impl();
  Status Init();

  // snapshot.cc
  // `wait_for_slot` false: TrySave (returns with *queued false when max_inflight are pending).
  Status Save(int64_t step, const std::vector<TensorRef>& tensors, bool wait_for_slot = true,
              bool* queued = nullptr);
  bool Busy() const;
  StatusOr<int64_t> ReserveDeviceStaging(const std::vector<TensorRef>& tensors, std::string* why);
  std::vector<SaveStats> TakeCommittedStats();

  // vault.cc
  Status Wait();
  Status Close();
  StatusOr<std::vector<int64_t>> List() const;
  std::optional<int64_t> Latest() const;
  StatusOr<internal::Manifest> LoadManifest(int64_t step) const;
  StatusOr<std::vector<HostTensor>> Restore(int64_t step, const ProgressFn& progress) const;
  Status RestoreInto(int64_t step, const std::map<std::string, RestoreTarget>& targets,
                     const ProgressFn& progress) const;
  Status Verify(int64_t step, const ProgressFn& progress) const;
  StatusOr<CheckpointSummary> Summary(int64_t step) const;
  SaveStats last_stats() const;
  static TensorInfo Info(const internal::TensorRec& t);

  // lifecycle.cc
  Status ExportSafetensors(int64_t step, const std::string& path, const ExportOptions& opts,
                           const ProgressFn& progress) const;
  Status RestoreToDirectory(int64_t step, const std::string& out_dir, bool replace,
                            const ProgressFn& progress) const;
  Status Merge(int64_t step, const ProgressFn& progress);
  Status ApplyRetention();
  StatusOr<GcStats> Gc(bool dry_run);

  const std::string& dir() const { return dir_; }

 private:
  // vault.cc
  Status ChooseWriter();
  Status ProbeCufile();
  Status WaitLocked();
  void FreeDeviceArena(std::unique_ptr<internal::DeviceArena> a);
  template <typename DstFn, typename DoneFn>
  Status ReadAll(const internal::Manifest& m, const std::set<std::string>* only, DstFn dst,
                 DoneFn done, const ProgressFn& progress, bool pinned_staging = false,
                 bool prefault_dst = false) const;

  // snapshot.cc
  Status CheckTensors(const std::vector<TensorRef>& tensors, internal::Job* job) const;
  Status SnapshotDeviceStaged(internal::SnapshotPlan* p);
  Status BeginDeviceHashes(internal::SnapshotPlan* p);
  Status HashHostTensors(internal::SnapshotPlan* p);
  Status FetchDeviceHashes(internal::SnapshotPlan* p);
  void ChooseChunksToStage(internal::SnapshotPlan* p);
  Status CopyChangedChunks(internal::SnapshotPlan* p);
  Status Enqueue(std::unique_ptr<internal::Job> job, double t0);
  std::unique_ptr<internal::StagingArena> TakeArena();
  void ReturnArena(std::unique_ptr<internal::StagingArena> a);
  Status FailSnapshot(internal::Job* job, bool copies_enqueued, Status s);
  StatusOr<bool> TakeDeviceArenas(internal::Job* job,
                                  const std::map<int, std::vector<size_t>>& by_dev, SaveStats* st);
  std::string TakeDeviceArena(int dev, int64_t need, internal::Job* job, SaveStats* st,
                              std::string* how);
  void ReturnDeviceArenas(std::vector<std::unique_ptr<internal::DeviceArena>>* arenas);
  Status StageOnDevice(int dev, const std::vector<size_t>& tis,
                       const std::vector<TensorRef>& tensors, internal::DeviceArena* arena,
                       internal::Job* job);
  StatusOr<internal::DeviceSnapshot*> GetDeviceSnapshot(int device);
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // writer.cc
  void WriterLoop();
  Status WriteJob(internal::Job* job);
  template <typename OpenFn>
  Status WriteDeviceChunksCufile(internal::Job* job, internal::DeviceArena* arena,
                                 const std::vector<internal::Slot>& writes,
                                 const std::string& seg_name, const OpenFn& open_file,
                                 std::unique_ptr<internal::ChunkSink>* file, int64_t* seg_off,
                                 internal::Manifest* m);
  Status HashStaged(internal::Job* job);
  static internal::DeviceArena* DeviceArenaOf(internal::Job* job, int dev);
  StatusOr<internal::StagingReader*> GetStagingReader(int dev);
  Status CommitManifest(const internal::Manifest& m);
  void IndexFrom(const internal::Manifest& m, bool seed_known);

  // lifecycle.cc
  Status RetentionLocked();
  StatusOr<GcStats> GcLocked(bool dry_run);

  std::string dir_;
  VaultOptions opts_;
  std::string man_dir_, seg_dir_;
  int lock_fd_ = -1;
  bool closed_ = false;
  int io_threads_ = 1;  // workers of read passes and snapshots (opts_.io_threads resolved)

  std::mutex api_mu_;      // serializes Save / Wait / Close / Merge / Gc
  mutable std::mutex mu_;  // inflight_, error_, last_stats_, committed_, free_arenas_
  std::condition_variable cv_;
  int inflight_ = 0;
  Status error_;
  SaveStats last_stats_;
  std::deque<SaveStats> committed_;  // committed since the last TakeCommittedStats (bounded)
  std::vector<std::unique_ptr<internal::StagingArena>> free_arenas_;
  // Device staging arenas not held by a queued save, per device (Note [Device staging]).
  std::map<int, std::vector<std::unique_ptr<internal::DeviceArena>>> free_dev_arenas_;
  // Save-side (api_mu_): snapshot workers ("ckpt-snap", io_threads - 1 of them; the caller is
  // the last) and one device snapshot per CUDA device used.
  std::unique_ptr<ThreadPool> snap_pool_;
  std::map<int, std::unique_ptr<internal::DeviceSnapshot>> device_snaps_;

  // Save-side (api_mu_): hashes of the previous snapshot, last step saved.
  std::unordered_set<Hash128, internal::HashKey> known_;
  int64_t last_step_ = -1;

  // Writer-side (writer_mu_): chunks of the latest committed manifest.
  std::mutex writer_mu_;
  std::unordered_map<Hash128, internal::ChunkRec, internal::HashKey> index_;
  std::unordered_map<std::string, std::vector<internal::ChunkRec>> prev_slots_;
  int64_t latest_committed_ = -1;
  std::unique_ptr<internal::ChunkEncoder> encoder_;  // writer_mu_: save and merge encode chunks
  // Writer=cufile: the cuFile driver session (Note [cuFile writer]); null for the POSIX writer.
  // Set by Init, used by the writer thread and (deregistration) by Save / Close; thread-safe.
  std::unique_ptr<internal::CufileSession> cufile_;
  std::string writer_reason_;         // SaveStats::writer_reason prefix
  bool warned_unregistered_ = false;  // writer thread: logged a cuFileBufRegister failure
  // Writer-side: one staging reader per device (stream, hash batch, two pinned buffers).
  std::map<int, std::unique_ptr<internal::StagingReader>> readers_;

  BoundedQueue<std::unique_ptr<internal::Job>> queue_;
  std::thread writer_;  // "ckpt-writer", joined by Close()
};

}  // namespace ckpt
}  // namespace loongforge
