// Stands in for cufile_writer.cc in builds without cuFile (CMake picks one of the two):
// writer=cufile is refused with the reason, and writer=auto falls back to the POSIX writer.
#include "ckpt/chunk_sink.h"

namespace loongforge {
namespace ckpt {
namespace internal {

bool CufileCompiled() { return false; }
StatusOr<std::unique_ptr<CufileSession>> OpenCufileSession() {
  return UnimplementedError(
      "cufile: not built (cufile.h / libcufile were not found when this build was configured)");
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
