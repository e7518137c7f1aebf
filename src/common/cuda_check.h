// All CUDA error checking in one header. Include only from CUDA-enabled sources.
//
//   LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));   // returns a Status with file:line, clears the
//                                                    // sticky error
//   LF_CUDA_CHECK_LAUNCH();                          // after every kernel launch; with
//                                                    // LOONGFORGE_CUDA_SYNC=1 it also synchronizes
//   LF_CUDA_WARN_IF_ERROR(cudaFree(p));              // for destructors: logs, never throws/aborts
#pragma once

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "loongforge/env_knobs.h"  // LOONGFORGE_CUDA_SYNC
#include "loongforge/logging.h"
#include "loongforge/status.h"

namespace loongforge {
namespace internal {

inline Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear the error so later calls are not poisoned by it
  std::string msg = std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return UnavailableError(msg);
  if (err == cudaErrorInvalidValue) return InvalidArgumentError(msg);
  return InternalError(msg);
}

// True when a CUDA device is usable (tests GTEST_SKIP otherwise); clears the error it may leave.
inline bool CudaDevicePresent() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

inline bool CudaSyncAfterLaunch() {
  static const bool v = EnvBool("LOONGFORGE_CUDA_SYNC");
  return v;
}

}  // namespace internal
}  // namespace loongforge

#define LF_CUDA_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                      \
    cudaError_t _lf_err = (expr);                                                           \
    if (_lf_err != cudaSuccess)                                                             \
      return ::loongforge::internal::CudaErrorToStatus(_lf_err, #expr, __FILE__, __LINE__); \
  } while (0)

#define LF_CUDA_CHECK_LAUNCH()                                                             \
  do {                                                                                     \
    cudaError_t _lf_err = cudaGetLastError();                                              \
    if (_lf_err == cudaSuccess && ::loongforge::internal::CudaSyncAfterLaunch())           \
      _lf_err = cudaDeviceSynchronize();                                                   \
    if (_lf_err != cudaSuccess)                                                            \
      return ::loongforge::internal::CudaErrorToStatus(_lf_err, "kernel launch", __FILE__, \
                                                       __LINE__);                          \
  } while (0)

#define LF_CUDA_WARN_IF_ERROR(expr)                                           \
  do {                                                                        \
    cudaError_t _lf_err = (expr);                                             \
    if (_lf_err != cudaSuccess) {                                             \
      cudaGetLastError();                                                     \
      LF_LOG(WARNING) << #expr << " failed: " << cudaGetErrorString(_lf_err); \
    }                                                                         \
  } while (0)

#endif  // LOONGFORGE_WITH_CUDA
