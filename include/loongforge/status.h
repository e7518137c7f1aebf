// Status / StatusOr: the single error model of LoongForge.
//
// Caller errors (bad input, missing files, full disks) travel as Status values that name the file,
// record or field. Broken invariants use LF_CHECK (logging.h) instead. Statuses are translated in
// exactly two places: the Python bindings (exceptions) and the CLI (exit codes).
#pragma once

#include <cassert>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace loongforge {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: message"
  std::string ToString() const;
  // Returns a copy whose message is "context: message" (used to add file/record names on the way
  // up).
  Status WithContext(const std::string& context) const;
  // Marks a status as deliberately ignored.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

Status InvalidArgumentError(std::string msg);
Status NotFoundError(std::string msg);
Status AlreadyExistsError(std::string msg);
Status DataLossError(std::string msg);
Status ResourceExhaustedError(std::string msg);
Status FailedPreconditionError(std::string msg);
Status OutOfRangeError(std::string msg);
Status UnavailableError(std::string msg);
Status InternalError(std::string msg);
Status DeadlineExceededError(std::string msg);
Status CancelledError(std::string msg);
Status UnimplementedError(std::string msg);
// Maps an errno value to a Status (ENOSPC -> ResourceExhausted, ENOENT -> NotFound, ...), with
// "what: strerror" as the message.
Status ErrnoToStatus(int err, const std::string& what);

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : v_(status) {  // NOLINT(runtime/explicit)
    assert(!status.ok() && "StatusOr constructed from an OK status");
    if (status.ok()) v_ = Status(StatusCode::kInternal, "StatusOr constructed from OK status");
  }
  StatusOr(Status&& status) : StatusOr(static_cast<const Status&>(status)) {}  // NOLINT
  StatusOr(const T& value) : v_(value) {}                                      // NOLINT
  StatusOr(T&& value) : v_(std::move(value)) {}                                // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
const Status& AsStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace loongforge

#define LF_CONCAT_INNER(a, b) a##b
#define LF_CONCAT(a, b) LF_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define LF_RETURN_IF_ERROR(expr)                                                \
  do {                                                                          \
    const ::loongforge::Status _lf_st = ::loongforge::internal::AsStatus(expr); \
    if (!_lf_st.ok()) return _lf_st;                                            \
  } while (0)

// Like LF_RETURN_IF_ERROR, prefixing `context` (a std::string expression) to the message.
#define LF_RETURN_IF_ERROR_CTX(expr, context)                                   \
  do {                                                                          \
    const ::loongforge::Status _lf_st = ::loongforge::internal::AsStatus(expr); \
    if (!_lf_st.ok()) return _lf_st.WithContext(context);                       \
  } while (0)

#define LF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

// `lhs = value of expr`, or return its status. lhs may be a declaration: LF_ASSIGN_OR_RETURN(auto
// x, F());
#define LF_ASSIGN_OR_RETURN(lhs, expr) \
  LF_ASSIGN_OR_RETURN_IMPL(LF_CONCAT(_lf_statusor_, __LINE__), lhs, expr)
