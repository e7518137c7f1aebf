#include "loongforge/env_knobs.h"

#include <strings.h>

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loongforge {
namespace {

constexpr int64_t kNoMin = INT64_MIN;
constexpr int64_t kNoMax = INT64_MAX;
// A size in MiB that still fits a byte count of 64 bits once shifted left by 20.
constexpr int64_t kMaxMiB = INT64_MAX >> 20;

// The table. A plain array of literals: constant-initialized, so a reader in another static
// initializer (the log level) finds it filled whatever the order of initialization.
// clang-format off
const EnvKnob kKnobs[] = {
    // ---- the C++ core ----
    {"LOONGFORGE_LOG_LEVEL", KnobType::kString, "INFO",
     "level of the C++ core's log lines on stderr", "core", 0, 0, "DEBUG|INFO|WARNING|WARN|ERROR"},
    {"LOONGFORGE_CUDA_SYNC", KnobType::kBool, "0",
     "synchronize after every kernel launch, so an asynchronous CUDA error names its launch (slow)",
     "core", 0, 0, ""},
    {"LOONGFORGE_CRASH_BACKTRACE", KnobType::kBool, "0",
     "on a fatal signal in loongforge._C, print the native stack (object+offset, for addr2line)",
     "core", 0, 0, ""},
    {"LOONGFORGE_MEM_LIMIT_MB", KnobType::kInt, "0",
     "MemSculptor: most device memory it reserves, MiB (0: no cap; train --memory-cap-gib overrides it)",
     "core", 0, kMaxMiB, ""},
    {"LOONGFORGE_MEM_SEGMENT_MB", KnobType::kInt, "32",
     "MemSculptor: size of the segments its pools reserve from the device, MiB",
     "core", 1, kMaxMiB, ""},
    {"LOONGFORGE_MEM_MAX_PLANS", KnobType::kInt, "64",
     "MemSculptor: step plans kept (least recently used evicted beyond; 0: no bound)",
     "core", 0, kNoMax, ""},
    {"LOONGFORGE_MEM_PLAN_UNSEEN", KnobType::kBool, "1",
     "MemSculptor: a step of a signature without a plan is recorded and planned at its end",
     "core", 0, 0, ""},
    // ---- the Python package ----
    {"LOONGFORGE_FP8_FUSED", KnobType::kBool, "1",
     "--fp8-frozen quantizes activations with the one-kernel C++ quantize (0: with torch ops)",
     "python", 0, 0, ""},
    {"LOONGFORGE_GROUPED_MM", KnobType::kString, "auto",
     "MoE expert GEMM: auto (torch's grouped GEMM where it serves) or fallback (padded bmm)",
     "python", 0, 0, "auto|fallback"},
    {"LOONGFORGE_TRAIN_LOADER_BUCKETS", KnobType::kBool, "1",
     "trainer: DataFusion pads batches to the token buckets (0: the step runner pads; diagnosis)",
     "python", 0, 0, ""},
    {"LOONGFORGE_SIGNAL_GRACE_S", KnobType::kFloat, "60",
     "trainer: seconds after SIGTERM/SIGINT to reach a step boundary before exiting without a save",
     "python", 0, 0, ""},
    {"LOONGFORGE_MEM_TRACE", KnobType::kString, "",
     "trainer: file that keeps MemSculptor's recorded steps (for loongforge mem replay; empty: none)",
     "python", 0, 0, ""},
    {"LOONGFORGE_MEM_RECORD_STEPS", KnobType::kInt, "0",
     "trainer: steps MemSculptor records before planning (0: min(3, --warmup))",
     "python", 0, kNoMax, ""},
    {"LOONGFORGE_DEBUG", KnobType::kBool, "0",
     "trainer: an error prints its Python traceback as well as its one line",
     "python", 0, 0, ""},
    // ---- the bin/loongforge launcher (a shell script: it reads them itself) ----
    {"LOONGFORGE_BUILD", KnobType::kString, "",
     "bin/loongforge: the build folder holding the loongforge binary (empty: <repo>/build)",
     "bin/loongforge", 0, 0, ""},
    {"LOONGFORGE_PYTHON", KnobType::kString, "/usr/bin/python3",
     "bin/loongforge: the Python interpreter that runs the Python commands",
     "bin/loongforge", 0, 0, ""},
};
// clang-format on

[[noreturn]] void Misuse(const char* name, const char* what) {
  std::fprintf(stderr,
               "loongforge: environment knob %s %s (declare it in src/common/env_knobs.cc)\n", name,
               what);
  std::abort();
}

const EnvKnob& Declared(const char* name, KnobType type) {
  const EnvKnob* k = FindEnvKnob(name);
  if (k == nullptr) Misuse(name, "is not declared");
  if (k->type != type) {
    std::fprintf(stderr, "loongforge: environment knob %s is declared %s, read as %s\n", name,
                 KnobTypeName(k->type), KnobTypeName(type));
    std::abort();
  }
  return *k;
}

// The text to parse: the variable's, or the default's when unset or empty.
const char* TextOf(const EnvKnob& k) {
  const char* v = EnvRaw(k.name);
  return v != nullptr ? v : k.default_value;
}

Status Bad(const EnvKnob& k, const char* value, const std::string& why) {
  return InvalidArgumentError(std::string(k.name) + "='" + value + "': " + why);
}

StatusOr<int64_t> IntOf(const EnvKnob& k, const char* s) {
  const char* p = s;
  if (*p == '+' || *p == '-') ++p;
  if (*p == '\0') return Bad(k, s, "not an integer");
  for (const char* q = p; *q; ++q) {
    if (*q < '0' || *q > '9') return Bad(k, s, "not an integer");
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  if (errno == ERANGE || end == s || *end != '\0') return Bad(k, s, "not a 64-bit integer");
  if (v < k.min_value || v > k.max_value) {
    std::string range = k.max_value == kNoMax   ? ">= " + std::to_string(k.min_value)
                        : k.min_value == kNoMin ? "<= " + std::to_string(k.max_value)
                                                : "in [" + std::to_string(k.min_value) + ", " +
                                                      std::to_string(k.max_value) + "]";
    return Bad(k, s, "must be " + range);
  }
  return static_cast<int64_t>(v);
}

StatusOr<double> FloatOf(const EnvKnob& k, const char* s) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE || !std::isfinite(v) ||
      std::isspace(static_cast<unsigned char>(*s))) {
    return Bad(k, s, "not a finite number");
  }
  return v;
}

StatusOr<bool> BoolOf(const EnvKnob& k, const char* s) {
  for (const char* t : {"1", "true", "yes", "on"}) {
    if (!strcasecmp(s, t)) return true;
  }
  for (const char* f : {"0", "false", "no", "off"}) {
    if (!strcasecmp(s, f)) return false;
  }
  return Bad(k, s, "not a boolean (1/0, true/false, yes/no, on/off)");
}

StatusOr<std::string> StringOf(const EnvKnob& k, const char* s) {
  if (k.choices[0] == '\0') return std::string(s);
  std::string_view all(k.choices);
  while (!all.empty()) {
    size_t bar = all.find('|');
    std::string_view c = all.substr(0, bar);
    if (c.size() == std::strlen(s) && !strncasecmp(c.data(), s, c.size())) return std::string(c);
    all = bar == std::string_view::npos ? std::string_view() : all.substr(bar + 1);
  }
  return Bad(k, s, std::string("not one of ") + k.choices);
}

template <typename T, typename F>
StatusOr<T> Parse(const char* name, KnobType type, F of) {
  const EnvKnob& k = Declared(name, type);
  return of(k, TextOf(k));
}

// The value, or a warning and the default.
template <typename T, typename F>
T OrDefault(const char* name, KnobType type, F of) {
  const EnvKnob& k = Declared(name, type);
  StatusOr<T> v = of(k, TextOf(k));
  if (v.ok()) return *v;
  std::fprintf(stderr, "loongforge: warning: %s; using the default %s='%s'\n",
               v.status().message().c_str(), k.name, k.default_value);
  StatusOr<T> d = of(k, k.default_value);
  if (!d.ok()) Misuse(name, "has a default that does not parse");
  return *d;
}

}  // namespace

const char* KnobTypeName(KnobType type) {
  switch (type) {
    case KnobType::kInt:
      return "int";
    case KnobType::kFloat:
      return "float";
    case KnobType::kBool:
      return "bool";
    case KnobType::kString:
      return "string";
  }
  return "?";
}

const EnvKnob* EnvKnobTable(size_t* count) {
  *count = sizeof(kKnobs) / sizeof(kKnobs[0]);
  return kKnobs;
}

const EnvKnob* FindEnvKnob(std::string_view name) {
  for (const EnvKnob& k : kKnobs) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

const char* EnvRaw(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

StatusOr<int64_t> ParseEnvInt(const char* name) {
  return Parse<int64_t>(name, KnobType::kInt, IntOf);
}
StatusOr<double> ParseEnvFloat(const char* name) {
  return Parse<double>(name, KnobType::kFloat, FloatOf);
}
StatusOr<bool> ParseEnvBool(const char* name) { return Parse<bool>(name, KnobType::kBool, BoolOf); }
StatusOr<std::string> ParseEnvString(const char* name) {
  return Parse<std::string>(name, KnobType::kString, StringOf);
}

int64_t EnvInt(const char* name) { return OrDefault<int64_t>(name, KnobType::kInt, IntOf); }
double EnvFloat(const char* name) { return OrDefault<double>(name, KnobType::kFloat, FloatOf); }
bool EnvBool(const char* name) { return OrDefault<bool>(name, KnobType::kBool, BoolOf); }
std::string EnvString(const char* name) {
  return OrDefault<std::string>(name, KnobType::kString, StringOf);
}

Status CheckEnvKnob(const char* name) {
  const EnvKnob* k = FindEnvKnob(name);
  if (k == nullptr) Misuse(name, "is not declared");
  switch (k->type) {
    case KnobType::kInt:
      return ParseEnvInt(name).status();
    case KnobType::kFloat:
      return ParseEnvFloat(name).status();
    case KnobType::kBool:
      return ParseEnvBool(name).status();
    case KnobType::kString:
      return ParseEnvString(name).status();
  }
  return Status::Ok();
}

}  // namespace loongforge
