// Shared helpers for the pybind11 module loongforge._C.
//
// Each component registers its bindings in its own python/bindings/bind_<module>.cc:
//   LF_REGISTER_BINDINGS(data, [](py::module_& m) { ... });
// and turns a Status into a Python exception with ThrowIfError (the only translation point on the
// Python side).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string>
#include <vector>

#include "loongforge/status.h"

namespace loongforge {
namespace py = pybind11;

using BindingFn = void (*)(py::module_&);
std::vector<std::pair<std::string, BindingFn>>& BindingRegistry();
struct BindingRegistrar {
  BindingRegistrar(const char* name, BindingFn fn) { BindingRegistry().emplace_back(name, fn); }
};

// Throws the Python exception for `s`:
//   InvalidArgument/OutOfRange -> ValueError, NotFound -> FileNotFoundError,
//   AlreadyExists -> FileExistsError, PermissionDenied -> PermissionError,
//   ResourceExhausted -> loongforge.ResourceExhaustedError (a MemoryError),
//   DataLoss -> loongforge.DataLossError (a RuntimeError), DeadlineExceeded -> TimeoutError,
//   anything else -> RuntimeError.
[[noreturn]] void ThrowStatus(const Status& s);
inline void ThrowIfError(const Status& s) {
  if (!s.ok()) ThrowStatus(s);
}
template <typename T>
T ValueOrThrow(StatusOr<T>&& v) {
  if (!v.ok()) ThrowStatus(v.status());
  return std::move(v).value();
}

// Calls f() with the GIL released (a long C++ call that touches no Python object) and returns
// its StatusOr's value, throwing its error as the Python exception above once the GIL is back.
template <typename F>
auto ValueOrThrowWithoutGil(F&& f) {
  auto r = [&] {
    py::gil_scoped_release release;
    return f();
  }();
  return ValueOrThrow(std::move(r));
}

}  // namespace loongforge

#define LF_REGISTER_BINDINGS(name, fn) \
  static ::loongforge::BindingRegistrar LF_CONCAT(_lf_bind_reg_, __LINE__)(#name, fn)
