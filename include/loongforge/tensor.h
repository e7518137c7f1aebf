// The one tensor boundary of the core: element types (DType) and a borrowed view of typed memory
// (TensorView) that every module takes. The core links no torch: the Python bindings build a
// TensorView from a torch tensor or any DLPack producer (python/bindings/tensor_convert.h), and C++
// callers build one from their own buffers.
//
//   TensorView v = TensorView::Contiguous(ptr, DType::kFloat32, {rows, cols});
//   LF_RETURN_IF_ERROR(v.CheckContiguous("residual"));
//
// A TensorView owns nothing: the memory must outlive every use of the view, and a function that
// takes one says how long it reads or writes it (usually: until it returns, or until the work it
// queued on `stream` is done).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "loongforge/status.h"

namespace loongforge {

// Element types. The short names are stable: checkpoint manifests store them.
//   kBool "bool" (1 byte), kUInt8 "u8", kInt8 "i8", kInt16 "i16", kInt32 "i32", kInt64 "i64",
//   kFloat16 "f16", kBFloat16 "bf16" (stored as the top 16 bits of an IEEE float32),
//   kFloat32 "f32", kFloat64 "f64".
enum class DType : uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

// Bytes per element of `d`.
int DTypeSize(DType d);
// The short name of `d` ("f32", "bf16", ...).
const char* DTypeName(DType d);
// The long name of `d`, as torch and numpy spell it ("float32", "bfloat16", "uint8", "bool").
const char* DTypeLongName(DType d);
// The safetensors spelling of `d` ("F32", "BF16", "BOOL", ...).
const char* DTypeSafetensorsName(DType d);
// Parses a short name ("f32") or torch's long name ("float32", "bfloat16", "uint8", "bool", ...).
// Errors: InvalidArgument naming the input and the accepted names.
StatusOr<DType> ParseDType(std::string_view name);

// Where memory lives. The values are DLPack's device type codes.
enum class DeviceType : int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,  // pinned host memory: readable by the CPU and by CUDA copies
};

struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;  // CUDA device ordinal; 0 for host memory

  bool is_host() const { return type == DeviceType::kCPU || type == DeviceType::kCUDAHost; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu", "cuda:1", "cuda_host"
};

// A borrowed view of typed memory: `data` points at element [0, ..., 0] (any DLPack byte offset
// already applied). `strides` are in elements; empty means compact row-major. `stream` is the
// cudaStream_t whose queued work produces or consumes the memory (null: the legacy default
// stream; unused for host memory). `read_only` marks memory the producer forbids writing to (a
// DLPack 1.x read-only export); kernels check it on their outputs.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  Device device;
  void* stream = nullptr;
  bool read_only = false;

  // A compact row-major view of host memory (or of `device` memory).
  static TensorView Contiguous(void* data, DType dtype, std::vector<int64_t> shape,
                               Device device = {});
  static TensorView Contiguous(const void* data, DType dtype, std::vector<int64_t> shape,
                               Device device = {}) {
    return Contiguous(const_cast<void*>(data), dtype, std::move(shape), device);
  }

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  // Product of the dimensions (1 for a 0-d tensor, 0 when a dimension is 0).
  int64_t numel() const;
  int64_t nbytes() const { return numel() * DTypeSize(dtype); }
  // True if the elements are compact and row-major: empty strides, or strides equal to the
  // row-major ones wherever the dimension is larger than 1 (torch's rule).
  bool IsContiguous() const;

  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }

  // Validation helpers. `name` names the tensor in the message ("tensor 'residual' ..."); every
  // error is InvalidArgument.
  // Data must be non-null unless the tensor has no elements; dimensions must be >= 0.
  Status CheckValid(std::string_view name) const;
  Status CheckContiguous(std::string_view name) const;
  Status CheckDType(std::string_view name, DType want) const;
  // One of `allowed`.
  Status CheckDType(std::string_view name, std::initializer_list<DType> allowed) const;
  Status CheckNumel(std::string_view name, int64_t want) const;
  // Exactly `want` (same type and index).
  Status CheckDevice(std::string_view name, const Device& want) const;
  Status CheckWritable(std::string_view name) const;
};

// "[2, 3]" for messages.
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace loongforge
