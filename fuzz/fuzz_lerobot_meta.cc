// LeRobot metadata (src/dataset/lerobot_meta.cc). The first input byte picks the file the rest is:
//   0: meta/info.json (ParseInfo)        1: modality.json (ParseModality, dims 32 and 32)
//   2: meta/episodes.jsonl (ReadEpisodes) 3: meta/tasks.jsonl (ReadTasks)
//   4: an --episodes list ("0,3,5-9")    5: a path template with {episode_chunk:03d} etc.
// 2 and 3 read the file under a fixed, valid v2.1 info.json.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "dataset/lerobot_import.h"
#include "fuzz_util.h"

namespace lr = loongforge::data::lerobot;

namespace {
constexpr const char* kInfo = R"({
  "codebase_version": "v2.1", "fps": 10, "chunks_size": 1000, "total_episodes": 2,
  "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
  "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
  "features": {
    "observation.state": {"dtype": "float32", "shape": [4]},
    "action": {"dtype": "float32", "shape": [4]},
    "observation.images.front": {"dtype": "video", "shape": [48, 64, 3],
                                 "names": ["height", "width", "channels"]}
  }
})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string root = lf_fuzz::ScratchDir("lerobot_meta") + "/ds";
  switch (data[0] % 6) {
    case 0: {
      lf_fuzz::WriteFile(root + "/meta/info.json", rest);
      (void)lr::ParseInfo(root + "/meta/info.json");
      break;
    }
    case 1: {
      lf_fuzz::WriteFile(root + "/meta/modality.json", rest);
      (void)lr::ParseModality(root + "/meta/modality.json", 32, 32);
      break;
    }
    case 2:
    case 3: {
      lf_fuzz::WriteFile(root + "/meta/info.json", kInfo);
      auto info = lr::ParseInfo(root + "/meta/info.json");
      if (!info.ok()) {
        std::fprintf(stderr, "fuzz harness: fixed info.json rejected: %s\n",
                     info.status().ToString().c_str());
        std::abort();
      }
      const bool episodes = data[0] % 6 == 2;
      lf_fuzz::WriteFile(root + (episodes ? "/meta/episodes.jsonl" : "/meta/tasks.jsonl"), rest);
      if (episodes)
        (void)lr::ReadEpisodes(root, *info, {"observation.images.front"});
      else
        (void)lr::ReadTasks(root, *info);
      break;
    }
    case 4:
      (void)lr::ParseEpisodeList(std::string(rest));
      break;
    case 5:
      (void)lr::FormatTemplate(std::string(rest), {{"episode_chunk", 1}, {"episode_index", 42}},
                               {{"video_key", "observation.images.front"}});
      break;
  }
  return 0;
}
