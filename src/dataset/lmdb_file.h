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
  uint32_t page_size = 0;  // mm_dbs[FREE_DBI].md_pad
  uint64_t map_size = 0;   // mm_mapsize
  uint64_t last_page = 0;  // mm_last_pg: last page number in use
  uint64_t txnid = 0;      // mm_txnid: the meta with the larger one is current
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
StatusOr<LmdbFileInfo> CheckLmdbDataFile(const std::string& data_mdb);

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
