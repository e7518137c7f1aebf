// Tests of the CPU loader: sampler, image kernels against their references, pipeline order,
// resume, batch contents and the corrupt-data policies.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "image_ops.h"
#include "loader_test_util.h"
#include "loongforge/loader.h"
#include "test_dataset.h"

namespace loongforge {
namespace data {
namespace {

using internal::CropBox;
using internal::Jitter;
using internal::NormalizeParams;
using internal::RgbImage;

// Guards the sampler contract: same inputs -> same order; different epochs -> different orders.
TEST(Sampler, DeterministicPerEpoch) {
  SamplerOptions o;
  o.num_samples = 1000;
  o.batch_size = 8;
  o.seed = 42;
  auto a = Sampler::Create(o), b = Sampler::Create(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->EpochOrder(3), b->EpochOrder(3));
  EXPECT_NE(a->EpochOrder(3), a->EpochOrder(4));
  o.seed = 43;
  auto c = Sampler::Create(o);
  EXPECT_NE(a->EpochOrder(3), c->EpochOrder(3));
}

// Guards distributed training: every rank must run the same number of batches, or collectives hang.
TEST(Sampler, EqualBatchCountsForWorldSizes1To8) {
  for (int64_t n : {97, 100, 257, 1000}) {
    for (int world = 1; world <= 8; ++world) {
      for (bool drop : {true, false}) {
        std::set<int64_t> seen;
        int64_t batches = -1;
        for (int r = 0; r < world; ++r) {
          SamplerOptions o{n, 4, 7, r, world, true, drop};
          auto s = Sampler::Create(o);
          ASSERT_TRUE(s.ok()) << s.status();
          if (batches < 0) batches = s->batches_per_epoch();
          EXPECT_EQ(s->batches_per_epoch(), batches) << "n=" << n << " world=" << world;
          for (int64_t b = 0; b < s->batches_per_epoch(); ++b)
            for (int64_t i : s->Batch(0, b)) {
              ASSERT_GE(i, 0);
              ASSERT_LT(i, n);
              if (drop)
                EXPECT_TRUE(seen.insert(i).second) << "sample on two ranks: " << i;
              else
                seen.insert(i);
            }
        }
        if (!drop) EXPECT_EQ(static_cast<int64_t>(seen.size()), n);  // nothing left out
      }
    }
  }
}

TEST(Sampler, RejectsBadArguments) {
  EXPECT_FALSE(Sampler::Create({0, 4, 0, 0, 1, true, true}).ok());
  EXPECT_FALSE(Sampler::Create({10, 4, 0, 2, 2, true, true}).ok());
  EXPECT_FALSE(Sampler::Create({3, 4, 0, 0, 1, true, true}).ok());  // no full batch
}

RgbImage MakeRgb(int w, int h, uint64_t seed) {
  RgbImage im;
  im.pixels = testing::RandomRgb(w, h, seed);
  im.width = w;
  im.height = h;
  return im;
}

// Guards the fused kernel: it must equal the plain double-precision definition on random inputs.
TEST(ImageOps, FusedMatchesReference) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  for (int trial = 0; trial < 12; ++trial) {
    int w = 40 + trial * 23, h = 30 + trial * 17;
    RgbImage im = MakeRgb(w, h, trial);
    CropBox box;
    box.w = w * (0.5f + 0.5f * u(rng));
    box.h = h * (0.5f + 0.5f * u(rng));
    box.x0 = std::floor((w - box.w) * u(rng));
    box.y0 = std::floor((h - box.h) * u(rng));
    int ow = 16 + trial * 9, oh = 12 + trial * 11;  // both up- and down-scaling
    Jitter j;
    j.enabled = trial % 2;
    j.brightness = 0.7f + 0.6f * u(rng);
    j.contrast = 0.6f + 0.8f * u(rng);
    j.saturation = 0.5f + u(rng);
    float gray = internal::MeanGray(im, box, 2);
    NormalizeParams np{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
    std::vector<float> a(3 * ow * oh), b(3 * ow * oh);
    internal::CropResizeNormalize(im, box, ow, oh, j, gray, np, a.data());
    internal::CropResizeNormalizeReference(im, box, ow, oh, j, gray, np, b.data());
    double max_err = 0;
    for (size_t i = 0; i < a.size(); ++i)
      max_err = std::max<double>(max_err, std::fabs(a[i] - b[i]));
    // float32 vs double arithmetic on 0..255 values, scaled by 1/(255*0.224): ~1e-4 worst case.
    EXPECT_LT(max_err, 2e-3) << "trial " << trial;
  }
}

// Guards DCT-domain scaling: decoding at reduced size and resizing must stay close to decoding
// at full size and resizing with an area filter (what it approximates).
TEST(ImageOps, DctScaledDecodeCloseToFullDecode) {
  internal::JpegDecoder dec;
  for (int trial = 0; trial < 4; ++trial) {
    const int w = 640, h = 480, out = 224;
    std::string jpg = testing::EncodeJpeg(testing::RandomRgb(w, h, 100 + trial), w, h, 90);
    RgbImage scaled, full;
    ASSERT_TRUE(dec.Decode(jpg, 236, 236, &scaled, "t").ok());
    EXPECT_EQ(scaled.scale_denom / scaled.scale_num, 2);  // 640x480 -> 320x240 for a 224 output
    ASSERT_TRUE(dec.Decode(jpg, 0, 0, &full, "t").ok());
    EXPECT_EQ(full.width, w);
    NormalizeParams np;
    std::vector<float> a(3 * out * out), b(3 * out * out);
    CropBox sb{0, 0, static_cast<float>(scaled.width), static_cast<float>(scaled.height)};
    internal::CropResizeNormalize(scaled, sb, out, out, {}, 0, np, a.data());
    // Reference: 2x2 box-average the full decode, then the same bilinear resize.
    RgbImage half;
    half.width = w / 2;
    half.height = h / 2;
    half.pixels.resize(half.width * half.height * 3);
    for (int y = 0; y < half.height; ++y)
      for (int x = 0; x < half.width; ++x)
        for (int c = 0; c < 3; ++c) {
          int s = 0;
          for (int dy = 0; dy < 2; ++dy)
            for (int dx = 0; dx < 2; ++dx)
              s += full.pixels[((2 * y + dy) * w + 2 * x + dx) * 3 + c];
          half.pixels[(y * half.width + x) * 3 + c] = static_cast<uint8_t>((s + 2) / 4);
        }
    internal::CropResizeNormalize(half, sb, out, out, {}, 0, np, b.data());
    double mae = 0;
    for (size_t i = 0; i < a.size(); ++i) mae += std::fabs(a[i] - b[i]);
    mae /= a.size();
    EXPECT_LT(mae, 0.03) << "mean abs error in normalized units (1/255 = 0.0078)";
  }
}

TEST(ImageOps, RejectsNonJpegAndTruncated) {
  internal::JpegDecoder dec;
  RgbImage im;
  Status s = dec.Decode("this is not a jpeg", 0, 0, &im, "rec_7");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("rec_7"), std::string::npos);
  std::string jpg = testing::EncodeJpeg(testing::RandomRgb(64, 48, 3), 64, 48);
  std::string good = jpg;
  jpg.resize(jpg.size() * 2 / 3);
  EXPECT_EQ(dec.Decode(jpg, 0, 0, &im, "rec_8").code(), StatusCode::kDataLoss);
  // A decoder that failed must still decode the next good image (libjpeg-turbo keeps stale state).
  EXPECT_TRUE(dec.Decode(good, 0, 0, &im, "rec_9").ok());
}

class LoaderTest : public testing::TestDbFixture {
 protected:
  // SmallLoaderOptions in sampler order (no shuffle): batch b holds samples 4b .. 4b + 3.
  static LoaderOptions InOrder(const std::string& db) {
    LoaderOptions o = SmallLoaderOptions(db);
    o.shuffle = false;
    return o;
  }
  // Runs one epoch from `start`, returning sample indices per batch and a checksum of images.
  static std::vector<std::vector<int64_t>> Epoch(DataLoader& dl, int64_t ep, int64_t start,
                                                 double* img_sum = nullptr, Status* err = nullptr) {
    std::vector<std::vector<int64_t>> out;
    ForEachBatch(dl, ep, start, err, [&](const Batch& x) {
      out.emplace_back(x.sample_index, x.sample_index + x.size);
      if (img_sum) {
        size_t n = static_cast<size_t>(x.size) * x.cameras * 3 * x.height * x.width;
        for (size_t i = 0; i < n; ++i) *img_sum += x.images[i] * static_cast<double>(i % 97 + 1);
      }
    });
    return out;
  }
};

// Guards ordering: batches and their pixels do not depend on the number of decode threads.
TEST_F(LoaderTest, OutputIndependentOfThreadCount) {
  std::string db = Db({});
  double sums[2] = {0, 0};
  std::vector<std::vector<int64_t>> orders[2];
  for (int t = 0; t < 2; ++t) {
    LoaderOptions o = SmallLoaderOptions(db);
    o.threads = t == 0 ? 1 : 3;
    o.color_jitter = true;
    auto dl = DataLoader::Create(o);
    ASSERT_TRUE(dl.ok()) << dl.status();
    orders[t] = Epoch(**dl, 1, 0, &sums[t]);
  }
  EXPECT_EQ(orders[0].size(), 10u);
  EXPECT_EQ(orders[0], orders[1]);
  EXPECT_DOUBLE_EQ(sums[0], sums[1]);
}

// Guards resume: starting at batch k yields exactly the tail of the full epoch.
TEST_F(LoaderTest, MidEpochResumeYieldsRemainingSequence) {
  std::string db = Db({});
  auto dl = DataLoader::Create(SmallLoaderOptions(db));
  ASSERT_TRUE(dl.ok());
  auto full = Epoch(**dl, 2, 0);
  // Consume 3 batches, record the position, and resume in a fresh loader.
  ASSERT_TRUE((*dl)->Start(2, 0).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*dl)->Next().ok());
  EXPECT_EQ((*dl)->next_batch(), 3);
  auto dl2 = DataLoader::Create(SmallLoaderOptions(db));
  auto tail = Epoch(**dl2, 2, (*dl)->next_batch());
  ASSERT_EQ(tail.size(), full.size() - 3);
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], full[i + 3]);
}

// Guards epoch continuation: a loader that runs epochs back to back (keeping its pipeline across
// the boundary) yields exactly what fresh loaders yield for each epoch.
TEST_F(LoaderTest, BackToBackEpochsMatchFreshStarts) {
  std::string db = Db({});
  auto dl = DataLoader::Create(SmallLoaderOptions(db));
  ASSERT_TRUE(dl.ok());
  for (int ep = 0; ep < 3; ++ep) {
    double a = 0, b = 0;
    auto kept = Epoch(**dl, ep, 0, &a);
    auto fresh_dl = DataLoader::Create(SmallLoaderOptions(db));
    ASSERT_TRUE(fresh_dl.ok());
    auto fresh = Epoch(**fresh_dl, ep, 0, &b);
    EXPECT_EQ(kept, fresh) << "epoch " << ep;
    EXPECT_DOUBLE_EQ(a, b) << "epoch " << ep;
  }
  // Jumping elsewhere restarts the pipeline at the requested position.
  auto tail = Epoch(**dl, 7, 4);
  auto fresh_dl = DataLoader::Create(SmallLoaderOptions(db));
  auto full = Epoch(**fresh_dl, 7, 0);
  ASSERT_EQ(tail.size() + 4, full.size());
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], full[i + 4]);
}

// Guards stage 3: padding, masks, normalization and action masks carry the records' values.
TEST_F(LoaderTest, BatchContents) {
  testing::TestDbOptions to;
  std::string db = Db(to);
  LoaderOptions o = InOrder(db);
  auto dl = DataLoader::Create(o);
  ASSERT_TRUE(dl.ok());
  ASSERT_TRUE((*dl)->Start(0).ok());
  auto b = (*dl)->Next();
  ASSERT_TRUE(b.ok());
  const Batch& x = **b;
  ASSERT_EQ(x.size, 4);
  EXPECT_EQ(x.tokens_len, 5);  // samples 0..3 have 2..5 tokens
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(x.sample_index[i], i);
    for (int t = 0; t < x.tokens_len; ++t) {
      bool valid = t < i + 2;
      EXPECT_EQ(x.attention_mask[i * x.tokens_len + t], valid);
      EXPECT_EQ(x.tokens[i * x.tokens_len + t], valid ? 3 + i + t : 0);
    }
    for (int d = 0; d < to.state_dim; ++d)
      EXPECT_FLOAT_EQ(x.state[i * to.state_dim + d], (i + d - 1.f) / 2.f);
    EXPECT_FLOAT_EQ(x.action[i * to.horizon * to.action_dim + 5], i * 0.5f + 5);
    EXPECT_EQ(x.action_mask[i * to.horizon + to.horizon - 1], i % 2);
  }
  // Images are normalized to about [-1, 1] with mean/std 0.5 and are not constant.
  float lo = 1e9, hi = -1e9;
  for (int k = 0; k < 4 * 2 * 3 * 32 * 32; ++k)
    lo = std::min(lo, x.images[k]), hi = std::max(hi, x.images[k]);
  EXPECT_GE(lo, -1.0001f);
  EXPECT_LE(hi, 1.0001f);
  EXPECT_LT(lo, -0.3f);
  EXPECT_GT(hi, 0.3f);
}

// Guards the skip policy: every kind of bad record is counted and dropped; the rest arrives.
TEST_F(LoaderTest, SkipPolicyDropsAndCountsBadRecords) {
  testing::TestDbOptions to;
  to.corrupt_jpeg = {3};
  to.truncated_jpeg = {11};
  to.truncated_state = {17};
  to.missing_tokens = {22};
  std::string db = Db(to);
  LoaderOptions o = SmallLoaderOptions(db);
  auto dl = DataLoader::Create(o);
  ASSERT_TRUE(dl.ok());
  auto batches = Epoch(**dl, 0, 0);
  std::set<int64_t> seen;
  for (auto& b : batches) seen.insert(b.begin(), b.end());
  EXPECT_EQ(seen.size(), 36u);
  for (int64_t bad : {3, 11, 17, 22}) EXPECT_FALSE(seen.count(bad)) << bad;
  EXPECT_EQ((*dl)->corrupt_skipped(), 4);
}

// Guards the API bounds: threads far past any machine (100000 ended in std::terminate when the
// threads could not start), a zero or negative timeout, a negative corrupt limit and an absurd
// prefetch are InvalidArgument naming the option and the value.
TEST_F(LoaderTest, OptionBounds) {
  std::string db = Db(testing::TestDbOptions{});
  struct Case {
    void (*set)(LoaderOptions&);
    const char* text;
  };
  const Case cases[] = {
      {[](LoaderOptions& o) { o.threads = 100000; }, "'threads' must be in 1..256"},
      {[](LoaderOptions& o) { o.threads = 0; }, "'threads' must be in 1..256"},
      {[](LoaderOptions& o) { o.timeout_ms = 0; }, "'timeout_ms' must be > 0"},
      {[](LoaderOptions& o) { o.timeout_ms = -1000; }, "got -1000"},
      {[](LoaderOptions& o) { o.prefetch = 1 << 20; }, "'prefetch' must be in 1..1024"},
      {[](LoaderOptions& o) { o.max_consecutive_corrupt = -1; }, "max_consecutive_corrupt"},
      {[](LoaderOptions& o) {
         o.image_size = {0, 32};
       },
       "'image_size' must be (height, width)"},
      {[](LoaderOptions& o) {
         o.image_size = {32, -4};
       },
       "got (32, -4)"},
      {[](LoaderOptions& o) {
         o.image_size = {4097, 32};
       },
       "each in 1..4096"},
  };
  for (const Case& c : cases) {
    LoaderOptions o = SmallLoaderOptions(db);
    c.set(o);
    auto dl = DataLoader::Create(o);
    EXPECT_EQ(dl.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(dl.status().message().find(c.text), std::string::npos) << dl.status();
  }
}

// Guards map-style access (Note [Sample access]): GetSample(i, epoch) is bit for bit the row of
// sample i in that epoch's batches (random crops and jitter on), in any order of calls; an index
// past the end is OutOfRange naming it and the length.
TEST_F(LoaderTest, GetSampleEqualsBatchRow) {
  std::string db = Db({});
  LoaderOptions o = SmallLoaderOptions(db);
  o.color_jitter = true;
  o.token_pad = 64;
  auto dl = DataLoader::Create(o);
  ASSERT_TRUE(dl.ok()) << dl.status();
  const size_t img = static_cast<size_t>(2) * 3 * 32 * 32;  // TestDb: 2 cameras
  int rows = 0;
  for (int64_t ep : {0, 2})
    ForEachBatch(**dl, ep, 0, nullptr, [&](const Batch& b) {
      ASSERT_EQ(b.cameras, 2);
      for (int r = 0; r < b.size; ++r) {
        auto s = (*dl)->GetSample(b.sample_index[r], ep);
        ASSERT_TRUE(s.ok()) << s.status();
        const Batch& x = **s;
        ASSERT_EQ(x.size, 1);
        ASSERT_EQ(x.tokens_len, b.tokens_len);
        EXPECT_EQ(x.sample_index[0], b.sample_index[r]);
        EXPECT_EQ(std::memcmp(x.images, b.images + r * img, img * sizeof(float)), 0)
            << "sample " << b.sample_index[r] << " epoch " << ep;
        EXPECT_EQ(std::memcmp(x.tokens, b.tokens + r * b.tokens_len, 8 * b.tokens_len), 0);
        EXPECT_EQ(std::memcmp(x.state, b.state + r * b.state_dim, 4 * b.state_dim), 0);
        ++rows;
      }
    });
  EXPECT_EQ(rows, 80);
  const int64_t n = (*dl)->schema().num_samples;
  auto past = (*dl)->GetSample(n);
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("sample " + std::to_string(n) +
                                         " is out of range for a dataset of " + std::to_string(n) +
                                         " samples"),
            std::string::npos)
      << past.status();
  EXPECT_EQ((*dl)->GetSample(-1).status().code(), StatusCode::kOutOfRange);
}

// Guards non-square uint8 output: [rows, cams, 3, H, W] bytes that are the float path's pixels
// ((x / 255 - 0.5) / 0.5) rounded, from the same decode, crop and resize.
TEST_F(LoaderTest, Uint8NonSquareIsTheFloatPathsPixels) {
  std::string db = Db({});
  LoaderOptions o = InOrder(db);
  o.image_size = {20, 36};
  auto fl = DataLoader::Create(o);
  o.dtype = DType::kUInt8;
  auto u8 = DataLoader::Create(o);
  ASSERT_TRUE(fl.ok() && u8.ok()) << fl.status() << u8.status();
  ASSERT_TRUE((*fl)->Start(0).ok() && (*u8)->Start(0).ok());
  auto a = (*fl)->Next();
  auto b = (*u8)->Next();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*b)->height, 20);
  EXPECT_EQ((*b)->width, 36);
  EXPECT_EQ((*b)->image_dtype, DType::kUInt8);
  const auto* px = reinterpret_cast<const uint8_t*>((*b)->images);
  const size_t n = static_cast<size_t>((*b)->rows) * (*b)->cameras * 3 * 20 * 36;
  int off = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = ((*a)->images[i] * 0.5f + 0.5f) * 255.f;
    off += std::fabs(v - px[i]) > 0.51f;
  }
  EXPECT_EQ(off, 0);
  EXPECT_EQ((*b)->Tensors()[0].second.dtype, DType::kUInt8);
}

// Guards the UBSan finding: an empty instruction (0-byte tokens record, whose view may carry no
// data pointer) is delivered as a row of no tokens, without a memcpy from it.
TEST_F(LoaderTest, EmptyInstructionRow) {
  testing::TestDbOptions to;
  to.empty_tokens = {2};
  std::string db = Db(to);
  auto dl = DataLoader::Create(InOrder(db));
  ASSERT_TRUE(dl.ok()) << dl.status();
  ASSERT_TRUE((*dl)->Start(0).ok());
  auto b = (*dl)->Next();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*b)->size, 4);
  const Batch& x = **b;
  EXPECT_EQ(x.sample_index[2], 2);
  for (int t = 0; t < x.tokens_len; ++t) {
    EXPECT_EQ(x.attention_mask[2 * x.tokens_len + t], 0) << t;
    EXPECT_EQ(x.tokens[2 * x.tokens_len + t], 0) << t;
  }
  EXPECT_EQ(x.attention_mask[3 * x.tokens_len], 1);
}

// Guards the error policy: the first bad record stops the loader with a Status naming its key.
TEST_F(LoaderTest, ErrorPolicyNamesTheRecord) {
  using Defect = std::set<int64_t> testing::TestDbOptions::*;
  struct Case {
    Defect defect;  // the field of TestDbOptions that breaks `sample`
    int64_t sample;
    StatusCode code;
    const char* key;
  };
  const Case cases[] = {
      {&testing::TestDbOptions::truncated_jpeg, 5, StatusCode::kDataLoss, "00000005_cam_cam"},
      {&testing::TestDbOptions::truncated_state, 6, StatusCode::kDataLoss, "00000006_state"},
      {&testing::TestDbOptions::missing_tokens, 7, StatusCode::kNotFound, "00000007_tokens"},
      // Token ids outside the vocabulary are caught when read, before they reach an embedding.
      {&testing::TestDbOptions::out_of_vocab_tokens, 6, StatusCode::kDataLoss, "00000006_tokens"},
  };
  int n = 0;
  for (const Case& c : cases) {
    testing::TestDbOptions opts;
    (opts.*c.defect) = {c.sample};
    std::string db = Db(opts, "db" + std::to_string(n++));
    LoaderOptions o = InOrder(db);
    o.on_corrupt = CorruptPolicy::kError;
    auto dl = DataLoader::Create(o);
    ASSERT_TRUE(dl.ok());
    Status err;
    auto got = Epoch(**dl, 0, 0, nullptr, &err);
    EXPECT_EQ(err.code(), c.code) << err;
    EXPECT_NE(err.message().find(c.key), std::string::npos) << err;
    EXPECT_EQ(got.size(), 1u);  // batch 0 (samples 0..3) arrives before the bad one
  }
}

// Reads a batch's arrays (CPU loader) into checks of the static-shape contract: `rows` rows,
// tokens padded to the smallest bucket holding the longest real row, masks exactly over each
// sample's (i % 7) + 2 tokens, padding rows zero with sample_index -1.
void CheckStaticBatch(const Batch& x, int batch_size, const std::vector<int>& buckets,
                      const std::set<int64_t>& long_tokens = {}, int cap = 0) {
  ASSERT_EQ(x.rows, batch_size);
  ASSERT_GE(x.token_bucket, 0);
  ASSERT_LT(x.token_bucket, static_cast<int>(buckets.size()));
  EXPECT_EQ(x.tokens_len, buckets[x.token_bucket]);
  int longest = 1;
  for (int r = 0; r < x.size; ++r) {
    const int64_t i = x.sample_index[r];
    int nt = long_tokens.count(i) ? 12 : static_cast<int>(i % 7) + 2;
    if (cap > 0) nt = std::min(nt, cap);
    longest = std::max(longest, nt);
    for (int t = 0; t < x.tokens_len; ++t) {
      EXPECT_EQ(x.attention_mask[r * x.tokens_len + t], t < nt) << "sample " << i << " t " << t;
      EXPECT_EQ(x.tokens[r * x.tokens_len + t], t < nt ? 3 + i + t : 0) << "sample " << i;
    }
  }
  // The smallest bucket that fits.
  EXPECT_GE(x.tokens_len, longest);
  if (x.token_bucket > 0) EXPECT_LT(buckets[x.token_bucket - 1], longest);
  const size_t img = static_cast<size_t>(x.cameras) * 3 * x.height * x.width;
  for (int r = x.size; r < x.rows; ++r) {
    EXPECT_EQ(x.sample_index[r], -1);
    for (int t = 0; t < x.tokens_len; ++t) {
      EXPECT_EQ(x.tokens[r * x.tokens_len + t], 0);
      EXPECT_EQ(x.attention_mask[r * x.tokens_len + t], 0);
    }
    for (int h = 0; h < x.horizon; ++h) EXPECT_EQ(x.action_mask[r * x.horizon + h], 0);
    for (int d = 0; d < x.state_dim; ++d) EXPECT_EQ(x.state[r * x.state_dim + d], 0.f);
    for (size_t k = 0; k < img; ++k) ASSERT_EQ(x.images[r * img + k], 0.f) << "row " << r;
  }
}

// Guards static batches: every batch has batch_size rows and one of the bucket lengths (the
// smallest that fits), masks and tokens are right, and every bucket actually occurs.
TEST_F(LoaderTest, StaticBucketsShapesAndMasks) {
  std::string db = Db({});
  const std::vector<int> buckets = {3, 6, 8};
  for (bool shuffle : {false, true}) {
    LoaderOptions o = SmallLoaderOptions(db);
    o.batch_size = 2;
    o.shuffle = shuffle;
    o.token_buckets = {8, 3, 6, 3};  // unsorted, duplicated: Create normalizes
    auto dl = DataLoader::Create(o);
    ASSERT_TRUE(dl.ok()) << dl.status();
    EXPECT_EQ((*dl)->token_buckets(), buckets);
    ASSERT_TRUE((*dl)->Start(0).ok());
    std::set<int> seen;
    for (;;) {
      auto b = (*dl)->Next();
      if (!b.ok()) {
        EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange) << b.status();
        break;
      }
      CheckStaticBatch(**b, 2, buckets);
      seen.insert((*b)->token_bucket);
    }
    if (!shuffle) EXPECT_EQ(seen.size(), 3u);  // max lengths 3, 5, 7, 8, ... cover all buckets
  }
}

// Guards padding rows: with static_shapes, a batch that lost a corrupt sample keeps batch_size
// rows; the missing row is zero with masks off and sample_index -1, and the real rows match
// the dynamic-shape loader's.
TEST_F(LoaderTest, StaticShapesPadSkippedSamples) {
  testing::TestDbOptions to;
  to.corrupt_jpeg = {1};
  std::string db = Db(to);
  LoaderOptions o = InOrder(db);
  o.static_shapes = true;  // one bucket: the schema's max_tokens (8)
  auto st = DataLoader::Create(o);
  o.static_shapes = false;
  auto dyn = DataLoader::Create(o);
  ASSERT_TRUE(st.ok() && dyn.ok()) << st.status();
  EXPECT_EQ((*st)->token_buckets(), std::vector<int>{8});
  ASSERT_TRUE((*st)->Start(0).ok() && (*dyn)->Start(0).ok());
  auto a = (*st)->Next(), b = (*dyn)->Next();
  ASSERT_TRUE(a.ok() && b.ok());
  const Batch &x = **a, &y = **b;
  EXPECT_EQ(x.size, 3);
  EXPECT_EQ(y.rows, 3);
  EXPECT_EQ(x.tokens_len, 8);
  CheckStaticBatch(x, 4, {8});
  const size_t img = static_cast<size_t>(x.cameras) * 3 * x.height * x.width;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(x.sample_index[r], y.sample_index[r]);
    for (size_t k = 0; k < img; k += 7) ASSERT_EQ(x.images[r * img + k], y.images[r * img + k]);
    for (int d = 0; d < x.state_dim; ++d)
      EXPECT_EQ(x.state[r * x.state_dim + d], y.state[r * y.state_dim + d]);
  }
}

// Guards the too-long contract: an instruction longer than the largest bucket stops the loader
// with InvalidArgument naming the record, even under the skip policy; truncate_tokens cuts it
// instead; Create refuses buckets the schema already says are too short, and bad bucket lists.
TEST_F(LoaderTest, StaticBucketsTooLongInstruction) {
  testing::TestDbOptions to;
  to.long_tokens = {6};
  std::string db = Db(to);
  LoaderOptions o = InOrder(db);
  o.token_buckets = {4, 8};
  auto dl = DataLoader::Create(o);
  ASSERT_TRUE(dl.ok()) << dl.status();
  ASSERT_TRUE((*dl)->Start(0).ok());
  ASSERT_TRUE((*dl)->Next().ok());  // samples 0..3
  auto bad = (*dl)->Next();         // samples 4..7: sample 6 has 12 tokens
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("00000006_tokens"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("truncate_tokens"), std::string::npos) << bad.status();
  EXPECT_EQ((*dl)->corrupt_skipped(), 0);

  o.truncate_tokens = true;
  auto cut = DataLoader::Create(o);
  ASSERT_TRUE(cut.ok());
  ASSERT_TRUE((*cut)->Start(0).ok());
  int batches = 0;
  for (auto b = (*cut)->Next(); b.ok(); b = (*cut)->Next(), ++batches)
    CheckStaticBatch(**b, 4, {4, 8}, to.long_tokens, 8);
  EXPECT_EQ(batches, 10);

  o = SmallLoaderOptions(db);
  o.token_buckets = {4, 6};  // schema max_tokens 8
  auto early = DataLoader::Create(o);
  EXPECT_EQ(early.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(early.status().message().find("truncate_tokens"), std::string::npos);
  o.token_buckets = {0, 8};
  EXPECT_EQ(DataLoader::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.token_buckets = {8};
  o.token_pad = 8;
  EXPECT_EQ(DataLoader::Create(o).status().code(), StatusCode::kInvalidArgument);
  // Without static shapes nothing changes: a batch-max loader pads to the batch's longest.
  o = InOrder(db);
  auto plain = DataLoader::Create(o);
  ASSERT_TRUE((*plain)->Start(0).ok());
  auto b0 = (*plain)->Next();
  ASSERT_TRUE(b0.ok());
  EXPECT_EQ((*b0)->rows, 4);
  EXPECT_EQ((*b0)->tokens_len, 5);
  EXPECT_EQ((*b0)->token_bucket, -1);
}

TEST_F(LoaderTest, OpenErrorsAreClear) {
  LoaderOptions o = SmallLoaderOptions(dir_ + "/nope");
  auto dl = DataLoader::Create(o);
  EXPECT_EQ(dl.status().code(), StatusCode::kNotFound);
  EXPECT_NE(dl.status().message().find("nope"), std::string::npos);
  std::string db = Db({});
  o = SmallLoaderOptions(db);
  o.token_pad = 3;  // shorter than the longest instruction (8)
  EXPECT_EQ(DataLoader::Create(o).status().code(), StatusCode::kInvalidArgument);
}

// Guards the GPU tuning options (formerly environment variables): out-of-range values are
// InvalidArgument naming the option, checked at Create on every build (CPU loader included).
TEST_F(LoaderTest, TuningOptionsOutOfRangeNameTheOption) {
  std::string db = Db({});
  struct Case {
    const char* name;
    void (*set)(LoaderOptions&);
  };
  const Case cases[] = {
      {"decode_lanes", [](LoaderOptions& o) { o.decode_lanes = 1; }},
      {"decode_lanes", [](LoaderOptions& o) { o.decode_lanes = 17; }},
      {"decode_stagger", [](LoaderOptions& o) { o.decode_stagger = 1.5f; }},
      {"decode_stagger", [](LoaderOptions& o) { o.decode_stagger = -0.1f; }},
  };
  for (const Case& c : cases) {
    LoaderOptions o = SmallLoaderOptions(db);
    c.set(o);
    auto dl = DataLoader::Create(o);
    ASSERT_FALSE(dl.ok()) << c.name;
    EXPECT_EQ(dl.status().code(), StatusCode::kInvalidArgument) << dl.status();
    EXPECT_NE(dl.status().message().find(c.name), std::string::npos) << dl.status();
  }
  // In range: the CPU loader accepts them (they only steer the GPU stage).
  LoaderOptions o = SmallLoaderOptions(db);
  o.decode_lanes = 16;
  o.decode_stagger = 0.f;
  o.prefault = PrefaultMode::kPopulate;
  EXPECT_TRUE(DataLoader::Create(o).ok());
}

// Guards the one definition of token buckets shared by the loader and the step runner: sorted,
// deduplicated, positive; a length maps to the smallest bucket that holds it, or -1.
TEST(TokenBuckets, SortAndChoose) {
  auto b = SortTokenBuckets({64, 16, 32, 16});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int>{16, 32, 64}));
  EXPECT_EQ(SortTokenBuckets({8, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SortTokenBuckets({}).ok());
  EXPECT_EQ(TokenBucketFor(*b, 1), 0);
  EXPECT_EQ(TokenBucketFor(*b, 16), 0);
  EXPECT_EQ(TokenBucketFor(*b, 17), 1);
  EXPECT_EQ(TokenBucketFor(*b, 64), 2);
  EXPECT_EQ(TokenBucketFor(*b, 65), -1);
  EXPECT_EQ(TokenBucketFor({}, 1), -1);
}

// Guards Note [Held by]: the stage named for the oldest unconsumed batch, from the pipeline's
// counts (started <= buffers, read <= stage 1, published <= ready).
TEST(LoaderHeldBy, ClassifiesByStageCounts) {
  EXPECT_STREQ(HeldBy(3, 2, 1, 0), "ready");
  EXPECT_STREQ(HeldBy(3, 2, 1, 1), "decode");
  EXPECT_STREQ(HeldBy(3, 2, 2, 2), "read");
  EXPECT_STREQ(HeldBy(3, 3, 3, 3), "buffers");
  EXPECT_STREQ(HeldBy(0, 0, 0, 0), "buffers");
}

// Guards the batch's held_by/wait_ms: batches the pipeline had published before Next() was
// called are "ready", and the counts carry on across Next() calls.
TEST_F(LoaderTest, BatchesPublishedBeforeNextAreReady) {
  std::string db = Db({});
  auto dl = DataLoader::Create(SmallLoaderOptions(db));
  ASSERT_TRUE(dl.ok()) << dl.status();
  ASSERT_TRUE((*dl)->Start(0, 0).ok());
  // prefetch 2: two batches fit in the output queue; wait (bounded) until both are published.
  for (int i = 0; i < 2000 && (*dl)->metrics().Counters()["batches"] < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE((*dl)->metrics().Counters()["batches"], 2);
  for (int i = 0; i < 2; ++i) {
    auto b = (*dl)->Next();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_STREQ((*b)->held_by, "ready") << "batch " << i;
    EXPECT_GE((*b)->wait_ms, 0.0);
  }
  auto b = (*dl)->Next();  // the third: whatever stage it is in, one of the five names
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string held = (*b)->held_by;
  EXPECT_TRUE(held == "ready" || held == "decode" || held == "read" || held == "buffers") << held;
}

// Guards the loader under load, with a stand-in busy consumer: while the consumer
// holds its current batch (as a training step does), the pipeline fills the output queue to
// `prefetch` batches ahead (bounded wait on the published count; a pipeline serialized with its
// consumer never gets there), so every later batch is "ready" when asked for.
TEST_F(LoaderTest, KeepsPrefetchQueueFullWhileConsumerHoldsItsBatch) {
  std::string db = Db({});
  LoaderOptions o = SmallLoaderOptions(db);
  o.prefetch = 3;
  auto dl = DataLoader::Create(o);
  ASSERT_TRUE(dl.ok()) << dl.status();
  const int64_t nb = (*dl)->batches_per_epoch();
  ASSERT_GE(nb, 8);
  ASSERT_TRUE((*dl)->Start(0, 0).ok());
  std::shared_ptr<Batch> held;
  for (int64_t i = 0; i < nb; ++i) {
    auto b = (*dl)->Next();
    ASSERT_TRUE(b.ok()) << b.status();
    if (i > 0) EXPECT_STREQ((*b)->held_by, "ready") << "batch " << i;
    held = *b;  // the step works on this batch; the previous one is released
    const int64_t want = std::min<int64_t>(i + 1 + o.prefetch, nb);
    for (int k = 0; k < 2000 && (*dl)->metrics().Counters()["batches"] < want; ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_GE((*dl)->metrics().Counters()["batches"], want) << "while batch " << i << " was held";
  }
}

// Guards memory flatness: buffers are recycled, so slots stay bounded over many epochs.
TEST_F(LoaderTest, BuffersAreRecycledAcrossEpochs) {
  std::string db = Db({});
  auto dl = DataLoader::Create(SmallLoaderOptions(db));
  ASSERT_TRUE(dl.ok());
  for (int ep = 0; ep < 5; ++ep) Epoch(**dl, ep, 0);
  // A stopped-and-restarted epoch must not leak its in-flight batches either.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*dl)->Start(i, 0).ok());
    ASSERT_TRUE((*dl)->Next().ok());
    (*dl)->Stop();
  }
  int64_t batches = (*dl)->metrics().Counters()["batches"];
  EXPECT_GE(batches, 50);
}

}  // namespace
}  // namespace data
}  // namespace loongforge
