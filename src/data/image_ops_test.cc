// Tests of the JPEG decoder's bound on frame pixels (image_ops.h): a header is checked before any
// pixel buffer is sized from it.
#include "image_ops.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "test_dataset.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

// A 2 KB frame whose header claims 65500x65500 must be refused from the header, naming the record,
// the claimed size and the bound, not decoded into a 12 GiB buffer that fails afterwards.
TEST(ImageOps, RefusesHeaderOverPixelBound) {
  JpegDecoder dec;
  RgbImage im;
  const std::string good = testing::EncodeJpeg(testing::RandomRgb(64, 48, 9), 64, 48);
  Status s = dec.Decode(testing::WithClaimedSize(good, 65500, 65500), 0, 0, &im, "db: record 'r5'");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("db: record 'r5'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("65500x65500"), std::string::npos) << s;
  EXPECT_NE(s.message().find("max_frame_pixels " + std::to_string(kDefaultMaxFramePixels)),
            std::string::npos)
      << s;
  EXPECT_LT(im.pixels.capacity(), size_t{1} << 20) << "a buffer was sized from the header";
  // With DCT scaling asked for too (the loader's default): the bound is on the header's size.
  EXPECT_EQ(dec.Decode(testing::WithClaimedSize(good, 65500, 65500), 236, 236, &im, "r").code(),
            StatusCode::kDataLoss);
  // The bound is inclusive, and the decoder keeps working after a refusal.
  EXPECT_EQ(dec.Decode(good, 0, 0, &im, "r", 64 * 48 - 1).code(), StatusCode::kDataLoss);
  Status ok = dec.Decode(good, 0, 0, &im, "r", 64 * 48);
  EXPECT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(im.width, 64);
  EXPECT_EQ(im.height, 48);
}

// The area products of a 65535-pixel side do not fit an int: the check and the scale choice must
// use 64-bit arithmetic (46341^2 > INT_MAX would wrap negative and pass a 32-bit bound).
TEST(ImageOps, PixelBoundIsSixtyFourBit) {
  EXPECT_EQ(CheckFramePixels(46341, 46341, kDefaultMaxFramePixels, "f").code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(CheckFramePixels(65535, 65535, INT32_MAX, "f").code(), StatusCode::kDataLoss);
  EXPECT_TRUE(CheckFramePixels(8192, 8192, kDefaultMaxFramePixels, "f").ok());
  EXPECT_EQ(CheckFramePixels(8192, 8193, kDefaultMaxFramePixels, "f").code(),
            StatusCode::kDataLoss);
}

}  // namespace
}  // namespace internal
}  // namespace data
}  // namespace loongforge
