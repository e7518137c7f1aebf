// The LeRobot dataset's metadata (Note [LeRobot layouts] in lerobot_import.h): meta/info.json,
// the episodes and tasks (v2.x JSON lines, v3.0 Parquet), GR00T's modality.json, and the small
// parsers `pack --from-lerobot` needs (episode lists, path templates, quantiles). Reading rows and
// frames into the record store is lerobot_import.cc.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "common/json_util.h"

#include "dataset/lerobot_import.h"
#include "dataset/lerobot_internal.h"
#include "dataset/parquet/parquet.h"

namespace loongforge::data::lerobot {
namespace fs = std::filesystem;
using nlohmann::json;
using parquet::Column;

namespace internal {

StatusOr<std::string> ReadMetaFile(const std::string& path) {
  auto text = loongforge::internal::ReadRegularFile(path, kMaxMetaFileBytes);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound)
    return NotFoundError(path + ": not found");
  return text;
}

StatusOr<json> ReadJsonFile(const std::string& path) {
  LF_ASSIGN_OR_RETURN(std::string text, ReadMetaFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(path + ": not valid JSON");
  return j;
}

StatusOr<const Column*> FindColumn(const std::vector<Column>& cols, const std::string& name,
                                   const std::string& file) {
  for (const auto& c : cols)
    if (c.name == name) return &c;
  return InvalidArgumentError(file + ": no column \"" + name + "\"");
}

Status CheckIntColumn(const Column& c, const std::string& file) {
  if (c.kind != Column::Kind::kInt64 || c.is_list)
    return InvalidArgumentError(file + ": column \"" + c.name + "\" is not an integer column");
  for (size_t i = 0; i < c.valid.size(); ++i)
    if (!c.valid[i])
      return InvalidArgumentError(file + ": column \"" + c.name + "\" row " + std::to_string(i) +
                                  " is null");
  return Status::Ok();
}

}  // namespace internal

using internal::CheckIntColumn;
using internal::FindColumn;
using internal::ReadJsonFile;

namespace {

// Picture size of a video feature: names say which axis is which; else HWC or CHW by the axis
// of size 3; else info's video.height / video.width.
Status VideoSize(const std::string& where, Feature* f, const json& vinfo) {
  int h = 0, w = 0;
  if (f->shape.size() == 3) {
    auto find = [&](const char* n) {
      for (size_t i = 0; i < f->names.size(); ++i)
        if (f->names[i] == n) return static_cast<int>(i);
      return -1;
    };
    int hi = find("height"), wi = find("width");
    if (hi >= 0 && wi >= 0) {
      h = static_cast<int>(f->shape[hi]);
      w = static_cast<int>(f->shape[wi]);
    } else if (f->shape[2] == 3 || f->shape[2] == 1) {
      h = static_cast<int>(f->shape[0]);
      w = static_cast<int>(f->shape[1]);
    } else if (f->shape[0] == 3 || f->shape[0] == 1) {
      h = static_cast<int>(f->shape[1]);
      w = static_cast<int>(f->shape[2]);
    }
  }
  if (vinfo.is_object()) {
    if (vinfo.contains("video.height") && vinfo["video.height"].is_number_integer())
      h = vinfo["video.height"].get<int>();
    if (vinfo.contains("video.width") && vinfo["video.width"].is_number_integer())
      w = vinfo["video.width"].get<int>();
    if (vinfo.contains("video.codec") && vinfo["video.codec"].is_string())
      f->codec = vinfo["video.codec"].get<std::string>();
  }
  if (h <= 0 || w <= 0)
    return InvalidArgumentError(where + ": features[\"" + f->key +
                                "\"]: cannot tell the picture size from its shape (height, "
                                "width, channels or channels, height, width) or info");
  f->height = h;
  f->width = w;
  return Status::Ok();
}

// Calls `fn` with each non-blank line of the JSON-lines file `path` and "path:line" for its errors.
// NotFound (with `missing_hint` appended) when the file is missing; InvalidArgument naming the
// line when one is not a JSON object; else the first error of `fn`.
Status ForEachJsonLine(const std::string& path, const std::string& missing_hint,
                       const std::function<Status(const json&, const std::string&)>& fn) {
  auto text = internal::ReadMetaFile(path);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound)
    return NotFoundError(path + ": not found" + missing_hint);
  if (!text.ok()) return text.status();
  std::istringstream in(*text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgumentError(where + ": not a JSON object");
    LF_RETURN_IF_ERROR(fn(j, where));
  }
  return Status::Ok();
}

// Records task `index` -> `text`; a task_index listed again with another text is refused naming
// both texts (rows would get whichever came last).
Status AddTask(std::map<int64_t, std::string>* tasks, int64_t index, const std::string& text,
               const std::string& where) {
  auto [it, added] = tasks->emplace(index, text);
  if (!added && it->second != text)
    return InvalidArgumentError(where + ": task_index " + std::to_string(index) + " is \"" + text +
                                "\", but it was already listed as \"" + it->second + "\"");
  return Status::Ok();
}

}  // namespace

StatusOr<Info> ParseInfo(const std::string& path) {
  LF_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  Info info;
  info.path = path;
  if (!j.is_object()) return InvalidArgumentError(path + ": not a JSON object");
  auto str = [&](const char* k, std::string* out) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string())
      return InvalidArgumentError(path + ": missing or non-string \"" + k + "\"");
    *out = it->get<std::string>();
    return Status::Ok();
  };
  LF_RETURN_IF_ERROR(str("codebase_version", &info.version));
  if (info.version == "v2.0" || info.version == "v2.1" || info.version == "v3.0") {
    info.major = info.version[1] - '0';
    info.minor = info.version[3] - '0';
  } else {
    return InvalidArgumentError(path + ": codebase_version \"" + info.version +
                                "\" is not supported (v2.0, v2.1, v3.0)");
  }
  if (!j.contains("fps") || !j["fps"].is_number() || j["fps"].get<double>() <= 0)
    return InvalidArgumentError(path + ": missing or non-positive \"fps\"");
  info.fps = j["fps"].get<double>();
  info.chunks_size = json_util::Int(j, "chunks_size", 1000);
  if (info.chunks_size <= 0) return InvalidArgumentError(path + ": \"chunks_size\" must be > 0");
  info.total_episodes = json_util::Int(j, "total_episodes", -1);
  LF_RETURN_IF_ERROR(str("data_path", &info.data_path));
  if (j.contains("video_path") && j["video_path"].is_string())
    info.video_path = j["video_path"].get<std::string>();
  auto fit = j.find("features");
  if (fit == j.end() || !fit->is_object())
    return InvalidArgumentError(path + ": missing \"features\" object");
  for (const auto& [key, fj] : fit->items()) {
    if (!fj.is_object())
      return InvalidArgumentError(path + ": features[\"" + key + "\"] is not an object");
    Feature f;
    f.key = key;
    f.dtype = json_util::String(fj, "dtype");
    if (fj.contains("shape") && fj["shape"].is_array())
      for (const auto& v : fj["shape"])
        if (v.is_number_integer()) f.shape.push_back(v.get<int64_t>());
    if (fj.contains("names") && fj["names"].is_array())
      for (const auto& v : fj["names"])
        if (v.is_string()) f.names.push_back(v.get<std::string>());
    if (f.is_video()) {
      // LeRobot writes "info"; some GR00T datasets "video_info".
      const json vinfo = fj.contains("info")         ? fj["info"]
                         : fj.contains("video_info") ? fj["video_info"]
                                                     : json();
      LF_RETURN_IF_ERROR(VideoSize(path, &f, vinfo));
    }
    info.features[key] = std::move(f);
  }
  bool any_video = false;
  for (const auto& [k, f] : info.features) any_video |= f.is_video();
  if (any_video && info.video_path.empty())
    return InvalidArgumentError(path + ": video features but no \"video_path\"");
  return info;
}

StatusOr<std::vector<EpisodeMeta>> ReadEpisodes(const std::string& root, const Info& info,
                                                const std::vector<std::string>& video_keys) {
  std::vector<EpisodeMeta> eps;
  if (info.major == 2) {
    LF_RETURN_IF_ERROR(ForEachJsonLine(
        root + "/meta/episodes.jsonl", " (a v2 dataset lists its episodes there)",
        [&](const json& j, const std::string& where) -> Status {
          EpisodeMeta e;
          e.episode_index = json_util::Int(j, "episode_index", -1);
          e.length = json_util::Int(j, "length", -1);
          if (e.episode_index < 0 || e.length < 1)
            return InvalidArgumentError(
                where + ": needs integer \"episode_index\" >= 0 and \"length\" >= 1");
          if (j.contains("tasks") && j["tasks"].is_array())
            for (const auto& t : j["tasks"])
              if (t.is_string()) e.tasks.push_back(t.get<std::string>());
          eps.push_back(std::move(e));
          return Status::Ok();
        }));
  } else {
    const fs::path dir = fs::path(root) / "meta" / "episodes";
    std::vector<std::string> files;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".parquet") files.push_back(it->path().string());
    if (files.empty())
      return NotFoundError(dir.string() +
                           ": no episode parquet files (a v3 dataset lists its episodes there)");
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      // A listed file may be a symlink out of the dataset.
      LF_RETURN_IF_ERROR(PathInRoot(root, fs::path(file).lexically_relative(root).string(),
                                    dir.string() + ": episode file")
                             .status());
      std::vector<std::string> names = {"episode_index",      "length",
                                        "dataset_from_index", "dataset_to_index",
                                        "data/chunk_index",   "data/file_index"};
      for (const auto& k : video_keys)
        for (const char* s : {"chunk_index", "file_index", "from_timestamp"})
          names.push_back("videos/" + k + "/" + s);
      LF_ASSIGN_OR_RETURN(std::vector<Column> cols, parquet::ReadParquet(file, names));
      std::vector<const Column*> c(names.size());
      for (size_t i = 0; i < names.size(); ++i) {
        LF_ASSIGN_OR_RETURN(c[i], FindColumn(cols, names[i], file));
        if (names[i].find("from_timestamp") == std::string::npos) {
          LF_RETURN_IF_ERROR(CheckIntColumn(*c[i], file));
        } else if (c[i]->kind != Column::Kind::kDouble || c[i]->is_list) {
          return InvalidArgumentError(file + ": column \"" + names[i] + "\" is not a float column");
        }
      }
      // Tasks are informational (rows carry task_index); read them when the reader can.
      std::vector<Column> task_cols;
      auto tc = parquet::ReadParquet(file, {"tasks"});
      if (tc.ok()) task_cols = std::move(*tc);
      const size_t rows = c[0]->i64.size();
      for (size_t r = 0; r < rows; ++r) {
        EpisodeMeta e;
        e.episode_index = c[0]->i64[r];
        e.length = c[1]->i64[r];
        e.from_index = c[2]->i64[r];
        e.to_index = c[3]->i64[r];
        e.data_chunk = c[4]->i64[r];
        e.data_file = c[5]->i64[r];
        const std::string row = file + ": row " + std::to_string(r) + " (episode " +
                                std::to_string(e.episode_index) + ")";
        if (e.episode_index < 0 || e.from_index < 0 || e.to_index < 0 || e.data_chunk < 0 ||
            e.data_file < 0)
          return InvalidArgumentError(
              row + ": episode_index " + std::to_string(e.episode_index) + ", dataset_from_index " +
              std::to_string(e.from_index) + ", dataset_to_index " + std::to_string(e.to_index) +
              ", data/chunk_index " + std::to_string(e.data_chunk) + ", data/file_index " +
              std::to_string(e.data_file) + ": none may be negative");
        if (e.to_index - e.from_index != e.length || e.length < 1)
          return InvalidArgumentError(
              file + ": episode " + std::to_string(e.episode_index) + ": length " +
              std::to_string(e.length) + " disagrees with dataset_from_index..dataset_to_index " +
              std::to_string(e.from_index) + ".." + std::to_string(e.to_index));
        for (size_t k = 0; k < video_keys.size(); ++k) {
          VideoLocation v;
          v.chunk_index = c[6 + 3 * k]->i64[r];
          v.file_index = c[7 + 3 * k]->i64[r];
          v.from_timestamp = c[8 + 3 * k]->f64[r];
          const Column& fc = *c[8 + 3 * k];
          if ((!fc.valid.empty() && !fc.valid[r]) || !std::isfinite(v.from_timestamp) ||
              v.from_timestamp < 0 || v.chunk_index < 0 || v.file_index < 0)
            return InvalidArgumentError(
                row + ": videos/" + video_keys[k] + ": chunk_index " +
                std::to_string(v.chunk_index) + ", file_index " + std::to_string(v.file_index) +
                ", from_timestamp " +
                ((!fc.valid.empty() && !fc.valid[r]) ? std::string("null")
                                                     : std::to_string(v.from_timestamp)) +
                ": the indexes must be >= 0 and from_timestamp a finite time >= 0");
          e.videos[video_keys[k]] = v;
        }
        if (!task_cols.empty() && task_cols[0].is_list &&
            task_cols[0].kind == Column::Kind::kString)
          for (int64_t i = task_cols[0].offsets[r]; i < task_cols[0].offsets[r + 1]; ++i)
            e.tasks.push_back(task_cols[0].str[i]);
        eps.push_back(std::move(e));
      }
    }
  }
  std::sort(eps.begin(), eps.end(), [](const EpisodeMeta& a, const EpisodeMeta& b) {
    return a.episode_index < b.episode_index;
  });
  for (size_t i = 1; i < eps.size(); ++i)
    if (eps[i].episode_index == eps[i - 1].episode_index)
      return InvalidArgumentError(root + "/meta: episode " + std::to_string(eps[i].episode_index) +
                                  " is listed twice");
  if (eps.empty()) return InvalidArgumentError(root + "/meta: no episodes listed");
  return eps;
}

StatusOr<std::map<int64_t, std::string>> ReadTasks(const std::string& root, const Info& info) {
  std::map<int64_t, std::string> tasks;
  if (info.major == 2) {
    LF_RETURN_IF_ERROR(ForEachJsonLine(
        root + "/meta/tasks.jsonl", "", [&](const json& j, const std::string& where) -> Status {
          const int64_t index = json_util::Int(j, "task_index", -1);
          if (!j.contains("task") || !j["task"].is_string() || index < 0)
            return InvalidArgumentError(where + ": needs \"task_index\" and \"task\"");
          return AddTask(&tasks, index, j["task"].get<std::string>(), where);
        }));
    return tasks;
  }
  const std::string path = root + "/meta/tasks.parquet";
  LF_ASSIGN_OR_RETURN(std::vector<std::string> names, parquet::ParquetColumnNames(path));
  std::string text_col;
  for (const char* cand : {"task", "__index_level_0__"})
    if (std::find(names.begin(), names.end(), cand) != names.end()) {
      text_col = cand;
      break;
    }
  if (text_col.empty())
    return InvalidArgumentError(path + ": no task text column (\"task\" or \"__index_level_0__\")");
  LF_ASSIGN_OR_RETURN(std::vector<Column> cols,
                      parquet::ReadParquet(path, {"task_index", text_col}));
  LF_ASSIGN_OR_RETURN(const Column* ti, FindColumn(cols, "task_index", path));
  LF_ASSIGN_OR_RETURN(const Column* tx, FindColumn(cols, text_col, path));
  LF_RETURN_IF_ERROR(CheckIntColumn(*ti, path));
  if (tx->kind != Column::Kind::kString || tx->is_list)
    return InvalidArgumentError(path + ": column \"" + text_col + "\" is not a string column");
  for (size_t i = 0; i < ti->i64.size(); ++i) {
    const std::string where = path + ": row " + std::to_string(i);
    if (ti->i64[i] < 0)
      return InvalidArgumentError(where + ": task_index " + std::to_string(ti->i64[i]) +
                                  " is negative");
    if (!tx->valid.empty() && !tx->valid[i])
      return InvalidArgumentError(where + ": column \"" + text_col + "\" is null");
    LF_RETURN_IF_ERROR(AddTask(&tasks, ti->i64[i], tx->str[i], where));
  }
  return tasks;
}

StatusOr<std::vector<int64_t>> ParseEpisodeList(const std::string& spec) {
  std::set<int64_t> out;
  static const std::regex item(R"(\s*(\d{1,12})\s*(?:-\s*(\d{1,12})\s*)?)");
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string part =
        spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    std::smatch m;
    if (!std::regex_match(part, m, item))
      return InvalidArgumentError("episodes: \"" + part + "\" in \"" + spec +
                                  "\" is not an episode index or a range a-b");
    int64_t a = std::stoll(m[1].str()), b = m[2].matched ? std::stoll(m[2].str()) : a;
    if (b < a) return InvalidArgumentError("episodes: empty range \"" + part + "\"");
    if (b - a > 10'000'000)
      return InvalidArgumentError("episodes: range \"" + part + "\" too large");
    for (int64_t e = a; e <= b; ++e) out.insert(e);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return std::vector<int64_t>(out.begin(), out.end());
}

StatusOr<std::string> FormatTemplate(const std::string& tmpl,
                                     const std::map<std::string, int64_t>& ints,
                                     const std::map<std::string, std::string>& strings) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '{') {
      out += tmpl[i];
      continue;
    }
    size_t close = tmpl.find('}', i);
    if (close == std::string::npos)
      return InvalidArgumentError("path template \"" + tmpl + "\": unclosed '{'");
    std::string field = tmpl.substr(i + 1, close - i - 1), spec;
    size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (auto it = strings.find(field); it != strings.end() && spec.empty()) {
      out += it->second;
    } else if (auto jt = ints.find(field); jt != ints.end()) {
      int width = 0;
      if (!spec.empty()) {
        std::smatch m;
        static const std::regex re(R"(0?(\d{1,2})d)");
        if (!std::regex_match(spec, m, re))
          return InvalidArgumentError("path template \"" + tmpl + "\": format \"" + spec +
                                      "\" is not supported (only {name} and {name:0Nd})");
        width = std::stoi(m[1].str());
      }
      std::string digits = std::to_string(jt->second);
      if (static_cast<int>(digits.size()) < width) out += std::string(width - digits.size(), '0');
      out += digits;
    } else {
      return InvalidArgumentError("path template \"" + tmpl + "\": unknown field {" + field + "}");
    }
    i = close;
  }
  return out;
}

StatusOr<std::string> PathInRoot(const std::string& root, const std::string& rel,
                                 const std::string& what) {
  const std::string path = root + "/" + rel;
  auto refuse = [&](const std::string& why) {
    return InvalidArgumentError(what + " gives \"" + rel + "\", " + why + " " + root +
                                " (paths the metadata forms must stay inside the dataset)");
  };
  if (rel.empty() || rel[0] == '/') return refuse("which is not a path relative to");
  std::error_code ec;
  const fs::path real_root = fs::canonical(root, ec);
  if (ec) return ErrnoToStatus(ec.value(), "resolve dataset root " + root);
  // weakly_canonical resolves every symlink of the part that exists and ".." in the rest.
  const fs::path real = fs::weakly_canonical(path, ec);
  if (ec) return ErrnoToStatus(ec.value(), "resolve " + path);
  const std::string r = real_root.string(), p = real.string();
  if (p.size() <= r.size() || p.compare(0, r.size(), r) != 0 || (r != "/" && p[r.size()] != '/'))
    return refuse("which resolves to " + p + ", outside");
  return path;
}

StatusOr<Modality> ParseModality(const std::string& path, int state_dim, int action_dim) {
  LF_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  Modality m;
  m.path = path;
  m.task_column = "task_index";
  if (!j.is_object()) return InvalidArgumentError(path + ": not a JSON object");
  auto slices = [&](const char* group, int dim, std::vector<Slice>* out) -> Status {
    if (!j.contains(group)) return Status::Ok();
    if (!j[group].is_object())
      return InvalidArgumentError(path + ": \"" + group + "\" is not an object");
    for (const auto& [name, s] : j[group].items()) {
      const std::string where = path + ": " + group + "." + name;
      if (!s.is_object() || !s.contains("start") || !s.contains("end") ||
          !s["start"].is_number_integer() || !s["end"].is_number_integer())
        return InvalidArgumentError(where + ": needs integer \"start\" and \"end\"");
      Slice sl{name, s["start"].get<int>(), s["end"].get<int>()};
      if (sl.start < 0 || sl.end <= sl.start || sl.end > dim)
        return InvalidArgumentError(where + ": slice [" + std::to_string(sl.start) + ", " +
                                    std::to_string(sl.end) + ") is out of range for " + group +
                                    " of " + std::to_string(dim) + " dims");
      out->push_back(sl);
    }
    std::sort(out->begin(), out->end(),
              [](const Slice& a, const Slice& b) { return a.start < b.start; });
    // Two names for the same dimensions would each get the values of both.
    for (size_t k = 1; k < out->size(); ++k) {
      const Slice &a = (*out)[k - 1], &b = (*out)[k];
      if (b.start < a.end)
        return InvalidArgumentError(
            path + ": " + group + "." + a.name + " [" + std::to_string(a.start) + ", " +
            std::to_string(a.end) + ") and " + group + "." + b.name + " [" +
            std::to_string(b.start) + ", " + std::to_string(b.end) + ") overlap");
    }
    return Status::Ok();
  };
  LF_RETURN_IF_ERROR(slices("state", state_dim, &m.state));
  LF_RETURN_IF_ERROR(slices("action", action_dim, &m.action));
  if (j.contains("video") && j["video"].is_object())
    for (const auto& [name, v] : j["video"].items()) {
      std::string key = v.is_object() && v.contains("original_key") && v["original_key"].is_string()
                            ? v["original_key"].get<std::string>()
                            : "observation.images." + name;
      m.video.emplace_back(name, key);
    }
  if (j.contains("annotation") && j["annotation"].is_object())
    for (const auto& [name, a] : j["annotation"].items())
      if (name.find("task_description") != std::string::npos) {
        m.task_column = a.is_object() && a.contains("original_key") && a["original_key"].is_string()
                            ? a["original_key"].get<std::string>()
                            : "annotation." + name;
        break;
      }
  m.json = j.dump();
  return m;
}

std::vector<float> Quantile(const std::vector<float>& rows, size_t dims, double q) {
  const size_t n = dims ? rows.size() / dims : 0;
  std::vector<float> out(dims, 0.f);
  if (n == 0) return out;
  std::vector<float> col(n);
  for (size_t d = 0; d < dims; ++d) {
    for (size_t i = 0; i < n; ++i) col[i] = rows[i * dims + d];
    std::sort(col.begin(), col.end());
    const double pos = q * static_cast<double>(n - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, n - 1);
    const double frac = pos - static_cast<double>(lo);
    out[d] = static_cast<float>(col[lo] + (static_cast<double>(col[hi]) - col[lo]) * frac);
  }
  return out;
}

}  // namespace loongforge::data::lerobot
