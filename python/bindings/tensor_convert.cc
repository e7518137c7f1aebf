// Python tensor -> TensorView through DLPack (tensor_convert.h).
#include "tensor_convert.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "dlpack_capsule.h"

namespace loongforge {
namespace {

std::string Quoted(std::string_view name) { return "tensor '" + std::string(name) + "'"; }

// torch objects, looked up once torch has been imported by someone (an object can only be a torch
// tensor then; the converter never imports torch itself). Never freed: destroying Python objects
// at process exit would run after the interpreter is gone.
struct TorchRefs {
  py::object tensor_type;     // torch.Tensor
  py::object dtype_type;      // torch.dtype
  py::object dtype_bool;      // torch.bool
  py::object dtype_uint8;     // torch.uint8
  py::object current_stream;  // torch.cuda.current_stream, looked up on first use
};

TorchRefs* Torch() {
  static TorchRefs* refs = nullptr;  // guarded by the GIL
  if (refs != nullptr) return refs;
  py::dict modules = py::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return nullptr;
  py::module_ torch = py::module_::import("torch");
  refs = new TorchRefs{torch.attr("Tensor"), torch.attr("dtype"), torch.attr("bool"),
                       torch.attr("uint8"), py::none()};
  return refs;
}

// The DType of DLPack's `t` (the one table: dlpack::kDTypeCodes), or InvalidArgument naming the
// tensor and what it holds.
StatusOr<DType> DTypeOfDL(const dlpack::DLDataType& t, std::string_view name) {
  if (std::optional<DType> d = dlpack::FromDLDataType(t)) return *d;
  static const char* const kCodeNames[] = {"int",    "uint",    "float", "opaque",
                                           "bfloat", "complex", "bool"};
  const std::string code =
      t.code < 7 ? kCodeNames[t.code] : "code " + std::to_string(static_cast<int>(t.code)) + " ";
  std::string what = code + std::to_string(static_cast<int>(t.bits));
  if (t.lanes != 1) what += "x" + std::to_string(t.lanes);
  std::string known;
  for (const dlpack::DTypeCode& c : dlpack::kDTypeCodes)
    known += (known.empty() ? "" : " ") + std::string(DTypeName(c.dtype));
  return InvalidArgumentError(Quoted(name) + " has dtype " + what +
                              ", which LoongForge does not support (" + known + ")");
}

StatusOr<Device> FromDLDevice(const dlpack::DLDevice& d, std::string_view name) {
  switch (d.device_type) {
    case 1:
      return Device{DeviceType::kCPU, 0};
    case 2:
      return Device{DeviceType::kCUDA, d.device_id};
    case 3:
      return Device{DeviceType::kCUDAHost, 0};
    default:
      return InvalidArgumentError(Quoted(name) + " is on DLPack device type " +
                                  std::to_string(d.device_type) +
                                  "; LoongForge takes CPU, CUDA and pinned host memory");
  }
}

// Fills `out` from a borrowed capsule (kept alive by out->keep_alive).
Status FromCapsule(py::object capsule, std::string_view name, PyTensor* out) {
  const dlpack::DLTensor* dl = nullptr;
  bool read_only = false;
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, "dltensor")) {
    auto* m = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    dl = &m->dl_tensor;
  } else if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* m = static_cast<dlpack::DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(c, "dltensor_versioned"));
    if (m->version.major != 1) {
      return InvalidArgumentError(
          Quoted(name) + " is a DLPack " + std::to_string(m->version.major) + "." +
          std::to_string(m->version.minor) + " capsule; LoongForge reads DLPack 0.x and 1.x");
    }
    dl = &m->dl_tensor;
    read_only = (m->flags & dlpack::kFlagBitmaskReadOnly) != 0;
  } else {
    return InvalidArgumentError(Quoted(name) +
                                " is a capsule but not an unconsumed DLPack tensor (a capsule "
                                "can be consumed once)");
  }
  if (dl->ndim < 0) return InvalidArgumentError(Quoted(name) + " has a negative ndim");
  TensorView& v = out->view;
  LF_ASSIGN_OR_RETURN(v.dtype, DTypeOfDL(dl->dtype, name));
  LF_ASSIGN_OR_RETURN(v.device, FromDLDevice(dl->device, name));
  v.data = dl->data == nullptr ? nullptr : static_cast<char*>(dl->data) + dl->byte_offset;
  v.shape.assign(dl->shape, dl->shape + dl->ndim);
  if (dl->strides != nullptr) v.strides.assign(dl->strides, dl->strides + dl->ndim);
  v.read_only = read_only;
  out->keep_alive = std::move(capsule);
  return v.CheckValid(name);
}

}  // namespace

StatusOr<PyTensor> ToTensorView(py::handle obj, std::string_view name, CurrentStreams* streams) {
  PyTensor out;
  try {
    if (PyCapsule_CheckExact(obj.ptr())) {
      LF_RETURN_IF_ERROR(FromCapsule(py::reinterpret_borrow<py::object>(obj), name, &out));
      return out;
    }
    TorchRefs* torch = Torch();
    const bool is_torch = torch != nullptr && py::isinstance(obj, torch->tensor_type);
    if (!is_torch && !py::hasattr(obj, "__dlpack__")) {
      return InvalidArgumentError(Quoted(name) + " is a " +
                                  std::string(py::str(obj.get_type().attr("__name__"))) +
                                  ", not a tensor (expected a torch.Tensor or an object with "
                                  "__dlpack__)");
    }
    py::object src = py::reinterpret_borrow<py::object>(obj);
    bool is_bool = false;
    if (is_torch) {
      // Tensor.__dlpack__ refuses tensors that require grad; the view reads or writes the same
      // memory either way.
      if (src.attr("requires_grad").cast<bool>()) src = src.attr("detach")();
      // torch < 2.0 exports no bool through DLPack: pass the same bytes as uint8.
      if (py::object(src.attr("dtype")).is(torch->dtype_bool)) {
        is_bool = true;
        src = src.attr("view")(torch->dtype_uint8);
      }
    }
    // torch: stream=-1 asks for no synchronization (torch >= 2 would otherwise make the legacy
    // default stream wait for the current one, serializing a comm stream with the compute
    // stream); the view carries the current stream instead (below). Other producers get no stream
    // argument, which by DLPack's convention means the legacy default stream (and numpy refuses
    // any stream).
    py::object capsule =
        is_torch ? src.attr("__dlpack__")(py::arg("stream") = -1) : src.attr("__dlpack__")();
    LF_RETURN_IF_ERROR(FromCapsule(std::move(capsule), name, &out));
    if (is_bool) out.view.dtype = DType::kBool;
    if (is_torch && out.view.device.is_cuda()) {
      const int dev = out.view.device.index;
      if (streams != nullptr) {
        for (const auto& [d, s] : streams->seen) {
          if (d == dev) {
            out.view.stream = s;
            return out;
          }
        }
      }
      if (torch->current_stream.is_none()) {
        torch->current_stream = py::module_::import("torch.cuda").attr("current_stream");
      }
      LF_ASSIGN_OR_RETURN(out.view.stream, ToCudaStream(torch->current_stream(dev), name));
      if (streams != nullptr) streams->seen.emplace_back(dev, out.view.stream);
    }
    return out;
  } catch (py::error_already_set& e) {
    return InvalidArgumentError(Quoted(name) +
                                " could not be exported through DLPack: " + e.what());
  }
}

PyTensor ToTensorViewOrThrow(py::handle obj, std::string_view name, CurrentStreams* streams) {
  return ValueOrThrow(ToTensorView(obj, name, streams));
}

StatusOr<DType> ToDType(py::handle obj, std::string_view what) {
  std::string name;
  if (py::isinstance<py::str>(obj)) {
    name = obj.cast<std::string>();
  } else if (TorchRefs* torch = Torch();
             torch != nullptr && py::isinstance(obj, torch->dtype_type)) {
    name = py::str(obj);  // "torch.float32"
    if (name.rfind("torch.", 0) == 0) name.erase(0, 6);
  } else {
    return InvalidArgumentError(std::string(what) + " must be a torch.dtype or a dtype name, got " +
                                py::repr(obj).cast<std::string>());
  }
  StatusOr<DType> d = ParseDType(name);
  if (!d.ok()) return InvalidArgumentError(std::string(what) + ": " + d.status().message());
  return d;
}

StatusOr<void*> ToCudaStream(py::handle obj, std::string_view what) {
  try {
    if (obj.is_none()) return nullptr;
    py::object handle = py::hasattr(obj, "cuda_stream") ? py::object(obj.attr("cuda_stream"))
                                                        : py::reinterpret_borrow<py::object>(obj);
    if (!py::isinstance<py::int_>(handle) || py::isinstance<py::bool_>(handle)) {
      return InvalidArgumentError(
          std::string(what) + " must be a torch.cuda.Stream, an int cudaStream_t or None, got " +
          py::repr(obj).cast<std::string>());
    }
    return reinterpret_cast<void*>(handle.cast<uintptr_t>());
  } catch (py::error_already_set& e) {
    return InvalidArgumentError(std::string(what) + " is not a CUDA stream: " + e.what());
  } catch (const py::cast_error& e) {
    return InvalidArgumentError(std::string(what) + " is not a CUDA stream handle: " + e.what());
  }
}

namespace {

void BindTensor(py::module_& m) {
  m.def(
      "dtypes",
      [] {
        py::list out;
        for (DType d :
             {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32,
              DType::kInt64, DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
          py::dict e;
          e["name"] = DTypeName(d);
          e["long_name"] = DTypeLongName(d);
          e["safetensors"] = DTypeSafetensorsName(d);
          e["size"] = DTypeSize(d);
          out.append(e);
        }
        return out;
      },
      "Every dtype of the C++ core (include/loongforge/tensor.h), each with its short name, its "
      "torch/numpy name, its safetensors name and its size: the one table the Python side reads.");
  m.def(
      "dtype_long_name",
      [](const std::string& name) { return DTypeLongName(ValueOrThrow(ParseDType(name))); },
      py::arg("name"),
      "The torch/numpy name of a LoongForge dtype name (\"bf16\" -> \"bfloat16\"); "
      "ValueError for an unknown one.");
  py::module_ testing = TestingModule(m);
  testing.def(
      "tensor_info",
      [](py::object obj, const std::string& name) {
        const PyTensor t = ToTensorViewOrThrow(obj, name);
        py::dict d;
        d["dtype"] = DTypeName(t.view.dtype);
        d["shape"] = t.view.shape;
        d["strides"] = t.view.strides;
        d["device"] = t.view.device.ToString();
        d["contiguous"] = t.view.IsContiguous();
        d["stream"] = reinterpret_cast<uintptr_t>(t.view.stream);
        d["read_only"] = t.view.read_only;
        return d;
      },
      py::arg("tensor"), py::arg("name") = "tensor",
      "What the C++ core sees of a tensor (for tests and debugging): dtype, shape, strides, "
      "device, contiguous, stream, read_only.");
  testing.def(
      "tensor_reexport",
      [](py::object obj) {
        // The capsule that keeps the producer's memory alive travels in the owner; it is released
        // with the GIL held, whichever thread drops the last reference.
        PyTensor t = ToTensorViewOrThrow(obj, "tensor");
        auto* keep = new py::object(std::move(t.keep_alive));
        std::shared_ptr<const void> owner(keep, [](const py::object* p) {
          py::gil_scoped_acquire gil;
          delete p;
        });
        return dlpack::MakeCapsule(std::move(owner), t.view);
      },
      py::arg("tensor"),
      "The tensor converted to the core's TensorView and exported again as a DLPack capsule (for "
      "tests: both directions of the one DType <-> DLPack table; the memory is shared).");
}

}  // namespace

LF_REGISTER_BINDINGS(tensor, BindTensor);

}  // namespace loongforge
