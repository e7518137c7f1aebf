// Tests of the nvJPEG batch decoder (GPU machine only: builds with nvJPEG, skips without a device).
#include <gtest/gtest.h>

#include "loongforge/cuda_check.h"

#if defined(LOONGFORGE_WITH_CUDA) && defined(LOONGFORGE_WITH_NVJPEG)
#include <cuda_runtime_api.h>
#include <turbojpeg.h>

#include <cmath>
#include <string>
#include <vector>

#include "image_ops.h"
#include "nvjpeg_decoder.h"
#include "test_dataset.h"

namespace loongforge {
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
  NvJpegDecoderOptions o;
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
      EXPECT_LT(sum / got.size(), 12.0) << "image " << i << " batch " << batch;
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

// Guards against device memory leaks: 100k decodes (100 batches of 1000 small images) must
// leave free device memory where it was after warm-up.
TEST(NvJpegDecoder, NoDeviceMemoryGrowthOver100kDecodes) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto dec = NvJpegBatchDecoder::Create(NvJpegDecoderOptions());
  ASSERT_TRUE(dec.ok()) << dec.status();
  std::vector<std::string> files;
  for (int i = 0; i < 1000; ++i) {
    int w = 64 + (i % 4) * 16, h = 48 + (i % 3) * 16;
    files.push_back(Encode(testing::RandomRgb(w, h, i), w, h, TJSAMP_420, 0));
  }
  std::vector<std::string_view> views(files.begin(), files.end());
  auto name_of = [](size_t i) { return std::to_string(i); };
  size_t free_warm = 0, free_end = 0, total = 0;
  std::vector<DecodedImage> out;
  std::vector<Status> st;
  for (int b = 0; b < 100; ++b) {
    ASSERT_TRUE((*dec)->Decode(views, name_of, &out, &st).ok());
    ASSERT_TRUE((*dec)->ReleaseAfter((*dec)->stream()).ok());
    if (b == 5 || b == 99) {
      ASSERT_EQ(cudaStreamSynchronize((*dec)->stream()), cudaSuccess);
      ASSERT_EQ(cudaMemGetInfo(b == 5 ? &free_warm : &free_end, &total), cudaSuccess);
    }
  }
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s;
  const double grew_mib = (double(free_warm) - double(free_end)) / (1 << 20);
  std::printf("[nvjpeg] free after warm-up %.1f MiB, after 100k decodes %.1f MiB\n",
              free_warm / 1048576.0, free_end / 1048576.0);
  EXPECT_LT(grew_mib, 8.0) << "device memory grew by " << grew_mib << " MiB";
}

}  // namespace
}  // namespace loongforge

#endif  // LOONGFORGE_WITH_CUDA && LOONGFORGE_WITH_NVJPEG
