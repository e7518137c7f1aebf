// The one converter from Python tensors to the core's TensorView (include/loongforge/tensor.h).
//
// Accepts a torch.Tensor, any object with __dlpack__ (numpy, cupy, jax, ...) or a DLPack capsule
// ("dltensor" or "dltensor_versioned"). Nothing is copied: the view points at the producer's
// memory, and the returned PyTensor holds the capsule that keeps that memory alive. The core links
// no torch; torch is reached only through its Python API (Tensor.__dlpack__ and
// torch.cuda.current_stream), so one build works with every torch version that speaks DLPack.
//
// Streams: a torch CUDA tensor is exported with no stream synchronization (stream=-1), and its
// view carries torch's current stream on its device (the stream the caller's work was queued on);
// any other CUDA producer is asked for its tensor with no stream, which by DLPack's convention
// means the legacy default stream (view.stream = null).
//
// Threads: call with the GIL held. A PyTensor must be destroyed with the GIL held too; keep it in
// scope around a py::gil_scoped_release block, not inside it.
#pragma once

#include <string_view>

#include "bindings.h"
#include "loongforge/tensor.h"

namespace loongforge {

struct PyTensor {
  TensorView view;
  py::object keep_alive;  // the DLPack capsule: the producer frees the memory once it is gone
};

// Converts `obj`; `name` names the tensor in errors (InvalidArgument: no DLPack support, an
// unsupported dtype or device, a consumed capsule, a producer that refused to export).
StatusOr<PyTensor> ToTensorView(py::handle obj, std::string_view name);

// ToTensorView, raising the Python exception (ValueError) on error.
PyTensor ToTensorViewOrThrow(py::handle obj, std::string_view name);

}  // namespace loongforge
