// Tests of the GPU loader (device = kCuda) against the CPU loader. Option checks run everywhere;
// the rest needs CUDA + nvJPEG + a device and skips otherwise, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "loader_test_util.h"
#include "loongforge/loader.h"
#include "test_dataset.h"

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loongforge {
namespace data {
namespace {

class GpuLoaderTest : public testing::TestDbFixture {
 protected:
  static LoaderOptions Opts(const std::string& db, bool gpu) {
    LoaderOptions o = SmallLoaderOptions(db);
    o.dct_scaling = false;  // the GPU path decodes at full size: compare like with like
    if (gpu) o.device = LoaderDevice::kCuda;
    return o;
  }
  static bool Skip(std::string* why) { return !DataLoader::GpuSupport(0, why); }
};

// A batch copied to host memory (from either loader), images as float32 NCHW.
struct HostBatch {
  int64_t index = 0;
  int size = 0, rows = 0, tokens_len = 0, bucket = -1;
  std::vector<float> images, state, action;
  std::vector<int64_t> tokens, sample_index;
  std::vector<uint8_t> attention_mask, action_mask;
};

template <typename T>
std::vector<T> Fetch(const T* p, size_t n, bool device) {
  std::vector<T> v(n);
  if (n == 0) return v;
#ifdef LOONGFORGE_WITH_CUDA
  if (device) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
#endif
  std::memcpy(v.data(), p, n * sizeof(T));
  return v;
}

HostBatch ToHost(const Batch& b) {
  const bool dev = b.device_type == 2;
  HostBatch h{b.index, b.size, b.rows, b.tokens_len, b.token_bucket};
  const size_t n = b.rows, hw = static_cast<size_t>(b.height) * b.width;
  const size_t nimg = n * b.cameras;
  std::vector<float> raw;
  if (b.image_dtype == DType::kBFloat16) {
    auto bits = Fetch(reinterpret_cast<const uint16_t*>(b.images), nimg * 3 * hw, dev);
    raw.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) raw[i] = Bf16ToFloat(bits[i]);
  } else {
    raw = Fetch(b.images, nimg * 3 * hw, dev);
  }
  h.images.resize(raw.size());
  for (size_t im = 0; im < nimg; ++im)
    for (int c = 0; c < 3; ++c)
      for (size_t p = 0; p < hw; ++p)
        h.images[(im * 3 + c) * hw + p] = b.image_layout == ImageLayout::kNHWC
                                              ? raw[(im * hw + p) * 3 + c]
                                              : raw[(im * 3 + c) * hw + p];
  h.tokens = Fetch(b.tokens, n * b.tokens_len, dev);
  h.attention_mask = Fetch(b.attention_mask, n * b.tokens_len, dev);
  h.state = Fetch(b.state, n * b.state_dim, dev);
  h.action = Fetch(b.action, n * b.horizon * b.action_dim, dev);
  h.action_mask = Fetch(b.action_mask, n * b.horizon, dev);
  h.sample_index = Fetch(b.sample_index, n, dev);
  return h;
}

std::vector<HostBatch> RunEpoch(DataLoader& dl, int64_t ep, Status* err = nullptr) {
  std::vector<HostBatch> out;
  ForEachBatch(dl, ep, 0, err, [&](const Batch& b) { out.push_back(ToHost(b)); });
  return out;
}

// Compares everything but images exactly; images within `mean_tol` mean / `max_tol` max.
void ExpectSameBatches(const std::vector<HostBatch>& a, const std::vector<HostBatch>& b,
                       double mean_tol, double max_tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].sample_index, b[k].sample_index) << what << " batch " << k;
    EXPECT_EQ(a[k].size, b[k].size) << what;
    EXPECT_EQ(a[k].rows, b[k].rows) << what;
    EXPECT_EQ(a[k].bucket, b[k].bucket) << what;
    EXPECT_EQ(a[k].tokens, b[k].tokens) << what;
    EXPECT_EQ(a[k].attention_mask, b[k].attention_mask) << what;
    EXPECT_EQ(a[k].state, b[k].state) << what;
    EXPECT_EQ(a[k].action, b[k].action) << what;
    EXPECT_EQ(a[k].action_mask, b[k].action_mask) << what;
    ASSERT_EQ(a[k].images.size(), b[k].images.size()) << what;
    double sum = 0, worst = 0;
    for (size_t i = 0; i < a[k].images.size(); ++i) {
      double d = std::fabs(a[k].images[i] - b[k].images[i]);
      sum += d;
      worst = std::max(worst, d);
    }
    const double mean = a[k].images.empty() ? 0 : sum / a[k].images.size();
    EXPECT_LT(mean, mean_tol) << what << " batch " << k;
    EXPECT_LT(worst, max_tol) << what << " batch " << k;
  }
}

// Guards the option contract on every build: GPU-only options on the CPU loader and image dtypes
// other than f32/bf16 are InvalidArgument, and device=cuda without CUDA/nvJPEG/device is
// Unavailable with the reason.
TEST_F(GpuLoaderTest, OptionsAndAvailability) {
  std::string db = Db({});
  LoaderOptions o = Opts(db, false);
  o.layout = ImageLayout::kNHWC;
  EXPECT_EQ(DataLoader::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = Opts(db, false);
  o.dtype = DType::kBFloat16;
  EXPECT_EQ(DataLoader::Create(o).status().code(), StatusCode::kInvalidArgument);
  // An image dtype the loader does not write is refused on any device, naming the option.
  for (bool gpu : {false, true}) {
    o = Opts(db, gpu);
    o.dtype = DType::kInt64;
    auto bad = DataLoader::Create(o);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
    EXPECT_NE(bad.status().message().find("option 'dtype'"), std::string::npos) << bad.status();
  }
  std::string why;
  const bool supported = DataLoader::GpuSupport(0, &why);
  EXPECT_FALSE(why.empty());
  auto dl = DataLoader::Create(Opts(db, true));
  if (supported) {
    ASSERT_TRUE(dl.ok()) << dl.status();
    EXPECT_TRUE((*dl)->device_info().gpu);
    EXPECT_FALSE((*dl)->device_info().reason.empty());
  } else {
    EXPECT_EQ(dl.status().code(), StatusCode::kUnavailable) << dl.status();
    EXPECT_NE(dl.status().message().find(why), std::string::npos) << dl.status();
  }
  auto cpu = DataLoader::Create(Opts(db, false));
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE((*cpu)->device_info().gpu);
  EXPECT_EQ((*cpu)->device_info().decode_backend, "libjpeg-turbo");
}

// Guards GPU/CPU equivalence: same samples, same order, same stage-3 arrays bit for bit, and
// images equal up to the decoders' IDCT/upsampling differences, with and without jitter.
TEST_F(GpuLoaderTest, MatchesCpuLoader) {
  std::string why;
  if (Skip(&why)) GTEST_SKIP() << why;
  std::string db = Db({});
  for (bool jitter : {false, true}) {
    LoaderOptions oc = Opts(db, false), og = Opts(db, true);
    oc.color_jitter = og.color_jitter = jitter;
    auto cpu = DataLoader::Create(oc);
    auto gpu = DataLoader::Create(og);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
    auto a = RunEpoch(**cpu, 3), b = RunEpoch(**gpu, 3);
    // Normalized units (std 0.5): 0.04 is ~5 grey levels on average.
    ExpectSameBatches(a, b, 0.04, 0.8, jitter ? "jitter" : "plain");
    auto info = (*gpu)->device_info();
    std::printf("[gpu loader] backend=%s hw_decode=%d reason=%s hw=%lld cuda=%lld cpu=%lld\n",
                info.decode_backend.c_str(), info.hw_decode, info.reason.c_str(),
                (long long)info.images_hw, (long long)info.images_cuda, (long long)info.images_cpu);
  }
}

// Guards the bf16 / NHWC outputs: the same pixels as float32 NCHW, to bf16 precision.
TEST_F(GpuLoaderTest, Bf16NhwcEqualsFloatNchw) {
  std::string why;
  if (Skip(&why)) GTEST_SKIP() << why;
  std::string db = Db({});
  LoaderOptions o = Opts(db, true);
  auto f32 = DataLoader::Create(o);
  o.layout = ImageLayout::kNHWC;
  o.dtype = DType::kBFloat16;
  auto bf = DataLoader::Create(o);
  ASSERT_TRUE(f32.ok() && bf.ok()) << bf.status();
  // bf16 keeps 8 significant bits: spacing 2^-6 = 0.0156 for |x| in [2, 4), and normalized
  // values reach about 2.6 here, so one rounding step can be 0.0156 plus fp32 noise (measured
  // worst 0.018 on an H200).
  ExpectSameBatches(RunEpoch(**f32, 1), RunEpoch(**bf, 1), 4e-3, 2.5e-2, "bf16/nhwc");
}

// Guards the corrupt policy on the GPU: the same samples are skipped and counted as on the CPU,
// and under `error` the loader stops with DataLoss naming the record.
TEST_F(GpuLoaderTest, CorruptPolicySameAsCpu) {
  std::string why;
  if (Skip(&why)) GTEST_SKIP() << why;
  testing::TestDbOptions to;
  to.corrupt_jpeg = {3};
  to.truncated_jpeg = {11, 12};
  to.truncated_state = {17};
  to.missing_tokens = {22};
  std::string db = Db(to);
  auto cpu = DataLoader::Create(Opts(db, false));
  auto gpu = DataLoader::Create(Opts(db, true));
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  auto a = RunEpoch(**cpu, 0), b = RunEpoch(**gpu, 0);
  ExpectSameBatches(a, b, 0.04, 0.8, "corrupt");
  EXPECT_EQ((*gpu)->corrupt_skipped(), 5);
  EXPECT_EQ((*gpu)->corrupt_skipped(), (*cpu)->corrupt_skipped());
  LoaderOptions o = Opts(db, true);
  o.on_corrupt = CorruptPolicy::kError;
  o.shuffle = false;
  auto strict = DataLoader::Create(o);
  ASSERT_TRUE(strict.ok());
  Status err;
  auto got = RunEpoch(**strict, 0, &err);
  EXPECT_EQ(err.code(), StatusCode::kDataLoss) << err;
  EXPECT_NE(err.message().find("00000003_cam_cam"), std::string::npos) << err;
  EXPECT_EQ(got.size(), 0u);  // sample 3 is in batch 0
}

// Guards device stage 3 and static batches on the GPU: token buckets, padding rows of skipped
// samples (zero images too) and masks equal the CPU loader's, with the stage-3 kernel and with
// the host twin (stage3_on_device = false), and the two GPU variants agree bit
// for bit on everything but decode noise.
TEST_F(GpuLoaderTest, StaticBucketsDeviceCollateMatchCpu) {
  std::string why;
  if (Skip(&why)) GTEST_SKIP() << why;
  testing::TestDbOptions to;
  to.corrupt_jpeg = {3};
  to.truncated_state = {17};
  std::string db = Db(to);
  LoaderOptions oc = Opts(db, false), og = Opts(db, true);
  oc.token_buckets = og.token_buckets = {3, 6, 8};
  auto cpu = DataLoader::Create(oc);
  auto gpu = DataLoader::Create(og);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  EXPECT_TRUE((*gpu)->device_info().stage3_on_device);
  auto a = RunEpoch(**cpu, 2), b = RunEpoch(**gpu, 2);
  ExpectSameBatches(a, b, 0.04, 0.8, "static buckets");
  int padded = 0;
  for (const HostBatch& h : b) {
    EXPECT_EQ(h.rows, 4);
    padded += h.rows - h.size;
  }
  EXPECT_EQ(padded, 2);  // samples 3 and 17
  LoaderOptions oh = og;
  oh.stage3_on_device = false;
  auto host3 = DataLoader::Create(oh);
  ASSERT_TRUE(host3.ok()) << host3.status();
  EXPECT_FALSE((*host3)->device_info().stage3_on_device);
  ExpectSameBatches(b, RunEpoch(**host3, 2), 0.04, 0.8, "host stage 3");
  // Dynamic shapes through the kernel too (batch max, compacted rows).
  oc.token_buckets.clear();
  og.token_buckets.clear();
  auto cpu2 = DataLoader::Create(oc);
  auto gpu2 = DataLoader::Create(og);
  ASSERT_TRUE(cpu2.ok() && gpu2.ok());
  ExpectSameBatches(RunEpoch(**cpu2, 1), RunEpoch(**gpu2, 1), 0.04, 0.8, "dynamic");
}

// Exact equality of two runs (images bit for bit too).
void ExpectIdenticalBatches(const std::vector<HostBatch>& a, const std::vector<HostBatch>& b,
                            const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].index, b[k].index) << what << " batch " << k;
    EXPECT_EQ(a[k].sample_index, b[k].sample_index) << what << " batch " << k;
    EXPECT_EQ(a[k].size, b[k].size) << what;
    EXPECT_EQ(a[k].tokens, b[k].tokens) << what;
    EXPECT_EQ(a[k].state, b[k].state) << what;
    EXPECT_EQ(a[k].action, b[k].action) << what;
    EXPECT_TRUE(a[k].images == b[k].images) << what << " batch " << k << ": images differ";
  }
}

// Guards the asynchronous decode (Note [Decode lanes]): with lane threads and 2 or 3 batches in
// flight the loader hands out, over two epochs (continuation included) and with corrupt images
// taking the CPU path on the lanes, exactly the batches of the one-batch-at-a-time path
// (async_decode = false) and of the per-batch re-initializing decoder, in sampler order, images
// bit for bit (also with concurrent or staggered lanes, Note [Decode turns], and with madvise
// prefaulting); with interleaved nvJPEG output, the same up to decode noise. Bad tuning values
// are InvalidArgument naming the option.
TEST_F(GpuLoaderTest, AsyncDecodeSameBatchesAsSyncBitwise) {
  std::string why;
  if (Skip(&why)) GTEST_SKIP() << why;
  testing::TestDbOptions to;
  to.samples = 48;
  to.corrupt_jpeg = {5};
  to.truncated_jpeg = {20};
  std::string db = Db(to);
  LoaderOptions o = Opts(db, true);
  o.hw_decode_ratio = 1.f;  // a fixed split: the measured one depends on timing
  o.color_jitter = true;
  // Runs two epochs with the options `tune` sets.
  auto run = [&](auto tune) {
    LoaderOptions t = o;
    tune(t);
    auto dl = DataLoader::Create(t);
    EXPECT_TRUE(dl.ok()) << dl.status();
    std::vector<HostBatch> all;
    if (!dl.ok()) return all;
    for (int ep = 4; ep < 6; ++ep) {
      auto e = RunEpoch(**dl, ep);
      all.insert(all.end(), e.begin(), e.end());
    }
    EXPECT_EQ((*dl)->corrupt_skipped(), 4);
    return all;
  };
  const auto sync = run([](LoaderOptions& t) { t.async_decode = false; });
  ASSERT_EQ(sync.size(), 2u * 48 / 4);
  ExpectIdenticalBatches(sync, run([](LoaderOptions&) {}), "async, 2 lanes");
  ExpectIdenticalBatches(sync, run([](LoaderOptions& t) { t.decode_lanes = 3; }), "async, 3 lanes");
  ExpectIdenticalBatches(sync, run([](LoaderOptions& t) {
                           t.async_decode = false;
                           t.decode_reuse = false;
                         }),
                         "re-init per batch");
  // Note [Decode turns]: concurrent and staggered lanes, and pages mapped by madvise.
  for (float stagger : {0.f, 0.5f})
    ExpectIdenticalBatches(sync, run([stagger](LoaderOptions& t) { t.decode_stagger = stagger; }),
                           "stagger");
  ExpectIdenticalBatches(sync, run([](LoaderOptions& t) { t.prefault = PrefaultMode::kPopulate; }),
                         "prefault=populate");
  // Interleaved nvJPEG output (RGBI): the same batches up to the decoder's colour conversion.
  const auto rgbi = run([](LoaderOptions& t) { t.decode_interleaved = true; });
  ExpectSameBatches(sync, rgbi, 0.04, 0.8, "interleaved output");
}

#ifdef LOONGFORGE_WITH_CUDA
// Guards device memory: slots and decode buffers are reused, so free device memory stays flat
// over epochs and over stopped-and-restarted epochs.
TEST_F(GpuLoaderTest, DeviceMemoryFlatAcrossEpochs) {
  std::string why;
  if (Skip(&why)) GTEST_SKIP() << why;
  testing::TestDbOptions to;
  to.samples = 64;
  std::string db = Db(to);
  LoaderOptions o = Opts(db, true);
  o.batch_size = 8;
  auto dl = DataLoader::Create(o);
  ASSERT_TRUE(dl.ok());
  size_t free_warm = 0, free_end = 0, total = 0;
  for (int ep = 0; ep < 12; ++ep) {
    RunEpoch(**dl, ep);
    if (ep == 1) {
      ASSERT_EQ(cudaMemGetInfo(&free_warm, &total), cudaSuccess);
    }
  }
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*dl)->Start(i, 0).ok());
    ASSERT_TRUE((*dl)->Next().ok());
    (*dl)->Stop();
  }
  RunEpoch(**dl, 20);
  ASSERT_EQ(cudaMemGetInfo(&free_end, &total), cudaSuccess);
  const double grew = (double(free_warm) - double(free_end)) / (1 << 20);
  EXPECT_LT(grew, 8.0) << "device memory grew by " << grew << " MiB";
}
#endif

}  // namespace
}  // namespace data
}  // namespace loongforge
