// Makes a device current for the lifetime of a guard, for entry points that take a device id.
#pragma once

#include <cuda_runtime_api.h>

#include "launch_status.h"

namespace flashcute {

// `device` current until the guard ends (-1: leaves the current one); status() says whether
// switching worked.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0 || cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) return;
    status_ = cuda_status(cudaSetDevice(device), "cudaSetDevice");
    switched_ = status_.ok();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_{};
};

}  // namespace flashcute
