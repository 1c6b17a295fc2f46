// Checked calls. Every CUDA and cuBLAS call goes through one of these macros, so a
// failure names the call, the file and line, and the library's own error string:
//   CUDA error: cudaMalloc(&p, bytes) at common/device_cuda.cpp:124: out of memory (cudaErrorMemoryAllocation)
// Failures throw mgpu::Error; each program's main() prints it and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

#include "backend.h"
#if MGPU_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace mgpu {

// Every error this repository reports on purpose (bad data, failed library calls).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "common/device_cuda.cpp" rather than the absolute path the compiler was given.
std::string short_path(const char* file);

#if MGPU_CUDA
void check_cuda(cudaError_t status, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
#endif

}  // namespace mgpu

#define MGPU_CHECK_CUDA(call) ::mgpu::check_cuda((call), #call, __FILE__, __LINE__)
#define MGPU_CHECK_CUBLAS(call) ::mgpu::check_cublas((call), #call, __FILE__, __LINE__)
