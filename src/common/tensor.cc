// DType tables and TensorView helpers (include/loongforge/tensor.h).
#include "loongforge/tensor.h"

#include <string>

namespace loongforge {
namespace {

struct DTypeRow {
  DType dtype;
  const char* name;         // short name, stored in checkpoint manifests
  const char* long_name;    // torch's name
  const char* safetensors;  // safetensors' spelling
  int size;
};

// Indexed by the enum value: the one DType table of the core (the bindings' DLPack codes are
// python/bindings/dlpack_capsule.h).
constexpr DTypeRow kDTypes[] = {
    {DType::kBool, "bool", "bool", "BOOL", 1},
    {DType::kUInt8, "u8", "uint8", "U8", 1},
    {DType::kInt8, "i8", "int8", "I8", 1},
    {DType::kInt16, "i16", "int16", "I16", 2},
    {DType::kInt32, "i32", "int32", "I32", 4},
    {DType::kInt64, "i64", "int64", "I64", 8},
    {DType::kFloat16, "f16", "float16", "F16", 2},
    {DType::kBFloat16, "bf16", "bfloat16", "BF16", 2},
    {DType::kFloat32, "f32", "float32", "F32", 4},
    {DType::kFloat64, "f64", "float64", "F64", 8},
};
constexpr int kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);
static_assert(static_cast<int>(DType::kFloat64) == kNumDTypes - 1, "kDTypes follows DType");

const DTypeRow& Row(DType d) { return kDTypes[static_cast<int>(d)]; }

std::string Quoted(std::string_view name) { return "tensor '" + std::string(name) + "'"; }

}  // namespace

int DTypeSize(DType d) { return Row(d).size; }
const char* DTypeName(DType d) { return Row(d).name; }
const char* DTypeLongName(DType d) { return Row(d).long_name; }
const char* DTypeSafetensorsName(DType d) { return Row(d).safetensors; }

StatusOr<DType> ParseDType(std::string_view name) {
  for (const auto& r : kDTypes) {
    if (name == r.name || name == r.long_name) return r.dtype;
  }
  std::string known;
  for (const auto& r : kDTypes) known += (known.empty() ? "" : " ") + std::string(r.name);
  return InvalidArgumentError("unknown dtype '" + std::string(name) + "' (expected " + known +
                              ", or torch's names such as float32)");
}

std::string Device::ToString() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return "cuda:" + std::to_string(index);
    case DeviceType::kCUDAHost:
      return "cuda_host";
  }
  return "device type " + std::to_string(static_cast<int>(type));
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

TensorView TensorView::Contiguous(void* data, DType dtype, std::vector<int64_t> shape,
                                  Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.device = device;
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorView::IsContiguous() const {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  if (numel() == 0) return true;  // no elements: any strides describe the same (empty) tensor
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Status TensorView::CheckValid(std::string_view name) const {
  for (int64_t d : shape) {
    if (d < 0) {
      return InvalidArgumentError(Quoted(name) + " has a negative dimension (shape " +
                                  ShapeToString(shape) + ")");
    }
  }
  if (!strides.empty() && strides.size() != shape.size()) {
    return InvalidArgumentError(Quoted(name) + " has " + std::to_string(strides.size()) +
                                " strides for " + std::to_string(shape.size()) + " dimensions");
  }
  if (data == nullptr && numel() > 0) {
    return InvalidArgumentError(Quoted(name) + " has no data pointer");
  }
  return Status::Ok();
}

Status TensorView::CheckContiguous(std::string_view name) const {
  if (IsContiguous()) return Status::Ok();
  return InvalidArgumentError(Quoted(name) + " is not contiguous (shape " + ShapeToString(shape) +
                              ", strides " + ShapeToString(strides) +
                              "); make it contiguous first");
}

Status TensorView::CheckDType(std::string_view name, DType want) const {
  return CheckDType(name, {want});
}

Status TensorView::CheckDType(std::string_view name, std::initializer_list<DType> allowed) const {
  std::string names;
  for (DType d : allowed) {
    if (d == dtype) return Status::Ok();
    if (!names.empty()) names += " or ";
    names += DTypeName(d);
  }
  return InvalidArgumentError(Quoted(name) + " has dtype " + DTypeName(dtype) + "; expected " +
                              names);
}

Status TensorView::CheckNumel(std::string_view name, int64_t want) const {
  if (numel() == want) return Status::Ok();
  return InvalidArgumentError(Quoted(name) + " has " + std::to_string(numel()) +
                              " elements (shape " + ShapeToString(shape) + "); expected " +
                              std::to_string(want));
}

Status TensorView::CheckDevice(std::string_view name, const Device& want) const {
  if (device == want) return Status::Ok();
  return InvalidArgumentError(Quoted(name) + " is on " + device.ToString() + "; expected " +
                              want.ToString());
}

Status TensorView::CheckWritable(std::string_view name) const {
  if (!read_only) return Status::Ok();
  return InvalidArgumentError(Quoted(name) + " is read-only; it is written to here");
}

}  // namespace loongforge
