// The CPU stage of the loader (loader_pipeline.h): stage 2 as one libjpeg-turbo decode task per
// image on the lf-decode pool (DCT-domain downscaling, then the fused crop/resize/jitter/normalize
// of image_ops.h straight into the batch buffer), and stage 3 by its CPU twin (collate.h), on
// lf-collate. Batches live in host memory, pinned with pin_memory where the build has CUDA.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "image_ops.h"
#include "loader_pipeline.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

// Host slots: one allocation per batch, every array at its maximum size.
class HostSlotMemory : public SlotMemory {
 public:
  explicit HostSlotMemory(bool pin) : pin_(pin) {}

  StatusOr<Slot*> Allocate(const SlotShape& shape) override {
    // Images (float32 or uint8), then the tail every stage lays out alike (SlotShape), then the
    // staging.
    const size_t img = SlotShape::Align(shape.image_elem * shape.b * shape.k * 3 * shape.ih *
                                        static_cast<size_t>(shape.iw));
    const size_t tail = shape.TailBytes();
    auto* slot = new Slot();
    slot->bytes = img + tail + shape.raw;
    if (pin_) {
      if (void* p = AllocPinned(slot->bytes)) {
        slot->base = static_cast<uint8_t*>(p);
        slot->pinned = true;
      }
    }
    if (!slot->base) {
      void* p = nullptr;
      if (posix_memalign(&p, 4096, slot->bytes) != 0) {
        Status err = ResourceExhaustedError(
            "loader: cannot allocate a " + std::to_string(slot->bytes >> 20) + " MiB batch buffer");
        delete slot;
        return err;
      }
      slot->base = static_cast<uint8_t*>(p);
      // Fault the pages in now, once, on the fetch thread: first-touch faults inside the decode
      // workers showed up as batch-interval jitter (a fresh GiB costs seconds on some VMs).
      std::memset(slot->base, 0, slot->bytes);
    }
    Batch& b = slot->batch;
    b.images = reinterpret_cast<float*>(slot->base);
    shape.LayoutTail(slot->base + img, &b);
    slot->raw = slot->base + img + tail;
    b.pinned = slot->pinned;
    slot->published = &slot->batch;
    return slot;
  }

  void Free(Slot* s) override {
    if (s->pinned)
      FreePinned(s->base);
    else
      std::free(s->base);
    delete s;
  }

 private:
  const bool pin_;
};

class CpuStage : public DecodeStage {
 public:
  explicit CpuStage(Pipeline& p) : p_(p) {}

  bool QueueDecode(const WorkPtr& w) override {
    const size_t n = w->samples.size();
    const int cams = static_cast<int>(p_.camera_modality.size());
    int tasks = 0;
    for (size_t i = 0; i < n; ++i)
      if (w->sample_status[i].ok()) tasks += cams;
    w->pending = tasks + 1;  // +1 released by the pipeline, after every task is queued
    for (size_t i = 0; i < n && !p_.stop.load(); ++i) {
      if (!w->sample_status[i].ok()) continue;
      for (int c = 0; c < cams; ++c) {
        p_.tasks_in_flight.fetch_add(1);
        Status s = p_.decode_pool->Submit([this, w, i, c] {
          DecodeImage(w, static_cast<int>(i), c);
          p_.tasks_in_flight.fetch_sub(1);
        });
        if (!s.ok()) {
          p_.tasks_in_flight.fetch_sub(1);
          w->cancelled = true;
          return false;  // pool shut down: the loader is being destroyed
        }
      }
    }
    return true;
  }

  void CollateLoop() override;

 private:
  // Stage 2: one image of one sample, on an lf-decode worker.
  void DecodeImage(const WorkPtr& w, int sample, int camera);
  // ResizeMode::kPad: `box` of `rgb` resized into its letterbox of the output image at element
  // `at` of the batch's images, the rest black (pixel 0, normalized as any pixel).
  void PadInto(const RgbImage& rgb, const CropBox& box, const internal::Jitter& j, float gray,
               size_t at, Work* w);
  // Stage 3: compaction, padding rows, the stage-3 CPU twin, publication.
  Status Collate(Work& w, std::shared_ptr<Batch>* out);

  Pipeline& p_;
};

void CpuStage::DecodeImage(const WorkPtr& w, int sample, int camera) {
  if (!w->cancelled.load()) {
    ScopedTimerMs timer(p_.h_decode);
    thread_local JpegDecoder decoder;
    thread_local RgbImage rgb;
    const Schema& sc = p_.reader->schema();
    const int cams = static_cast<int>(sc.cameras.size());
    const int out_h = p_.opts.image_size[0], out_w = p_.opts.image_size[1];
    const std::string_view jpeg = w->jpeg[static_cast<size_t>(sample) * cams + camera];
    const int64_t id = w->samples[sample];
    // Ask the decoder for an image whose crop is still >= the output size.
    int min_w = 0, min_h = 0;
    if (p_.opts.dct_scaling) {
      min_w = static_cast<int>(std::ceil(out_w / p_.opts.crop_fraction));
      min_h = static_cast<int>(std::ceil(out_h / p_.opts.crop_fraction));
    }
    Status s = decoder.Decode(
        jpeg, min_w, min_h, &rgb,
        p_.reader->path() + ": record '" + SampleKey(id, p_.camera_modality[camera]) + "'",
        p_.opts.max_frame_pixels);
    if (s.ok()) {
      SampleRng rng(p_.opts.seed, w->epoch, id, camera);
      const float fx = p_.opts.train ? rng.Uniform() : 0.5f;
      const float fy = p_.opts.train ? rng.Uniform() : 0.5f;
      const CropBox box =
          internal::ChooseCropBox(rgb.width, rgb.height, out_w, out_h, p_.opts.crop_fraction,
                                  static_cast<int>(p_.opts.resize), fx, fy);
      Jitter j;
      float gray = 0;
      if (p_.opts.color_jitter) {
        j = internal::DrawJitter(&rng);  // Note [Colour jitter] (image_ops.h)
        gray = internal::MeanGray(rgb, box, 4);
      }
      const size_t at = (static_cast<size_t>(sample) * cams + camera) * 3 * out_h * out_w;
      if (p_.opts.resize == ResizeMode::kPad) {
        PadInto(rgb, box, j, gray, at, w.get());
      } else if (p_.opts.dtype == DType::kUInt8) {
        auto* dst = reinterpret_cast<uint8_t*>(w->slot->batch.images) + at;
        internal::CropResizeToUint8(rgb, box, out_w, out_h, j, gray, dst);
      } else {
        internal::NormalizeParams norm{p_.opts.mean, p_.opts.std};
        internal::CropResizeNormalize(rgb, box, out_w, out_h, j, gray, norm,
                                      w->slot->batch.images + at);
      }
      p_.c_images->fetch_add(1);
    } else {
      w->SetError(static_cast<size_t>(sample), std::move(s));
    }
  }
  w->TaskDone();
}

void CpuStage::PadInto(const RgbImage& rgb, const CropBox& box, const internal::Jitter& j,
                       float gray, size_t at, Work* w) {
  const int out_h = p_.opts.image_size[0], out_w = p_.opts.image_size[1];
  const internal::PadRect r = internal::LetterboxRect(box, out_w, out_h);
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  auto place = [&](auto* dst, const auto* src, auto black) {
    for (int c = 0; c < 3; ++c) {
      std::fill(dst + c * plane, dst + (c + 1) * plane, black[c]);
      for (int y = 0; y < r.h; ++y)
        std::copy(src + (static_cast<size_t>(c) * r.h + y) * r.w,
                  src + (static_cast<size_t>(c) * r.h + y + 1) * r.w,
                  dst + c * plane + static_cast<size_t>(r.y + y) * out_w + r.x);
    }
  };
  if (p_.opts.dtype == DType::kUInt8) {
    thread_local std::vector<uint8_t> tmp;
    tmp.resize(static_cast<size_t>(3) * r.w * r.h);
    internal::CropResizeToUint8(rgb, box, r.w, r.h, j, gray, tmp.data());
    const uint8_t black[3] = {0, 0, 0};
    place(reinterpret_cast<uint8_t*>(w->slot->batch.images) + at, tmp.data(), black);
  } else {
    thread_local std::vector<float> tmp;
    tmp.resize(static_cast<size_t>(3) * r.w * r.h);
    internal::NormalizeParams norm{p_.opts.mean, p_.opts.std};
    internal::CropResizeNormalize(rgb, box, r.w, r.h, j, gray, norm, tmp.data());
    float black[3];
    for (int c = 0; c < 3; ++c) black[c] = -norm.mean[c] / norm.std[c];
    place(w->slot->batch.images + at, tmp.data(), black);
  }
}

// Stage 3 of the CPU loader: compaction, padding rows, the stage-3 CPU twin, publication.
Status CpuStage::Collate(Work& w, std::shared_ptr<Batch>* out) {
  const Schema& sc = p_.reader->schema();
  const int cams = static_cast<int>(sc.cameras.size());
  // Bytes of one camera's image.
  const size_t img_elems = static_cast<size_t>(3) * p_.opts.image_size[0] * p_.opts.image_size[1] *
                           DTypeSize(p_.opts.dtype);
  Batch& b = w.slot->batch;
  auto* images = reinterpret_cast<uint8_t*>(b.images);
  CollatePlan p;
  LF_RETURN_IF_ERROR(p_.PlanCollate(w, &p));
  for (int o = 0; o < p.n; ++o) {
    const size_t i = static_cast<size_t>(p.keep[o]);
    // Move decoded images down over a skipped sample.
    if (static_cast<size_t>(o) != i)
      std::memmove(images + static_cast<size_t>(o) * cams * img_elems,
                   images + i * cams * img_elems, cams * img_elems);
  }
  if (p.rows > p.n)  // static shapes: padding rows are zero
    std::memset(images + static_cast<size_t>(p.n) * cams * img_elems, 0,
                (p.rows - p.n) * cams * img_elems);
  internal::CollateOut o3;
  o3.tokens = b.tokens;
  o3.attention_mask = b.attention_mask;
  o3.state = b.state;
  o3.action = b.action;
  o3.action_mask = b.action_mask;
  o3.sample_index = b.sample_index;
  internal::CollateReference(p_.s3, w.slot->raw, p_.Dims(p), o3);
  p_.Publish(w, p, out);
  return Status::Ok();
}

void CpuStage::CollateLoop() {
  WorkPtr w;
  while (!p_.stop.load()) {
    Status s = p_.work_q->Pop(&w, std::chrono::hours(24 * 365));
    if (!s.ok()) break;  // closed: stop
    if (w->epoch_end) {
      if (!p_.out_q
               ->Push(OutOfRangeError("end of epoch " + std::to_string(w->epoch)),
                      std::chrono::hours(24 * 365))
               .ok())
        return;
      continue;
    }
    if (!p_.WaitDecoded(*w)) return;
    if (p_.stop.load()) break;
    std::shared_ptr<Batch> batch;
    Status cs;
    {
      ScopedTimerMs timer(p_.h_collate);
      cs = Collate(*w, &batch);
    }
    w.reset();  // ends the read transaction
    if (!cs.ok()) {
      p_.out_q->Push(cs, std::chrono::hours(24 * 365)).IgnoreError();
      return;
    }
    p_.h_latency->Record(batch->latency_ms);
    p_.c_batches->fetch_add(1);
    if (!p_.out_q->Push(std::move(batch), std::chrono::hours(24 * 365)).ok()) return;
  }
}

}  // namespace

std::unique_ptr<DecodeStage> CreateCpuStage(Pipeline& p) { return std::make_unique<CpuStage>(p); }

std::shared_ptr<SlotMemory> CreateHostSlotMemory(bool pin) {
  return std::make_shared<HostSlotMemory>(pin);
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
