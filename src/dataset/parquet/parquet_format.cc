// Parquet's footer and page headers: the thrift compact protocol, the parquet.thrift structs the
// reader uses, the file's magic and footer, and the plan of each top-level field from the schema
// tree (parquet_format.h). Page and column decoding is in parquet.cc.
#include "dataset/parquet/parquet_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <variant>

#include "common/file_util.h"

namespace loongforge::data::parquet {
namespace {

constexpr char kMagic[] = "PAR1";
constexpr int kMaxThriftDepth = 32;

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

bool IsListAnnotated(const SchemaElement& e) { return e.converted == kCvList || e.logical == 3; }

}  // namespace

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

bool ParsePageHeader(const uint8_t* p, size_t n, PageHeader* h, size_t* consumed) {
  ThriftReader r(p, n);
  ReadPageHeader(r, h);
  *consumed = r.consumed();
  return r.ok();
}

File::~File() {
  if (fd_ >= 0) close(fd_);
}

Status File::Open(const std::string& path) {
  path_ = path;
  // A FIFO would block open() and read(), a directory fail deep in the footer parser
  // (Note [Only regular files are opened as files] in common/file_util.h).
  LF_ASSIGN_OR_RETURN(fd_, ::loongforge::internal::OpenRegularFile(path));
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoToStatus(errno, path);
  size_ = st.st_size;
  return Status::Ok();
}

Status File::Read(int64_t offset, int64_t n, std::string* out) const {
  if (offset < 0 || n < 0 || offset > size_ || n > size_ - offset) {
    return DataLossError(path_ + ": truncated or corrupt: bytes [" + std::to_string(offset) + ", " +
                         std::to_string(offset + n) + ") past the end of the " +
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

}  // namespace loongforge::data::parquet
