// DataFusion loader: the pipeline (stage 1, batch order, stage 3's plan, publication) and the
// public DataLoader. The decode stages live in loader_cpu_stage.cc and loader_gpu_stage.cc, behind
// DecodeStage (loader_pipeline.h).
//
// Note [Loader pipeline]
// ----------------------
// Three stages linked by bounded queues, so at most `prefetch` batches are in flight:
//
//   lf-fetch ──work_q──► lf-collate ──out_q──► Next()
//      │                    ▲
//      └─ per-image tasks ─►│ lf-decode* (ThreadPool) decrement Work::pending
//
// Stage 1 (lf-fetch) takes a free buffer slot, opens a read transaction, resolves every record of
// the batch as a zero-copy view into LMDB's memory map, validates record sizes, and submits one
// decode task per (sample, camera) that writes straight into the slot's image buffer. It then
// pushes the Work to work_q in sampler order. Stage 3 (lf-collate) pops Work in that same order and
// waits until its images are done, so batches leave in sampler order whatever the thread count or
// timing. The transaction lives in the Work: views stay valid until the batch is collated.
//
// Buffers: a Slot holds every array of one batch at its maximum size. Slots are recycled through
// a SlotPool shared with the consumer: a published Batch is a shared_ptr whose deleter returns the
// slot, so memory stays flat as long as the consumer drops its batches.
//
// Corrupt data: each sample carries the first error met while reading or decoding it. Under
// `skip` the sample is dropped (the batch is compacted) and counted; under `error` the pipeline
// stops and Next() returns that Status, which names the record key.
//
// Note [Static batches]
// ---------------------
// For CUDA graphs and planned memory a trainer wants few distinct shapes. With
// static_shapes (or token_buckets), every batch has batch_size rows and tokens padded to one of
// a small sorted set of lengths: the smallest bucket >= the longest instruction kept in the
// batch. Samples dropped as corrupt leave padding rows at the end (zero images/arrays, masks off,
// sample_index -1), so `size` counts the real ones. Camera count, horizon and image size are
// fixed by the schema and options. Batch::token_bucket says which bucket; the buffers are the
// slot pool's preallocated ones (a fixed set after warm-up, allocated at Create on the GPU).
// An instruction longer than the largest bucket is not corruption (the data is fine, the
// configuration is not): it stops the loader with InvalidArgument naming the record whatever
// the corrupt policy, unless truncate_tokens cuts it; Create already refuses when the schema's
// max_tokens says some instruction is too long.
//
// Note [Held by]
// --------------
// A trainer that waits for data wants to know which stage held the batch. The pipeline counts
// the batches that got a buffer slot (seq_started), that left stage 1 (seq_read: records read,
// checked and their decode queued) and that were published (seq_published); Next() counts those
// it handed out (seq_consumed). The batch Next() is waiting for is number seq_consumed, the
// oldest not handed out, so at the call: published beyond it -> "ready"; out of stage 1 but not
// published -> "decode" (CPU decode threads or the GPU stage, transforms, collation); holding a
// buffer but still in stage 1 -> "read"; no buffer yet -> "buffers" (every slot held by the
// consumer or the batches ahead). A published batch whose GPU work Next() then waited for is
// "device". The counts restart with the pipeline and carry on across an epoch continuation.
// Batch::held_by and Batch::wait_ms carry the answer to the consumer.
//
// Note [Epoch continuation] is at FetchLoop; the GPU stage's pipeline is Note [GPU loader] in
// loader_gpu_stage.cc.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>

#include "decode_turns.h"  // CheckLanesAndStagger
#include "loader_pipeline.h"
#include "loongforge/loader.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace data {

const char* HeldBy(int64_t started, int64_t read, int64_t published, int64_t consumed) {
  if (published > consumed) return "ready";
  if (read > consumed) return "decode";
  if (started > consumed) return "read";
  return "buffers";
}

StatusOr<std::vector<int>> SortTokenBuckets(std::vector<int> buckets) {
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  if (!buckets.empty() && buckets.front() <= 0)
    return InvalidArgumentError("token_buckets must be positive lengths (got " +
                                std::to_string(buckets.front()) + ")");
  return buckets;
}

int TokenBucketFor(const std::vector<int>& buckets, int length) {
  auto it = std::lower_bound(buckets.begin(), buckets.end(), length);
  return it == buckets.end() ? -1 : static_cast<int>(it - buckets.begin());
}

Status CheckImageDType(DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kUInt8)
    return Status::Ok();
  return InvalidArgumentError(std::string("loader option 'dtype' must be float32, bfloat16 or "
                                          "uint8 (the image types the loader writes), got ") +
                              DTypeLongName(dtype));
}

std::vector<std::pair<std::string, TensorView>> Batch::Tensors() const {
  const Device dev = device_type == static_cast<int>(DeviceType::kCUDA)
                         ? Device{DeviceType::kCUDA, device_id}
                         : Device{pinned ? DeviceType::kCUDAHost : DeviceType::kCPU, 0};
  const int64_t n = rows, k = cameras, l = tokens_len, h = horizon;
  auto view = [&](const void* p, DType t, std::vector<int64_t> shape) {
    return TensorView::Contiguous(p, t, std::move(shape), dev);
  };
  return {
      {"images",
       view(images, image_dtype,
            image_layout == ImageLayout::kNHWC ? std::vector<int64_t>{n, k, height, width, 3}
                                               : std::vector<int64_t>{n, k, 3, height, width})},
      {"tokens", view(tokens, DType::kInt64, {n, l})},
      {"attention_mask", view(attention_mask, DType::kUInt8, {n, l})},
      {"state", view(state, DType::kFloat32, {n, state_dim})},
      {"action", view(action, DType::kFloat32, {n, h, action_dim})},
      {"action_mask", view(action_mask, DType::kUInt8, {n, h})},
      {"sample_index", view(sample_index, DType::kInt64, {n})},
  };
}

namespace internal {

// ---------------------------------------------------------------------------------------------
// Slots

void SlotShape::LayoutTail(uint8_t* p, Batch* out) const {
  out->tokens = reinterpret_cast<int64_t*>(p);
  p += Align(sizeof(int64_t) * b * l);
  out->attention_mask = p;
  p += Align(static_cast<size_t>(b) * l);
  out->state = reinterpret_cast<float*>(p);
  p += Align(sizeof(float) * b * s);
  out->action = reinterpret_cast<float*>(p);
  p += Align(sizeof(float) * b * h * a);
  out->action_mask = p;
  p += Align(static_cast<size_t>(b) * h);
  out->sample_index = reinterpret_cast<int64_t*>(p);
}

size_t SlotShape::TailBytes() const {
  return Align(sizeof(int64_t) * b * l) + Align(static_cast<size_t>(b) * l) +
         Align(sizeof(float) * b * s) + Align(sizeof(float) * b * h * a) +
         Align(static_cast<size_t>(b) * h) + Align(sizeof(int64_t) * b);
}

SlotPool::~SlotPool() {
  for (Slot* s : all_) memory_->Free(s);
}

StatusOr<Slot*> SlotPool::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_.empty()) {
    Slot* s = free_.back();
    free_.pop_back();
    return s;
  }
  auto slot = memory_->Allocate(shape_);
  if (!slot.ok()) return slot.status();
  all_.push_back(*slot);
  return *slot;
}

Status SlotPool::Reserve(int n) {
  std::vector<Slot*> got;
  for (int i = 0; i < n; ++i) {
    auto slot = Acquire();
    if (!slot.ok()) {
      for (Slot* s : got) ReturnUnused(s);
      return slot.status();
    }
    got.push_back(*slot);
  }
  for (Slot* s : got) ReturnUnused(s);
  return Status::Ok();
}

void SlotPool::Release(Slot* s) {
  memory_->Released(s, consumer_stream_.load());
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(s);
}

void SlotPool::ReturnUnused(Slot* s) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(s);
}

size_t SlotPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (Slot* s : all_) n += s->bytes;
  return n;
}

int SlotPool::slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(all_.size());
}

// ---------------------------------------------------------------------------------------------
// Stage 1

void Pipeline::FetchLoop(int64_t ep, int64_t start) {
  stage->FetchThreadStart();  // GPU: slots are allocated here
  const Schema& sc = reader->schema();
  const int cams = static_cast<int>(sc.cameras.size());
  const int64_t nb = sampler->batches_per_epoch();
  // Note [Epoch continuation]: after the last batch of an epoch, a marker goes down the pipeline
  // and fetching goes on with the next epoch, so a consumer that starts epoch e+1 right after
  // finishing e finds its first batches ready instead of an empty pipeline (the restart gap was
  // the largest batch-interval outlier). Start() keeps the running pipeline in that case.
  for (;; ep += 1, start = 0) {
    for (int64_t b = start; b < nb && !stop.load(); ++b) {
      // Record lookups only; time blocked on back-pressure below is not fetch work.
      std::optional<ScopedTimerMs> timer(std::in_place, h_fetch);
      auto w = std::make_shared<Work>();
      w->t_start = NowSeconds();
      w->epoch = ep;
      w->index = b;
      w->samples = sampler->Batch(ep, b);
      w->pool = pool;
      const int slots_before = pool->slots();
      auto slot = [&] {
        ScopedTimerMs acquire_timer(h_acquire);
        return pool->Acquire();
      }();
      if (pool->slots() > slots_before) c_slots_grown->fetch_add(pool->slots() - slots_before);
      if (!slot.ok()) {
        out_q->Push(slot.status(), timeout()).IgnoreError();
        return;
      }
      w->slot = *slot;
      seq_started.fetch_add(1);  // Note [Held by]
      auto txn = reader->Begin();
      if (!txn.ok()) {
        out_q->Push(txn.status(), timeout()).IgnoreError();
        return;
      }
      w->txn.emplace(std::move(txn).value());
      const size_t n = w->samples.size();
      w->tokens.resize(n);
      w->state.resize(n);
      w->action.resize(n);
      w->amask.resize(n);
      w->task.assign(task_source == TaskSource::kNone ? 0 : n, std::string_view());
      w->jpeg.resize(n * cams);
      w->sample_status.assign(n, Status::Ok());
      int64_t bytes = 0;
      for (size_t i = 0; i < n; ++i) {
        const int64_t id = w->samples[i];
        auto get = [&](std::string_view modality, size_t expect_bytes, std::string_view* v) {
          if (!w->sample_status[i].ok()) return;
          std::string key = SampleKey(id, modality);
          auto r = w->txn->Get(key);
          if (!r.ok()) {
            w->sample_status[i] = r.status();
            return;
          }
          if (expect_bytes && r->size() != expect_bytes) {
            w->sample_status[i] = DataLossError(reader->path() + ": record '" + key + "' has " +
                                                std::to_string(r->size()) + " bytes, expected " +
                                                std::to_string(expect_bytes) + " (truncated?)");
            return;
          }
          const size_t ntok = r->size() / 4;
          if (modality == "tokens" &&
              (r->size() % 4 != 0 || (ntok > static_cast<size_t>(max_tokens) && !truncate_ok))) {
            if (r->size() % 4 == 0 && static_shapes) {  // Note [Static batches]: not corruption
              if (w->fatal.ok())
                w->fatal = InvalidArgumentError(
                    reader->path() + ": record '" + key + "' has " + std::to_string(ntok) +
                    " tokens, more than the largest token bucket (" + std::to_string(max_tokens) +
                    "): add a bucket of at least " + std::to_string(ntok) +
                    " or set truncate_tokens");
              return;
            }
            w->sample_status[i] = DataLossError(reader->path() + ": record '" + key + "' has " +
                                                std::to_string(r->size()) +
                                                " bytes: not a token "
                                                "list of at most " +
                                                std::to_string(max_tokens));
            return;
          }
          if (modality == "tokens") {  // ids outside the vocabulary never reach an embedding
            Status t = CheckTokens(*r, sc, reader->path(), key);
            if (!t.ok()) {
              w->sample_status[i] = std::move(t);
              return;
            }
          }
          *v = *r;
          bytes += static_cast<int64_t>(r->size());
        };
        get("tokens", 0, &w->tokens[i]);
        get("state", sizeof(float) * sc.state_dim, &w->state[i]);
        get("action", sizeof(float) * sc.action_dim * sc.action_horizon, &w->action[i]);
        get("amask", static_cast<size_t>(sc.action_horizon), &w->amask[i]);
        for (int c = 0; c < cams; ++c) get(camera_modality[c], 0, &w->jpeg[i * cams + c]);
        if (task_source == TaskSource::kRecord) {  // Note [Task text]
          get("task", 0, &w->task[i]);
        } else if (task_source == TaskSource::kLeRobot) {
          std::string_view lr;  // f64 timestamp, i64 task_index, i64 index
          get("lerobot", 24, &lr);
          if (w->sample_status[i].ok()) {
            int64_t ti = 0;
            std::memcpy(&ti, lr.data() + 8, sizeof(ti));
            auto it = lerobot_tasks.find(ti);
            if (it == lerobot_tasks.end())
              w->sample_status[i] = DataLossError(
                  reader->path() + ": record '" + SampleKey(id, "lerobot") + "' has task_index " +
                  std::to_string(ti) + ", which the schema's task table lacks");
            else
              w->task[i] = it->second;
          }
        }
        std::string_view meta;  // int32 episode, step (dataset.h): checked, not delivered
        get("meta", 2 * sizeof(int32_t), &meta);
      }
      c_bytes->fetch_add(bytes);
      PackCollate(*w);
      stage->Fetched(*w);  // GPU: prefaults the JPEG pages
      timer.reset();
      // CPU: one decode task per image; GPU: none (stage 2 decodes the batch on lf-collate).
      if (!stage->QueueDecode(w)) return;  // pool shut down: the loader is being destroyed
      w->TaskDone();
      if (stop.load()) {
        w->cancelled = true;
        return;
      }
      seq_read.fetch_add(1);                                                       // Note [Held by]
      if (!work_q->Push(std::move(w), std::chrono::hours(24 * 365)).ok()) return;  // closed: stop
    }
    if (stop.load()) return;
    auto marker = std::make_shared<Work>();
    marker->epoch = ep;
    marker->epoch_end = true;
    if (!work_q->Push(std::move(marker), std::chrono::hours(24 * 365)).ok()) return;
  }
}

bool Pipeline::WaitDecoded(Work& w) {
  std::unique_lock<std::mutex> lock(w.mu);
  if (w.done_cv.wait_for(lock, timeout(), [&] { return w.pending == 0 || stop.load(); }))
    return true;
  lock.unlock();
  out_q
      ->Push(DeadlineExceededError("loader: decoding batch " + std::to_string(w.index) +
                                   " took longer than " + std::to_string(opts.timeout_ms) + " ms"),
             timeout())
      .IgnoreError();
  return false;
}

// Note [Collate staging]: the batch's raw non-image records into the slot's staging buffer.
void Pipeline::PackCollate(Work& w) {
  const CollateLayout& L = s3;
  uint8_t* raw = w.slot->raw;
  auto* off = reinterpret_cast<int32_t*>(raw + L.off_token_offset);
  auto* sidx = reinterpret_cast<int64_t*>(raw + L.off_sample_index);
  auto* st = reinterpret_cast<float*>(raw + L.off_state);
  auto* ac = reinterpret_cast<float*>(raw + L.off_action);
  uint8_t* am = raw + L.off_amask;
  auto* ids = reinterpret_cast<int32_t*>(raw + L.off_tokens);
  const size_t S = L.state_dim, HA = static_cast<size_t>(L.horizon) * L.action_dim;
  const size_t H = L.horizon;
  int32_t total = 0;
  for (size_t i = 0; i < w.samples.size(); ++i) {
    off[i] = total;
    sidx[i] = w.samples[i];
    if (!w.sample_status[i].ok()) continue;  // never a src_row
    // Sizes were validated by the lookups; ids beyond the capacity are cut (truncate_tokens).
    const int nt = static_cast<int>(std::min<size_t>(w.tokens[i].size() / 4, L.max_tokens));
    // LMDB views: maybe unaligned. An empty record's view may have no data pointer at all.
    if (nt > 0) std::memcpy(ids + total, w.tokens[i].data(), sizeof(int32_t) * nt);
    total += nt;
    std::memcpy(st + i * S, w.state[i].data(), sizeof(float) * S);
    std::memcpy(ac + i * HA, w.action[i].data(), sizeof(float) * HA);
    std::memcpy(am + i * H, w.amask[i].data(), H);
  }
  off[w.samples.size()] = total;
  if (!norm_stats.empty())
    std::memcpy(raw + L.off_norm, norm_stats.data(), sizeof(float) * norm_stats.size());
}

// Reads one byte of every page of the batch's JPEG bytes, so the page faults of LMDB's map (read
// ahead is off: MDB_NORDAHEAD) are taken here, ahead of time, and not inside nvJPEG's copy of

// ---------------------------------------------------------------------------------------------
// Stage 3

// Which samples a batch keeps, its shape, and stage 3's src_row (Note [Collate staging]).
Status Pipeline::PlanCollate(Work& w, CollatePlan* p) {
  if (!w.fatal.ok()) return w.fatal;
  // Compact away corrupt samples (skip policy) or stop on the first (error policy).
  p->keep.clear();
  p->dropped = 0;  // counted when the batch is handed out (Next), not when prefetched
  for (size_t i = 0; i < w.samples.size(); ++i) {
    if (w.sample_status[i].ok()) {
      p->keep.push_back(static_cast<int>(i));
      consecutive_corrupt = 0;
      continue;
    }
    if (opts.on_corrupt == CorruptPolicy::kError) return w.sample_status[i];
    ++p->dropped;
    if (opts.max_consecutive_corrupt > 0 && ++consecutive_corrupt >= opts.max_consecutive_corrupt)
      return DataLossError(
          reader->path() + ": " + std::to_string(consecutive_corrupt) +
          " corrupt samples in a row (max_consecutive_corrupt=" +
          std::to_string(opts.max_consecutive_corrupt) + "), the last sample " +
          std::to_string(w.samples[i]) + ": " + w.sample_status[i].message() +
          "; the dataset looks unreadable: repack it, or raise max_consecutive_corrupt");
    int64_t suppressed = 0;
    if (corrupt_log.Allow(&suppressed))
      LF_LOG(WARNING) << "skipping corrupt sample " << w.samples[i] << ": "
                      << w.sample_status[i].message()
                      << (suppressed ? " (" + std::to_string(suppressed) + " more not shown)" : "");
  }
  uint8_t* raw = w.slot->raw;
  const auto* off = reinterpret_cast<const int32_t*>(raw + s3.off_token_offset);
  auto* src_row = reinterpret_cast<int32_t*>(raw + s3.off_src_row);
  p->n = static_cast<int>(p->keep.size());
  int longest = 1;
  for (int o = 0; o < p->n; ++o) {
    const int i = p->keep[o];
    src_row[o] = i;
    longest = std::max(longest, off[i + 1] - off[i]);
  }
  p->total_tokens = off[w.samples.size()];
  p->bucket = -1;
  if (static_shapes) {
    // Note [Static batches]: the smallest bucket that holds the longest kept instruction.
    p->bucket = TokenBucketFor(buckets, longest);
    LF_CHECK(p->bucket >= 0);  // fetch cut or rejected anything longer than the last one
    p->len = buckets[p->bucket];
    p->rows = opts.batch_size;
  } else {
    p->len = opts.token_pad > 0 ? opts.token_pad : longest;
    p->rows = p->n;
  }
  return Status::Ok();
}

CollateDims Pipeline::Dims(const CollatePlan& p) const {
  CollateDims d;
  d.n = p.n;
  d.rows = p.rows;
  d.len = p.len;
  d.normalize = normalize;
  d.clip = clip_norm;
  return d;
}

void Pipeline::Publish(Work& w, const CollatePlan& p, std::shared_ptr<Batch>* out) {
  seq_published.fetch_add(1);  // Note [Held by]
  const Schema& sc = reader->schema();
  Batch& b = w.slot->batch;
  b.epoch = w.epoch;
  b.index = w.index;
  b.size = p.n;
  b.rows = p.rows;
  b.token_bucket = p.bucket;
  b.corrupt_skipped = p.dropped;
  b.cameras = static_cast<int>(sc.cameras.size());
  b.height = opts.image_size[0];
  b.width = opts.image_size[1];
  b.image_dtype = opts.dtype;  // the host batch's (a stage's device copy keeps its own)
  b.tokens_len = p.len;
  b.state_dim = sc.state_dim;
  b.action_dim = sc.action_dim;
  b.horizon = sc.action_horizon;
  b.latency_ms = (NowSeconds() - w.t_start) * 1e3;
  b.task.clear();
  if (!w.task.empty()) {  // Note [Task text]: kept rows in order, "" for padding rows
    b.task.resize(p.rows);
    for (int o = 0; o < p.n; ++o) {
      // An empty record's view may have no data pointer: never copy from it.
      const std::string_view t = w.task[p.keep[o]];
      if (!t.empty()) b.task[o].assign(t.data(), t.size());
    }
  }
  // Hand the slot to the consumer: the Batch keeps the pool alive and returns the slot on release.
  Slot* slot = w.slot;
  w.slot = nullptr;
  std::shared_ptr<SlotPool> pool = w.pool;
  Batch* pub = slot->published;
  if (pub != &slot->batch) {
    // The stage's copy (GPU: device memory) is published with the host copy's metadata; its
    // pointers and device fields were set when the slot was allocated.
    Batch& d = *pub;
    Batch ptrs = d;
    d = b;
    d.images = ptrs.images;
    d.tokens = ptrs.tokens;
    d.attention_mask = ptrs.attention_mask;
    d.state = ptrs.state;
    d.action = ptrs.action;
    d.action_mask = ptrs.action_mask;
    d.sample_index = ptrs.sample_index;
    d.pinned = ptrs.pinned;
    d.device_type = ptrs.device_type;
    d.device_id = ptrs.device_id;
    d.image_layout = ptrs.image_layout;
    d.image_dtype = ptrs.image_dtype;
    d.ready_event = ptrs.ready_event;
  }
  *out = std::shared_ptr<Batch>(pub, [pool, slot](Batch*) { pool->Release(slot); });
}

void Pipeline::StopThreads() {
  stop = true;
  if (work_q) work_q->Close();
  if (out_q) out_q->Close();
  if (fetch_thread.joinable()) fetch_thread.join();
  if (collate_thread.joinable()) collate_thread.join();
  if (stage) stage->Sync();  // GPU: queued copies into slots finish before slots are reused
  // Drop queued Work (their decode tasks see `cancelled` and finish fast), then wait for the
  // decode tasks still queued or running, so a stopped loader is quiet (bounded wait).
  if (work_q) {
    WorkPtr w;
    while (work_q->TryPop(&w)) w->cancelled = true;
  }
  for (int i = 0; i < 10000 && tasks_in_flight.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  running = false;
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// DataLoader

// Note [Sample access]
// --------------------
// GetSample(i, epoch) serves map-style access (a dataset[i] for debugging and for the user's own
// samplers) from a second pipeline over the same DB, created on first use, whose sampler is the
// identity: batch_size 1, no shuffle, no dropped tail, one rank. Its batch i is sample i, decoded,
// cropped, jittered and collated by the code that makes the batches, so the row is the batched
// loader's row of sample i in that epoch (the augmentation draws depend on (seed, epoch, sample,
// camera), not on the batch). It fails on a corrupt sample (on_corrupt error): an index that
// silently gives nothing has no meaning. Asking for the sample after the last one asked continues
// the running pipeline, which has prefetched it; any other index restarts it there.
struct DataLoader::Impl : internal::Pipeline {
  std::mutex sample_mu;
  std::unique_ptr<DataLoader> sample_loader;
};

bool DataLoader::GpuSupport(int device_id, std::string* reason) {
  return internal::GpuStageSupport(device_id, reason);
}

// Note [State normalization]
// ---------------------------
// Stage 3 computes y = (x - centre) / scale per dimension, clamped to [-1, 1] for q01_q99
// (CollateDims). The modes follow Isaac-GR00T's Normalizer (gr00t/data/transform/state_action.py)
// through that one formula:
//   mean_std: centre = mean, scale = std; a std <= 1e-6 becomes 1 (the dimension is only centred;
//     GR00T keeps it raw: LoongForge kept its own rule, which batches already depend on).
//   min_max:  centre = (min + max) / 2, scale = (max - min) / 2, i.e. 2 (x - min) / (max - min)
//     - 1; max == min gives 0, as GR00T does (scale = +inf).
//   q01_q99:  as min_max on [q01, q99], then clamped to [-1, 1]; q99 == q01 keeps x (centre 0,
//     scale 1) and clamps it, as GR00T does.
// Centre and scale are computed in double and rounded once to float; the result differs from
// GR00T's two-division form by float rounding only.
namespace {

Status StageNormalization(const LoaderOptions& o, const Schema& sc, bool* normalize, bool* clip,
                          std::vector<float>* staged) {
  *normalize = false;
  *clip = false;
  staged->clear();
  if (!o.normalize_state || o.normalize == StateNormalization::kNone) return Status::Ok();
  const char* lo_name = "mean";
  const char* hi_name = "std";
  const std::vector<float>* ls = &sc.state_mean;  // state low/centre, state high/scale, ...
  const std::vector<float>* hs = &sc.state_std;
  const std::vector<float>* la = &sc.action_mean;
  const std::vector<float>* ha = &sc.action_std;
  const char* mode = "mean_std";
  if (o.normalize == StateNormalization::kMinMax) {
    mode = "min_max", lo_name = "min", hi_name = "max";
    ls = &sc.state_min, hs = &sc.state_max, la = &sc.action_min, ha = &sc.action_max;
  } else if (o.normalize == StateNormalization::kQ01Q99) {
    mode = "q01_q99", lo_name = "q01", hi_name = "q99";
    ls = &sc.state_q01, hs = &sc.state_q99, la = &sc.action_q01, ha = &sc.action_q99;
  }
  for (auto [what, v, dim] :
       {std::make_tuple("state", ls, sc.state_dim), std::make_tuple("state", hs, sc.state_dim),
        std::make_tuple("action", la, sc.action_dim), std::make_tuple("action", ha, sc.action_dim)})
    if (v->size() != static_cast<size_t>(dim))
      return InvalidArgumentError(o.db_path + ": normalize=\"" + mode + "\" needs the schema's " +
                                  what + "_" + (v == ls || v == la ? lo_name : hi_name) + " (" +
                                  std::to_string(dim) + " values), which this DB " +
                                  (v->empty()
                                       ? std::string("lacks")
                                       : "has with " + std::to_string(v->size()) + " values") +
                                  (o.normalize == StateNormalization::kQ01Q99
                                       ? " (q01/q99 are stored by pack --from-lerobot)"
                                       : "") +
                                  "; pass normalize=\"none\" or another mode");
  auto stage = [&](const std::vector<float>& lo, const std::vector<float>& hi) {
    std::vector<float> centre, scale;
    for (size_t k = 0; k < lo.size(); ++k) {
      if (o.normalize == StateNormalization::kMeanStd) {
        centre.push_back(lo[k]);
        scale.push_back(hi[k] > 1e-6f ? hi[k] : 1.f);
      } else if (hi[k] != lo[k]) {
        centre.push_back(static_cast<float>((double{lo[k]} + double{hi[k]}) / 2));
        scale.push_back(static_cast<float>((double{hi[k]} - double{lo[k]}) / 2));
      } else if (o.normalize == StateNormalization::kMinMax) {
        centre.push_back(lo[k]);
        scale.push_back(INFINITY);
      } else {
        centre.push_back(0.f);
        scale.push_back(1.f);
      }
    }
    staged->insert(staged->end(), centre.begin(), centre.end());
    staged->insert(staged->end(), scale.begin(), scale.end());
  };
  stage(*ls, *hs);
  stage(*la, *ha);
  *normalize = true;
  *clip = o.normalize == StateNormalization::kQ01Q99;
  return Status::Ok();
}

// Note [Task text]
// ----------------
// LeRobot and GR00T batches carry each sample's task text, so the loader delivers it too, from
// what the DB stores: `pack` and `pack --from-lerobot` write "{id}_task" (the instruction's
// UTF-8 text, what "{id}_tokens" encodes); a LeRobot DB packed before that has each sample's
// task_index in "{id}_lerobot" and the task table in the schema's source_meta. A DB with neither
// (older episode-folder packs, synthetic DBs) stores no text: the tokens cannot stand in for it
// (Tokenizer::Decode is for display, lossy for other tokenizers than byte-v1), so batches have no
// task (has_task_text() is false; the Python adapter warns once per DB). Which source applies is
// decided from sample 0; a later sample without its record is then a corrupt sample naming the
// record.
Status FindTaskSource(const RecordReader& reader, internal::Pipeline::TaskSource* source,
                      std::map<int64_t, std::string>* lerobot_tasks) {
  using TaskSource = internal::Pipeline::TaskSource;
  const Schema& sc = reader.schema();
  *source = TaskSource::kNone;
  if (sc.num_samples == 0) return Status::Ok();
  LF_ASSIGN_OR_RETURN(RecordReader::Txn txn, reader.Begin());
  if (txn.Get(SampleKey(0, "task")).ok()) {
    *source = TaskSource::kRecord;
    return Status::Ok();
  }
  if (sc.source_format.rfind("lerobot", 0) == 0 && txn.Get(SampleKey(0, "lerobot")).ok()) {
    nlohmann::json meta = nlohmann::json::parse(sc.source_meta, nullptr, false);
    if (meta.is_discarded() || !meta.contains("tasks") || !meta["tasks"].is_object())
      return DataLossError(reader.path() + ": the schema's source_meta has no task table");
    for (const auto& [k, v] : meta["tasks"].items()) {
      char* end = nullptr;
      const long long ti = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || !v.is_string())
        return DataLossError(reader.path() + ": the schema's source_meta task table has entry '" +
                             k + "', not task_index -> text");
      (*lerobot_tasks)[ti] = v.get<std::string>();
    }
    *source = TaskSource::kLeRobot;
    return Status::Ok();
  }
  // Debug only: the CLI's output stays as it was; Python's adapter warns once per DB.
  LF_LOG(DEBUG) << reader.path()
                << ": this DB stores no task text (no '00000000_task' record); its batches have "
                   "no task";
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(const LoaderOptions& o) {
  if (o.batch_size <= 0) return InvalidArgumentError("batch_size must be > 0");
  if (o.image_size[0] < 1 || o.image_size[0] > 4096 || o.image_size[1] < 1 ||
      o.image_size[1] > 4096)
    return InvalidArgumentError(
        "loader option 'image_size' must be (height, width), each in "
        "1..4096, got (" +
        std::to_string(o.image_size[0]) + ", " + std::to_string(o.image_size[1]) + ")");
  if (!(o.crop_fraction > 0.f && o.crop_fraction <= 1.f))
    return InvalidArgumentError("crop_fraction must be in (0, 1]");
  if (o.threads <= 0 || o.threads > kMaxLoaderThreads)
    return InvalidArgumentError("loader option 'threads' must be in 1.." +
                                std::to_string(kMaxLoaderThreads) + " (this machine has " +
                                std::to_string(std::thread::hardware_concurrency()) +
                                " cores), got " + std::to_string(o.threads));
  if (o.prefetch <= 0 || o.prefetch > 1024)
    return InvalidArgumentError("loader option 'prefetch' must be in 1..1024, got " +
                                std::to_string(o.prefetch));
  if (o.timeout_ms <= 0)
    return InvalidArgumentError("loader option 'timeout_ms' must be > 0 (a wait bound), got " +
                                std::to_string(o.timeout_ms));
  if (o.max_consecutive_corrupt < 0)
    return InvalidArgumentError(
        "loader option 'max_consecutive_corrupt' must be >= 0 (0: no "
        "limit), got " +
        std::to_string(o.max_consecutive_corrupt));
  if (o.max_frame_pixels < 1)
    return InvalidArgumentError("max_frame_pixels must be >= 1 (got " +
                                std::to_string(o.max_frame_pixels) + ")");
  for (int c = 0; c < 3; ++c)
    if (!(o.std[c] > 0)) return InvalidArgumentError("normalize std must be > 0");
  if (!(o.hw_decode_ratio <= 1.f)) return InvalidArgumentError("hw_decode_ratio must be <= 1");
  if (o.token_pad < 0) return InvalidArgumentError("token_pad must be >= 0");
  LF_ASSIGN_OR_RETURN(std::vector<int> buckets, SortTokenBuckets(o.token_buckets));
  if (!buckets.empty() && o.token_pad > 0)
    return InvalidArgumentError(
        "token_pad and token_buckets are exclusive (token_pad=N is token_buckets=[N])");
  LF_RETURN_IF_ERROR(internal::CheckLanesAndStagger(o.decode_lanes, o.decode_stagger, "decode_"));
  LF_RETURN_IF_ERROR(CheckImageDType(o.dtype));
  const bool gpu = o.device == LoaderDevice::kCuda;
  if (!gpu && (o.layout != ImageLayout::kNCHW || o.dtype == DType::kBFloat16 || o.antialias))
    return InvalidArgumentError(
        "layout NHWC, dtype bfloat16 and antialias need device=cuda (the CPU loader writes "
        "float32 or uint8 NCHW)");
  if (gpu && o.resize == ResizeMode::kPad)
    return InvalidArgumentError(
        "loader option 'resize' pad needs device=cpu (the GPU loader stretches or crops)");
  if (gpu && o.dtype == DType::kUInt8)
    return InvalidArgumentError(
        "loader option 'dtype' uint8 needs device=cpu (the GPU loader writes float32 or "
        "bfloat16)");
  if (gpu) {
    std::string why;
    if (!GpuSupport(o.device_id, &why)) return UnavailableError("loader: device=cuda: " + why);
  }
  std::unique_ptr<DataLoader> dl(new DataLoader());
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  // Readers: decode threads do not open transactions; fetch holds up to prefetch + 2 at once.
  LF_ASSIGN_OR_RETURN(impl->reader, RecordReader::Open(o.db_path, 2 * o.prefetch + 16));
  const Schema& sc = impl->reader->schema();
  auto sampler = Sampler::Create(SamplerOptions{sc.num_samples, o.batch_size, o.seed, o.rank,
                                                o.world_size, o.shuffle, o.drop_last});
  if (!sampler.ok()) return sampler.status().WithContext(o.db_path);
  impl->sampler.emplace(std::move(sampler).value());
  // Note [Static batches]
  impl->static_shapes = o.static_shapes || !buckets.empty();
  if (impl->static_shapes && buckets.empty())
    buckets.push_back(o.token_pad > 0 ? o.token_pad : std::max(1, sc.max_tokens));
  impl->buckets = buckets;
  impl->max_tokens = std::max(1, sc.max_tokens);
  if (o.token_pad > 0) impl->max_tokens = o.token_pad;
  if (impl->static_shapes) impl->max_tokens = buckets.back();
  impl->truncate_ok = o.truncate_tokens && (impl->static_shapes || o.token_pad > 0);
  if ((impl->static_shapes || o.token_pad > 0) && sc.max_tokens > impl->max_tokens &&
      !o.truncate_tokens)
    return InvalidArgumentError(
        std::string(impl->static_shapes ? "largest token bucket " : "token_pad ") +
        std::to_string(impl->max_tokens) + " is shorter than the longest instruction in " +
        o.db_path + " (" + std::to_string(sc.max_tokens) +
        " tokens): add a longer bucket or set truncate_tokens");
  LF_RETURN_IF_ERROR(
      StageNormalization(o, sc, &impl->normalize, &impl->clip_norm, &impl->norm_stats));
  impl->s3 = internal::CollateLayout::Make(o.batch_size, impl->max_tokens, sc.state_dim,
                                           sc.action_dim, sc.action_horizon);
  for (const auto& c : sc.cameras) impl->camera_modality.push_back(CameraModality(c));
  LF_RETURN_IF_ERROR(FindTaskSource(*impl->reader, &impl->task_source, &impl->lerobot_tasks));
  bool pin = o.pin_memory;
  if (pin && !internal::PinnedAvailable()) {
    LF_LOG(INFO) << "pin_memory requested but this build has no CUDA: using pageable memory";
    pin = false;
  }
  internal::SlotShape shape;
  shape.b = o.batch_size;
  shape.k = static_cast<int>(sc.cameras.size());
  shape.ih = o.image_size[0];
  shape.iw = o.image_size[1];
  shape.l = impl->max_tokens;
  shape.s = sc.state_dim;
  shape.a = sc.action_dim;
  shape.h = sc.action_horizon;
  shape.image_elem = DTypeSize(o.dtype);
  shape.raw = internal::SlotShape::Align(impl->s3.capacity_bytes);
  impl->pool = std::make_shared<internal::SlotPool>(
      shape, gpu ? internal::CreateGpuSlotMemory(o) : internal::CreateHostSlotMemory(pin));
  // Enough queued decode tasks to keep every worker busy across two batches. (GPU: the pool only
  // decodes the images nvJPEG cannot.)
  size_t task_cap = static_cast<size_t>(o.batch_size) * sc.cameras.size() * 2;
  try {
    impl->decode_pool = std::make_unique<ThreadPool>(o.threads, "lf-decode", task_cap);
  } catch (const std::system_error& e) {
    return ResourceExhaustedError("loader: could not start " + std::to_string(o.threads) +
                                  " decode threads: " + e.what() + " (lower 'threads')");
  }
  impl->creator_pid = ::getpid();
  impl->cpu_info.reason = "device=cpu: libjpeg-turbo on " + std::to_string(o.threads) + " threads";
  if (gpu) {
    LF_ASSIGN_OR_RETURN(impl->stage, internal::CreateGpuStage(*impl));
  } else {
    impl->stage = internal::CreateCpuStage(*impl);
  }
  auto& m = impl->metrics;
  impl->h_fetch = m.GetHistogram("fetch_ms");
  impl->h_acquire = m.GetHistogram("fetch_slot_ms");
  impl->c_slots_grown = m.GetCounter("slots_allocated_on_demand");
  impl->h_decode = m.GetHistogram("decode_ms");
  impl->h_collate = m.GetHistogram("collate_ms");
  impl->h_latency = m.GetHistogram("batch_latency_ms");
  impl->h_wait = m.GetHistogram("consumer_wait_ms");
  impl->c_images = m.GetCounter("images_decoded");
  impl->c_batches = m.GetCounter("batches");
  impl->c_corrupt = m.GetCounter("corrupt_skipped");
  impl->c_bytes = m.GetCounter("record_bytes_read");
  dl->impl_ = std::move(impl);
  return dl;
}

// Note [A loader across fork]
// fork() copies the loader's memory but none of its threads: in the child the pipeline's queues
// wait for threads that do not exist, and joining their handles waits forever (the probe's
// multiprocessing child hung until killed). So every entry point checks the pid the loader was
// created in and refuses in another process with FailedPrecondition saying to create a loader
// there; the child's destructor leaks the pipeline instead of joining (its memory goes with the
// child). A `spawn`ed or `forkserver` child that opens its own loader is unaffected.
static Status CheckSameProcess(pid_t creator) {
  if (::getpid() == creator) return Status::Ok();
  return FailedPreconditionError(
      "loader: this DataLoader was created in process " + std::to_string(creator) +
      " and used in process " + std::to_string(::getpid()) +
      " (a fork child): its threads did not survive fork; create a new loader in the child");
}

DataLoader::~DataLoader() {
  if (!impl_) return;
  if (!CheckSameProcess(impl_->creator_pid).ok()) {
    (void)impl_.release();  // Note [A loader across fork]: the threads are the parent's
    return;
  }
  impl_->StopThreads();
  impl_->decode_pool->Shutdown();  // runs (cancelled) tasks still queued, joins the workers
}

const Schema& DataLoader::schema() const { return impl_->reader->schema(); }
int64_t DataLoader::batches_per_epoch() const { return impl_->sampler->batches_per_epoch(); }
int64_t DataLoader::epoch() const { return impl_->epoch; }
int64_t DataLoader::next_batch() const { return impl_->next_batch; }
const std::vector<int>& DataLoader::token_buckets() const { return impl_->buckets; }
bool DataLoader::has_task_text() const {
  return impl_->task_source != internal::Pipeline::TaskSource::kNone;
}
MetricsRegistry& DataLoader::metrics() { return impl_->metrics; }
int64_t DataLoader::corrupt_skipped() const { return impl_->c_corrupt->load(); }

Status DataLoader::Start(int64_t epoch, int64_t start_batch) {
  Impl& im = *impl_;
  LF_RETURN_IF_ERROR(CheckSameProcess(im.creator_pid));
  // The pipeline is already fetching this epoch (Note [Epoch continuation]).
  if (im.running && im.finished && !im.failed && epoch == im.epoch + 1 && start_batch == 0) {
    im.epoch = epoch;
    im.next_batch = 0;
    im.finished = false;
    return Status::Ok();
  }
  im.StopThreads();
  if (epoch < 0) return InvalidArgumentError("epoch must be >= 0");
  if (start_batch < 0 || start_batch > batches_per_epoch())
    return OutOfRangeError("start batch " + std::to_string(start_batch) + " outside epoch of " +
                           std::to_string(batches_per_epoch()) + " batches");
  im.stop = false;
  im.finished = false;
  im.failed = false;
  im.epoch = epoch;
  im.next_batch = start_batch;
  im.seq_started = im.seq_read = im.seq_published = 0;  // Note [Held by]: the threads are stopped
  im.seq_consumed = 0;  // consecutive_corrupt carries on: a restart reads the same DB
  im.work_q = std::make_unique<BoundedQueue<internal::WorkPtr>>(im.opts.prefetch, "lf-work");
  im.out_q = std::make_unique<BoundedQueue<internal::Output>>(im.opts.prefetch, "lf-out");
  try {
    im.fetch_thread = std::thread([&im, epoch, start_batch] { im.FetchLoop(epoch, start_batch); });
    pthread_setname_np(im.fetch_thread.native_handle(), "lf-fetch");
    im.collate_thread = std::thread([&im] { im.stage->CollateLoop(); });
    pthread_setname_np(im.collate_thread.native_handle(), "lf-collate");
  } catch (const std::system_error& e) {
    im.running = true;  // StopThreads joins the thread that did start
    im.StopThreads();
    return ResourceExhaustedError(std::string("loader: could not start its threads: ") + e.what());
  }
  im.running = true;
  return Status::Ok();
}

StatusOr<std::shared_ptr<Batch>> DataLoader::Next() {
  Impl& im = *impl_;
  LF_RETURN_IF_ERROR(CheckSameProcess(im.creator_pid));
  if (!im.running) return FailedPreconditionError("loader: Next() before Start()");
  if (im.finished) return OutOfRangeError("end of epoch");
  internal::Output item = OutOfRangeError("end of epoch");
  const double t0 = NowSeconds();
  const char* held_by =
      HeldBy(im.seq_started.load(), im.seq_read.load(), im.seq_published.load(), im.seq_consumed);
  {
    ScopedTimerMs timer(im.h_wait);
    Status s = im.out_q->Pop(&item, im.timeout());
    if (!s.ok()) {
      im.finished = true;
      im.failed = true;
      if (s.code() == StatusCode::kDeadlineExceeded)
        return DeadlineExceededError("loader: no batch within " +
                                     std::to_string(im.opts.timeout_ms) + " ms");
      return s;
    }
  }
  if (!item.ok()) {
    im.finished = true;
    if (item.status().code() != StatusCode::kOutOfRange) im.failed = true;
    return item.status();
  }
  {  // GPU: hand out complete batches only (Note [GPU loader])
    const double t_ready = NowSeconds();
    Status s = im.stage->WaitReady(**item);
    if (!s.ok()) {
      im.finished = true;
      im.failed = true;
      return s;
    }
    // Note [Held by]: a published batch whose device work held Next() measurably (0.1 ms). Only
    // a batch with device work to wait for: a CPU batch's Next() descheduled for 0.1 ms on a
    // loaded machine was not held by a device (a flaky "device" on 2 busy cores).
    if (held_by == std::string_view("ready") && (*item)->ready_event != nullptr &&
        NowSeconds() - t_ready > 1e-4)
      held_by = "device";
  }
  (*item)->held_by = held_by;
  (*item)->wait_ms = (NowSeconds() - t0) * 1e3;
  ++im.seq_consumed;
  im.next_batch = (*item)->index + 1;
  im.c_corrupt->fetch_add((*item)->corrupt_skipped);
  return item;
}

LoaderDeviceInfo DataLoader::device_info() const {
  LoaderDeviceInfo info = impl_->cpu_info;
  impl_->stage->FillInfo(&info);
  return info;
}

void DataLoader::SetConsumerStream(void* stream) { impl_->pool->SetConsumerStream(stream); }

StatusOr<std::shared_ptr<Batch>> DataLoader::GetSample(int64_t sample, int64_t epoch) {
  Impl& im = *impl_;
  LF_RETURN_IF_ERROR(CheckSameProcess(im.creator_pid));
  const int64_t n = im.reader->schema().num_samples;
  if (sample < 0 || sample >= n)
    return OutOfRangeError(im.opts.db_path + ": sample " + std::to_string(sample) +
                           " is out of range for a dataset of " + std::to_string(n) + " samples");
  if (epoch < 0) return InvalidArgumentError("epoch must be >= 0");
  std::lock_guard<std::mutex> lock(im.sample_mu);
  if (!im.sample_loader) {  // Note [Sample access]
    LoaderOptions o = im.opts;
    o.batch_size = 1;
    o.shuffle = false;
    o.drop_last = false;
    o.rank = 0;
    o.world_size = 1;
    o.on_corrupt = CorruptPolicy::kError;
    o.threads = 1;
    o.prefetch = 1;
    LF_ASSIGN_OR_RETURN(im.sample_loader, Create(o));
  }
  DataLoader& d = *im.sample_loader;
  Impl& s = *d.impl_;
  if (!(s.running && !s.finished && s.epoch == epoch && s.next_batch == sample))
    LF_RETURN_IF_ERROR(d.Start(epoch, sample));
  return d.Next();
}

void DataLoader::Stop() {
  if (!CheckSameProcess(impl_->creator_pid).ok()) return;
  impl_->StopThreads();
  std::lock_guard<std::mutex> lock(impl_->sample_mu);
  if (impl_->sample_loader) impl_->sample_loader->Stop();
}

}  // namespace data
}  // namespace loongforge
