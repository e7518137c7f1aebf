// Tests of the LeRobot import's parts (lerobot_import.h): info.json variants, episode lists, path
// templates, GR00T modality slices, quantiles, and PackLeRobot's refusal of bad sources with no
// DB left behind. Whole packs of the committed fixtures are tested in tests/python/test_lerobot.py.
#include "dataset/lerobot_import.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dataset/temp_dir_test_util.h"
#include "dataset/video_reader.h"
#include "loongforge/pack.h"

namespace loongforge::data::lerobot {
namespace {
namespace fs = std::filesystem;

constexpr const char* kInfoV21 = R"({
  "codebase_version": "v2.1", "fps": 30, "chunks_size": 1000,
  "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
  "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
  "features": {
    "observation.state": {"dtype": "float32", "shape": [6]},
    "action": {"dtype": "float32", "shape": [7]},
    "observation.images.hwc": {"dtype": "video", "shape": [96, 128, 3],
                               "names": ["height", "width", "channels"],
                               "info": {"video.codec": "av1"}},
    "observation.images.chw": {"dtype": "video", "shape": [3, 480, 640]},
    "observation.images.gr00t": {"dtype": "video", "shape": [224, 224, 3],
                                 "video_info": {"video.height": 240, "video.width": 320}}
  }})";

// Guards the shapes real files use: HWC with names, CHW without, GR00T's video_info (which wins
// over the shape), the codec.
TEST(LeRobotInfo, VideoShapesAndVideoInfo) {
  TempDir d;
  auto info = ParseInfo(d.Write("meta/info.json", kInfoV21));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->major, 2);
  EXPECT_EQ(info->minor, 1);
  EXPECT_EQ(info->fps, 30);
  const auto& f = info->features;
  EXPECT_EQ(f.at("observation.images.hwc").width, 128);
  EXPECT_EQ(f.at("observation.images.hwc").height, 96);
  EXPECT_EQ(f.at("observation.images.hwc").codec, "av1");
  EXPECT_EQ(f.at("observation.images.chw").width, 640);
  EXPECT_EQ(f.at("observation.images.chw").height, 480);
  EXPECT_EQ(f.at("observation.images.gr00t").width, 320);
  EXPECT_EQ(f.at("observation.images.gr00t").height, 240);
}

// Guards: an unknown codebase_version is refused naming the file, not read with wrong rules.
TEST(LeRobotInfo, UnknownVersionRefused) {
  TempDir d;
  std::string text = kInfoV21;
  text.replace(text.find("v2.1"), 4, "v1.6");
  const std::string path = d.Write("meta/info.json", text);
  auto info = ParseInfo(path);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find(path), std::string::npos);
  EXPECT_NE(info.status().message().find("v1.6"), std::string::npos);
}

// Guards --episodes parsing: lists, ranges, duplicates; junk refused.
TEST(LeRobotEpisodes, ListsAndRanges) {
  auto e = ParseEpisodeList("0,3,5-7, 3");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (std::vector<int64_t>{0, 3, 5, 6, 7}));
  EXPECT_FALSE(ParseEpisodeList("1,,2").ok());
  EXPECT_FALSE(ParseEpisodeList("7-3").ok());
  EXPECT_FALSE(ParseEpisodeList("a").ok());
  EXPECT_FALSE(ParseEpisodeList("-1").ok());
}

// Guards the path templates of both layouts (Note [LeRobot layouts]).
TEST(LeRobotPaths, FormatsTemplates) {
  auto v2 = FormatTemplate(
      "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
      {{"episode_chunk", 1}, {"episode_index", 1042}}, {{"video_key", "observation.images.top"}});
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(*v2, "videos/chunk-001/observation.images.top/episode_001042.mp4");
  auto v3 = FormatTemplate("data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                           {{"chunk_index", 0}, {"file_index", 12}}, {});
  ASSERT_TRUE(v3.ok());
  EXPECT_EQ(*v3, "data/chunk-000/file-012.parquet");
  EXPECT_FALSE(FormatTemplate("{nope}", {}, {}).ok());
  EXPECT_FALSE(FormatTemplate("{chunk_index:x}", {{"chunk_index", 0}}, {}).ok());
}

// Guards bad modality input: a modality slice out of range names the file, the slice and dims;
// a good file gives slices, renamed cameras and the task column.
TEST(LeRobotModality, SlicesCheckedAgainstDims) {
  TempDir d;
  const std::string good = d.Write("modality.json", R"({
    "state": {"gripper": {"start": 5, "end": 6}, "arm": {"start": 0, "end": 5}},
    "action": {"arm": {"start": 0, "end": 7}},
    "video": {"ego_view": {"original_key": "observation.images.ego"}},
    "annotation": {"human.action.task_description": {}}})");
  auto m = ParseModality(good, 6, 7);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->state.size(), 2u);
  EXPECT_EQ(m->state[0].name, "arm");
  EXPECT_EQ(m->state[1].start, 5);
  EXPECT_EQ(m->video.at(0).first, "ego_view");
  EXPECT_EQ(m->video.at(0).second, "observation.images.ego");
  EXPECT_EQ(m->task_column, "annotation.human.action.task_description");
  auto bad = ParseModality(good, 5, 7);  // state has 5 dims: gripper [5, 6) is out of range
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(good), std::string::npos);
  EXPECT_NE(bad.status().message().find("state.gripper"), std::string::npos);
  const std::string empty = d.Write("m2.json", R"({"action": {"a": {"start": 3, "end": 3}}})");
  EXPECT_FALSE(ParseModality(empty, 6, 7).ok());
}

// Guards: two slices of a group covering the same dimensions are refused naming both.
TEST(LeRobotModality, OverlappingSlicesRefused) {
  TempDir d;
  const std::string path = d.Write("modality.json", R"({
    "state": {"arm": {"start": 0, "end": 5}, "wrist": {"start": 4, "end": 6}}})");
  auto m = ParseModality(path, 6, 7);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  for (const char* needle : {"state.arm [0, 5)", "state.wrist [4, 6)", "overlap"})
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find(path), std::string::npos);
}

// Guards: a task_index listed twice with different texts is refused naming the line and both
// texts (before, the later text won silently); listed twice with the same text is accepted.
TEST(LeRobotTasks, DuplicateTaskIndexWithOtherTextRefused) {
  TempDir d;
  d.Write("meta/info.json", kInfoV21);
  auto info = ParseInfo((d.path() / "meta/info.json").string());
  ASSERT_TRUE(info.ok());
  d.Write("meta/tasks.jsonl",
          "{\"task_index\": 0, \"task\": \"pick\"}\n{\"task_index\": 0, \"task\": \"pick\"}\n");
  auto same = ReadTasks(d.path().string(), *info);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->at(0), "pick");
  d.Write("meta/tasks.jsonl",
          "{\"task_index\": 0, \"task\": \"pick\"}\n{\"task_index\": 0, \"task\": \"place\"}\n");
  auto t = ReadTasks(d.path().string(), *info);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  for (const char* needle : {"tasks.jsonl:2", "\"pick\"", "\"place\""})
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().ToString();
}

// Guards: metadata files that are directories are errors naming the path and its kind (before,
// std::ifstream threw basic_filebuf::underflow and the CLI aborted).
TEST(LeRobotInfo, DirectoryInsteadOfFileRefused) {
  TempDir d;
  fs::create_directories(d.path() / "meta/info.json");
  fs::create_directories(d.path() / "meta/modality.json");
  for (const char* rel : {"meta/info.json", "meta/modality.json"}) {
    const std::string path = (d.path() / rel).string();
    Status s = std::string(rel) == "meta/info.json" ? ParseInfo(path).status()
                                                    : ParseModality(path, 6, 7).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("directory"), std::string::npos) << s.ToString();
  }
  d.Write("meta/info.json.real", kInfoV21);
  auto info = ParseInfo((d.path() / "meta/info.json.real").string());
  ASSERT_TRUE(info.ok());
  fs::create_directories(d.path() / "meta/episodes.jsonl");
  auto e = ReadEpisodes(d.path().string(), *info, {});
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  EXPECT_NE(e.status().message().find("episodes.jsonl is a directory"), std::string::npos)
      << e.status().ToString();
}

// Guards: paths formed from metadata stay inside the dataset root: "..", absolute paths and
// symlinks out of the root are refused naming the template and the value; paths inside (also
// through a symlink that stays inside, or a ".." that comes back) are accepted.
TEST(LeRobotPaths, StayInsideTheRoot) {
  TempDir d;
  const std::string root = (d.path() / "ds").string();
  fs::create_directories(root + "/data/chunk-000");
  fs::create_directories(d.path() / "outside");
  fs::create_symlink(d.path() / "outside", root + "/data/escape");
  fs::create_symlink("chunk-000", root + "/data/alias");
  const std::string what = "info.json: data_path \"T\"";
  for (const char* bad : {"../outside/x.parquet", "data/../../outside/x.parquet",
                          "data/escape/x.parquet", "/etc/passwd", ""}) {
    auto p = PathInRoot(root, bad, what);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(what), std::string::npos) << p.status().ToString();
    EXPECT_NE(p.status().message().find("\"" + std::string(bad) + "\""), std::string::npos)
        << p.status().ToString();
  }
  for (const char* good : {"data/chunk-000/episode_000000.parquet", "data/alias/e.parquet",
                           "data/x/../chunk-000/e.parquet"}) {
    auto p = PathInRoot(root, good, what);
    ASSERT_TRUE(p.ok()) << good << ": " << p.status().ToString();
    EXPECT_EQ(*p, root + "/" + good);
  }
}

// Guards q01/q99: numpy.quantile's linear interpolation, per dimension.
TEST(LeRobotStats, QuantileMatchesNumpyLinear) {
  // Column 0: 0..100 (q01 = 1, q99 = 99); column 1: 0, 10 (q01 = 0.1, q99 = 9.9 for n = 2).
  std::vector<float> rows;
  for (int i = 0; i <= 100; ++i) rows.insert(rows.end(), {static_cast<float>(100 - i), 0.f});
  auto q01 = Quantile(rows, 2, 0.01), q99 = Quantile(rows, 2, 0.99);
  EXPECT_FLOAT_EQ(q01[0], 1.f);
  EXPECT_FLOAT_EQ(q99[0], 99.f);
  EXPECT_FLOAT_EQ(q01[1], 0.f);
  std::vector<float> two = {0.f, 10.f};
  EXPECT_NEAR(Quantile(two, 1, 0.01)[0], 0.1f, 1e-6);
  EXPECT_NEAR(Quantile(two, 1, 0.99)[0], 9.9f, 1e-6);
}

// Guards: a source without meta/info.json is NotFound naming it, and no DB or staging remains.
TEST(LeRobotPack, MissingInfoLeavesNoDb) {
  TempDir d;
  LeRobotPackOptions o;
  o.src = (d.path() / "not_a_dataset").string();
  o.out = (d.path() / "db").string();
  o.progress = false;
  fs::create_directories(o.src);
  auto r = PackLeRobot(o);
  ASSERT_FALSE(r.ok());
  if (HaveVideoDecoder()) {
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("meta/info.json"), std::string::npos);
  } else {
    EXPECT_NE(r.status().message().find("lacks FFmpeg"), std::string::npos);
  }
  for (const auto& e : fs::directory_iterator(d.path()))
    EXPECT_EQ(e.path().filename(), "not_a_dataset") << "left behind: " << e.path();
}

// Guards the CLI: one of --src / --from-lerobot is required, and a bad LeRobot source exits
// non-zero (< 128) with a line naming the file.
TEST(LeRobotPack, CliNamesTheFile) {
  TempDir d;
  const std::string out = (d.path() / "db").string();
  const std::string log = (d.path() / "log").string();
  std::string cmd = std::string(LF_TEST_CLI) + " pack --quiet --from-lerobot " +
                    (d.path() / "nope").string() + " --out " + out + " > " + log + " 2>&1";
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_NE(WEXITSTATUS(rc), 0);
  EXPECT_LT(WEXITSTATUS(rc), 128);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find(HaveVideoDecoder() ? "nope/meta/info.json" : "lacks FFmpeg"),
            std::string::npos)
      << text;
  EXPECT_FALSE(fs::exists(out));
  cmd = std::string(LF_TEST_CLI) + " pack --quiet --out " + out + " > " + log + " 2>&1";
  rc = std::system(cmd.c_str());
  EXPECT_NE(WEXITSTATUS(rc), 0);
}

}  // namespace
}  // namespace loongforge::data::lerobot
