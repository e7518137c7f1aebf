// Tests of VideoReader on the committed LeRobot fixture videos (tests/data/lerobot, written by
// make_videos.sh): every frame carries its own index as a block code, so a test can tell which
// frame was decoded. AV1 (libdav1d), H.264 and HEVC (B-frames), v2.1 per-episode files and a
// v3.0 concatenated file; PSNR against the ffmpeg CLI's own decode; bad input.
#include "dataset/video_reader.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "dataset/video_test_util.h"

namespace loongforge::data {
namespace {
namespace fs = std::filesystem;

#ifndef LF_HAVE_FFMPEG
// Guards: a build without FFmpeg says so instead of failing obscurely.
TEST(VideoReader, WithoutFfmpegSaysSo) {
  auto r = VideoReader::Open(LeRobotFixture("v2.1") + "/videos/x.mp4");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lacks FFmpeg"), std::string::npos);
}
#else

std::string V21(const std::string& cam, int ep) {
  char name[64];
  std::snprintf(name, sizeof(name), "episode_%06d.mp4", ep);
  return LeRobotFixture("v2.1") + "/videos/chunk-000/observation.images." + cam + "/" + name;
}
std::string V30(const std::string& cam) {
  return LeRobotFixture("v3.0") + "/videos/observation.images." + cam + "/chunk-000/file-000.mp4";
}
constexpr double kFps = 30.0;
constexpr int kLengths[3] = {12, 16, 20};

struct Decoded {
  std::vector<std::vector<uint8_t> > frames;
  int w = 0, h = 0;
};

Status ReadAll(VideoReader* r, const std::vector<double>& ts, Decoded* out,
               VideoReadOptions o = {}) {
  out->frames.assign(ts.size(), {});
  return r->ReadFrames(ts, o, [&](size_t i, const uint8_t* rgb, int w, int h) {
    out->frames[i].assign(rgb, rgb + static_cast<size_t>(w) * h * 3);
    out->w = w;
    out->h = h;
    return Status::Ok();
  });
}

std::vector<double> Times(int from, int to) {
  std::vector<double> t;
  for (int i = from; i < to; ++i) t.push_back(i / kFps);
  return t;
}

class VideoCodecs : public ::testing::TestWithParam<const char*> {};

// Guards: the frame handed out for each timestamp is the frame at that timestamp (pts matching,
// B-frame reordering in H.264, libdav1d for AV1), in every v2.1 episode file.
TEST_P(VideoCodecs, EveryFrameIsTheOneAskedFor) {
  for (int ep = 0; ep < 3; ++ep) {
    auto r = VideoReader::Open(V21(GetParam(), ep));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->info().width, 128);
    EXPECT_EQ((*r)->info().height, 96);
    Decoded d;
    ASSERT_TRUE(ReadAll(r->get(), Times(0, kLengths[ep]), &d).ok());
    for (int i = 0; i < kLengths[ep]; ++i) {
      FrameCode c = DecodeFrameCode(d.frames[i].data(), d.w, d.h);
      EXPECT_EQ(c.position, i) << "episode " << ep;
      EXPECT_EQ(c.episode, ep);
    }
  }
}

// Guards: a sparse, sorted request seeks to the keyframe before the first wanted frame and
// decodes forward; a later request behind the position seeks back. The frames are the right ones.
TEST_P(VideoCodecs, SeeksForwardAndBack) {
  auto r = VideoReader::Open(V30(GetParam()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Decoded d;
  std::vector<double> ts = {31 / kFps, 33 / kFps, 33 / kFps, 47 / kFps};
  ASSERT_TRUE(ReadAll(r->get(), ts, &d).ok());
  EXPECT_EQ(DecodeFrameCode(d.frames[0].data(), d.w, d.h).position, 31);
  EXPECT_EQ(DecodeFrameCode(d.frames[1].data(), d.w, d.h).position, 33);
  EXPECT_EQ(DecodeFrameCode(d.frames[2].data(), d.w, d.h).position, 33);
  EXPECT_EQ(DecodeFrameCode(d.frames[3].data(), d.w, d.h).position, 47);
  EXPECT_EQ(DecodeFrameCode(d.frames[3].data(), d.w, d.h).episode, 2);
  // Decode only what is needed: not the 31 frames before the first wanted one.
  EXPECT_LT((*r)->frames_decoded(), 31);
  ASSERT_TRUE(ReadAll(r->get(), {2 / kFps, 13 / kFps}, &d).ok());
  EXPECT_EQ(DecodeFrameCode(d.frames[0].data(), d.w, d.h).position, 2);
  EXPECT_EQ(DecodeFrameCode(d.frames[1].data(), d.w, d.h).position, 13);
  EXPECT_EQ(DecodeFrameCode(d.frames[1].data(), d.w, d.h).episode, 1);
}

// Guards: resizing through libswscale keeps the content (codes still readable at 64x48).
TEST_P(VideoCodecs, ResizesToTheAskedSize) {
  auto r = VideoReader::Open(V21(GetParam(), 1));
  ASSERT_TRUE(r.ok());
  Decoded d;
  VideoReadOptions o;
  o.out_width = 64;
  o.out_height = 48;
  ASSERT_TRUE(ReadAll(r->get(), Times(0, 16), &d, o).ok());
  EXPECT_EQ(d.w, 64);
  EXPECT_EQ(d.h, 48);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(DecodeFrameCode(d.frames[i].data(), d.w, d.h).position, i);
}

// Guards: FramePixels::kRgbx32 (the pack's layout, for turbojpeg's TJPF_RGBX) holds the same
// picture as kRgb24: 4 bytes a pixel, rows packed, R, G, B within a few levels of kRgb24's (the
// SIMD path rounds differently), on the same reader switching layouts (cached converter rekeyed).
TEST_P(VideoCodecs, RgbxLayoutMatchesRgb24) {
  auto r = VideoReader::Open(V21(GetParam(), 2));
  ASSERT_TRUE(r.ok());
  VideoReadOptions o;
  o.out_width = 72;  // a downscale with a row size (288 bytes) unlike the RGB24 one
  o.out_height = 54;
  Decoded rgb;
  ASSERT_TRUE(ReadAll(r->get(), Times(0, 20), &rgb, o).ok());
  o.pixels = FramePixels::kRgbx32;
  std::vector<std::vector<uint8_t> > rgbx(20);
  ASSERT_TRUE((*r)->ReadFrames(Times(0, 20), o,
                               [&](size_t i, const uint8_t* p, int w, int h) {
                                 EXPECT_EQ(w, 72);
                                 EXPECT_EQ(h, 54);
                                 rgbx[i].assign(p, p + static_cast<size_t>(w) * h * 4);
                                 return Status::Ok();
                               })
                  .ok());
  for (int i = 0; i < 20; ++i) {
    int worst = 0;
    for (size_t px = 0; px < static_cast<size_t>(72) * 54; ++px)
      for (int c = 0; c < 3; ++c)
        worst =
            std::max(worst, std::abs(int{rgbx[i][px * 4 + c]} - int{rgb.frames[i][px * 3 + c]}));
    EXPECT_LE(worst, 8) << "frame " << i;
    std::vector<uint8_t> packed(static_cast<size_t>(72) * 54 * 3);
    for (size_t px = 0; px < static_cast<size_t>(72) * 54; ++px)
      std::copy_n(&rgbx[i][px * 4], 3, &packed[px * 3]);
    EXPECT_EQ(DecodeFrameCode(packed.data(), 72, 54).position, i);
    EXPECT_EQ(DecodeFrameCode(packed.data(), 72, 54).episode, 2);
  }
}

// Our decode of `path`'s first `n` 128x96 frames against FFmpeg's reference decode (YUV->RGB
// conversion, frame order): PSNR >= 40 dB against `ffmpeg -pix_fmt rgb24`.
void ExpectMatchesFfmpegCli(const std::string& path, int n) {
  char tmpl[] = "/tmp/lf_video_ref_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string cmd =
      "ffmpeg -nostdin -v error -y -i " + path + " -f rawvideo -pix_fmt rgb24 " + tmpl;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(tmpl, std::ios::binary);
  std::string ref((std::istreambuf_iterator<char>(in)), {});
  fs::remove(tmpl);
  const size_t frame_bytes = 128 * 96 * 3;
  ASSERT_EQ(ref.size(), n * frame_bytes);
  auto r = VideoReader::Open(path);
  ASSERT_TRUE(r.ok());
  Decoded d;
  ASSERT_TRUE(ReadAll(r->get(), Times(0, n), &d).ok());
  for (int i = 0; i < n; ++i) {
    double se = 0;
    for (size_t k = 0; k < frame_bytes; ++k) {
      double diff =
          static_cast<double>(d.frames[i][k]) - static_cast<uint8_t>(ref[i * frame_bytes + k]);
      se += diff * diff;
    }
    const double mse = se / frame_bytes;
    const double psnr = mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
    EXPECT_GE(psnr, 40.0) << path << " frame " << i;
  }
}

bool HaveFfmpegCli() { return std::system("ffmpeg -version > /dev/null 2>&1") == 0; }

// Guards: our decode matches FFmpeg's reference decode. Skipped where the ffmpeg CLI is absent.
TEST_P(VideoCodecs, MatchesFfmpegCliDecode) {
  if (!HaveFfmpegCli()) GTEST_SKIP() << "no ffmpeg CLI";
  ExpectMatchesFfmpegCli(V30(GetParam()), 48);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VideoCodecs, ::testing::Values("front", "wrist"),
                         [](const auto& info) {
                           return std::string(info.param) == "front" ? "Av1" : "H264";
                         });

// Guards HEVC, which LeRobot datasets also hold (libavcodec's native decoder; the fixture is the
// v3.0 wrist video re-encoded by make_videos.sh with libx265, GOP 8, B-frames): every frame is
// the one asked for, a request behind the position seeks back, and the pixels match FFmpeg's.
TEST(VideoReader, HevcFramesSeeksAndPixels) {
  const std::string path = LeRobotFixture("hevc") + "/file-000.mp4";
  auto r = VideoReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Decoded d;
  ASSERT_TRUE(ReadAll(r->get(), Times(0, 48), &d).ok());
  for (int i = 0; i < 48; ++i)
    EXPECT_EQ(DecodeFrameCode(d.frames[i].data(), d.w, d.h).position, i) << "frame " << i;
  ASSERT_TRUE(ReadAll(r->get(), {5 / kFps, 30 / kFps}, &d).ok());
  EXPECT_EQ(DecodeFrameCode(d.frames[0].data(), d.w, d.h).position, 5);
  EXPECT_EQ(DecodeFrameCode(d.frames[1].data(), d.w, d.h).position, 30);
  if (!HaveFfmpegCli()) GTEST_SKIP() << "no ffmpeg CLI for the pixel comparison";
  ExpectMatchesFfmpegCli(path, 48);
}

// Guards: a missing video is NotFound naming the file.
TEST(VideoReader, MissingFileIsNamed) {
  auto r = VideoReader::Open("/nonexistent/episode_000000.mp4");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("episode_000000.mp4"), std::string::npos);
}

// Guards: a truncated video is an error naming the file (at open, or as missing frames), never
// a wrong frame or a crash.
TEST(VideoReader, TruncatedFileIsNamed) {
  const std::string src = V21("front", 2);
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (size_t keep : {bytes.size() / 2, bytes.size() - 200, size_t{100}}) {
    const std::string path =
        (fs::temp_directory_path() / ("lf_trunc_" + std::to_string(::getpid()) + ".mp4")).string();
    {
      std::ofstream out(path, std::ios::binary);
      out.write(bytes.data(), static_cast<std::streamsize>(keep));
    }
    auto r = VideoReader::Open(path);
    Status s = r.ok() ? [&] {
      Decoded d;
      return ReadAll(r->get(), Times(0, 20), &d);
    }()
                      : r.status();
    fs::remove(path);
    ASSERT_FALSE(s.ok()) << "kept " << keep << " bytes";
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
  }
}

// Guards: rows past the last frame (fewer frames than rows) are DataLoss naming the file, the
// timestamp and the row.
TEST(VideoReader, FewerFramesThanRowsIsNamed) {
  auto r = VideoReader::Open(V21("wrist", 0));
  ASSERT_TRUE(r.ok());
  Decoded d;
  std::vector<double> ts = Times(0, 14);  // the file has 12 frames
  Status s = (*r)->ReadFrames(
      ts, {}, [](size_t, const uint8_t*, int, int) { return Status::Ok(); },
      [](size_t i) { return "row " + std::to_string(i); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("episode_000000.mp4"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("row 12"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("fewer frames than rows"), std::string::npos) << s.ToString();
}

// Guards: a timestamp between two frames (off by more than the tolerance) is NotFound naming
// the file and the timestamp, not the nearest frame silently.
TEST(VideoReader, TimestampWithoutFrameIsNamed) {
  auto r = VideoReader::Open(V21("front", 1));
  ASSERT_TRUE(r.ok());
  Decoded d;
  Status s = ReadAll(r->get(), {1 / kFps, 2.5 / kFps}, &d);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("episode_000001.mp4"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("0.083333 s"), std::string::npos) << s.ToString();
  // Within tolerance (5e-5 s off) is accepted.
  ASSERT_TRUE(ReadAll(r->get(), {3 / kFps + 5e-5}, &d).ok());
  EXPECT_EQ(DecodeFrameCode(d.frames[0].data(), d.w, d.h).position, 3);
}

// Runs `body` in a child process that SIGALRM ends after `seconds`: a read that never returns
// fails the test instead of hanging it. The child exits 0 when `body` returns true.
::testing::AssertionResult ReturnsInTime(const std::function<bool()>& body, unsigned seconds) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(seconds);
    ::_exit(body() ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid)
    return ::testing::AssertionFailure() << "fork/waitpid failed";
  if (WIFSIGNALED(status))
    return ::testing::AssertionFailure() << "killed by signal " << WTERMSIG(status)
                                         << " (still reading after " << seconds << " s)";
  if (WEXITSTATUS(status) != 0) return ::testing::AssertionFailure() << "wrong result";
  return ::testing::AssertionSuccess();
}

// Guards: a timestamp far past the end of the video (2 s and more past it, inf, 1e9) is DataLoss
// naming the file, the row, the timestamp and the stream's duration, at once: before, each one
// re-seeked to the last keyframe forever.
TEST(VideoReader, TimestampPastTheEndIsNamedNotLooped) {
  const std::string path = V21("front", 0);  // 12 frames: 0.4 s
  for (double t : {0.4 + 2.5, 100.0, 1e9, std::numeric_limits<double>::infinity()}) {
    EXPECT_TRUE(ReturnsInTime(
        [&] {
          auto r = VideoReader::Open(path);
          if (!r.ok()) return false;
          Status s = (*r)->ReadFrames(
              {0.0, t}, {}, [](size_t, const uint8_t*, int, int) { return Status::Ok(); },
              [](size_t i) { return "row " + std::to_string(i); });
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          const std::string& m = s.message();
          return (s.code() == StatusCode::kDataLoss ||
                  (!std::isfinite(t) && s.code() == StatusCode::kInvalidArgument)) &&
                 m.find("episode_000000.mp4") != std::string::npos &&
                 m.find("row 1") != std::string::npos &&
                 (!std::isfinite(t) || m.find("0.400000 s") != std::string::npos);
        },
        20))
        << "timestamp " << t;
  }
  // A NaN is refused as well (as unsorted or not finite).
  auto r = VideoReader::Open(path);
  ASSERT_TRUE(r.ok());
  Decoded d;
  EXPECT_EQ(ReadAll(r->get(), {0.0, std::nan("")}, &d).code(), StatusCode::kInvalidArgument);
  // Within a frame of the end the read goes on and reports the missing frame as before.
  Status s = ReadAll(r->get(), {0.4}, &d);
  EXPECT_NE(s.message().find("the video ends before this frame"), std::string::npos)
      << s.ToString();
}

// Guards: a wanted frame more than kReseekGapSeconds past the only keyframe (one GOP of 5 s) is
// reached by decoding forward after one seek; before, every decoded frame re-seeked to the same
// keyframe and the read never ended.
TEST(VideoReader, LongGopFarFrameIsReachedWithOneSeek) {
  if (!HaveFfmpegCli()) GTEST_SKIP() << "no ffmpeg CLI to write a long-GOP video";
  const std::string path =
      (fs::temp_directory_path() / ("lf_gop_" + std::to_string(::getpid()) + ".mp4")).string();
  const std::string cmd =
      "ffmpeg -hide_banner -loglevel error -y -f lavfi -i testsrc=size=64x48:rate=30 "
      "-frames:v 150 -c:v libx264 -g 300 -bf 0 -pix_fmt yuv420p -threads 1 " +
      path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(ReturnsInTime(
      [&] {
        auto r = VideoReader::Open(path);
        if (!r.ok()) return false;
        std::vector<size_t> got;
        Status s = (*r)->ReadFrames({4.0, 4.5}, {}, [&](size_t i, const uint8_t*, int, int) {
          got.push_back(i);
          return Status::Ok();
        });
        std::fprintf(stderr, "%s, %lld seeks, %lld frames\n", s.ToString().c_str(),
                     static_cast<long long>((*r)->seeks()),
                     static_cast<long long>((*r)->frames_decoded()));
        return s.ok() && got == std::vector<size_t>{0, 1} && (*r)->seeks() <= 2 &&
               (*r)->frames_decoded() <= 140;
      },
      30));
  fs::remove(path);
}

// Guards: a video path that is a FIFO (libavformat would block in open) or a directory is refused
// naming the path and its kind.
TEST(VideoReader, NonRegularFileIsRefused) {
  const std::string dir =
      (fs::temp_directory_path() / ("lf_vr_kind_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir + "/dir.mp4");
  const std::string fifo = dir + "/fifo.mp4";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Plain names, not a structured binding: C++17 does not let a lambda capture those.
  for (const auto& pk :
       {std::pair<std::string, std::string>{fifo, "FIFO"}, {dir + "/dir.mp4", "directory"}}) {
    const std::string& path = pk.first;
    const std::string& kind = pk.second;
    EXPECT_TRUE(ReturnsInTime(
        [&] {
          auto r = VideoReader::Open(path);
          if (r.ok()) return false;
          std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
          return r.status().code() == StatusCode::kInvalidArgument &&
                 r.status().message().find(path) != std::string::npos &&
                 r.status().message().find(kind) != std::string::npos;
        },
        20))
        << path;
  }
  fs::remove_all(dir);
}

// Guards: unsorted timestamps are refused rather than decoded in a wrong order.
TEST(VideoReader, UnsortedTimestampsAreRefused) {
  auto r = VideoReader::Open(V21("front", 0));
  ASSERT_TRUE(r.ok());
  Decoded d;
  Status s = ReadAll(r->get(), {2 / kFps, 1 / kFps}, &d);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}
#endif  // LF_HAVE_FFMPEG

// Guards: the default output size keeps the aspect ratio with the shortest edge 256, even sizes,
// and never upscales a smaller frame.
TEST(VideoReader, ResolveOutputSize) {
  struct Case {
    int width, height, size_w, size_h, shortest_edge, want_w, want_h;
  };
  const Case cases[] = {
      {640, 480, 0, 0, 256, 342, 256},      // landscape: height becomes 256
      {480, 640, 0, 0, 256, 256, 342},      // portrait: width becomes 256
      {640, 480, 224, 224, 256, 224, 224},  // --size wins
      {96, 72, 0, 0, 0, 96, 72},            // no shortest edge: the source size
      {128, 96, 0, 0, 256, 128, 96},        // smaller than the shortest edge: kept
      {320, 256, 0, 0, 256, 320, 256},      // already at it: kept
  };
  for (const Case& c : cases) {
    int w = 0, h = 0;
    ResolveOutputSize(c.width, c.height, c.size_w, c.size_h, c.shortest_edge, &w, &h);
    EXPECT_EQ(w, c.want_w) << c.width << "x" << c.height;
    EXPECT_EQ(h, c.want_h) << c.width << "x" << c.height;
  }
}

}  // namespace
}  // namespace loongforge::data
