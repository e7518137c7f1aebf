// Tests of the record store's edges: damaged data.mdb files refused before mapping, the LMDB
// meta reader checked against LMDB itself, outputs that are never a user's folder, the writer
// lock, and token records checked against the vocabulary.
#include <gtest/gtest.h>
#include <lmdb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataset/lmdb_file.h"
#include "loongforge/dataset.h"
#include "test_dataset.h"

namespace loongforge::data {
namespace {
namespace fs = std::filesystem;

using RecordStoreTest = testing::TestDbFixture;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const fs::path& p, const std::string& data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << data;
}

testing::TestDbOptions Small() {
  testing::TestDbOptions o;
  o.samples = 24;
  o.width = 64;
  o.height = 48;
  return o;
}

// Guards the hand-written meta reader against LMDB's own view of the same file: page size, last
// page and map size must be what mdb_env_info / mdb_env_stat say (the offsets are not guessed).
TEST_F(RecordStoreTest, MetaReaderAgreesWithLmdb) {
  std::string db = Db(Small());
  auto info = internal::CheckLmdbDataFile(db + "/data.mdb");
  ASSERT_TRUE(info.ok()) << info.status();
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  ASSERT_EQ(mdb_env_open(env, db.c_str(), MDB_RDONLY | MDB_NOLOCK, 0444), 0);
  MDB_envinfo ei;
  MDB_stat st;
  mdb_env_info(env, &ei);
  mdb_env_stat(env, &st);
  const internal::LmdbMeta& m = info->meta[info->current];
  EXPECT_EQ(m.page_size, st.ms_psize);
  EXPECT_EQ(m.last_page, ei.me_last_pgno);
  EXPECT_EQ(m.txnid, ei.me_last_txnid);
  EXPECT_EQ(m.map_size, uint64_t{1} << 40);  // RecordWriter's map size, as stored
  EXPECT_GT(m.last_page, 4u);
  EXPECT_EQ(info->required_bytes, static_cast<int64_t>((m.last_page + 1) * m.page_size));
  EXPECT_EQ(info->file_bytes, static_cast<int64_t>(fs::file_size(db + "/data.mdb")));
  mdb_env_close(env);
}

// Guards: a data.mdb cut short (an interrupted copy) is DataLoss naming the file and
// both sizes at Open, not SIGBUS in the first reader that touches a page past the end.
TEST_F(RecordStoreTest, TruncatedDataFileIsDataLossAtOpen) {
  std::string db = Db(Small());
  const fs::path data = fs::path(db) / "data.mdb";
  const auto size = fs::file_size(data);
  for (auto keep : {size / 2, size - 4096, uint64_t{8192}, uint64_t{100}}) {
    fs::resize_file(data, keep);
    auto r = RecordReader::Open(db);
    ASSERT_FALSE(r.ok()) << "opened a data.mdb cut to " << keep << " of " << size << " bytes";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(data.string()), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status();
    if (keep >= 8192)
      EXPECT_NE(r.status().message().find(std::to_string(keep) + " bytes"), std::string::npos)
          << r.status();
  }
}

// Guards: a 0-byte data.mdb is DataLoss "empty" naming it (was "Internal: Bad file
// descriptor").
TEST_F(RecordStoreTest, EmptyDataFileIsDataLoss) {
  std::string db = Db(Small());
  fs::resize_file(fs::path(db) / "data.mdb", 0);
  auto r = RecordReader::Open(db);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("data.mdb: empty (0 bytes)"), std::string::npos)
      << r.status();
}

// Guards: a data.mdb that is not LMDB at all (bad magic), or whose second meta page is garbage,
// is DataLoss naming the file.
TEST_F(RecordStoreTest, NotLmdbIsDataLoss) {
  std::string db = Db(Small());
  const fs::path data = fs::path(db) / "data.mdb";
  auto info = internal::CheckLmdbDataFile(data.string());
  ASSERT_TRUE(info.ok()) << info.status();
  const size_t page = info->meta[0].page_size;
  std::string bytes = ReadAll(data);
  std::string bad = bytes;
  bad[16] ^= 0x55;  // mm_magic of meta page 0
  WriteAll(data, bad);
  auto r = RecordReader::Open(db);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("not an LMDB data file"), std::string::npos) << r.status();
  bad = bytes;
  bad[page + 10] = 0;  // page 1 loses its P_META flag
  WriteAll(data, bad);
  r = RecordReader::Open(db);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("page 1"), std::string::npos) << r.status();
}

// Guards: overwrite replaces only a LoongForge DB; a user's folder (with a file in it),
// a plain file, a symlink to a DB and '.' are refused and left exactly as they were.
TEST_F(RecordStoreTest, OverwriteRefusesWhatIsNotADataset) {
  const fs::path w = fs::path(dir_) / "w";
  fs::create_directories(w);
  WriteAll(w / "keep", "k");
  auto r = RecordWriter::Create(w.string(), /*overwrite=*/true);
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists) << r.status();
  EXPECT_NE(r.status().message().find("is not a LoongForge dataset"), std::string::npos);
  EXPECT_NE(r.status().message().find("'keep'"), std::string::npos) << r.status();
  EXPECT_EQ(ReadAll(w / "keep"), "k");

  const fs::path f = fs::path(dir_) / "file";
  WriteAll(f, "user data");
  EXPECT_EQ(RecordWriter::Create(f.string(), true).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadAll(f), "user data");

  // A folder holding a data.mdb that is not LMDB, and an LMDB file without a LoongForge schema.
  fs::create_directories(fs::path(dir_) / "fake");
  WriteAll(fs::path(dir_) / "fake" / "data.mdb", std::string(9000, 'x'));
  EXPECT_EQ(RecordWriter::Create(dir_ + "/fake", true).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(fs::file_size(fs::path(dir_) / "fake" / "data.mdb"), 9000u);

  std::string db = Db(Small());
  fs::create_symlink(db, fs::path(dir_) / "link");
  auto l = RecordWriter::Create(dir_ + "/link", true);
  EXPECT_EQ(l.status().code(), StatusCode::kAlreadyExists) << l.status();
  EXPECT_NE(l.status().message().find("symbolic link"), std::string::npos) << l.status();
  EXPECT_TRUE(fs::is_symlink(fs::path(dir_) / "link"));

  EXPECT_EQ(RecordWriter::Create(".", true).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RecordWriter::Create(dir_ + "/w/..", true).status().code(),
            StatusCode::kInvalidArgument);
  // Nothing was left next to them: no staging directory, no lock file.
  for (auto& e : fs::directory_iterator(dir_)) {
    std::string n = e.path().filename();
    EXPECT_EQ(n.find(".partial"), std::string::npos) << n;
    EXPECT_EQ(n.find(".lock"), std::string::npos) << n;
  }
}

// Guards the other half of the rule: a LoongForge DB is replaced with overwrite (atomically, the
// old one removed), and a trailing slash names the same DB.
TEST_F(RecordStoreTest, OverwriteReplacesADataset) {
  testing::TestDbOptions o = Small();
  std::string db = Db(o);
  o.samples = 7;
  ASSERT_TRUE(testing::MakeTestDb(db + "/", o).ok());
  auto r = RecordReader::Open(db);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->schema().num_samples, 7);
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"db"});
}

// Guards: an output whose parent folders do not exist yet gets them (as `mkdir -p`); a parent
// that is a file fails naming it, and leaves nothing behind.
TEST_F(RecordStoreTest, OutputParentFoldersAreMade) {
  const std::string db = dir_ + "/a/b/db";
  auto w = RecordWriter::Create(db);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Put("00000000_x", "y").ok());
  Schema s;
  s.cameras = {"c"};
  ASSERT_TRUE((*w)->Commit(s).ok());
  w->reset();
  EXPECT_TRUE(RecordReader::Open(db).ok());
  WriteAll(fs::path(dir_) / "file", "x");
  auto bad = RecordWriter::Create(dir_ + "/file/db");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(dir_ + "/file"), std::string::npos) << bad.status();
}

// Guards: a user's folder named like the old staging directory ("<out>.partial") is
// never touched by a writer; the staging directory is a new, unique one.
TEST_F(RecordStoreTest, UserPartialFolderIsKept) {
  const fs::path partial = fs::path(dir_) / "db.partial";
  fs::create_directories(partial);
  WriteAll(partial / "notes.txt", "mine");
  std::string db = Db(Small());
  EXPECT_TRUE(RecordReader::Open(db).ok());
  EXPECT_EQ(ReadAll(partial / "notes.txt"), "mine");
}

// Guards: two writers to one output cannot both run; the second fails at Create with
// Unavailable naming the output, and the first one's DB is published.
TEST_F(RecordStoreTest, SecondWriterToTheSameOutputFails) {
  const std::string db = dir_ + "/db";
  auto first = RecordWriter::Create(db);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = RecordWriter::Create(db, /*overwrite=*/true);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(db + " is being written by another"), std::string::npos)
      << second.status();
  ASSERT_TRUE((*first)->Put("00000000_x", "y").ok());
  Schema s;
  s.cameras = {"c"};
  ASSERT_TRUE((*first)->Commit(s).ok());
  first->reset();
  auto r = RecordReader::Open(db);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(fs::exists(db + ".lock"));
  // The lock is free again.
  EXPECT_EQ(RecordWriter::Create(db).status().code(), StatusCode::kAlreadyExists);
}

// Guards: a staging directory left by a killed writer makes readers say "being written or
// interrupted" (not "not found"), and the next writer of that output removes it.
TEST_F(RecordStoreTest, InterruptedWriterLeftovers) {
  const fs::path left = fs::path(dir_) / "db.partial.AbC123";
  fs::create_directories(left);
  WriteAll(left / "data.mdb", "half");
  auto r = RecordReader::Open(dir_ + "/db");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  std::string db = Db(Small());
  EXPECT_FALSE(fs::exists(left));
  EXPECT_TRUE(RecordReader::Open(db).ok());
}

// Guards: token ids outside [0, vocab_size) are DataLoss naming the record and id.
TEST(CheckTokens, OutOfVocabularyIsDataLoss) {
  Schema s;
  s.vocab_size = 259;
  s.tokenizer = "byte-v1";
  std::vector<int32_t> ok = {1, 258, 2}, big = {1, 259, 2}, neg = {1, -4};
  auto view = [](const std::vector<int32_t>& v) {
    return std::string_view(reinterpret_cast<const char*>(v.data()), 4 * v.size());
  };
  EXPECT_TRUE(CheckTokens(view(ok), s, "db", "00000003_tokens").ok());
  Status st = CheckTokens(view(big), s, "db", "00000003_tokens");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("db: record '00000003_tokens': token id 259 at position 1"),
            std::string::npos)
      << st;
  EXPECT_EQ(CheckTokens(view(neg), s, "db", "k").code(), StatusCode::kDataLoss);
  EXPECT_EQ(CheckTokens("abc", s, "db", "k").code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace loongforge::data

namespace loongforge::data {
namespace {

// Rewrites the DB at `src` into `dst` record by record, with `edit` applied to its schema and
// `record` to each record (returning false drops it): real LMDB files with a damaged schema.
template <typename Edit, typename Record = bool (*)(const std::string&, std::string*)>
std::string Rewrite(
    const std::string& src, const std::string& dst, Edit edit,
    Record record = [](const std::string&, std::string*) { return true; }) {
  auto r = RecordReader::Open(src);
  EXPECT_TRUE(r.ok()) << r.status();
  auto keys = (*r)->Keys();
  EXPECT_TRUE(keys.ok()) << keys.status();
  auto txn = (*r)->Begin();
  auto w = RecordWriter::Create(dst, true);
  EXPECT_TRUE(w.ok()) << w.status();
  for (const auto& k : *keys) {
    if (k == kSchemaKey) continue;
    std::string v(*txn->Get(k));
    if (record(k, &v)) EXPECT_TRUE((*w)->Put(k, v).ok());
  }
  Schema s = (*r)->schema();
  edit(s);
  EXPECT_TRUE((*w)->Commit(s).ok());
  return dst;
}

void ExpectDataLoss(const Status& s, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  for (const auto& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << p << ": " << s;
}

// Guards: a schema claiming far more samples than exist (1e12: the sampler allocated for them and
// aborted with bad_alloc) is DataLoss at Open naming the field and both counts; so is one sample
// too many (its records are missing).
TEST_F(RecordStoreTest, NumSamplesCheckedAgainstRecords) {
  const std::string db = Db(Small());
  const std::string huge = Rewrite(db, dir_ + "/huge", [](Schema& s) { s.num_samples = 1e12; });
  ExpectDataLoss(RecordReader::Open(huge).status(),
                 {huge, "'num_samples' is 1000000000000", "records"});
  const std::string one = Rewrite(db, dir_ + "/one", [](Schema& s) { s.num_samples += 1; });
  ExpectDataLoss(RecordReader::Open(one).status(), {"'num_samples' is 25", "'00000024_"});
  EXPECT_TRUE(RecordReader::Open(db).ok());
}

// Guards: a camera named twice, and a vocabulary of 0 ids, are DataLoss at Open naming the field.
TEST_F(RecordStoreTest, DuplicateCamerasAndZeroVocabulary) {
  const std::string db = Db(Small());
  const std::string dup = Rewrite(db, dir_ + "/dup", [](Schema& s) {
    s.cameras = {s.cameras[0], s.cameras[0]};
  });
  ExpectDataLoss(RecordReader::Open(dup).status(), {dup, "'cameras'", "'cam0' twice"});
  const std::string v0 = Rewrite(db, dir_ + "/v0", [](Schema& s) { s.vocab_size = 0; });
  ExpectDataLoss(RecordReader::Open(v0).status(), {v0, "'vocab_size' is 0"});
}

// Guards the fuzz finding: every schema field is type-checked; a wrong type is DataLoss naming
// the field and the value (a list of strings where numbers belong escaped as an nlohmann
// type_error and terminated the process).
TEST(SchemaJson, EveryFieldTypeChecked) {
  Schema s;
  s.cameras = {"c"};
  s.state_dim = 1;
  s.state_mean = {0.f};
  nlohmann::json good = nlohmann::json::parse(s.ToJson());
  ASSERT_TRUE(Schema::FromJson(good.dump(), "db").ok());
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"state_mean", nlohmann::json::array({"x"})},
      {"state_std", nlohmann::json::array({nullptr})},
      {"num_samples", "12"},
      {"num_samples", 1.5},
      {"image_width", 1e30},
      {"image_height", uint64_t{1} << 40},
      {"cameras", nlohmann::json::array({1})},
      {"tokenizer", 3},
      {"vocab_size", nlohmann::json::object()},
      {"fps", "fast"},
      {"source", nlohmann::json::array()},
      {"action_horizon", true},
  };
  for (const auto& [field, value] : bad) {
    nlohmann::json j = good;
    j[field] = value;
    auto r = Schema::FromJson(j.dump(), "db/x");
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << field << " " << value.dump();
    EXPECT_NE(r.status().message().find("'" + field + "'"), std::string::npos) << r.status();
  }
  for (const char* field : {"num_samples", "cameras", "state_dim", "tokenizer"}) {
    nlohmann::json j = good;
    j.erase(field);
    EXPECT_EQ(Schema::FromJson(j.dump(), "db").status().code(), StatusCode::kDataLoss) << field;
  }
}

// The current meta page's main root page number (LMDB 0.9 64-bit layout, lmdb_file.cc).
uint64_t MainRoot(const std::string& data, uint64_t* page_size) {
  auto info = internal::CheckLmdbDataFile(data);
  EXPECT_TRUE(info.ok()) << info.status();
  *page_size = info->meta[info->current].page_size;
  return info->meta[info->current].main_root;
}

void Patch(const std::string& file, int64_t at, const void* bytes, size_t n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(at);
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

// Guards the fuzz finding: a tree page whose node runs past the page (a key size of 65535) made
// mdb_cursor_get read outside the map (SIGSEGV in Keys); Keys now walks the tree first and
// returns DataLoss naming data.mdb and the page.
TEST_F(RecordStoreTest, DamagedTreePageIsDataLossInKeys) {
  const std::string db = Db(Small());
  const std::string data = db + "/data.mdb";
  uint64_t ps = 0;
  uint64_t pg = MainRoot(data, &ps);
  // Descend to the first leaf: branch nodes hold the child number in their first 6 bytes.
  for (;;) {
    std::string page(ps, '\0');
    std::ifstream in(data, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(pg * ps));
    in.read(page.data(), static_cast<std::streamsize>(ps));
    uint16_t flags, ptr0;
    std::memcpy(&flags, page.data() + 10, 2);
    std::memcpy(&ptr0, page.data() + 16, 2);
    if (flags & 0x02) {  // P_LEAF: key size of its first node
      const uint16_t big = 0xFFFF;
      Patch(data, static_cast<int64_t>(pg * ps + ptr0 + 6), &big, 2);
      break;
    }
    uint16_t lo, hi;
    std::memcpy(&lo, page.data() + ptr0, 2);
    std::memcpy(&hi, page.data() + ptr0 + 2, 2);
    pg = lo | (uint64_t{hi} << 16);
  }
  auto r = RecordReader::Open(db);
  if (!r.ok()) {  // the damaged leaf held the schema record
    ExpectDataLoss(r.status(), {});
    return;
  }
  ExpectDataLoss((*r)->Keys().status(), {data, "LMDB page " + std::to_string(pg)});
}

// Guards: a main root among the meta pages (a zeroed root pointer) made LMDB assert
// "root > 1" (abort); it is DataLoss at Open naming data.mdb.
TEST_F(RecordStoreTest, RootInMetaPagesIsDataLoss) {
  const std::string db = Db(Small());
  const std::string data = db + "/data.mdb";
  uint64_t ps = 0;
  MainRoot(data, &ps);
  const uint64_t one = 1;
  for (uint64_t meta = 0; meta < 2; ++meta) Patch(data, meta * ps + 16 + 112, &one, 8);
  ExpectDataLoss(RecordReader::Open(db).status(), {data, "main database root page 1"});
}

// Guards the live-loader findings: data.mdb truncated (SIGBUS) or overwritten with zeros (LMDB
// assertion) after Open is DataLoss naming the file at the next read transaction, before any
// page is touched.
TEST_F(RecordStoreTest, DataFileChangedUnderTheReader) {
  const std::string db = Db(Small());
  const std::string data = db + "/data.mdb";
  {
    auto r = RecordReader::Open(db);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*r)->Begin().ok());
    const auto size = fs::file_size(data);
    std::string zeros(size, '\0');
    Patch(data, 0, zeros.data(), zeros.size());
    ExpectDataLoss((*r)->Begin().status(), {data, "changed while the dataset was open"});
  }
  const std::string db2 = Db(Small(), "db2");
  auto r = RecordReader::Open(db2);
  ASSERT_TRUE(r.ok()) << r.status();
  auto txn = (*r)->Begin();
  ASSERT_TRUE(txn.ok());
  fs::resize_file(db2 + "/data.mdb", 8192);
  ExpectDataLoss((*r)->Begin().status(), {db2 + "/data.mdb", "changed while the dataset was open"});
  ExpectDataLoss(txn->Renew(), {"changed while the dataset was open"});
}

// Guards: a dataset folder the user may not read is PermissionDenied naming it, not NotFound
// "missing data.mdb". As root (who reads anything) the open runs in a child as user nobody.
TEST_F(RecordStoreTest, UnreadableFolderIsPermissionDenied) {
  const std::string db = Db(Small());
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::permissions(db, fs::perms::none);
  auto check = [&] {
    Status s = RecordReader::Open(db).status();
    return s.code() == StatusCode::kPermissionDenied && s.message().find(db) != std::string::npos;
  };
  if (::geteuid() != 0) {
    EXPECT_TRUE(check()) << RecordReader::Open(db).status();
  } else {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      ::_exit(check() ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  }
  fs::permissions(db, fs::perms::owner_all);
}

}  // namespace
}  // namespace loongforge::data
