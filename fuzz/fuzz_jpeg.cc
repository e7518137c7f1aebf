// JPEG header and decode (src/data/image_ops.cc JpegDecoder), as the loader and `pack` use it:
// the header first, then, for images within the harness's pixel budget, a full decode and a
// DCT-scaled decode to at least 16x16. One decoder per process, reused like a loader worker's,
// so state left behind by a failed call is exercised too.
#include <cstdint>
#include <string_view>

#include "data/image_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static loongforge::data::internal::JpegDecoder decoder;
  std::string_view jpeg(reinterpret_cast<const char*>(data), size);
  int w = 0, h = 0;
  if (!decoder.ReadHeader(jpeg, &w, &h, "fuzz.jpg").ok()) return 0;
  // Decoding is bounded by the image size, not the input size: keep each run small and fast.
  if (w <= 0 || h <= 0 || static_cast<int64_t>(w) * h > (1 << 20)) return 0;
  loongforge::data::internal::RgbImage img;
  (void)decoder.Decode(jpeg, 0, 0, &img, "fuzz.jpg");
  (void)decoder.Decode(jpeg, 16, 16, &img, "fuzz.jpg");
  return 0;
}
