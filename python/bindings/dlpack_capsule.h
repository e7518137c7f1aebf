// Minimal DLPack ABI (the structs of dlpack.h v0.x and v1.x) and a producer: MakeCapsule wraps
// memory owned by a shared_ptr in a "dltensor" capsule that torch.utils.dlpack.from_dlpack consumes
// without copying. The capsule (or the tensor that consumed it) keeps the owner alive; the owner is
// released when the last of them goes away. The consumer side (a Python object -> TensorView) is
// tensor_convert.h.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace loongforge {
namespace dlpack {

struct DLDevice {
  int32_t device_type;  // 1 = CPU, 2 = CUDA, 3 = CUDA host (pinned)
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // nullptr = compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
// DLPack >= 1.0 (capsule name "dltensor_versioned").
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
constexpr uint64_t kFlagBitmaskReadOnly = uint64_t{1} << 0;
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

constexpr DLDataType kFloat32{2, 32, 1};
constexpr DLDataType kInt64{0, 64, 1};
constexpr DLDataType kUInt8{1, 8, 1};
constexpr DLDataType kBool{6, 8, 1};
constexpr DLDataType kBFloat16{4, 16, 1};

struct Holder {
  std::shared_ptr<const void> owner;
  std::vector<int64_t> shape;
  DLManagedTensor managed;
};

// Returns a PyCapsule named "dltensor" viewing `data` with `shape` (compact, row-major).
// `device_type` 1 for host memory (torch reads pinned host memory as CPU too), 2 for CUDA device
// memory of `device_id`.
inline pybind11::capsule MakeCapsule(std::shared_ptr<const void> owner, void* data,
                                     std::vector<int64_t> shape, DLDataType dtype,
                                     int32_t device_type = 1, int32_t device_id = 0) {
  auto* h = new Holder{std::move(owner), std::move(shape), {}};
  DLManagedTensor& m = h->managed;
  m.dl_tensor.data = data;
  m.dl_tensor.device = {device_type, device_id};
  m.dl_tensor.ndim = static_cast<int32_t>(h->shape.size());
  m.dl_tensor.dtype = dtype;
  m.dl_tensor.shape = h->shape.data();
  m.dl_tensor.strides = nullptr;
  m.dl_tensor.byte_offset = 0;
  m.manager_ctx = h;
  m.deleter = [](DLManagedTensor* self) { delete static_cast<Holder*>(self->manager_ctx); };
  // If nobody consumed the capsule (its name is still "dltensor"), free the tensor here.
  PyObject* cap = PyCapsule_New(&m, "dltensor", [](PyObject* c) {
    if (PyCapsule_IsValid(c, "dltensor")) {
      auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
      if (mt && mt->deleter) mt->deleter(mt);
    }
  });
  if (!cap) {
    delete h;
    throw pybind11::error_already_set();
  }
  return pybind11::reinterpret_steal<pybind11::capsule>(cap);
}

}  // namespace dlpack
}  // namespace loongforge
