// Tests of the nvJPEG batch decoder (GPU machine only: builds with nvJPEG, skips without a device).
#include <gtest/gtest.h>

#include "common/cuda_check.h"

#include <cuda_runtime_api.h>
#include <turbojpeg.h>

#include <cmath>
#include <string>
#include <vector>

#include "image_ops.h"
#include "nvjpeg_decoder.h"
#include "test_dataset.h"

namespace loongforge {
namespace data {
namespace {

using internal::DecodedImage;
using internal::NvJpegBatchDecoder;
using internal::NvJpegDecoderOptions;

bool HaveDevice() { return ::loongforge::internal::CudaDevicePresent(); }

std::string Encode(const std::vector<uint8_t>& rgb, int w, int h, int subsamp, int flags) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  std::string out;
  if (tjCompress2(tj, rgb.data(), w, w * 3, h, TJPF_RGB, &buf, &size, subsamp, 90, flags) == 0)
    out.assign(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// Copies a decoded device image to host RGB8 interleaved.
std::vector<uint8_t> Download(const DecodedImage& d) {
  const size_t rows = d.pixel_stride == 1 ? 3 * static_cast<size_t>(d.height) : d.height;
  std::vector<uint8_t> raw(rows * d.pitch);
  // Planes of a planar image are contiguous (plane c at plane[0] + c * pitch * height).
  EXPECT_EQ(cudaMemcpy(raw.data(), d.plane[0], raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<uint8_t> rgb(3 * static_cast<size_t>(d.width) * d.height);
  for (int y = 0; y < d.height; ++y)
    for (int x = 0; x < d.width; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(static_cast<size_t>(y) * d.width + x) * 3 + c] =
            d.pixel_stride == 1 ? raw[(static_cast<size_t>(c) * d.height + y) * d.pitch + x]
                                : raw[static_cast<size_t>(y) * d.pitch + 3 * x + c];
  return rgb;
}

// Guards the decode paths: baseline (hardware/cuda), progressive and grayscale (cpu or cuda)
// must all give the libjpeg-turbo pixels up to IDCT/upsampling differences, and truncated or
// non-JPEG inputs must be DataLoss naming the record, in a batch that otherwise decodes.
TEST(NvJpegDecoder, MatchesCpuDecodeAndReportsCorrupt) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  for (bool interleaved : {false, true}) {  // planar RGB, then NVJPEG_OUTPUT_RGBI
    NvJpegDecoderOptions o;
    o.interleaved = interleaved;
    auto dec = NvJpegBatchDecoder::Create(o);
    ASSERT_TRUE(dec.ok()) << dec.status();
    std::vector<std::string> files;
    std::vector<std::vector<uint8_t>> want;
    std::vector<std::pair<int, int>> dims;
    for (int i = 0; i < 24; ++i) {
      int w = 64 + 37 * (i % 7), h = 48 + 29 * (i % 5);
      auto rgb = testing::RandomRgb(w, h, 1000 + i);
      int subsamp = i % 3 == 0 ? TJSAMP_444 : TJSAMP_420;
      int flags = i == 5 ? TJFLAG_PROGRESSIVE : 0;
      if (i == 7) subsamp = TJSAMP_GRAY;
      files.push_back(Encode(rgb, w, h, subsamp, flags));
      internal::RgbImage ref;
      internal::JpegDecoder cpu;
      EXPECT_TRUE(cpu.Decode(files.back(), 0, 0, &ref, "ref").ok());
      want.push_back(ref.pixels);
      dims.push_back({w, h});
    }
    const size_t truncated = files.size(), garbage = files.size() + 1;
    files.push_back(files[3].substr(0, files[3].size() / 2));
    files.push_back(std::string(500, '\x42'));
    std::vector<std::string_view> views(files.begin(), files.end());
    auto name_of = [](size_t i) { return "rec" + std::to_string(i); };
    // Several batches: the auto split warms up, measures both paths, then splits.
    for (int batch = 0; batch < 5; ++batch) {
      std::vector<DecodedImage> out;
      std::vector<Status> st;
      ASSERT_TRUE((*dec)->Decode(views, name_of, &out, &st).ok());
      ASSERT_EQ(cudaEventSynchronize((*dec)->ready_event()), cudaSuccess);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(st[i].ok()) << "image " << i << ": " << st[i];
        ASSERT_EQ(out[i].width, dims[i].first);
        ASSERT_EQ(out[i].height, dims[i].second);
        auto got = Download(out[i]);
        double sum = 0;
        for (size_t k = 0; k < got.size(); ++k) sum += std::abs(int(got[k]) - int(want[i][k]));
        // IDCT and chroma upsampling differ between the libraries: measured 4-9 levels on average
        // on an H200 for these noisy, chroma-rich random images; a wrong plane order, pitch or
        // size gives tens.
        EXPECT_LT(sum / got.size(), 12.0)
            << "image " << i << " batch " << batch << " interleaved " << interleaved;
      }
      EXPECT_EQ(st[truncated].code(), StatusCode::kDataLoss) << st[truncated];
      EXPECT_NE(st[truncated].message().find("rec" + std::to_string(truncated)), std::string::npos);
      EXPECT_EQ(st[garbage].code(), StatusCode::kDataLoss) << st[garbage];
      ASSERT_TRUE((*dec)->ReleaseAfter((*dec)->stream()).ok());
    }
    auto info = (*dec)->info();
    EXPECT_GE(info.images_cpu, 5 * 3);  // progressive, truncated, garbage at least
    EXPECT_GT(info.images_hw + info.images_cuda, 0);
    std::printf(
        "[nvjpeg] backend=%s hw=%d reason=%s ratio=%.3f measured=%d hw=%lld cuda=%lld "
        "cpu=%lld\n",
        info.backend.c_str(), info.hw_available, info.reason.c_str(), info.hw_ratio,
        info.ratio_measured, (long long)info.images_hw, (long long)info.images_cuda,
        (long long)info.images_cpu);
  }
}

// Guards against device memory leaks: 100k decodes (100 batches of 1000 small images, two in
// flight on the lane threads) must leave free device memory where it was after warm-up.
TEST(NvJpegDecoder, NoDeviceMemoryGrowthOver100kDecodes) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  // Async lanes, two batches in flight (the loader's default): Note [Decode lanes].
  NvJpegDecoderOptions o;
  o.async = true;
  o.lanes = 2;
  auto dec = NvJpegBatchDecoder::Create(o);
  ASSERT_TRUE(dec.ok()) << dec.status();
  std::vector<std::string> files;
  for (int i = 0; i < 1000; ++i) {
    int w = 64 + (i % 4) * 16, h = 48 + (i % 3) * 16;
    files.push_back(Encode(testing::RandomRgb(w, h, i), w, h, TJSAMP_420, 0));
  }
  std::vector<std::string_view> views(files.begin(), files.end());
  auto name_of = [](size_t i) { return std::to_string(i); };
  size_t free_warm = 0, free_end = 0, total = 0;
  std::vector<Status> st;
  ASSERT_TRUE((*dec)->Submit(views, name_of).ok());
  for (int b = 0; b < 100; ++b) {
    if (b + 1 < 100) {
      ASSERT_TRUE((*dec)->Submit(views, name_of).ok());
    }
    NvJpegBatchDecoder::Result r;
    ASSERT_TRUE((*dec)->Collect(&r).ok());
    st = std::move(r.status);
    ASSERT_TRUE((*dec)->ReleaseAfter(r.stream).ok());
    if (b == 5 || b == 99) {
      ASSERT_EQ(cudaEventSynchronize(r.ready), cudaSuccess);
      ASSERT_EQ(cudaMemGetInfo(b == 5 ? &free_warm : &free_end, &total), cudaSuccess);
    }
  }
  ASSERT_TRUE((*dec)->Drain().ok());
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s;
  const double grew_mib = (double(free_warm) - double(free_end)) / (1 << 20);
  std::printf("[nvjpeg] free after warm-up %.1f MiB, after 100k decodes %.1f MiB\n",
              free_warm / 1048576.0, free_end / 1048576.0);
  EXPECT_LT(grew_mib, 8.0) << "device memory grew by " << grew_mib << " MiB";
}

// Downloads every image of a batch (empty for a failed image) with its status.
struct HostBatch {
  std::vector<std::vector<uint8_t>> images;
  std::vector<StatusCode> codes;
};
HostBatch ToHost(const NvJpegBatchDecoder::Result& r) {
  HostBatch h;
  EXPECT_EQ(cudaEventSynchronize(r.ready), cudaSuccess);
  for (size_t i = 0; i < r.images.size(); ++i) {
    h.codes.push_back(r.status[i].code());
    h.images.push_back(r.status[i].ok() ? Download(r.images[i]) : std::vector<uint8_t>());
  }
  return h;
}

// Mixed batches (baseline 4:2:0/4:4:4, progressive, grayscale, truncated, garbage), distinct
// per batch so that a batch handed out of order is caught.
std::vector<std::vector<std::string>> MixedBatches(int batches) {
  std::vector<std::vector<std::string>> out(batches);
  for (int b = 0; b < batches; ++b)
    for (int i = 0; i < 20 + 3 * b; ++i) {
      const int w = 48 + 13 * ((i + b) % 9), h = 40 + 11 * ((i * 3 + b) % 7);
      auto rgb = testing::RandomRgb(w, h, 7000 + 100 * b + i);
      const int subsamp = i % 4 == 0 ? TJSAMP_444 : i % 9 == 5 ? TJSAMP_GRAY : TJSAMP_420;
      std::string f = Encode(rgb, w, h, subsamp, i % 11 == 6 ? TJFLAG_PROGRESSIVE : 0);
      if (i % 13 == 12) f = f.substr(0, f.size() / 2);  // truncated
      if (i % 17 == 16) f = std::string(300, '\x5a');   // not a JPEG
      out[b].push_back(std::move(f));
    }
  return out;
}

// Guards the decode lanes (Note [Decode lanes]): with lane threads and up to `lanes` batches in
// flight, every batch comes out in submission order, bit for bit the same images and the same
// statuses as the synchronous decoder's (and as the decoder that re-initializes its states for
// every batch, and the one with a hardware handle per lane), over more batches than lanes so
// that lanes and buffer sets are reused.
TEST(NvJpegDecoder, AsyncLanesMatchSynchronousBitwise) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const auto batches = MixedBatches(7);
  auto name_of = [](size_t i) { return "rec" + std::to_string(i); };
  auto run = [&](bool async, int lanes, bool reuse, int in_flight, bool own_handles = false,
                 float stagger = 1.f) {
    NvJpegDecoderOptions o;
    o.hw_ratio = 1.f;  // a fixed split: the measured one depends on timing
    o.async = async;
    o.lanes = lanes;
    o.reuse_state = reuse;
    o.hw_handle_per_lane = own_handles;
    o.stagger = stagger;
    auto dec = NvJpegBatchDecoder::Create(o);
    EXPECT_TRUE(dec.ok()) << dec.status();
    std::vector<HostBatch> got;
    if (!dec.ok()) return got;
    size_t next = 0;
    while (got.size() < batches.size()) {
      while (next < batches.size() && (*dec)->in_flight() < in_flight) {
        std::vector<std::string_view> v(batches[next].begin(), batches[next].end());
        EXPECT_TRUE((*dec)->Submit(std::move(v), name_of).ok());
        ++next;
      }
      NvJpegBatchDecoder::Result r;
      EXPECT_TRUE((*dec)->Collect(&r).ok());
      got.push_back(ToHost(r));
      EXPECT_TRUE((*dec)->ReleaseAfter(r.stream).ok());
    }
    auto info = (*dec)->info();
    EXPECT_EQ(info.async, async);
    EXPECT_EQ(info.lanes, lanes);
    EXPECT_EQ(info.batches, static_cast<int64_t>(batches.size()));
    // Re-initialized per batch size change only (batch sizes differ here: at most one per
    // batch and backend), or before every batch without reuse.
    std::printf("[nvjpeg] async=%d lanes=%d reuse=%d state_inits=%lld hw=%lld cuda=%lld\n", async,
                lanes, reuse, (long long)info.state_inits, (long long)info.images_hw,
                (long long)info.images_cuda);
    return got;
  };
  const auto want = run(false, 2, true, 1);
  ASSERT_EQ(want.size(), batches.size());
  for (size_t b = 0; b < want.size(); ++b) {
    ASSERT_EQ(want[b].codes.size(), batches[b].size());
    EXPECT_EQ(want[b].codes[12 % batches[b].size()], StatusCode::kDataLoss);  // truncated
  }
  struct Mode {
    bool async;
    int lanes;
    bool reuse;
    int in_flight;
    bool own_handles;
    float stagger;  // Note [Decode turns]
  };
  for (const Mode m : {Mode{true, 2, true, 2, false, 1.f}, Mode{true, 2, true, 2, false, 0.f},
                       Mode{true, 3, true, 3, false, 0.5f}, Mode{true, 3, true, 1, false, 1.f},
                       Mode{false, 2, false, 1, false, 1.f}, Mode{true, 2, true, 2, true, 1.f}}) {
    const auto got = run(m.async, m.lanes, m.reuse, m.in_flight, m.own_handles, m.stagger);
    ASSERT_EQ(got.size(), want.size());
    for (size_t b = 0; b < want.size(); ++b) {
      EXPECT_EQ(got[b].codes, want[b].codes) << "batch " << b << " async=" << m.async;
      ASSERT_EQ(got[b].images.size(), want[b].images.size());
      for (size_t i = 0; i < want[b].images.size(); ++i)
        EXPECT_TRUE(got[b].images[i] == want[b].images[i])
            << "batch " << b << " image " << i << " async=" << m.async << " lanes=" << m.lanes
            << " reuse=" << m.reuse << " stagger=" << m.stagger;
    }
  }
}

// Guards the lane contract and shutdown: more than `lanes` batches in flight is
// FailedPrecondition (not a hang), Drain() drops batches in flight and leaves the decoder
// usable, and destroying a decoder with batches in flight returns (its lane threads finish).
TEST(NvJpegDecoder, AsyncLaneLimitDrainAndShutdown) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const auto batches = MixedBatches(3);
  auto name_of = [](size_t i) { return std::to_string(i); };
  NvJpegDecoderOptions o;
  o.async = true;
  o.lanes = 2;
  o.hw_ratio = 1.f;
  o.timeout_ms = 20000;
  auto dec = NvJpegBatchDecoder::Create(o);
  ASSERT_TRUE(dec.ok()) << dec.status();
  std::vector<std::string_view> v0(batches[0].begin(), batches[0].end());
  std::vector<std::string_view> v1(batches[1].begin(), batches[1].end());
  std::vector<std::string_view> v2(batches[2].begin(), batches[2].end());
  ASSERT_TRUE((*dec)->Submit(v0, name_of).ok());
  ASSERT_TRUE((*dec)->Submit(v1, name_of).ok());
  EXPECT_EQ((*dec)->Submit(v2, name_of).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*dec)->in_flight(), 2);
  ASSERT_TRUE((*dec)->Drain().ok());
  EXPECT_EQ((*dec)->in_flight(), 0);
  NvJpegBatchDecoder::Result r;
  EXPECT_EQ((*dec)->Collect(&r).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*dec)->Submit(v2, name_of).ok());
  ASSERT_TRUE((*dec)->Collect(&r).ok());
  EXPECT_EQ(r.images.size(), batches[2].size());
  ASSERT_TRUE((*dec)->ReleaseAfter(r.stream).ok());
  ASSERT_TRUE((*dec)->Submit(v0, name_of).ok());
  ASSERT_TRUE((*dec)->Submit(v1, name_of).ok());
  dec->reset();  // two batches in flight: waits for them, joins the lanes
}

// Guards Note [Decode turns]: a batch that never calls nvJPEG (every image unreadable, so all
// go to the CPU path and fail) passes its turn on, so the batches after it decode instead of
// waiting for it until the timeout; the decoder counts every batch and times its nvJPEG calls;
// a stagger outside [0, 1] is refused.
TEST(NvJpegDecoder, TurnsArePassedOnAndStaggerIsChecked) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  NvJpegDecoderOptions bad;
  bad.stagger = 1.5f;
  EXPECT_EQ(NvJpegBatchDecoder::Create(bad).status().code(), StatusCode::kInvalidArgument);
  bad.stagger = -0.1f;
  EXPECT_EQ(NvJpegBatchDecoder::Create(bad).status().code(), StatusCode::kInvalidArgument);

  const auto good = MixedBatches(4);
  const std::vector<std::string> garbage = {"not a jpeg", std::string(64, '\xff'), "x"};
  auto name_of = [](size_t i) { return "rec" + std::to_string(i); };
  NvJpegDecoderOptions o;
  o.async = true;
  o.lanes = 2;
  o.hw_ratio = 1.f;
  o.timeout_ms = 5000;  // a turn never passed on would fail a Collect below with this deadline
  auto dec = NvJpegBatchDecoder::Create(o);
  ASSERT_TRUE(dec.ok()) << dec.status();
  const std::vector<const std::vector<std::string>*> order = {
      &good[0], &garbage, &good[1], &garbage, &garbage, &good[2], &good[3]};
  size_t next = 0, collected = 0;
  while (collected < order.size()) {
    while (next < order.size() && (*dec)->in_flight() < 2) {
      std::vector<std::string_view> v(order[next]->begin(), order[next]->end());
      ASSERT_TRUE((*dec)->Submit(std::move(v), name_of).ok());
      ++next;
    }
    NvJpegBatchDecoder::Result r;
    ASSERT_TRUE((*dec)->Collect(&r).ok()) << "batch " << collected;
    ASSERT_EQ(r.status.size(), order[collected]->size());
    if (order[collected] == &garbage) {
      for (const Status& s : r.status) EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    }
    ASSERT_TRUE((*dec)->ReleaseAfter(r.stream).ok());
    ++collected;
  }
  ASSERT_TRUE((*dec)->Drain().ok());
  const auto info = (*dec)->info();
  EXPECT_EQ(info.batches, static_cast<int64_t>(order.size()));
  EXPECT_FLOAT_EQ(info.stagger, 1.f);
  EXPECT_GT(info.call_ms, 0.0);
  std::printf(
      "[nvjpeg] turns: %lld batches, ms per batch: release %.3f prepare %.3f turn %.3f "
      "call %.3f\n",
      (long long)info.batches, info.release_wait_ms / info.batches, info.prepare_ms / info.batches,
      info.turn_wait_ms / info.batches, info.call_ms / info.batches);
}

}  // namespace
}  // namespace data
}  // namespace loongforge
