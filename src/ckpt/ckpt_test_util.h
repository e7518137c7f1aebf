// Helpers shared by the CheckpointVault tests (vault_test.cc, vault_cuda_test.cc,
// ckpt_cli_test.cc, cufile_writer_test.cc): temp dirs, random bytes and host states.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "loongforge/ckpt.h"
#include "test_dataset.h"

namespace loongforge {
namespace ckpt {

// A fresh empty directory for this test process.
inline std::string TempDir(const std::string& name) { return testing::TempDir("ckpt_" + name); }

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A TensorRef to contiguous host memory.
inline TensorRef HostRef(std::string name, DType dtype, std::vector<int64_t> shape,
                         const void* data) {
  return {std::move(name), TensorView::Contiguous(data, dtype, std::move(shape))};
}

// Owns named byte buffers and hands out TensorRefs to them.
struct State {
  struct T {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<T> ts;
  void Add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           uint64_t seed) {
    int64_t n = DTypeSize(*ParseDType(dtype));
    for (auto d : shape) n *= d;
    ts.push_back({name, dtype, shape, RandomBytes(static_cast<size_t>(n), seed)});
  }
  std::vector<TensorRef> Refs() const {
    std::vector<TensorRef> r;
    for (const auto& t : ts)
      r.push_back(HostRef(t.name, *ParseDType(t.dtype), t.shape, t.bytes.data()));
    return r;
  }
};

inline void ExpectRestores(CheckpointVault* v, int64_t step, const State& s) {
  auto r = v->Restore(step);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), s.ts.size());
  for (size_t i = 0; i < s.ts.size(); ++i) {
    EXPECT_EQ((*r)[i].info.name, s.ts[i].name);
    EXPECT_EQ((*r)[i].info.dtype, s.ts[i].dtype);
    EXPECT_EQ((*r)[i].info.shape, s.ts[i].shape);
    EXPECT_TRUE((*r)[i].data == s.ts[i].bytes) << "step " << step << " tensor " << s.ts[i].name;
  }
}

inline VaultOptions SmallOpts() {
  VaultOptions o;
  o.chunk_bytes = 4096;
  return o;
}

// The whole file at `path` ("" if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace ckpt
}  // namespace loongforge
