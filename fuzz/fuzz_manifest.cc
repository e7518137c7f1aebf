// Checkpoint manifest (src/ckpt/manifest.cc): header, checksum, JSON body and its validation.
// The first input byte picks the mode: odd = the rest is a whole manifest file as read from disk;
// even = the rest is a manifest body, wrapped here in a header with the right length and xxh3-128,
// so the fuzzer reaches the JSON checks instead of stopping at the checksum.
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string file;
  if (data[0] & 1) {
    file = std::move(rest);
  } else {
    XXH128_hash_t h = XXH3_128bits(rest.data(), rest.size());
    char hex[33];
    std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    file = std::string("LFCKPT1 ") + hex + " " + std::to_string(rest.size()) + "\n" + rest;
  }
  auto m = loongforge::ckpt::internal::ParseManifest(file, "fuzz/manifest.json");
  if (m.ok()) (void)m->Segments();
  return 0;
}
