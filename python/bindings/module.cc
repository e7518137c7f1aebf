// The pybind11 module loongforge._C: exception types, build_info(), and every registered component.
#include <pybind11/stl.h>

#include <algorithm>

#include "bindings.h"
#include "loongforge/build_info.h"

namespace loongforge {

std::vector<std::pair<std::string, BindingFn>>& BindingRegistry() {
  static std::vector<std::pair<std::string, BindingFn>> r;
  return r;
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

  // Register components in a fixed order (static init order across files is unspecified).
  auto regs = BindingRegistry();
  std::sort(regs.begin(), regs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [name, fn] : regs) fn(m);
}
