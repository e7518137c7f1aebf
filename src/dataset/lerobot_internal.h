// Helpers that the LeRobot metadata reader (lerobot_meta.cc) and the import (lerobot_import.cc)
// share: JSON files and the checks on the Parquet columns they read. Private to src/dataset.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataset/parquet/parquet.h"
#include "loongforge/status.h"

namespace loongforge::data::lerobot::internal {

// The most a metadata file (info.json, episodes, tasks, stats, modality.json) may hold.
constexpr size_t kMaxMetaFileBytes = size_t{1} << 30;

// All of the metadata file `path` (ReadRegularFile: a directory, FIFO or device is refused naming
// the path and its kind); NotFound "<path>: not found" when it is missing.
StatusOr<std::string> ReadMetaFile(const std::string& path);

// The JSON document in `path` (read by ReadMetaFile): NotFound when the file is missing,
// InvalidArgument naming the file when it does not parse.
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

// The column `name` of `cols` (as ReadParquet returned them from `file`); InvalidArgument naming
// the file and the column when it is missing.
StatusOr<const parquet::Column*> FindColumn(const std::vector<parquet::Column>& cols,
                                            const std::string& name, const std::string& file);

// OK when `c` is a flat integer column without nulls; else InvalidArgument naming the file, the
// column and (for a null) the row.
Status CheckIntColumn(const parquet::Column& c, const std::string& file);

}  // namespace loongforge::data::lerobot::internal
