// Builds small, real LoongForge datasets for tests: random-but-structured RGB frames encoded with
// libjpeg-turbo and written through RecordWriter, independent of the packer.
#pragma once

#include <gtest/gtest.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "loongforge/dataset.h"

namespace loongforge {
namespace testing {

// A random image with low-frequency structure plus noise (never flat, never all-zero).
inline std::vector<uint8_t> RandomRgb(int w, int h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  float fx[3], fy[3], ph[3];
  for (int c = 0; c < 3; ++c) {
    fx[c] = 1 + 6 * u(rng);
    fy[c] = 1 + 6 * u(rng);
    ph[c] = 6.28f * u(rng);
  }
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        float v = 128 +
                  90 * std::sin(fx[c] * x / w * 6.28f + ph[c]) * std::cos(fy[c] * y / h * 6.28f) +
                  20 * (u(rng) - 0.5f);
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::min(255.f, std::max(0.f, v)));
      }
  return px;
}

inline std::string EncodeJpeg(const std::vector<uint8_t>& rgb, int w, int h, int quality = 90) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  int rc = tjCompress2(tj, rgb.data(), w, w * 3, h, TJPF_RGB, &buf, &size, TJSAMP_420, quality, 0);
  std::string out;
  if (rc == 0) out.assign(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// `jpg` with its baseline SOF0 header rewritten to claim `w` x `h` (the scan data is unchanged).
inline std::string WithClaimedSize(std::string jpg, int w, int h) {
  const size_t i = jpg.find("\xFF\xC0");
  EXPECT_NE(i, std::string::npos);
  jpg[i + 5] = static_cast<char>(h >> 8), jpg[i + 6] = static_cast<char>(h & 0xFF);
  jpg[i + 7] = static_cast<char>(w >> 8), jpg[i + 8] = static_cast<char>(w & 0xFF);
  return jpg;
}

struct TestDbOptions {
  int samples = 40, cameras = 2, width = 96, height = 72;
  int state_dim = 6, action_dim = 4, horizon = 3;
  std::set<int64_t> corrupt_jpeg, truncated_jpeg, truncated_state, missing_tokens;
  // These samples get 12 tokens while the schema keeps saying max_tokens 8 (an instruction the
  // schema's statistics missed).
  std::set<int64_t> long_tokens;
  // These samples get a token id equal to the schema's vocab_size (one past the vocabulary).
  std::set<int64_t> out_of_vocab_tokens;
  // These samples get an empty instruction (a 0-byte tokens record).
  std::set<int64_t> empty_tokens;
};

inline std::string TempDir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("lf_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// Writes a DB at `path`; instruction of sample i has (i % 7) + 2 tokens (ids 3 + i + t);
// state[d] = i + d.
inline Status MakeTestDb(const std::string& path, const TestDbOptions& o) {
  LF_ASSIGN_OR_RETURN(auto w, data::RecordWriter::Create(path, true));
  data::Schema s;
  s.num_samples = o.samples;
  s.num_episodes = 1;
  for (int c = 0; c < o.cameras; ++c) s.cameras.push_back("cam" + std::to_string(c));
  s.image_width = o.width;
  s.image_height = o.height;
  s.state_dim = o.state_dim;
  s.action_dim = o.action_dim;
  s.action_horizon = o.horizon;
  s.vocab_size = 259;
  s.max_tokens = 8;
  s.state_mean.assign(o.state_dim, 1.f);
  s.state_std.assign(o.state_dim, 2.f);
  s.action_mean.assign(o.action_dim, 0.f);
  s.action_std.assign(o.action_dim, 1.f);
  for (int64_t i = 0; i < o.samples; ++i) {
    for (int c = 0; c < o.cameras; ++c) {
      std::string jpg = EncodeJpeg(RandomRgb(o.width, o.height, i * 31 + c), o.width, o.height);
      if (o.corrupt_jpeg.count(i)) jpg[jpg.size() / 2] ^= 0x5A, jpg.replace(200, 64, 64, '\xFF');
      if (o.truncated_jpeg.count(i)) jpg.resize(jpg.size() / 2);
      LF_RETURN_IF_ERROR(w->Put(data::SampleKey(i, data::CameraModality(s.cameras[c])), jpg));
    }
    std::vector<int32_t> tok(o.long_tokens.count(i) ? 12 : (i % 7) + 2);
    for (size_t t = 0; t < tok.size(); ++t) tok[t] = static_cast<int32_t>(3 + i + t);
    if (o.out_of_vocab_tokens.count(i)) tok[1] = 259;
    if (o.empty_tokens.count(i)) tok.clear();
    if (!o.missing_tokens.count(i))
      LF_RETURN_IF_ERROR(
          w->Put(data::SampleKey(i, "tokens"),
                 std::string_view(reinterpret_cast<char*>(tok.data()), 4 * tok.size())));
    std::vector<float> st(o.state_dim);
    for (int d = 0; d < o.state_dim; ++d) st[d] = static_cast<float>(i + d);
    std::string sv(reinterpret_cast<char*>(st.data()), 4 * st.size());
    if (o.truncated_state.count(i)) sv.resize(sv.size() - 3);
    LF_RETURN_IF_ERROR(w->Put(data::SampleKey(i, "state"), sv));
    std::vector<float> ac(o.horizon * o.action_dim);
    for (size_t k = 0; k < ac.size(); ++k) ac[k] = static_cast<float>(i) * 0.5f + k;
    LF_RETURN_IF_ERROR(w->Put(data::SampleKey(i, "action"),
                              std::string_view(reinterpret_cast<char*>(ac.data()), 4 * ac.size())));
    std::string am(o.horizon, '\1');
    am.back() = static_cast<char>(i % 2);
    LF_RETURN_IF_ERROR(w->Put(data::SampleKey(i, "amask"), am));
    int32_t meta[2] = {0, static_cast<int32_t>(i)};
    LF_RETURN_IF_ERROR(
        w->Put(data::SampleKey(i, "meta"), std::string_view(reinterpret_cast<char*>(meta), 8)));
  }
  return w->Commit(s);
}

// A test fixture owning a temporary folder, with Db() to build a test dataset in it.
class TestDbFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_suite()->name());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Db(const TestDbOptions& o, const std::string& name = "db") {
    std::string p = dir_ + "/" + name;
    Status s = MakeTestDb(p, o);
    EXPECT_TRUE(s.ok()) << s;
    return p;
  }
  std::string dir_;
};

}  // namespace testing
}  // namespace loongforge
