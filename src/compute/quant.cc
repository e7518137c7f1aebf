// The public entry of the row-wise e4m3 quantization (include/loongforge/compute.h): validate the
// tensors, then run the CPU or the CUDA twin (quant_kernels.h) on their device. The CPU twin is
// the reference the CUDA kernel is tested against.
#include <string>

#include "compute/quant_kernels.h"
#include "loongforge/compute.h"

namespace loongforge {
namespace compute {
namespace internal {

void QuantizeRowsE4m3Cpu(const void* x, DType x_dtype, int64_t rows, int64_t cols, uint8_t* q,
                         float* scale) {
  const bool bf16 = x_dtype == DType::kBFloat16;
  for (int64_t r = 0; r < rows; ++r) {
    auto at = [&](int64_t c) {
      const int64_t i = r * cols + c;
      return bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(x)[i])
                  : static_cast<const float*>(x)[i];
    };
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = AbsMaxNan(amax, at(c));
    const float s = RowScale(amax);
    scale[r] = s;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = QuantizeElement(at(c), s);
  }
}

}  // namespace internal

namespace {

Status SameDevice(const TensorView& t, std::string_view name, const TensorView& x) {
  if (x.device.is_host() ? t.device.is_host() : t.device == x.device) return Status::Ok();
  return InvalidArgumentError("tensor '" + std::string(name) + "' is on " + t.device.ToString() +
                              " but tensor 'x' is on " + x.device.ToString());
}

}  // namespace

bool CudaAvailable() { return internal::CudaAvailable(); }

Status QuantizeRowsE4m3(const TensorView& x, const TensorView& q, const TensorView& scale) {
  Status valid = [&]() -> Status {
    LF_RETURN_IF_ERROR(x.CheckValid("x"));
    LF_RETURN_IF_ERROR(x.CheckDType("x", {DType::kBFloat16, DType::kFloat32}));
    LF_RETURN_IF_ERROR(x.CheckContiguous("x"));
    if (x.ndim() != 2) {
      return InvalidArgumentError("tensor 'x' must be 2-d [rows, cols], got " +
                                  std::to_string(x.ndim()) + " dimensions");
    }
    LF_RETURN_IF_ERROR(q.CheckValid("q"));
    LF_RETURN_IF_ERROR(q.CheckDType("q", DType::kUInt8));
    LF_RETURN_IF_ERROR(q.CheckContiguous("q"));
    LF_RETURN_IF_ERROR(q.CheckNumel("q", x.numel()));
    LF_RETURN_IF_ERROR(q.CheckWritable("q"));
    LF_RETURN_IF_ERROR(SameDevice(q, "q", x));
    LF_RETURN_IF_ERROR(scale.CheckValid("scale"));
    LF_RETURN_IF_ERROR(scale.CheckDType("scale", DType::kFloat32));
    LF_RETURN_IF_ERROR(scale.CheckContiguous("scale"));
    LF_RETURN_IF_ERROR(scale.CheckNumel("scale", x.shape[0]));
    LF_RETURN_IF_ERROR(scale.CheckWritable("scale"));
    return SameDevice(scale, "scale", x);
  }();
  if (!valid.ok()) return valid.WithContext("e4m3 row quantization");
  const int64_t rows = x.shape[0], cols = x.shape[1];
  if (rows == 0) return Status::Ok();
  if (x.device.is_cuda()) {
    return internal::QuantizeRowsE4m3Cuda(x.data, x.dtype, rows, cols, q.data_as<uint8_t>(),
                                          scale.data_as<float>(), x.stream);
  }
  internal::QuantizeRowsE4m3Cpu(x.data, x.dtype, rows, cols, q.data_as<uint8_t>(),
                                scale.data_as<float>());
  return Status::Ok();
}

}  // namespace compute
}  // namespace loongforge
