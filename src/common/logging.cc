#include "loongforge/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

#include "loongforge/env_knobs.h"

namespace loongforge {
namespace {

// A level outside the knob's choices is warned about (by EnvString, on stderr: logging cannot log
// its own configuration) and gives INFO.
LogLevel LevelFromEnv() {
  const std::string v = EnvString("LOONGFORGE_LOG_LEVEL");
  if (v == "DEBUG") return LogLevel::kDebug;
  if (v == "WARNING" || v == "WARN") return LogLevel::kWarning;
  if (v == "ERROR") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& LevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LogLevel GetLogLevel() { return static_cast<LogLevel>(LevelStorage().load()); }
void SetLogLevel(LogLevel level) { LevelStorage().store(static_cast<int>(level)); }

bool RateLimiter::Allow(int64_t* suppressed) {
  int64_t now = NowMs();
  int64_t last = last_ms_.load();
  if (last >= 0 && now - last < interval_ms_) {
    dropped_.fetch_add(1);
    return false;
  }
  if (!last_ms_.compare_exchange_strong(last, now)) {
    dropped_.fetch_add(1);
    return false;
  }
  if (suppressed) *suppressed = dropped_.exchange(0);
  return true;
}

namespace internal {

LogMessage::LogMessage(const char* file, int line, LogLevel level)
    : file_(file), line_(line), level_(level) {}

LogMessage::~LogMessage() {
  static const char kLetters[] = "DIWEF";
  const char* base = std::strrchr(file_, '/');
  base = base ? base + 1 : file_;
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
  std::string line = std::string("[lf ") + kLetters[static_cast<int>(level_)] + " " + ts + " " +
                     base + ":" + std::to_string(line_) + "] " + os_.str() + "\n";
  // One fwrite per line keeps lines whole across threads.
  std::fwrite(line.data(), 1, line.size(), stderr);
  if (level_ == LogLevel::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace internal
}  // namespace loongforge
