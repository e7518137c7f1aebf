// Test helpers for the LeRobot fixtures (tests/data/lerobot): where they are, and the frame code
// that tests/data/lerobot/make_videos.sh draws into every frame.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace loongforge::data {

// tests/data/lerobot/<name> in this source tree (LF_TEST_SOURCE_DIR, set by CMake).
inline std::string LeRobotFixture(const std::string& name) {
  return (std::filesystem::path(LF_TEST_SOURCE_DIR) / "tests" / "data" / "lerobot" / name).string();
}

struct FrameCode {
  int position = 0;  // frame's position in its video file (top row of blocks)
  int episode = 0;   // episode_index (bottom row)
};

// Reads the code of an RGB frame of any size: two rows of eight blocks, bit k of a row in block
// k, white = 1 (make_videos.sh). Samples the green channel at each block's centre.
inline FrameCode DecodeFrameCode(const uint8_t* rgb, int width, int height) {
  FrameCode c;
  for (int row = 0; row < 2; ++row)
    for (int k = 0; k < 8; ++k) {
      const int x = (2 * k + 1) * width / 16;
      const int y = (2 * row + 1) * height / 4;
      const bool one = rgb[(static_cast<size_t>(y) * width + x) * 3 + 1] > 128;
      (row == 0 ? c.position : c.episode) |= (one ? 1 : 0) << k;
    }
  return c;
}

}  // namespace loongforge::data
