// RestoreTarget from the core's TensorView (include/loongforge/ckpt.h). A TensorRef holds its
// view as is; Save() checks it (CheckTensors in snapshot.cc).
#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {

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
