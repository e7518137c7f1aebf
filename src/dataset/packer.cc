// `pack`: validates an episode folder and writes it into the LMDB record store.
//
// Three phases: (1) scan — every episode's steps.jsonl is parsed and its camera folders listed, in
// parallel, one task per episode; (2) check — in episode order, so the first error reported does
// not depend on thread timing: cameras, dims and frame coverage across episodes, then
// normalization statistics; (3) write — frames are read and their JPEG headers validated on the
// thread pool a bounded window ahead of the single writer thread, which puts the records of each
// sample in key order and publishes the DB with RecordWriter::Commit().
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/thread_pool.h"
#include "dataset/pack_common.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"
#include "loongforge/pack.h"
#include "loongforge/progress.h"
#include "loongforge/tokenizer.h"

namespace loongforge::data {
namespace fs = std::filesystem;
namespace {

constexpr auto kFrameReadTimeout = std::chrono::seconds(300);

struct StepRow {
  std::vector<float> state, action;
  std::string instruction;
  int line = 0;  // in steps.jsonl, for errors found after the scan
};

struct Episode {
  std::string name;
  fs::path dir, steps_path;
  std::vector<StepRow> steps;
  std::vector<std::string> cameras;  // sorted camera names found in this episode
  std::map<std::string, std::map<int64_t, fs::path>> frames;  // camera -> step -> file
};

// Natural order: runs of digits compare by value, so "ep2" < "ep10".
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && a[i2] == '0') ++i2;
      while (j2 < b.size() && b[j2] == '0') ++j2;
      size_t ie = i2, je = j2;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      if (ie - i2 != je - j2) return ie - i2 < je - j2;
      int c = a.compare(i2, ie - i2, b, j2, je - j2);
      if (c != 0) return c < 0;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if ((a.size() - i) != (b.size() - j)) return a.size() - i < b.size() - j;
  return a < b;  // e.g. "01" vs "1": fall back to plain order so the sort is strict
}

std::string Where(const fs::path& file, int line) {
  return file.string() + ":" + std::to_string(line);
}

Status ReadNumbers(const nlohmann::json& j, const char* field, const std::string& where,
                   std::vector<float>* out) {
  auto it = j.find(field);
  if (it == j.end()) return InvalidArgumentError(where + ": missing \"" + field + "\"");
  if (!it->is_array()) return InvalidArgumentError(where + ": \"" + field + "\" is not a list");
  out->clear();
  out->reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    if (!v.is_number())
      return InvalidArgumentError(where + ": \"" + field + "\"[" + std::to_string(i) +
                                  "] is not a number");
    double d = v.get<double>();
    if (!std::isfinite(static_cast<float>(d)))
      return InvalidArgumentError(where + ": \"" + field + "\"[" + std::to_string(i) +
                                  "] does not fit a float32");
    out->push_back(static_cast<float>(d));
  }
  return Status::Ok();
}

Status ParseSteps(Episode* ep, int max_instruction_bytes) {
  std::ifstream in(ep->steps_path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(ep->steps_path, ec))
      return NotFoundError(ep->steps_path.string() + ": missing steps.jsonl in episode " +
                           ep->dir.string());
    return ErrnoToStatus(errno, "open " + ep->steps_path.string());
  }
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank line
    const std::string where = Where(ep->steps_path, line_no);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidArgumentError(where + ": not valid JSON");
    if (!j.is_object()) return InvalidArgumentError(where + ": not a JSON object");
    auto st = j.find("step");
    if (st == j.end()) return InvalidArgumentError(where + ": missing \"step\"");
    if (!st->is_number_integer())
      return InvalidArgumentError(where + ": \"step\" is not an integer");
    int64_t step = st->get<int64_t>();
    int64_t expected = static_cast<int64_t>(ep->steps.size());
    if (step != expected)
      return InvalidArgumentError(
          where + ": step " + std::to_string(step) + " where step " + std::to_string(expected) +
          " was expected (steps must be 0, 1, 2, ... in order, without gaps)");
    StepRow row;
    LF_RETURN_IF_ERROR(ReadNumbers(j, "state", where, &row.state));
    LF_RETURN_IF_ERROR(ReadNumbers(j, "action", where, &row.action));
    auto ins = j.find("instruction");
    if (ins == j.end()) return InvalidArgumentError(where + ": missing \"instruction\"");
    if (!ins->is_string()) return InvalidArgumentError(where + ": \"instruction\" is not a string");
    row.instruction = ins->get<std::string>();
    if (row.instruction.size() > static_cast<size_t>(max_instruction_bytes))
      return InvalidArgumentError(where + ": \"instruction\" of episode " + ep->name + " has " +
                                  std::to_string(row.instruction.size()) +
                                  " bytes, more than the limit of " +
                                  std::to_string(max_instruction_bytes) +
                                  " (raise it with --max-instruction-bytes / "
                                  "max_instruction_bytes if the text is meant to be this long)");
    row.line = line_no;
    if (row.action.empty()) return InvalidArgumentError(where + ": \"action\" is empty");
    if (!ep->steps.empty()) {
      const StepRow& first = ep->steps.front();
      if (row.state.size() != first.state.size())
        return InvalidArgumentError(where + ": state has " + std::to_string(row.state.size()) +
                                    " dims, expected " + std::to_string(first.state.size()) +
                                    " (as on the first line)");
      if (row.action.size() != first.action.size())
        return InvalidArgumentError(where + ": action has " + std::to_string(row.action.size()) +
                                    " dims, expected " + std::to_string(first.action.size()) +
                                    " (as on the first line)");
    }
    ep->steps.push_back(std::move(row));
  }
  if (in.bad()) return ErrnoToStatus(errno, "read " + ep->steps_path.string());
  if (ep->steps.empty()) return InvalidArgumentError(ep->steps_path.string() + ": no steps");
  return Status::Ok();
}

// Frame files are "<step>.jpg" (or .jpeg, any case; leading zeros allowed). Dotfiles are ignored.
Status ListFrames(const fs::path& cam_dir, std::map<int64_t, fs::path>* frames) {
  std::error_code ec;
  for (fs::directory_iterator it(cam_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::string name = p.filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::string ext = p.extension().string(), stem = p.stem().string();
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    bool digits =
        !stem.empty() && stem.size() <= 12 &&
        std::all_of(stem.begin(), stem.end(), [](unsigned char c) { return std::isdigit(c); });
    if ((ext != ".jpg" && ext != ".jpeg") || !digits)
      return InvalidArgumentError(p.string() + ": frame files must be named <step>.jpg");
    int64_t step = std::stoll(stem);
    auto [pos, inserted] = frames->emplace(step, p);
    if (!inserted)
      return InvalidArgumentError(p.string() + ": a second frame for step " + std::to_string(step) +
                                  " (also " + pos->second.string() + ")");
  }
  if (ec) return ErrnoToStatus(ec.value(), "list " + cam_dir.string());
  return Status::Ok();
}

Status ScanEpisode(Episode* ep, int max_instruction_bytes) {
  ep->steps_path = ep->dir / "steps.jsonl";
  std::error_code ec;
  for (fs::directory_iterator it(ep->dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code dir_ec;
    if (name.rfind("cam_", 0) == 0 && it->is_directory(dir_ec)) {
      if (name.size() == 4)
        return InvalidArgumentError(it->path().string() + ": empty camera name");
      ep->cameras.push_back(name.substr(4));
    }
  }
  if (ec) return ErrnoToStatus(ec.value(), "list " + ep->dir.string());
  std::sort(ep->cameras.begin(), ep->cameras.end());
  LF_RETURN_IF_ERROR(ParseSteps(ep, max_instruction_bytes));
  for (const auto& cam : ep->cameras)
    LF_RETURN_IF_ERROR(ListFrames(ep->dir / ("cam_" + cam), &ep->frames[cam]));
  return Status::Ok();
}

// Checks an episode against the first one (cameras, dims) and that every step has every frame.
Status CheckEpisode(const Episode& ep, const Episode& first) {
  std::string first_cams;
  for (const auto& c : first.cameras) first_cams += (first_cams.empty() ? "" : ", ") + c;
  for (const auto& cam : first.cameras)
    if (!std::binary_search(ep.cameras.begin(), ep.cameras.end(), cam))
      return NotFoundError((ep.dir / ("cam_" + cam)).string() +
                           ": missing camera folder (episode " + first.name + " has cameras " +
                           first_cams + ")");
  for (const auto& cam : ep.cameras)
    if (!std::binary_search(first.cameras.begin(), first.cameras.end(), cam))
      return InvalidArgumentError((ep.dir / ("cam_" + cam)).string() + ": camera '" + cam +
                                  "' is not in the first episode " + first.name + " (cameras " +
                                  first_cams + ")");
  const StepRow &a = ep.steps.front(), &b = first.steps.front();
  if (a.state.size() != b.state.size())
    return InvalidArgumentError(Where(ep.steps_path, 1) + ": state has " +
                                std::to_string(a.state.size()) + " dims, expected " +
                                std::to_string(b.state.size()) + " (as in " +
                                first.steps_path.string() + ")");
  if (a.action.size() != b.action.size())
    return InvalidArgumentError(Where(ep.steps_path, 1) + ": action has " +
                                std::to_string(a.action.size()) + " dims, expected " +
                                std::to_string(b.action.size()) + " (as in " +
                                first.steps_path.string() + ")");
  const int64_t n = static_cast<int64_t>(ep.steps.size());
  for (const auto& cam : ep.cameras) {
    const auto& frames = ep.frames.at(cam);
    const fs::path cam_dir = ep.dir / ("cam_" + cam);
    for (int64_t t = 0; t < n; ++t)
      if (!frames.count(t))
        return NotFoundError((cam_dir / (std::to_string(t) + ".jpg")).string() +
                             ": missing frame for step " + std::to_string(t) + " (" +
                             ep.steps_path.string() + " has " + std::to_string(n) + " steps)");
    if (!frames.empty() && frames.rbegin()->first >= n)
      return InvalidArgumentError(frames.rbegin()->second.string() + ": frame for step " +
                                  std::to_string(frames.rbegin()->first) + " but " +
                                  ep.steps_path.string() + " has only " + std::to_string(n) +
                                  " steps");
  }
  return Status::Ok();
}

struct TjDecompressor {
  tjhandle h = tjInitDecompress();
  ~TjDecompressor() {
    if (h) tjDestroy(h);
  }
};

struct JpegInfo {
  int width = 0, height = 0;
};

// Validates that `data` is a JPEG we can decode to RGB: a parsable header (tjDecompressHeader3),
// a colour space other than CMYK/YCCK, and an end-of-image marker (catches truncated files).
StatusOr<JpegInfo> CheckJpeg(const std::string& data, const std::string& path, int64_t max_pixels) {
  thread_local TjDecompressor tj;
  if (!tj.h) return InternalError(std::string("tjInitDecompress: ") + tjGetErrorStr());
  int w = 0, h = 0, subsamp = 0, cs = 0;
  if (data.size() < 4 || static_cast<uint8_t>(data[0]) != 0xFF ||
      static_cast<uint8_t>(data[1]) != 0xD8 ||
      tjDecompressHeader3(tj.h, reinterpret_cast<const unsigned char*>(data.data()),
                          static_cast<unsigned long>(data.size()), &w, &h, &subsamp, &cs) != 0)
    return InvalidArgumentError(
        path + ": not a JPEG" +
        (data.size() >= 4 ? std::string(" (") + tjGetErrorStr2(tj.h) + ")" : " (too short)"));
  if (static_cast<int64_t>(w) * h > max_pixels)
    return InvalidArgumentError(path + ": JPEG header claims " + std::to_string(w) + "x" +
                                std::to_string(h) + " = " +
                                std::to_string(static_cast<int64_t>(w) * h) +
                                " pixels, over max_frame_pixels " + std::to_string(max_pixels));
  if (cs == TJCS_CMYK || cs == TJCS_YCCK)
    return InvalidArgumentError(path + ": CMYK JPEG is not supported");
  // The EOI marker is normally the last two bytes; allow a little trailing padding.
  bool eoi = false;
  size_t from = data.size() > 256 ? data.size() - 256 : 0;
  for (size_t i = data.size() - 1; i > from && !eoi; --i)
    eoi = static_cast<uint8_t>(data[i - 1]) == 0xFF && static_cast<uint8_t>(data[i]) == 0xD9;
  if (!eoi) return InvalidArgumentError(path + ": truncated JPEG (no end-of-image marker)");
  return JpegInfo{w, h};
}

Status ReadWholeFile(const fs::path& path, std::string* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return ErrnoToStatus(errno, "open " + path.string());
  out->clear();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) return ErrnoToStatus(err, "read " + path.string());
  return Status::Ok();
}

struct SampleFrames {
  Status status;
  std::vector<std::string> jpegs;  // per camera, in schema camera order
};

}  // namespace

StatusOr<PackResult> PackEpisodes(const PackOptions& o) {
  static_assert(sizeof(float) == 4, "float32 records");
  if (o.src.empty() || o.out.empty()) return InvalidArgumentError("pack: src and out are required");
  LF_RETURN_IF_ERROR(CheckSharedPackOptions(o.horizon, o.threads, o.max_instruction_bytes));
  if (o.max_frame_pixels < 1)
    return InvalidArgumentError("pack: max_frame_pixels must be >= 1, got " +
                                std::to_string(o.max_frame_pixels));
  const double start = NowSeconds();
  std::error_code ec;
  LF_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, MakeTokenizer(o.tokenizer));
  // The writer first: it refuses an output that is not ours to replace and locks it against a
  // concurrent pack before any time goes into the scan (RecordWriter in dataset.h).
  LF_ASSIGN_OR_RETURN(std::unique_ptr<RecordWriter> writer,
                      RecordWriter::Create(o.out, o.overwrite));

  // ---- phase 1: scan ----
  const fs::path root = fs::path(o.src) / "episodes";
  if (!fs::is_directory(root, ec))
    return NotFoundError(root.string() + ": no episodes folder in " + o.src);
  std::vector<Episode> episodes;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code dir_ec;
    if (name.empty() || name[0] == '.' || !it->is_directory(dir_ec)) continue;
    episodes.emplace_back();
    episodes.back().name = name;
    episodes.back().dir = it->path();
  }
  if (ec) return ErrnoToStatus(ec.value(), "list " + root.string());
  if (episodes.empty()) return InvalidArgumentError(root.string() + ": no episode folders");
  std::sort(episodes.begin(), episodes.end(),
            [](const Episode& a, const Episode& b) { return NaturalLess(a.name, b.name); });

  int threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads, "pack");
  {
    ProgressBar bar("pack: scan", static_cast<int64_t>(episodes.size()), o.progress);
    std::vector<std::future<Status>> scans;
    for (auto& ep : episodes)
      scans.push_back(pool.Async([&ep, &bar, &o] {
        Status s = ScanEpisode(&ep, o.max_instruction_bytes);
        bar.Add(1);
        return s;
      }));
    // ---- phase 2: check, in episode order ----
    std::vector<Status> results;
    for (auto& f : scans)
      results.push_back(f.valid() ? f.get() : CancelledError("pack: thread pool shut down"));
    for (size_t e = 0; e < episodes.size(); ++e) {
      LF_RETURN_IF_ERROR(results[e]);
      if (e == 0 && episodes[0].cameras.empty())
        return InvalidArgumentError(episodes[0].dir.string() + ": no camera folders (cam_<name>/)");
      LF_RETURN_IF_ERROR(CheckEpisode(episodes[e], episodes[0]));
    }
  }

  Schema schema;
  schema.num_episodes = static_cast<int64_t>(episodes.size());
  schema.cameras = episodes[0].cameras;
  schema.state_dim = static_cast<int>(episodes[0].steps[0].state.size());
  schema.action_dim = static_cast<int>(episodes[0].steps[0].action.size());
  schema.action_horizon = o.horizon;
  schema.tokenizer = tokenizer->id();
  schema.vocab_size = tokenizer->vocab_size();
  schema.source = fs::absolute(o.src, ec).string();
  std::vector<const float*> states, actions;
  for (const auto& ep : episodes)
    for (const auto& st : ep.steps) {
      states.push_back(st.state.data());
      actions.push_back(st.action.data());
    }
  schema.num_samples = static_cast<int64_t>(states.size());
  ComputeStats(states, schema.state_dim, &schema.state_mean, &schema.state_std, &schema.state_min,
               &schema.state_max);
  ComputeStats(actions, schema.action_dim, &schema.action_mean, &schema.action_std,
               &schema.action_min, &schema.action_max);

  // Frame size comes from the first frame; every other frame must match it.
  const fs::path first_frame = episodes[0].frames.at(schema.cameras[0]).at(0);
  {
    std::string data;
    LF_RETURN_IF_ERROR(ReadWholeFile(first_frame, &data));
    LF_ASSIGN_OR_RETURN(JpegInfo info, CheckJpeg(data, first_frame.string(), o.max_frame_pixels));
    schema.image_width = info.width;
    schema.image_height = info.height;
  }

  const double write_start = NowSeconds();
  // ---- phase 3: write ----
  struct SampleRef {
    const Episode* ep;
    int32_t episode_index, step;
  };
  std::vector<SampleRef> samples;
  samples.reserve(static_cast<size_t>(schema.num_samples));
  for (size_t e = 0; e < episodes.size(); ++e)
    for (size_t t = 0; t < episodes[e].steps.size(); ++t)
      samples.push_back({&episodes[e], static_cast<int32_t>(e), static_cast<int32_t>(t)});

  std::atomic<bool> cancel{false};
  const int width = schema.image_width, height = schema.image_height;
  const std::vector<std::string>& cams = schema.cameras;
  const std::string first_frame_name = first_frame.string();
  auto read_frames = [&](const SampleRef& s) {
    SampleFrames out;
    if (cancel.load()) {
      out.status = CancelledError("pack cancelled");
      return out;
    }
    out.jpegs.resize(cams.size());
    for (size_t c = 0; c < cams.size(); ++c) {
      const fs::path& p = s.ep->frames.at(cams[c]).at(s.step);
      out.status = ReadWholeFile(p, &out.jpegs[c]);
      if (!out.status.ok()) return out;
      auto info = CheckJpeg(out.jpegs[c], p.string(), o.max_frame_pixels);
      if (!info.ok()) {
        out.status = info.status();
        return out;
      }
      if (info->width != width || info->height != height) {
        out.status = InvalidArgumentError(p.string() + ": frame is " + std::to_string(info->width) +
                                          "x" + std::to_string(info->height) + ", expected " +
                                          std::to_string(width) + "x" + std::to_string(height) +
                                          " (as " + first_frame_name + ")");
        return out;
      }
    }
    return out;
  };

  PackResult result;
  OrderedWindow<SampleFrames> reads(&pool, samples.size(), static_cast<size_t>(4 * threads + 8),
                                    &cancel, [&](size_t i) { return read_frames(samples[i]); });
  auto fail = [&](Status s) { return reads.Fail(std::move(s)); };
  ProgressBar bar("pack: write", schema.num_samples, o.progress);
  std::vector<int32_t> tokens;
  std::string last_instruction;
  bool have_tokens = false;
  std::vector<float> chunk(static_cast<size_t>(o.horizon) * schema.action_dim);
  std::vector<uint8_t> amask(o.horizon);
  for (size_t i = 0; i < samples.size(); ++i) {
    auto next = reads.Take(kFrameReadTimeout);
    if (next.status().code() == StatusCode::kDeadlineExceeded)
      return fail(DeadlineExceededError("pack: reading the frames of sample " + std::to_string(i) +
                                        " took over " + std::to_string(kFrameReadTimeout.count()) +
                                        " s"));
    if (!next.ok()) return fail(next.status());
    SampleFrames frames = std::move(*next);
    if (!frames.status.ok()) return fail(frames.status);

    const SampleRef& s = samples[i];
    const std::vector<StepRow>& steps = s.ep->steps;
    const StepRow& row = steps[s.step];
    if (!have_tokens || row.instruction != last_instruction) {
      auto ids = EncodeChecked(*tokenizer, row.instruction,
                               "the instruction at " + Where(s.ep->steps_path, row.line));
      if (!ids.ok()) return fail(ids.status());
      tokens = std::move(*ids);
      last_instruction = row.instruction;
      have_tokens = true;
      schema.max_tokens = std::max(schema.max_tokens, static_cast<int>(tokens.size()));
    }
    FillActionChunk(
        s.step, static_cast<int64_t>(steps.size()), o.horizon, schema.action_dim,
        [&](int64_t t) { return steps[t].action.data(); }, chunk.data(), amask.data());
    const int32_t meta[2] = {s.episode_index, s.step};
    Status st = PutSample(
        writer.get(), static_cast<int64_t>(i), cams,
        {AsBytes(chunk), AsBytes(amask),
         std::vector<std::string_view>(frames.jpegs.begin(), frames.jpegs.end()),
         /*lerobot=*/{}, AsBytes(meta, 2), AsBytes(row.state), row.instruction, AsBytes(tokens)},
        &result.jpeg_bytes);
    if (!st.ok()) return fail(st);
    bar.Add(1);
  }
  LF_RETURN_IF_ERROR(writer->Commit(schema));
  bar.Finish();
  result.schema = schema;
  result.bytes_written = writer->bytes_written();
  result.seconds = NowSeconds() - start;
  result.write_seconds = NowSeconds() - write_start;
  result.scan_seconds = write_start - start;
  LF_LOG(DEBUG) << "packed " << schema.num_samples << " samples into " << o.out;
  return result;
}

}  // namespace loongforge::data
