// Building Status values on the host: formatted messages and CUDA errors.
#pragma once

#include <cstdio>

#include <cuda_runtime_api.h>

#include "flashcute/flashcute.h"

namespace flashcute {

template <class... Args>
Status make_status(StatusCode code, const char* format, Args... args) {
  Status status;
  status.code = code;
  if constexpr (sizeof...(Args) == 0) {
    std::snprintf(status.message, sizeof(status.message), "%s", format);
  } else {
    std::snprintf(status.message, sizeof(status.message), format, args...);
  }
  return status;
}

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status{};
  const StatusCode code = (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
                              ? StatusCode::kNoDevice
                              : StatusCode::kCudaError;
  return make_status(code, "%s failed: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace flashcute
