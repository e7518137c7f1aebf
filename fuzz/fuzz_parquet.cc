// Parquet reader (src/dataset/parquet): magic, thrift footer, column chunks, page headers,
// dictionary and data pages, decompression. The input is written as a .parquet file in a fixed
// scratch directory and read the three ways the LeRobot importer does.
#include <cstdint>
#include <string>
#include <string_view>

#include "dataset/parquet/parquet.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace pq = loongforge::data::parquet;
  const std::string path = lf_fuzz::ScratchDir("parquet") + "/in.parquet";
  lf_fuzz::WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  (void)pq::ParquetNumRows(path);
  auto names = pq::ParquetColumnNames(path);
  if (!names.ok()) return 0;
  (void)pq::ReadParquet(path);
  return 0;
}
