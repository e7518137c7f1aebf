// The public compression entry points (include/loongforge/comm.h): validate the tensors, then run
// the CPU or CUDA kernel of topk_kernels.h on the tensors' device. Every check the kernels rely on
// lives here, so the Python wrappers only shape the API.
#include <string>

#include "comm/topk_kernels.h"
#include "loongforge/comm.h"

namespace loongforge {
namespace comm {
namespace {

constexpr int64_t kMaxElems = int64_t{1} << 31;  // indices are int32

// `t` lives where `anchor` does: both in host memory (CPU or pinned), or on the same CUDA device.
Status CheckSameDevice(const TensorView& t, std::string_view name, const TensorView& anchor,
                       std::string_view anchor_name) {
  if (anchor.device.is_host() ? t.device.is_host() : t.device == anchor.device) {
    return Status::Ok();
  }
  return InvalidArgumentError("tensor '" + std::string(name) + "' is on " + t.device.ToString() +
                              " but tensor '" + std::string(anchor_name) + "' is on " +
                              anchor.device.ToString());
}

// Valid, contiguous, one of the float dtypes the kernels take, on `anchor`'s device.
Status CheckFloatOperand(const TensorView& t, std::string_view name, const TensorView& anchor,
                         std::string_view anchor_name) {
  LF_RETURN_IF_ERROR(t.CheckValid(name));
  LF_RETURN_IF_ERROR(t.CheckDType(name, {DType::kFloat32, DType::kBFloat16}));
  LF_RETURN_IF_ERROR(t.CheckContiguous(name));
  return CheckSameDevice(t, name, anchor, anchor_name);
}

}  // namespace

bool CudaAvailable() { return internal::CudaAvailable(); }

Status TopKErrorFeedback(const TensorView* grad, const TensorView& residual, int64_t k,
                         const TensorView& values, const TensorView& indices, int num_threads) {
  const int64_t n = residual.numel();
  const int64_t kk = k < n ? k : n;
  Status valid = [&]() -> Status {
    LF_RETURN_IF_ERROR(residual.CheckValid("residual"));
    LF_RETURN_IF_ERROR(residual.CheckDType("residual", DType::kFloat32));
    LF_RETURN_IF_ERROR(residual.CheckContiguous("residual"));
    LF_RETURN_IF_ERROR(residual.CheckWritable("residual"));
    if (n >= kMaxElems) {
      return InvalidArgumentError("tensor 'residual' has " + std::to_string(n) +
                                  " elements, beyond int32 indices (split it into buckets)");
    }
    if (k < 0) return InvalidArgumentError("k is negative (" + std::to_string(k) + ")");
    if (grad != nullptr) {
      LF_RETURN_IF_ERROR(CheckFloatOperand(*grad, "grad", residual, "residual"));
      LF_RETURN_IF_ERROR(grad->CheckNumel("grad", n));
    }
    LF_RETURN_IF_ERROR(CheckFloatOperand(values, "values", residual, "residual"));
    LF_RETURN_IF_ERROR(values.CheckNumel("values", kk));
    LF_RETURN_IF_ERROR(values.CheckWritable("values"));
    LF_RETURN_IF_ERROR(indices.CheckValid("indices"));
    LF_RETURN_IF_ERROR(indices.CheckDType("indices", DType::kInt32));
    LF_RETURN_IF_ERROR(indices.CheckContiguous("indices"));
    LF_RETURN_IF_ERROR(CheckSameDevice(indices, "indices", residual, "residual"));
    LF_RETURN_IF_ERROR(indices.CheckNumel("indices", kk));
    return indices.CheckWritable("indices");
  }();
  if (!valid.ok()) return valid.WithContext("top-k");

  const void* g = grad != nullptr ? grad->data : nullptr;
  const DType gt = grad != nullptr ? grad->dtype : DType::kFloat32;
  if (residual.device.is_cuda()) {
    return internal::TopKErrorFeedbackCuda(g, gt, residual.data_as<float>(), n, kk, values.data,
                                           values.dtype, indices.data_as<int32_t>(),
                                           residual.stream);
  }
  return internal::TopKErrorFeedbackCpu(g, gt, residual.data_as<float>(), n, kk, values.data,
                                        values.dtype, indices.data_as<int32_t>(), num_threads);
}

Status ScatterAdd(const TensorView& values, const TensorView& indices, int64_t num_segments,
                  const TensorView& dense, float scale, bool zero_dense_first, int num_threads) {
  const int64_t total = values.numel();
  Status valid = [&]() -> Status {
    LF_RETURN_IF_ERROR(dense.CheckValid("dense"));
    LF_RETURN_IF_ERROR(dense.CheckDType("dense", {DType::kFloat32, DType::kBFloat16}));
    LF_RETURN_IF_ERROR(dense.CheckContiguous("dense"));
    LF_RETURN_IF_ERROR(dense.CheckWritable("dense"));
    LF_RETURN_IF_ERROR(CheckFloatOperand(values, "values", dense, "dense"));
    LF_RETURN_IF_ERROR(indices.CheckValid("indices"));
    LF_RETURN_IF_ERROR(indices.CheckDType("indices", DType::kInt32));
    LF_RETURN_IF_ERROR(indices.CheckContiguous("indices"));
    LF_RETURN_IF_ERROR(CheckSameDevice(indices, "indices", dense, "dense"));
    LF_RETURN_IF_ERROR(indices.CheckNumel("indices", total));
    if (num_segments <= 0 || total % num_segments != 0) {
      return InvalidArgumentError(std::to_string(total) + " values do not split into " +
                                  std::to_string(num_segments) + " segments");
    }
    return Status::Ok();
  }();
  if (!valid.ok()) return valid.WithContext("scatter-add");

  const int64_t n = dense.numel();
  const int64_t len = total / num_segments;
  if (dense.device.is_cuda()) {
    return internal::ScatterAddCuda(values.data, values.dtype, indices.data_as<int32_t>(),
                                    num_segments, len, dense.data, dense.dtype, n, scale,
                                    zero_dense_first, dense.stream);
  }
  return internal::ScatterAddCpu(values.data, values.dtype, indices.data_as<int32_t>(),
                                 num_segments, len, dense.data, dense.dtype, n, scale,
                                 zero_dense_first, num_threads);
}

}  // namespace comm
}  // namespace loongforge
