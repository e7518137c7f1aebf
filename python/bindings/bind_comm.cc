// Bindings of the NexusSync compression kernels (include/loongforge/comm.h).
//
// They take raw addresses (torch tensor data_ptr()) plus sizes and dtype codes (0 = fp32,
// 1 = bf16); python/loongforge/comm.py checks devices, dtypes, contiguity and sizes before calling.
// The GIL is released for the duration of each call.
#include <cstdint>

#include "bindings.h"
#include "loongforge/comm.h"

namespace loongforge {
namespace {

GradDType ToDType(int code, const char* what) {
  if (code == 0) return GradDType::kFloat32;
  if (code == 1) return GradDType::kBFloat16;
  ThrowStatus(InvalidArgumentError(std::string(what) +
                                   ": dtype code must be 0 (float32) or 1 "
                                   "(bfloat16), got " +
                                   std::to_string(code)));
}

template <typename T>
T* Ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

void RegisterComm(py::module_& m) {
  m.def(
      "comm_topk_error_feedback",
      [](uintptr_t grad, int grad_dtype, uintptr_t residual, int64_t n, int64_t k, uintptr_t values,
         int value_dtype, uintptr_t indices, bool cuda, uintptr_t stream, int num_threads) {
        const GradDType gt = ToDType(grad_dtype, "grad");
        const GradDType vt = ToDType(value_dtype, "values");
        Status s;
        {
          py::gil_scoped_release release;
          s = cuda
                  ? TopKErrorFeedbackCuda(Ptr<const void>(grad), gt, Ptr<float>(residual), n, k,
                                          Ptr<void>(values), vt, Ptr<int32_t>(indices),
                                          Ptr<void>(stream))
                  : TopKErrorFeedbackCpu(Ptr<const void>(grad), gt, Ptr<float>(residual), n, k,
                                         Ptr<void>(values), vt, Ptr<int32_t>(indices), num_threads);
        }
        ThrowIfError(s);
      },
      py::arg("grad"), py::arg("grad_dtype"), py::arg("residual"), py::arg("n"), py::arg("k"),
      py::arg("values"), py::arg("value_dtype"), py::arg("indices"), py::arg("cuda") = false,
      py::arg("stream") = 0, py::arg("num_threads") = 0,
      "Top-k with error feedback on raw buffers (see loongforge/comm.h). grad may be 0.");
  m.def(
      "comm_scatter_add",
      [](uintptr_t values, int value_dtype, uintptr_t indices, int64_t num_segments,
         int64_t segment_len, uintptr_t dense, int dense_dtype, int64_t n, float scale,
         bool zero_dense_first, bool cuda, uintptr_t stream, int num_threads) {
        const GradDType vt = ToDType(value_dtype, "values");
        const GradDType dt = ToDType(dense_dtype, "dense");
        Status s;
        {
          py::gil_scoped_release release;
          s = cuda ? ScatterAddCuda(Ptr<const void>(values), vt, Ptr<const int32_t>(indices),
                                    num_segments, segment_len, Ptr<void>(dense), dt, n, scale,
                                    zero_dense_first, Ptr<void>(stream))
                   : ScatterAddCpu(Ptr<const void>(values), vt, Ptr<const int32_t>(indices),
                                   num_segments, segment_len, Ptr<void>(dense), dt, n, scale,
                                   zero_dense_first, num_threads);
        }
        ThrowIfError(s);
      },
      py::arg("values"), py::arg("value_dtype"), py::arg("indices"), py::arg("num_segments"),
      py::arg("segment_len"), py::arg("dense"), py::arg("dense_dtype"), py::arg("n"),
      py::arg("scale"), py::arg("zero_dense_first"), py::arg("cuda") = false, py::arg("stream") = 0,
      py::arg("num_threads") = 0,
      "dense[idx] += scale * value, segment by segment (see loongforge/comm.h).");
  m.def("comm_cuda_available", &CommCudaAvailable,
        "True if the CUDA compression kernels are built and a device is visible.");
}

}  // namespace

LF_REGISTER_BINDINGS(comm, RegisterComm);

}  // namespace loongforge
