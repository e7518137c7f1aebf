// LMDB-backed record store: zero-copy reads from the memory map, atomic publication of new DBs.
// See include/loongforge/dataset.h for the layout.
#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "loongforge/dataset.h"
#include "loongforge/logging.h"

namespace loongforge::data {
namespace fs = std::filesystem;
namespace {

Status LmdbError(int rc, const std::string& what) {
  std::string msg = what + ": " + mdb_strerror(rc);
  switch (rc) {
    case MDB_NOTFOUND:
      return NotFoundError(msg);
    case MDB_MAP_FULL:
    case ENOSPC:
      return ResourceExhaustedError(msg);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
      return DataLossError(msg);
    case MDB_READERS_FULL:
      return ResourceExhaustedError(msg + " (raise max_readers)");
    case ENOENT:
      return NotFoundError(msg);
    default:
      return rc > 0 ? ErrnoToStatus(rc, what) : InternalError(msg);
  }
}

template <typename T>
Status ReadVec(const nlohmann::json& j, const char* field, std::vector<T>* out,
               const std::string& where) {
  if (!j.contains(field)) return Status::Ok();
  if (!j[field].is_array())
    return DataLossError(where + ": schema field '" + field + "' is not a list");
  *out = j[field].get<std::vector<T>>();
  return Status::Ok();
}

}  // namespace

std::string SampleKey(int64_t sample_id, std::string_view modality) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%08lld_", static_cast<long long>(sample_id));
  return std::string(buf).append(modality);
}

std::string CameraModality(std::string_view camera) { return std::string("cam_").append(camera); }

std::string Schema::ToJson() const {
  nlohmann::json j;
  j["format_version"] = format_version;
  j["num_samples"] = num_samples;
  j["num_episodes"] = num_episodes;
  j["cameras"] = cameras;
  j["image_width"] = image_width;
  j["image_height"] = image_height;
  j["state_dim"] = state_dim;
  j["action_dim"] = action_dim;
  j["action_horizon"] = action_horizon;
  j["tokenizer"] = tokenizer;
  j["vocab_size"] = vocab_size;
  j["max_tokens"] = max_tokens;
  j["state_mean"] = state_mean;
  j["state_std"] = state_std;
  j["state_min"] = state_min;
  j["state_max"] = state_max;
  j["action_mean"] = action_mean;
  j["action_std"] = action_std;
  j["action_min"] = action_min;
  j["action_max"] = action_max;
  j["source"] = source;
  return j.dump(2);
}

StatusOr<Schema> Schema::FromJson(std::string_view json, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return DataLossError(where + ": schema record is not valid JSON");
  Schema s;
  try {
    s.format_version = j.at("format_version").get<int>();
    if (s.format_version != kDatasetFormatVersion)
      return FailedPreconditionError(where + ": dataset format version " +
                                     std::to_string(s.format_version) + ", this build reads " +
                                     std::to_string(kDatasetFormatVersion));
    s.num_samples = j.at("num_samples").get<int64_t>();
    s.num_episodes = j.value("num_episodes", int64_t{0});
    s.cameras = j.at("cameras").get<std::vector<std::string>>();
    s.image_width = j.at("image_width").get<int>();
    s.image_height = j.at("image_height").get<int>();
    s.state_dim = j.at("state_dim").get<int>();
    s.action_dim = j.at("action_dim").get<int>();
    s.action_horizon = j.at("action_horizon").get<int>();
    s.tokenizer = j.at("tokenizer").get<std::string>();
    s.vocab_size = j.value("vocab_size", 0);
    s.max_tokens = j.value("max_tokens", 0);
    s.source = j.value("source", std::string());
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(where + ": schema record: " + e.what());
  }
  LF_RETURN_IF_ERROR(ReadVec(j, "state_mean", &s.state_mean, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "state_std", &s.state_std, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "state_min", &s.state_min, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "state_max", &s.state_max, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_mean", &s.action_mean, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_std", &s.action_std, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_min", &s.action_min, where));
  LF_RETURN_IF_ERROR(ReadVec(j, "action_max", &s.action_max, where));
  if (s.num_samples < 0 || s.state_dim < 0 || s.action_dim < 0 || s.action_horizon <= 0 ||
      s.cameras.empty())
    return DataLossError(where + ": schema record has invalid dimensions");
  return s;
}

// ---------------------------------------------------------------------------------------------
// RecordReader

StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path,
                                                           int max_readers) {
  std::error_code ec;
  if (!fs::exists(fs::path(path) / "data.mdb", ec)) {
    if (fs::exists(path + ".partial", ec))
      return FailedPreconditionError(path + ": dataset is still being written (" + path +
                                     ".partial exists) or its packing was interrupted");
    return NotFoundError(path + ": no LoongForge dataset (missing data.mdb)");
  }
  std::unique_ptr<RecordReader> r(new RecordReader());
  r->path_ = path;
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc) return LmdbError(rc, "mdb_env_create");
  r->env_ = env;
  mdb_env_set_maxreaders(env, static_cast<unsigned>(max_readers));
  // Read-only, no lock file: the DB is immutable once packed, so readers need no coordination,
  // and a process forked from the opener can open its own environment without touching locks.
  // MDB_NOTLS lets one thread hold several transactions.
  rc = mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS | MDB_NORDAHEAD, 0444);
  if (rc) return LmdbError(rc, "open dataset " + path);
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  if (rc) return LmdbError(rc, "begin read transaction on " + path);
  MDB_dbi dbi;
  rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  if (rc) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "open main database of " + path);
  }
  r->dbi_ = dbi;
  MDB_val k{std::strlen(kSchemaKey), const_cast<char*>(kSchemaKey)}, v;
  rc = mdb_get(txn, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) {
    mdb_txn_abort(txn);
    return FailedPreconditionError(path +
                                   ": dataset is incomplete (no __schema__ record); re-run pack");
  }
  if (rc) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "read __schema__ of " + path);
  }
  auto schema =
      Schema::FromJson(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size), path);
  mdb_txn_abort(txn);
  if (!schema.ok()) return schema.status();
  r->schema_ = std::move(schema).value();
  return r;
}

RecordReader::~RecordReader() {
  if (env_) mdb_env_close(static_cast<MDB_env*>(env_));
}

int64_t RecordReader::size_bytes() const {
  std::error_code ec;
  auto n = fs::file_size(fs::path(path_) / "data.mdb", ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

StatusOr<RecordReader::Txn> RecordReader::Begin() const {
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(static_cast<MDB_env*>(env_), nullptr, MDB_RDONLY, &txn);
  if (rc) return LmdbError(rc, "begin read transaction on " + path_);
  return Txn(txn, dbi_, &path_);
}

RecordReader::Txn::~Txn() {
  if (txn_) mdb_txn_abort(static_cast<MDB_txn*>(txn_));
}

RecordReader::Txn::Txn(Txn&& o) noexcept : txn_(o.txn_), dbi_(o.dbi_), path_(o.path_) {
  o.txn_ = nullptr;
}

StatusOr<std::string_view> RecordReader::Txn::Get(std::string_view key) const {
  MDB_val k{key.size(), const_cast<char*>(key.data())}, v;
  int rc = mdb_get(static_cast<MDB_txn*>(txn_), dbi_, &k, &v);
  if (rc == MDB_NOTFOUND)
    return NotFoundError(*path_ + ": missing record '" + std::string(key) + "'");
  if (rc) return LmdbError(rc, *path_ + ": read record '" + std::string(key) + "'");
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

Status RecordReader::Txn::Renew() {
  mdb_txn_reset(static_cast<MDB_txn*>(txn_));
  int rc = mdb_txn_renew(static_cast<MDB_txn*>(txn_));
  if (rc) return LmdbError(rc, "renew read transaction on " + *path_);
  return Status::Ok();
}

StatusOr<std::vector<std::string>> RecordReader::Keys() const {
  LF_ASSIGN_OR_RETURN(Txn txn, Begin());
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(static_cast<MDB_txn*>(txn.txn_), dbi_, &cur);
  if (rc) return LmdbError(rc, "open cursor on " + path_);
  std::vector<std::string> keys;
  MDB_val k, v;
  while ((rc = mdb_cursor_get(cur, &k, &v, keys.empty() ? MDB_FIRST : MDB_NEXT)) == 0)
    keys.emplace_back(static_cast<const char*>(k.mv_data), k.mv_size);
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND) return LmdbError(rc, "iterate keys of " + path_);
  return keys;
}

// ---------------------------------------------------------------------------------------------
// RecordWriter

StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Create(const std::string& path,
                                                             bool overwrite,
                                                             int64_t map_size_bytes) {
  std::error_code ec;
  if (fs::exists(path, ec) && !overwrite)
    return AlreadyExistsError(path + " already exists (pass overwrite to replace it)");
  std::unique_ptr<RecordWriter> w(new RecordWriter());
  w->path_ = path;
  w->staging_ = path + ".partial";
  fs::remove_all(w->staging_, ec);
  if (!fs::create_directories(w->staging_, ec) || ec)
    return ErrnoToStatus(ec ? ec.value() : EIO, "create " + w->staging_);
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc) return LmdbError(rc, "mdb_env_create");
  w->env_ = env;
  mdb_env_set_mapsize(env, static_cast<size_t>(map_size_bytes));
  // MDB_NOSYNC during the bulk load: Commit() does one mdb_env_sync(force) before publishing.
  rc = mdb_env_open(env, w->staging_.c_str(), MDB_NOSYNC | MDB_NOMETASYNC, 0644);
  if (rc) return LmdbError(rc, "create dataset in " + w->staging_);
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env, nullptr, 0, &txn);
  if (rc) return LmdbError(rc, "begin write transaction");
  MDB_dbi dbi;
  rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  if (rc) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "open main database");
  }
  w->dbi_ = dbi;
  w->txn_ = txn;
  return w;
}

RecordWriter::~RecordWriter() {
  if (txn_) mdb_txn_abort(static_cast<MDB_txn*>(txn_));
  if (env_) mdb_env_close(static_cast<MDB_env*>(env_));
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

Status RecordWriter::FlushTxn() {
  int rc = mdb_txn_commit(static_cast<MDB_txn*>(txn_));
  txn_ = nullptr;
  if (rc) return LmdbError(rc, "commit records to " + staging_);
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(static_cast<MDB_env*>(env_), nullptr, 0, &txn);
  if (rc) return LmdbError(rc, "begin write transaction");
  txn_ = txn;
  pending_ = 0;
  return Status::Ok();
}

Status RecordWriter::Put(std::string_view key, std::string_view value) {
  if (committed_ || !txn_) return FailedPreconditionError("RecordWriter used after Commit/failure");
  if (key == kSchemaKey) return InvalidArgumentError("the schema record is written by Commit()");
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  int rc = mdb_put(static_cast<MDB_txn*>(txn_), dbi_, &k, &v, 0);
  if (rc) {
    mdb_txn_abort(static_cast<MDB_txn*>(txn_));
    txn_ = nullptr;
    return LmdbError(rc, "write record '" + std::string(key) + "' to " + staging_);
  }
  bytes_ += static_cast<int64_t>(key.size() + value.size());
  if (++pending_ >= 512) return FlushTxn();
  return Status::Ok();
}

Status RecordWriter::Commit(const Schema& schema) {
  if (committed_ || !txn_) return FailedPreconditionError("RecordWriter used after Commit/failure");
  std::string js = schema.ToJson();
  MDB_val k{std::strlen(kSchemaKey), const_cast<char*>(kSchemaKey)};
  MDB_val v{js.size(), js.data()};
  int rc = mdb_put(static_cast<MDB_txn*>(txn_), dbi_, &k, &v, 0);
  if (rc) return LmdbError(rc, "write schema record to " + staging_);
  rc = mdb_txn_commit(static_cast<MDB_txn*>(txn_));
  txn_ = nullptr;
  if (rc) return LmdbError(rc, "commit " + staging_);
  rc = mdb_env_sync(static_cast<MDB_env*>(env_), 1);
  if (rc) return LmdbError(rc, "sync " + staging_);
  mdb_env_close(static_cast<MDB_env*>(env_));
  env_ = nullptr;
  // The lock file is not part of the dataset (readers open with MDB_NOLOCK).
  std::error_code ec;
  fs::remove(fs::path(staging_) / "lock.mdb", ec);
  if (fs::exists(path_, ec)) {
    fs::remove_all(path_, ec);
    if (ec) return ErrnoToStatus(ec.value(), "remove old " + path_);
  }
  if (::rename(staging_.c_str(), path_.c_str()) != 0)
    return ErrnoToStatus(errno, "rename " + staging_ + " to " + path_);
  std::string parent = fs::absolute(path_).parent_path().string();
  LF_RETURN_IF_ERROR(internal::SyncDir(parent));
  committed_ = true;
  return Status::Ok();
}

}  // namespace loongforge::data
