// Helpers shared by the tests of src/data (loader_test.cc, loader_gpu_test.cc,
// image_kernels_test.cc): the small loader they start from, an epoch's loop, and bf16 decoding.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "loongforge/loader.h"

namespace loongforge {
namespace data {

// A small CPU loader over the test database `db`: batches of 4, 32x32 images, 2 threads,
// prefetch 2, seed 5. timeout_ms only turns a hung pipeline into a failure; no test times it.
inline LoaderOptions SmallLoaderOptions(const std::string& db) {
  LoaderOptions o;
  o.db_path = db;
  o.batch_size = 4;
  o.image_size = {32, 32};
  o.threads = 2;
  o.prefetch = 2;
  o.seed = 5;
  o.timeout_ms = 30000;
  return o;
}

// Starts `dl` at batch `start` of epoch `ep` and calls on_batch(const Batch&) for each batch until
// Next() fails. That failure is stored in `err` when given; otherwise it must be OutOfRange (the
// end of the epoch).
template <typename OnBatch>
void ForEachBatch(DataLoader& dl, int64_t ep, int64_t start, Status* err, OnBatch on_batch) {
  EXPECT_TRUE(dl.Start(ep, start).ok());
  for (;;) {
    auto b = dl.Next();
    if (!b.ok()) {
      if (err)
        *err = b.status();
      else
        EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange) << b.status();
      return;
    }
    on_batch(**b);
  }
}

// The float whose top 16 bits are `bits` (bf16 -> float is exact).
inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace data
}  // namespace loongforge
