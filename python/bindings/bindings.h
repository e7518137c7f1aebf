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
#include <utility>
#include <vector>

#include "loongforge/status.h"

namespace loongforge {
namespace py = pybind11;

using BindingFn = void (*)(py::module_&);

// loongforge._C.testing: hooks into the core's internals for tests and benchmarks (the loader's CPU
// transform, the batch JPEG decoder, what the core sees of a tensor). Kept apart so that _C's own
// names are the product's; created on first use, the same submodule for every caller.
py::module_ TestingModule(py::module_& m);
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

// Returns f() called with the GIL released: for a long C++ call that touches no Python object (nor
// does its result). The GIL is held again when it returns.
template <typename F>
auto CallWithoutGil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// CallWithoutGil for an f that returns a Status: throws its error as the Python exception above
// once the GIL is back.
template <typename F>
void ThrowIfErrorWithoutGil(F&& f) {
  ThrowIfError(CallWithoutGil(std::forward<F>(f)));
}

// CallWithoutGil for an f that returns a StatusOr: its value, or its error thrown as above.
template <typename F>
auto ValueOrThrowWithoutGil(F&& f) {
  return ValueOrThrow(CallWithoutGil(std::forward<F>(f)));
}

// A Python list of to_py(item) for each item of `items`, in order.
template <typename Range, typename F>
py::list ListOf(const Range& items, F&& to_py) {
  py::list out;
  for (const auto& item : items) out.append(to_py(item));
  return out;
}

// Options structs are filled from Python through option tables (option_table.h).

}  // namespace loongforge

#define LF_REGISTER_BINDINGS(name, fn) \
  static ::loongforge::BindingRegistrar LF_CONCAT(_lf_bind_reg_, __LINE__)(#name, fn)
