// Frame-accurate reading of mp4 videos (LeRobot's AV1, H.264, HEVC) through Debian's FFmpeg
// libraries: libavformat demuxes, libavcodec decodes (libdav1d for AV1, the native H.264/HEVC
// decoders), libswscale converts YUV to RGB24 and resizes.
//
// Built only with FFmpeg (LF_HAVE_FFMPEG, found by pkg-config in CMake). Without it Open()
// returns FailedPrecondition saying that this build lacks FFmpeg, and nothing else is callable.
//
// Note [Frame selection]: a wanted timestamp t (seconds) is served by the decoded frame whose
// presentation time (best-effort pts x stream time base) lies within `tolerance_s` of t, as
// LeRobot's decode_video_frames does with its tolerance_s (1e-4 s by default). ReadFrames() seeks
// once, to the keyframe at or before the first wanted time (AVSEEK_FLAG_BACKWARD), then decodes
// forward; frames between wanted ones are decoded (inter prediction needs them) but not
// converted. It seeks again only when the next wanted time lies more than kReseekGapSeconds past
// the last decoded frame, so a pass over a whole file is one sequential decode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge::data {

// True when this build can decode video (LF_HAVE_FFMPEG).
bool HaveVideoDecoder();

struct VideoInfo {
  int width = 0, height = 0;  // coded picture size
  double fps = 0;             // average frame rate of the stream (0 if the file does not say)
  double duration_s = 0;      // stream (or container) duration, 0 if unknown
  int64_t num_frames = 0;     // frame count the container declares, 0 if unknown
  std::string codec;          // FFmpeg codec name: "av1", "h264", "hevc", ...
  std::string pix_fmt;        // e.g. "yuv420p"
};

// The output frame size for a `width` x `height` video: `size_w` x `size_h` when both are > 0;
// else the size whose shortest edge is `shortest_edge` with the aspect ratio kept (rounded to the
// nearest even number, at least 2); `shortest_edge` <= 0 keeps the video's size.
void ResolveOutputSize(int width, int height, int size_w, int size_h, int shortest_edge, int* out_w,
                       int* out_h);

// Layout of the frames handed to a FrameSink.
enum class FramePixels {
  kRgb24,  // 3 bytes a pixel: R, G, B
  // 4 bytes a pixel: R, G, B and one byte of no meaning. libswscale's SIMD path writes this layout
  // (RGB24 output takes its C path, 2.5x slower on 640x480 -> 342x256), and libjpeg-turbo reads
  // it as TJPF_RGBX. Values may differ from kRgb24's by a few levels (the SIMD path rounds less
  // exactly).
  kRgbx32,
};

struct VideoReadOptions {
  int out_width = 0, out_height = 0;  // RGB output size; 0 x 0 = the video's size
  double tolerance_s = 1e-4;          // Note [Frame selection]
  int decoder_threads = 1;            // libavcodec threads per reader; 0 = FFmpeg's choice
  FramePixels pixels = FramePixels::kRgb24;
};

// Receives the frame for wanted timestamp number `i` (index into the list given to ReadFrames):
// `rgb` is out_height x out_width pixels of 3 (kRgb24) or 4 (kRgbx32) bytes, row-major, rows
// packed, valid only during the call. A non-OK return stops the read and is returned by
// ReadFrames().
using FrameSink = std::function<Status(size_t i, const uint8_t* rgb, int width, int height)>;

class VideoReader {
 public:
  // Opens `path` and its best video stream. NotFound if the file is missing; InvalidArgument
  // naming the path and its kind if it is not a regular file (a FIFO, a directory); DataLoss naming
  // the file if it is not a readable video (truncated, no moov atom, no video stream) or its codec
  // has no decoder in this FFmpeg; FailedPrecondition if the build lacks FFmpeg.
  static StatusOr<std::unique_ptr<VideoReader>> Open(const std::string& path);
  ~VideoReader();
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  const VideoInfo& info() const { return info_; }
  const std::string& path() const { return path_; }

  // Decodes the frames at `timestamps` (seconds in the video's own time, non-decreasing) and
  // hands each to `sink` in order (Note [Frame selection]). `what(i)` (optional) describes the
  // wanted timestamp i for error messages (e.g. "episode 3 row 17"). Errors name the file, the
  // timestamp and what(i):
  //   InvalidArgument: timestamps not sorted or not finite, a bad output size.
  //   NotFound: no frame within tolerance of a timestamp (frames exist before and after it).
  //   DataLoss: the video ends (or breaks off: truncated file, decode error) before a timestamp;
  //     the message gives the time of the last decoded frame and the number of frames decoded.
  //     A timestamp more than a frame past the stream's duration is DataLoss before anything is
  //     decoded (the message gives the duration); a decode walk that passes twice the stream's
  //     frame count without reaching its frame is DataLoss too, so no input decodes forever.
  Status ReadFrames(const std::vector<double>& timestamps, const VideoReadOptions& options,
                    const FrameSink& sink,
                    const std::function<std::string(size_t)>& what = nullptr);

  // Frames decoded so far by this reader (for tests of "decode only what is needed").
  int64_t frames_decoded() const { return frames_decoded_; }
  int64_t seeks() const { return seeks_; }

  struct Impl;

 private:
  VideoReader() = default;
  std::string path_;
  VideoInfo info_;
  std::unique_ptr<Impl> impl_;
  int64_t frames_decoded_ = 0, seeks_ = 0;
};

}  // namespace loongforge::data
