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
#include <utility>
#include <vector>

#include "bindings.h"
#include "loongforge/tensor.h"

namespace loongforge {

struct PyTensor {
  TensorView view;
  py::object keep_alive;  // the DLPack capsule: the producer frees the memory once it is gone
};

// torch's current stream per CUDA device, looked up once for a batch of conversions (a
// checkpoint converts thousands of tensors; the lookup is a Python call each). Valid while the
// caller holds the GIL and runs no Python code that could switch streams between conversions.
struct CurrentStreams {
  std::vector<std::pair<int, void*>> seen;  // (device index, stream)
};

// Converts `obj`; `name` names the tensor in errors (InvalidArgument: no DLPack support, an
// unsupported dtype or device, a consumed capsule, a producer that refused to export). `streams`,
// when given, caches torch's current-stream lookups across the calls that share it.
StatusOr<PyTensor> ToTensorView(py::handle obj, std::string_view name,
                                CurrentStreams* streams = nullptr);

// ToTensorView, raising the Python exception (ValueError) on error.
PyTensor ToTensorViewOrThrow(py::handle obj, std::string_view name,
                             CurrentStreams* streams = nullptr);

// A dtype given from Python: a torch.dtype (torch.bfloat16) or a name ParseDType takes ("bfloat16",
// "bf16"). `what` names the argument in errors (InvalidArgument: another type, an unknown name, a
// torch dtype LoongForge has no DType for). Whether the DType suits is the caller's check.
StatusOr<DType> ToDType(py::handle obj, std::string_view what);

// A CUDA stream given from Python, in the converter's notion of a stream (TensorView::stream, a
// cudaStream_t): a torch.cuda.Stream or ExternalStream (anything with an int `cuda_stream`), an
// int handle (0 or None: the legacy default stream; 1 cudaStreamLegacy and 2 cudaStreamPerThread
// are CUDA's own handles). `what` names the argument in errors (InvalidArgument).
StatusOr<void*> ToCudaStream(py::handle obj, std::string_view what);

}  // namespace loongforge
