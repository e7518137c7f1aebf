// Tests of the record store's edges: damaged data.mdb files refused before mapping, the LMDB
// meta reader checked against LMDB itself, outputs that are never a user's folder, the writer
// lock, and token records checked against the vocabulary.
#include <gtest/gtest.h>
#include <lmdb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

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

// Guards issue 21 #2: a data.mdb cut short (an interrupted copy) is DataLoss naming the file and
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

// Guards issue 21 #2: a 0-byte data.mdb is DataLoss "empty" naming it (was "Internal: Bad file
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

// Guards issue 21 #1: overwrite replaces only a LoongForge DB; a user's folder (with a file in it),
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

// Guards issue 21 #1: a user's folder named like the old staging directory ("<out>.partial") is
// never touched by a writer; the staging directory is a new, unique one.
TEST_F(RecordStoreTest, UserPartialFolderIsKept) {
  const fs::path partial = fs::path(dir_) / "db.partial";
  fs::create_directories(partial);
  WriteAll(partial / "notes.txt", "mine");
  std::string db = Db(Small());
  EXPECT_TRUE(RecordReader::Open(db).ok());
  EXPECT_EQ(ReadAll(partial / "notes.txt"), "mine");
}

// Guards issue 21 #9: two writers to one output cannot both run; the second fails at Create with
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

// Guards issue 21 #8: token ids outside [0, vocab_size) are DataLoss naming the record and id.
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
