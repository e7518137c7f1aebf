// Checkpoint manifests: the in-memory form and its self-checking file format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {
namespace internal {

// Bounds on what a manifest (and VaultOptions) may say: chunk_bytes in [4 KiB, 1 GiB] (a read
// buffer is sized by it), at most kMaxDims dimensions per tensor.
constexpr int64_t kMinChunkBytes = 4096;
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;
constexpr int kMaxDims = 16;

enum class Codec : int { kRaw = 0, kZstd = 1, kXorZstd = 2 };

// Where a stored chunk lives.
struct ChunkLoc {
  std::string seg;  // segment file name under DIR/segments
  int64_t off = 0;
  int64_t len = 0;  // stored length
};

struct ChunkRec {
  Hash128 hash;  // XXH3-128 of the raw bytes
  int64_t raw = 0;
  Codec codec = Codec::kRaw;
  ChunkLoc loc;
  // kXorZstd only: the full (kRaw or kZstd) chunk the delta applies to.
  Codec base_codec = Codec::kRaw;
  Hash128 base_hash;
  ChunkLoc base;
};

struct TensorRec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
  std::vector<ChunkRec> chunks;
};

struct Manifest {
  int64_t step = -1;
  int64_t parent = -1;
  int64_t chunk_bytes = 0;
  double created_unix = 0;
  std::vector<TensorRec> tensors;

  // Every segment referenced (data and delta bases), sorted, unique.
  std::vector<std::string> Segments() const;
};

// File format: "LFCKPT1 <xxh3-128 of body, 32 hex> <body length>\n" + JSON body.
std::string SerializeManifest(const Manifest& m);
// `path` is used in error messages only. Truncation, a bad checksum, bad JSON or any field that
// is out of range or inconsistent (nbytes vs shape and dtype, chunk count and sizes vs nbytes
// and chunk_bytes, duplicate tensor names, non-integer numbers) -> DataLoss naming the field.
StatusOr<Manifest> ParseManifest(const std::string& bytes, const std::string& path);

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
