// A temporary directory for the dataset tests: made (mkdtemp) on construction, removed with all it
// holds on destruction.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace loongforge::data {

class TempDir {
 public:
  // `prefix` names the directory under the system's temp path (prefix_XXXXXX).
  explicit TempDir(const std::string& prefix = "lf_dataset_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }
  const std::filesystem::path& path() const { return path_; }
  // Writes `text` to `rel` (making its parent folders) and returns the file's path.
  std::string Write(const std::string& rel, const std::string& text) const {
    const std::filesystem::path p = path_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace loongforge::data
