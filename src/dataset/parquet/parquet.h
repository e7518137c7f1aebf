// A focused Parquet reader for the tables LeRobot writes.
//
// Hand-written because Debian 12 ships no Arrow/Parquet C++ library, and the project uses only
// Debian packages. It reads exactly what pyarrow writes for LeRobot datasets and refuses anything
// else with a Status naming the file, the column and the unsupported feature, never a wrong value.
// See Note [Parquet subset] in parquet.cc for the supported subset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge::data::parquet {

// One top-level column of a Parquet file, all row groups concatenated.
struct Column {
  std::string name;  // the top-level field name, e.g. "observation.state"
  enum class Kind { kInt64, kDouble, kString, kBool } kind = Kind::kInt64;
  std::vector<int64_t> i64;      // kInt64 values (INT32 widened; UINT_8/16/32 zero-extended)
  std::vector<double> f64;       // kDouble values (FLOAT widened exactly)
  std::vector<std::string> str;  // kString values (BYTE_ARRAY bytes, UTF-8 or not)
  std::vector<uint8_t> b;        // kBool values, 0 or 1
  // List columns: row r holds values [offsets[r], offsets[r+1]) (size num_rows + 1); empty for
  // flat columns.
  std::vector<int64_t> offsets;
  // Per row (flat) or per value (list); 0 marks a null, whose value slot holds 0 / "" / false.
  // Empty = all valid.
  std::vector<uint8_t> valid;
  bool is_list = false;

  // Number of values (not rows) of the column's kind.
  size_t NumValues() const;
};

// Reads the named top-level columns (all of them when `columns` is empty) of every row group, in
// the order requested (file order when empty). INT32/INT64 -> kInt64, FLOAT/DOUBLE -> kDouble
// (exact: float widened), BYTE_ARRAY -> kString, BOOLEAN -> kBool. Errors (each message starts with
// the path, and names the column where one is involved):
//   NotFound: the file or a requested column does not exist.
//   DataLoss: not a Parquet file (magic), truncated, corrupt footer or page (sizes, CRC, levels,
//             dictionary indices, decompression).
//   Unimplemented: a feature outside the supported subset (nested types, INT96, DELTA encodings,
//                  LZ4/BROTLI, a codec this build lacks...).
// Thread-safe: no shared state.
StatusOr<std::vector<Column>> ReadParquet(const std::string& path,
                                          const std::vector<std::string>& columns = {});

// The file's row count from its footer. Errors as ReadParquet (the footer only).
StatusOr<int64_t> ParquetNumRows(const std::string& path);

// The names of the file's top-level columns in file order, supported or not.
StatusOr<std::vector<std::string>> ParquetColumnNames(const std::string& path);

}  // namespace loongforge::data::parquet
