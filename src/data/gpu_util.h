// Small CUDA helpers of the GPU loader: waits with a timeout (every wait has one).
#pragma once

#ifdef LOONGFORGE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/cuda_check.h"
#include "loongforge/status.h"

namespace loongforge {
namespace data {
namespace internal {

// Waits until `event` has completed (or was never recorded), polling so that the wait can time
// out: DeadlineExceeded naming `what` after `timeout_ms`, or the CUDA error the event reports.
inline Status WaitEvent(cudaEvent_t event, int64_t timeout_ms, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int spins = 0;
  for (;;) {
    cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady)
      return ::loongforge::internal::CudaErrorToStatus(e, what.c_str(), __FILE__, __LINE__);
    if (std::chrono::steady_clock::now() > deadline)
      return DeadlineExceededError(what + ": GPU work did not finish within " +
                                   std::to_string(timeout_ms) + " ms");
    // Short spins first (batches finish in milliseconds), then sleep to leave the core alone.
    if (++spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge

#endif  // LOONGFORGE_WITH_CUDA
