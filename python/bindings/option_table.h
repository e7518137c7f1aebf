// Note [Option tables]
// -------------------
// An options struct of the public C++ API (LoaderOptions, VaultOptions, PackOptions, ...) is the
// one declaration of its options and their defaults. A binding lists each field once, with its
// Python name, in a table of OptionField<S>; the table converts a Python value into the field
// (the type comes from the member pointer), reads the defaults back from a default-constructed S,
// and refuses an unknown keyword listing the known ones. No default is restated in the binding
// or in Python: the Python classes forward their keyword arguments and ask the table for the
// defaults (`_C.loader_options()`, `_C.vault_options()`, `_C.pack_options()`, ...). The one
// deliberate difference: from Python the dataset tools draw no progress bar unless asked. Adding a
// field to a struct means adding one line to its table.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings.h"

namespace loongforge {

template <typename S>
struct OptionField {
  const char* name;
  std::function<void(S&, py::handle)> set;
  std::function<py::object(const S&)> get;
};

// A field whose Python value casts to its C++ type. `what` names the options in errors
// ("DataLoader", "CheckpointVault").
template <typename S, typename T>
OptionField<S> Plain(const char* what, const char* name, T S::*m) {
  return {name,
          [what, name, m](S& o, py::handle v) {
            try {
              o.*m = v.cast<T>();
            } catch (const py::cast_error&) {
              if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v))
                  ThrowStatus(InvalidArgumentError(
                      std::string(what) + ": option '" + name + "' must be in " +
                      std::to_string(std::numeric_limits<T>::min()) + ".." +
                      std::to_string(std::numeric_limits<T>::max()) + ", got " +
                      py::repr(v).cast<std::string>()));
              }
              ThrowStatus(InvalidArgumentError(
                  std::string(what) + ": option '" + name + "' cannot take a " +
                  py::str(v.get_type().attr("__name__")).cast<std::string>() + " (" +
                  py::repr(v).cast<std::string>() + ")"));
            }
          },
          [m](const S& o) { return py::cast(o.*m); }};
}

// An enum field spelled as one of `names` in Python.
template <typename S, typename E>
OptionField<S> Choice(const char* what, const char* name, E S::*m,
                      std::vector<std::pair<std::string, E>> names) {
  return {name,
          [what, name, m, names](S& o, py::handle v) {
            const std::string got = py::str(v);
            std::string known;
            for (const auto& [n, e] : names) {
              if (n == got) {
                o.*m = e;
                return;
              }
              known += (known.empty() ? "'" : " or '") + n + "'";
            }
            ThrowStatus(InvalidArgumentError(std::string(what) + ": option '" + name +
                                             "' must be " + known + ", got '" + got + "'"));
          },
          [m, names](const S& o) -> py::object {
            for (const auto& [n, e] : names)
              if (o.*m == e) return py::str(n);
            return py::none();
          }};
}

// Sets the fields of `o` named in `kw`; an unknown name is InvalidArgument listing the known ones.
template <typename S>
void ApplyOptions(const std::vector<OptionField<S>>& fields, const char* what, const py::kwargs& kw,
                  S* o) {
  for (auto item : kw) {
    const std::string k = py::str(item.first);
    auto f = std::find_if(fields.begin(), fields.end(),
                          [&](const OptionField<S>& f) { return k == f.name; });
    if (f == fields.end()) {
      std::string known;
      for (const OptionField<S>& g : fields)
        known += (known.empty() ? "" : ", ") + std::string(g.name);
      ThrowStatus(InvalidArgumentError(std::string(what) + ": unknown option '" + k +
                                       "' (known: " + known + ")"));
    }
    f->set(*o, item.second);
  }
}

// Every option of the table and its default, read from a default-constructed S.
template <typename S>
py::dict OptionDefaults(const std::vector<OptionField<S>>& fields) {
  const S defaults;
  py::dict d;
  for (const OptionField<S>& f : fields) d[f.name] = f.get(defaults);
  return d;
}

}  // namespace loongforge
