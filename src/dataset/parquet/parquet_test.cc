// Tests of the Parquet reader.
//
// Real files (made by pyarrow, with their values as pyarrow reads them) are checked by
// tests/python/test_parquet.py. Here small files are assembled byte by byte, so that each encoding
// edge case (RLE and bit-packed runs, levels of lists, page v2, dictionaries) has values known by
// construction, and so that each kind of corruption can be made precisely.
#include "dataset/parquet/parquet.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace loongforge::data::parquet {
namespace {

// ---- a thrift compact encoder, just enough for the structs below ----
class Thrift {
 public:
  std::string out;
  void Byte(uint8_t b) { out.push_back(static_cast<char>(b)); }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      Byte(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    Byte(static_cast<uint8_t>(v));
  }
  void Zz(int64_t v) { Varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void Field(int16_t id, int type) {
    int delta = id - last_;
    if (delta > 0 && delta <= 15) {
      Byte(static_cast<uint8_t>(delta << 4 | type));
    } else {
      Byte(static_cast<uint8_t>(type));
      Zz(id);
    }
    last_ = id;
  }
  void I32(int16_t id, int64_t v) { Field(id, 5), Zz(v); }
  void I64(int16_t id, int64_t v) { Field(id, 6), Zz(v); }
  void Bin(int16_t id, const std::string& s) { Field(id, 8), Varint(s.size()), out += s; }
  void Bool(int16_t id, bool v) { Field(id, v ? 1 : 2); }
  void Begin(int16_t id) { Field(id, 12), Push(); }
  void Push() { stack_.push_back(last_), last_ = 0; }
  void End() { Byte(0), last_ = stack_.back(), stack_.pop_back(); }
  void List(int16_t id, int elem_type, int n) {
    Field(id, 9);
    if (n < 15) {
      Byte(static_cast<uint8_t>(n << 4 | elem_type));
    } else {
      Byte(static_cast<uint8_t>(0xF0 | elem_type));
      Varint(static_cast<uint64_t>(n));
    }
  }

 private:
  int16_t last_ = 0;
  std::vector<int16_t> stack_;
};

// ---- encodings ----
std::string Le32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string RleRun(uint32_t value, int count, int width) {
  Thrift t;
  t.Varint(static_cast<uint64_t>(count) << 1);
  for (int k = 0; k < (width + 7) / 8; ++k) t.Byte(static_cast<uint8_t>(value >> (8 * k)));
  return t.out;
}
// A bit-packed run; values are padded with zeros to a multiple of 8.
std::string BitPacked(std::vector<uint32_t> v, int width) {
  while (v.size() % 8) v.push_back(0);
  Thrift t;
  t.Varint((v.size() / 8) << 1 | 1);
  std::string bytes(v.size() * width / 8, '\0');
  size_t bit = 0;
  for (uint32_t x : v) {
    for (int k = 0; k < width; ++k, ++bit) {
      if ((x >> k) & 1) bytes[bit / 8] = static_cast<char>(bytes[bit / 8] | (1 << (bit % 8)));
    }
  }
  return t.out + bytes;
}
std::string WithLen(const std::string& s) { return Le32(static_cast<uint32_t>(s.size())) + s; }
std::string PlainI32(std::vector<int32_t> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string PlainF32(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string PlainStr(std::vector<std::string> v) {
  std::string s;
  for (auto& x : v) s += WithLen(x);
  return s;
}

// ---- a file builder: one row group; each leaf column is a list of pages ----
struct SchemaNode {
  int type;  // -1: group
  int repetition;
  std::string name;
  int num_children = 0;
  int converted = -1;
};
struct Page {
  int type = 0;  // 0 DATA_PAGE, 2 DICTIONARY_PAGE, 3 DATA_PAGE_V2
  std::string body;
  int num_values = 0;
  int encoding = 0;
  int num_nulls = 0, num_rows = 0, def_bytes = 0, rep_bytes = 0;  // v2
  bool crc = false;
  int crc_delta = 0;  // added to the correct CRC (non-zero corrupts it)
};
struct Leaf {
  int type;
  std::vector<std::string> path;
  std::vector<Page> pages;
  int64_t num_values;
  int64_t size_delta = 0;  // added to total_compressed_size
};

uint32_t TestCrc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char ch : s) {
    c ^= ch;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

std::string PageBytes(const Page& p) {
  Thrift h;
  h.I32(1, p.type);
  h.I32(2, static_cast<int64_t>(p.body.size()));
  h.I32(3, static_cast<int64_t>(p.body.size()));
  if (p.crc) h.I32(4, static_cast<int32_t>(TestCrc32(p.body) + p.crc_delta));
  if (p.type == 0) {
    h.Begin(5);
    h.I32(1, p.num_values), h.I32(2, p.encoding), h.I32(3, 3), h.I32(4, 3);
    h.End();
  } else if (p.type == 2) {
    h.Begin(7);
    h.I32(1, p.num_values), h.I32(2, 0);
    h.End();
  } else {
    h.Begin(8);
    h.I32(1, p.num_values), h.I32(2, p.num_nulls), h.I32(3, p.num_rows), h.I32(4, p.encoding);
    h.I32(5, p.def_bytes), h.I32(6, p.rep_bytes), h.Bool(7, false);
    h.End();
  }
  h.Byte(0);
  return h.out + p.body;
}

std::string BuildFile(const std::vector<SchemaNode>& schema, const std::vector<Leaf>& leaves,
                      int64_t num_rows) {
  std::string data = "PAR1";
  std::vector<int64_t> offsets, sizes;
  for (const auto& l : leaves) {
    offsets.push_back(static_cast<int64_t>(data.size()));
    size_t start = data.size();
    for (const auto& p : l.pages) data += PageBytes(p);
    sizes.push_back(static_cast<int64_t>(data.size() - start) + l.size_delta);
  }
  Thrift m;
  m.I32(1, 1);
  m.List(2, 12, static_cast<int>(schema.size()));
  for (const auto& e : schema) {
    m.Push();
    if (e.type >= 0) m.I32(1, e.type);
    m.I32(3, e.repetition);
    m.Bin(4, e.name);
    if (e.num_children) m.I32(5, e.num_children);
    if (e.converted >= 0) m.I32(6, e.converted);
    m.End();
  }
  m.I64(3, num_rows);
  m.List(4, 12, 1);
  m.Push();  // RowGroup
  m.List(1, 12, static_cast<int>(leaves.size()));
  for (size_t i = 0; i < leaves.size(); ++i) {
    const Leaf& l = leaves[i];
    bool has_dict = !l.pages.empty() && l.pages[0].type == 2;
    m.Push();  // ColumnChunk
    m.I64(2, offsets[i]);
    m.Begin(3);  // ColumnMetaData
    m.I32(1, l.type);
    m.List(2, 5, 1), m.Zz(0);
    m.List(3, 8, static_cast<int>(l.path.size()));
    for (auto& s : l.path) m.Varint(s.size()), m.out += s;
    m.I32(4, 0);
    m.I64(5, l.num_values);
    m.I64(6, sizes[i]);
    m.I64(7, sizes[i]);
    m.I64(9, offsets[i] + (has_dict ? static_cast<int64_t>(PageBytes(l.pages[0]).size()) : 0));
    if (has_dict) m.I64(11, offsets[i]);
    m.End();
    m.End();
  }
  m.I64(2, static_cast<int64_t>(data.size()));
  m.I64(3, num_rows);
  m.End();
  m.Byte(0);
  return data + m.out + Le32(static_cast<uint32_t>(m.out.size())) + "PAR1";
}

class ParquetTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes, const std::string& name = "t.parquet") {
    std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  void SetUp() override {
    char tmpl[] = "/tmp/lf_parquet_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

// An optional INT32 column: def levels as an RLE run then a bit-packed run (5 of 8 used).
std::string OptionalInt32File() {
  // rows: 7, null, null, null, 8, null, 9, 10, 11  (def: 1,0,0,0 | 1,0,1,1,1)
  std::string def = RleRun(1, 1, 1) + RleRun(0, 3, 1) + BitPacked({1, 0, 1, 1, 1}, 1);
  Page p;
  p.body = WithLen(def) + PlainI32({7, 8, 9, 10, 11});
  p.num_values = 9;
  p.crc = true;
  return BuildFile({{-1, 0, "schema", 1}, {1, 1, "x"}}, {{1, {"x"}, {p}, 9}}, 9);
}

// Guards level decoding across RLE and bit-packed runs, null slots and CRC checking.
TEST_F(ParquetTest, OptionalInt32WithMixedRuns) {
  auto r = ReadParquet(Write(OptionalInt32File()));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  const Column& c = (*r)[0];
  EXPECT_EQ(c.name, "x");
  EXPECT_EQ(c.kind, Column::Kind::kInt64);
  EXPECT_FALSE(c.is_list);
  EXPECT_EQ(c.i64, (std::vector<int64_t>{7, 0, 0, 0, 8, 0, 9, 10, 11}));
  EXPECT_EQ(c.valid, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 1, 1, 1}));
  EXPECT_EQ(*ParquetNumRows(Write(OptionalInt32File())), 9);
}

// Guards dictionary decoding (bit width 2): a bit-packed run, an RLE run, and a last bit-packed run
// padded to 8 slots of which 2 are used; the dictionary page precedes the data page.
TEST_F(ParquetTest, DictionaryStringsBitPackedAndRle) {
  Page dict;
  dict.type = 2;
  dict.body = PlainStr({"pick", "place", "", "push"});
  dict.num_values = 4;
  Page data;
  data.encoding = 8;  // RLE_DICTIONARY
  data.num_values = 14;
  data.body = std::string(1, '\x02') + BitPacked({3, 0, 1, 2, 1, 0, 3, 3}, 2) + RleRun(1, 4, 2) +
              BitPacked({2, 0}, 2);  // last run padded to 8 slots, 2 used
  auto bytes = BuildFile({{-1, 0, "schema", 1}, {6, 0, "task", 0, 0}},
                         {{6, {"task"}, {dict, data}, 14}}, 14);
  auto r = ReadParquet(Write(bytes));
  ASSERT_TRUE(r.ok()) << r.status();
  const Column& c = (*r)[0];
  EXPECT_EQ(c.kind, Column::Kind::kString);
  EXPECT_TRUE(c.valid.empty());
  EXPECT_EQ(c.str,
            (std::vector<std::string>{"push", "pick", "place", "", "place", "pick", "push", "push",
                                      "place", "place", "place", "place", "", "pick"}));
}

// The three-level LIST schema pyarrow writes for list<float> / fixed_size_list<float>[N].
std::vector<SchemaNode> ListSchema() {
  return {{-1, 0, "schema", 1},
          {-1, 1, "observation.state", 1, 3},
          {-1, 2, "list", 1},
          {4, 1, "element"}};
}

// Guards list assembly from rep/def levels: rows [1.5, -2], [], [null, 3], [0.25] (def: 3 value,
// 2 null element, 1 empty list).
TEST_F(ParquetTest, ThreeLevelListWithEmptyRowAndNullElement) {
  std::string rep = BitPacked({0, 1, 0, 0, 1, 0}, 1);
  std::string def = BitPacked({3, 3, 1, 2, 3, 3}, 2);
  Page p;
  p.body = WithLen(rep) + WithLen(def) + PlainF32({1.5f, -2.0f, 3.0f, 0.25f});
  p.num_values = 6;
  auto bytes = BuildFile(ListSchema(), {{4, {"observation.state", "list", "element"}, {p}, 6}}, 4);
  auto r = ReadParquet(Write(bytes), {"observation.state"});
  ASSERT_TRUE(r.ok()) << r.status();
  const Column& c = (*r)[0];
  EXPECT_TRUE(c.is_list);
  EXPECT_EQ(c.kind, Column::Kind::kDouble);
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{0, 2, 2, 4, 5}));
  EXPECT_EQ(c.f64, (std::vector<double>{1.5, -2.0, 0.0, 3.0, 0.25}));
  EXPECT_EQ(c.valid, (std::vector<uint8_t>{1, 1, 0, 1, 1}));
}

// Guards data page v2: levels stored before the values, uncompressed and without length prefixes;
// values split over two pages.
TEST_F(ParquetTest, DataPageV2ListAcrossPages) {
  auto page = [](std::vector<uint32_t> rep, std::vector<uint32_t> def, std::vector<float> v) {
    Page p;
    p.type = 3;
    std::string r = BitPacked(rep, 1), d = BitPacked(def, 2);
    p.body = r + d + PlainF32(v);
    p.rep_bytes = static_cast<int>(r.size());
    p.def_bytes = static_cast<int>(d.size());
    p.num_values = static_cast<int>(rep.size());
    p.num_rows = 0;
    for (auto x : rep) p.num_rows += x == 0;
    return p;
  };
  Page a = page({0, 1, 1, 0, 1, 1}, {3, 3, 3, 3, 3, 3}, {1, 2, 3, 4, 5, 6});
  Page b = page({0, 1, 1}, {3, 3, 3}, {7, 8, 9});
  auto bytes =
      BuildFile(ListSchema(), {{4, {"observation.state", "list", "element"}, {a, b}, 9}}, 3);
  auto r = ReadParquet(Write(bytes));
  ASSERT_TRUE(r.ok()) << r.status();
  const Column& c = (*r)[0];
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(c.f64, (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(c.valid.empty());
}

// Guards a required BOOLEAN column (PLAIN bit-packed values, no levels) and column selection.
TEST_F(ParquetTest, RequiredBooleanAndColumnSelection) {
  Page pb;
  pb.body = std::string(1, static_cast<char>(0b0101101)) + std::string(1, '\x01');
  pb.num_values = 9;
  Page pi;
  pi.body = PlainI32({-1, 2, -3, 4, -5, 6, -7, 8, -9});
  pi.num_values = 9;
  auto bytes = BuildFile({{-1, 0, "schema", 2}, {0, 0, "flag"}, {1, 0, "n"}},
                         {{0, {"flag"}, {pb}, 9}, {1, {"n"}, {pi}, 9}}, 9);
  std::string path = Write(bytes);
  auto names = ParquetColumnNames(path);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"flag", "n"}));
  auto r = ReadParquet(path, {"n", "flag"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].name, "n");
  EXPECT_EQ((*r)[0].i64, (std::vector<int64_t>{-1, 2, -3, 4, -5, 6, -7, 8, -9}));
  EXPECT_EQ((*r)[1].kind, Column::Kind::kBool);
  EXPECT_EQ((*r)[1].b, (std::vector<uint8_t>{1, 0, 1, 1, 0, 1, 0, 0, 1}));
}

// ---- bad input: each error names the file (and the column) ----
void ExpectError(const StatusOr<std::vector<Column>>& r, StatusCode code,
                 const std::vector<std::string>& parts) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  for (const auto& p : parts)
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << r.status();
}

// Guards truncation at every length: never a crash or a value, always DataLoss naming the file.
TEST_F(ParquetTest, TruncatedFileIsDataLoss) {
  std::string bytes = OptionalInt32File();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string p = Write(bytes.substr(0, n));
    auto r = ReadParquet(p);
    ASSERT_FALSE(r.ok()) << "length " << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status();
  }
}

// Guards the magic check at both ends.
TEST_F(ParquetTest, BadMagicIsDataLoss) {
  std::string bytes = OptionalInt32File();
  bytes[bytes.size() - 1] = 'X';
  std::string p = Write(bytes);
  ExpectError(ReadParquet(p), StatusCode::kDataLoss, {p, "PAR1"});
  bytes = OptionalInt32File();
  bytes[0] = 'X';
  ExpectError(ReadParquet(Write(bytes)), StatusCode::kDataLoss, {"PAR1", "start"});
}

// Guards a footer length past the file and a footer that does not parse.
TEST_F(ParquetTest, CorruptFooterIsDataLoss) {
  std::string bytes = OptionalInt32File();
  std::string bad = bytes;
  uint32_t huge = 1u << 30;
  std::memcpy(&bad[bad.size() - 8], &huge, 4);
  std::string p = Write(bad);
  ExpectError(ReadParquet(p), StatusCode::kDataLoss, {p, "footer length"});
  uint32_t len;
  std::memcpy(&len, &bytes[bytes.size() - 8], 4);
  bad = bytes;
  for (size_t i = bytes.size() - 8 - len; i < bytes.size() - 8; ++i) bad[i] = '\x19';  // lists
  ExpectError(ReadParquet(Write(bad)), StatusCode::kDataLoss, {"footer"});
}

// Guards the page CRC: a flipped bit in the values is caught, not returned as a value.
TEST_F(ParquetTest, CorruptPageChecksumIsDataLoss) {
  std::string bytes = OptionalInt32File();
  size_t pos = bytes.find(PlainI32({7, 8, 9, 10, 11}));
  ASSERT_NE(pos, std::string::npos);
  bytes[pos] ^= 1;
  std::string p = Write(bytes);
  ExpectError(ReadParquet(p), StatusCode::kDataLoss, {p, "column 'x'", "checksum"});
}

// Guards page sizes: a page larger than its column chunk and a chunk that ends before its values.
TEST_F(ParquetTest, CorruptPageSizeIsDataLoss) {
  Page p;
  p.body = PlainI32({1, 2, 3});
  p.num_values = 3;
  auto bytes = BuildFile({{-1, 0, "schema", 1}, {1, 0, "n"}}, {{1, {"n"}, {p}, 3, -4}}, 3);
  ExpectError(ReadParquet(Write(bytes)), StatusCode::kDataLoss, {"column 'n'", "page size"});
  p.num_values = 4;  // the page claims a value its bytes do not hold
  bytes = BuildFile({{-1, 0, "schema", 1}, {1, 0, "n"}}, {{1, {"n"}, {p}, 4}}, 4);
  ExpectError(ReadParquet(Write(bytes)), StatusCode::kDataLoss, {"column 'n'", "fewer INT32"});
}

// Guards dictionary indices past the dictionary (would otherwise read out of bounds).
TEST_F(ParquetTest, DictionaryIndexOutOfRangeIsDataLoss) {
  Page dict;
  dict.type = 2;
  dict.body = PlainStr({"a", "b"});
  dict.num_values = 2;
  Page data;
  data.encoding = 8;
  data.body = std::string(1, '\x02') + RleRun(3, 2, 2);
  data.num_values = 2;
  auto bytes = BuildFile({{-1, 0, "schema", 1}, {6, 0, "s"}}, {{6, {"s"}, {dict, data}, 2}}, 2);
  ExpectError(ReadParquet(Write(bytes)), StatusCode::kDataLoss, {"column 's'", "index 3"});
}

// Guards refusal of unsupported features, naming the column and the feature.
TEST_F(ParquetTest, UnsupportedFeaturesAreUnimplemented) {
  Page p;
  p.body = std::string(24, '\0');
  p.num_values = 2;
  auto int96 = BuildFile({{-1, 0, "schema", 1}, {3, 0, "ts"}}, {{3, {"ts"}, {p}, 2}}, 2);
  std::string path = Write(int96);
  ExpectError(ReadParquet(path), StatusCode::kUnimplemented, {path, "column 'ts'", "INT96"});

  Page d;
  d.encoding = 5;  // DELTA_BINARY_PACKED
  d.body = std::string(8, '\0');
  d.num_values = 2;
  auto delta = BuildFile({{-1, 0, "schema", 1}, {2, 0, "i"}}, {{2, {"i"}, {d}, 2}}, 2);
  ExpectError(ReadParquet(Write(delta)), StatusCode::kUnimplemented,
              {"column 'i'", "DELTA_BINARY_PACKED"});

  // struct<a: int32, b: int32>: refused when asked for, while other columns still read.
  Page a;
  a.body = WithLen(RleRun(1, 1, 1)) + PlainI32({5});
  a.num_values = 1;
  Page n;
  n.body = PlainI32({42});
  n.num_values = 1;
  auto nested =
      BuildFile({{-1, 0, "schema", 2}, {-1, 1, "s", 2}, {1, 1, "a"}, {1, 1, "b"}, {1, 0, "n"}},
                {{1, {"s", "a"}, {a}, 1}, {1, {"s", "b"}, {a}, 1}, {1, {"n"}, {n}, 1}}, 1);
  path = Write(nested);
  ExpectError(ReadParquet(path), StatusCode::kUnimplemented, {path, "column 's'", "nested struct"});
  auto ok = ReadParquet(path, {"n"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].i64, std::vector<int64_t>{42});
}

// Guards the missing-file and missing-column errors.
TEST_F(ParquetTest, MissingFileAndColumnAreNotFound) {
  ExpectError(ReadParquet(dir_ + "/nope.parquet"), StatusCode::kNotFound, {"nope.parquet"});
  std::string p = Write(OptionalInt32File());
  ExpectError(ReadParquet(p, {"y"}), StatusCode::kNotFound, {p, "'y'"});
}

}  // namespace
}  // namespace loongforge::data::parquet
