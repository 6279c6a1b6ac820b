// CUDA status checks for the backend's host code: a failed call throws tern::Error naming the call and
// CUDA's message. Host code only (includes the runtime API header).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace tern::cuda {

inline void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorName(code), " (", cudaGetErrorString(code), ")");
}

// After a kernel launch: a bad configuration or an earlier asynchronous fault surfaces here.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

}  // namespace tern::cuda

#define TERN_CUDA(call) ::tern::cuda::check_cuda((call), #call)
