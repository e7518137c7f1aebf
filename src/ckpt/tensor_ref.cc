// TensorRef / RestoreTarget from the core's TensorView (include/loongforge/ckpt.h).
#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {

StatusOr<TensorRef> TensorRef::FromView(std::string name, const TensorView& view) {
  LF_RETURN_IF_ERROR(view.CheckValid(name));
  LF_RETURN_IF_ERROR(view.CheckContiguous(name));
  TensorRef r;
  r.dtype = view.dtype;
  r.shape = view.shape;
  r.data = view.data;
  r.device = view.device.is_cuda() ? view.device.index : -1;
  r.stream = view.device.is_cuda() ? view.stream : nullptr;
  r.name = std::move(name);
  return r;
}

StatusOr<RestoreTarget> RestoreTarget::FromView(const std::string& name, const TensorView& view) {
  LF_RETURN_IF_ERROR(view.CheckValid(name));
  LF_RETURN_IF_ERROR(view.CheckContiguous(name));
  LF_RETURN_IF_ERROR(view.CheckWritable(name));
  RestoreTarget t;
  t.data = view.data;
  t.nbytes = view.nbytes();
  t.device = view.device.is_cuda() ? view.device.index : -1;
  return t;
}

}  // namespace ckpt
}  // namespace loongforge
