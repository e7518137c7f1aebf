// Frame-accurate mp4 reading on FFmpeg (video_reader.h, Note [Frame selection]).
#include "dataset/video_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "common/file_util.h"

#ifdef LF_HAVE_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}
#endif

namespace loongforge::data {

void ResolveOutputSize(int width, int height, int size_w, int size_h, int shortest_edge, int* out_w,
                       int* out_h) {
  if (size_w > 0 && size_h > 0) {
    *out_w = size_w;
    *out_h = size_h;
    return;
  }
  // A frame already no larger than the shortest edge keeps its size: upscaling only adds bytes.
  if (shortest_edge <= 0 || width <= 0 || height <= 0 || std::min(width, height) <= shortest_edge) {
    *out_w = width;
    *out_h = height;
    return;
  }
  auto even = [](double v) { return std::max(2, static_cast<int>(std::lround(v / 2.0)) * 2); };
  if (width <= height) {
    *out_w = shortest_edge;
    *out_h = even(static_cast<double>(height) * shortest_edge / width);
  } else {
    *out_h = shortest_edge;
    *out_w = even(static_cast<double>(width) * shortest_edge / height);
  }
}

namespace {
std::string FormatSeconds(double t) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6f s", t);
  return buf;
}
}  // namespace

#ifndef LF_HAVE_FFMPEG

bool HaveVideoDecoder() { return false; }
struct VideoReader::Impl {};
VideoReader::~VideoReader() = default;
StatusOr<std::unique_ptr<VideoReader>> VideoReader::Open(const std::string& path) {
  return FailedPreconditionError(path +
                                 ": cannot decode video: this LoongForge build lacks FFmpeg "
                                 "(install libavformat-dev libavcodec-dev libswscale-dev "
                                 "libavutil-dev and rebuild)");
}
Status VideoReader::ReadFrames(const std::vector<double>&, const VideoReadOptions&,
                               const FrameSink&, const std::function<std::string(size_t)>&) {
  return FailedPreconditionError(path_ + ": this LoongForge build lacks FFmpeg");
}

#else  // LF_HAVE_FFMPEG

bool HaveVideoDecoder() { return true; }

namespace {

// Seeking costs a GOP of decoding; decoding forward costs the frames in between. Past this gap a
// seek is cheaper for any GOP length LeRobot writes (GOP 2 for AV1, <= 250 for H.264 at 30 fps).
constexpr double kReseekGapSeconds = 2.0;

std::string AvError(int rc) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(rc, buf, sizeof(buf));
  return buf;
}

}  // namespace

struct VideoReader::Impl {
  AVFormatContext* fmt = nullptr;
  AVCodecContext* dec = nullptr;
  AVPacket* pkt = nullptr;
  AVFrame* frame = nullptr;
  SwsContext* sws = nullptr;
  int sws_key[6] = {0, 0, -1, 0, 0, -1};  // src w, h, fmt, dst w, h, fmt of the cached context
  int stream = -1;
  double time_base = 0;
  int threads_opened = -1;  // decoder_threads the codec was opened with
  const AVCodec* codec = nullptr;
  // Position: the pts (seconds) of the last frame handed out of the decoder since the last
  // seek/open; -inf at the start of the file.
  double last_pts = -std::numeric_limits<double>::infinity();
  bool at_eof = false;    // demuxer exhausted and decoder drained
  bool draining = false;  // flush packet sent
  std::vector<uint8_t> rgb;

  ~Impl() {
    if (sws) sws_freeContext(sws);
    if (frame) av_frame_free(&frame);
    if (pkt) av_packet_free(&pkt);
    if (dec) avcodec_free_context(&dec);
    if (fmt) avformat_close_input(&fmt);
  }
};

VideoReader::~VideoReader() = default;

StatusOr<std::unique_ptr<VideoReader>> VideoReader::Open(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError(path + ": video file not found");
  // libavformat opens by name and would block on a FIFO or read a device forever: the path must
  // be a regular file (Note [Only regular files are opened as files] in common/file_util.h).
  {
    auto fd = loongforge::internal::OpenRegularFile(path);
    if (!fd.ok()) return fd.status();
    ::close(*fd);
  }
  std::unique_ptr<VideoReader> r(new VideoReader());
  r->path_ = path;
  r->impl_ = std::make_unique<Impl>();
  Impl& m = *r->impl_;
  av_log_set_level(AV_LOG_QUIET);  // errors arrive as Status; FFmpeg's own log would only repeat
  int rc = avformat_open_input(&m.fmt, path.c_str(), nullptr, nullptr);
  if (rc < 0) return DataLossError(path + ": not a readable video (" + AvError(rc) + ")");
  rc = avformat_find_stream_info(m.fmt, nullptr);
  if (rc < 0) return DataLossError(path + ": cannot read stream info (" + AvError(rc) + ")");
  const AVCodec* codec = nullptr;
  m.stream = av_find_best_stream(m.fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  if (m.stream < 0) return DataLossError(path + ": no video stream (" + AvError(m.stream) + ")");
  AVStream* st = m.fmt->streams[m.stream];
  // AV1: FFmpeg's native "av1" decoder only drives hardware; libdav1d decodes in software.
  if (st->codecpar->codec_id == AV_CODEC_ID_AV1) {
    const AVCodec* dav1d = avcodec_find_decoder_by_name("libdav1d");
    if (dav1d) codec = dav1d;
  }
  if (!codec)
    return DataLossError(path + ": no decoder for codec '" +
                         avcodec_get_name(st->codecpar->codec_id) + "' in this FFmpeg");
  m.codec = codec;
  m.time_base = av_q2d(st->time_base);
  m.pkt = av_packet_alloc();
  m.frame = av_frame_alloc();
  if (!m.pkt || !m.frame) return ResourceExhaustedError(path + ": out of memory");
  VideoInfo& info = r->info_;
  info.width = st->codecpar->width;
  info.height = st->codecpar->height;
  info.codec = avcodec_get_name(st->codecpar->codec_id);
  const char* pf = av_get_pix_fmt_name(static_cast<AVPixelFormat>(st->codecpar->format));
  info.pix_fmt = pf ? pf : "unknown";
  if (st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0)
    info.fps = av_q2d(st->avg_frame_rate);
  info.num_frames = st->nb_frames;
  if (st->duration != AV_NOPTS_VALUE)
    info.duration_s = st->duration * m.time_base;
  else if (m.fmt->duration != AV_NOPTS_VALUE)
    info.duration_s = static_cast<double>(m.fmt->duration) / AV_TIME_BASE;
  if (info.width <= 0 || info.height <= 0)
    return DataLossError(path + ": video stream has no picture size");
  return r;
}

Status VideoReader::ReadFrames(const std::vector<double>& ts, const VideoReadOptions& o,
                               const FrameSink& sink,
                               const std::function<std::string(size_t)>& what) {
  Impl& m = *impl_;
  auto desc = [&](size_t i) {
    std::string s = path_ + ": frame at " + FormatSeconds(ts[i]);
    if (what) s += " (" + what(i) + ")";
    return s;
  };
  for (size_t i = 1; i < ts.size(); ++i)
    if (!(ts[i] >= ts[i - 1]))
      return InvalidArgumentError(desc(i) + ": timestamps must be sorted, but " +
                                  FormatSeconds(ts[i]) + " follows " + FormatSeconds(ts[i - 1]));
  if (ts.empty()) return Status::Ok();
  // A wanted time past the end of the stream (by more than a frame) has no frame; refusing it here
  // names the duration instead of decoding to the end of the file.
  const double frame_s = info_.fps > 0 ? 1.0 / info_.fps : 0.1;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!std::isfinite(ts[i]))
      return InvalidArgumentError(desc(i) + ": the timestamp is not finite");
    if (info_.duration_s > 0 && !(ts[i] <= info_.duration_s + frame_s)) {
      // Name the first wanted time at or past the end: the first row without a frame.
      size_t k = i;
      while (k > 0 && ts[k - 1] >= info_.duration_s - o.tolerance_s) --k;
      return DataLossError(desc(k) + ": past the end of the video, whose stream lasts " +
                           FormatSeconds(info_.duration_s) + " (up to " + FormatSeconds(ts[i]) +
                           " is wanted): fewer frames than rows, or wrong timestamps");
    }
  }
  int out_w = o.out_width > 0 ? o.out_width : info_.width;
  int out_h = o.out_height > 0 ? o.out_height : info_.height;
  if (out_w > 16384 || out_h > 16384 || (o.out_width > 0) != (o.out_height > 0))
    return InvalidArgumentError(path_ + ": bad output size " + std::to_string(o.out_width) + "x" +
                                std::to_string(o.out_height));
  const double tol = o.tolerance_s;

  // (Re)open the decoder when the thread count changes (it is fixed at avcodec_open2).
  if (!m.dec || m.threads_opened != o.decoder_threads) {
    if (m.dec) avcodec_free_context(&m.dec);
    m.dec = avcodec_alloc_context3(m.codec);
    if (!m.dec) return ResourceExhaustedError(path_ + ": out of memory");
    int rc = avcodec_parameters_to_context(m.dec, m.fmt->streams[m.stream]->codecpar);
    if (rc < 0) return DataLossError(path_ + ": bad codec parameters (" + AvError(rc) + ")");
    m.dec->thread_count = std::max(0, o.decoder_threads);
    m.dec->pkt_timebase = m.fmt->streams[m.stream]->time_base;
    rc = avcodec_open2(m.dec, m.codec, nullptr);
    if (rc < 0)
      return DataLossError(path_ + ": cannot open the " + m.codec->name + " decoder (" +
                           AvError(rc) + ")");
    m.threads_opened = o.decoder_threads;
    // A fresh decoder must start at a keyframe.
    m.last_pts = std::numeric_limits<double>::infinity();
  }

  auto seek_to = [&](double t) -> Status {
    int64_t target = static_cast<int64_t>(std::floor((t - tol) / m.time_base));
    int rc = av_seek_frame(m.fmt, m.stream, target, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) rc = av_seek_frame(m.fmt, m.stream, 0, AVSEEK_FLAG_BACKWARD | AVSEEK_FLAG_ANY);
    if (rc < 0)
      return DataLossError(path_ + ": cannot seek to " + FormatSeconds(t) + " (" + AvError(rc) +
                           ")");
    avcodec_flush_buffers(m.dec);
    m.last_pts = -std::numeric_limits<double>::infinity();
    m.at_eof = false;
    m.draining = false;
    ++seeks_;
    return Status::Ok();
  };

  // Next decoded frame into m.frame; false at the end of the stream. A read error other than EOF
  // (a truncated file) ends the stream too: the caller reports the frames it did not get.
  std::string stream_error;
  auto next_frame = [&](bool* got) -> Status {
    *got = false;
    while (!m.at_eof) {
      int rc = avcodec_receive_frame(m.dec, m.frame);
      if (rc == 0) {
        *got = true;
        ++frames_decoded_;
        return Status::Ok();
      }
      if (rc == AVERROR_EOF) {
        m.at_eof = true;
        break;
      }
      if (rc != AVERROR(EAGAIN)) {
        stream_error = "decode error: " + AvError(rc);
        m.at_eof = true;
        break;
      }
      if (m.draining) {
        m.at_eof = true;
        break;
      }
      rc = av_read_frame(m.fmt, m.pkt);
      if (rc < 0) {
        if (rc != AVERROR_EOF) stream_error = "read error: " + AvError(rc);
        avcodec_send_packet(m.dec, nullptr);
        m.draining = true;
        continue;
      }
      if (m.pkt->stream_index == m.stream) {
        rc = avcodec_send_packet(m.dec, m.pkt);
        if (rc < 0 && rc != AVERROR(EAGAIN)) {
          av_packet_unref(m.pkt);
          stream_error = "decode error: " + AvError(rc);
          m.at_eof = true;
          break;
        }
      }
      av_packet_unref(m.pkt);
    }
    return Status::Ok();
  };

  const bool rgbx = o.pixels == FramePixels::kRgbx32;
  const int bytes_per_pixel = rgbx ? 4 : 3;
  const AVPixelFormat out_fmt = rgbx ? AV_PIX_FMT_RGB0 : AV_PIX_FMT_RGB24;
  auto convert = [&]() -> Status {
    AVFrame* f = m.frame;
    int key[6] = {f->width, f->height, f->format, out_w, out_h, out_fmt};
    if (!m.sws || !std::equal(key, key + 6, m.sws_key)) {
      if (m.sws) sws_freeContext(m.sws);
      // Bilinear, not bicubic: for the downscales packing does (640x480 -> 342x256) swscale widens
      // the bilinear kernel by the scale factor (no aliasing), at 2/3 of bicubic's cost (the
      // largest cost after decoding; BENCHMARKS.md "LeRobot import"). Not SWS_FAST_BILINEAR: that
      // one does not widen and aliases.
      m.sws = sws_getContext(f->width, f->height, static_cast<AVPixelFormat>(f->format), out_w,
                             out_h, out_fmt, SWS_BILINEAR, nullptr, nullptr, nullptr);
      if (!m.sws) return DataLossError(path_ + ": cannot convert frames of this pixel format");
      std::copy(key, key + 6, m.sws_key);
      // The stream's own matrix and range (untagged video: BT.601, limited range, as ffmpeg does).
      const int* coeffs = sws_getCoefficients(f->colorspace);
      sws_setColorspaceDetails(m.sws, coeffs, f->color_range == AVCOL_RANGE_JPEG ? 1 : 0,
                               sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
    }
    m.rgb.resize(static_cast<size_t>(out_w) * out_h * bytes_per_pixel);
    uint8_t* dst[4] = {m.rgb.data(), nullptr, nullptr, nullptr};
    int dst_stride[4] = {out_w * bytes_per_pixel, 0, 0, 0};
    int h = sws_scale(m.sws, f->data, f->linesize, 0, f->height, dst, dst_stride);
    if (h != out_h) return DataLossError(path_ + ": frame conversion failed");
    return Status::Ok();
  };

  // Every walk is bounded: each wanted time seeks at most once (a seek that lands far before it,
  // a long GOP or a sparse index, is followed by decoding forward, never by the same seek again),
  // and the frames decoded between two handed-out frames are capped by the stream's frame count
  // (twice, for one restart from the start) plus a margin, so no file can keep the loop going.
  const double stream_frames =
      info_.num_frames > 0 ? static_cast<double>(info_.num_frames) : info_.duration_s / frame_s;
  const int64_t max_walk =
      stream_frames > 0 ? 2 * static_cast<int64_t>(std::ceil(stream_frames)) + 64 : -1;
  int64_t walked = 0;
  size_t i = 0;
  size_t seeked_for = ts.size();  // the wanted index the last seek was for
  bool reseeked_from_start = false;
  bool fresh_seek = false;
  // The frame at last_pts was consumed by an earlier call: asking for it (or earlier) seeks.
  if (ts[0] <= m.last_pts + tol || ts[0] > m.last_pts + kReseekGapSeconds) {
    LF_RETURN_IF_ERROR(seek_to(ts[0]));
    fresh_seek = true;
    seeked_for = 0;
  }
  while (i < ts.size()) {
    if (ts[i] > m.last_pts + kReseekGapSeconds && !fresh_seek && seeked_for != i) {
      LF_RETURN_IF_ERROR(seek_to(ts[i]));
      fresh_seek = true;
      seeked_for = i;
    }
    if (max_walk >= 0 && walked > max_walk)
      return DataLossError(desc(i) + ": " + std::to_string(walked) +
                           " frames decoded without reaching it (the stream declares " +
                           std::to_string(static_cast<int64_t>(std::ceil(stream_frames))) +
                           " frames): a broken index or timestamps");
    bool got = false;
    LF_RETURN_IF_ERROR(next_frame(&got));
    ++walked;
    if (!got) {
      int64_t n = frames_decoded_;
      std::string last = std::isfinite(m.last_pts) ? FormatSeconds(m.last_pts) : "no frame";
      return DataLossError(desc(i) + ": the video ends before this frame (last frame decoded at " +
                           last + ", " + std::to_string(n) + " frames decoded by this reader" +
                           (stream_error.empty() ? "" : "; " + stream_error) +
                           "): fewer frames than rows, or a truncated video");
    }
    int64_t pts = m.frame->best_effort_timestamp;
    if (pts == AV_NOPTS_VALUE) pts = m.frame->pts;
    if (pts == AV_NOPTS_VALUE) return DataLossError(desc(i) + ": decoded frame has no timestamp");
    const double t = static_cast<double>(pts) * m.time_base;
    if (fresh_seek && t > ts[i] + tol && !reseeked_from_start) {
      // The seek landed past the wanted frame (an index without this keyframe): start over.
      LF_RETURN_IF_ERROR(seek_to(0));
      reseeked_from_start = true;
      continue;
    }
    fresh_seek = false;
    const double prev = m.last_pts;
    m.last_pts = t;
    if (t < ts[i] - tol) continue;  // before the wanted frame: decoded, not converted
    if (t > ts[i] + tol)
      return NotFoundError(
          desc(i) + ": no frame within " + FormatSeconds(tol) + " (the frames around it are at " +
          (std::isfinite(prev) ? FormatSeconds(prev) : std::string("-")) + " and " +
          FormatSeconds(t) + "); the row's timestamp does not match the video");
    LF_RETURN_IF_ERROR(convert());
    // Consecutive rows may ask for the same frame.
    while (i < ts.size() && std::fabs(t - ts[i]) <= tol) {
      LF_RETURN_IF_ERROR(sink(i, m.rgb.data(), out_w, out_h));
      ++i;
    }
    walked = 0;
  }
  return Status::Ok();
}

#endif  // LF_HAVE_FFMPEG

}  // namespace loongforge::data
