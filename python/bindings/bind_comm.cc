// Bindings of the NexusSync compression kernels (include/loongforge/comm.h).
//
// Tensors cross as TensorViews made by the one converter (tensor_convert.h): torch tensors, any
// DLPack producer, or DLPack capsules. The C++ entry points validate dtypes, sizes, contiguity and
// devices and name the offending tensor (ValueError here). CUDA tensors run on torch's current
// stream of their device. The GIL is released for the duration of each call.
#include <optional>

#include "bindings.h"
#include "loongforge/comm.h"
#include "tensor_convert.h"

namespace loongforge {
namespace {

void RegisterComm(py::module_& m) {
  m.def(
      "comm_topk_error_feedback",
      [](py::object grad, py::object residual, int64_t k, py::object values, py::object indices,
         int num_threads) {
        // The PyTensors hold the DLPack capsules: keep them alive (and destroy them with the GIL)
        // around the call.
        std::optional<PyTensor> g;
        if (!grad.is_none()) g = ToTensorViewOrThrow(grad, "grad");
        const PyTensor r = ToTensorViewOrThrow(residual, "residual");
        const PyTensor v = ToTensorViewOrThrow(values, "values");
        const PyTensor i = ToTensorViewOrThrow(indices, "indices");
        ThrowIfErrorWithoutGil([&] {
          return comm::TopKErrorFeedback(g ? &g->view : nullptr, r.view, k, v.view, i.view,
                                         num_threads);
        });
      },
      py::arg("grad"), py::arg("residual"), py::arg("k"), py::arg("values"), py::arg("indices"),
      py::arg("num_threads") = 0,
      "Top-k with error feedback (loongforge/comm.h). grad may be None; values/indices hold "
      "min(k, residual.numel()) elements.");
  m.def(
      "comm_scatter_add",
      [](py::object values, py::object indices, py::object dense, int64_t num_segments, float scale,
         bool zero_dense_first, int num_threads) {
        const PyTensor v = ToTensorViewOrThrow(values, "values");
        const PyTensor i = ToTensorViewOrThrow(indices, "indices");
        const PyTensor d = ToTensorViewOrThrow(dense, "dense");
        ThrowIfErrorWithoutGil([&] {
          return comm::ScatterAdd(v.view, i.view, num_segments, d.view, scale, zero_dense_first,
                                  num_threads);
        });
      },
      py::arg("values"), py::arg("indices"), py::arg("dense"), py::arg("num_segments") = 1,
      py::arg("scale") = 1.0f, py::arg("zero_dense_first") = false, py::arg("num_threads") = 0,
      "dense[idx] += scale * value, segment by segment (loongforge/comm.h).");
  m.def("comm_cuda_available", &comm::CudaAvailable,
        "True if the CUDA compression kernels are built and a device is visible.");
}

}  // namespace

LF_REGISTER_BINDINGS(comm, RegisterComm);

}  // namespace loongforge
