// Chunk encoding, reading, decoding and the parallel read pass (see chunk_io.h).
//
// Note [Fresh memory]
// Restoring 1 GiB into freshly allocated tensors, or snapshotting into a freshly allocated staging
// arena, touches 262,144 new 4 KiB pages. Taking them one fault at a time inside pread/memcpy is
// what made the first save and every restore slow (on a VM each first touch may also exit to the
// hypervisor). We advise transparent huge pages on those ranges (512x fewer faults where THP is
// in `madvise` mode) and pre-fault them in bulk with MADV_POPULATE_WRITE from the worker that is
// about to fill them, so the faults are spread over the workers too. Both are hints: on kernels
// without them nothing changes but the speed.
#include "ckpt/chunk_io.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "ckpt/device.h"
#include "common/file_util.h"
#include "loongforge/logging.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace loongforge {
namespace ckpt {
namespace internal {

// ---------------- SegmentReader ----------------

SegmentReader::~SegmentReader() {
  for (auto& [_, f] : fds_) ::close(f.fd);
}

StatusOr<int> SegmentReader::Fd(const std::string& seg) {
  auto it = fds_.find(seg);
  if (it != fds_.end()) return it->second.fd;
  const std::string path = seg_dir_ + "/" + seg;
  // A regular file only: a FIFO planted as a segment would block the read forever.
  auto fd = loongforge::internal::OpenRegularFile(path);
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kNotFound)
      return DataLossError("segment file " + path + " is missing");
    return fd.status();
  }
  struct stat st;
  if (::fstat(*fd, &st) != 0) {
    const int err = errno;
    ::close(*fd);
    return ErrnoToStatus(err, "stat " + path);
  }
  ::posix_fadvise(*fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  fds_.emplace(seg, Open{*fd, static_cast<int64_t>(st.st_size)});
  return *fd;
}

Status SegmentReader::CheckRange(const ChunkLoc& loc) {
  LF_RETURN_IF_ERROR(Fd(loc.seg));
  const int64_t size = fds_.at(loc.seg).size;
  if (loc.off < 0 || loc.len < 0 || loc.off > size || loc.len > size - loc.off)
    return DataLossError("segment " + seg_dir_ + "/" + loc.seg + " has " + std::to_string(size) +
                         " bytes, the manifest says a chunk is at offset " +
                         std::to_string(loc.off) + " length " + std::to_string(loc.len));
  return Status::Ok();
}

namespace {
Status Truncated(const std::string& seg, int64_t off, int64_t len) {
  return DataLossError("segment " + seg + " is truncated (wanted bytes " + std::to_string(off) +
                       ".." + std::to_string(off + len) + ")");
}

// preadv of `iov` (advanced in place on short reads) at `off`; IOV_MAX entries per call.
Status PreadvAll(int fd, std::vector<iovec>& iov, int64_t off, const std::string& seg,
                 int64_t total) {
  size_t first = 0;
  const int64_t start = off;
  while (first < iov.size()) {
    const int cnt = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    ssize_t n = ::preadv(fd, iov.data() + first, cnt, off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read segment " + seg);
    }
    if (n == 0) return Truncated(seg, start, total);
    off += n;
    size_t left = static_cast<size_t>(n);
    while (left > 0 && first < iov.size()) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return Status::Ok();
}
}  // namespace

Status SegmentReader::Read(const ChunkLoc& loc, void* dst) {
  LF_ASSIGN_OR_RETURN(int fd, Fd(loc.seg));
  LF_RETURN_IF_ERROR(CheckRange(loc));
  std::vector<iovec> iov{{dst, static_cast<size_t>(loc.len)}};
  if (loc.len == 0) return Status::Ok();
  return PreadvAll(fd, iov, loc.off, loc.seg, loc.len);
}

// ---------------- ChunkEncoder ----------------

ChunkEncoder::~ChunkEncoder() {
  if (cctx_) ZSTD_freeCCtx(cctx_);
}

size_t ChunkEncoder::Compress(const uint8_t* src, size_t n, std::vector<uint8_t>* dst) {
  dst->resize(ZSTD_compressBound(n));
  if (!cctx_) cctx_ = ZSTD_createCCtx();
  size_t z = ZSTD_compressCCtx(cctx_, dst->data(), dst->size(), src, n, opts_.level);
  return ZSTD_isError(z) ? 0 : z;
}

ChunkEncoder::Payload ChunkEncoder::Encode(const uint8_t* raw, ChunkRec* rec, const ChunkRec* base,
                                           uint8_t* base_bytes) {
  const int64_t n = rec->raw;
  Payload out{raw, n};
  rec->codec = Codec::kRaw;
  if (opts_.compress) {
    size_t z = Compress(raw, static_cast<size_t>(n), &zbuf_);
    if (z > 0 && static_cast<double>(z) < opts_.max_ratio * n) {
      rec->codec = Codec::kZstd;
      out = {zbuf_.data(), static_cast<int64_t>(z)};
    }
  }
  if (base != nullptr && base_bytes != nullptr) {
    for (int64_t i = 0; i < n; ++i) base_bytes[i] ^= raw[i];
    size_t z = Compress(base_bytes, static_cast<size_t>(n), &xbuf_);
    if (z > 0 && static_cast<int64_t>(z) < out.len &&
        static_cast<double>(z) < opts_.max_ratio * n) {
      rec->codec = Codec::kXorZstd;
      rec->base_codec = base->codec;
      rec->base_hash = base->hash;
      rec->base = base->loc;
      out = {xbuf_.data(), static_cast<int64_t>(z)};
    }
  }
  return out;
}

// ---------------- ChunkDecoder ----------------

ChunkDecoder::~ChunkDecoder() {
  if (dctx_) ZSTD_freeDCtx(dctx_);
}

Status CheckChunkHash(const Hash128& want, const uint8_t* data, int64_t n,
                      const std::string& what) {
  Hash128 got = HashBytes(data, static_cast<size_t>(n));
  if (got != want)
    return DataLossError(what + ": checksum mismatch (stored " + want.ToHex() + ", read " +
                         got.ToHex() + ")");
  return Status::Ok();
}

std::string ChunkWhat(int64_t step, const std::string& tensor, size_t idx, const ChunkLoc& loc) {
  return "checkpoint " + std::to_string(step) + ": tensor '" + tensor + "' chunk " +
         std::to_string(idx) + " (segment " + loc.seg + " offset " + std::to_string(loc.off) + ")";
}

Status ChunkDecoder::Decompress(const uint8_t* src, size_t src_len, uint8_t* dst, int64_t raw,
                                const std::string& what) {
  // The frame must say it decodes to exactly the manifest's size; the output is bounded by it.
  const unsigned long long fcs = ZSTD_getFrameContentSize(src, src_len);
  if (fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN ||
      fcs != static_cast<unsigned long long>(raw))
    return DataLossError(what + ": compressed frame " +
                         (fcs == ZSTD_CONTENTSIZE_ERROR ? std::string("is not a zstd frame")
                          : fcs == ZSTD_CONTENTSIZE_UNKNOWN
                              ? std::string("has no content size")
                              : "holds " + std::to_string(fcs) + " bytes") +
                         ", the manifest says " + std::to_string(raw));
  if (!dctx_) dctx_ = ZSTD_createDCtx();
  size_t n = ZSTD_decompressDCtx(dctx_, dst, static_cast<size_t>(raw), src, src_len);
  if (ZSTD_isError(n) || static_cast<int64_t>(n) != raw)
    return DataLossError(what + ": corrupt compressed data (" +
                         (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") + ")");
  return Status::Ok();
}

Status ChunkDecoder::DecodeFull(Codec codec, const ChunkLoc& loc, int64_t raw, const Hash128& hash,
                                uint8_t* dst, const std::string& what) {
  if (codec == Codec::kRaw) {
    if (loc.len != raw) return DataLossError(what + ": stored length does not match raw length");
    LF_RETURN_IF_ERROR_CTX(reader_.Read(loc, dst), what);
  } else if (codec == Codec::kZstd) {
    stored_.resize(static_cast<size_t>(loc.len));
    LF_RETURN_IF_ERROR_CTX(reader_.Read(loc, stored_.data()), what);
    LF_RETURN_IF_ERROR(Decompress(stored_.data(), stored_.size(), dst, raw, what));
  } else {
    return DataLossError(what + ": unknown codec " + std::to_string(static_cast<int>(codec)));
  }
  return CheckChunkHash(hash, dst, raw, what);
}

Status ChunkDecoder::Decode(const ChunkRec& c, uint8_t* dst, const std::string& what) {
  if (c.codec == Codec::kXorZstd) {
    stored_.resize(static_cast<size_t>(c.loc.len));
    LF_RETURN_IF_ERROR_CTX(reader_.Read(c.loc, stored_.data()), what);
    std::vector<uint8_t> delta_stored;
    delta_stored.swap(stored_);  // DecodeStored's base decode reuses stored_
    Status s = DecodeStored(c, delta_stored.data(), dst, what);
    stored_.swap(delta_stored);
    return s;
  }
  return DecodeFull(c.codec, c.loc, c.raw, c.hash, dst, what);
}

Status ChunkDecoder::DecodeStored(const ChunkRec& c, const uint8_t* stored, uint8_t* dst,
                                  const std::string& what) {
  switch (c.codec) {
    case Codec::kRaw:
      if (c.loc.len != c.raw)
        return DataLossError(what + ": stored length does not match raw length");
      if (stored != dst) std::memcpy(dst, stored, static_cast<size_t>(c.raw));
      return CheckChunkHash(c.hash, dst, c.raw, what);
    case Codec::kZstd:
      LF_RETURN_IF_ERROR(Decompress(stored, static_cast<size_t>(c.loc.len), dst, c.raw, what));
      return CheckChunkHash(c.hash, dst, c.raw, what);
    case Codec::kXorZstd: {
      LF_RETURN_IF_ERROR(
          DecodeFull(c.base_codec, c.base, c.raw, c.base_hash, dst, what + " (delta base)"));
      delta_.resize(static_cast<size_t>(c.raw));
      LF_RETURN_IF_ERROR(
          Decompress(stored, static_cast<size_t>(c.loc.len), delta_.data(), c.raw, what));
      for (int64_t i = 0; i < c.raw; ++i) dst[i] ^= delta_[static_cast<size_t>(i)];
      return CheckChunkHash(c.hash, dst, c.raw, what);
    }
  }
  return DataLossError(what + ": unknown codec " + std::to_string(static_cast<int>(c.codec)));
}

// ---------------- host memory ----------------

namespace {
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kPageBytes = 4096;

// The [begin, end) interior of [p, p + n) aligned to `align`; begin >= end when empty.
void Interior(void* p, size_t n, size_t align, uintptr_t* begin, uintptr_t* end) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  *begin = (a + align - 1) & ~(align - 1);
  *end = (a + n) & ~(align - 1);
}
}  // namespace

Status CheckHostBytes(int64_t n, const std::string& what) {
  struct sysinfo si;
  if (n < 0 || sysinfo(&si) != 0) return Status::Ok();
  const uint64_t unit = si.mem_unit ? si.mem_unit : 1;
  const uint64_t have = (static_cast<uint64_t>(si.totalram) + si.totalswap) * unit;
  if (static_cast<uint64_t>(n) <= have) return Status::Ok();
  return ResourceExhaustedError(what + " needs " + std::to_string(n) +
                                " bytes of host memory; this machine has " + std::to_string(have) +
                                " (RAM and swap)");
}

void AdviseHugePages(void* p, size_t n) {
  uintptr_t b, e;
  Interior(p, n, kHugePageBytes, &b, &e);
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);  // a hint
}

void PrefaultForWrite(void* p, size_t n) {
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return;
  uintptr_t b, e;
  Interior(p, n, kPageBytes, &b, &e);
  if (e <= b) return;
  if (::madvise(reinterpret_cast<void*>(b), e - b, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
    unsupported.store(true, std::memory_order_relaxed);  // kernel < 5.14: let memcpy fault
}

bool HostBuffer::Reserve(size_t n, bool want_pinned) {
  if (n <= capacity_ && (pinned_ || !want_pinned)) return true;
  Free();
  n = std::max<size_t>(n, 1);
  if (want_pinned && DeviceSupportCompiled()) {
    data_ = static_cast<uint8_t*>(AllocHost(n, true));
    pinned_ = data_ != nullptr;
  }
  if (!data_) {
    // Whole huge pages, so the tail of the buffer can be a huge page too.
    const size_t len = (n + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    AdviseHugePages(p, len);
    data_ = static_cast<uint8_t*>(p);
    mapped_ = true;
    n = len;
  }
  capacity_ = n;
  return true;
}

void HostBuffer::Free() {
  if (data_) {
    if (mapped_) {
      ::munmap(data_, capacity_);
    } else {
      FreeHost(data_, pinned_);
    }
  }
  data_ = nullptr;
  capacity_ = 0;
  pinned_ = mapped_ = false;
}

int DefaultIoThreads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hw, 1, 4));
}

// ---------------- parallel read pass ----------------

namespace {
constexpr int64_t kRunBytes = int64_t{8} << 20;

struct Run {
  size_t begin = 0, end = 0;  // items [begin, end)
  int64_t stored_bytes = 0;   // bytes of the segment range read
  int64_t raw_bytes = 0;
};

// Per-thread state of a read pass.
struct Worker {
  explicit Worker(const std::string& seg_dir) : dec(seg_dir) {}
  ChunkDecoder dec;
  HostBuffer stage;             // raw bytes of chunks without a host destination
  std::vector<uint8_t> stored;  // stored bytes of compressed chunks
  std::vector<iovec> iov;
  std::vector<const uint8_t*> src;  // per item: where its stored bytes land
  std::vector<uint8_t*> dst;        // per item: where its raw bytes go
};

Status ReadRun(const std::vector<ReadItem>& items, const Run& run, const ReadPassOptions& opts,
               Worker& w, const ChunkDoneFn& done) {
  const size_t n = run.end - run.begin;
  // Size the scratch buffers of this run first (they are reused across runs).
  int64_t stage_bytes = 0, stored_bytes = 0;
  for (size_t i = run.begin; i < run.end; ++i) {
    const ChunkRec& c = items[i].t->chunks[items[i].ci];
    if (!items[i].host_dst) stage_bytes += c.raw;
    if (c.codec != Codec::kRaw) stored_bytes += c.loc.len;
  }
  if (stage_bytes > 0 && !w.stage.Reserve(static_cast<size_t>(stage_bytes), opts.pinned_staging))
    return ResourceExhaustedError("out of host memory for a " + std::to_string(stage_bytes) +
                                  "-byte restore staging buffer");
  if (w.stored.size() < static_cast<size_t>(stored_bytes))
    w.stored.resize(static_cast<size_t>(stored_bytes));
  w.iov.clear();
  w.src.assign(n, nullptr);
  w.dst.assign(n, nullptr);
  int64_t stage_off = 0, stored_off = 0;
  for (size_t k = 0; k < n; ++k) {
    const ReadItem& it = items[run.begin + k];
    const ChunkRec& c = it.t->chunks[it.ci];
    uint8_t* dst = it.host_dst;
    if (!dst) {
      dst = w.stage.data() + stage_off;
      stage_off += c.raw;
    } else if (opts.prefault_dst) {
      PrefaultForWrite(dst, static_cast<size_t>(c.raw));
    }
    w.dst[k] = dst;
    uint8_t* land = dst;
    if (c.codec != Codec::kRaw || c.loc.len != c.raw) {
      land = w.stored.data() + stored_off;
      stored_off += c.loc.len;
      if (c.codec == Codec::kRaw)  // length mismatch: read nowhere, DecodeStored reports it
        land = nullptr;
    }
    w.src[k] = land;
    if (land && c.loc.len > 0) w.iov.push_back({land, static_cast<size_t>(c.loc.len)});
  }
  const ReadItem& first = items[run.begin];
  const ChunkLoc& loc0 = first.t->chunks[first.ci].loc;
  if (!w.iov.empty()) {
    const std::string what = ChunkWhat(opts.step, first.t->name, first.ci, loc0);
    auto fd = w.dec.reader().Fd(loc0.seg);
    if (!fd.ok()) return fd.status().WithContext(what);
    LF_RETURN_IF_ERROR_CTX(w.dec.reader().CheckRange({loc0.seg, loc0.off, run.stored_bytes}), what);
    LF_RETURN_IF_ERROR_CTX(PreadvAll(*fd, w.iov, loc0.off, loc0.seg, run.stored_bytes), what);
  }
  for (size_t k = 0; k < n; ++k) {
    const ReadItem& it = items[run.begin + k];
    const ChunkRec& c = it.t->chunks[it.ci];
    const std::string what = ChunkWhat(opts.step, it.t->name, it.ci, c.loc);
    if (!w.src[k]) return DataLossError(what + ": stored length does not match raw length");
    LF_RETURN_IF_ERROR(w.dec.DecodeStored(c, w.src[k], w.dst[k], what));
    LF_RETURN_IF_ERROR(done(it, w.dst[k]));
  }
  return Status::Ok();
}
}  // namespace

Status ParallelReadPass(std::vector<ReadItem> items, const ReadPassOptions& opts,
                        const ChunkDoneFn& done, const ProgressFn& progress) {
  std::sort(items.begin(), items.end(), [](const ReadItem& a, const ReadItem& b) {
    const ChunkLoc& x = a.t->chunks[a.ci].loc;
    const ChunkLoc& y = b.t->chunks[b.ci].loc;
    return x.seg != y.seg ? x.seg < y.seg : x.off < y.off;
  });
  std::vector<Run> runs;
  for (size_t i = 0; i < items.size(); ++i) {
    const ChunkRec& c = items[i].t->chunks[items[i].ci];
    if (!runs.empty()) {
      Run& r = runs.back();
      const ChunkLoc& p = items[i - 1].t->chunks[items[i - 1].ci].loc;
      if (p.seg == c.loc.seg && p.off + p.len == c.loc.off &&
          r.stored_bytes + c.loc.len <= kRunBytes && r.end - r.begin < IOV_MAX) {
        r.end = i + 1;
        r.stored_bytes += c.loc.len;
        r.raw_bytes += c.raw;
        continue;
      }
    }
    runs.push_back({i, i + 1, c.loc.len, c.raw});
  }
  const int nthreads = static_cast<int>(std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(std::max(1, opts.threads)), runs.size())));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;  // first_error_*, progress
  size_t first_error_run = runs.size();
  Status first_error;
  int64_t done_bytes = 0;
  auto work = [&] {
    Worker w(opts.seg_dir);
    while (!failed.load(std::memory_order_acquire)) {
      const size_t r = next.fetch_add(1);
      if (r >= runs.size()) break;
      Status s = ReadRun(items, runs[r], opts, w, done);
      std::lock_guard<std::mutex> l(mu);
      if (!s.ok()) {
        if (r < first_error_run) {
          first_error_run = r;
          first_error = s;
        }
        failed.store(true, std::memory_order_release);
      } else {
        done_bytes += runs[r].raw_bytes;
        if (progress) progress(done_bytes);
      }
    }
  };
  if (nthreads == 1) {
    work();
  } else {
    std::vector<std::thread> threads;
    for (int i = 0; i < nthreads; ++i)
      threads.emplace_back([&] {
        pthread_setname_np(pthread_self(), "ckpt-read");
        work();
      });
    for (auto& t : threads) t.join();  // each ends after its current run
  }
  return first_error;
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
