// The LoongForge record store: an LMDB environment holding one robot-learning dataset.
//
// Layout (docs/DATASET.md has the full description):
//   "__schema__"                 JSON Schema record (below); written last, so a DB without it is
//                                incomplete and refused by readers
//   "{sample_id:08d}_cam_{name}" JPEG bytes of that camera's frame
//   "{sample_id:08d}_tokens"     int32 little-endian token ids of the instruction (no padding)
//   "{sample_id:08d}_state"      float32[state_dim]
//   "{sample_id:08d}_action"     float32[action_horizon * action_dim], row-major by future step
//   "{sample_id:08d}_amask"      uint8[action_horizon]: 1 where the future step exists in the
//   episode
//   "{sample_id:08d}_meta"       int32[2]: episode index, step index
//   "{sample_id:08d}_task"       UTF-8 text of the instruction the tokens encode (DBs packed
//                                before it have none: Note [Task text] in src/data/loader.cc)
//
// Readers open the environment read-only with MDB_NOLOCK|MDB_RDONLY semantics suitable after
// fork (no lock file writes, each reader thread its own read transaction) and get values as
// zero-copy views into the memory map, valid while the read transaction that produced them lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loongforge/status.h"

namespace loongforge::data {

constexpr int kDatasetFormatVersion = 1;
constexpr const char* kSchemaKey = "__schema__";

struct Schema {
  int format_version = kDatasetFormatVersion;
  int64_t num_samples = 0;
  int64_t num_episodes = 0;
  std::vector<std::string> cameras;  // camera names, in key order
  int image_width = 0, image_height = 0;
  int state_dim = 0, action_dim = 0;
  int action_horizon = 16;
  std::string tokenizer = "byte-v1";
  int vocab_size = 0;
  int max_tokens = 0;  // longest token sequence in the DB
  // Normalization statistics over all samples, per dimension.
  std::vector<float> state_mean, state_std, action_mean, action_std;
  std::vector<float> state_min, state_max, action_min, action_max;
  std::string source;  // where it was packed from (informational)
  // Set by `pack --from-lerobot` (empty / 0 for an episode-folder pack, and then not serialized):
  std::string source_format;  // "lerobot v2.0", "lerobot v2.1", "lerobot v3.0"
  double fps = 0;
  std::vector<float> state_q01, state_q99, action_q01, action_q99;  // 1st / 99th percentiles
  // JSON object: the import's episode table (LeRobot episode_index, first sample, length), task
  // texts, camera -> LeRobot video key, GR00T modality slices (lerobot_import.h).
  std::string source_meta;

  std::string ToJson() const;
  static StatusOr<Schema> FromJson(std::string_view json, const std::string& where);
};

// Key helpers: "{sample_id:08d}_{modality}".
std::string SampleKey(int64_t sample_id, std::string_view modality);
std::string CameraModality(std::string_view camera);  // "cam_<camera>"

// Read-only view of a packed DB.
class RecordReader {
 public:
  // Opens `path` (the LMDB directory). Returns NotFound if missing, FailedPrecondition if the DB
  // is incomplete (no schema record, or a pack of it is still running or was interrupted),
  // DataLoss naming data.mdb if the file is empty, not LMDB, or shorter than its LMDB meta pages
  // say (checked before the file is mapped, so a truncated copy never raises SIGBUS), DataLoss if
  // the schema cannot be parsed, has a field of the wrong type, names a camera twice, or claims
  // more samples than the DB holds (naming the field and both values), PermissionDenied when the
  // folder cannot be read.
  // `max_readers` bounds concurrent read transactions (threads x processes).
  static StatusOr<std::unique_ptr<RecordReader>> Open(const std::string& path,
                                                      int max_readers = 256);
  ~RecordReader();

  const Schema& schema() const { return schema_; }
  const std::string& path() const { return path_; }
  int64_t size_bytes() const;  // size of the data file

  // A read transaction. Views returned by Get() point into the memory map and stay valid until
  // the transaction is destroyed. One transaction per thread at a time; not shareable.
  class Txn {
   public:
    ~Txn();
    Txn(Txn&&) noexcept;
    Txn(const Txn&) = delete;
    // NotFound (naming the key) when absent.
    StatusOr<std::string_view> Get(std::string_view key) const;
    // Resets and renews the snapshot (cheap; use between batches to let writers reclaim pages).
    Status Renew();

   private:
    friend class RecordReader;
    explicit Txn(void* txn, unsigned dbi, const std::string* path, const RecordReader* reader)
        : txn_(txn), dbi_(dbi), path_(path), reader_(reader) {}
    void* txn_;
    unsigned dbi_;
    const std::string* path_;
    const RecordReader* reader_;
  };
  // Checks data.mdb first (CheckUnchanged): DataLoss when it changed since Open.
  StatusOr<Txn> Begin() const;

  // Every key in order (for inspect / tests). Walks and checks the B-tree pages first, so a
  // damaged data.mdb is DataLoss naming the page rather than a crash.
  StatusOr<std::vector<std::string>> Keys() const;

  // DataLoss naming data.mdb when the file was truncated, rewritten or replaced since Open
  // (size, LMDB meta pages); Begin() and Txn::Renew() call it.
  Status CheckUnchanged() const;

 private:
  RecordReader() = default;
  static Status CheckSchemaRecords(void* txn, unsigned dbi, const Schema& s,
                                   const std::string& path);
  std::string path_, data_file_;
  int64_t opened_bytes_ = 0;
  uint64_t opened_txnid_ = 0, opened_last_page_ = 0;
  void* env_ = nullptr;
  unsigned dbi_ = 0;
  Schema schema_;
};

// Writes a DB (Note [Outputs are created, never followed] in src/common/file_util.h).
//
// Create() takes an exclusive lock on `path` (flock on the file "<path>.lock", removed again when
// the writer ends), so a second writer to the same path fails at once with Unavailable, and
// stages the DB in a new directory "<path>.partial.XXXXXX" (mkdtemp: a unique name, never a
// folder that existed before). Records are buffered into write transactions of 512 puts; nothing
// is visible at `path` until Commit(schema) has written the schema record, synced the file, and
// renamed the staging directory to `path`.
//
// `path` must not exist, or, with `overwrite`, must be a LoongForge DB: a directory holding only
// data.mdb (and LMDB's lock.mdb) whose data.mdb is a readable LMDB file with a __schema__ record.
// Anything else (a user's folder or file, a symlink, '.', a damaged DB) is refused with
// AlreadyExists saying why, and left untouched. A replaced DB is swapped out atomically at Commit
// and only then removed. Staging directories left by a killed writer of the same path are removed
// by the next Create (they are recognised by name and content).
// Errors name the file: ResourceExhausted for a full disk, a quota or a file-size limit (also
// when LMDB reports them as a short write, EIO), other write errors as errno.
class RecordWriter {
 public:
  static StatusOr<std::unique_ptr<RecordWriter>> Create(const std::string& path,
                                                        bool overwrite = false,
                                                        int64_t map_size_bytes = int64_t{1} << 40);
  ~RecordWriter();  // without Commit(): aborts, removes the staging directory, releases the lock
  Status Put(std::string_view key, std::string_view value);
  Status Commit(const Schema& schema);
  int64_t bytes_written() const { return bytes_; }

 private:
  RecordWriter() = default;
  Status FlushTxn();
  Status WriteError(int rc, const std::string& what) const;
  Status Publish();
  std::string path_, staging_, lock_path_;
  int lock_fd_ = -1;
  bool overwrite_ = false;
  void* env_ = nullptr;
  void* txn_ = nullptr;
  unsigned dbi_ = 0;
  int pending_ = 0;
  int64_t bytes_ = 0;
  bool committed_ = false;
};

// Checks a "{sample_id:08d}_tokens" record read from the DB at `db_path`: a whole number of int32
// ids, each in [0, schema.vocab_size) (only >= 0 when the schema has no vocab_size). A reader
// calls it before the ids reach an embedding table. DataLoss naming the DB, the key, the bad id
// and its position.
Status CheckTokens(std::string_view record, const Schema& schema, const std::string& db_path,
                   std::string_view key);

}  // namespace loongforge::data
