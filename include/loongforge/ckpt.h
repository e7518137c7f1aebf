// CheckpointVault: incremental, asynchronous, crash-consistent checkpoints of named tensors.
//
// A tensor (name, dtype, shape, contiguous bytes) is cut into fixed chunks (4 MiB by default), each
// hashed with XXH3-128. A checkpoint stores only the chunks whose hash is not already stored by the
// previous checkpoint; a manifest maps every tensor to its chunks (hash, length, compression,
// location). See Note [Vault layout] in src/ckpt/vault_impl.h for the on-disk format.
//
//   auto vault = CheckpointVault::Open(dir, opts);            // StatusOr<unique_ptr<...>>
//   (*vault)->Save(step, tensors);   // snapshots (copy to staging) and returns
//   (*vault)->Wait();                // waits for the background writer; returns its error, if any
//   (*vault)->RestoreInto(step, targets);
//
// Threads: a vault owns one background writer thread ("ckpt-writer"). Save/Wait/Close must be
// called from one thread at a time (they are serialized by a mutex). Read-only calls (List,
// Describe, Restore*, Verify, Export) may run from any thread.
//
// Errors: InvalidArgument (bad shape/step), NotFound (no such step), DataLoss (checksum
// mismatch, truncated or tampered manifest; the message names the tensor and chunk or the file),
// PermissionDenied (a directory or file of the vault cannot be read; the message names it),
// ResourceExhausted (disk full; older checkpoints stay intact), Unavailable (another process holds
// the vault open for writing), DeadlineExceeded (a wait ran past its timeout).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/status.h"
#include "loongforge/tensor.h"

namespace loongforge {
namespace ckpt {

// Element types are loongforge::DType (loongforge/tensor.h); manifests store DTypeName(), and
// safetensors exports DTypeSafetensorsName().

// 128-bit chunk hash (XXH3-128 of the chunk's raw bytes, seed 0).
struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
  std::string ToHex() const;  // 32 hex digits, hi then lo
  static StatusOr<Hash128> FromHex(const std::string& hex);
};
Hash128 HashBytes(const void* data, size_t len);

// A tensor to save: `view` stored under `name`, the same TensorView every module takes
// (loongforge/tensor.h). The view must be valid and contiguous, in host memory (pinned included)
// or, in CUDA builds, CUDA device memory; Save() returns InvalidArgument naming the tensor
// otherwise (Unimplemented for CUDA memory in a build without CUDA). The memory must stay
// unchanged until Save() returns, not longer. `view.stream` (CUDA tensors only) is the
// cudaStream_t on which the work producing the data was queued: the snapshot is ordered after
// everything queued on it so far (an event, no host sync), and with device staging work queued on
// it after Save() returns waits for the snapshot's copy; null = the legacy default stream. Work
// on other streams must not write the tensor before that copy is done (e.g. make such a stream
// wait on this one).
struct TensorRef {
  std::string name;
  TensorView view;
};

// A stored tensor's description.
struct TensorInfo {
  std::string name;
  std::string dtype;  // DTypeName() of the stored DType ("f32", "bf16", ...)
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
  int64_t num_chunks = 0;
};

// A tensor restored into a new CPU buffer.
struct HostTensor {
  TensorInfo info;
  std::vector<uint8_t> data;
};

// Where RestoreInto() puts a tensor: `nbytes` must equal the stored size; device -1 = CPU pointer,
// >= 0 = CUDA device pointer (CUDA builds only). CPU targets are overwritten in full, so
// RestoreInto advises transparent huge pages for them and pre-faults them in bulk (Note [Fresh
// memory]).
struct RestoreTarget {
  void* data = nullptr;
  int64_t nbytes = 0;
  int device = -1;

  // The memory of `view`, restored into as tensor `name`. Errors: InvalidArgument naming the
  // tensor when the view is not contiguous, not valid or read-only.
  static StatusOr<RestoreTarget> FromView(const std::string& name, const TensorView& view);
};

// Writable file and file-system operations used by the writer. The default is POSIX with fsync; a
// test can wrap it to inject failures (e.g. ENOSPC after N bytes).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(const void* data, size_t len) = 0;
  virtual Status Sync() = 0;  // fsync
  virtual Status Close() = 0;
};
class Env {
 public:
  virtual ~Env() = default;
  // Creates `path` as a new file: fails (AlreadyExists) if anything, a symlink included, is
  // there already (O_CREAT | O_EXCL | O_NOFOLLOW; Note [Outputs are created, never followed] in
  // src/common/file_util.h). The vault passes only new, random names.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual Status Remove(const std::string& path) = 0;
  static std::shared_ptr<Env> Posix();
};

// Where Save() stages device tensors (Note [Device staging] in src/ckpt/snapshot.cc).
//   kAuto: a device arena when cudaMemGetInfo shows room for it with a margin (max(1 GiB, 10% of
//          the device)) and it is within device_staging_max_bytes; else pinned host staging.
//   kOn:   a device arena always; Save() returns ResourceExhausted when it cannot have one.
//   kOff:  pinned host staging (Save() hashes on the device and copies changed chunks to the host
//          before it returns).
enum class DeviceStaging { kAuto, kOn, kOff };
StatusOr<DeviceStaging> ParseDeviceStaging(const std::string& name);  // "auto" | "on" | "off"

// How the writer moves device-staged chunks to the segment file (Note [cuFile writer] in
// src/ckpt/chunk_sink.h).
//   kPosix:  device staging -> two pinned host buffers -> write(2) (the default path).
//   kCufile: raw device-staged chunks go straight from the staging arena to the file with
//   cuFileWrite
//            (NVIDIA GPUDirect Storage; its POSIX compat mode where the nvidia-fs driver is
//            absent). Open() fails (Unimplemented / Unavailable, with the reason) when cuFile is
//            not built or its driver cannot be opened. Chunks that are compressed or XOR-delta
//            coded, and host-staged chunks, are still written from host memory; the bytes on disk
//            are identical.
//   kAuto:   kPosix; stats name the writer and why (writer, writer_reason).
enum class Writer { kAuto, kPosix, kCufile };
StatusOr<Writer> ParseWriter(const std::string& name);  // "auto" | "posix" | "cufile"

struct VaultOptions {
  int64_t chunk_bytes = int64_t{4} << 20;  // chunk size; >= 4 KiB, a multiple of 64
  bool compress = false;                   // zstd per chunk, kept only when it pays
  int compress_level = 1;                  // zstd level
  double compress_max_ratio = 0.9;         // keep compressed if stored < ratio * raw
  bool xor_delta = false;  // store a changed chunk as zstd(XOR with the previous full version)
                           // when that is smaller; restore reads base + delta (depth 1, no chains)
  int keep_last = 0;       // retention: keep the N newest checkpoints (0 = keep all)
  int keep_every = 0;      // retention: also keep steps that are multiples of M (0 = none)
  int max_inflight = 1;    // saves snapshotted but not yet committed; Save() blocks beyond this
  bool fsync = true;       // fsync data, manifest and directories (off only for benchmarks)
  bool read_only = false;  // open for reading (CLI ls/show/verify/export); no writer thread
  int io_threads = 0;      // threads that read/verify chunks on restore and verify, and hash/copy
                           // chunks in a snapshot (0 = min(4, hardware threads))
  int64_t wait_timeout_ms = 30 * 60 * 1000;  // bound on every wait for the writer
  DeviceStaging device_staging = DeviceStaging::kAuto;
  int64_t device_staging_max_bytes = 0;          // cap on one device's staging arena (0 = no cap)
  int64_t d2h_buffer_bytes = int64_t{64} << 20;  // each of the writer's two pinned buffers per
                                                 // device for device-staged chunks (>= chunk_bytes)
  // Segment writer for device-staged chunks (Note [cuFile writer]). With kCufile, segment files
  // are created with open(2) directly (not through `env`); manifests still go through `env`.
  Writer writer = Writer::kAuto;
  std::shared_ptr<Env> env;  // null = Env::Posix()
};

// Figures of one save.
struct SaveStats {
  int64_t step = -1;
  double blocking_s = 0;          // time Save() blocked the caller (back-pressure + snapshot)
  double wait_s = 0;              // back-pressure part of blocking_s: waiting for the writer to
                                  // commit an earlier save (max_inflight saves were pending)
  double prepare_s = 0;           // checking the tensors and planning chunks (part of blocking_s)
  double snapshot_s = 0;          // stage + hash + copy part of blocking_s
  double stage_s = 0;             //   device staging: taking the arenas and queueing the copies
  double hash_s = 0;              //   hashing every chunk (CPU workers / device kernels)
  double copy_s = 0;              //   copying changed chunks to staging (0 when fused with hashing)
  double write_s = 0;             // background: compress + write + fsync + commit
  double durable_s = 0;           // Save() call to the commit of its manifest (0 until committed)
  int64_t bytes_total = 0;        // raw bytes of the state
  int64_t bytes_copied = 0;       // raw bytes copied into staging by the snapshot
  int64_t staging_allocated = 0;  // staging bytes newly allocated (0: a recycled arena sufficed)
  int64_t bytes_written = 0;      // bytes appended to the new segment (after compression)
  int64_t chunks_total = 0;
  int64_t chunks_written = 0;
  int64_t chunks_skipped = 0;  // unchanged (or duplicate) chunks referenced, not written
  int64_t chunks_compressed = 0;
  int64_t chunks_delta = 0;
  // Snapshot path: "host" (CPU tensors and, without device staging, device tensors hashed on the
  // device and their changed chunks copied to host staging before Save() returns) or "device"
  // (device tensors copied into a device arena; hashing and device-to-host copies happen in the
  // background). `snapshot_reason` says why (e.g. the cap or free device memory).
  std::string snapshot_path;
  std::string snapshot_reason;
  double staged_hash_s = 0;  // background: hashing the device-staged copy
  double d2h_s = 0;          // background: waiting for device-staging -> host transfers
  int64_t bytes_d2h = 0;     // background: bytes moved from device staging to the host
  // Segment writer of this save: "posix" or "cufile"; `writer_reason` says why (the option, the
  // cuFile mode, e.g. "compat mode (nvidia-fs not loaded)", and which chunks went which way).
  std::string writer;
  std::string writer_reason;
  int64_t chunks_cufile = 0;  // chunks written by cuFileWrite straight from device memory
  int64_t bytes_cufile = 0;   // their bytes
  double cufile_s = 0;        // background: time in cuFileWrite calls
};

struct CheckpointSummary {
  int64_t step = -1;
  int64_t parent = -1;  // the checkpoint it was built on, -1 for a full one
  int64_t num_tensors = 0;
  int64_t bytes_total = 0;   // raw bytes of all tensors
  int64_t bytes_own = 0;     // stored bytes in this checkpoint's own segment
  int64_t num_segments = 0;  // segments it references (1 = self-contained)
  double created_unix = 0;
};

struct GcStats {
  int64_t segments_deleted = 0;
  int64_t bytes_freed = 0;
  int64_t segments_live = 0;
  int64_t bytes_live = 0;
  // Paths in segments/ that gc left alone because they are not segment files of the vault
  // (other names, directories, symlinks, ...).
  std::vector<std::string> skipped;
};

using ProgressFn = std::function<void(int64_t bytes_done)>;

// Options of CheckpointVault::ExportSafetensors.
struct ExportOptions {
  // Replace an existing regular file at the output path.
  bool replace = false;
  // Write only the tensors whose key path in the saved structure starts with `strip_prefix`,
  // named by the rest of the path, and nothing else (no optimizer state, no structure chunk, no
  // LoongForge metadata), so that model.load_state_dict() takes the file's tensors directly.
  // Key paths are those of loongforge.ckpt's structure chunk ("model/" + the state-dict key for
  // {"model": model.state_dict(), ...}); tensors sharing storage (tied weights) are written
  // each as a tensor of its own. A vault without that chunk (saved from C++) matches tensor names.
  // A prefix that matches no tensor is InvalidArgument naming it.
  bool model_only = false;
  std::string strip_prefix = "model/";
};

class CheckpointVault {
 public:
  // Opens (creating if needed, unless read_only) the vault in `dir`. A writable vault takes an
  // exclusive lock on DIR/LOCK: a second writer gets Unavailable.
  static StatusOr<std::unique_ptr<CheckpointVault>> Open(const std::string& dir,
                                                         const VaultOptions& opts = {});
  ~CheckpointVault();  // Close(); logs a writer error nobody collected
  CheckpointVault(const CheckpointVault&) = delete;
  CheckpointVault& operator=(const CheckpointVault&) = delete;

  // Snapshots `tensors` and queues them for the background writer: CPU tensors are hashed and their
  // changed chunks copied to host staging; device tensors are copied into a device arena (device
  // staging) or hashed on the device with changed chunks copied to pinned host staging (Note
  // [Device staging]). With device staging, each TensorRef::view.stream is made to wait (on the
  // GPU, not the host) until the copy is done, so kernels the caller queues on it after Save()
  // returns cannot overwrite a tensor before the snapshot read it. Blocks while max_inflight saves
  // are pending. `step` must be greater than every step saved before. Returns a pending writer
  // error first (the save is then not queued).
  Status Save(int64_t step, const std::vector<TensorRef>& tensors);
  // Save() that never waits for the writer (Note [When the writer is busy] in
  // src/ckpt/snapshot.cc): when max_inflight saves are pending it snapshots nothing, queues
  // nothing and returns false at once (the caller skips this checkpoint; the step is not
  // consumed, so a later Save of it is allowed). True when the save was queued, as by Save().
  // Returns a pending writer error first.
  StatusOr<bool> TrySave(int64_t step, const std::vector<TensorRef>& tensors);
  // Allocates ahead the device staging arenas a Save() of `tensors` would take (Note [Device
  // staging] in src/ckpt/snapshot.cc), so that the first save does not pay cudaMalloc inside the
  // caller's step (26 GB for n16 + AdamW: ~50 ms). Returns the bytes newly allocated; 0 with
  // `*why` set when nothing was reserved (device staging off, no CUDA tensors, arenas already
  // large enough, not enough free device memory under device_staging=auto, or a save in flight).
  // Errors: device_staging=on and the arena cannot be allocated (ResourceExhausted).
  StatusOr<int64_t> ReserveDeviceStaging(const std::vector<TensorRef>& tensors, std::string* why);
  // True while max_inflight saves are snapshotted but not committed: Save() would wait now.
  // Only the writer ends this state, so a caller that serializes its Save calls and sees false
  // knows its next Save will not wait.
  bool Busy() const;
  // Figures of the saves committed since the previous call, oldest first (durable_s and the
  // writer's figures filled in). At most kMaxCommittedStats are kept; older ones are dropped.
  static constexpr size_t kMaxCommittedStats = 256;
  std::vector<SaveStats> TakeCommittedStats();
  // Waits until every queued save is committed; returns the first writer error since the last call.
  Status Wait();
  // Wait() and stop the writer thread. Idempotent.
  Status Close();

  // Committed steps (every manifest name, damaged manifests included), ascending.
  StatusOr<std::vector<int64_t>> List() const;
  // The newest step whose manifest loads; a damaged newer one is skipped with a warning in the
  // log that names the file and why. nullopt if there is none.
  std::optional<int64_t> Latest() const;
  StatusOr<CheckpointSummary> Summary(int64_t step) const;
  StatusOr<std::vector<TensorInfo>> Describe(int64_t step) const;
  // Summary, Describe, Restore*, Verify, Export: an explicit step whose manifest is damaged is
  // DataLoss naming the manifest file.
  // Restores every tensor into new CPU buffers (one pass over the chunks; each checksum verified).
  StatusOr<std::vector<HostTensor>> Restore(int64_t step, const ProgressFn& progress = {}) const;
  // Restores into caller buffers; `targets` names a subset (or all) of the tensors. Chunks are read
  // and verified by io_threads workers (`progress` is called from them, serialized, with a growing
  // byte count); on DataLoss the targets hold partial data.
  Status RestoreInto(int64_t step, const std::map<std::string, RestoreTarget>& targets,
                     const ProgressFn& progress = {}) const;
  // Reads every chunk of `step` and recomputes its checksum.
  Status Verify(int64_t step, const ProgressFn& progress = {}) const;
  // Writes `step` as a safetensors file (atomically: a new temporary file next to `path`,
  // fsync, rename). An existing `path` is replaced only if it is a regular file and `replace`
  // is given (AlreadyExists otherwise); a directory, device, FIFO or symlink at `path` is
  // refused (InvalidArgument), never written through.
  Status ExportSafetensors(int64_t step, const std::string& path, bool replace = false,
                           const ProgressFn& progress = {}) const;
  // The same with ExportOptions: `model_only` writes a plain state dict (see ExportOptions).
  Status ExportSafetensors(int64_t step, const std::string& path, const ExportOptions& opts,
                           const ProgressFn& progress = {}) const;
  // Writes every tensor of `step` as OUT/<i>.bin (raw bytes) plus OUT/tensors.json (name, dtype,
  // shape, file of each). OUT is created if missing; an existing non-empty OUT is AlreadyExists
  // unless `replace`, which replaces only the files restore writes. On any failure (e.g. a full
  // disk) nothing partial is left (Note [Restore into a directory] in src/ckpt/lifecycle.cc).
  Status RestoreToDirectory(int64_t step, const std::string& out_dir, bool replace = false,
                            const ProgressFn& progress = {}) const;

  // Rewrites `step` into one segment of its own (self-contained) and recommits its manifest.
  Status Merge(int64_t step, const ProgressFn& progress = {});
  // Applies keep_last / keep_every (never deletes the newest), then gc.
  Status ApplyRetention();
  // Deletes segments no manifest references and stray temp manifests. Never a referenced
  // segment, and only regular files named like the vault's own (others: GcStats::skipped).
  StatusOr<GcStats> Gc(bool dry_run = false);

  SaveStats last_stats() const;
  const std::string& dir() const;

  class Impl;

 private:
  explicit CheckpointVault(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
}  // namespace loongforge
