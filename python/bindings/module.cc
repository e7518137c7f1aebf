// The pybind11 module loongforge._C: exception types, build_info(), and every registered component.
#include <pybind11/stl.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "bindings.h"
#include "loongforge/build_info.h"
#include "loongforge/env_knobs.h"

namespace loongforge {

std::vector<std::pair<std::string, BindingFn>>& BindingRegistry() {
  static std::vector<std::pair<std::string, BindingFn>> r;
  return r;
}

py::module_ TestingModule(py::module_& m) {
  if (py::hasattr(m, "testing")) return m.attr("testing").cast<py::module_>();
  return m.def_submodule("testing",
                         "Hooks into the C++ core's internals for tests and benchmarks; not API.");
}

// With LOONGFORGE_CRASH_BACKTRACE=1, a fatal signal prints the native stack (frames as
// object+offset, for addr2line) before the process dies. For debugging crashes in worker threads,
// which Python's faulthandler cannot show.
static void CrashHandler(int sig) {
  void* frames[64];
  int n = backtrace(frames, 64);
  char head[64];
  int len = std::snprintf(head, sizeof(head), "loongforge: fatal signal %d, native stack:\n", sig);
  if (write(STDERR_FILENO, head, len) < 0) {
  }
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    char line[512];
    if (dladdr(frames[i], &info) && info.dli_fname) {
      len = std::snprintf(line, sizeof(line), "  #%d %s+0x%lx %s\n", i, info.dli_fname,
                          static_cast<unsigned long>(static_cast<char*>(frames[i]) -
                                                     static_cast<char*>(info.dli_fbase)),
                          info.dli_sname ? info.dli_sname : "");
    } else {
      len = std::snprintf(line, sizeof(line), "  #%d %p\n", i, frames[i]);
    }
    if (write(STDERR_FILENO, line, len) < 0) {
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void MaybeInstallCrashHandler() {
  if (!EnvBool("LOONGFORGE_CRASH_BACKTRACE")) return;
  void* warm[2];
  backtrace(warm, 2);  // loads libgcc_s now: the handler must not allocate
  static char alt_stack[1 << 16];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = CrashHandler;
  sa.sa_flags = SA_ONSTACK;
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

static PyObject* g_data_loss_error = nullptr;
static PyObject* g_resource_exhausted_error = nullptr;

void ThrowStatus(const Status& s) {
  std::string msg = s.ToString();
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      type = PyExc_ValueError;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case StatusCode::kAlreadyExists:
      type = PyExc_FileExistsError;
      break;
    case StatusCode::kPermissionDenied:
      type = PyExc_PermissionError;
      break;
    case StatusCode::kResourceExhausted:
      type = g_resource_exhausted_error;
      break;
    case StatusCode::kDataLoss:
      type = g_data_loss_error;
      break;
    case StatusCode::kDeadlineExceeded:
      type = PyExc_TimeoutError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, msg.c_str());
  throw py::error_already_set();
}

}  // namespace loongforge

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace loongforge;
  m.doc() = "LoongForge C++ core (private; use the `loongforge` package)";
  MaybeInstallCrashHandler();
  // Exception types made with the C API and owned for the life of the process (never released):
  // a function-local static py::exception crashed on raise under pybind11 3.1 / Python 3.12.
  if (g_data_loss_error == nullptr) {
    g_data_loss_error =
        PyErr_NewException("loongforge._C.DataLossError", PyExc_RuntimeError, nullptr);
    g_resource_exhausted_error =
        PyErr_NewException("loongforge._C.ResourceExhaustedError", PyExc_MemoryError, nullptr);
    if (!g_data_loss_error || !g_resource_exhausted_error) throw py::error_already_set();
  }
  m.attr("DataLossError") = py::reinterpret_borrow<py::object>(g_data_loss_error);
  m.attr("ResourceExhaustedError") = py::reinterpret_borrow<py::object>(g_resource_exhausted_error);
  // An allocation that fails inside any binding is the same error as a ResourceExhausted Status
  // (a MemoryError subclass), whichever binding threw it.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(g_resource_exhausted_error,
                      "ResourceExhausted: out of memory (std::bad_alloc)");
    }
  });

  m.def(
      "build_info",
      [] {
        BuildInfo b = GetBuildInfo();
        py::dict d;
        d["version"] = b.version;
        d["git_hash"] = b.git_hash;
        d["build_type"] = b.build_type;
        d["compiler"] = b.compiler;
        d["cuda"] = b.cuda;
        d["cuda_version"] = b.cuda_version;
        d["cuda_archs"] = b.cuda_archs;
        d["nvjpeg"] = b.nvjpeg;
        d["cufile"] = b.cufile;
        d["nccl"] = b.nccl;
        d["cuda_runtime_version"] = b.cuda_runtime_version;
        d["cuda_driver_version"] = b.cuda_driver_version;
        d["cuda_device_count"] = b.cuda_device_count;
        return d;
      },
      "Version, git hash and the GPU features compiled in and found at run time.");

  // The environment knobs' table (src/common/env_knobs.cc): loongforge.knobs reads it here, so
  // Python declares none of its own.
  m.def(
      "env_knobs",
      [] {
        size_t n = 0;
        const EnvKnob* t = EnvKnobTable(&n);
        py::list out;
        for (size_t i = 0; i < n; ++i) {
          const EnvKnob& k = t[i];
          py::dict d;
          d["name"] = k.name;
          d["type"] = KnobTypeName(k.type);
          d["default"] = k.default_value;
          d["doc"] = k.doc;
          d["reader"] = k.reader;
          if (k.type == KnobType::kInt) {
            d["min"] = k.min_value;
            d["max"] = k.max_value;
          }
          if (k.type == KnobType::kString && k.choices[0] != '\0') d["choices"] = k.choices;
          const char* raw = EnvRaw(k.name);
          d["current"] = raw != nullptr ? py::object(py::str(raw)) : py::object(py::none());
          out.append(d);
        }
        return out;
      },
      "Every declared LOONGFORGE_* knob: name, type, default, doc, reader, current (None: unset).");
  m.def(
      "env_knob",
      [](const std::string& name) -> py::object {
        const EnvKnob* k = FindEnvKnob(name);
        if (k == nullptr) {
          throw py::key_error(name +
                              " is not a declared environment knob (src/common/env_knobs.cc)");
        }
        auto value = [](auto v) -> py::object {
          if (!v.ok()) ThrowStatus(v.status());
          return py::cast(*v);
        };
        switch (k->type) {
          case KnobType::kInt:
            return value(ParseEnvInt(k->name));
          case KnobType::kFloat:
            return value(ParseEnvFloat(k->name));
          case KnobType::kBool:
            return value(ParseEnvBool(k->name));
          case KnobType::kString:
            return value(ParseEnvString(k->name));
        }
        return py::none();
      },
      py::arg("name"),
      "The knob's value as its type (the default when unset or empty); ValueError naming the "
      "variable for a bad value, KeyError for an undeclared name.");

  // Register components in a fixed order (static init order across files is unspecified).
  auto regs = BindingRegistry();
  std::sort(regs.begin(), regs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [name, fn] : regs) fn(m);
}
