// Manifest serialization and the chunk hash.
#include "ckpt/manifest.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
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

namespace {
// A JSON number read as an integer must be one, in [lo, hi]: nlohmann's get<int64_t>() of 1e300
// or -1.5 is a float-to-integer conversion with undefined behaviour, not an error.
StatusOr<int64_t> IntField(const json& v, const std::string& field, int64_t lo, int64_t hi) {
  int64_t x;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    x = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi))
      return DataLossError(field + " is " + std::to_string(u) + ", above the limit " +
                           std::to_string(hi));
    x = static_cast<int64_t>(u);
  } else {
    return DataLossError(field + " must be an integer, got " + v.dump());
  }
  if (x < lo || x > hi)
    return DataLossError(field + " is " + std::to_string(x) + ", outside [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "]");
  return x;
}
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
}  // namespace

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
  // Each check names the field (and tensor) and both values; every size is checked before it is
  // used, so a manifest that lies cannot size a buffer or overflow a sum.
#define LF_MAN_INT(var, value, field, lo, hi)         \
  do {                                                \
    auto r_ = IntField((value), (field), (lo), (hi)); \
    if (!r_.ok()) return loss(r_.status().message()); \
    var = *r_;                                        \
  } while (0)
  try {
    json j = json::parse(body, body + body_len);
    if (!j.is_object()) return loss("body is not a JSON object");
    int64_t format;
    LF_MAN_INT(format, j.at("format"), "format", 0, kMax);
    if (format != 1) return loss("unsupported format version " + std::to_string(format));
    LF_MAN_INT(m.step, j.at("step"), "step", 0, kMax);
    LF_MAN_INT(m.parent, j.at("parent"), "parent", -1, kMax);
    LF_MAN_INT(m.chunk_bytes, j.at("chunk_bytes"), "chunk_bytes", kMinChunkBytes, kMaxChunkBytes);
    if (!j.at("created_unix").is_number()) return loss("created_unix must be a number");
    m.created_unix = j.at("created_unix").get<double>();
    auto segs = j.at("segments").get<std::vector<std::string>>();
    for (const auto& sg : segs)
      if (sg.empty() || sg.find('/') != std::string::npos || sg == "." || sg == "..")
        return loss("segment name '" + sg + "' is not a file name");
    const int64_t nseg = static_cast<int64_t>(segs.size());
    std::set<std::string> names;
    for (const auto& jt : j.at("tensors")) {
      TensorRec t;
      t.name = jt.at("name").get<std::string>();
      const std::string tn = "tensor '" + t.name + "'";
      if (!names.insert(t.name).second) return loss(tn + " appears more than once");
      auto dt = ParseDType(jt.at("dtype").get<std::string>());
      if (!dt.ok()) return loss(tn + ": " + dt.status().message());
      t.dtype = *dt;
      const json& js = jt.at("shape");
      if (!js.is_array()) return loss(tn + ": shape is not an array");
      if (js.size() > static_cast<size_t>(kMaxDims))
        return loss(tn + ": shape has " + std::to_string(js.size()) + " dimensions, at most " +
                    std::to_string(kMaxDims) + " are allowed");
      // nbytes must equal product(shape) x dtype size, computed without overflow.
      __int128 want = DTypeSize(t.dtype);
      for (size_t d = 0; d < js.size(); ++d) {
        int64_t dim;
        LF_MAN_INT(dim, js[d], tn + ": shape[" + std::to_string(d) + "]", 0, kMax);
        t.shape.push_back(dim);
        want *= dim;
        if (want > kMax) want = static_cast<__int128>(kMax) + 1;  // saturate: too big anyway
      }
      LF_MAN_INT(t.nbytes, jt.at("nbytes"), tn + ": nbytes", 0, kMax);
      if (want != t.nbytes)
        return loss(tn + ": nbytes is " + std::to_string(t.nbytes) + " but shape " + js.dump() +
                    " of " + DTypeName(t.dtype) + " needs " +
                    (want > kMax ? std::string("more than 2^63-1")
                                 : std::to_string(static_cast<int64_t>(want))));
      const json& jcs = jt.at("chunks");
      if (!jcs.is_array()) return loss(tn + ": chunks is not an array");
      const int64_t want_chunks = t.nbytes == 0 ? 0 : (t.nbytes - 1) / m.chunk_bytes + 1;
      if (static_cast<int64_t>(jcs.size()) != want_chunks)
        return loss(tn + ": has " + std::to_string(jcs.size()) + " chunks, nbytes " +
                    std::to_string(t.nbytes) + " at chunk_bytes " + std::to_string(m.chunk_bytes) +
                    " needs " + std::to_string(want_chunks));
      int64_t sum = 0;
      for (size_t ci = 0; ci < jcs.size(); ++ci) {
        const json& jc = jcs[ci];
        const std::string cn = tn + " chunk " + std::to_string(ci);
        if (!jc.is_array() || jc.size() < 6) return loss(cn + ": not a chunk record");
        ChunkRec c;
        auto h = Hash128::FromHex(jc.at(0).get<std::string>());
        if (!h.ok()) return loss(cn + ": " + h.status().message());
        c.hash = *h;
        LF_MAN_INT(c.raw, jc.at(1), cn + ": raw size", 0, m.chunk_bytes);
        // Every chunk but the last is full; the last holds the rest.
        const int64_t want_raw =
            ci + 1 < jcs.size() ? m.chunk_bytes : t.nbytes - m.chunk_bytes * (want_chunks - 1);
        if (c.raw != want_raw)
          return loss(cn + ": raw size is " + std::to_string(c.raw) + ", expected " +
                      std::to_string(want_raw));
        int64_t codec, seg, base_codec;
        LF_MAN_INT(codec, jc.at(2), cn + ": codec", 0, 2);
        c.codec = static_cast<Codec>(codec);
        LF_MAN_INT(seg, jc.at(3), cn + ": segment index", 0, nseg - 1);
        c.loc.seg = segs[static_cast<size_t>(seg)];
        LF_MAN_INT(c.loc.off, jc.at(4), cn + ": offset", 0, kMax);
        LF_MAN_INT(c.loc.len, jc.at(5), cn + ": stored length", 0, kMax - c.loc.off);
        // A stored chunk is the raw bytes or a zstd frame of them: never larger than zstd's bound
        // (this bounds the read buffers sized by it).
        const int64_t max_stored =
            static_cast<int64_t>(ZSTD_compressBound(static_cast<size_t>(c.raw)));
        if (c.codec == Codec::kRaw ? c.loc.len != c.raw : c.loc.len > max_stored)
          return loss(cn + ": stored length is " + std::to_string(c.loc.len) + " for raw size " +
                      std::to_string(c.raw) + " (codec " + std::to_string(codec) + ")");
        if (c.codec == Codec::kXorZstd) {
          if (jc.size() < 11) return loss(cn + ": delta chunk record without its base");
          LF_MAN_INT(base_codec, jc.at(6), cn + ": base codec", 0, 1);
          c.base_codec = static_cast<Codec>(base_codec);
          auto bh = Hash128::FromHex(jc.at(7).get<std::string>());
          if (!bh.ok()) return loss(cn + ": " + bh.status().message());
          c.base_hash = *bh;
          LF_MAN_INT(seg, jc.at(8), cn + ": base segment index", 0, nseg - 1);
          c.base.seg = segs[static_cast<size_t>(seg)];
          LF_MAN_INT(c.base.off, jc.at(9), cn + ": base offset", 0, kMax);
          LF_MAN_INT(c.base.len, jc.at(10), cn + ": base stored length", 0, kMax - c.base.off);
          if (c.base_codec == Codec::kRaw ? c.base.len != c.raw : c.base.len > max_stored)
            return loss(cn + ": base stored length is " + std::to_string(c.base.len) +
                        " for raw size " + std::to_string(c.raw));
        }
        sum += c.raw;  // <= nbytes: each raw matched its exact share above
        t.chunks.push_back(std::move(c));
      }
      if (sum != t.nbytes)
        return loss(tn + ": chunk sizes add up to " + std::to_string(sum) + ", nbytes is " +
                    std::to_string(t.nbytes));
      m.tensors.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return loss(std::string("malformed JSON: ") + e.what());
  }
#undef LF_MAN_INT
  return m;
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
