// Stored chunks: encoding (raw / zstd / xor+zstd) for the writer and merge, reading segment
// files, decoding with checksum verification, the parallel read pass used by restore and verify,
// and host memory helpers (staging arenas, pre-faulting). Private to CheckpointVault.
#pragma once

#include <zstd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/manifest.h"
#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {
namespace internal {

// Open read-only segment files of one reader (one thread).
class SegmentReader {
 public:
  explicit SegmentReader(std::string seg_dir) : seg_dir_(std::move(seg_dir)) {}
  ~SegmentReader();
  SegmentReader(const SegmentReader&) = delete;
  SegmentReader& operator=(const SegmentReader&) = delete;
  // The file descriptor of segment `seg` (opened on first use). DataLoss if it is missing.
  StatusOr<int> Fd(const std::string& seg);
  // Reads loc.len bytes at loc.off into `dst`. DataLoss if the range is not inside the segment
  // (its size when first opened; segments are complete before a manifest names them).
  Status Read(const ChunkLoc& loc, void* dst);
  // DataLoss naming the segment, its size and the range unless `loc` lies inside the segment.
  Status CheckRange(const ChunkLoc& loc);

 private:
  struct Open {
    int fd;
    int64_t size;
  };
  std::string seg_dir_;
  std::unordered_map<std::string, Open> fds_;
};

// Decodes stored chunks into raw bytes and verifies their XXH3-128. One per thread.
class ChunkDecoder {
 public:
  explicit ChunkDecoder(const std::string& seg_dir) : reader_(seg_dir) {}
  ~ChunkDecoder();
  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Reads and decodes chunk `c` into `dst` (c.raw bytes). `what` names the chunk in errors.
  Status Decode(const ChunkRec& c, uint8_t* dst, const std::string& what);
  // Same, with the chunk's stored bytes (c.loc) already read into `stored`. For a raw chunk
  // `stored` may equal `dst` (read in place).
  Status DecodeStored(const ChunkRec& c, const uint8_t* stored, uint8_t* dst,
                      const std::string& what);
  SegmentReader& reader() { return reader_; }

 private:
  Status DecodeFull(Codec codec, const ChunkLoc& loc, int64_t raw, const Hash128& hash,
                    uint8_t* dst, const std::string& what);
  Status Decompress(const uint8_t* src, size_t src_len, uint8_t* dst, int64_t raw,
                    const std::string& what);

  SegmentReader reader_;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<uint8_t> stored_, delta_;
};

// Encodes raw chunks for storage, the inverse of ChunkDecoder: zstd when the stored size is below
// max_ratio * raw, and (with a delta base) zstd of the XOR with the previous full version of the
// chunk when that is smaller still. One per thread (owns a ZSTD_CCtx and scratch buffers).
class ChunkEncoder {
 public:
  struct Options {
    bool compress = false;   // try zstd of the chunk itself
    int level = 1;           // zstd level (both codecs)
    double max_ratio = 0.9;  // keep an encoding only if stored < max_ratio * raw
  };
  // What to store: `len` bytes at `data` (the raw chunk itself, or the encoder's scratch, valid
  // until the next Encode call).
  struct Payload {
    const uint8_t* data = nullptr;
    int64_t len = 0;
  };
  explicit ChunkEncoder(Options opts) : opts_(opts) {}
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Encodes the rec->raw bytes at `raw`; sets rec->codec (and, for kXorZstd, the base fields).
  // `base` / `base_bytes` (both or neither): a full (kRaw or kZstd) stored chunk of the same raw
  // length and its decoded bytes, which are XORed with `raw` in place (clobbered).
  Payload Encode(const uint8_t* raw, ChunkRec* rec, const ChunkRec* base = nullptr,
                 uint8_t* base_bytes = nullptr);

 private:
  // zstd of n bytes at `src` into `dst`; the compressed size, or 0 when it fails.
  size_t Compress(const uint8_t* src, size_t n, std::vector<uint8_t>* dst);

  Options opts_;
  ZSTD_CCtx* cctx_ = nullptr;
  std::vector<uint8_t> zbuf_, xbuf_;
};

Status CheckChunkHash(const Hash128& want, const uint8_t* data, int64_t n, const std::string& what);
std::string ChunkWhat(int64_t step, const std::string& tensor, size_t idx, const ChunkLoc& loc);

// Host memory reused across saves or read passes: page-aligned, advised for transparent huge
// pages, pinned (cudaHostAlloc) on request in CUDA builds. `populated` is how many leading bytes
// have been touched; Populate() pre-faults a range in bulk (MADV_POPULATE_WRITE), which is much
// cheaper than one fault per 4 KiB page inside memcpy. Note [Fresh memory].
class HostBuffer {
 public:
  HostBuffer() = default;
  ~HostBuffer() { Free(); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  // Ensures capacity >= n (keeps the contents only if no reallocation happens). Returns false
  // if host memory is exhausted.
  bool Reserve(size_t n, bool want_pinned);
  void Free();
  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  bool pinned_ = false;
  bool mapped_ = false;  // mmap'ed (else AllocHost)
};

// OK when `n` bytes of host memory could exist on this machine (RAM plus swap), else
// ResourceExhausted naming `what`. A manifest's sizes are checked against each other, not against
// the machine; asking the allocator for more than it could ever give is an abort under sanitizers
// and a gamble under overcommit, so the bound is checked before the allocation is attempted.
Status CheckHostBytes(int64_t n, const std::string& what);

// Advises transparent huge pages for the 2 MiB-aligned interior of [p, p + n) (no-op if THP is
// off). Only for memory about to be overwritten in full.
void AdviseHugePages(void* p, size_t n);
// Pre-faults the page-aligned interior of [p, p + n) for writing (no-op where unsupported).
void PrefaultForWrite(void* p, size_t n);

// One chunk of a read pass. `host_dst` is where the raw bytes go (CPU memory of the final
// destination), or null to decode into per-thread staging (device targets, verify).
struct ReadItem {
  const TensorRec* t = nullptr;
  size_t ci = 0;
  int64_t offset = 0;  // byte offset of the chunk in its tensor
  uint8_t* host_dst = nullptr;
};

struct ReadPassOptions {
  std::string seg_dir;
  int64_t step = -1;
  int threads = 1;              // worker threads ("ckpt-read")
  bool pinned_staging = false;  // staging for null host_dst in pinned memory (device targets)
  bool prefault_dst = false;    // pre-fault host_dst ranges before reading into them
};

// Called once per chunk, from a worker thread, after its checksum verified; `data` holds c.raw
// bytes (host_dst or staging, valid only during the call).
using ChunkDoneFn = std::function<Status(const ReadItem&, const uint8_t* data)>;

// Note [Parallel read pass]
// Items are sorted by (segment, offset) and cut into runs of chunks stored back to back (<= 8
// MiB). Worker threads take runs in order from an atomic counter; each reads its run with one
// preadv (raw chunks straight into their destination, compressed ones into a reusable per-thread
// buffer), then decompresses and verifies each chunk while the other workers read. Runs are taken
// in file order, so the disk sees a few sequential streams. The error reported is that of the
// first failing run in file order (runs before it are always completed).
Status ParallelReadPass(std::vector<ReadItem> items, const ReadPassOptions& opts,
                        const ChunkDoneFn& done, const ProgressFn& progress);

// Default worker count for read passes and snapshots: min(4, hardware threads), at least 1.
int DefaultIoThreads();

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
