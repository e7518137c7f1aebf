// CheckpointVault::Save: the snapshot of the caller's tensors, one function per path, and the
// staging arenas it fills. The write happens in writer.cc.
//
//   host tensors                    HashHostTensors (fused hash + copy, or hash), then the
//                                   changed chunks in CopyChangedChunks
//   device tensors, host staging    BeginDeviceHashes / FetchDeviceHashes, then their changed
//                                   chunks by DMA in CopyChangedChunks
//   device tensors, device staging  SnapshotDeviceStaged (a device-to-device copy; the writer
//                                   hashes the copy)
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
// tensors right after Save() returns, and its next kernels go to the same stream (TensorRef::view.
// stream, the current stream in Python). So Publish makes each producer stream wait for the
// arena's ready event (cudaStreamWaitEvent): the host is not blocked, but the caller's later work
// on that stream starts only after the snapshot copy finished, a few milliseconds of GPU time.
// Work the caller queues on other streams is not ordered by this (documented in ckpt.h).
//
// Note [When the writer is busy]
// What can hold Save() (and so the training step) for long, from the trainer down:
//   1. Python, before the call: the caller builds the state (model/optimizer state_dict: views,
//      no copies); CheckpointVault.save flattens it (one pass over the dict, pickles the small
//      non-tensor skeleton) and makes non-contiguous tensors contiguous (parameters and AdamW
//      moments are contiguous: no copy). A CUDA tensor is copied to the host in Python only in a
//      build without CUDA. The trainer's per-rank state (loader position, RNG) is a small
//      torch.save; reading CUDA RNG state or a GPU loader's position may wait for the queued
//      step (one step at most).
//   2. Back-pressure (SaveStats::wait_s): Save() waits while max_inflight (default 1) earlier
//      saves are not committed. Every chunk of a training state changes between checkpoints, so
//      each save writes the whole state: 26 GB at ~2 GB/s is ~13 s of writing, longer than 100
//      steps of 109 ms. A cadence faster than the disk makes every save wait for the previous
//      write: this, not the snapshot, is the stall measured in the trainer (13 s per save at
//      --ckpt-every 10).
//   3. Device arenas (snapshot_s, staging_allocated): the first save, and a save whose state
//      grew, cudaMalloc's an arena of the whole device state (after cudaFree of the smaller one,
//      which synchronizes the device). With device_staging=auto, an arena that would leave less
//      than max(1 GiB, 10% of the device) free sends the save to host staging instead
//      (snapshot_reason says so): then Save() waits for the device hashes, copies every changed
//      chunk over PCIe into pinned memory, and the first such save cudaHostAlloc's the whole
//      state (seconds for tens of GB).
//   4. Host tensors (snapshot_s): hashed (and copied when changed) on io_threads workers.
// The remedy for 2 is a choice the caller makes (issue: wait, or skip and say so): Save() is
// today's back-pressure; TrySave() returns false at once while the writer is busy, so a
// trainer can skip that checkpoint and log it. Skipping never touches the committed
// checkpoints or the save in flight, and a skipped step may be saved later. Busy() answers the
// same question without a state to snapshot. TakeCommittedStats() gives each committed save's
// bytes_written and durable_s (Save() call to manifest commit).

// Note [Change detection]
// Save() hashes every chunk on the caller's thread and copies only chunks whose hash the previous
// snapshot did not contain (the first save after Open compares with the latest committed manifest).
// The writer resolves every hash against the chunks of the latest committed manifest, so an
// unchanged chunk costs one hash and no copy. If a save fails, the next Save() snapshots in full.
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>

#include "ckpt/vault_impl.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace ckpt {
using internal::Job;
using internal::PendingChunk;
using internal::PendingTensor;
using internal::StagingArena;

namespace {
constexpr int64_t kArenaAlign = 256;  // device arena: tensors back to back at this alignment
int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
// The CUDA device of `t`, or -1 for host memory (pinned included).
int CudaIndex(const TensorRef& t) { return t.view.device.is_cuda() ? t.view.device.index : -1; }
}  // namespace

namespace internal {
// The state of one Save() while it snapshots: the layout of the tensors' chunks, their hashes,
// and which chunks go to the staging arena.
struct SnapshotPlan {
  SnapshotPlan(const std::vector<TensorRef>& t, std::unique_ptr<Job> j, int64_t chunk_bytes)
      : tensors(t), job(std::move(j)), cb(chunk_bytes), nt(t.size()), first_slot(nt), byte_off(nt) {
    for (size_t ti = 0; ti < nt; ++ti) {
      const int64_t nchunks = (job->tensors[ti].nbytes + cb - 1) / cb;
      first_slot[ti] = nslots;
      byte_off[ti] = total_bytes;  // fused layout: the tensors back to back
      nslots += nchunks;
      total_bytes += job->tensors[ti].nbytes;
      if (job->tensors[ti].device >= 0) {
        by_dev[job->tensors[ti].device].push_back(ti);
      } else {
        for (int64_t c = 0; c < nchunks; ++c) cpu_slots.push_back({ti, c});
      }
      job->tensors[ti].chunks.resize(static_cast<size_t>(nchunks));
    }
    hashes.resize(static_cast<size_t>(nslots));
  }
  const uint8_t* ChunkSrc(size_t ti, int64_t c) const {
    return static_cast<const uint8_t*>(tensors[ti].view.data) + c * cb;
  }
  int64_t ChunkLen(size_t ti, int64_t c) const {
    return std::min(cb, job->tensors[ti].nbytes - c * cb);
  }
  Hash128& HashOf(size_t ti, int64_t c) { return hashes[static_cast<size_t>(first_slot[ti] + c)]; }
  SaveStats& stats() { return job->stats; }

  const std::vector<TensorRef>& tensors;
  std::unique_ptr<Job> job;
  const int64_t cb;
  const size_t nt;
  std::vector<int64_t> first_slot, byte_off;
  int64_t nslots = 0, total_bytes = 0;
  std::map<int, std::vector<size_t>> by_dev;          // device -> its tensors (host staging)
  std::vector<std::pair<size_t, int64_t>> cpu_slots;  // (tensor, chunk) of CPU tensors
  std::vector<Hash128> hashes;
  bool dev_staged = false;  // the device tensors went to device arenas (Note [Device staging])
  std::vector<std::pair<int, DeviceSnapshot*>> dsnaps;  // host staging of device tensors
  bool fused = false;  // hash and copy in one pass (Note [Snapshot])
  // Chunks to copy into the arena (not fused): tensor, chunk, offset in the arena.
  struct Copy {
    size_t ti;
    int64_t c;
    size_t dst_off;
  };
  std::vector<Copy> copies;
  size_t staged_bytes = 0;
  std::unordered_set<Hash128, HashKey> now;  // hashes of this snapshot
};

}  // namespace internal
using internal::SnapshotPlan;

Status CheckpointVault::Impl::Save(int64_t step, const std::vector<TensorRef>& tensors,
                                   bool wait_for_slot, bool* queued) {
  std::lock_guard<std::mutex> api(api_mu_);
  const double t0 = NowSeconds();
  if (queued) *queued = false;
  if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
  if (closed_) return FailedPreconditionError("vault " + dir_ + " is closed");
  // Back-pressure: wait for a free in-flight slot (Note [When the writer is busy]); TrySave
  // returns instead, after reporting a pending writer error.
  double wait_s = 0;
  {
    std::unique_lock<std::mutex> l(mu_);
    auto collect_error = [&] {
      Status e = error_;
      error_ = Status::Ok();
      known_.clear();  // Note [Change detection]: the next save is full
      return e;
    };
    if (!wait_for_slot && inflight_ >= opts_.max_inflight)
      return error_.ok() ? Status::Ok() : collect_error();
    if (!cv_.wait_for(l, std::chrono::milliseconds(opts_.wait_timeout_ms),
                      [&] { return inflight_ < opts_.max_inflight; }))
      return DeadlineExceededError("checkpoint save: writer did not free a slot within " +
                                   std::to_string(opts_.wait_timeout_ms) + " ms");
    wait_s = NowSeconds() - t0;
    if (!error_.ok()) return collect_error();
  }
  if (step < 0)
    return InvalidArgumentError("checkpoint step must be >= 0, got " + std::to_string(step));
  if (step <= last_step_)
    return InvalidArgumentError("checkpoint step " + std::to_string(step) +
                                " is not greater than the last step " + std::to_string(last_step_));
  auto job = std::make_unique<Job>();
  job->step = step;
  job->t_save = t0;
  job->stats.wait_s = wait_s;
  LF_RETURN_IF_ERROR(CheckTensors(tensors, job.get()));
  // Snapshot: Note [Snapshot].
  SnapshotPlan p(tensors, std::move(job), opts_.chunk_bytes);
  SaveStats& st = p.stats();
  st.step = step;
  st.writer = cufile_ ? "cufile" : "posix";  // the writer adds details (Note [cuFile writer])
  st.writer_reason = writer_reason_;
  const double ts0 = NowSeconds();
  st.prepare_s = ts0 - t0 - wait_s;
  LF_RETURN_IF_ERROR(SnapshotDeviceStaged(&p));
  const double ts_staged = NowSeconds();
  st.stage_s = ts_staged - ts0;
  // Device tensors left for host staging: their hash kernels run while the host hashes.
  LF_RETURN_IF_ERROR(BeginDeviceHashes(&p));
  p.job->arena = TakeArena();
  // Fused first snapshot: with nothing known every chunk is copied, so hash and copy each chunk
  // in one pass over the source (it is read once, and is in cache for the copy).
  p.fused = known_.empty() && p.by_dev.empty() && !p.dev_staged;
  LF_RETURN_IF_ERROR(HashHostTensors(&p));
  LF_RETURN_IF_ERROR(FetchDeviceHashes(&p));
  const double ts1 = NowSeconds();
  st.hash_s = ts1 - ts_staged;
  ChooseChunksToStage(&p);
  if (!p.fused) LF_RETURN_IF_ERROR(CopyChangedChunks(&p));
  st.copy_s = NowSeconds() - ts1;
  known_ = std::move(p.now);
  last_step_ = step;
  st.snapshot_s = NowSeconds() - ts0;
  LF_RETURN_IF_ERROR(Enqueue(std::move(p.job), t0));
  if (queued) *queued = true;
  return Status::Ok();
}

bool CheckpointVault::Impl::Busy() const {
  std::lock_guard<std::mutex> l(mu_);
  return inflight_ >= opts_.max_inflight;
}

// The arenas TakeDeviceArenas would take for `tensors`, allocated now and put on the free lists,
// where the next Save() finds them recycled. Only with no save in flight: an in-flight save holds
// its arena, and allocating another would break "at most max_inflight arenas exist".
StatusOr<int64_t> CheckpointVault::Impl::ReserveDeviceStaging(const std::vector<TensorRef>& tensors,
                                                              std::string* why) {
  why->clear();
  if (opts_.device_staging == DeviceStaging::kOff) {
    *why = "device_staging=off";
    return int64_t{0};
  }
  if (!internal::DeviceSupportCompiled()) {
    *why = "built without CUDA";
    return int64_t{0};
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_ > 0) {
      *why = "a save is in flight (its arena is reused when it commits)";
      return int64_t{0};
    }
  }
  std::map<int, int64_t> need;  // device -> arena bytes, laid out as TakeDeviceArenas does
  for (const TensorRef& t : tensors) {
    const int dev = CudaIndex(t);
    if (dev >= 0) need[dev] += AlignUp(t.view.nbytes(), kArenaAlign);
  }
  if (need.empty()) {
    *why = "no CUDA tensors";
    return int64_t{0};
  }
  internal::Job job;
  SaveStats st;
  std::string how;
  for (auto& [dev, bytes] : need) {
    // The device's snapshot stream and events too: the first Save() creates nothing.
    LF_RETURN_IF_ERROR(GetDeviceSnapshot(dev).status());
    std::string no = TakeDeviceArena(dev, std::max(bytes, kArenaAlign), &job, &st, &how);
    if (!no.empty()) {
      *why = no;
      break;
    }
  }
  ReturnDeviceArenas(&job.dev_arenas);
  if (!why->empty() && opts_.device_staging == DeviceStaging::kOn)
    return ResourceExhaustedError("device_staging=on but " + *why);
  if (why->empty() && st.staging_allocated == 0) *why = "the recycled arenas are large enough";
  return st.staging_allocated;
}

std::vector<SaveStats> CheckpointVault::Impl::TakeCommittedStats() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<SaveStats> out(committed_.begin(), committed_.end());
  committed_.clear();
  return out;
}

// Validates `tensors` (names unique and non-empty; views valid, contiguous, on the host or on a
// CUDA device of a CUDA build) and sizes job->tensors from them.
Status CheckpointVault::Impl::CheckTensors(const std::vector<TensorRef>& tensors, Job* job) const {
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty()) return InvalidArgumentError("tensor with an empty name");
    if (!names.insert(t.name).second)
      return InvalidArgumentError("tensor name '" + t.name + "' appears twice");
    LF_RETURN_IF_ERROR(t.view.CheckValid(t.name));
    LF_RETURN_IF_ERROR(t.view.CheckContiguous(t.name));
    if (t.view.device.is_cuda() && !internal::DeviceSupportCompiled())
      return UnimplementedError("tensor '" + t.name +
                                "' is on a CUDA device but CUDA support is not compiled in");
    PendingTensor pt{t.name, t.view.dtype, t.view.shape, t.view.nbytes(), {}};
    pt.device = CudaIndex(t);
    job->tensors.push_back(std::move(pt));
  }
  return Status::Ok();
}

// Path "device": Note [Device staging]. Copies the device tensors into device arenas and moves
// on; leaves p->by_dev empty then. Otherwise (no arena, or staging off) the device tensors stay
// in p->by_dev for host staging.
Status CheckpointVault::Impl::SnapshotDeviceStaged(SnapshotPlan* p) {
  SaveStats& st = p->stats();
  st.snapshot_path = "host";
  st.snapshot_reason = p->by_dev.empty() ? "no device tensors" : "";
  if (p->by_dev.empty()) return Status::Ok();
  LF_ASSIGN_OR_RETURN(p->dev_staged, TakeDeviceArenas(p->job.get(), p->by_dev, &st));
  if (!p->dev_staged) return Status::Ok();
  st.snapshot_path = "device";
  for (auto& [dev, tis] : p->by_dev) {
    internal::DeviceArena* arena = nullptr;
    for (auto& a : p->job->dev_arenas)
      if (a->device() == dev) arena = a.get();
    Status s = StageOnDevice(dev, tis, p->tensors, arena, p->job.get());
    if (!s.ok())
      return FailSnapshot(p->job.get(), false,
                          s.WithContext("device staging on CUDA device " + std::to_string(dev)));
  }
  p->by_dev.clear();  // nothing left for the host-staging device path
  return Status::Ok();
}

// Path "device tensors, host staging", first half: one hash kernel per device queued on its
// snapshot stream (it runs while the host hashes the CPU tensors).
Status CheckpointVault::Impl::BeginDeviceHashes(SnapshotPlan* p) {
  const int64_t cb = p->cb;
  for (auto& [dev, tis] : p->by_dev) {
    LF_ASSIGN_OR_RETURN(internal::DeviceSnapshot * ds, GetDeviceSnapshot(dev));
    int64_t dslots = 0;
    std::vector<void*> streams;
    for (size_t ti : tis) {
      dslots += (p->job->tensors[ti].nbytes + cb - 1) / cb;
      if (std::find(streams.begin(), streams.end(), p->tensors[ti].view.stream) == streams.end())
        streams.push_back(p->tensors[ti].view.stream);
    }
    LF_RETURN_IF_ERROR_CTX(ds->Begin(dslots, static_cast<int64_t>(tis.size()), streams),
                           "snapshot on CUDA device " + std::to_string(dev));
    int64_t k = 0;
    for (size_t ti : tis) {
      LF_RETURN_IF_ERROR_CTX(
          ds->EnqueueHash(p->tensors[ti].view.data, p->job->tensors[ti].nbytes, cb, k),
          "hash tensor '" + p->tensors[ti].name + "' on device");
      k += (p->job->tensors[ti].nbytes + cb - 1) / cb;
    }
    LF_RETURN_IF_ERROR_CTX(ds->SubmitHashes(),
                           "hash tensors on CUDA device " + std::to_string(dev));
    p->dsnaps.push_back({dev, ds});
  }
  return Status::Ok();
}

// Path "host tensors": hashes every CPU chunk on the snapshot workers; fused, also copies it.
Status CheckpointVault::Impl::HashHostTensors(SnapshotPlan* p) {
  if (!p->fused) {
    ParallelFor(p->cpu_slots.size(), [&](size_t i) {
      auto [ti, c] = p->cpu_slots[i];
      p->HashOf(ti, c) = HashBytes(p->ChunkSrc(ti, c), static_cast<size_t>(p->ChunkLen(ti, c)));
    });
    return Status::Ok();
  }
  internal::StagingArena* sa = p->job->arena.get();
  if (!sa->Reserve(static_cast<size_t>(std::max<int64_t>(p->total_bytes, 1)), false,
                   &p->stats().staging_allocated))
    return FailSnapshot(p->job.get(), false,
                        ResourceExhaustedError("out of host memory for a checkpoint snapshot"));
  uint8_t* base = sa->buf.data();
  const size_t pop = sa->populated;
  ParallelFor(p->cpu_slots.size(), [&](size_t i) {
    auto [ti, c] = p->cpu_slots[i];
    const size_t len = static_cast<size_t>(p->ChunkLen(ti, c));
    uint8_t* dst = base + p->byte_off[ti] + c * p->cb;
    p->HashOf(ti, c) = HashBytes(p->ChunkSrc(ti, c), len);
    if (static_cast<size_t>(dst - base) + len > pop) internal::PrefaultForWrite(dst, len);
    std::memcpy(dst, p->ChunkSrc(ti, c), len);
  });
  sa->populated = std::max(pop, static_cast<size_t>(p->total_bytes));
  return Status::Ok();
}

// Path "device tensors, host staging": collects the hashes BeginDeviceHashes queued.
Status CheckpointVault::Impl::FetchDeviceHashes(SnapshotPlan* p) {
  for (auto& [dev, ds] : p->dsnaps) {
    std::vector<Hash128> dh;
    Status s = ds->FetchHashes(&dh, opts_.wait_timeout_ms);
    if (!s.ok())
      return FailSnapshot(p->job.get(), false,
                          s.WithContext("hash tensors on CUDA device " + std::to_string(dev)));
    int64_t k = 0;
    for (size_t ti : p->by_dev[dev])
      for (int64_t c = 0; c < static_cast<int64_t>(p->job->tensors[ti].chunks.size()); ++c)
        p->HashOf(ti, c) = dh[static_cast<size_t>(k++)];
  }
  return Status::Ok();
}

// Decides which chunks to stage: those the previous snapshot did not have (first copy only).
// Fused, they are in the arena already; else they are listed in p->copies.
void CheckpointVault::Impl::ChooseChunksToStage(SnapshotPlan* p) {
  SaveStats& st = p->stats();
  uint8_t* base = p->job->arena->buf.data();
  for (size_t ti = 0; ti < p->nt; ++ti) {
    PendingTensor& pt = p->job->tensors[ti];
    if (pt.dev_off >= 0) {  // device staged: hashed and resolved by the writer
      for (int64_t c = 0; c < static_cast<int64_t>(pt.chunks.size()); ++c)
        pt.chunks[static_cast<size_t>(c)].raw = p->ChunkLen(ti, c);
      st.chunks_total += static_cast<int64_t>(pt.chunks.size());
      st.bytes_total += pt.nbytes;
      st.bytes_copied += pt.nbytes;
      continue;
    }
    for (int64_t c = 0; c < static_cast<int64_t>(pt.chunks.size()); ++c) {
      PendingChunk& pc = pt.chunks[static_cast<size_t>(c)];
      pc.raw = p->ChunkLen(ti, c);
      pc.hash = p->HashOf(ti, c);
      if (!known_.count(pc.hash) && p->now.insert(pc.hash).second) {
        if (p->fused) {
          pc.staged = base + p->byte_off[ti] + c * p->cb;
        } else {
          p->copies.push_back({ti, c, p->staged_bytes});
          p->staged_bytes += static_cast<size_t>(pc.raw);
        }
        st.bytes_copied += pc.raw;
      } else {
        p->now.insert(pc.hash);
      }
      ++st.chunks_total;
    }
    st.bytes_total += pt.nbytes;
  }
}

// Copies the chunks ChooseChunksToStage listed into the arena: device copies first
// (asynchronous, runs of adjacent chunks merged), then CPU copies on the workers while the DMA
// engines run, then waits for the device copies.
Status CheckpointVault::Impl::CopyChangedChunks(SnapshotPlan* p) {
  internal::StagingArena* sa = p->job->arena.get();
  const bool want_pinned = !p->by_dev.empty();
  if (p->staged_bytes > 0 &&
      !sa->Reserve(p->staged_bytes, want_pinned, &p->stats().staging_allocated))
    return FailSnapshot(
        p->job.get(), false,
        ResourceExhaustedError("out of host memory for a " + std::to_string(p->staged_bytes) +
                               "-byte checkpoint snapshot"));
  uint8_t* base = sa->buf.data();
  const auto& copies = p->copies;
  for (size_t i = 0; i < copies.size();) {
    const SnapshotPlan::Copy& cp = copies[i];
    const int dev = p->job->tensors[cp.ti].device;
    size_t len = static_cast<size_t>(p->ChunkLen(cp.ti, cp.c));
    size_t j = i + 1;
    while (dev >= 0 && j < copies.size() && copies[j].ti == cp.ti &&
           copies[j].c == copies[j - 1].c + 1) {
      len += static_cast<size_t>(p->ChunkLen(copies[j].ti, copies[j].c));
      ++j;
    }
    if (dev >= 0) {
      internal::DeviceSnapshot* ds = nullptr;
      for (auto& [d, snap] : p->dsnaps)
        if (d == dev) ds = snap;
      Status s = ds->EnqueueCopy(base + cp.dst_off, p->ChunkSrc(cp.ti, cp.c), len);
      if (!s.ok())
        return FailSnapshot(
            p->job.get(), true,
            s.WithContext("copy tensor '" + p->tensors[cp.ti].name + "' from device"));
    }
    i = j;
  }
  const size_t pop = sa->populated;
  ParallelFor(copies.size(), [&](size_t i) {
    const SnapshotPlan::Copy& cp = copies[i];
    if (p->job->tensors[cp.ti].device >= 0) return;
    const size_t len = static_cast<size_t>(p->ChunkLen(cp.ti, cp.c));
    uint8_t* dst = base + cp.dst_off;
    if (cp.dst_off + len > pop) internal::PrefaultForWrite(dst, len);
    std::memcpy(dst, p->ChunkSrc(cp.ti, cp.c), len);
  });
  sa->populated = std::max(pop, p->staged_bytes);
  for (auto& [dev, ds] : p->dsnaps) {
    Status s = ds->Finish(opts_.wait_timeout_ms);
    if (!s.ok())
      return FailSnapshot(p->job.get(), true,
                          s.WithContext("snapshot copies on CUDA device " + std::to_string(dev)));
  }
  for (const SnapshotPlan::Copy& cp : copies)
    p->job->tensors[cp.ti].chunks[static_cast<size_t>(cp.c)].staged = base + cp.dst_off;
  return Status::Ok();
}

// Hands a snapshotted job to the writer (counts it in flight first).
Status CheckpointVault::Impl::Enqueue(std::unique_ptr<Job> job, double t0) {
  const int64_t step = job->step;
  {
    std::lock_guard<std::mutex> l(mu_);
    ++inflight_;
  }
  job->stats.blocking_s = NowSeconds() - t0;
  {
    std::lock_guard<std::mutex> l(mu_);
    last_stats_ = job->stats;
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

// The free arena with the largest capacity (at most max_inflight arenas ever exist: one per
// queued job plus the free ones, and Save() runs only when fewer than max_inflight are queued).
std::unique_ptr<StagingArena> CheckpointVault::Impl::TakeArena() {
  std::lock_guard<std::mutex> l(mu_);
  if (free_arenas_.empty()) return std::make_unique<StagingArena>();
  auto best = std::max_element(
      free_arenas_.begin(), free_arenas_.end(),
      [](const auto& a, const auto& b) { return a->buf.capacity() < b->buf.capacity(); });
  auto a = std::move(*best);
  free_arenas_.erase(best);
  return a;
}
void CheckpointVault::Impl::ReturnArena(std::unique_ptr<StagingArena> a) {
  if (!a) return;
  std::lock_guard<std::mutex> l(mu_);
  free_arenas_.push_back(std::move(a));
}

// Ends a failed snapshot. With device copies enqueued, they must complete before the arena is
// reused; if they cannot be waited for, the arena is leaked rather than handed out while a DMA
// may still write into it.
Status CheckpointVault::Impl::FailSnapshot(Job* job, bool copies_enqueued, Status s) {
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
StatusOr<bool> CheckpointVault::Impl::TakeDeviceArenas(
    Job* job, const std::map<int, std::vector<size_t>>& by_dev, SaveStats* st) {
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
std::string CheckpointVault::Impl::TakeDeviceArena(int dev, int64_t need, Job* job, SaveStats* st,
                                                   std::string* how) {
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

void CheckpointVault::Impl::ReturnDeviceArenas(
    std::vector<std::unique_ptr<internal::DeviceArena>>* arenas) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& a : *arenas)
    if (a) free_dev_arenas_[a->device()].push_back(std::move(a));
  arenas->clear();
}

// Enqueues the device-to-device copies of `tis` into `arena` after the producers' work and
// makes the producer streams wait for them (Notes [Device staging], [Caller stream waits]).
Status CheckpointVault::Impl::StageOnDevice(int dev, const std::vector<size_t>& tis,
                                            const std::vector<TensorRef>& tensors,
                                            internal::DeviceArena* arena, Job* job) {
  LF_ASSIGN_OR_RETURN(internal::DeviceSnapshot * ds, GetDeviceSnapshot(dev));
  std::vector<void*> streams;
  for (size_t ti : tis)
    if (std::find(streams.begin(), streams.end(), tensors[ti].view.stream) == streams.end())
      streams.push_back(tensors[ti].view.stream);
  LF_RETURN_IF_ERROR(ds->Begin(0, 0, streams));
  for (size_t ti : tis) {
    const PendingTensor& pt = job->tensors[ti];
    LF_RETURN_IF_ERROR_CTX(ds->EnqueueDeviceCopy(arena->data() + pt.dev_off, tensors[ti].view.data,
                                                 static_cast<size_t>(pt.nbytes)),
                           "copy tensor '" + pt.name + "' into device staging");
  }
  return ds->Publish(arena, streams);
}

StatusOr<internal::DeviceSnapshot*> CheckpointVault::Impl::GetDeviceSnapshot(int device) {
  auto it = device_snaps_.find(device);
  if (it != device_snaps_.end()) return it->second.get();
  LF_ASSIGN_OR_RETURN(auto ds, internal::NewDeviceSnapshot(device));
  return device_snaps_.emplace(device, std::move(ds)).first->second.get();
}

// Runs fn(i) for i in [0, n) on the snapshot workers and the calling thread. The tasks are
// bounded CPU work (hash/copy of one chunk) on memory the caller keeps alive, so the wait has no
// timeout: it must not return before they end.
void CheckpointVault::Impl::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
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

}  // namespace ckpt
}  // namespace loongforge
