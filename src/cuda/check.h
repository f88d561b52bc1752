// CUDA_CHECK: every CUDA call and launch in src/cuda goes through it, so that a failure throws
// pathattn::RuntimeError naming the call (or kernel), the CUDA error and the file:line (llm.c's cudaCheck, as an
// exception). Invalid arguments are pathattn::Error, thrown before any CUDA work.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "pathattn/pathattn.h"

namespace pathattn::cuda {

[[noreturn]] inline void cuda_fail(cudaError_t e, const std::string& what, const char* file, int line) {
  throw RuntimeError(std::string("pathattn: CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                     ") in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace pathattn::cuda

#define CUDA_CHECK(call)                                                           \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) ::pathattn::cuda::cuda_fail(e_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: launch-configuration errors surface here, named by the kernel, not at the next call.
#define CUDA_CHECK_LAUNCH(name)                                                                            \
  do {                                                                                                     \
    cudaError_t e_ = cudaGetLastError();                                                                   \
    if (e_ != cudaSuccess) ::pathattn::cuda::cuda_fail(e_, std::string("the launch of ") + (name), __FILE__, __LINE__); \
  } while (0)

namespace pathattn::cuda {

// Makes `device` current for the scope of a call and restores the caller's current device on exit.
struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { (void)cudaSetDevice(prev); }  // unchecked: a destructor may not throw
};

}  // namespace pathattn::cuda
