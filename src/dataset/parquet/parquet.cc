// A focused Parquet reader (see parquet.h for why it is hand-written): page and column decoding
// and the public reader. The footer, page headers and schema plan are in parquet_format.cc.
//
// Note [Parquet subset]
// What LeRobot's pyarrow writer produces, and nothing more:
// - Footer: FileMetaData in the thrift compact protocol, after the data and before its 4-byte
//   length and the "PAR1" magic. Unknown thrift fields are skipped, as thrift requires.
// - Pages: DATA_PAGE (v1), DATA_PAGE_V2 and DICTIONARY_PAGE; INDEX_PAGE is skipped. A page CRC,
//   when present, is checked (CRC-32 of the page bytes as stored).
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

#include <cstring>

#include <zstd.h>
#if LOONGFORGE_WITH_SNAPPY
#include <snappy-c.h>
#endif
#if LOONGFORGE_WITH_ZLIB
#include <zlib.h>
#endif

#include "dataset/parquet/parquet_format.h"

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
      PageHeader h;
      size_t header_bytes = 0;
      if (!ParsePageHeader(p + pos, chunk.size() - pos, &h, &header_bytes))
        return Corrupt("page header does not parse");
      pos += header_bytes;
      // A page's sizes are int32 in the format: the type bounds an allocation to 2 GiB.
      if (h.compressed_size < 0 || h.uncompressed_size < 0 ||
          static_cast<size_t>(h.compressed_size) > chunk.size() - pos) {
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

// A file opened with its footer read and its top-level fields planned.
struct Table {
  File file;
  FileMeta meta;
  std::vector<FieldPlan> fields;
};

Status OpenTable(const std::string& path, Table* t) {
  LF_RETURN_IF_ERROR(t->file.Open(path));
  LF_RETURN_IF_ERROR(ReadFooter(t->file, path, &t->meta));
  return PlanFields(path, t->meta, &t->fields);
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
  Table t;
  LF_RETURN_IF_ERROR(OpenTable(path, &t));
  std::vector<std::string> names;
  for (const auto& p : t.fields) names.push_back(p.name);
  return names;
}

StatusOr<std::vector<Column>> ReadParquet(const std::string& path,
                                          const std::vector<std::string>& columns) {
  Table t;
  LF_RETURN_IF_ERROR(OpenTable(path, &t));
  const FileMeta& meta = t.meta;
  const std::vector<FieldPlan>& plans = t.fields;
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
      LF_RETURN_IF_ERROR(
          reader.Read(t.file, g.columns[static_cast<size_t>(plan.leaf)], g.num_rows));
    }
    if (col.is_list) col.offsets.push_back(static_cast<int64_t>(col.NumValues()));
    out.push_back(std::move(col));
  }
  return out;
}

}  // namespace loongforge::data::parquet
