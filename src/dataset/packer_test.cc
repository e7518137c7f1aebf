// Tests of the dataset format: demo-data -> pack -> RecordReader round trip, normalization stats,
// pack's validation of bad inputs (named errors, no DB left behind), inspect, and the CLI.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "dataset/pack_common.h"
#include "dataset/temp_dir_test_util.h"
#include "loongforge/dataset.h"
#include "loongforge/pack.h"
#include "loongforge/tokenizer.h"
#include "test_cli.h"
#include "test_dataset.h"

namespace loongforge::data {
namespace {
namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const fs::path& p, const std::string& data) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << data;
}

// A real JPEG of random content (not a constant image) of the given size.
std::string MakeJpeg(int w, int h, uint32_t seed) {
  std::vector<unsigned char> rgb(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(seed);
  for (auto& v : rgb) v = static_cast<unsigned char>(rng());
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0), 0);
  std::string out(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

template <typename T>
std::vector<T> AsVec(std::string_view v) {
  std::vector<T> out(v.size() / sizeof(T));
  std::memcpy(out.data(), v.data(), out.size() * sizeof(T));
  return out;
}

// Demo-data options: `episodes` episodes of `steps_min`..`steps_max` steps of `width`x`height`
// frames written under `out`, quietly.
DemoDataOptions DemoOpts(const fs::path& out, int episodes, int width, int height, int steps_min,
                         int steps_max) {
  DemoDataOptions o;
  o.out_dir = out.string();
  o.episodes = episodes;
  o.width = width;
  o.height = height;
  o.steps_min = steps_min;
  o.steps_max = steps_max;
  o.progress = false;
  return o;
}

// The schema of the DB at `db`; a default Schema, with a test failure, when it does not open.
Schema DbSchema(const fs::path& db) {
  auto reader = RecordReader::Open(db.string());
  EXPECT_TRUE(reader.ok()) << reader.status();
  return reader.ok() ? (*reader)->schema() : Schema{};
}

PackOptions Opts(const fs::path& src, const fs::path& out, int horizon = 3) {
  PackOptions o;
  o.src = src.string();
  o.out = out.string();
  o.horizon = horizon;
  o.threads = 2;
  o.progress = false;
  return o;
}

// ---- demo-data ----------------------------------------------------------------------------------

// Guards realism of synthetic frames: a 640x480 q90 frame must cost like a camera frame
// (flat-colour frames would be a few KB and make loader benchmarks meaningless).
// Guards the packers' read window: a task Take() gave up on after its timeout stays tracked, so
// Fail() waits for it before the caller's locals it uses go away (it used to be handed out and
// forgotten: a frame read past the 300 s timeout could outlive pack()).
TEST(OrderedWindow, FailWaitsForTheTaskTakeGaveUpOn) {
  ThreadPool pool(2, "window-test");
  std::atomic<bool> cancel{false}, finished{false};
  {
    OrderedWindow<int> w(&pool, 3, 2, &cancel, [&](size_t i) {
      if (i == 0) {
        while (!cancel.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // still busy after cancel
        finished = true;
      }
      return static_cast<int>(i);
    });
    auto r = w.Take(std::chrono::seconds(1));
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
    Status s = w.Fail(InternalError("give up"));
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_TRUE(finished.load()) << "Fail() returned while task 0 still ran";
  }
  // Results come in order when nothing times out.
  cancel = false;
  OrderedWindow<int> w(&pool, 4, 2, &cancel, [](size_t i) { return static_cast<int>(10 * i); });
  for (int i = 0; i < 4; ++i) {
    auto r = w.Take();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, 10 * i);
  }
}

TEST(DemoData, FrameJpegSizeIsRealistic) {
  std::vector<uint8_t> rgb = RenderDemoFrame(640, 480, 7, 0, 0, 0.3);
  ASSERT_EQ(rgb.size(), 640u * 480 * 3);
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, rgb.data(), 640, 0, 480, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0), 0);
  tjFree(buf);
  tjDestroy(tj);
  EXPECT_GT(size, 40000u);
  EXPECT_LT(size, 90000u);
  // The scene moves: a later frame of the same episode differs.
  EXPECT_NE(rgb, RenderDemoFrame(640, 480, 7, 0, 0, 0.8));
}

// Guards determinism: the generated dataset does not depend on the thread count.
TEST(DemoData, DeterministicAcrossThreads) {
  TempDir tmp;
  DemoDataOptions o = DemoOpts(tmp / "a", 3, 48, 32, 2, 4);
  o.seed = 5;
  o.threads = 1;
  ASSERT_TRUE(GenerateDemoData(o).ok());
  o.out_dir = (tmp / "b").string();
  o.threads = 3;
  ASSERT_TRUE(GenerateDemoData(o).ok());
  int files = 0;
  for (auto& e : fs::recursive_directory_iterator(tmp / "a")) {
    if (!e.is_regular_file()) continue;
    fs::path rel = fs::relative(e.path(), tmp / "a");
    EXPECT_EQ(ReadFile(e.path()), ReadFile(tmp / "b" / rel.string())) << rel;
    ++files;
  }
  EXPECT_GT(files, 3 * 3);
  // Existing output is refused without overwrite.
  EXPECT_EQ(GenerateDemoData(o).status().code(), StatusCode::kAlreadyExists);
}

// ---- round trip ---------------------------------------------------------------------------------

// Guards the whole format: every record read back equals what the episode folder says, with the
// action chunk built from the next `horizon` steps (last action repeated, amask 0 past the end).
TEST(Pack, DemoDataRoundTrip) {
  TempDir tmp;
  DemoDataOptions d = DemoOpts(tmp / "src", 3, 64, 48, 3, 7);
  d.cameras = 2;
  d.state_dim = 5;
  d.action_dim = 7;
  auto gen = GenerateDemoData(d);
  ASSERT_TRUE(gen.ok()) << gen.status();
  const int horizon = 4;
  auto packed = PackEpisodes(Opts(tmp / "src", tmp / "db", horizon));
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_FALSE(fs::exists(tmp / "db.partial"));

  auto reader = RecordReader::Open((tmp / "db").string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Schema& s = (*reader)->schema();
  EXPECT_EQ(s.num_samples, gen->steps);
  EXPECT_EQ(s.num_episodes, 3);
  EXPECT_EQ(s.cameras, (std::vector<std::string>{"front", "wrist"}));
  EXPECT_EQ(s.image_width, 64);
  EXPECT_EQ(s.image_height, 48);
  EXPECT_EQ(s.state_dim, 5);
  EXPECT_EQ(s.action_dim, 7);
  EXPECT_EQ(s.action_horizon, horizon);
  EXPECT_EQ(s.tokenizer, "byte-v1");
  EXPECT_EQ(s.vocab_size, 259);
  auto keys = (*reader)->Keys();
  ASSERT_TRUE(keys.ok());
  // 2 cams + state, action, action mask, tokens, meta, task text + schema.
  EXPECT_EQ(static_cast<int64_t>(keys->size()), s.num_samples * 8 + 1);
  EXPECT_NE(std::find(keys->begin(), keys->end(), SampleKey(0, "task")), keys->end());

  ByteTokenizer tok;
  auto txn = (*reader)->Begin();
  ASSERT_TRUE(txn.ok());
  int64_t id = 0;
  int max_tokens = 0;
  std::vector<std::string> eps;
  for (auto& e : fs::directory_iterator(tmp / "src" / "episodes"))
    if (e.is_directory()) eps.push_back(e.path().filename());  // not demo-data's marker file
  std::sort(eps.begin(), eps.end());
  for (size_t e = 0; e < eps.size(); ++e) {
    fs::path dir = tmp / "src" / "episodes" / eps[e];
    std::vector<nlohmann::json> rows;
    std::ifstream in(dir / "steps.jsonl");
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
    for (size_t t = 0; t < rows.size(); ++t, ++id) {
      auto get = [&](const std::string& m) {
        auto v = txn->Get(SampleKey(id, m));
        EXPECT_TRUE(v.ok()) << v.status();
        return v.ok() ? std::string(*v) : std::string();
      };
      EXPECT_EQ(get("cam_front"), ReadFile(dir / "cam_front" / (std::to_string(t) + ".jpg")));
      EXPECT_EQ(get("cam_wrist"), ReadFile(dir / "cam_wrist" / (std::to_string(t) + ".jpg")));
      std::vector<float> state;
      for (double v : rows[t]["state"]) state.push_back(static_cast<float>(v));
      EXPECT_EQ(AsVec<float>(get("state")), state);
      std::vector<float> chunk;
      std::vector<uint8_t> mask;
      for (int k = 0; k < horizon; ++k) {
        size_t src = std::min(t + k, rows.size() - 1);
        for (double v : rows[src]["action"]) chunk.push_back(static_cast<float>(v));
        mask.push_back(t + k < rows.size());
      }
      EXPECT_EQ(AsVec<float>(get("action")), chunk) << "sample " << id;
      EXPECT_EQ(AsVec<uint8_t>(get("amask")), mask);
      EXPECT_EQ(AsVec<int32_t>(get("meta")),
                (std::vector<int32_t>{static_cast<int32_t>(e), static_cast<int32_t>(t)}));
      auto ids = tok.Encode(rows[t]["instruction"].get<std::string>());
      EXPECT_EQ(AsVec<int32_t>(get("tokens")), ids);
      max_tokens = std::max(max_tokens, static_cast<int>(ids.size()));
    }
  }
  EXPECT_EQ(id, s.num_samples);
  EXPECT_EQ(s.max_tokens, max_tokens);

  // inspect decodes the same sample.
  auto js = InspectJson((tmp / "db").string(), 1);
  ASSERT_TRUE(js.ok()) << js.status();
  auto j = nlohmann::json::parse(*js);
  EXPECT_EQ(j["sample"]["step"], 1);
  EXPECT_EQ(j["sample"]["cameras"]["front"]["width"], 64);
  EXPECT_EQ(j["modalities"]["cam_wrist"]["count"], s.num_samples);
  EXPECT_EQ(InspectJson((tmp / "db").string(), s.num_samples).status().code(),
            StatusCode::kOutOfRange);
  auto text = InspectText((tmp / "db").string(), 0);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("cameras front, wrist (64x48)"), std::string::npos) << *text;
}

// ---- a hand-made tiny episode set -------------------------------------------------------------

// Episodes "2" (steps 0..2) and "10" (steps 0..1), cameras a and b, 2-d state, 1-d action.
void MakeTinySet(const fs::path& src) {
  const char* ep2 =
      "{\"step\": 0, \"state\": [1, 10], \"action\": [0.5], \"instruction\": \"go\"}\n"
      "{\"step\": 1, \"state\": [3, 10], \"action\": [1.5], \"instruction\": \"go\"}\n"
      "\n"
      "{\"step\": 2, \"state\": [5, 10], \"action\": [2.5], \"instruction\": \"go\"}\n";
  const char* ep10 =
      "{\"step\": 0, \"state\": [7, 20], \"action\": [-1], \"instruction\": \"stop now\"}\r\n"
      "{\"step\": 1, \"state\": [9, 20], \"action\": [-3], \"instruction\": \"stop now\"}\r\n";
  WriteFile(src / "episodes" / "2" / "steps.jsonl", ep2);
  WriteFile(src / "episodes" / "10" / "steps.jsonl", ep10);
  uint32_t seed = 1;
  for (const char* ep : {"2", "10"}) {
    int n = std::string(ep) == "2" ? 3 : 2;
    for (const char* cam : {"a", "b"})
      for (int t = 0; t < n; ++t)
        WriteFile(
            src / "episodes" / ep / (std::string("cam_") + cam) / (std::to_string(t) + ".jpg"),
            MakeJpeg(16, 8, seed++));
  }
}

// Guards normalization stats and natural episode order ("2" before "10") on known numbers.
TEST(Pack, StatsOnHandMadeEpisodes) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  auto r = PackEpisodes(Opts(tmp / "src", tmp / "db", 3));
  ASSERT_TRUE(r.ok()) << r.status();
  auto reader = RecordReader::Open((tmp / "db").string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Schema& s = (*reader)->schema();
  EXPECT_EQ(s.num_samples, 5);
  EXPECT_EQ(s.num_episodes, 2);
  EXPECT_EQ(s.cameras, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.image_width, 16);
  EXPECT_EQ(s.image_height, 8);
  // state dim 0: 1 3 5 7 9 -> mean 5, population std sqrt(8); dim 1: 10 10 10 20 20.
  ASSERT_EQ(s.state_mean.size(), 2u);
  EXPECT_FLOAT_EQ(s.state_mean[0], 5);
  EXPECT_FLOAT_EQ(s.state_std[0], std::sqrt(8.0f));
  EXPECT_FLOAT_EQ(s.state_min[0], 1);
  EXPECT_FLOAT_EQ(s.state_max[0], 9);
  EXPECT_FLOAT_EQ(s.state_mean[1], 14);
  EXPECT_FLOAT_EQ(s.state_std[1], std::sqrt(24.0f));
  // action: 0.5 1.5 2.5 -1 -3 -> mean 0.1, var (0.16+1.96+5.76+1.21+9.61)/5 = 3.74.
  EXPECT_FLOAT_EQ(s.action_mean[0], 0.1f);
  EXPECT_NEAR(s.action_std[0], std::sqrt(3.74), 1e-6);
  EXPECT_FLOAT_EQ(s.action_min[0], -3);
  EXPECT_FLOAT_EQ(s.action_max[0], 2.5);
  EXPECT_EQ(s.max_tokens, 10);  // bos + "stop now" + eos
  auto txn = (*reader)->Begin();
  ASSERT_TRUE(txn.ok());
  // Sample 3 is episode "10" step 0: chunk [-1, -3, -3], mask [1, 1, 0].
  EXPECT_EQ(AsVec<int32_t>(*txn->Get(SampleKey(3, "meta"))), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(AsVec<float>(*txn->Get(SampleKey(3, "action"))), (std::vector<float>{-1, -3, -3}));
  EXPECT_EQ(AsVec<uint8_t>(*txn->Get(SampleKey(3, "amask"))), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(AsVec<float>(*txn->Get(SampleKey(2, "state"))), (std::vector<float>{5, 10}));
  EXPECT_EQ(std::string(*txn->Get(SampleKey(4, "cam_b"))),
            ReadFile(tmp / "src" / "episodes" / "10" / "cam_b" / "1.jpg"));
}

// ---- bad inputs ---------------------------------------------------------------------------------

struct BadCase {
  Status status;
  bool out_exists, partial_exists;
};

BadCase PackBad(const TempDir& tmp) {
  auto r = PackEpisodes(Opts(tmp / "src", tmp / "db"));
  return {r.ok() ? Status::Ok() : r.status(), fs::exists(tmp / "db"),
          fs::exists(tmp / "db.partial")};
}

#define EXPECT_PACK_FAILS(tmp, expected_code, ...)                                    \
  do {                                                                                \
    BadCase bc = PackBad(tmp);                                                        \
    EXPECT_EQ(bc.status.code(), expected_code) << bc.status;                          \
    for (const std::string& part : std::vector<std::string>{__VA_ARGS__})             \
      EXPECT_NE(bc.status.message().find(part), std::string::npos)                    \
          << "'" << part << "' not in: " << bc.status.message();                      \
    EXPECT_FALSE(bc.out_exists) << "a failed pack left a DB";                         \
    EXPECT_FALSE(bc.partial_exists) << "a failed pack left the .partial staging dir"; \
  } while (0)

fs::path Ep(const TempDir& tmp, const char* ep) { return tmp / "src" / "episodes" / ep; }

// Guards: a frame that is not a JPEG is named (caught in the parallel read phase, after records
// have been written, so this also checks the staging dir is removed).
TEST(PackRejects, NonJpegFrame) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path bad = Ep(tmp, "10") / "cam_b" / "1.jpg";
  WriteFile(bad, "this is not a jpeg, just text pretending");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, bad.string() + ": not a JPEG");
}

// Guards: a JPEG cut short (header intact) is caught by the end-of-image check.
TEST(PackRejects, TruncatedJpeg) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path bad = Ep(tmp, "2") / "cam_a" / "2.jpg";
  std::string data = ReadFile(bad);
  WriteFile(bad, data.substr(0, data.size() - 30));  // scan data cut short, header intact
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, bad.string(), "truncated JPEG");
}

// Guards: all frames must share one size; the odd one is named with both sizes.
TEST(PackRejects, FrameSizeMismatch) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path bad = Ep(tmp, "10") / "cam_a" / "0.jpg";
  WriteFile(bad, MakeJpeg(32, 24, 99));
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, bad.string(),
                    "frame is 32x24, expected 16x8");
}

// Guards: a frame whose header claims more pixels than max_frame_pixels is refused from its
// header, naming the file, the claimed size and the bound (the loader would refuse every record
// of it, after a 12 GiB allocation per 65500x65500 frame without the bound).
TEST(PackRejects, FrameOverPixelBound) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path bad = Ep(tmp, "10") / "cam_a" / "1.jpg";
  WriteFile(bad, testing::WithClaimedSize(ReadFile(bad), 65500, 65500));
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, bad.string(),
                    "JPEG header claims 65500x65500 = 4290250000 pixels",
                    "over max_frame_pixels 67108864");
  // The bound is the option's, inclusive: 16x8 frames pass 128 and fail 127, at the first frame.
  TempDir tmp2;
  MakeTinySet(tmp2 / "src");
  PackOptions o = Opts(tmp2 / "src", tmp2 / "db");
  o.max_frame_pixels = 127;
  auto r = PackEpisodes(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("16x8 = 128 pixels, over max_frame_pixels 127"),
            std::string::npos)
      << r.status();
  EXPECT_FALSE(fs::exists(tmp2 / "db"));
  o.max_frame_pixels = 128;
  EXPECT_TRUE(PackEpisodes(o).ok());
}

// Guards: a step with no frame in one camera is named (file and step).
TEST(PackRejects, MissingStepFrame) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::remove(Ep(tmp, "2") / "cam_b" / "1.jpg");
  EXPECT_PACK_FAILS(tmp, StatusCode::kNotFound, (Ep(tmp, "2") / "cam_b" / "1.jpg").string(),
                    "missing frame for step 1");
}

// Guards: a frame beyond the last step is an error, not silently dropped.
TEST(PackRejects, FrameWithoutStep) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  WriteFile(Ep(tmp, "10") / "cam_a" / "5.jpg", MakeJpeg(16, 8, 5));
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, (Ep(tmp, "10") / "cam_a" / "5.jpg").string(),
                    "has only 2 steps");
}

// Guards: a camera folder missing from one episode is named.
TEST(PackRejects, MissingCamera) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::remove_all(Ep(tmp, "10") / "cam_b");
  EXPECT_PACK_FAILS(tmp, StatusCode::kNotFound, (Ep(tmp, "10") / "cam_b").string(),
                    "missing camera folder");
}

// Guards: ragged dims within one file name file:line and expected vs got.
TEST(PackRejects, RaggedStateDims) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path f = Ep(tmp, "2") / "steps.jsonl";
  WriteFile(f,
            "{\"step\": 0, \"state\": [1, 10], \"action\": [0.5], \"instruction\": \"go\"}\n"
            "{\"step\": 1, \"state\": [3, 10, 4], \"action\": [1.5], \"instruction\": \"go\"}\n"
            "{\"step\": 2, \"state\": [5, 10], \"action\": [2.5], \"instruction\": \"go\"}\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, f.string() + ":2",
                    "state has 3 dims, expected 2");
}

// Guards: ragged action dims across episodes name the later file and the first one.
TEST(PackRejects, RaggedActionDimsAcrossEpisodes) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path f = Ep(tmp, "10") / "steps.jsonl";
  WriteFile(f,
            "{\"step\": 0, \"state\": [7, 20], \"action\": [-1, 0], \"instruction\": \"x\"}\n"
            "{\"step\": 1, \"state\": [9, 20], \"action\": [-3, 0], \"instruction\": \"x\"}\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, f.string() + ":1",
                    "action has 2 dims, expected 1", (Ep(tmp, "2") / "steps.jsonl").string());
}

// Guards: a line that is not JSON is named by file:line.
TEST(PackRejects, BadJsonLine) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path f = Ep(tmp, "10") / "steps.jsonl";
  WriteFile(f,
            "{\"step\": 0, \"state\": [7, 20], \"action\": [-1], \"instruction\": \"x\"}\n"
            "{\"step\": 1, \"state\": [9, 20], \"action\": [-3], \"instr\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, f.string() + ":2: not valid JSON");
}

// Guards: a missing or mistyped field is named with file:line.
TEST(PackRejects, MissingOrMistypedField) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path f = Ep(tmp, "10") / "steps.jsonl";
  WriteFile(f, "{\"step\": 0, \"state\": [7, 20], \"action\": [-1]}\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, f.string() + ":1: missing \"instruction\"");
  WriteFile(f, "{\"step\": 0, \"state\": [7, \"a\"], \"action\": [-1], \"instruction\": \"x\"}\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument,
                    f.string() + ":1: \"state\"[1] is not a number");
}

// Guards: step numbers must run 0, 1, 2, ... without gaps.
TEST(PackRejects, NonContiguousSteps) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path f = Ep(tmp, "2") / "steps.jsonl";
  WriteFile(f,
            "{\"step\": 0, \"state\": [1, 10], \"action\": [0.5], \"instruction\": \"go\"}\n"
            "{\"step\": 2, \"state\": [5, 10], \"action\": [2.5], \"instruction\": \"go\"}\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument,
                    f.string() + ":2: step 2 where step 1 was expected");
}

// Guards: missing steps.jsonl, an empty episodes folder and a missing one are named.
TEST(PackRejects, MissingStepsFileAndEmptyEpisodes) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::remove(Ep(tmp, "10") / "steps.jsonl");
  EXPECT_PACK_FAILS(tmp, StatusCode::kNotFound, (Ep(tmp, "10") / "steps.jsonl").string());
  fs::remove_all(tmp / "src" / "episodes");
  EXPECT_PACK_FAILS(tmp, StatusCode::kNotFound, (tmp / "src" / "episodes").string());
  fs::create_directories(tmp / "src" / "episodes");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, "no episode folders");
}

// Guards determinism of error reports: with bad inputs in two episodes, the one earlier in episode
// order is reported whatever the thread count.
TEST(PackRejects, FirstErrorInEpisodeOrder) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  WriteFile(Ep(tmp, "10") / "steps.jsonl", "not json\n");
  WriteFile(Ep(tmp, "2") / "cam_a" / "2.jpg", "not a jpeg either");
  for (int threads : {1, 4}) {
    PackOptions o = Opts(tmp / "src", tmp / "db");
    o.threads = threads;
    auto r = PackEpisodes(o);
    // Scan errors (steps.jsonl) come before frame errors, found while writing.
    EXPECT_NE(r.status().message().find((Ep(tmp, "10") / "steps.jsonl").string() + ":1"),
              std::string::npos)
        << r.status();
  }
  WriteFile(Ep(tmp, "10") / "steps.jsonl",
            "{\"step\": 0, \"state\": [7, 20], \"action\": [-1], \"instruction\": \"x\"}\n");
  fs::remove_all(Ep(tmp, "10") / "cam_a" / "1.jpg");
  fs::remove_all(Ep(tmp, "10") / "cam_b" / "1.jpg");
  WriteFile(Ep(tmp, "10") / "cam_b" / "0.jpg", "bad too");
  for (int threads : {1, 4}) {
    PackOptions o = Opts(tmp / "src", tmp / "db");
    o.threads = threads;
    auto r = PackEpisodes(o);
    EXPECT_NE(r.status().message().find((Ep(tmp, "2") / "cam_a" / "2.jpg").string()),
              std::string::npos)
        << r.status();
  }
}

// Guards atomic replacement: an existing DB is refused without overwrite, and a failed
// overwrite leaves the old DB readable and no staging directory.
TEST(PackRejects, FailedOverwriteKeepsOldDb) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  ASSERT_TRUE(PackEpisodes(Opts(tmp / "src", tmp / "db")).ok());
  EXPECT_EQ(PackEpisodes(Opts(tmp / "src", tmp / "db")).status().code(),
            StatusCode::kAlreadyExists);
  WriteFile(Ep(tmp, "10") / "cam_a" / "1.jpg", "garbage");
  PackOptions o = Opts(tmp / "src", tmp / "db");
  o.overwrite = true;
  EXPECT_EQ(PackEpisodes(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(tmp / "db.partial"));
  EXPECT_EQ(DbSchema(tmp / "db").num_samples, 5);
}

// Guards: pack --overwrite onto a user's folder is refused and the folder is left as
// it was (it used to be deleted and replaced by the DB); an existing DB is still replaced.
TEST(PackRejects, OverwriteKeepsAUserFolder) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::create_directories(tmp / "w");
  WriteFile(tmp / "w" / "keep", "k");
  PackOptions o = Opts(tmp / "src", tmp / "w");
  o.overwrite = true;
  auto r = PackEpisodes(o);
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists) << r.status();
  EXPECT_NE(
      r.status().message().find((tmp / "w").string() + " exists and is not a LoongForge dataset"),
      std::string::npos)
      << r.status();
  EXPECT_EQ(ReadFile(tmp / "w" / "keep"), "k");
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp / "w"), fs::directory_iterator()), 1);
  // The source folder itself is not a DB either.
  o.out = (tmp / "src").string();
  EXPECT_EQ(PackEpisodes(o).status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(fs::exists(tmp / "src" / "episodes" / "2" / "steps.jsonl"));
  // A DB is replaced.
  ASSERT_TRUE(PackEpisodes(Opts(tmp / "src", tmp / "db")).ok());
  o.out = (tmp / "db").string();
  o.horizon = 2;
  ASSERT_TRUE(PackEpisodes(o).ok());
  EXPECT_EQ(DbSchema(tmp / "db").action_horizon, 2);
}

// Guards: a user's folder named "<out>.partial" survives a pack (it used to be taken
// for the staging directory and deleted).
TEST(Pack, UserPartialFolderIsKept) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  WriteFile(tmp / "db.partial" / "notes.txt", "mine");
  ASSERT_TRUE(PackEpisodes(Opts(tmp / "src", tmp / "db")).ok());
  EXPECT_EQ(ReadFile(tmp / "db.partial" / "notes.txt"), "mine");
}

// Guards: an instruction over the limit is refused naming file:line, episode and the
// limit (a 100k-character one used to be packed silently); a raised limit accepts it.
TEST(PackRejects, InstructionOverTheLimit) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path f = Ep(tmp, "10") / "steps.jsonl";
  const std::string huge(100000, 'a');
  WriteFile(f,
            "{\"step\": 0, \"state\": [7, 20], \"action\": [-1], \"instruction\": \"stop\"}\n"
            "{\"step\": 1, \"state\": [9, 20], \"action\": [-3], \"instruction\": \"" +
                huge + "\"}\n");
  EXPECT_PACK_FAILS(tmp, StatusCode::kInvalidArgument, f.string() + ":2",
                    "of episode 10 has 100000 bytes, more than the limit of 4096");
  PackOptions o = Opts(tmp / "src", tmp / "db");
  o.max_instruction_bytes = 100000;
  auto r = PackEpisodes(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->schema.max_tokens, 100002);
}

// Guards: option values out of range are refused by the library (every caller), not
// only by the CLI: threads -3 used to be accepted.
TEST(PackRejects, BadOptions) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  for (auto set : std::vector<std::function<void(PackOptions*)>>{
           [](PackOptions* o) { o->threads = -3; }, [](PackOptions* o) { o->horizon = 0; },
           [](PackOptions* o) { o->max_instruction_bytes = 0; },
           [](PackOptions* o) { o->max_frame_pixels = 0; }, [](PackOptions* o) { o->out = "."; }}) {
    PackOptions o = Opts(tmp / "src", tmp / "db");
    set(&o);
    auto r = PackEpisodes(o);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_FALSE(fs::exists(tmp / "db"));
  }
}

// A tokenizer that returns an id one past its vocabulary for any text with an 'x' in it.
class OffByOneTokenizer : public ByteTokenizer {
 public:
  std::string id() const override { return "test-off-by-one"; }
  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids = ByteTokenizer::Encode(text);
    if (text.find('x') != std::string_view::npos) ids[1] = kVocabSize;
    return ids;
  }
};

// Guards: ids at or above the vocabulary never reach the DB, whatever tokenizer is
// registered; the error names the tokenizer, the id and the instruction's file:line.
TEST(PackRejects, TokenizerIdOutsideVocabulary) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  RegisterTokenizer("test-off-by-one", []() -> StatusOr<std::unique_ptr<Tokenizer>> {
    return std::unique_ptr<Tokenizer>(new OffByOneTokenizer());
  });
  PackOptions o = Opts(tmp / "src", tmp / "db");
  o.tokenizer = "test-off-by-one";
  ASSERT_TRUE(PackEpisodes(o).ok());  // no 'x' in the tiny set's instructions
  fs::path f = Ep(tmp, "10") / "steps.jsonl";
  WriteFile(f,
            "{\"step\": 0, \"state\": [7, 20], \"action\": [-1], \"instruction\": \"x\"}\n"
            "{\"step\": 1, \"state\": [9, 20], \"action\": [-3], \"instruction\": \"x\"}\n");
  o.out = (tmp / "db2").string();
  auto r = PackEpisodes(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("tokenizer 'test-off-by-one' returned token id 259"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find(f.string() + ":1"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(tmp / "db2"));
}

// Guards the reading side: inspect refuses a token record with an id outside the
// vocabulary, naming the record.
TEST(Inspect, OutOfVocabularyTokenIsDataLoss) {
  TempDir tmp;
  testing::TestDbOptions t;
  t.samples = 4;
  t.out_of_vocab_tokens = {2};
  ASSERT_TRUE(testing::MakeTestDb((tmp / "db").string(), t).ok());
  EXPECT_TRUE(InspectJson((tmp / "db").string(), 1).ok());
  auto r = InspectJson((tmp / "db").string(), 2);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("record '00000002_tokens': token id 259"), std::string::npos)
      << r.status();
}

// Guards: camera names that repeat (they used to share one folder, so half the
// frames claimed were written) and negative thread counts are refused.
TEST(DemoData, RefusesRepeatedCameraNamesAndBadThreads) {
  TempDir tmp;
  DemoDataOptions o = DemoOpts(tmp / "d", 1, 16, 16, 2, 2);
  o.cameras = 2;
  o.camera_names = {"a", "a"};
  auto r = GenerateDemoData(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("camera name 'a' is given twice"), std::string::npos);
  o.camera_names = {"a", "b"};
  o.threads = -1;
  EXPECT_EQ(GenerateDemoData(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(tmp / "d" / "episodes"));
}

// Guards the output rule for demo-data: overwrite replaces only demo data (marked), never a
// folder of recorded episodes, and a user's "episodes.partial" folder is left alone.
TEST(DemoData, OverwriteReplacesOnlyDemoData) {
  TempDir tmp;
  DemoDataOptions o = DemoOpts(tmp / "d", 1, 16, 16, 2, 2);
  o.overwrite = true;
  WriteFile(tmp / "d" / "episodes" / "rec1" / "steps.jsonl", "recorded");
  WriteFile(tmp / "d" / "episodes.partial" / "notes", "mine");
  auto r = GenerateDemoData(o);
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists) << r.status();
  EXPECT_NE(r.status().message().find("was not written by demo-data"), std::string::npos);
  EXPECT_EQ(ReadFile(tmp / "d" / "episodes" / "rec1" / "steps.jsonl"), "recorded");
  fs::rename(tmp / "d" / "episodes", tmp / "recorded");
  ASSERT_TRUE(GenerateDemoData(o).ok());
  o.steps_min = o.steps_max = 3;
  auto again = GenerateDemoData(o);  // replaces the demo data written just before
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->steps, 3);
  EXPECT_EQ(ReadFile(tmp / "d" / "episodes.partial" / "notes"), "mine");
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(tmp / "d")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"episodes", "episodes.partial"}));
  // pack ignores the marker file.
  EXPECT_TRUE(PackEpisodes(Opts(tmp / "d", tmp / "db")).ok());
}

// ---- CLI ----------------------------------------------------------------------------------------

using testing::CliResult;
using testing::RunCli;

// Guards the CLI edge: a bad input gives exit code 2 and one line naming the file; the good path
// (demo-data -> pack -> inspect --json) works end to end.
TEST(PackCli, ExitCodesAndErrorLine) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  fs::path bad = Ep(tmp, "2") / "cam_a" / "0.jpg";
  WriteFile(bad, "GIF89a not a jpeg");
  CliResult r =
      RunCli("pack --quiet --src " + (tmp / "src").string() + " --out " + (tmp / "db").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(
      r.output.find("loongforge pack: error: InvalidArgument: " + bad.string() + ": not a JPEG"),
      std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(tmp / "db"));
  EXPECT_FALSE(fs::exists(tmp / "db.partial"));

  r = RunCli("demo-data --quiet --out " + (tmp / "demo").string() +
             " --episodes 2 --cameras 3 --size 40x30 --steps-min 2 --steps-max 3 --state-dim 4 "
             "--action-dim 6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunCli("pack --quiet --horizon 2 --src " + (tmp / "demo").string() + " --out " +
             (tmp / "demo_db").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunCli("inspect --json --sample 1 " + (tmp / "demo_db").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["schema"]["cameras"], (std::vector<std::string>{"front", "side", "wrist"}));
  EXPECT_EQ(j["schema"]["action_dim"], 6);
  EXPECT_EQ(j["sample"]["cameras"]["side"]["height"], 30);
  r = RunCli("inspect " + (tmp / "nope").string());
  EXPECT_EQ(r.exit_code, 3) << r.output;
}

// Guards the CLI: `pack --overwrite` onto a user's folder and onto '.' exits
// non-zero with one line and leaves every file (the repro: w/keep used to be deleted, exit 0).
TEST(PackCli, OverwriteNeverDeletesUserFiles) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  WriteFile(tmp / "w" / "keep", "k");
  CliResult r = RunCli("pack --quiet --src " + (tmp / "src").string() + " --out " +
                       (tmp / "w").string() + " --overwrite");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("AlreadyExists: " + (tmp / "w").string() +
                          " exists and is not a LoongForge dataset"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(ReadFile(tmp / "w" / "keep"), "k");
  r = RunCli("pack --quiet --src " + (tmp / "src").string() + " --out " + (tmp / "w").string() +
             "/. --overwrite");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = RunCli("pack --quiet --src " + (tmp / "src").string() + " --out . --overwrite");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(ReadFile(tmp / "w" / "keep"), "k");
  EXPECT_TRUE(fs::exists(tmp / "src" / "episodes"));
}

// Guards the CLI: inspect on a truncated or empty data.mdb exits 4 (DataLoss) with
// a line naming the file, instead of dying of SIGBUS (exit 135) or "Internal: Bad file
// descriptor".
TEST(PackCli, DamagedDataFileIsOneLine) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  ASSERT_TRUE(PackEpisodes(Opts(tmp / "src", tmp / "db")).ok());
  const fs::path data = tmp / "db" / "data.mdb";
  fs::resize_file(data, fs::file_size(data) / 2);
  CliResult r = RunCli("inspect " + (tmp / "db").string());
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("loongforge inspect: error: DataLoss: " + data.string() + ": truncated"),
            std::string::npos)
      << r.output;
  fs::resize_file(data, 0);
  r = RunCli("inspect " + (tmp / "db").string());
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find(data.string() + ": empty (0 bytes)"), std::string::npos) << r.output;
}

// Guards: a write that runs out of room is ResourceExhausted (exit 5) naming data.mdb,
// not "DataLoss: Input/output error". LMDB turns the short write at the limit into EIO; a
// file-size limit (ulimit -f, SIGXFSZ ignored) makes the same short write as a full disk.
TEST(PackCli, FullDiskIsResourceExhausted) {
  TempDir tmp;
  DemoDataOptions d = DemoOpts(tmp / "src", 2, 64, 48, 20, 20);
  ASSERT_TRUE(GenerateDemoData(d).ok());
  const std::string cmd = "sh -c \"trap '' XFSZ; ulimit -f 200; exec " + std::string(LF_TEST_CLI) +
                          " pack --quiet --src " + (tmp / "src").string() + " --out " +
                          (tmp / "db").string() + "\" 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(st)) << out;
  EXPECT_EQ(WEXITSTATUS(st), 5) << out;
  EXPECT_NE(out.find("ResourceExhausted: "), std::string::npos) << out;
  EXPECT_NE(out.find("/data.mdb, staged for " + (tmp / "db").string()), std::string::npos) << out;
  for (auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename(), "src") << "left behind: " << e.path();
}

// Guards: two packs started together on one --out: exactly one succeeds, the other
// fails with one line (the lock, or the DB the first one published), and the DB is readable (both
// used to exit 0 with no DB left).
TEST(PackCli, ConcurrentPacksToOneOutput) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  const std::string pack = std::string(LF_TEST_CLI) + " pack --quiet --src " +
                           (tmp / "src").string() + " --out " + (tmp / "db").string();
  const std::string cmd = "(" + pack + " > " + (tmp / "a.out").string() + " 2>&1; echo $? > " +
                          (tmp / "a.rc").string() + ") & (" + pack + " > " +
                          (tmp / "b.out").string() + " 2>&1; echo $? > " + (tmp / "b.rc").string() +
                          ") & wait";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const int a = std::stoi(ReadFile(tmp / "a.rc")), b = std::stoi(ReadFile(tmp / "b.rc"));
  EXPECT_EQ((a == 0) + (b == 0), 1) << ReadFile(tmp / "a.out") << ReadFile(tmp / "b.out");
  const std::string failed = ReadFile(tmp / (a == 0 ? "b.out" : "a.out"));
  EXPECT_TRUE(failed.find("is being written by another pack") != std::string::npos ||
              failed.find("already exists") != std::string::npos)
      << failed;
  EXPECT_EQ(DbSchema(tmp / "db").num_samples, 5);
}

// Guards the CLI: --threads -3 and --camera-names a,a exit 2 with one line.
TEST(PackCli, BadValuesAreRefused) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  CliResult r = RunCli("pack --quiet --threads -3 --src " + (tmp / "src").string() + " --out " +
                       (tmp / "db").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("threads must be in 0..1024"), std::string::npos) << r.output;
  r = RunCli("demo-data --quiet --out " + (tmp / "d").string() +
             " --episodes 1 --size 16x16 --steps-min 2 --steps-max 2 --camera-names a,a");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("camera name 'a' is given twice"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "db"));
  EXPECT_FALSE(fs::exists(tmp / "d" / "episodes"));
}

// Guards: any legal output name (up to NAME_MAX = 255 bytes) can be packed; its lock file and
// staging directory get a short hashed name when "<name>.partial.XXXXXX" would not fit, and
// nothing but the DB is left afterwards.
TEST(Pack, LongestOutputNamesFit) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  for (size_t len : {240, 241, 250, 255}) {
    const fs::path out = tmp / std::string(len, 'a' + static_cast<char>(len % 26));
    auto r = PackEpisodes(Opts(tmp / "src", out));
    ASSERT_TRUE(r.ok()) << len << ": " << r.status();
    EXPECT_EQ(DbSchema(out).num_samples, 5);
  }
  size_t entries = 0;
  for (auto& e : fs::directory_iterator(tmp.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename().string().find(".lf-"), std::string::npos) << e.path();
    EXPECT_EQ(e.path().extension(), "") << "left behind: " << e.path();
  }
  EXPECT_EQ(entries, 5u);  // src and the four DBs
}

// Guards: the lock file names its writer (pid and host), a stale lock of a dead writer on this
// host is taken over, and one written on another host (whose flock this host may not see on a
// network filesystem) is refused, naming that host.
TEST(Pack, LockRecordsOwnerAndStaleLockIsCleared) {
  TempDir tmp;
  MakeTinySet(tmp / "src");
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const fs::path lock = tmp / "db.lock";
  // A pack killed on this host: its pid is gone and its flock went with it.
  WriteFile(lock, std::string("loongforge record-store lock\npid 999999999 host ") + host + "\n");
  auto r = PackEpisodes(Opts(tmp / "src", tmp / "db"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(fs::exists(lock));
  // While a writer holds it, the lock file says who it is.
  {
    auto w = RecordWriter::Create((tmp / "db2").string(), false);
    ASSERT_TRUE(w.ok()) << w.status();
    const std::string text = ReadFile(tmp / "db2.lock");
    EXPECT_NE(text.find("pid " + std::to_string(::getpid()) + " host " + host), std::string::npos)
        << text;
  }
  EXPECT_FALSE(fs::exists(tmp / "db2.lock"));
  WriteFile(tmp / "db3.lock", "loongforge record-store lock\npid 12 host another-host\n");
  auto r3 = PackEpisodes(Opts(tmp / "src", tmp / "db3"));
  EXPECT_EQ(r3.status().code(), StatusCode::kUnavailable) << r3.status();
  EXPECT_NE(r3.status().message().find("another-host"), std::string::npos) << r3.status();
  EXPECT_TRUE(fs::exists(tmp / "db3.lock")) << "another host's lock must be left alone";
  EXPECT_FALSE(fs::exists(tmp / "db3"));
}

// Guards: a pack that fails after taking the lock (a LeRobot dataset whose meta/info.json is a
// directory) leaves neither the lock file nor a staging directory behind, and the CLI says so in
// one line instead of aborting.
TEST(PackCli, FailedLeRobotPackLeavesNothing) {
  TempDir tmp;
  fs::create_directories(tmp / "lr" / "meta" / "info.json");
  CliResult r = RunCli("pack --quiet --from-lerobot " + (tmp / "lr").string() + " --out " +
                       (tmp / "out.db").string());
  EXPECT_GT(r.exit_code, 0) << r.output;
  EXPECT_NE(r.err.find("loongforge pack: error: "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  for (auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename(), "lr") << "left behind: " << e.path();
}

}  // namespace
}  // namespace loongforge::data
