// LMDB meta-page checks and write-error classification (see lmdb_file.h).
#include "dataset/lmdb_file.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loongforge::data::internal {
namespace {

static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8,
              "the LMDB meta layout below is the 64-bit one (pgno_t, size_t, txnid_t of 8 bytes)");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "LMDB files are host-endian; the meta reader below assumes little-endian"
#endif

// LMDB 0.9 mdb.c: struct MDB_page starts with pgno_t mp_pgno (8), uint16_t mp_pad, uint16_t
// mp_flags, then 4 bytes of bounds; PAGEHDRSZ = 16 and METADATA(p) = p + PAGEHDRSZ.
constexpr size_t kPageHeaderBytes = 16;
constexpr size_t kPageFlagsOffset = 10;
constexpr uint16_t kPageFlagMeta = 0x08;  // P_META
// struct MDB_meta: uint32_t mm_magic; uint32_t mm_version; void* mm_address; size_t mm_mapsize;
// MDB_db mm_dbs[2] (48 bytes each: uint32_t md_pad, uint16_t md_flags, uint16_t md_depth, five
// 8-byte fields); pgno_t mm_last_pg; txnid_t mm_txnid. mm_psize is mm_dbs[FREE_DBI].md_pad.
constexpr size_t kMagicOffset = 0, kVersionOffset = 4, kMapSizeOffset = 16, kPageSizeOffset = 24,
                 kFreeRootOffset = 64, kMainDepthOffset = 78, kMainEntriesOffset = 104,
                 kMainRootOffset = 112, kLastPageOffset = 120, kTxnIdOffset = 128, kMetaBytes = 136;
constexpr uint64_t kNoRoot = ~uint64_t{0};  // P_INVALID: an empty database
// struct MDB_page: uint16_t mp_lower at 12, mp_upper at 14 (uint32_t mp_pages on overflow
// pages), then uint16_t mp_ptrs[] (node offsets from the page start). struct MDB_node: uint16_t
// mn_lo, mn_hi (data size, or the low 32 bits of a child page number on branch pages), mn_flags
// (its high 16 bits), mn_ksize, then the key and the data (NODESIZE = 8).
constexpr uint16_t kPageBranch = 0x01, kPageLeaf = 0x02, kPageLeaf2 = 0x20;        // P_BRANCH ...
constexpr uint16_t kNodeBigData = 0x01, kNodeSubData = 0x02, kNodeDupData = 0x04;  // F_BIGDATA ...
constexpr size_t kLowerOffset = 12, kUpperOffset = 14, kNodeHeaderBytes = 8;
constexpr size_t kMetaBufBytes = kPageHeaderBytes + kMetaBytes;  // sizeof(MDB_metabuf)
constexpr uint32_t kLmdbMagic = 0xBEEFC0DE;                      // MDB_MAGIC
constexpr uint32_t kLmdbDataVersion = 1;                         // MDB_DATA_VERSION (0.9)

template <typename T>
T Load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string Num(uint64_t v) { return std::to_string(v); }

// Reads the meta page at `offset`. DataLoss naming `file` when it is not one.
Status ReadMeta(int fd, const std::string& file, int64_t file_bytes, int64_t offset, int index,
                LmdbMeta* out) {
  if (file_bytes < offset + static_cast<int64_t>(kMetaBufBytes))
    return DataLossError(file + ": truncated: " + Num(file_bytes) + " bytes, too short to hold " +
                         "LMDB meta page " + std::to_string(index) + " (at byte " + Num(offset) +
                         "); the file was cut short (an interrupted copy or a full disk?)");
  unsigned char buf[kMetaBufBytes];
  ssize_t n;
  do {
    n = ::pread(fd, buf, sizeof(buf), offset);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoToStatus(errno, "read " + file);
  if (n != static_cast<ssize_t>(sizeof(buf)))
    return DataLossError(file + ": short read of LMDB meta page " + std::to_string(index));
  const unsigned char* m = buf + kPageHeaderBytes;
  const uint16_t flags = Load<uint16_t>(buf + kPageFlagsOffset);
  if (!(flags & kPageFlagMeta) || Load<uint32_t>(m + kMagicOffset) != kLmdbMagic)
    return DataLossError(file + ": not an LMDB data file (page " + std::to_string(index) +
                         " is not an LMDB meta page)");
  const uint32_t version = Load<uint32_t>(m + kVersionOffset);
  if (version != kLmdbDataVersion)
    return DataLossError(file + ": LMDB data version " + Num(version) + " in meta page " +
                         std::to_string(index) + ", this build reads version " +
                         Num(kLmdbDataVersion));
  out->page_size = Load<uint32_t>(m + kPageSizeOffset);
  out->map_size = Load<uint64_t>(m + kMapSizeOffset);
  out->last_page = Load<uint64_t>(m + kLastPageOffset);
  out->txnid = Load<uint64_t>(m + kTxnIdOffset);
  out->main_root = Load<uint64_t>(m + kMainRootOffset);
  out->free_root = Load<uint64_t>(m + kFreeRootOffset);
  out->main_entries = Load<uint64_t>(m + kMainEntriesOffset);
  out->main_depth = Load<uint16_t>(m + kMainDepthOffset);
  const uint32_t ps = out->page_size;
  if (ps < 256 || ps > 65536 || (ps & (ps - 1)) != 0)
    return DataLossError(file + ": LMDB meta page " + std::to_string(index) +
                         " gives an impossible page size " + Num(ps));
  if (out->last_page < 1 || out->last_page > (uint64_t{1} << 62) / ps)
    return DataLossError(file + ": LMDB meta page " + std::to_string(index) +
                         " gives an impossible last page " + Num(out->last_page));
  // LMDB asserts "root > 1" (abort) on a root among the meta pages; one past mm_last_pg is
  // outside the file.
  for (auto [what, root] :
       {std::make_pair("main", out->main_root), std::make_pair("free-page", out->free_root)})
    if (root != kNoRoot && (root < 2 || root > out->last_page))
      return DataLossError(file + ": LMDB meta page " + std::to_string(index) + " gives the " +
                           what + " database root page " + Num(root) +
                           ", outside the data pages 2.." + Num(out->last_page));
  if (out->main_root != kNoRoot && (out->main_depth < 1 || out->main_depth > 64))
    return DataLossError(file + ": LMDB meta page " + std::to_string(index) +
                         " gives an impossible tree depth " + Num(out->main_depth));
  return Status::Ok();
}

// `path` opened read-only, closed when this goes; get() < 0 (with errno set) when open failed.
class ReadOnlyFd {
 public:
  explicit ReadOnlyFd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~ReadOnlyFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadOnlyFd(const ReadOnlyFd&) = delete;
  ReadOnlyFd& operator=(const ReadOnlyFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Status PreadAll(int fd, void* buf, size_t n, int64_t offset, const std::string& file) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, static_cast<char*>(buf) + got, n - got, offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoToStatus(errno, "read " + file);
    if (r == 0)
      return DataLossError(file + ": ends at byte " + Num(offset + got) + " inside a page");
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<LmdbFileInfo> CheckLmdbDataFile(const std::string& data_mdb) {
  const ReadOnlyFd file(data_mdb);
  const int fd = file.get();
  if (fd < 0) return ErrnoToStatus(errno, "open " + data_mdb);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, "stat " + data_mdb);
  if (!S_ISREG(st.st_mode)) return DataLossError(data_mdb + ": not a regular file");
  LmdbFileInfo info;
  info.file_bytes = static_cast<int64_t>(st.st_size);
  if (info.file_bytes == 0)
    return DataLossError(data_mdb +
                         ": empty (0 bytes), not an LMDB data file (an interrupted copy?)");
  LF_RETURN_IF_ERROR(ReadMeta(fd, data_mdb, info.file_bytes, 0, 0, &info.meta[0]));
  // As mdb_env_read_header: the second meta page starts one page (of meta 0's size) in.
  LF_RETURN_IF_ERROR(
      ReadMeta(fd, data_mdb, info.file_bytes, info.meta[0].page_size, 1, &info.meta[1]));
  if (info.meta[1].page_size != info.meta[0].page_size)
    return DataLossError(data_mdb + ": the LMDB meta pages disagree on the page size (" +
                         Num(info.meta[0].page_size) + " and " + Num(info.meta[1].page_size) + ")");
  info.current = info.meta[1].txnid > info.meta[0].txnid ? 1 : 0;
  const uint64_t last = std::max(info.meta[0].last_page, info.meta[1].last_page);
  info.required_bytes = static_cast<int64_t>((last + 1) * info.meta[0].page_size);
  if (info.file_bytes < info.required_bytes)
    return DataLossError(data_mdb + ": truncated: the file has " + Num(info.file_bytes) +
                         " bytes but its LMDB meta pages reference " + Num(info.required_bytes) +
                         " (pages 0.." + Num(last) + " of " + Num(info.meta[0].page_size) +
                         " bytes; map size " + Num(info.meta[info.current].map_size) +
                         "); it was cut short (an interrupted copy or a full disk?): copy or "
                         "pack it again");
  // The current main root must be a tree page that names itself (a zeroed or shifted file
  // passes the meta checks only if its meta pages survived).
  const LmdbMeta& cur = info.meta[info.current];
  if (cur.main_root != kNoRoot) {
    unsigned char hdr[kPageHeaderBytes];
    LF_RETURN_IF_ERROR(PreadAll(fd, hdr, sizeof(hdr),
                                static_cast<int64_t>(cur.main_root * cur.page_size), data_mdb));
    const uint16_t flags = Load<uint16_t>(hdr + kPageFlagsOffset);
    if (Load<uint64_t>(hdr) != cur.main_root || !(flags & (kPageBranch | kPageLeaf)))
      return DataLossError(data_mdb + ": the main database root page " + Num(cur.main_root) +
                           " (LMDB meta page " + std::to_string(info.current) +
                           ") is not a tree page: the file is damaged");
  }
  return info;
}

Status CheckLmdbTree(const std::string& data_mdb, const LmdbFileInfo& info) {
  const LmdbMeta& m = info.meta[info.current];
  if (m.main_root == kNoRoot) return Status::Ok();
  const ReadOnlyFd file(data_mdb);
  const int fd = file.get();
  if (fd < 0) return ErrnoToStatus(errno, "open " + data_mdb);
  const size_t ps = m.page_size;
  std::vector<unsigned char> page(ps);
  std::unordered_set<uint64_t> seen;
  std::vector<std::pair<uint64_t, int>> todo{{m.main_root, 1}};  // (page, level from the root)
  auto bad = [&](uint64_t pg, const std::string& why) {
    return DataLossError(data_mdb + ": LMDB page " + Num(pg) + " " + why +
                         ": the file is damaged (copy or pack it again)");
  };
  while (!todo.empty()) {
    auto [pg, level] = todo.back();
    todo.pop_back();
    if (!seen.insert(pg).second) return bad(pg, "is reached twice in the tree");
    LF_RETURN_IF_ERROR(PreadAll(fd, page.data(), ps, static_cast<int64_t>(pg * ps), data_mdb));
    const unsigned char* p = page.data();
    const uint16_t flags = Load<uint16_t>(p + kPageFlagsOffset);
    const bool leaf = level == m.main_depth;
    if (Load<uint64_t>(p) != pg) return bad(pg, "names itself page " + Num(Load<uint64_t>(p)));
    if ((flags & kPageLeaf2) || !(flags & (leaf ? kPageLeaf : kPageBranch)))
      return bad(pg, std::string("is not the ") + (leaf ? "leaf" : "branch") +
                         " page expected at level " + std::to_string(level) + " of " +
                         std::to_string(m.main_depth) + " (flags " + Num(flags) + ")");
    const uint16_t lower = Load<uint16_t>(p + kLowerOffset),
                   upper = Load<uint16_t>(p + kUpperOffset);
    if (lower < kPageHeaderBytes || lower > upper || upper > ps || (lower - kPageHeaderBytes) % 2)
      return bad(pg, "has impossible bounds (lower " + Num(lower) + ", upper " + Num(upper) + ")");
    const size_t nodes = (lower - kPageHeaderBytes) / 2;
    if (nodes == 0 && !(leaf && pg == m.main_root)) return bad(pg, "holds no nodes");
    for (size_t i = 0; i < nodes; ++i) {
      const uint16_t at = Load<uint16_t>(p + kPageHeaderBytes + 2 * i);
      if (at < upper || at + kNodeHeaderBytes > ps)
        return bad(pg, "has node " + std::to_string(i) + " at offset " + Num(at) +
                           ", outside its node area");
      const unsigned char* n = p + at;
      const uint32_t lo_hi = Load<uint16_t>(n) | (uint32_t{Load<uint16_t>(n + 2)} << 16);
      const uint16_t nflags = Load<uint16_t>(n + 4), ksize = Load<uint16_t>(n + 6);
      size_t end = at + kNodeHeaderBytes + ksize;
      if (leaf) {
        if (nflags & (kNodeSubData | kNodeDupData))
          return bad(pg, "holds a sub-database or duplicate node (node " + std::to_string(i) +
                             "), which a LoongForge dataset never has");
        end += (nflags & kNodeBigData) ? sizeof(uint64_t) : lo_hi;
        if (end > ps)
          return bad(pg, "has node " + std::to_string(i) + " running past the page end");
        if (nflags & kNodeBigData) {
          const uint64_t ov = Load<uint64_t>(n + kNodeHeaderBytes + ksize);
          const uint64_t pages = (uint64_t{lo_hi} + kPageHeaderBytes + ps - 1) / ps;
          if (ov < 2 || ov > m.last_page || pages > m.last_page - ov + 1)
            return bad(pg, "has node " + std::to_string(i) + " whose " + Num(lo_hi) +
                               " bytes start at page " + Num(ov) + ", past the last page " +
                               Num(m.last_page));
        }
      } else {
        if (end > ps)
          return bad(pg, "has node " + std::to_string(i) + " running past the page end");
        const uint64_t child = lo_hi | (uint64_t{nflags} << 32);
        if (child < 2 || child > m.last_page)
          return bad(pg, "points to child page " + Num(child) + ", outside 2.." + Num(m.last_page));
        todo.emplace_back(child, level + 1);
      }
    }
  }
  return Status::Ok();
}

Status LmdbError(int rc, const std::string& what) {
  std::string msg = what + ": " + mdb_strerror(rc);
  switch (rc) {
    case MDB_NOTFOUND:
      return NotFoundError(msg);
    case MDB_MAP_FULL:
      return ResourceExhaustedError(msg + " (the LMDB map size is too small)");
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
      return DataLossError(msg);
    case MDB_READERS_FULL:
      return ResourceExhaustedError(msg + " (raise max_readers)");
    case EFBIG:  // the process file-size limit (RLIMIT_FSIZE) or the filesystem's maximum
      return ResourceExhaustedError(msg);
    default:
      return rc > 0 ? ErrnoToStatus(rc, what) : InternalError(msg);
  }
}

Status LmdbWriteError(int rc, int fd, const std::string& what) {
  if (rc != EIO || fd < 0) return LmdbError(rc, what);
  // mdb_page_flush returns EIO for a short write ("short write, filesystem full?"). Find the
  // real cause: the file-size limit first (a probe write past it would raise SIGXFSZ), then a
  // one-page write past the end of the file, which fails as the next LMDB write would have.
  struct stat st;
  if (::fstat(fd, &st) != 0) return LmdbError(rc, what);
  constexpr off_t kProbeBytes = 4096;
  struct rlimit rl;
  if (::getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      static_cast<uint64_t>(st.st_size) + kProbeBytes > static_cast<uint64_t>(rl.rlim_cur))
    return ResourceExhaustedError(what + ": " + std::strerror(EFBIG) +
                                  " (the file reached the process file-size limit of " +
                                  Num(rl.rlim_cur) + " bytes)");
  std::vector<char> zeros(kProbeBytes, 0);
  const off_t at = (st.st_size + kProbeBytes - 1) / kProbeBytes * kProbeBytes;
  ssize_t n;
  do {
    n = ::pwrite(fd, zeros.data(), zeros.size(), at);
  } while (n < 0 && errno == EINTR);
  const int err = n < 0 ? errno : 0;
  if (::ftruncate(fd, st.st_size) != 0) {
    // The file is a staging file about to be removed; its length no longer matters.
  }
  if (err == ENOSPC || err == EDQUOT || err == EFBIG)
    return ResourceExhaustedError(what + ": " + std::strerror(err));
  return LmdbError(rc, what);
}

}  // namespace loongforge::data::internal
