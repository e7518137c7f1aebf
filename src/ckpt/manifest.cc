// Manifest serialization and the chunk hash.
#include "ckpt/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace loongforge {
namespace ckpt {

std::string Hash128::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

StatusOr<Hash128> Hash128::FromHex(const std::string& hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    return InvalidArgumentError("bad hash '" + hex + "'");
  Hash128 h;
  h.hi = std::stoull(hex.substr(0, 16), nullptr, 16);
  h.lo = std::stoull(hex.substr(16), nullptr, 16);
  return h;
}

Hash128 HashBytes(const void* data, size_t len) {
  XXH128_hash_t h = XXH3_128bits(data, len);
  Hash128 r;
  r.lo = h.low64;
  r.hi = h.high64;
  return r;
}

namespace internal {
using nlohmann::json;

std::vector<std::string> Manifest::Segments() const {
  std::set<std::string> s;
  for (const auto& t : tensors)
    for (const auto& c : t.chunks) {
      s.insert(c.loc.seg);
      if (c.codec == Codec::kXorZstd) s.insert(c.base.seg);
    }
  return {s.begin(), s.end()};
}

std::string SerializeManifest(const Manifest& m) {
  // Segment names go into a table; chunks refer to them by index (keeps manifests small).
  std::vector<std::string> segs = m.Segments();
  std::map<std::string, int> seg_index;
  for (size_t i = 0; i < segs.size(); ++i) seg_index[segs[i]] = static_cast<int>(i);
  json j;
  j["format"] = 1;
  j["step"] = m.step;
  j["parent"] = m.parent;
  j["chunk_bytes"] = m.chunk_bytes;
  j["created_unix"] = m.created_unix;
  j["segments"] = segs;
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json jt;
    jt["name"] = t.name;
    jt["dtype"] = DTypeName(t.dtype);
    jt["shape"] = t.shape;
    jt["nbytes"] = t.nbytes;
    json chunks = json::array();
    for (const auto& c : t.chunks) {
      // [hash, raw, codec, seg, off, len (, base_codec, base_hash, base_seg, base_off, base_len)]
      json jc = json::array({c.hash.ToHex(), c.raw, static_cast<int>(c.codec),
                             seg_index.at(c.loc.seg), c.loc.off, c.loc.len});
      if (c.codec == Codec::kXorZstd) {
        for (json v : {json(static_cast<int>(c.base_codec)), json(c.base_hash.ToHex()),
                       json(seg_index.at(c.base.seg)), json(c.base.off), json(c.base.len)})
          jc.push_back(v);
      }
      chunks.push_back(std::move(jc));
    }
    jt["chunks"] = std::move(chunks);
    tensors.push_back(std::move(jt));
  }
  j["tensors"] = std::move(tensors);
  std::string body = j.dump();
  std::string header = "LFCKPT1 " + HashBytes(body.data(), body.size()).ToHex() + " " +
                       std::to_string(body.size()) + "\n";
  return header + body;
}

StatusOr<Manifest> ParseManifest(const std::string& bytes, const std::string& path) {
  auto loss = [&](const std::string& why) {
    return DataLossError("manifest " + path + ": " + why);
  };
  const size_t nl = bytes.find('\n');
  if (bytes.compare(0, 8, "LFCKPT1 ") != 0 || nl == std::string::npos || nl < 8 + 32 + 2)
    return loss("bad header (not a CheckpointVault manifest, or truncated)");
  const std::string hash_hex = bytes.substr(8, 32);
  int64_t body_len = -1;
  try {
    body_len = std::stoll(bytes.substr(8 + 33, nl - (8 + 33)));
  } catch (...) {
    return loss("bad header length field");
  }
  const int64_t have = static_cast<int64_t>(bytes.size() - nl - 1);
  if (have != body_len)
    return loss("truncated or padded: header says " + std::to_string(body_len) +
                " body bytes, file has " + std::to_string(have));
  const char* body = bytes.data() + nl + 1;
  if (HashBytes(body, static_cast<size_t>(body_len)).ToHex() != hash_hex)
    return loss("checksum mismatch (file was modified or corrupted)");
  Manifest m;
  try {
    json j = json::parse(body, body + body_len);
    if (j.at("format").get<int>() != 1) return loss("unsupported format version");
    m.step = j.at("step").get<int64_t>();
    m.parent = j.at("parent").get<int64_t>();
    m.chunk_bytes = j.at("chunk_bytes").get<int64_t>();
    m.created_unix = j.at("created_unix").get<double>();
    auto segs = j.at("segments").get<std::vector<std::string>>();
    auto seg_at = [&](const json& v) -> const std::string& { return segs.at(v.get<size_t>()); };
    for (const auto& jt : j.at("tensors")) {
      TensorRec t;
      t.name = jt.at("name").get<std::string>();
      auto dt = ParseDType(jt.at("dtype").get<std::string>());
      if (!dt.ok()) return loss("tensor '" + t.name + "': " + dt.status().message());
      t.dtype = *dt;
      t.shape = jt.at("shape").get<std::vector<int64_t>>();
      t.nbytes = jt.at("nbytes").get<int64_t>();
      int64_t sum = 0;
      for (const auto& jc : jt.at("chunks")) {
        ChunkRec c;
        auto h = Hash128::FromHex(jc.at(0).get<std::string>());
        if (!h.ok()) return loss("tensor '" + t.name + "': " + h.status().message());
        c.hash = *h;
        c.raw = jc.at(1).get<int64_t>();
        c.codec = static_cast<Codec>(jc.at(2).get<int>());
        c.loc = {seg_at(jc.at(3)), jc.at(4).get<int64_t>(), jc.at(5).get<int64_t>()};
        if (c.codec == Codec::kXorZstd) {
          c.base_codec = static_cast<Codec>(jc.at(6).get<int>());
          auto bh = Hash128::FromHex(jc.at(7).get<std::string>());
          if (!bh.ok()) return loss("tensor '" + t.name + "': " + bh.status().message());
          c.base_hash = *bh;
          c.base = {seg_at(jc.at(8)), jc.at(9).get<int64_t>(), jc.at(10).get<int64_t>()};
        }
        sum += c.raw;
        t.chunks.push_back(std::move(c));
      }
      if (sum != t.nbytes) return loss("tensor '" + t.name + "': chunk sizes do not add up");
      m.tensors.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return loss(std::string("malformed JSON: ") + e.what());
  }
  return m;
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
