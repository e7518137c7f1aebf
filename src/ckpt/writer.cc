// CheckpointVault's background writer ("ckpt-writer"): resolves a snapshot's chunks against the
// latest committed checkpoint, encodes and appends the new ones to one segment, makes it durable,
// then commits the manifest (Note [Vault layout] in vault_impl.h).
#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "ckpt/names.h"
#include "ckpt/vault_impl.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace ckpt {
using internal::ChunkDecoder;
using internal::ChunkRec;
using internal::Codec;
using internal::HashKey;
using internal::Job;
using internal::Manifest;
using internal::PendingChunk;
using internal::PendingTensor;
using internal::Slot;

void CheckpointVault::Impl::WriterLoop() {
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
    } else {
      job->stats.durable_s = NowSeconds() - job->t_save;
      if (last_stats_.step == job->stats.step) last_stats_ = job->stats;
      committed_.push_back(job->stats);
      if (committed_.size() > CheckpointVault::kMaxCommittedStats) committed_.pop_front();
    }
    --inflight_;
    cv_.notify_all();
  }
}

// Writes one segment and commits the manifest. Runs under writer_mu_.
Status CheckpointVault::Impl::WriteJob(Job* job) {
  const std::string seg_name = internal::NewSegmentName(job->step, "");
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
  std::vector<uint8_t> basebuf;
  std::unique_ptr<ChunkDecoder> decoder;
  // Encodes (zstd, XOR delta: ChunkEncoder) and appends one chunk; records where it went.
  auto write_chunk = [&](const Slot& w, const uint8_t* raw) -> Status {
    const PendingTensor& pt = job->tensors[w.ti];
    const PendingChunk& pc = pt.chunks[w.ci];
    const std::vector<ChunkRec>* prev_slots = nullptr;
    if (auto it = prev_slots_.find(pt.name); it != prev_slots_.end()) prev_slots = &it->second;
    ChunkRec rec;
    rec.hash = pc.hash;
    rec.raw = pc.raw;
    // The delta base: the previous full version of this chunk slot, decoded.
    const ChunkRec* base = nullptr;
    if (opts_.xor_delta && prev_slots && w.ci < prev_slots->size()) {
      const ChunkRec& b = (*prev_slots)[w.ci];
      if (b.raw == pc.raw && b.codec != Codec::kXorZstd) {
        if (!decoder) decoder = std::make_unique<ChunkDecoder>(seg_dir_);
        basebuf.resize(static_cast<size_t>(pc.raw));
        Status bs =
            decoder->Decode(b, basebuf.data(),
                            "delta base of tensor '" + pt.name + "' chunk " + std::to_string(w.ci));
        if (bs.ok()) {
          base = &b;
        } else {
          LF_LOG(WARNING) << bs << "; storing the chunk in full";
        }
      }
    }
    const internal::ChunkEncoder::Payload payload =
        encoder_->Encode(raw, &rec, base, base ? basebuf.data() : nullptr);
    const uint8_t* payload_data = payload.data;
    const int64_t payload_len = payload.len;
    LF_RETURN_IF_ERROR(open_file());
    LF_RETURN_IF_ERROR(file->AppendHost(payload_data, static_cast<size_t>(payload_len)));
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
  for (auto& dev_and_writes : dev_writes) {
    // Named, not a structured binding: C++17 lambdas cannot capture structured bindings.
    const int dev = dev_and_writes.first;
    auto& writes = dev_and_writes.second;
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
                        std::to_string(st.chunks_written - st.chunks_cufile) + " from host memory";
  }
  return Status::Ok();
}

// Note [cuFile writer]: appends the raw chunks `writes` (Slot: tensor, chunk) of `arena` with
// cuFileWrite (runs of adjacent chunks in one call), recording each chunk's location in `m`.
// Writer thread.
template <typename OpenFn>
Status CheckpointVault::Impl::WriteDeviceChunksCufile(Job* job, internal::DeviceArena* arena,
                                                      const std::vector<Slot>& writes,
                                                      const std::string& seg_name,
                                                      const OpenFn& open_file,
                                                      std::unique_ptr<internal::ChunkSink>* file,
                                                      int64_t* seg_off, Manifest* m) {
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
    return arena->data() + job->tensors[w.ti].dev_off + static_cast<int64_t>(w.ci) * m->chunk_bytes;
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
    LF_RETURN_IF_ERROR((*file)->AppendDevice(src, static_cast<size_t>(len),
                                             what + " of checkpoint " + std::to_string(job->step)));
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
Status CheckpointVault::Impl::HashStaged(Job* job) {
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

internal::DeviceArena* CheckpointVault::Impl::DeviceArenaOf(Job* job, int dev) {
  for (auto& a : job->dev_arenas)
    if (a->device() == dev) return a.get();
  LF_CHECK(false) << "no staging arena for CUDA device " << dev;
  return nullptr;
}

// The writer's staging reader of `dev` (writer thread, or Close after the writer stopped).
StatusOr<internal::StagingReader*> CheckpointVault::Impl::GetStagingReader(int dev) {
  auto it = readers_.find(dev);
  if (it != readers_.end()) return it->second.get();
  LF_ASSIGN_OR_RETURN(
      auto r, internal::NewStagingReader(dev, std::max(opts_.d2h_buffer_bytes, opts_.chunk_bytes)));
  return readers_.emplace(dev, std::move(r)).first->second.get();
}

// Commits `m`: temp file, fsync, rename onto its name, fsync the directory.
Status CheckpointVault::Impl::CommitManifest(const Manifest& m) {
  const std::string body = internal::SerializeManifest(m);
  const std::string final_path = man_dir_ + "/" + internal::ManifestName(m.step);
  // A new file of a random name (Env::NewWritableFile creates, never follows or truncates: Note
  // [Outputs are created, never followed]); rename replaces whatever is at final_path.
  const std::string tmp_path = man_dir_ + "/" + internal::NewManifestTempName(m.step);
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
void CheckpointVault::Impl::IndexFrom(const Manifest& m, bool seed_known) {
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

}  // namespace ckpt
}  // namespace loongforge
