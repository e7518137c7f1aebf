// Reading LMDB's on-disk meta pages without mapping the file, and naming the real cause of a
// failed LMDB write. Private to the record store (src/dataset); tests include it directly.
//
// Note [Validating data.mdb before mapping]
// LMDB maps data.mdb and dereferences its pages without comparing the file length to what the meta
// pages say: a file cut short (an interrupted copy, a full disk, a partial download) kills every
// reader with SIGBUS on the first page past the end, with no message. So before mdb_env_open a
// reader reads both meta pages itself, the way mdb_env_read_header does (pages 0 and 1: page
// header flags P_META, magic, data version, page size; mm_last_pg and mm_txnid), and requires the
// file to hold every page up to the larger mm_last_pg. The layout is LMDB 0.9's (mdb.c, MDB_page
// and MDB_meta) on a 64-bit little-endian host, checked by a test against mdb_env_info().
// mdb.c notes that a file may in principle end before mm_last_pg when its last pages are free
// (loose pages are not written); RecordWriter::Commit() extends its file to (mm_last_pg + 1)
// pages, so every DB LoongForge writes meets the check exactly.
#pragma once

#include <cstdint>
#include <string>

#include "loongforge/status.h"

namespace loongforge::data::internal {

// One meta page as LMDB 0.9 stores it.
struct LmdbMeta {
  uint32_t page_size = 0;     // mm_dbs[FREE_DBI].md_pad
  uint64_t map_size = 0;      // mm_mapsize
  uint64_t last_page = 0;     // mm_last_pg: last page number in use
  uint64_t txnid = 0;         // mm_txnid: the meta with the larger one is current
  uint64_t main_root = 0;     // mm_dbs[MAIN_DBI].md_root (~0: an empty database)
  uint64_t free_root = 0;     // mm_dbs[FREE_DBI].md_root
  uint64_t main_entries = 0;  // mm_dbs[MAIN_DBI].md_entries
  uint16_t main_depth = 0;    // mm_dbs[MAIN_DBI].md_depth
};

struct LmdbFileInfo {
  int64_t file_bytes = 0;
  LmdbMeta meta[2];
  int current = 0;             // index of the meta LMDB uses (larger txnid)
  int64_t required_bytes = 0;  // (max last_page + 1) * page_size
};

// Reads and checks the meta pages of the LMDB data file `data_mdb` (Note [Validating data.mdb
// before mapping]). DataLoss naming the file when it is empty, shorter than its meta pages say
// (with both sizes), not an LMDB file, of another LMDB data version or with an impossible page
// size; NotFound / PermissionDenied from open().
// Each meta page's database roots must be pages 2..mm_last_pg (or ~0 for an empty database: LMDB
// asserts "root > 1" on anything else), and the current main root must be a branch or leaf page
// that names itself.
StatusOr<LmdbFileInfo> CheckLmdbDataFile(const std::string& data_mdb);

// Note [Walking the tree before a cursor does]
// LMDB trusts every page it reads: a damaged branch page (a child number past the end, a node
// offset outside the page, a key longer than the page) sends mdb_cursor_get outside the map
// (SIGSEGV). A full scan of the keys therefore first walks the main B-tree of the current meta
// `info` itself, with pread: each page must name itself, have the expected kind (branch pages
// above leaf pages, no cycles, depth as the meta says), hold its node offsets and keys inside
// the page, and every child and overflow page must lie in 2..mm_last_pg. DataLoss naming the
// file and the page otherwise. It reads every branch and leaf page once (not the overflow pages
// holding images): about one 4 KiB read per hundred records, done once when a reader opens.
Status CheckLmdbTree(const std::string& data_mdb, const LmdbFileInfo& info);

// The Status of an LMDB return code `rc` from the write path of the environment whose data file
// is open as `fd` (mdb_env_get_fd; -1 if unknown). LMDB reports a short write (a disk that filled
// up mid-write, a file-size limit) as EIO; this function then probes the file with a one-page
// write past its end to find the real cause (ENOSPC, EDQUOT, EFBIG -> ResourceExhausted). `what`
// names the operation and the file.
Status LmdbWriteError(int rc, int fd, const std::string& what);

// The Status of any other LMDB return code (MDB_NOTFOUND -> NotFound, MDB_CORRUPTED and friends
// -> DataLoss, MDB_MAP_FULL / MDB_READERS_FULL -> ResourceExhausted, errno values as errno).
Status LmdbError(int rc, const std::string& what);

}  // namespace loongforge::data::internal
