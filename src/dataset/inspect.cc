// `inspect`: schema, counts, per-modality sizes and one decoded sample of a packed DB.
#include <turbojpeg.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "common/json_util.h"
#include "loongforge/dataset.h"
#include "loongforge/pack.h"
#include "loongforge/tokenizer.h"

namespace loongforge::data {
namespace {

template <typename T>
StatusOr<std::vector<T>> ReadArray(const RecordReader::Txn& txn, const std::string& key,
                                   size_t expect_n) {
  LF_ASSIGN_OR_RETURN(std::string_view v, txn.Get(key));
  if (v.size() % sizeof(T) != 0 || (expect_n && v.size() != expect_n * sizeof(T)))
    return DataLossError("record '" + key + "' has " + std::to_string(v.size()) +
                         " bytes, expected " +
                         (expect_n ? std::to_string(expect_n * sizeof(T))
                                   : "a multiple of " + std::to_string(sizeof(T))));
  std::vector<T> out(v.size() / sizeof(T));
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}

StatusOr<nlohmann::json> Inspect(const std::string& path, int64_t sample_id) {
  LF_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(path));
  const Schema& s = reader->schema();
  if (sample_id < 0 || sample_id >= s.num_samples)
    return OutOfRangeError(path + ": sample " + std::to_string(sample_id) +
                           " is out of range (0.." + std::to_string(s.num_samples - 1) + ")");
  nlohmann::json j;
  j["path"] = path;
  j["schema"] = nlohmann::json::parse(s.ToJson());
  j["db_file_bytes"] = reader->size_bytes();

  // Per-modality counts and sizes: one pass over the keys; values are not touched beyond their
  // size (zero-copy views), so this stays cheap on large DBs.
  LF_ASSIGN_OR_RETURN(std::vector<std::string> keys, reader->Keys());
  LF_ASSIGN_OR_RETURN(RecordReader::Txn txn, reader->Begin());
  std::map<std::string, std::pair<int64_t, int64_t>> mods;  // modality -> (count, bytes)
  int64_t other = 0;
  for (const auto& k : keys) {
    bool sample_key =
        k.size() >= 10 && k[8] == '_' &&
        std::all_of(k.begin(), k.begin() + 8, [](unsigned char c) { return std::isdigit(c); });
    if (!sample_key) {
      ++other;
      continue;
    }
    LF_ASSIGN_OR_RETURN(std::string_view v, txn.Get(k));
    auto& m = mods[k.substr(9)];
    m.first += 1;
    m.second += static_cast<int64_t>(v.size());
  }
  nlohmann::json jm = nlohmann::json::object();
  for (const auto& [name, cb] : mods)
    jm[name] = {{"count", cb.first},
                {"total_bytes", cb.second},
                {"mean_bytes",
                 cb.first ? static_cast<double>(cb.second) / static_cast<double>(cb.first) : 0.0}};
  j["modalities"] = jm;
  j["counts"] = {{"keys", keys.size()},
                 {"samples", s.num_samples},
                 {"episodes", s.num_episodes},
                 {"other_keys", other}};

  // One sample, decoded.
  nlohmann::json js;
  js["id"] = sample_id;
  LF_ASSIGN_OR_RETURN(auto meta, ReadArray<int32_t>(txn, SampleKey(sample_id, "meta"), 2));
  // Episodes are named by the source's episode_index, the number read_episode takes (LeRobot's
  // own naming): a LeRobot pack's episode table maps the sample to it, since DBs packed before the
  // meta record held that index hold the episode's position in the pack there.
  int64_t episode = meta[0];
  if (s.source_format.rfind("lerobot", 0) == 0) {
    nlohmann::json sm = nlohmann::json::parse(s.source_meta, nullptr, false);
    episode = -1;
    if (!sm.is_discarded() && sm.contains("episodes") && sm["episodes"].is_array())
      for (const auto& e : sm["episodes"]) {
        const int64_t first = json_util::Int(e, "first_sample", -1);
        if (first >= 0 && sample_id >= first && sample_id < first + json_util::Int(e, "length", 0))
          episode = json_util::Int(e, "episode_index", -1);
      }
    if (episode < 0)
      return DataLossError(path + ": sample " + std::to_string(sample_id) +
                           " is in no episode of the schema's source_meta episode table");
  }
  js["episode"] = episode;
  js["step"] = meta[1];
  const std::string tokens_key = SampleKey(sample_id, "tokens");
  LF_ASSIGN_OR_RETURN(std::string_view token_record, txn.Get(tokens_key));
  LF_RETURN_IF_ERROR(CheckTokens(token_record, s, path, tokens_key));
  LF_ASSIGN_OR_RETURN(auto tokens, ReadArray<int32_t>(txn, tokens_key, 0));
  js["tokens"] = tokens;
  auto tok = MakeTokenizer(s.tokenizer);
  js["text"] =
      tok.ok() ? (*tok)->Decode(tokens) : "(tokenizer '" + s.tokenizer + "' not available)";
  // The stored text (packs that write "{id}_task"), which the loader's `task` is.
  if (auto task = txn.Get(SampleKey(sample_id, "task")); task.ok())
    js["task"] = task->empty() ? std::string() : std::string(task->data(), task->size());
  LF_ASSIGN_OR_RETURN(auto state,
                      ReadArray<float>(txn, SampleKey(sample_id, "state"), s.state_dim));
  js["state"] = state;
  LF_ASSIGN_OR_RETURN(auto action,
                      ReadArray<float>(txn, SampleKey(sample_id, "action"),
                                       static_cast<size_t>(s.action_horizon) * s.action_dim));
  js["action_row0"] = std::vector<float>(action.begin(), action.begin() + s.action_dim);
  LF_ASSIGN_OR_RETURN(auto amask,
                      ReadArray<uint8_t>(txn, SampleKey(sample_id, "amask"), s.action_horizon));
  js["amask"] = amask;
  tjhandle tj = tjInitDecompress();
  nlohmann::json jc = nlohmann::json::object();
  for (const auto& cam : s.cameras) {
    std::string key = SampleKey(sample_id, CameraModality(cam));
    LF_ASSIGN_OR_RETURN(std::string_view v, txn.Get(key));
    int w = 0, h = 0, sub = 0, cs = 0;
    bool ok =
        tj && tjDecompressHeader3(tj, reinterpret_cast<const unsigned char*>(v.data()),
                                  static_cast<unsigned long>(v.size()), &w, &h, &sub, &cs) == 0;
    jc[cam] = {
        {"bytes", v.size()}, {"width", ok ? w : 0}, {"height", ok ? h : 0}, {"valid_jpeg", ok}};
  }
  if (tj) tjDestroy(tj);
  js["cameras"] = jc;
  j["sample"] = js;
  return j;
}

std::string Floats(const nlohmann::json& a, size_t max_n = 16) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < a.size() && i < max_n; ++i) {
    std::snprintf(buf, sizeof(buf), "%s%.4g", i ? ", " : "", a[i].get<double>());
    out += buf;
  }
  if (a.size() > max_n) out += ", ... (" + std::to_string(a.size()) + ")";
  return out + "]";
}

std::string HumanBytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2f MB", b / 1e6);
  else if (b >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1f KB", b / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f B", b);
  return buf;
}

}  // namespace

StatusOr<std::string> InspectJson(const std::string& path, int64_t sample_id) {
  LF_ASSIGN_OR_RETURN(nlohmann::json j, Inspect(path, sample_id));
  return j.dump(2);
}

StatusOr<std::string> InspectText(const std::string& path, int64_t sample_id) {
  LF_ASSIGN_OR_RETURN(nlohmann::json j, Inspect(path, sample_id));
  const auto& s = j["schema"];
  std::string o;
  char buf[512];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof(buf), fmt, args...);
    o += buf;
  };
  line("dataset %s (format v%d)\n", path.c_str(), s["format_version"].get<int>());
  line("  samples %lld, episodes %lld, keys %lld, data.mdb %s\n", s["num_samples"].get<long long>(),
       s["num_episodes"].get<long long>(), j["counts"]["keys"].get<long long>(),
       HumanBytes(j["db_file_bytes"].get<double>()).c_str());
  std::string cams;
  for (const auto& c : s["cameras"]) cams += (cams.empty() ? "" : ", ") + c.get<std::string>();
  line("  cameras %s (%dx%d)\n", cams.c_str(), s["image_width"].get<int>(),
       s["image_height"].get<int>());
  line("  state_dim %d, action_dim %d, action_horizon %d\n", s["state_dim"].get<int>(),
       s["action_dim"].get<int>(), s["action_horizon"].get<int>());
  line("  tokenizer %s (vocab %d), max_tokens %d\n", s["tokenizer"].get<std::string>().c_str(),
       s["vocab_size"].get<int>(), s["max_tokens"].get<int>());
  line("  source %s\n", s["source"].get<std::string>().c_str());
  for (const char* k : {"state_mean", "state_std", "state_min", "state_max", "action_mean",
                        "action_std", "action_min", "action_max"})
    line("  %-12s %s\n", k, Floats(s[k], 8).c_str());
  if (s.contains("source_format")) {  // pack --from-lerobot
    line("  source format %s, %.4g fps", s["source_format"].get<std::string>().c_str(),
         s["fps"].get<double>());
    const auto& m = s["source_meta"];
    if (m.contains("camera_keys"))
      for (const auto& [cam, key] : m["camera_keys"].items())
        line(", %s <- %s", cam.c_str(), key.is_string() ? key.get<std::string>().c_str() : "?");
    o += "\n";
    if (m.contains("stats_from"))
      line("  statistics %s\n", json_util::String(m, "stats_from").c_str());
    for (const char* k : {"state_q01", "state_q99", "action_q01", "action_q99"})
      line("  %-12s %s\n", k, Floats(s[k], 8).c_str());
  }
  o += "modalities:\n";
  line("  %-16s %8s %12s %12s\n", "modality", "count", "total", "mean");
  for (const auto& [name, m] : j["modalities"].items())
    line("  %-16s %8lld %12s %12s\n", name.c_str(), m["count"].get<long long>(),
         HumanBytes(m["total_bytes"].get<double>()).c_str(),
         HumanBytes(m["mean_bytes"].get<double>()).c_str());
  const auto& x = j["sample"];
  line("sample %lld (episode %lld, step %d):\n", x["id"].get<long long>(),
       x["episode"].get<long long>(), x["step"].get<int>());
  std::string toks;
  for (size_t i = 0; i < x["tokens"].size() && i < 24; ++i)
    toks += (i ? " " : "") + std::to_string(x["tokens"][i].get<int>());
  if (x["tokens"].size() > 24) toks += " ...";
  line("  tokens (%zu) [%s]\n", x["tokens"].size(), toks.c_str());
  o += "  text   \"" + x["text"].get<std::string>() + "\"\n";
  if (x.contains("task")) o += "  task   \"" + x["task"].get<std::string>() + "\"\n";
  line("  state  %s\n", Floats(x["state"]).c_str());
  line("  action[0] %s\n", Floats(x["action_row0"]).c_str());
  std::string mask;
  for (const auto& m : x["amask"]) mask += m.get<int>() ? '1' : '0';
  line("  amask  %s\n", mask.c_str());
  for (const auto& [cam, c] : x["cameras"].items())
    line("  cam_%-10s %dx%d JPEG, %s%s\n", cam.c_str(), c["width"].get<int>(),
         c["height"].get<int>(), HumanBytes(c["bytes"].get<double>()).c_str(),
         c["valid_jpeg"].get<bool>() ? "" : " (INVALID JPEG)");
  return o;
}

}  // namespace loongforge::data
