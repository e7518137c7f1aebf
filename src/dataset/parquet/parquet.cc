// A focused Parquet reader (see parquet.h for why it is hand-written).
//
// Note [Parquet subset]
// What LeRobot's pyarrow writer produces, and nothing more:
// - Footer: FileMetaData in the thrift compact protocol, after the data and before its 4-byte
// length
//   and the "PAR1" magic. Unknown thrift fields are skipped, as thrift requires.
// - Pages: DATA_PAGE (v1), DATA_PAGE_V2 and DICTIONARY_PAGE; INDEX_PAGE is skipped. A page CRC,
// when
//   present, is checked (CRC-32 of the page bytes as stored).
// - Encodings: PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, and RLE for booleans and levels.
// - Codecs: UNCOMPRESSED, SNAPPY, GZIP, ZSTD (each optional at build time: a missing library makes
//   that codec an Unimplemented error, not a build failure).
// - Physical types: BOOLEAN, INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY.
// - Shapes: a flat REQUIRED/OPTIONAL primitive, or a one-level list: the three-level LIST
//   (`optional group f (LIST) { repeated group list { optional T element; } }`, which pyarrow
//   writes for list<float> and fixed_size_list<float>[N]), the two-level LIST (`group (LIST) {
//   repeated T }`) and a bare `repeated T`. A null list (as opposed to an empty one or a null
//   element) is refused: the Column type has no way to say it.
// - Logical types that change a value's meaning (DECIMAL, unsigned 64-bit values past INT64_MAX,
//   INT96, FIXED_LEN_BYTE_ARRAY, maps, structs, lists of lists) are refused.
#include "dataset/parquet/parquet.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <variant>

#include <zstd.h>
#if LOONGFORGE_WITH_SNAPPY
#include <snappy-c.h>
#endif
#if LOONGFORGE_WITH_ZLIB
#include <zlib.h>
#endif

namespace loongforge::data::parquet {

size_t Column::NumValues() const {
  switch (kind) {
    case Kind::kInt64:
      return i64.size();
    case Kind::kDouble:
      return f64.size();
    case Kind::kString:
      return str.size();
    case Kind::kBool:
      return b.size();
  }
  return 0;
}

namespace {

constexpr char kMagic[] = "PAR1";
constexpr int kMaxThriftDepth = 32;
// Refuse absurd sizes from a corrupt header before allocating for them.
constexpr int64_t kMaxPageBytes = int64_t{1} << 31;

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

const char* TypeName(int t) {
  static const char* kNames[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                 "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? kNames[t] : "unknown type";
}
std::string EncodingName(int e) {
  static const char* kNames[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && e < 10 ? kNames[e] : "encoding " + std::to_string(e);
}
std::string CodecName(int c) {
  static const char* kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                 "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? kNames[c] : "codec " + std::to_string(c);
}

// CRC-32 (IEEE, reflected), as Parquet's page checksum uses; table-driven, no zlib needed.
uint32_t Crc32(const uint8_t* p, size_t n) {
  static const auto kTable = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// ---- thrift compact protocol ----
enum TType {
  kTStop = 0,
  kTTrue = 1,
  kTFalse = 2,
  kTByte = 3,
  kTI16 = 4,
  kTI32 = 5,
  kTI64 = 6,
  kTDouble = 7,
  kTBinary = 8,
  kTList = 9,
  kTSet = 10,
  kTMap = 11,
  kTStruct = 12
};

// Reads a thrift compact buffer; every read is bounds-checked and an error sticks (later reads
// return zeros), so parsers check ok() once at the end of a struct.
class ThriftReader {
 public:
  ThriftReader(const uint8_t* p, size_t n) : p_(p), end_(p + n), begin_(p) {}
  bool ok() const { return ok_; }
  size_t consumed() const { return static_cast<size_t>(p_ - begin_); }
  void Fail() {
    ok_ = false;
    p_ = end_;
  }

  uint8_t Byte() {
    if (p_ >= end_) {
      Fail();
      return 0;
    }
    return *p_++;
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b = Byte();
      if (!ok_) return 0;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
    Fail();
    return 0;
  }
  int64_t Zigzag() {
    uint64_t v = Varint();
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }
  int32_t I32() {
    int64_t v = Zigzag();
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) Fail();
    return ok_ ? static_cast<int32_t>(v) : 0;
  }
  std::string Binary() {
    uint64_t n = Varint();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_)) {
      Fail();
      return {};
    }
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  // Reads a field header: returns false at STOP. `last_id` carries the previous field id.
  bool Field(int16_t* last_id, int* type) {
    uint8_t b = Byte();
    if (!ok_ || b == 0) return false;
    *type = b & 0x0F;
    int delta = b >> 4;
    if (delta != 0) {
      *last_id = static_cast<int16_t>(*last_id + delta);
    } else {
      *last_id = static_cast<int16_t>(Zigzag());
    }
    return ok_;
  }
  // List/set header: element type and size.
  void ListHeader(int* elem_type, int64_t* size) {
    uint8_t b = Byte();
    *elem_type = b & 0x0F;
    *size = b >> 4;
    if (*size == 15) *size = static_cast<int64_t>(Varint());
    // Each element takes at least one byte: bounds a corrupt size before anyone allocates for it.
    if (*size < 0 || *size > end_ - p_) Fail();
  }
  bool BoolValue(int type) { return type == kTTrue; }  // struct fields carry the bool in the type
  void Skip(int type, int depth = 0) {
    if (depth > kMaxThriftDepth) return Fail();
    switch (type) {
      case kTTrue:
      case kTFalse:
        return;
      case kTByte:
        Byte();
        return;
      case kTI16:
      case kTI32:
      case kTI64:
        Varint();
        return;
      case kTDouble:
        for (int i = 0; i < 8; ++i) Byte();
        return;
      case kTBinary:
        Binary();
        return;
      case kTList:
      case kTSet: {
        int et;
        int64_t n;
        ListHeader(&et, &n);
        for (int64_t i = 0; i < n && ok_; ++i) {
          if (et == kTTrue || et == kTFalse) {
            Byte();  // bools inside containers take one byte each
          } else {
            Skip(et, depth + 1);
          }
        }
        return;
      }
      case kTMap: {
        int64_t n = static_cast<int64_t>(Varint());
        if (n == 0) return;
        uint8_t kv = Byte();
        if (n < 0 || n > end_ - p_) return Fail();
        for (int64_t i = 0; i < n && ok_; ++i) {
          for (int t : {kv >> 4, kv & 0x0F}) {
            if (t == kTTrue || t == kTFalse) {
              Byte();
            } else {
              Skip(t, depth + 1);
            }
          }
        }
        return;
      }
      case kTStruct: {
        int16_t id = 0;
        int t;
        while (Field(&id, &t)) Skip(t, depth + 1);
        return;
      }
      default:
        return Fail();
    }
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* begin_;
  bool ok_ = true;
};

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

// Where one field of a thrift struct goes: an int (i32), an int64 (zigzag i64), a string (binary),
// a bool, or a reader of its own, called with the field's compact type.
using FieldSink = std::variant<int*, int64_t*, std::string*, bool*, std::function<void(int)>>;

// A field ReadStruct knows: its id, its compact type (kTTrue stands for a bool, which the compact
// protocol carries in the type as kTTrue or kTFalse) and its sink.
struct ThriftField {
  int16_t id;
  int type;
  FieldSink sink;
};

// Reads one struct: each field whose id and type are listed goes to its sink, every other field is
// skipped (so newer writers' fields cost nothing). `seen`, when given, is called with every field
// before that (unions: which member is set).
void ReadStruct(ThriftReader& r, std::initializer_list<ThriftField> fields,
                const std::function<void(int16_t, int)>& seen = {}) {
  int16_t id = 0;
  int t;
  while (r.Field(&id, &t)) {
    if (seen) seen(id, t);
    const bool is_bool = t == kTTrue || t == kTFalse;
    const ThriftField* f = nullptr;
    for (const ThriftField& c : fields) {
      if (c.id == id && (c.type == t || (c.type == kTTrue && is_bool))) {
        f = &c;
        break;
      }
    }
    if (f == nullptr) {
      r.Skip(t);
      continue;
    }
    std::visit(
        [&](const auto& sink) {
          using S = std::decay_t<decltype(sink)>;
          if constexpr (std::is_same_v<S, int*>) {
            *sink = r.I32();
          } else if constexpr (std::is_same_v<S, int64_t*>) {
            *sink = r.Zigzag();
          } else if constexpr (std::is_same_v<S, std::string*>) {
            *sink = r.Binary();
          } else if constexpr (std::is_same_v<S, bool*>) {
            *sink = r.BoolValue(t);
          } else {
            sink(t);
          }
        },
        f->sink);
  }
}

// LogicalType is a union: the member's field id says which type (3 LIST, 5 DECIMAL, 10 INTEGER).
void ReadLogicalType(ThriftReader& r, SchemaElement* e) {
  ReadStruct(
      r,
      {{10, kTStruct,
        [&](int) {  // IntType { 1: byte bitWidth, 2: bool isSigned }
          ReadStruct(r, {{2, kTTrue, [&](int t) { e->logical_unsigned = !r.BoolValue(t); }}});
        }}},
      [&](int16_t id, int t) {
        if (t == kTStruct) e->logical = id;
      });
}

void ReadSchemaElement(ThriftReader& r, SchemaElement* e) {
  ReadStruct(r, {{1, kTI32, &e->type},
                 {2, kTI32, &e->type_length},
                 {3, kTI32,
                  [&](int) {
                    e->repetition = r.I32();
                    e->has_repetition = true;
                  }},
                 {4, kTBinary, &e->name},
                 {5, kTI32, &e->num_children},
                 {6, kTI32, &e->converted},
                 {10, kTStruct, [&](int) { ReadLogicalType(r, e); }}});
}

void ReadColumnMeta(ThriftReader& r, ColumnMeta* m) {
  m->has_meta = true;
  ReadStruct(r, {{1, kTI32, &m->type},
                 {3, kTList,
                  [&](int) {
                    int et;
                    int64_t n;
                    r.ListHeader(&et, &n);
                    for (int64_t i = 0; i < n && r.ok(); ++i) {
                      if (et != kTBinary) return r.Fail();
                      m->path.push_back(r.Binary());
                    }
                  }},
                 {4, kTI32, &m->codec},
                 {5, kTI64, &m->num_values},
                 {7, kTI64, &m->total_compressed_size},
                 {9, kTI64, &m->data_page_offset},
                 {11, kTI64, &m->dictionary_page_offset}});
}

// Reads a thrift list<struct> into `out`, each element with `read`.
template <typename T>
void ReadStructList(ThriftReader& r, std::vector<T>* out, void (*read)(ThriftReader&, T*)) {
  int et;
  int64_t n;
  r.ListHeader(&et, &n);
  if (!r.ok() || et != kTStruct) return r.Fail();
  out->resize(static_cast<size_t>(n));
  for (auto& x : *out) read(r, &x);
}

void ReadColumnChunk(ThriftReader& r, ColumnMeta* m) {
  ReadStruct(r, {{1, kTBinary, &m->file_path}, {3, kTStruct, [&](int) { ReadColumnMeta(r, m); }}});
}

void ReadRowGroup(ThriftReader& r, RowGroup* g) {
  ReadStruct(r, {{1, kTList, [&](int) { ReadStructList(r, &g->columns, ReadColumnChunk); }},
                 {3, kTI64, &g->num_rows}});
}

void ReadFileMeta(ThriftReader& r, FileMeta* f) {
  ReadStruct(r, {{2, kTList, [&](int) { ReadStructList(r, &f->schema, ReadSchemaElement); }},
                 {3, kTI64, &f->num_rows},
                 {4, kTList, [&](int) { ReadStructList(r, &f->row_groups, ReadRowGroup); }}});
}

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

// DataPageHeader (v1) and DataPageHeaderV2 number their fields differently.
void ReadDataPageHeader(ThriftReader& r, DataPageInfo* d, bool v2) {
  if (v2) {
    ReadStruct(r, {{1, kTI32, &d->num_values},
                   {2, kTI32, &d->num_nulls},
                   {4, kTI32, &d->encoding},
                   {5, kTI32, &d->def_bytes},
                   {6, kTI32, &d->rep_bytes},
                   {7, kTTrue, &d->is_compressed}});
  } else {
    ReadStruct(r, {{1, kTI32, &d->num_values},
                   {2, kTI32, &d->encoding},
                   {3, kTI32, &d->def_encoding},
                   {4, kTI32, &d->rep_encoding}});
  }
}

void ReadPageHeader(ThriftReader& r, PageHeader* h) {
  ReadStruct(r, {{1, kTI32, &h->type},
                 {2, kTI32, &h->uncompressed_size},
                 {3, kTI32, &h->compressed_size},
                 {4, kTI32, [&](int) { h->crc = static_cast<uint32_t>(r.I32()); }},
                 {5, kTStruct, [&](int) { ReadDataPageHeader(r, &h->data, false); }},
                 {7, kTStruct,
                  [&](int) {  // DictionaryPageHeader
                    ReadStruct(r, {{1, kTI32, &h->dict_num_values}, {2, kTI32, &h->dict_encoding}});
                  }},
                 {8, kTStruct, [&](int) { ReadDataPageHeader(r, &h->data, true); }}});
}

// Appends `n` PLAIN (little-endian, back to back) values of type T at `p` to `out`; returns the
// bytes read. The caller has checked that they are there.
template <typename T, typename Out>
size_t AppendPlain(const uint8_t* p, int64_t n, std::vector<Out>* out) {
  for (int64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, p + sizeof(T) * i, sizeof(T));
    out->push_back(static_cast<Out>(x));
  }
  return static_cast<size_t>(n) * sizeof(T);
}

// ---- file access ----
class File {
 public:
  ~File() {
    if (fd_ >= 0) close(fd_);
  }
  Status Open(const std::string& path) {
    path_ = path;
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return ErrnoToStatus(errno, path);
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoToStatus(errno, path);
    size_ = st.st_size;
    return Status::Ok();
  }
  int64_t size() const { return size_; }
  Status Read(int64_t offset, int64_t n, std::string* out) const {
    if (offset < 0 || n < 0 || offset > size_ || n > size_ - offset) {
      return DataLossError(path_ + ": truncated or corrupt: bytes [" + std::to_string(offset) +
                           ", " + std::to_string(offset + n) + ") past the end of the " +
                           std::to_string(size_) + "-byte file");
    }
    out->resize(static_cast<size_t>(n));
    int64_t done = 0;
    while (done < n) {
      ssize_t k = pread(fd_, out->data() + done, static_cast<size_t>(n - done), offset + done);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) return ErrnoToStatus(errno, path_);
      if (k == 0) return DataLossError(path_ + ": file shrank while reading");
      done += k;
    }
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

Status ReadFooter(const File& f, const std::string& path, FileMeta* meta) {
  if (f.size() < 12) {
    return DataLossError(path + ": not a Parquet file: " + std::to_string(f.size()) +
                         " bytes, too short for the header and footer");
  }
  std::string head, tail;
  LF_RETURN_IF_ERROR(f.Read(0, 4, &head));
  LF_RETURN_IF_ERROR(f.Read(f.size() - 8, 8, &tail));
  if (head != kMagic || tail.compare(4, 4, kMagic) != 0) {
    return DataLossError(path + ": not a Parquet file (no PAR1 magic at " +
                         (head != kMagic ? "the start" : "the end") + "; truncated?)");
  }
  uint32_t len;
  std::memcpy(&len, tail.data(), 4);  // little-endian: Parquet and every host we build for
  if (int64_t{len} > f.size() - 12) {
    return DataLossError(path + ": corrupt footer length " + std::to_string(len) + " in a " +
                         std::to_string(f.size()) + "-byte file (truncated?)");
  }
  std::string footer;
  LF_RETURN_IF_ERROR(f.Read(f.size() - 8 - len, len, &footer));
  ThriftReader r(reinterpret_cast<const uint8_t*>(footer.data()), footer.size());
  ReadFileMeta(r, meta);
  if (!r.ok()) return DataLossError(path + ": corrupt footer (FileMetaData does not parse)");
  if (meta->schema.empty()) return DataLossError(path + ": corrupt footer: empty schema");
  return Status::Ok();
}

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

bool IsListAnnotated(const SchemaElement& e) { return e.converted == kCvList || e.logical == 3; }

// Walks the schema tree (pre-order, num_children) and plans every top-level field.
Status PlanFields(const std::string& path, const FileMeta& meta, std::vector<FieldPlan>* out) {
  const auto& s = meta.schema;
  size_t pos = 1;
  int leaf_count = 0;
  // Returns the number of leaves under s[i] and advances pos past its subtree.
  struct Walker {
    const std::vector<SchemaElement>& s;
    size_t& pos;
    int& leaf_count;
    bool ok = true;
    // Collects the chain of nodes of the subtree starting at pos (for one-leaf chains) and
    // counts leaves.
    void Walk(std::vector<int>* chain, int* leaves, int depth) {
      if (pos >= s.size() || depth > kMaxThriftDepth) {
        ok = false;
        return;
      }
      int i = static_cast<int>(pos++);
      chain->push_back(i);
      if (s[i].num_children <= 0 && s[i].type >= 0) {
        ++*leaves;
        ++leaf_count;
        return;
      }
      if (s[i].num_children <= 0) {  // a group with no children
        ok = false;
        return;
      }
      for (int c = 0; c < s[i].num_children && ok; ++c) Walk(chain, leaves, depth + 1);
    }
  };
  Walker w{s, pos, leaf_count};
  for (int c = 0; c < s[0].num_children; ++c) {
    FieldPlan p;
    std::vector<int> chain;
    int leaves = 0;
    int first_leaf = leaf_count;
    w.Walk(&chain, &leaves, 0);
    if (!w.ok) return DataLossError(path + ": corrupt footer: malformed schema tree");
    const SchemaElement& top = s[chain[0]];
    p.name = top.name;
    p.leaf = first_leaf;
    p.leaf_schema = chain.back();
    const SchemaElement& leaf = s[chain.back()];
    if (leaves != 1) {
      p.unsupported = top.converted == kCvMap || top.converted == kCvMapKeyValue || top.logical == 2
                          ? "map type"
                          : "nested struct with " + std::to_string(leaves) + " leaf columns";
    } else {
      int reps = 0;
      int def = 0;
      for (int i : chain) {
        const SchemaElement& e = s[i];
        if (e.repetition == kOptional) ++def;
        if (e.repetition == kRepeated) {
          ++def;
          ++reps;
          p.list_def = def;
        }
      }
      p.max_def = def;
      p.max_rep = reps;
      p.is_list = reps == 1;
      bool shape_ok = false;
      if (chain.size() == 1) {
        shape_ok = true;  // flat primitive, or a bare repeated primitive (one-level list)
      } else if (IsListAnnotated(top) && top.repetition != kRepeated) {
        const SchemaElement& mid = s[chain[1]];
        // two-level: group (LIST) { repeated T }; three-level: group (LIST) { repeated group {T} }
        shape_ok = mid.repetition == kRepeated &&
                   (chain.size() == 2 ||
                    (chain.size() == 3 && leaf.repetition != kRepeated && !IsListAnnotated(mid)));
      }
      if (reps > 1) {
        p.unsupported = "nested list (" + std::to_string(reps) + " repetition levels)";
      } else if (!shape_ok) {
        p.unsupported = "nested struct";
      } else if (leaf.type == kInt96) {
        p.unsupported = "physical type INT96";
      } else if (leaf.type == kFixedLenByteArray) {
        p.unsupported = "physical type FIXED_LEN_BYTE_ARRAY";
      } else if (leaf.type < 0 || leaf.type > kFixedLenByteArray) {
        p.unsupported = "physical type " + std::to_string(leaf.type);
      } else if (leaf.converted == kCvDecimal || leaf.logical == 5) {
        p.unsupported = "DECIMAL logical type";
      } else if (leaf.converted == kCvInterval) {
        p.unsupported = "INTERVAL logical type";
      }
    }
    out->push_back(std::move(p));
  }
  if (pos != s.size()) return DataLossError(path + ": corrupt footer: malformed schema tree");
  for (const auto& g : meta.row_groups) {
    if (static_cast<int>(g.columns.size()) != leaf_count) {
      return DataLossError(path + ": corrupt footer: a row group has " +
                           std::to_string(g.columns.size()) + " column chunks, the schema " +
                           std::to_string(leaf_count) + " leaf columns");
    }
  }
  return Status::Ok();
}

// ---- decoding ----
// RLE / bit-packed hybrid (levels, dictionary indices, RLE booleans), without a length prefix.
class RleDecoder {
 public:
  RleDecoder(const uint8_t* p, size_t n, int bit_width) : p_(p), end_(p + n), w_(bit_width) {}
  // Appends exactly `count` values to out; false if the data runs out or is malformed.
  bool Decode(int64_t count, std::vector<uint32_t>* out) {
    if (w_ < 0 || w_ > 32) return false;
    const size_t value_bytes = static_cast<size_t>((w_ + 7) / 8);
    while (count > 0) {
      uint64_t header = 0;
      for (int shift = 0;; shift += 7) {
        if (p_ >= end_ || shift > 35) return false;
        uint8_t b = *p_++;
        header |= uint64_t{b & 0x7Fu} << shift;
        if (!(b & 0x80)) break;
      }
      if (header & 1) {  // bit-packed: (header >> 1) groups of 8 values
        uint64_t groups = header >> 1;
        uint64_t bytes = groups * static_cast<uint64_t>(w_);
        if (groups == 0 || bytes > static_cast<uint64_t>(end_ - p_)) {
          // A writer may end the last run early only if the values we need fit in the bytes left.
          uint64_t need = (static_cast<uint64_t>(count) * w_ + 7) / 8;
          if (groups == 0 || need > static_cast<uint64_t>(end_ - p_)) return false;
          bytes = static_cast<uint64_t>(end_ - p_);
        }
        uint64_t n = std::min<uint64_t>(groups * 8, static_cast<uint64_t>(count));
        uint64_t bit = 0;
        for (uint64_t i = 0; i < n; ++i) {
          uint32_t v = 0;
          for (int k = 0; k < w_; ++k, ++bit) {
            v |= static_cast<uint32_t>((p_[bit >> 3] >> (bit & 7)) & 1) << k;
          }
          out->push_back(v);
        }
        p_ += bytes;
        count -= static_cast<int64_t>(n);
      } else {  // RLE run
        uint64_t n = header >> 1;
        if (value_bytes > static_cast<size_t>(end_ - p_)) return false;
        uint32_t v = 0;
        for (size_t k = 0; k < value_bytes; ++k) v |= uint32_t{p_[k]} << (8 * k);
        p_ += value_bytes;
        if (w_ < 32 && (v >> w_) != 0) return false;
        if (n == 0) continue;
        n = std::min<uint64_t>(n, static_cast<uint64_t>(count));
        out->insert(out->end(), n, v);
        count -= static_cast<int64_t>(n);
      }
    }
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  int w_;
};

int BitWidth(int max_level) {
  int w = 0;
  while ((1 << w) <= max_level) ++w;
  return w;
}

// Values of one column chunk before assembly: either a dictionary (+ indices) or plain values.
struct Values {
  std::vector<int64_t> i64;
  std::vector<double> f64;
  std::vector<std::string> str;
  std::vector<uint8_t> b;
};

class ChunkReader {
 public:
  ChunkReader(const std::string& path, const FieldPlan& plan, const SchemaElement& leaf,
              Column* out)
      : path_(path), plan_(plan), leaf_(leaf), out_(out) {}

  Status Read(const File& f, const ColumnMeta& m, int64_t rg_rows) {
    if (!m.file_path.empty())
      return Error(true, "column chunk in another file (" + m.file_path + ")");
    if (!m.has_meta) return Corrupt("column chunk without metadata");
    if (m.type != leaf_.type) return Corrupt("column chunk type differs from the schema's");
    if (m.codec != kUncompressed && m.codec != kSnappy && m.codec != kGzip && m.codec != kZstd) {
      return Error(true, "compression codec " + CodecName(m.codec));
    }
#if !LOONGFORGE_WITH_SNAPPY
    if (m.codec == kSnappy) return Error(true, "SNAPPY compression (this build has no libsnappy)");
#endif
#if !LOONGFORGE_WITH_ZLIB
    if (m.codec == kGzip) return Error(true, "GZIP compression (this build has no zlib)");
#endif
    int64_t start = m.data_page_offset;
    if (m.dictionary_page_offset > 0 && m.dictionary_page_offset < start) {
      start = m.dictionary_page_offset;
    }
    std::string chunk;
    LF_RETURN_IF_ERROR_CTX(f.Read(start, m.total_compressed_size, &chunk), ColumnCtx());
    // While reading, a list column's offsets hold row starts only (ReadParquet closes them).
    rows_before_ = NumRows();
    const auto* p = reinterpret_cast<const uint8_t*>(chunk.data());
    size_t pos = 0;
    int64_t values_seen = 0;
    while (values_seen < m.num_values) {
      if (pos >= chunk.size()) {
        return Corrupt("pages hold " + std::to_string(values_seen) + " values, the chunk " +
                       std::to_string(m.num_values));
      }
      ThriftReader r(p + pos, chunk.size() - pos);
      PageHeader h;
      ReadPageHeader(r, &h);
      if (!r.ok()) return Corrupt("page header does not parse");
      pos += r.consumed();
      if (h.compressed_size < 0 || h.uncompressed_size < 0 ||
          static_cast<size_t>(h.compressed_size) > chunk.size() - pos ||
          h.uncompressed_size > kMaxPageBytes) {
        return Corrupt("page size " + std::to_string(h.compressed_size) +
                       " past the end of the column chunk");
      }
      const uint8_t* body = p + pos;
      pos += static_cast<size_t>(h.compressed_size);
      if (h.crc && Crc32(body, static_cast<size_t>(h.compressed_size)) != *h.crc) {
        return Corrupt("page checksum (CRC-32) mismatch");
      }
      if (h.type == kDictionaryPage) {
        LF_RETURN_IF_ERROR(ReadDictionaryPage(h, body, m.codec));
      } else if (h.type == kDataPage || h.type == kDataPageV2) {
        LF_RETURN_IF_ERROR(ReadDataPage(h, body, m.codec));
        values_seen += h.data.num_values;
      } else if (h.type != kIndexPage) {
        return Error(true, "page type " + std::to_string(h.type));
      }
    }
    if (values_seen != m.num_values) {
      return Corrupt("pages hold " + std::to_string(values_seen) + " values, the chunk " +
                     std::to_string(m.num_values));
    }
    int64_t rows_after = NumRows();
    if (rows_after - rows_before_ != rg_rows) {
      return Corrupt(std::to_string(rows_after - rows_before_) + " rows in the column chunk, " +
                     std::to_string(rg_rows) + " in the row group");
    }
    return Status::Ok();
  }

 private:
  std::string ColumnCtx() const { return path_ + ": column '" + plan_.name + "'"; }
  Status Error(bool unsupported, const std::string& what) const {
    std::string msg = ColumnCtx() + ": " + (unsupported ? "unsupported " : "") + what;
    return unsupported ? UnimplementedError(msg) : DataLossError(msg);
  }
  Status Corrupt(const std::string& what) const { return Error(false, "corrupt: " + what); }
  int64_t NumRows() const {
    return static_cast<int64_t>(out_->is_list ? out_->offsets.size() : out_->NumValues());
  }

  // Decompresses `n` bytes at p into `uncompressed` bytes.
  Status Decompress(int codec, const uint8_t* p, size_t n, size_t uncompressed,
                    std::string* out) const {
    out->resize(uncompressed);
    if (codec == kUncompressed) {
      if (n != uncompressed) return Corrupt("uncompressed page with two different sizes");
      if (n) std::memcpy(out->data(), p, n);
      return Status::Ok();
    }
    if (codec == kZstd) {
      size_t k = ZSTD_decompress(out->data(), uncompressed, p, n);
      if (ZSTD_isError(k) || k != uncompressed) {
        return Corrupt(std::string("ZSTD page does not decompress (") +
                       (ZSTD_isError(k) ? ZSTD_getErrorName(k) : "wrong size") + ")");
      }
      return Status::Ok();
    }
#if LOONGFORGE_WITH_SNAPPY
    if (codec == kSnappy) {
      size_t len = 0;
      if (snappy_uncompressed_length(reinterpret_cast<const char*>(p), n, &len) != SNAPPY_OK ||
          len != uncompressed) {
        return Corrupt("SNAPPY page does not decompress (bad length)");
      }
      if (snappy_uncompress(reinterpret_cast<const char*>(p), n, out->data(), &len) != SNAPPY_OK ||
          len != uncompressed) {
        return Corrupt("SNAPPY page does not decompress");
      }
      return Status::Ok();
    }
#endif
#if LOONGFORGE_WITH_ZLIB
    if (codec == kGzip) {
      z_stream z{};
      if (inflateInit2(&z, 15 + 32) != Z_OK) return InternalError("zlib inflateInit2 failed");
      z.next_in = const_cast<Bytef*>(p);
      z.avail_in = static_cast<uInt>(n);
      z.next_out = reinterpret_cast<Bytef*>(out->data());
      z.avail_out = static_cast<uInt>(uncompressed);
      int rc = inflate(&z, Z_FINISH);
      size_t got = z.total_out;
      inflateEnd(&z);
      if (rc != Z_STREAM_END || got != uncompressed) {
        return Corrupt("GZIP page does not decompress");
      }
      return Status::Ok();
    }
#endif
    return Error(true, "compression codec " + CodecName(codec));
  }

  // Decodes `n` PLAIN values of the leaf's type from [p, end) into v; sets *used to the bytes read.
  Status DecodePlain(const uint8_t* p, size_t size, int64_t n, Values* v, size_t* used) const {
    const int t = leaf_.type;
    auto need = [&](uint64_t bytes) -> Status {
      if (bytes > size) {
        return Corrupt("page holds fewer " + std::string(TypeName(t)) + " values than it says");
      }
      return Status::Ok();
    };
    size_t pos = 0;
    switch (t) {
      case kBoolean:
        LF_RETURN_IF_ERROR(need((static_cast<uint64_t>(n) + 7) / 8));
        for (int64_t i = 0; i < n; ++i) v->b.push_back((p[i >> 3] >> (i & 7)) & 1);
        pos = static_cast<size_t>((n + 7) / 8);
        break;
      case kInt32: {
        LF_RETURN_IF_ERROR(need(uint64_t(n) * 4));
        bool zero_extend = leaf_.converted == kCvUint8 || leaf_.converted == kCvUint16 ||
                           leaf_.converted == kCvUint32 ||
                           (leaf_.logical == 10 && leaf_.logical_unsigned);
        for (int64_t i = 0; i < n; ++i) {
          int32_t x;
          std::memcpy(&x, p + 4 * i, 4);
          v->i64.push_back(zero_extend ? int64_t{static_cast<uint32_t>(x)} : int64_t{x});
        }
        pos = static_cast<size_t>(n) * 4;
        break;
      }
      case kInt64: {
        LF_RETURN_IF_ERROR(need(uint64_t(n) * 8));
        bool is_unsigned =
            leaf_.converted == kCvUint64 || (leaf_.logical == 10 && leaf_.logical_unsigned);
        for (int64_t i = 0; i < n; ++i) {
          int64_t x;
          std::memcpy(&x, p + 8 * i, 8);
          if (is_unsigned && x < 0) return Error(true, "UINT64 value past INT64_MAX");
          v->i64.push_back(x);
        }
        pos = static_cast<size_t>(n) * 8;
        break;
      }
      case kFloat:
        LF_RETURN_IF_ERROR(need(uint64_t(n) * 4));
        pos = AppendPlain<float>(p, n, &v->f64);
        break;
      case kDouble:
        LF_RETURN_IF_ERROR(need(uint64_t(n) * 8));
        pos = AppendPlain<double>(p, n, &v->f64);
        break;
      case kByteArray:
        for (int64_t i = 0; i < n; ++i) {
          LF_RETURN_IF_ERROR(need(pos + 4));
          uint32_t len;
          std::memcpy(&len, p + pos, 4);
          pos += 4;
          LF_RETURN_IF_ERROR(need(uint64_t(pos) + len));
          v->str.emplace_back(reinterpret_cast<const char*>(p + pos), len);
          pos += len;
        }
        break;
      default:
        return Error(true, std::string("physical type ") + TypeName(t));
    }
    *used = pos;
    return Status::Ok();
  }

  Status ReadDictionaryPage(const PageHeader& h, const uint8_t* body, int codec) {
    if (h.dict_encoding != kPlain && h.dict_encoding != kPlainDictionary) {
      return Error(true, "dictionary page encoding " + EncodingName(h.dict_encoding));
    }
    if (h.dict_num_values < 0) return Corrupt("negative dictionary size");
    std::string buf;
    LF_RETURN_IF_ERROR(Decompress(codec, body, static_cast<size_t>(h.compressed_size),
                                  static_cast<size_t>(h.uncompressed_size), &buf));
    dict_ = Values();
    size_t used;
    LF_RETURN_IF_ERROR(DecodePlain(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(),
                                   h.dict_num_values, &dict_, &used));
    dict_size_ = h.dict_num_values;
    have_dict_ = true;
    return Status::Ok();
  }

  Status ReadDataPage(const PageHeader& h, const uint8_t* body, int codec) {
    const DataPageInfo& d = h.data;
    const bool v2 = h.type == kDataPageV2;
    if (d.num_values < 0) return Corrupt("negative value count in a data page");
    std::string buf;
    const uint8_t* p;
    size_t size;
    std::vector<uint32_t> rep, def;
    const int64_t n = d.num_values;
    if (v2) {
      // v2: levels first, never compressed and without length prefixes; then the values.
      if (d.rep_bytes < 0 || d.def_bytes < 0 ||
          int64_t{d.rep_bytes} + d.def_bytes > h.compressed_size) {
        return Corrupt("level sizes past the end of a data page v2");
      }
      const uint8_t* lv = body;
      if (plan_.max_rep > 0) {
        RleDecoder dec(lv, static_cast<size_t>(d.rep_bytes), BitWidth(plan_.max_rep));
        if (!dec.Decode(n, &rep)) return Corrupt("repetition levels do not decode");
      }
      if (plan_.max_def > 0) {
        RleDecoder dec(lv + d.rep_bytes, static_cast<size_t>(d.def_bytes), BitWidth(plan_.max_def));
        if (!dec.Decode(n, &def)) return Corrupt("definition levels do not decode");
      }
      const size_t lvl = static_cast<size_t>(d.rep_bytes + d.def_bytes);
      const size_t comp = static_cast<size_t>(h.compressed_size) - lvl;
      const int64_t uncomp = int64_t{h.uncompressed_size} - static_cast<int64_t>(lvl);
      if (uncomp < 0) return Corrupt("data page v2 smaller than its levels");
      if (d.is_compressed && codec != kUncompressed) {
        LF_RETURN_IF_ERROR(Decompress(codec, body + lvl, comp, static_cast<size_t>(uncomp), &buf));
      } else {
        if (static_cast<int64_t>(comp) != uncomp) return Corrupt("data page v2 sizes differ");
        buf.assign(reinterpret_cast<const char*>(body + lvl), comp);
      }
      p = reinterpret_cast<const uint8_t*>(buf.data());
      size = buf.size();
    } else {
      LF_RETURN_IF_ERROR(Decompress(codec, body, static_cast<size_t>(h.compressed_size),
                                    static_cast<size_t>(h.uncompressed_size), &buf));
      p = reinterpret_cast<const uint8_t*>(buf.data());
      size = buf.size();
      // v1: repetition then definition levels, each RLE with a 4-byte length prefix.
      auto levels = [&](int max_level, int encoding, const char* what,
                        std::vector<uint32_t>* out) -> Status {
        if (max_level == 0) return Status::Ok();
        if (encoding != kRle) {
          return Error(true, std::string(what) + " level encoding " + EncodingName(encoding));
        }
        if (size < 4) return Corrupt(std::string(what) + " levels past the end of the page");
        uint32_t len;
        std::memcpy(&len, p, 4);
        if (len > size - 4) return Corrupt(std::string(what) + " levels past the end of the page");
        RleDecoder dec(p + 4, len, BitWidth(max_level));
        if (!dec.Decode(n, out)) return Corrupt(std::string(what) + " levels do not decode");
        p += 4 + len;
        size -= 4 + len;
        return Status::Ok();
      };
      LF_RETURN_IF_ERROR(levels(plan_.max_rep, d.rep_encoding, "repetition", &rep));
      LF_RETURN_IF_ERROR(levels(plan_.max_def, d.def_encoding, "definition", &def));
    }
    for (uint32_t x : def) {
      if (x > static_cast<uint32_t>(plan_.max_def)) return Corrupt("definition level out of range");
    }
    int64_t present = n;
    if (plan_.max_def > 0) {
      present = 0;
      for (uint32_t x : def) present += x == static_cast<uint32_t>(plan_.max_def);
    }
    // Decode the `present` non-null values.
    Values vals;
    if (d.encoding == kPlain) {
      size_t used;
      LF_RETURN_IF_ERROR(DecodePlain(p, size, present, &vals, &used));
    } else if (d.encoding == kPlainDictionary || d.encoding == kRleDictionary) {
      if (!have_dict_) return Corrupt("dictionary-encoded page without a dictionary page");
      std::vector<uint32_t> idx;
      if (present > 0) {
        if (size < 1) return Corrupt("dictionary indices past the end of the page");
        RleDecoder dec(p + 1, size - 1, p[0]);
        if (!dec.Decode(present, &idx)) return Corrupt("dictionary indices do not decode");
      }
      for (uint32_t i : idx) {
        if (i >= static_cast<uint32_t>(dict_size_)) {
          return Corrupt("dictionary index " + std::to_string(i) + " out of range (dictionary of " +
                         std::to_string(dict_size_) + ")");
        }
      }
      switch (leaf_.type) {
        case kBoolean:
          for (uint32_t i : idx) vals.b.push_back(dict_.b[i]);
          break;
        case kInt32:
        case kInt64:
          for (uint32_t i : idx) vals.i64.push_back(dict_.i64[i]);
          break;
        case kFloat:
        case kDouble:
          for (uint32_t i : idx) vals.f64.push_back(dict_.f64[i]);
          break;
        default:
          for (uint32_t i : idx) vals.str.push_back(dict_.str[i]);
      }
    } else if (d.encoding == kRle && leaf_.type == kBoolean) {
      if (size < 4) return Corrupt("RLE booleans past the end of the page");
      uint32_t len;
      std::memcpy(&len, p, 4);
      if (len > size - 4) return Corrupt("RLE booleans past the end of the page");
      std::vector<uint32_t> bits;
      RleDecoder dec(p + 4, len, 1);
      if (!dec.Decode(present, &bits)) return Corrupt("RLE booleans do not decode");
      for (uint32_t x : bits) vals.b.push_back(static_cast<uint8_t>(x));
    } else {
      return Error(true, "encoding " + EncodingName(d.encoding) + " for " + TypeName(leaf_.type));
    }
    Assemble(n, rep, def, &vals);
    return assemble_status_;
  }

  // Appends one value slot: the next decoded value when valid, else a default.
  void Push(bool is_valid, Values* vals, size_t* next) {
    Column& c = *out_;
    const size_t slot = c.NumValues();
    // `valid` stays empty (all valid) until the first null, then holds one flag per slot. (The
    // first null may be slot 0, where the backfill adds nothing: push its flag explicitly.)
    if (!c.valid.empty()) {
      c.valid.push_back(is_valid ? 1 : 0);
    } else if (!is_valid) {
      c.valid.assign(slot, 1);
      c.valid.push_back(0);
    }
    switch (c.kind) {
      case Column::Kind::kInt64:
        c.i64.push_back(is_valid ? vals->i64[(*next)++] : 0);
        break;
      case Column::Kind::kDouble:
        c.f64.push_back(is_valid ? vals->f64[(*next)++] : 0.0);
        break;
      case Column::Kind::kString:
        c.str.push_back(is_valid ? std::move(vals->str[(*next)++]) : std::string());
        break;
      case Column::Kind::kBool:
        c.b.push_back(is_valid ? vals->b[(*next)++] : 0);
        break;
    }
  }

  void Assemble(int64_t n, const std::vector<uint32_t>& rep, const std::vector<uint32_t>& def,
                Values* vals) {
    assemble_status_ = Status::Ok();
    size_t next = 0;
    const uint32_t max_def = static_cast<uint32_t>(plan_.max_def);
    Column& c = *out_;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t dl = plan_.max_def > 0 ? def[static_cast<size_t>(i)] : 0;
      if (!plan_.is_list) {
        Push(dl == max_def, vals, &next);
        continue;
      }
      const uint32_t rl = rep[static_cast<size_t>(i)];
      if (rl == 0) {
        c.offsets.push_back(static_cast<int64_t>(c.NumValues()));
      } else if (static_cast<int64_t>(c.offsets.size()) == rows_before_) {
        assemble_status_ = Corrupt("list continues a row that never started");
        return;
      }
      const uint32_t list_def = static_cast<uint32_t>(plan_.list_def);
      if (dl >= list_def) {
        Push(dl == max_def, vals, &next);
      } else if (dl + 1 < list_def) {
        assemble_status_ = Error(true, "null list in row " + std::to_string(c.offsets.size() - 1));
        return;
      }  // dl == list_def - 1: an empty list, recorded by its row start alone
    }
  }

  const std::string& path_;
  const FieldPlan& plan_;
  const SchemaElement& leaf_;
  Column* out_;
  Values dict_;
  int64_t dict_size_ = 0;
  bool have_dict_ = false;
  int64_t rows_before_ = 0;
  Status assemble_status_;
};

Column::Kind KindOf(int type) {
  switch (type) {
    case kBoolean:
      return Column::Kind::kBool;
    case kFloat:
    case kDouble:
      return Column::Kind::kDouble;
    case kByteArray:
      return Column::Kind::kString;
    default:
      return Column::Kind::kInt64;
  }
}

}  // namespace

StatusOr<int64_t> ParquetNumRows(const std::string& path) {
  File f;
  LF_RETURN_IF_ERROR(f.Open(path));
  FileMeta meta;
  LF_RETURN_IF_ERROR(ReadFooter(f, path, &meta));
  return meta.num_rows;
}

StatusOr<std::vector<std::string>> ParquetColumnNames(const std::string& path) {
  File f;
  LF_RETURN_IF_ERROR(f.Open(path));
  FileMeta meta;
  LF_RETURN_IF_ERROR(ReadFooter(f, path, &meta));
  std::vector<FieldPlan> plans;
  LF_RETURN_IF_ERROR(PlanFields(path, meta, &plans));
  std::vector<std::string> names;
  for (const auto& p : plans) names.push_back(p.name);
  return names;
}

StatusOr<std::vector<Column>> ReadParquet(const std::string& path,
                                          const std::vector<std::string>& columns) {
  File f;
  LF_RETURN_IF_ERROR(f.Open(path));
  FileMeta meta;
  LF_RETURN_IF_ERROR(ReadFooter(f, path, &meta));
  std::vector<FieldPlan> plans;
  LF_RETURN_IF_ERROR(PlanFields(path, meta, &plans));
  std::vector<int> chosen;
  if (columns.empty()) {
    for (size_t i = 0; i < plans.size(); ++i) chosen.push_back(static_cast<int>(i));
  } else {
    for (const auto& name : columns) {
      int found = -1;
      for (size_t i = 0; i < plans.size(); ++i) {
        if (plans[i].name == name) found = static_cast<int>(i);
      }
      if (found < 0) return NotFoundError(path + ": no column '" + name + "'");
      chosen.push_back(found);
    }
  }
  int64_t total_rows = 0;
  for (const auto& g : meta.row_groups) {
    if (g.num_rows < 0) return DataLossError(path + ": corrupt footer: negative row count");
    total_rows += g.num_rows;
  }
  if (total_rows != meta.num_rows) {
    return DataLossError(path + ": corrupt footer: row groups hold " + std::to_string(total_rows) +
                         " rows, the file says " + std::to_string(meta.num_rows));
  }
  std::vector<Column> out;
  for (int ci : chosen) {
    const FieldPlan& plan = plans[static_cast<size_t>(ci)];
    if (!plan.unsupported.empty()) {
      return UnimplementedError(path + ": column '" + plan.name + "': unsupported " +
                                plan.unsupported);
    }
    const SchemaElement& leaf = meta.schema[static_cast<size_t>(plan.leaf_schema)];
    Column col;
    col.name = plan.name;
    col.kind = KindOf(leaf.type);
    col.is_list = plan.is_list;
    for (const auto& g : meta.row_groups) {
      ChunkReader reader(path, plan, leaf, &col);
      LF_RETURN_IF_ERROR(reader.Read(f, g.columns[static_cast<size_t>(plan.leaf)], g.num_rows));
    }
    if (col.is_list) col.offsets.push_back(static_cast<int64_t>(col.NumValues()));
    out.push_back(std::move(col));
  }
  return out;
}

}  // namespace loongforge::data::parquet
