// Logging and invariant checks.
//
//   LF_LOG(INFO) << "packed " << n << " samples";
//   LF_CHECK(ptr != nullptr) << "context";   // aborts with file:line: for broken invariants only
//   LF_DCHECK(...)                            // debug builds only
//
// The level comes from LOONGFORGE_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO). Output
// goes to stderr, one line per message, written atomically. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>

namespace loongforge {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);

namespace internal {

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return os_; }

 private:
  const char* file_;
  int line_;
  LogLevel level_;
  std::ostringstream os_;
};

// Used to swallow the stream expression when a message is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal

// Allows at most one message per `interval_ms` per call site; counts the suppressed ones.
class RateLimiter {
 public:
  explicit RateLimiter(int64_t interval_ms) : interval_ms_(interval_ms) {}
  // True if a message may be logged now; `suppressed` receives how many were dropped since the
  // last.
  bool Allow(int64_t* suppressed);

 private:
  int64_t interval_ms_;
  std::atomic<int64_t> last_ms_{-1};
  std::atomic<int64_t> dropped_{0};
};

}  // namespace loongforge

#define LF_LOG_LEVEL_DEBUG ::loongforge::LogLevel::kDebug
#define LF_LOG_LEVEL_INFO ::loongforge::LogLevel::kInfo
#define LF_LOG_LEVEL_WARNING ::loongforge::LogLevel::kWarning
#define LF_LOG_LEVEL_ERROR ::loongforge::LogLevel::kError
#define LF_LOG_LEVEL_FATAL ::loongforge::LogLevel::kFatal

#define LF_LOG(level)                                    \
  !(LF_LOG_LEVEL_##level >= ::loongforge::GetLogLevel()) \
      ? (void)0                                          \
      : ::loongforge::internal::LogVoidify() &           \
            ::loongforge::internal::LogMessage(__FILE__, __LINE__, LF_LOG_LEVEL_##level).stream()

#define LF_CHECK(cond)                                                                             \
  (cond)                                                                                           \
      ? (void)0                                                                                    \
      : ::loongforge::internal::LogVoidify() &                                                     \
            ::loongforge::internal::LogMessage(__FILE__, __LINE__, ::loongforge::LogLevel::kFatal) \
                    .stream()                                                                      \
                << "Check failed: " #cond " "

#ifdef NDEBUG
#define LF_DCHECK(cond) \
  while (false) LF_CHECK(cond)
#else
#define LF_DCHECK(cond) LF_CHECK(cond)
#endif
