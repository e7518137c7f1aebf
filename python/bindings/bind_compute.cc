// Bindings of the training-step kernels (include/loongforge/compute.h).
//
// Tensors cross as TensorViews made by the one converter (tensor_convert.h); CUDA tensors run on
// torch's current stream of their device (a CUDA-graph capture records the launch). The C++ entry
// point validates and names the offending tensor (ValueError here). The GIL is released for the
// call.
#include "bindings.h"
#include "loongforge/compute.h"
#include "tensor_convert.h"

namespace loongforge {
namespace {

void RegisterCompute(py::module_& m) {
  m.def(
      "compute_quantize_rows_e4m3",
      [](py::object x, py::object q, py::object scale) {
        const PyTensor xv = ToTensorViewOrThrow(x, "x");
        const PyTensor qv = ToTensorViewOrThrow(q, "q");
        const PyTensor sv = ToTensorViewOrThrow(scale, "scale");
        ThrowIfErrorWithoutGil(
            [&] { return compute::QuantizeRowsE4m3(xv.view, qv.view, sv.view); });
      },
      py::arg("x"), py::arg("q"), py::arg("scale"),
      "Row-wise e4m3 quantization (Note [Row-wise e4m3 quantization] in loongforge/compute.h): "
      "x [rows, cols] bf16 or f32 -> q [rows, cols] uint8 (float8_e4m3fn bytes) and scale "
      "[rows] f32, with x ~= e4m3(q) * scale; bit for bit loongforge.fp8.quantize_rowwise.");
  m.def("compute_cuda_available", &compute::CudaAvailable,
        "True if the CUDA training-step kernels are built and a device is visible.");
}

}  // namespace

LF_REGISTER_BINDINGS(compute, RegisterCompute);

}  // namespace loongforge
