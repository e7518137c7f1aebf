// The GPU stage of the loader (loader_pipeline.h), in builds with CUDA and nvJPEG (the twin
// without nvJPEG is loader_gpu_stage_stub.cc): nvJPEG decode lanes (nvjpeg_decoder.h), the fused
// image kernel (image_kernels.h) and the stage-3 kernel (collate.h) on a transform stream, batches
// in device memory.
//
// Note [GPU loader]
// -----------------
// With device = kCuda, stage 1 is unchanged (no decode tasks are queued) and lf-collate becomes
// the GPU stage. For each batch, in sampler order:
//   2a. nvJPEG batched decode on a decoder lane's stream into that lane's device images (Note
//       [GPU decode paths] and Note [Decode lanes] in nvjpeg_decoder.h): lf-collate submits up
//       to `decode_lanes` batches ahead, so the decode of batch k+1 runs on its own lane thread
//       while lf-collate finishes batch k; failed images mark their sample corrupt. The lanes
//       take turns for their nvJPEG calls (Note [Decode turns]), so batches leave evenly spaced.
//       (async_decode = false: one batch at a time, decoded on lf-collate.)
//   2b. the transform stream waits for the decode (event) and for the slot's `released` event,
//       then one fused kernel per batch crops/resizes/jitters/normalizes every kept image straight
//       into the slot's device image buffer, at its compacted index; the decoder's buffer set is
//       released after that kernel (event).
//   3.  stage 3 on the transform stream: lf-fetch already packed the batch's raw records into the
//       slot's pinned staging (Note [Collate staging] in collate.h); lf-collate adds which samples
//       survived, one async copy moves the raw ids/lengths/records to the device, and one kernel
//       pads tokens, builds the masks and normalizes state/action into the slot's device arrays
//       (static shapes: padding rows zeroed too); the slot's `ready` event is recorded after it.
//       (stage3_on_device = false runs the CPU twin and copies the arrays.)
// Next() waits (with the timeout) for `ready` before handing the batch out, so a consumer on any
// stream sees complete data. When the consumer drops the batch, the slot's `released` event is
// recorded on the consumer's stream (SetConsumerStream; torch's current stream in Python), and the
// next batch written into that slot waits for it on the GPU: the record_stream discipline, so the
// consumer's queued kernels never read a slot being rewritten. The Work of a batch (its LMDB read
// transaction, whose pages nvJPEG reads) is kept until `lanes` later batches have been decoded:
// by then its decode has finished (a lane decodes again only after its last consumer ran).
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>

#include "common/cuda_check.h"
#include "gpu_util.h"
#include "image_kernels.h"
#include "image_ops.h"
#include "loader_pipeline.h"
#include "nvjpeg_decoder.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

// madvise(MADV_POPULATE_READ), Linux 5.14; older kernels fail it with EINVAL.
#ifdef MADV_POPULATE_READ
constexpr int kMadvPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kMadvPopulateRead = 22;
#endif

// A GPU batch buffer: `base` (pinned) holds stage 3's host staging and the kernel's task list; the
// batch itself lives at dev_base. The non-image arrays have the same layout in both.
struct GpuSlot : Slot {
  uint8_t* dev_base = nullptr;
  Batch dev_batch;  // pointers into dev_base
  uint8_t *host_tail = nullptr, *dev_tail = nullptr;
  size_t tail_bytes = 0;
  GpuImageTask *host_tasks = nullptr, *dev_tasks = nullptr;
  uint8_t* dev_raw = nullptr;  // device copy of `raw`, read by the stage-3 kernel
  cudaEvent_t ready = nullptr, released = nullptr;
};

class GpuSlotMemory : public SlotMemory {
 public:
  explicit GpuSlotMemory(const LoaderOptions& o)
      : device_id_(o.device_id), layout_(o.layout), dtype_(o.dtype) {}

  StatusOr<Slot*> Allocate(const SlotShape& shape) override {
    const size_t b_ = shape.b, k_ = shape.k, image_elem_ = shape.image_elem;
    auto Align = SlotShape::Align;
    const size_t img = Align(image_elem_ * b_ * k_ * 3 * shape.ih * static_cast<size_t>(shape.iw));
    const size_t tail = shape.TailBytes();
    const size_t tasks = Align(sizeof(GpuImageTask) * b_ * k_);
    const size_t raw = shape.raw;
    auto* slot = new GpuSlot();
    auto fail = [&](Status s) {
      Free(slot);
      return s.WithContext("loader: allocating a GPU batch buffer");
    };
    slot->bytes = tail + tasks + raw;
    void* h = nullptr;
    cudaError_t e = cudaHostAlloc(&h, slot->bytes, cudaHostAllocDefault);
    if (e != cudaSuccess)
      return fail(
          ::loongforge::internal::CudaErrorToStatus(e, "cudaHostAlloc", __FILE__, __LINE__));
    slot->base = static_cast<uint8_t*>(h);
    slot->pinned = true;
    void* d = nullptr;
    e = cudaMalloc(&d, img + tail + tasks + raw);
    if (e != cudaSuccess)
      return fail(::loongforge::internal::CudaErrorToStatus(e, "cudaMalloc", __FILE__, __LINE__));
    slot->dev_base = static_cast<uint8_t*>(d);
    e = cudaEventCreateWithFlags(&slot->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&slot->released, cudaEventDisableTiming);
    if (e != cudaSuccess)
      return fail(
          ::loongforge::internal::CudaErrorToStatus(e, "cudaEventCreate", __FILE__, __LINE__));
    shape.LayoutTail(slot->base, &slot->batch);
    slot->batch.images = nullptr;
    slot->batch.pinned = true;
    slot->host_tail = slot->base;
    slot->host_tasks = reinterpret_cast<GpuImageTask*>(slot->base + tail);
    slot->dev_batch.images = reinterpret_cast<float*>(slot->dev_base);
    shape.LayoutTail(slot->dev_base + img, &slot->dev_batch);
    slot->dev_tail = slot->dev_base + img;
    slot->tail_bytes = tail;
    slot->dev_tasks = reinterpret_cast<GpuImageTask*>(slot->dev_base + img + tail);
    slot->raw = slot->base + tail + tasks;
    slot->dev_raw = slot->dev_base + img + tail + tasks;
    // Note [GPU loader]: the device copy is what the consumer gets.
    Batch& pub = slot->dev_batch;
    pub.pinned = false;
    pub.device_type = 2;
    pub.device_id = device_id_;
    pub.image_layout = layout_;
    pub.image_dtype = dtype_;
    pub.ready_event = slot->ready;
    slot->published = &slot->dev_batch;
    return slot;
  }

  void Free(Slot* base_slot) override {
    auto* s = static_cast<GpuSlot*>(base_slot);
    if (s->dev_base) LF_CUDA_WARN_IF_ERROR(cudaFree(s->dev_base));
    if (s->ready) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(s->ready));
    if (s->released) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(s->released));
    if (s->pinned)
      cudaFreeHost(s->base);
    else
      std::free(s->base);
    delete s;
  }

  // Note [GPU loader]: reuse waits for the consumer's queued work.
  void Released(Slot* base_slot, void* consumer_stream) override {
    auto* s = static_cast<GpuSlot*>(base_slot);
    if (!s->released) return;
    auto consumer = static_cast<cudaStream_t>(consumer_stream);
    if (cudaEventRecord(s->released, consumer) != cudaSuccess) {
      cudaGetLastError();
      LF_CUDA_WARN_IF_ERROR(cudaEventRecord(s->released, nullptr));
    }
  }

 private:
  const int device_id_;
  const ImageLayout layout_;
  const DType dtype_;
};

class GpuStage : public DecodeStage {
 public:
  explicit GpuStage(Pipeline& p) : p_(p) {}
  ~GpuStage() override {
    if (xform) {
      LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(xform));
      LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(xform));
    }
  }

  Status Init();

  void FetchThreadStart() override {
    LF_CUDA_WARN_IF_ERROR(cudaSetDevice(p_.opts.device_id));  // slots are allocated there
  }
  void Fetched(Work& w) override {
    if (p_.opts.prefault == PrefaultMode::kOff) return;
    ScopedTimerMs prefault_timer(h_prefault);
    Prefault(w);
  }
  bool QueueDecode(const WorkPtr& w) override {
    w->pending = 1;  // no decode tasks: stage 2 runs on lf-collate (CollateLoop)
    return true;
  }
  void CollateLoop() override;
  Status WaitReady(const Batch& b) override {
    if (!b.ready_event) return Status::Ok();
    ScopedTimerMs timer(p_.h_wait);
    return WaitEvent(static_cast<cudaEvent_t>(b.ready_event), p_.opts.timeout_ms,
                     "loader: batch " + std::to_string(b.index));
  }
  void Sync() override {
    // The decoder first: its lanes may wait for `released` events recorded on xform's work.
    if (decoder) {
      Status s = decoder->Drain();
      if (!s.ok()) LF_LOG(ERROR) << "loader: draining the nvJPEG decoder: " << s;
    }
    if (xform) LF_CUDA_WARN_IF_ERROR(cudaStreamSynchronize(xform));
  }
  void FillInfo(LoaderDeviceInfo* info) const override;

 private:
  // A batch handed to the decoder (Note [Decode lanes]): its Work and the (sample, camera) of
  // each submitted image.
  struct GpuPending {
    WorkPtr w;
    std::shared_ptr<std::vector<std::pair<int, int>>> who;
  };
  Status GpuSubmit(const WorkPtr& w, GpuPending* p);
  Status GpuFinish(Work& w, const std::vector<std::pair<int, int>>& who,
                   std::shared_ptr<Batch>* out);
  void Prefault(const Work& w);

  Pipeline& p_;
  std::unique_ptr<NvJpegBatchDecoder> decoder;
  cudaStream_t xform = nullptr;  // "transform" stream: fused kernel + stage-3 copy
  Histogram *h_gpu_decode = nullptr, *h_gpu_wait = nullptr, *h_gpu_submit = nullptr;
  Histogram* h_prefault = nullptr;  // the part of fetch_ms spent in Prefault()
  std::atomic<uint32_t> prefault_sink{0};
  std::atomic<bool> populate_ok{true};  // MADV_POPULATE_READ works on this kernel
};

Status GpuStage::Init() {
  const LoaderOptions& o = p_.opts;
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device_id));
  NvJpegDecoderOptions dopt;
  dopt.device = o.device_id;
  dopt.allow_hardware = o.hw_decode;
  dopt.hw_ratio = o.hw_decode_ratio;
  dopt.cpu_pool = p_.decode_pool.get();
  dopt.timeout_ms = o.timeout_ms;
  dopt.max_frame_pixels = o.max_frame_pixels;
  dopt.async = o.async_decode;
  dopt.lanes = o.async_decode ? o.decode_lanes : 2;
  dopt.reuse_state = o.decode_reuse;
  dopt.hw_handle_per_lane = o.decode_hw_handle_per_lane;
  dopt.interleaved = o.decode_interleaved;
  dopt.stagger = o.decode_stagger;
  LF_ASSIGN_OR_RETURN(decoder, NvJpegBatchDecoder::Create(dopt));
  LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&xform, cudaStreamNonBlocking));
  // Slots for every batch that can be in flight: lf-fetch's, work_q, lf-collate's (one per
  // decode lane with async_decode), out_q and two held by the consumer. More are allocated on
  // demand.
  const int collating = o.async_decode ? o.decode_lanes : 1;
  if (o.reserve_slots) LF_RETURN_IF_ERROR(p_.pool->Reserve(2 * o.prefetch + 3 + collating));
  // Host time handing a batch to the decoder (async_decode off: the whole decode) and waiting
  // for its decoded images.
  h_gpu_decode = p_.metrics.GetHistogram("gpu_decode_submit_ms");
  h_gpu_wait = p_.metrics.GetHistogram("gpu_decode_wait_ms");
  h_gpu_submit = p_.metrics.GetHistogram("gpu_kernel_submit_ms");
  h_prefault = p_.metrics.GetHistogram("fetch_prefault_ms");
  return Status::Ok();
}

void GpuStage::FillInfo(LoaderDeviceInfo* out) const {
  LoaderDeviceInfo& info = *out;
  if (decoder) {
    NvJpegDecoderInfo d = decoder->info();
    info.gpu = true;
    info.hw_decode = d.hw_available && d.hw_ratio > 0.f;
    info.decode_backend = "nvjpeg:" + d.backend;
    info.reason = d.reason;
    info.hw_ratio = d.hw_ratio;
    info.ratio_measured = d.ratio_measured;
    info.images_hw = d.images_hw;
    info.images_cuda = d.images_cuda;
    info.images_cpu = d.images_cpu;
    info.stage3_on_device = p_.opts.stage3_on_device;
    info.decode_lanes = d.async ? d.lanes : 1;
    info.decode_stagger = d.stagger;
    info.decoded_batches = d.batches;
    info.decode_release_wait_ms = d.release_wait_ms;
    info.decode_prepare_ms = d.prepare_ms;
    info.decode_turn_wait_ms = d.turn_wait_ms;
    info.decode_call_ms = d.call_ms;
  }
}

// Reads one byte of every page of the batch's JPEG bytes, so the page faults of LMDB's map (read
// ahead is off: MDB_NORDAHEAD) are taken here, ahead of time, and not inside nvJPEG's copy of
// the bitstreams on the GPU stage's thread, which feeds the JPEG engine.
void GpuStage::Prefault(const Work& w) {
  const size_t cams = p_.camera_modality.size();
  if (p_.opts.prefault == PrefaultMode::kPopulate && populate_ok.load(std::memory_order_relaxed)) {
    // One call per record maps its pages without a fault per page.
    bool ok = true;
    for (size_t i = 0; i < w.samples.size() && ok; ++i) {
      if (!w.sample_status[i].ok()) continue;
      for (size_t c = 0; c < cams && ok; ++c) {
        const std::string_view v = w.jpeg[i * cams + c];
        if (v.empty()) continue;
        const auto a = reinterpret_cast<uintptr_t>(v.data()) & ~uintptr_t{4095};
        const size_t len = reinterpret_cast<uintptr_t>(v.data()) + v.size() - a;
        if (madvise(reinterpret_cast<void*>(a), len, kMadvPopulateRead) != 0) {
          ok = false;
          if (populate_ok.exchange(false))
            LF_LOG(WARNING) << "loader: madvise(MADV_POPULATE_READ) failed ("
                            << std::strerror(errno) << "): touching pages instead";
        }
      }
    }
    if (ok) return;
  }
  uint32_t sink = 0;
  for (size_t i = 0; i < w.samples.size(); ++i) {
    if (!w.sample_status[i].ok()) continue;
    for (size_t c = 0; c < cams; ++c) {
      const std::string_view v = w.jpeg[i * cams + c];
      for (size_t o = 0; o < v.size(); o += 4096) sink += static_cast<uint8_t>(v[o]);
      if (!v.empty()) sink += static_cast<uint8_t>(v.back());
    }
  }
  prefault_sink.fetch_add(sink, std::memory_order_relaxed);  // keeps the reads
}

// Stage 2 and 3 of the GPU loader (Note [GPU loader]), with the decode of up to `decode_lanes`
// batches in flight (Note [Decode lanes] in nvjpeg_decoder.h): lf-collate submits batch k+1 to
// the decoder before it finishes batch k (collects its images, launches its kernels, publishes
// it), so the JPEG engines always have a batch while the host works on another. Batches are
// finished in submission order, which is sampler order. With async_decode off there is one
// batch in flight and the decoder decodes it inside Submit(), as before lanes existed.
void GpuStage::CollateLoop() {
  LF_CUDA_WARN_IF_ERROR(cudaSetDevice(p_.opts.device_id));  // this thread's CUDA calls
  const size_t depth = p_.opts.async_decode ? static_cast<size_t>(p_.opts.decode_lanes) : 1;
  // A finished batch's Work (its LMDB transaction, whose pages nvJPEG reads) is kept until
  // `lanes` later batches were collected: by then its lane decoded again, which it does only
  // after the batch's consumer kernels (and so its decode) finished. On exit the decoder is
  // drained and the device synchronized before Works are dropped (lanes may still read them).
  const size_t lanes = p_.opts.async_decode ? static_cast<size_t>(p_.opts.decode_lanes) : 2;
  std::deque<WorkPtr> retire;
  std::deque<GpuPending> inflight;
  struct Drain {
    GpuStage* im;
    std::deque<WorkPtr>* retire;
    std::deque<GpuPending>* inflight;
    ~Drain() {
      if (!retire->empty() || !inflight->empty()) im->Sync();
      inflight->clear();
      retire->clear();
    }
  } drain{this, &retire, &inflight};
  // Finishes the oldest batch in flight; false: stop (error delivered or queue closed).
  auto finish_oldest = [&]() -> bool {
    GpuPending p = std::move(inflight.front());
    inflight.pop_front();
    if (p.w->epoch_end)  // after the epoch's last batch, before the next epoch's first
      return p_.out_q
          ->Push(OutOfRangeError("end of epoch " + std::to_string(p.w->epoch)),
                 std::chrono::hours(24 * 365))
          .ok();
    std::shared_ptr<Batch> batch;
    Status cs;
    {
      ScopedTimerMs timer(p_.h_collate);
      cs = GpuFinish(*p.w, *p.who, &batch);
    }
    retire.push_back(std::move(p.w));
    while (retire.size() > lanes) retire.pop_front();
    if (!cs.ok()) {
      p_.out_q->Push(cs, std::chrono::hours(24 * 365)).IgnoreError();
      return false;
    }
    p_.h_latency->Record(batch->latency_ms);
    p_.c_batches->fetch_add(1);
    return p_.out_q->Push(std::move(batch), std::chrono::hours(24 * 365)).ok();
  };
  while (!p_.stop.load()) {
    // Batches in the decoder (epoch-end markers in `inflight` hold no lane).
    if (static_cast<size_t>(decoder->in_flight()) >= depth) {
      if (!finish_oldest()) return;
      continue;
    }
    WorkPtr w;
    if (inflight.empty()) {
      if (!p_.work_q->Pop(&w, std::chrono::hours(24 * 365)).ok()) break;  // closed: stop
    } else if (!p_.work_q->TryPop(&w)) {
      // Nothing fetched yet: finish what is in flight instead of waiting with it.
      if (!finish_oldest()) return;
      continue;
    }
    if (w->epoch_end) {
      // In order with the batches (Note [Epoch continuation]): the next epoch's first batches are
      // submitted while this epoch's last ones are still being decoded.
      inflight.push_back(GpuPending{std::move(w), nullptr});
      continue;
    }
    // GPU Works have no decode tasks (pending is 0 once queued); kept for symmetry.
    if (!p_.WaitDecoded(*w)) return;
    if (p_.stop.load()) break;
    GpuPending p;
    Status s = GpuSubmit(w, &p);
    if (!s.ok()) {
      p_.out_q->Push(s, std::chrono::hours(24 * 365)).IgnoreError();
      return;
    }
    inflight.push_back(std::move(p));
  }
}

Status GpuStage::GpuSubmit(const WorkPtr& wp, GpuPending* p) {
  const Work& w = *wp;
  const int cams = static_cast<int>(p_.reader->schema().cameras.size());
  const size_t n = w.samples.size();
  std::vector<std::string_view> views;
  auto who = std::make_shared<std::vector<std::pair<int, int>>>();  // (sample, camera) per view
  views.reserve(n * cams);
  who->reserve(n * cams);
  for (size_t i = 0; i < n; ++i) {
    if (!w.sample_status[i].ok()) continue;
    for (int c = 0; c < cams; ++c) {
      views.push_back(w.jpeg[i * cams + c]);
      who->emplace_back(static_cast<int>(i), c);
    }
  }
  // Called on a decoder lane for corrupt images: reads only what stays constant while the Work
  // is in flight (Work and `who` outlive the decode: GpuCollateLoop).
  const Work* wr = &w;
  const std::vector<std::pair<int, int>>* whor = who.get();
  auto name_of = [this, wr, whor](size_t k) {
    return p_.reader->path() + ": record '" +
           SampleKey(wr->samples[(*whor)[k].first], p_.camera_modality[(*whor)[k].second]) + "'";
  };
  p->w = wp;
  p->who = std::move(who);
  ScopedTimerMs timer(h_gpu_decode);
  return decoder->Submit(std::move(views), std::move(name_of));
}

Status GpuStage::GpuFinish(Work& w, const std::vector<std::pair<int, int>>& who,
                           std::shared_ptr<Batch>* out) {
  const Schema& sc = p_.reader->schema();
  const int cams = static_cast<int>(sc.cameras.size());
  const size_t n = w.samples.size();
  NvJpegBatchDecoder::Result res;
  {
    ScopedTimerMs timer(h_gpu_wait);
    LF_RETURN_IF_ERROR(decoder->Collect(&res));
  }
  std::vector<DecodedImage>& decoded = res.images;
  std::vector<Status>& dstatus = res.status;
  for (size_t k = 0; k < who.size(); ++k)
    if (!dstatus[k].ok()) w.SetError(static_cast<size_t>(who[k].first), std::move(dstatus[k]));
  // Which samples stay (corrupt policy), the batch's shape, and the compacted output index of
  // each kept sample.
  CollatePlan plan;
  LF_RETURN_IF_ERROR(p_.PlanCollate(w, &plan));
  std::vector<int> rank(n, -1);
  for (int o = 0; o < plan.n; ++o) rank[plan.keep[o]] = o;
  auto* slot = static_cast<GpuSlot*>(w.slot);
  GpuImageTask* tasks = slot->host_tasks;  // pinned: the task copy is truly async
  int nt = 0;
  for (size_t k = 0; k < who.size(); ++k) {
    const auto [i, c] = who[k];
    if (rank[i] < 0) continue;
    const DecodedImage& d = decoded[k];
    GpuImageTask t;
    for (int ch = 0; ch < 3; ++ch) t.plane[ch] = d.plane[ch];
    t.pitch = d.pitch;
    t.pixel_stride = d.pixel_stride;
    t.width = d.width;
    t.height = d.height;
    // Same random stream and draws, in the same order, as DecodeImage() (the CPU path).
    SampleRng rng(p_.opts.seed, w.epoch, w.samples[i], c);
    const float fx = p_.opts.train ? rng.Uniform() : 0.5f;
    const float fy = p_.opts.train ? rng.Uniform() : 0.5f;
    const internal::CropBox box =
        internal::ChooseCropBox(d.width, d.height, p_.opts.image_size[1], p_.opts.image_size[0],
                                p_.opts.crop_fraction, static_cast<int>(p_.opts.resize), fx, fy);
    t.box_w = box.w;
    t.box_h = box.h;
    t.box_x0 = box.x0;
    t.box_y0 = box.y0;
    if (p_.opts.color_jitter) {
      const internal::Jitter j = internal::DrawJitter(&rng);  // Note [Colour jitter]
      t.jitter = 1;
      t.brightness = j.brightness, t.contrast = j.contrast, t.saturation = j.saturation;
      t.hue = j.hue;
    }
    t.gray_mean = -1.f;  // computed on the device
    t.out_index = rank[i] * cams + c;
    tasks[nt++] = t;
  }
  p_.c_images->fetch_add(nt);
  {
    ScopedTimerMs timer(h_gpu_submit);
    LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(xform, res.ready, 0));
    LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(xform, slot->released, 0));
    internal::GpuResizeParams p;
    p.out_h = p_.opts.image_size[0];
    p.out_w = p_.opts.image_size[1];
    p.out_count = std::max<int>(1, static_cast<int>(n) * cams);
    p.layout = p_.opts.layout == ImageLayout::kNHWC ? internal::OutLayout::kNHWC
                                                    : internal::OutLayout::kNCHW;
    p.dtype = p_.opts.dtype == DType::kBFloat16 ? internal::OutDType::kBFloat16
                                                : internal::OutDType::kFloat32;
    p.antialias = p_.opts.antialias;
    for (int ch = 0; ch < 3; ++ch) p.mean[ch] = p_.opts.mean[ch], p.std[ch] = p_.opts.std[ch];
    LF_RETURN_IF_ERROR(internal::LaunchCropResizeNormalize(tasks, nt, slot->dev_tasks, p,
                                                           slot->dev_batch.images, xform));
    LF_RETURN_IF_ERROR(decoder->ReleaseAfter(xform));
  }
  // Static shapes: rows past the kept samples are zero images.
  if (plan.rows > plan.n) {
    const size_t img_bytes = static_cast<size_t>(cams) * 3 * p_.opts.image_size[0] *
                             p_.opts.image_size[1] * DTypeSize(p_.opts.dtype);
    LF_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(reinterpret_cast<uint8_t*>(slot->dev_batch.images) + plan.n * img_bytes, 0,
                        (plan.rows - plan.n) * img_bytes, xform));
  }
  // Stage 3 (Note [Collate staging]), ordered after the slot's `released` wait above.
  if (p_.opts.stage3_on_device) {
    // Raw ids, lengths and records only; the kernel pads, masks and normalizes on the device.
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        slot->dev_raw, slot->raw, p_.s3.Bytes(plan.total_tokens), cudaMemcpyHostToDevice, xform));
    internal::CollateOut o3;
    o3.tokens = slot->dev_batch.tokens;
    o3.attention_mask = slot->dev_batch.attention_mask;
    o3.state = slot->dev_batch.state;
    o3.action = slot->dev_batch.action;
    o3.action_mask = slot->dev_batch.action_mask;
    o3.sample_index = slot->dev_batch.sample_index;
    LF_RETURN_IF_ERROR(internal::LaunchCollate(p_.s3, slot->dev_raw, p_.Dims(plan), o3, xform));
  } else {
    // A/B switch off: the CPU twin into the pinned staging of the arrays, then one copy.
    internal::CollateOut o3;
    const Batch& hb = slot->batch;
    o3.tokens = hb.tokens;
    o3.attention_mask = hb.attention_mask;
    o3.state = hb.state;
    o3.action = hb.action;
    o3.action_mask = hb.action_mask;
    o3.sample_index = hb.sample_index;
    internal::CollateReference(p_.s3, slot->raw, p_.Dims(plan), o3);
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot->dev_tail, slot->host_tail, slot->tail_bytes,
                                            cudaMemcpyHostToDevice, xform));
  }
  LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->ready, xform));
  p_.Publish(w, plan, out);
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DecodeStage>> CreateGpuStage(Pipeline& p) {
  auto stage = std::make_unique<GpuStage>(p);
  LF_RETURN_IF_ERROR(stage->Init());
  return std::unique_ptr<DecodeStage>(std::move(stage));
}

std::shared_ptr<SlotMemory> CreateGpuSlotMemory(const LoaderOptions& o) {
  return std::make_shared<GpuSlotMemory>(o);
}

bool GpuStageSupport(int device_id, std::string* reason) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    *reason = std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
    return false;
  }
  if (device_id < 0 || device_id >= n) {
    *reason = "CUDA device " + std::to_string(device_id) + " does not exist (" + std::to_string(n) +
              " devices)";
    return false;
  }
  *reason = "CUDA and nvJPEG available";
  return true;
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
