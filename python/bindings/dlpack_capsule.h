// Minimal DLPack ABI (the structs of dlpack.h v0.x and v1.x), the one mapping between the core's
// DType/Device and DLPack's codes, and a producer: MakeCapsule exports a TensorView whose memory is
// owned by a shared_ptr as a "dltensor" capsule that torch.utils.dlpack.from_dlpack consumes
// without copying. The capsule (or the tensor that consumed it) keeps the owner alive; the owner is
// released when the last of them goes away. The consumer side (a Python object -> TensorView) is
// tensor_convert.h; both sides read dtypes through ToDLDataType / FromDLDataType below.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "loongforge/tensor.h"

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

// DLPack's spelling (code, bits, lanes) of every DType: the one DType <-> DLPack table of the
// bindings. Codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
struct DTypeCode {
  DType dtype;
  DLDataType dl;
};
constexpr DTypeCode kDTypeCodes[] = {
    {DType::kBool, {6, 8, 1}},     {DType::kUInt8, {1, 8, 1}},     {DType::kInt8, {0, 8, 1}},
    {DType::kInt16, {0, 16, 1}},   {DType::kInt32, {0, 32, 1}},    {DType::kInt64, {0, 64, 1}},
    {DType::kFloat16, {2, 16, 1}}, {DType::kBFloat16, {4, 16, 1}}, {DType::kFloat32, {2, 32, 1}},
    {DType::kFloat64, {2, 64, 1}},
};

constexpr bool DTypeCodesFollowDType() {
  constexpr size_t n = sizeof(kDTypeCodes) / sizeof(kDTypeCodes[0]);
  if (n != static_cast<size_t>(DType::kFloat64) + 1) return false;
  for (size_t i = 0; i < n; ++i)
    if (static_cast<size_t>(kDTypeCodes[i].dtype) != i) return false;
  return true;
}
static_assert(DTypeCodesFollowDType(), "kDTypeCodes lists every DType, in the enum's order");

inline DLDataType ToDLDataType(DType d) { return kDTypeCodes[static_cast<size_t>(d)].dl; }

// The DType DLPack's `t` spells, or nullopt (vectors, complex, opaque, other widths).
inline std::optional<DType> FromDLDataType(const DLDataType& t) {
  for (const DTypeCode& c : kDTypeCodes)
    if (c.dl.code == t.code && c.dl.bits == t.bits && c.dl.lanes == t.lanes) return c.dtype;
  return std::nullopt;
}

struct Holder {
  std::shared_ptr<const void> owner;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed;
};

// Returns a PyCapsule named "dltensor" viewing `view` (its data, dtype, shape, strides and device)
// and keeping `owner` alive. Host memory, pinned included, is exported as DLPack's CPU device
// (torch reads pinned host memory as CPU); CUDA memory as device `view.device.index`. The view's
// stream is not exported: the producer must have completed the memory (DLPack's stream contract
// is the consumer's to ask for, and from_dlpack of torch 1.13 does not).
inline pybind11::capsule MakeCapsule(std::shared_ptr<const void> owner, const TensorView& view) {
  auto* h = new Holder{std::move(owner), view.shape, view.strides, {}};
  DLManagedTensor& m = h->managed;
  m.dl_tensor.data = view.data;
  m.dl_tensor.device = view.device.is_cuda()
                           ? DLDevice{static_cast<int32_t>(DeviceType::kCUDA), view.device.index}
                           : DLDevice{static_cast<int32_t>(DeviceType::kCPU), 0};
  m.dl_tensor.ndim = static_cast<int32_t>(h->shape.size());
  m.dl_tensor.dtype = ToDLDataType(view.dtype);
  m.dl_tensor.shape = h->shape.data();
  m.dl_tensor.strides = h->strides.empty() ? nullptr : h->strides.data();
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
