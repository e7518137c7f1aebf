// Tests of Histogram (src/common/metrics.cc).
#include <gtest/gtest.h>

#include "loongforge/metrics.h"

namespace loongforge {
namespace {

// Guards the percentile maths against off-by-one interpolation.
TEST(Histogram, PercentilesAndStd) {
  Histogram h;
  for (int i = 1; i <= 101; ++i) h.Record(i);
  auto s = h.Summary();
  EXPECT_EQ(s.count, 101);
  EXPECT_DOUBLE_EQ(s.p50, 51);
  EXPECT_DOUBLE_EQ(s.p99, 100);
  EXPECT_DOUBLE_EQ(s.mean, 51);
  EXPECT_NEAR(s.std, 29.1548, 1e-3);
}

TEST(Histogram, ReservoirKeepsBoundedMemory) {
  Histogram h(100);
  for (int i = 0; i < 100000; ++i) h.Record(i % 10);
  auto s = h.Summary();
  EXPECT_EQ(s.count, 100000);
  EXPECT_GE(s.p50, 3);
  EXPECT_LE(s.p50, 6);
  EXPECT_EQ(s.max, 9);
}

}  // namespace
}  // namespace loongforge
