// File names of a CheckpointVault (see names.h).
#include "ckpt/names.h"

#include <charconv>
#include <cstdio>
#include <mutex>
#include <random>

#include "loongforge/metrics.h"

namespace loongforge {
namespace ckpt {
namespace internal {
namespace {

bool AllDigits(const std::string& s, size_t b, size_t e) {
  if (b >= e) return false;
  for (size_t i = b; i < e; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

bool AllHex(const std::string& s, size_t b, size_t e) {
  if (b >= e) return false;
  for (size_t i = b; i < e; ++i)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint32_t RandomWord() {
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(NowSeconds() * 1e9));
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  return static_cast<uint32_t>(rng());
}

constexpr char kManifestPrefix[] = "ckpt-";
constexpr char kManifestSuffix[] = ".manifest";

}  // namespace

std::string ManifestName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ckpt-%012lld.manifest", static_cast<long long>(step));
  return buf;
}

bool ParseManifestName(const std::string& name, int64_t* step) {
  const size_t b = sizeof(kManifestPrefix) - 1;
  if (!StartsWith(name, kManifestPrefix) || !EndsWith(name, kManifestSuffix)) return false;
  const size_t e = name.size() - (sizeof(kManifestSuffix) - 1);
  if (!AllDigits(name, b, e)) return false;
  int64_t v = 0;
  auto r = std::from_chars(name.data() + b, name.data() + e, v);
  if (r.ec != std::errc() || r.ptr != name.data() + e) return false;  // overflow
  if (ManifestName(v) != name) return false;  // e.g. extra leading zeros: not a name we write
  *step = v;
  return true;
}

bool IsManifestTempName(const std::string& name) {
  int64_t step;
  if (EndsWith(name, ".tmp") && ParseManifestName(name.substr(0, name.size() - 4), &step))
    return true;
  if (name.empty() || name[0] != '.') return false;
  const size_t t = name.rfind(".tmp.");
  if (t == std::string::npos || t + 5 >= name.size()) return false;
  return ParseManifestName(name.substr(1, t - 1), &step);
}

std::string NewManifestTempName(int64_t step) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", RandomWord());
  return "." + ManifestName(step) + ".tmp." + buf;
}

std::string NewSegmentName(int64_t step, const char* kind) {
  char buf[80];
  std::snprintf(buf, sizeof(buf), "seg-%012lld-%s%08x.lfs", static_cast<long long>(step), kind,
                RandomWord());
  return buf;
}

bool IsSegmentName(const std::string& name) {
  // seg-<digits>-[m]<8 hex>.lfs
  if (!StartsWith(name, "seg-") || !EndsWith(name, ".lfs")) return false;
  const size_t dash = name.find('-', 4);
  if (dash == std::string::npos || !AllDigits(name, 4, dash)) return false;
  size_t h = dash + 1;
  if (h < name.size() && name[h] == 'm') ++h;
  const size_t e = name.size() - 4;
  return e == h + 8 && AllHex(name, h, e);
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
