// Parquet's file format as the reader sees it (private to src/dataset/parquet): the parquet.thrift
// enums and structs it uses, the file with its footer (thrift compact FileMetaData, decoded in
// parquet_format.cc), page headers, and the plan of each top-level field. Page and column decoding
// is in parquet.cc. Note [Parquet subset] in parquet.cc says what is supported.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge::data::parquet {

// ---- parquet.thrift enums (the values we use) ----
enum PhysicalType {
  kBoolean = 0,
  kInt32 = 1,
  kInt64 = 2,
  kInt96 = 3,
  kFloat = 4,
  kDouble = 5,
  kByteArray = 6,
  kFixedLenByteArray = 7
};
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum Encoding { kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kRleDictionary = 8 };
enum Codec {
  kUncompressed = 0,
  kSnappy = 1,
  kGzip = 2,
  kLzo = 3,
  kBrotli = 4,
  kLz4 = 5,
  kZstd = 6,
  kLz4Raw = 7
};
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
// ConvertedType values
enum Converted {
  kCvUtf8 = 0,
  kCvMap = 1,
  kCvMapKeyValue = 2,
  kCvList = 3,
  kCvDecimal = 5,
  kCvUint8 = 11,
  kCvUint16 = 12,
  kCvUint32 = 13,
  kCvUint64 = 14,
  kCvInterval = 21
};

// Names for error messages ("unknown type", "encoding 42", "codec 9" past the known ones).
const char* TypeName(int t);
std::string EncodingName(int e);
std::string CodecName(int c);

// ---- parquet.thrift structs (the fields we use) ----
struct SchemaElement {
  int type = -1;  // -1: a group
  int type_length = 0;
  int repetition = kRequired;
  bool has_repetition = false;
  std::string name;
  int num_children = 0;
  int converted = -1;
  int logical = -1;  // LogicalType union field id (3 LIST, 5 DECIMAL, 10 INTEGER, ...)
  bool logical_unsigned = false;
};

struct ColumnMeta {
  int type = -1;
  std::vector<std::string> path;
  int codec = 0;
  int64_t num_values = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;
  bool has_meta = false;
  std::string file_path;
};

struct RowGroup {
  std::vector<ColumnMeta> columns;
  int64_t num_rows = 0;
};

struct FileMeta {
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
};

struct DataPageInfo {
  int num_values = 0;
  int num_nulls = -1;
  int encoding = 0;
  int def_encoding = kRle;
  int rep_encoding = kRle;
  int def_bytes = 0;  // v2
  int rep_bytes = 0;  // v2
  bool is_compressed = true;
};

struct PageHeader {
  int type = -1;
  int uncompressed_size = -1;
  int compressed_size = -1;
  std::optional<uint32_t> crc;
  DataPageInfo data;
  int dict_num_values = 0;
  int dict_encoding = kPlain;
};

// Decodes the thrift PageHeader at p[0, n) into *h and sets *consumed to its length; false if it
// does not parse (truncated or malformed).
bool ParsePageHeader(const uint8_t* p, size_t n, PageHeader* h, size_t* consumed);

// ---- file access ----
// A file opened for positioned reads (pread), closed on destruction.
class File {
 public:
  File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();
  Status Open(const std::string& path);
  int64_t size() const { return size_; }
  // Reads bytes [offset, offset + n) into *out; DataLoss naming the file when they are past its
  // end.
  Status Read(int64_t offset, int64_t n, std::string* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Checks the PAR1 magic at both ends and decodes the footer's FileMetaData. DataLoss naming `path`
// when the file is not Parquet, is truncated or its footer does not parse.
Status ReadFooter(const File& f, const std::string& path, FileMeta* meta);

// ---- schema: top-level fields and their leaf columns ----
struct FieldPlan {
  std::string name;
  int leaf = -1;         // index among leaf columns (= column chunk index in each row group)
  int leaf_schema = -1;  // index into FileMeta::schema
  int max_def = 0;
  int max_rep = 0;
  int list_def = 0;  // lists: def level at which an element exists (>= : element, == -1: empty)
  bool is_list = false;
  std::string unsupported;  // non-empty: why this field cannot be read
};

// Walks the schema tree (pre-order, num_children) and plans every top-level field; DataLoss naming
// `path` for a malformed tree or row groups that disagree with it.
Status PlanFields(const std::string& path, const FileMeta& meta, std::vector<FieldPlan>* out);

}  // namespace loongforge::data::parquet
