// `pack --from-lerobot`: a LeRobot dataset (Note [LeRobot layouts] in lerobot_import.h) into the
// LMDB record store, with the same records as `pack` (packer.cc, pack_common.h) plus
// "{id}_lerobot"; and ReadEpisode, which reads a packed episode back. The dataset's metadata is
// read by lerobot_meta.cc.
//
// Episodes are read and checked, and their videos decoded and re-encoded as JPEG, on a thread pool
// a bounded window ahead of the single writer, which puts records in episode order; every file is
// read and checked before RecordWriter::Commit() makes the DB visible, and any error drops the
// staging directory (RecordWriter), so no DB is left behind.
#include "dataset/lerobot_import.h"

#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>
#include <tuple>

#include "common/json_util.h"
#include "common/thread_pool.h"
#include "dataset/lerobot_internal.h"
#include "dataset/pack_common.h"
#include "dataset/parquet/parquet.h"
#include "dataset/video_reader.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"
#include "loongforge/pack.h"
#include "loongforge/progress.h"
#include "loongforge/tokenizer.h"

namespace loongforge::data {
namespace fs = std::filesystem;
using nlohmann::json;
using parquet::Column;

namespace {
using namespace lerobot;
using lerobot::internal::CheckIntColumn;
using lerobot::internal::FindColumn;
using lerobot::internal::ReadJsonFile;

struct Camera {
  std::string name;  // DB camera name
  std::string key;   // LeRobot video key
  const Feature* feature;
};

// One episode, read and checked, frames encoded: what the writer needs.
struct EpisodeOut {
  Status status;
  int64_t length = 0;
  std::vector<float> state, action;  // T x dims
  std::vector<double> timestamp;
  std::vector<int64_t> task_index, index;
  std::vector<std::vector<std::string>> jpegs;  // [camera][t]
};

// One per pool thread: the handle and an output buffer of tjBufSize() for the frame size, reused
// for every frame (TJFLAG_NOREALLOC) instead of a fresh tjAlloc/tjFree of ~200 KB per frame.
struct TjCompressor {
  tjhandle h = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long capacity = 0;
  ~TjCompressor() {
    if (buf) tjFree(buf);
    if (h) tjDestroy(h);
  }
  // Encodes w x h RGBX (4 bytes a pixel, FramePixels::kRgbx32) at `quality` (4:2:0, fast DCT)
  // into *out; false on a turbojpeg error (tjGetErrorStr() says which).
  bool Encode(const uint8_t* rgbx, int w, int hgt, int quality, std::string* out) {
    if (!h) return false;
    const unsigned long need = tjBufSize(w, hgt, TJSAMP_420);
    if (need == static_cast<unsigned long>(-1)) return false;
    if (need > capacity) {
      if (buf) tjFree(buf);
      buf = tjAlloc(static_cast<int>(need));
      capacity = buf ? need : 0;
      if (!buf) return false;
    }
    unsigned long size = capacity;
    if (tjCompress2(h, rgbx, w, 0, hgt, TJPF_RGBX, &buf, &size, TJSAMP_420, quality,
                    TJFLAG_FASTDCT | TJFLAG_NOREALLOC) != 0)
      return false;
    out->assign(reinterpret_cast<const char*>(buf), size);
    return true;
  }
};

// Reads a float list column into rows x dims floats, naming file/column/row on a mismatch.
Status ListToFloats(const Column& c, const std::vector<size_t>& rows, int dims,
                    const std::string& file, std::vector<float>* out) {
  if (!c.is_list || c.kind != Column::Kind::kDouble)
    return InvalidArgumentError(file + ": column \"" + c.name + "\" is not a list of floats");
  out->resize(rows.size() * dims);
  for (size_t k = 0; k < rows.size(); ++k) {
    const size_t r = rows[k];
    const int64_t n = c.offsets[r + 1] - c.offsets[r];
    if (n != dims)
      return InvalidArgumentError(file + ": column \"" + c.name + "\" row " + std::to_string(r) +
                                  " has " + std::to_string(n) + " values, meta/info.json says " +
                                  std::to_string(dims));
    for (int d = 0; d < dims; ++d) {
      const size_t v = static_cast<size_t>(c.offsets[r] + d);
      if (!c.valid.empty() && !c.valid[v])
        return InvalidArgumentError(file + ": column \"" + c.name + "\" row " + std::to_string(r) +
                                    " holds a null");
      const double x = c.f64[v];
      if (!std::isfinite(x) || std::fabs(x) > FLT_MAX)
        return InvalidArgumentError(file + ": column \"" + c.name + "\" row " + std::to_string(r) +
                                    " value " + std::to_string(d) + " is not a finite float32");
      (*out)[k * dims + d] = static_cast<float>(x);
    }
  }
  return Status::Ok();
}

int FeatureDim(const Info& info, const std::string& key) {
  auto it = info.features.find(key);
  if (it == info.features.end() || it->second.shape.empty()) return -1;
  int64_t n = 1;
  for (int64_t s : it->second.shape) n *= s;
  return static_cast<int>(n);
}

// Data files of v3 hold many episodes: each is read once and shared by its episodes' tasks.
class DataFileCache {
 public:
  using Table = std::shared_ptr<const StatusOr<std::vector<Column>>>;
  Table Get(const std::string& path, const std::vector<std::string>& cols) {
    std::shared_future<Table> fut;
    bool mine = false;
    std::promise<Table> promise;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = files_.find(path);
      if (it == files_.end()) {
        fut = promise.get_future().share();
        files_[path] = fut;
        mine = true;
      } else {
        fut = it->second;
      }
    }
    if (mine)
      promise.set_value(
          std::make_shared<StatusOr<std::vector<Column>>>(parquet::ReadParquet(path, cols)));
    return fut.get();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_future<Table>> files_;
};

std::string Ts(double t) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.6f", t);
  return b;
}

}  // namespace

StatusOr<PackResult> PackLeRobot(const LeRobotPackOptions& o) {
  if (o.src.empty() || o.out.empty())
    return InvalidArgumentError("pack --from-lerobot: source and --out are required");
  LF_RETURN_IF_ERROR(CheckSharedPackOptions(o.horizon, o.threads, o.max_instruction_bytes));
  if (o.quality < 1 || o.quality > 100)
    return InvalidArgumentError("pack: quality must be in 1..100, got " +
                                std::to_string(o.quality));
  if ((o.width > 0) != (o.height > 0) || o.width < 0 || o.height < 0 || o.width > 8192 ||
      o.height > 8192)
    return InvalidArgumentError("pack: --size must be WxH with both in 1..8192");
  if (o.shortest_edge > 8192) return InvalidArgumentError("pack: --shortest-edge must be <= 8192");
  if (!(o.tolerance_s > 0 && o.tolerance_s < 1))
    return InvalidArgumentError("pack: tolerance must be in (0, 1) s");
  if (!HaveVideoDecoder())
    return FailedPreconditionError(
        "pack --from-lerobot: this LoongForge build lacks FFmpeg, so it cannot decode LeRobot "
        "videos (install libavformat-dev libavcodec-dev libswscale-dev libavutil-dev and "
        "rebuild; see docs/DATASET.md)");
  const double start = NowSeconds();
  LF_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, MakeTokenizer(o.tokenizer));
  LF_ASSIGN_OR_RETURN(std::unique_ptr<RecordWriter> writer,
                      RecordWriter::Create(o.out, o.overwrite));

  const std::string root = o.src;
  LF_ASSIGN_OR_RETURN(Info info, ParseInfo(root + "/meta/info.json"));
  const int state_dim = FeatureDim(info, "observation.state");
  const int action_dim = FeatureDim(info, "action");
  if (state_dim < 1 || action_dim < 1)
    return InvalidArgumentError(
        info.path + ": needs features \"observation.state\" and \"action\" with a shape");

  // Modality (GR00T): on by default when meta/modality.json exists.
  std::unique_ptr<Modality> modality;
  {
    std::string mpath = o.modality;
    std::error_code ec;
    if (mpath.empty() &&
        fs::symlink_status(root + "/meta/modality.json", ec).type() != fs::file_type::not_found) {
      LF_ASSIGN_OR_RETURN(mpath, PathInRoot(root, "meta/modality.json", "the dataset's modality"));
    }
    if (!mpath.empty() && mpath != "none") {
      LF_ASSIGN_OR_RETURN(Modality m, ParseModality(mpath, state_dim, action_dim));
      modality = std::make_unique<Modality>(std::move(m));
    }
  }

  // Cameras: the modality's video entries, else every video feature (sorted by key).
  std::vector<Camera> cams;
  auto add_cam = [&](const std::string& name, const std::string& key) -> Status {
    auto it = info.features.find(key);
    if (it == info.features.end() || !it->second.is_video())
      return InvalidArgumentError((modality ? modality->path : info.path) + ": camera \"" + name +
                                  "\" refers to \"" + key + "\", which is not a video feature of " +
                                  info.path);
    cams.push_back({name, key, &it->second});
    return Status::Ok();
  };
  if (modality && !modality->video.empty()) {
    for (const auto& [name, key] : modality->video) LF_RETURN_IF_ERROR(add_cam(name, key));
  } else {
    for (const auto& [key, f] : info.features)
      if (f.is_video()) LF_RETURN_IF_ERROR(add_cam(key.substr(key.rfind('.') + 1), key));
  }
  if (!o.cameras.empty()) {
    std::vector<Camera> picked;
    for (const auto& want : o.cameras) {
      auto it = std::find_if(cams.begin(), cams.end(),
                             [&](const Camera& c) { return c.name == want || c.key == want; });
      if (it == cams.end()) {
        std::string have;
        for (const auto& c : cams) have += (have.empty() ? "" : ", ") + c.key;
        return InvalidArgumentError("pack: --cameras: \"" + want + "\" is not a video of " + root +
                                    " (it has: " + have + ")");
      }
      picked.push_back(*it);
    }
    cams = std::move(picked);
  }
  if (cams.empty()) return InvalidArgumentError(info.path + ": no video features to pack");
  for (size_t i = 0; i < cams.size(); ++i) {
    static const std::regex ok_name("[A-Za-z0-9_-]+");
    if (!std::regex_match(cams[i].name, ok_name))
      return InvalidArgumentError("pack: camera name \"" + cams[i].name + "\" (from " +
                                  cams[i].key + ") must be [A-Za-z0-9_-]+");
    for (size_t j = 0; j < i; ++j)
      if (cams[j].name == cams[i].name)
        return InvalidArgumentError("pack: cameras " + cams[j].key + " and " + cams[i].key +
                                    " would both be named \"" + cams[i].name + "\"");
  }
  int out_w = 0, out_h = 0;
  ResolveOutputSize(cams[0].feature->width, cams[0].feature->height, o.width, o.height,
                    o.shortest_edge, &out_w, &out_h);
  if (o.width <= 0)
    for (const auto& c : cams) {
      const double a0 = static_cast<double>(cams[0].feature->width) / cams[0].feature->height;
      const double a = static_cast<double>(c.feature->width) / c.feature->height;
      if (std::fabs(a - a0) > 0.01 * a0)
        return InvalidArgumentError("pack: cameras " + cams[0].key + " and " + c.key +
                                    " differ in aspect ratio; give one frame size with --size WxH");
    }

  std::vector<std::string> video_keys;
  for (const auto& c : cams) video_keys.push_back(c.key);
  LF_ASSIGN_OR_RETURN(std::vector<EpisodeMeta> all_eps, ReadEpisodes(root, info, video_keys));
  LF_ASSIGN_OR_RETURN(auto tasks, ReadTasks(root, info));
  std::vector<const EpisodeMeta*> eps;
  if (o.episodes.empty()) {
    for (const auto& e : all_eps) eps.push_back(&e);
  } else {
    LF_ASSIGN_OR_RETURN(std::vector<int64_t> want, ParseEpisodeList(o.episodes));
    for (int64_t w : want) {
      auto it =
          std::lower_bound(all_eps.begin(), all_eps.end(), w,
                           [](const EpisodeMeta& e, int64_t v) { return e.episode_index < v; });
      if (it == all_eps.end() || it->episode_index != w)
        return NotFoundError("pack: episode " + std::to_string(w) + " is not listed in " + root +
                             "/meta (--episodes " + o.episodes + ")");
      eps.push_back(&*it);
    }
  }
  const std::string task_col = modality ? modality->task_column : "task_index";

  // ---- per-episode work: rows, checks, frames ----
  DataFileCache cache;
  const std::vector<std::string> data_cols = {
      "observation.state", "action", "timestamp", "frame_index",
      "episode_index",     "index",  task_col};
  const double tol = o.tolerance_s;
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Episodes run in parallel, one decoder thread each; with fewer episodes than threads the
  // spare threads go to the decoders (libdav1d/libavcodec frame threads), so a dataset of one long
  // episode still uses every core. Frames are the same either way (decoding is deterministic).
  const int decoder_threads =
      std::max(1, threads / static_cast<int>(std::clamp<size_t>(eps.size(), 1, threads)));
  std::atomic<bool> cancel{false};
  auto load = [&](const EpisodeMeta& em) -> EpisodeOut {
    EpisodeOut out;
    if (cancel.load()) {
      out.status = CancelledError("pack cancelled");
      return out;
    }
    const int64_t ep = em.episode_index;
    std::map<std::string, int64_t> ints;
    if (info.major == 2) {
      ints = {{"episode_chunk", ep / info.chunks_size}, {"episode_index", ep}};
    } else {
      ints = {{"chunk_index", em.data_chunk}, {"file_index", em.data_file}, {"episode_index", ep}};
    }
    auto rel = FormatTemplate(info.data_path, ints, {});
    if (!rel.ok()) {
      out.status = rel.status();
      return out;
    }
    auto in_root = PathInRoot(root, *rel, info.path + ": data_path \"" + info.data_path + "\"");
    if (!in_root.ok()) {
      out.status = in_root.status();
      return out;
    }
    const std::string file = *in_root;
    auto table = cache.Get(file, data_cols);
    if (!table->ok()) {
      out.status = table->status();
      return out;
    }
    const std::vector<Column>& cols = **table;
    auto fail = [&](Status s) {
      out.status = std::move(s);
      return std::move(out);
    };
    const Column* c[7];
    for (int i = 0; i < 7; ++i) {
      auto r = FindColumn(cols, data_cols[i], file);
      if (!r.ok()) return fail(r.status());
      c[i] = *r;
      if (i >= 3) {
        Status s = CheckIntColumn(*c[i], file);
        if (!s.ok()) return fail(s);
      }
    }
    if (c[2]->kind != Column::Kind::kDouble || c[2]->is_list)
      return fail(InvalidArgumentError(file + ": column \"timestamp\" is not a float column"));
    // This episode's rows: all of a v2 file; those with its episode_index in a v3 file.
    std::vector<size_t> rows;
    for (size_t r = 0; r < c[4]->i64.size(); ++r)
      if (c[4]->i64[r] == ep) rows.push_back(r);
    if (info.major == 2 && rows.size() != c[4]->i64.size())
      return fail(InvalidArgumentError(
          file + ": column \"episode_index\" holds other episodes than " + std::to_string(ep)));
    if (static_cast<int64_t>(rows.size()) != em.length)
      return fail(InvalidArgumentError(
          file + ": episode " + std::to_string(ep) + " has " + std::to_string(rows.size()) +
          " rows, the metadata says length " + std::to_string(em.length)));
    out.length = em.length;
    Status s = ListToFloats(*c[0], rows, state_dim, file, &out.state);
    if (s.ok()) s = ListToFloats(*c[1], rows, action_dim, file, &out.action);
    if (!s.ok()) return fail(s);
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t r = rows[k];
      const double t = c[2]->f64[r];
      const std::string where = file + ": row " + std::to_string(r);
      if (c[3]->i64[r] != static_cast<int64_t>(k))
        return fail(InvalidArgumentError(where + ": frame_index " + std::to_string(c[3]->i64[r]) +
                                         ", expected " + std::to_string(k) +
                                         " (rows of an episode are frames 0..T-1 in order)"));
      // A null reads as 0.0 and would pick frame 0; a repeated or decreasing time would give two
      // rows one frame.
      if (!c[2]->valid.empty() && !c[2]->valid[r])
        return fail(InvalidArgumentError(where + ": timestamp is null"));
      if (!std::isfinite(t) || t < 0)
        return fail(
            InvalidArgumentError(where + ": timestamp " + Ts(t) + " is not a finite time >= 0"));
      if (k > 0 && !(t > out.timestamp.back()))
        return fail(InvalidArgumentError(where + ": timestamp " + Ts(t) +
                                         " does not increase (the row before has " +
                                         Ts(out.timestamp.back()) + ")"));
      if (em.from_index >= 0 && c[5]->i64[r] != em.from_index + static_cast<int64_t>(k))
        return fail(InvalidArgumentError(where + ": index " + std::to_string(c[5]->i64[r]) +
                                         " disagrees with dataset_from_index " +
                                         std::to_string(em.from_index) + " of episode " +
                                         std::to_string(ep)));
      const int64_t ti = c[6]->i64[r];
      if (!tasks.count(ti))
        return fail(InvalidArgumentError(where + ": column \"" + task_col +
                                         "\" = " + std::to_string(ti) +
                                         " is not a task listed in " + root + "/meta"));
      out.timestamp.push_back(t);
      out.task_index.push_back(ti);
      out.index.push_back(c[5]->i64[r]);
    }
    // Frames: one reader per camera, rows in order (one sequential decode per episode).
    thread_local TjCompressor tj;
    out.jpegs.resize(cams.size());
    for (size_t ci = 0; ci < cams.size(); ++ci) {
      const Camera& cam = cams[ci];
      double offset = 0;
      std::map<std::string, int64_t> vints;
      if (info.major == 2) {
        vints = {{"episode_chunk", ep / info.chunks_size}, {"episode_index", ep}};
      } else {
        const VideoLocation& v = em.videos.at(cam.key);
        vints = {
            {"chunk_index", v.chunk_index}, {"file_index", v.file_index}, {"episode_index", ep}};
        offset = v.from_timestamp;
      }
      auto vrel = FormatTemplate(info.video_path, vints, {{"video_key", cam.key}});
      if (!vrel.ok()) return fail(vrel.status());
      auto vin_root =
          PathInRoot(root, *vrel, info.path + ": video_path \"" + info.video_path + "\"");
      if (!vin_root.ok()) return fail(vin_root.status());
      const std::string vpath = *vin_root;
      auto reader = VideoReader::Open(vpath);
      if (!reader.ok()) return fail(reader.status());
      const VideoInfo& vi = (*reader)->info();
      if (vi.width != cam.feature->width || vi.height != cam.feature->height)
        return fail(InvalidArgumentError(vpath + ": video is " + std::to_string(vi.width) + "x" +
                                         std::to_string(vi.height) + ", " + info.path + " says " +
                                         std::to_string(cam.feature->width) + "x" +
                                         std::to_string(cam.feature->height) + " for " + cam.key));
      if (vi.fps > 0 && std::fabs(vi.fps - info.fps) > 0.01 * info.fps)
        return fail(InvalidArgumentError(vpath + ": video is " + std::to_string(vi.fps) + " fps, " +
                                         info.path + " says " + std::to_string(info.fps)));
      std::vector<double> want(out.timestamp.size());
      for (size_t k = 0; k < want.size(); ++k) want[k] = out.timestamp[k] + offset;
      VideoReadOptions vo;
      vo.out_width = out_w;
      vo.out_height = out_h;
      vo.tolerance_s = tol;
      vo.decoder_threads = decoder_threads;
      vo.pixels = FramePixels::kRgbx32;  // swscale's SIMD output, read by turbojpeg as is
      auto& jp = out.jpegs[ci];
      jp.resize(want.size());
      Status vs = (*reader)->ReadFrames(
          want, vo,
          [&](size_t k, const uint8_t* rgb, int w, int h) -> Status {
            if (cancel.load()) return CancelledError("pack cancelled");
            if (!tj.Encode(rgb, w, h, o.quality, &jp[k]))
              return InternalError(vpath + ": JPEG encode failed: " + tjGetErrorStr());
            return Status::Ok();
          },
          [&](size_t k) {
            return "episode " + std::to_string(ep) + " frame_index " + std::to_string(k) +
                   ", row timestamp " + Ts(out.timestamp[k]) +
                   (offset != 0 ? " + from_timestamp " + Ts(offset) : std::string());
          });
      if (!vs.ok()) return fail(vs);
    }
    return out;
  };

  Schema schema;
  schema.num_episodes = static_cast<int64_t>(eps.size());
  for (const auto& c : cams) schema.cameras.push_back(c.name);
  schema.image_width = out_w;
  schema.image_height = out_h;
  schema.state_dim = state_dim;
  schema.action_dim = action_dim;
  schema.action_horizon = o.horizon;
  schema.tokenizer = tokenizer->id();
  schema.vocab_size = tokenizer->vocab_size();
  std::error_code ec;
  schema.source = fs::absolute(o.src, ec).string();
  schema.source_format = "lerobot " + info.version;
  schema.fps = info.fps;

  ThreadPool pool(threads, "pack-lerobot");
  OrderedWindow<EpisodeOut> loads(&pool, eps.size(), static_cast<size_t>(2 * threads + 1), &cancel,
                                  [&](size_t i) { return load(*eps[i]); });
  auto fail_all = [&](Status s) { return loads.Fail(std::move(s)); };
  PackResult result;
  ProgressBar bar("pack: lerobot episodes", static_cast<int64_t>(eps.size()), o.progress);
  std::vector<float> all_state, all_action;
  json ep_table = json::array();
  std::vector<float> chunk(static_cast<size_t>(o.horizon) * action_dim);
  std::vector<uint8_t> amask(o.horizon);
  std::map<int64_t, std::vector<int32_t>> token_cache;
  int64_t sample = 0;
  for (size_t e = 0; e < eps.size(); ++e) {
    auto next = loads.Take();
    if (!next.ok()) return fail_all(next.status());
    EpisodeOut ep = std::move(*next);
    if (!ep.status.ok()) return fail_all(ep.status);
    const int64_t n = ep.length;
    if (eps[e]->episode_index > INT32_MAX)
      return fail_all(InvalidArgumentError(
          root + "/meta: episode_index " + std::to_string(eps[e]->episode_index) +
          " does not fit the int32 episode of the '_meta' record"));
    json row = {{"episode_index", eps[e]->episode_index}, {"first_sample", sample}, {"length", n}};
    ep_table.push_back(row);
    for (int64_t t = 0; t < n; ++t, ++sample) {
      auto tok = token_cache.find(ep.task_index[t]);
      if (tok == token_cache.end()) {
        const std::string& text = tasks.at(ep.task_index[t]);
        if (text.size() > static_cast<size_t>(o.max_instruction_bytes))
          return fail_all(InvalidArgumentError(
              root + "/meta: task " + std::to_string(ep.task_index[t]) + " has " +
              std::to_string(text.size()) + " bytes, more than --max-instruction-bytes " +
              std::to_string(o.max_instruction_bytes)));
        auto ids = EncodeChecked(*tokenizer, text, "task " + std::to_string(ep.task_index[t]));
        if (!ids.ok()) return fail_all(ids.status());
        schema.max_tokens = std::max(schema.max_tokens, static_cast<int>(ids->size()));
        tok = token_cache.emplace(ep.task_index[t], std::move(*ids)).first;
      }
      FillActionChunk(
          t, n, o.horizon, action_dim, [&](int64_t s) { return ep.action.data() + s * action_dim; },
          chunk.data(), amask.data());
      // The source's episode_index, as LeRobot, inspect and ReadEpisode name the episode.
      const int32_t meta[2] = {static_cast<int32_t>(eps[e]->episode_index),
                               static_cast<int32_t>(t)};
      struct {
        double timestamp;
        int64_t task_index, index;
      } lr = {ep.timestamp[t], ep.task_index[t], ep.index[t]};
      static_assert(sizeof(lr) == 24, "lerobot record layout");
      std::vector<std::string_view> jpegs(cams.size());
      for (size_t c = 0; c < cams.size(); ++c) jpegs[c] = ep.jpegs[c][t];
      Status st = PutSample(writer.get(), sample, schema.cameras,
                            {AsBytes(chunk), AsBytes(amask), std::move(jpegs), AsBytes(&lr, 1),
                             AsBytes(meta, 2), AsBytes(ep.state.data() + t * state_dim, state_dim),
                             tasks.at(ep.task_index[t]), AsBytes(tok->second)},
                            &result.jpeg_bytes);
      if (!st.ok()) return fail_all(st);
    }
    all_state.insert(all_state.end(), ep.state.begin(), ep.state.end());
    all_action.insert(all_action.end(), ep.action.begin(), ep.action.end());
    bar.Add(1);
  }
  schema.num_samples = sample;

  // Statistics of the packed rows: mean/std (population), min/max, q01/q99.
  auto stats = [](const std::vector<float>& rows, int dims, std::vector<float>* mean,
                  std::vector<float>* sd, std::vector<float>* mn, std::vector<float>* mx,
                  std::vector<float>* q01, std::vector<float>* q99) {
    std::vector<const float*> row_ptrs(rows.size() / dims);
    for (size_t i = 0; i < row_ptrs.size(); ++i) row_ptrs[i] = rows.data() + i * dims;
    ComputeStats(row_ptrs, dims, mean, sd, mn, mx);
    *q01 = Quantile(rows, dims, 0.01);
    *q99 = Quantile(rows, dims, 0.99);
  };
  stats(all_state, state_dim, &schema.state_mean, &schema.state_std, &schema.state_min,
        &schema.state_max, &schema.state_q01, &schema.state_q99);
  stats(all_action, action_dim, &schema.action_mean, &schema.action_std, &schema.action_min,
        &schema.action_max, &schema.action_q01, &schema.action_q99);
  // The dataset's own statistics win where it has them for all of it (LeRobot and GR00T
  // normalize with meta/stats.json); computed values fill the rest (q01/q99 most often).
  std::string stats_from = "computed from the packed rows";
  if (o.episodes.empty() && fs::exists(root + "/meta/stats.json", ec)) {
    LF_ASSIGN_OR_RETURN(json sj, ReadJsonFile(root + "/meta/stats.json"));
    auto take = [&](const char* feature, const char* stat, int dims, std::vector<float>* dst) {
      if (!sj.contains(feature) || !sj[feature].is_object() || !sj[feature].contains(stat)) return;
      const json& v = sj[feature][stat];
      if (!v.is_array() || static_cast<int>(v.size()) != dims) return;
      for (int d = 0; d < dims; ++d)
        if (!v[d].is_number()) return;
      for (int d = 0; d < dims; ++d) (*dst)[d] = v[d].get<float>();
      stats_from = "meta/stats.json where present, else computed";
    };
    for (auto [f, dims, mean, sd, mn, mx, q01, q99] :
         {std::make_tuple("observation.state", state_dim, &schema.state_mean, &schema.state_std,
                          &schema.state_min, &schema.state_max, &schema.state_q01,
                          &schema.state_q99),
          std::make_tuple("action", action_dim, &schema.action_mean, &schema.action_std,
                          &schema.action_min, &schema.action_max, &schema.action_q01,
                          &schema.action_q99)}) {
      take(f, "mean", dims, mean);
      take(f, "std", dims, sd);
      take(f, "min", dims, mn);
      take(f, "max", dims, mx);
      take(f, "q01", dims, q01);
      take(f, "q99", dims, q99);
    }
  }

  json meta;
  meta["format"] = info.version;
  // The source's own metadata, as it was (feature names, robot type, splits, ...), so a loader
  // contract can give what LeRobot's meta gives without the source at hand.
  LF_ASSIGN_OR_RETURN(meta["info"], ReadJsonFile(root + "/meta/info.json"));
  json names = json::object();
  for (const auto& [key, f] : info.features)
    if (!f.names.empty()) names[key] = f.names;
  meta["feature_names"] = names;
  meta["source_frame_size"] = {cams[0].feature->width, cams[0].feature->height};
  meta["episodes"] = ep_table;
  json jt = json::object();
  for (const auto& [k, v] : tasks) jt[std::to_string(k)] = v;
  meta["tasks"] = jt;
  json jc = json::object();
  for (const auto& c : cams) jc[c.name] = c.key;
  meta["camera_keys"] = jc;
  meta["stats_from"] = stats_from;
  if (modality) {
    meta["modality_file"] = modality->path;
    meta["modality"] = json::parse(modality->json);
  }
  schema.source_meta = meta.dump();

  LF_RETURN_IF_ERROR(writer->Commit(schema));
  bar.Finish();
  result.schema = schema;
  result.bytes_written = writer->bytes_written();
  result.seconds = NowSeconds() - start;
  result.write_seconds = result.seconds;
  LF_LOG(DEBUG) << "packed " << schema.num_samples << " LeRobot samples into " << o.out;
  return result;
}

namespace {

// One episode of the schema's source_meta episode table.
struct EpisodeSpan {
  int64_t episode_index, first, length;
};

// The episode table of a DB packed by PackLeRobot, checked against the DB: every span inside
// [0, num_samples), in sample order, covering every sample once. FailedPrecondition for a DB not
// packed from LeRobot; DataLoss naming the DB for a damaged table.
StatusOr<std::vector<EpisodeSpan>> EpisodeTable(const std::string& db, const Schema& s) {
  if (s.source_format.rfind("lerobot", 0) != 0)
    return FailedPreconditionError(db +
                                   ": not packed from a LeRobot dataset (pack --from-lerobot)");
  const json meta = json::parse(s.source_meta, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("episodes") ||
      !meta["episodes"].is_array())
    return DataLossError(db + ": schema source_meta is damaged (no episode table)");
  std::vector<EpisodeSpan> spans;
  int64_t next = 0;
  for (const auto& e : meta["episodes"]) {
    EpisodeSpan sp{json_util::Int(e, "episode_index", -1), json_util::Int(e, "first_sample", -1),
                   json_util::Int(e, "length", -1)};
    if (sp.episode_index < 0 || sp.first != next || sp.length < 1 ||
        sp.length > s.num_samples - sp.first)
      return DataLossError(db + ": schema source_meta episode table entry " +
                           std::to_string(spans.size()) + " is damaged (" + e.dump() +
                           "; expected first_sample " + std::to_string(next) +
                           " and length in 1.." + std::to_string(s.num_samples - next) + ")");
    next += sp.length;
    spans.push_back(sp);
  }
  if (next != s.num_samples)
    return DataLossError(db + ": schema source_meta episode table covers " + std::to_string(next) +
                         " of " + std::to_string(s.num_samples) + " samples");
  return spans;
}

// The record `mod` of sample `id`, of `size` bytes (0: any); DataLoss naming it otherwise.
StatusOr<std::string_view> GetRecord(RecordReader::Txn& txn, const std::string& db, int64_t id,
                                     const std::string& mod, size_t size) {
  const std::string key = SampleKey(id, mod);
  LF_ASSIGN_OR_RETURN(std::string_view v, txn.Get(key));
  if (size && v.size() != size)
    return DataLossError(db + ": record '" + key + "' has " + std::to_string(v.size()) +
                         " bytes, expected " + std::to_string(size));
  return v;
}

// Appends the image-free rows of samples [first, first + n) to `out` (frame table layout).
Status AppendRows(RecordReader::Txn& txn, const std::string& db, const Schema& s, int64_t first,
                  int64_t n, FrameTable* out) {
  for (int64_t id = first; id < first + n; ++id) {
    LF_ASSIGN_OR_RETURN(auto st, GetRecord(txn, db, id, "state", size_t(s.state_dim) * 4));
    const float* sp = reinterpret_cast<const float*>(st.data());
    out->state.insert(out->state.end(), sp, sp + s.state_dim);
    LF_ASSIGN_OR_RETURN(
        auto ac, GetRecord(txn, db, id, "action", size_t(s.action_horizon) * s.action_dim * 4));
    const float* ap = reinterpret_cast<const float*>(ac.data());
    out->action.insert(out->action.end(), ap, ap + s.action_dim);  // row 0: step t's action
    LF_ASSIGN_OR_RETURN(auto lr, GetRecord(txn, db, id, "lerobot", 24));
    double ts;
    int64_t ti, index;
    std::memcpy(&ts, lr.data(), 8);
    std::memcpy(&ti, lr.data() + 8, 8);
    std::memcpy(&index, lr.data() + 16, 8);
    LF_ASSIGN_OR_RETURN(auto mt, GetRecord(txn, db, id, "meta", 8));
    int32_t m[2];
    std::memcpy(m, mt.data(), 8);
    out->timestamp.push_back(ts);
    out->task_index.push_back(ti);
    out->index.push_back(index);
    out->episode_index.push_back(m[0]);
    out->frame_index.push_back(m[1]);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<FrameTable> ReadFrameTable(const std::string& db) {
  LF_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(db));
  const Schema& s = reader->schema();
  LF_ASSIGN_OR_RETURN(std::vector<EpisodeSpan> spans, EpisodeTable(db, s));
  FrameTable out;
  out.rows = s.num_samples;
  out.state_dim = s.state_dim;
  out.action_dim = s.action_dim;
  out.fps = s.fps;
  out.state.reserve(static_cast<size_t>(out.rows) * s.state_dim);
  out.action.reserve(static_cast<size_t>(out.rows) * s.action_dim);
  LF_ASSIGN_OR_RETURN(RecordReader::Txn txn, reader->Begin());
  if (out.rows > 0 && !txn.Get(SampleKey(0, "lerobot")).ok())
    return FailedPreconditionError(db + ": packed before the per-frame LeRobot records ('" +
                                   SampleKey(0, "lerobot") +
                                   "'); repack it with loongforge pack --from-lerobot");
  for (const EpisodeSpan& sp : spans) {
    LF_RETURN_IF_ERROR(AppendRows(txn, db, s, sp.first, sp.length, &out));
    out.episode_first.insert(out.episode_first.end(), sp.length, sp.first);
    out.episode_length.insert(out.episode_length.end(), sp.length, sp.length);
    // Delta timestamps step through an episode by sample id: its rows must be frames 0..T-1.
    for (int64_t id = sp.first; id < sp.first + sp.length; ++id)
      if (out.episode_index[id] != sp.episode_index || out.frame_index[id] != id - sp.first)
        return DataLossError(db + ": record '" + SampleKey(id, "meta") + "' says episode " +
                             std::to_string(out.episode_index[id]) + " frame " +
                             std::to_string(out.frame_index[id]) + ", the episode table episode " +
                             std::to_string(sp.episode_index) + " frame " +
                             std::to_string(id - sp.first));
  }
  return out;
}

StatusOr<EpisodeData> ReadEpisode(const std::string& db, int64_t episode_index) {
  LF_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(db));
  const Schema& s = reader->schema();
  LF_ASSIGN_OR_RETURN(std::vector<EpisodeSpan> spans, EpisodeTable(db, s));
  const json meta = json::parse(s.source_meta, nullptr, false);
  auto sp = std::find_if(spans.begin(), spans.end(),
                         [&](const EpisodeSpan& e) { return e.episode_index == episode_index; });
  if (sp == spans.end()) return NotFoundError(db + ": no episode " + std::to_string(episode_index));
  LF_ASSIGN_OR_RETURN(RecordReader::Txn txn, reader->Begin());
  FrameTable rows;
  LF_RETURN_IF_ERROR(AppendRows(txn, db, s, sp->first, sp->length, &rows));
  EpisodeData out;
  out.episode_index = episode_index;
  out.length = sp->length;
  out.state_dim = s.state_dim;
  out.action_dim = s.action_dim;
  out.state = std::move(rows.state);
  out.action = std::move(rows.action);
  out.timestamp = std::move(rows.timestamp);
  out.frame_index = std::move(rows.frame_index);
  out.task_index = std::move(rows.task_index);
  const json none;
  const json& tasks = meta.contains("tasks") ? meta["tasks"] : none;
  for (int64_t ti : out.task_index)
    out.tasks.push_back(json_util::String(tasks, std::to_string(ti).c_str()));
  out.cameras = s.cameras;
  out.width = s.image_width;
  out.height = s.image_height;
  const size_t frame_bytes = static_cast<size_t>(s.image_width) * s.image_height * 3;
  out.images.resize(s.cameras.size());
  for (auto& im : out.images) im.resize(static_cast<size_t>(out.length) * frame_bytes);
  tjhandle tj = tjInitDecompress();
  std::unique_ptr<void, void (*)(void*)> tj_guard(tj, [](void* h) {
    if (h) tjDestroy(h);
  });
  if (!tj) return InternalError("tjInitDecompress failed");
  for (int64_t t = 0; t < out.length; ++t) {
    const int64_t id = sp->first + t;
    for (size_t c = 0; c < s.cameras.size(); ++c) {
      const std::string mod = CameraModality(s.cameras[c]);
      LF_ASSIGN_OR_RETURN(auto jpg, GetRecord(txn, db, id, mod, 0));
      uint8_t* dst = out.images[c].data() + static_cast<size_t>(t) * frame_bytes;
      if (tjDecompress2(tj, reinterpret_cast<const unsigned char*>(jpg.data()),
                        static_cast<unsigned long>(jpg.size()), dst, s.image_width, 0,
                        s.image_height, TJPF_RGB, 0) != 0)
        return DataLossError(db + ": record '" + SampleKey(id, mod) +
                             "' is not a decodable JPEG of " + std::to_string(s.image_width) + "x" +
                             std::to_string(s.image_height));
    }
  }
  return out;
}

}  // namespace loongforge::data
