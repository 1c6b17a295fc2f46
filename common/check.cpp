#include "check.h"

#include <cstring>

namespace mgpu {

std::string short_path(const char* file) {
  // Keep the part from the first top-level folder of this repository onwards.
  for (const char* dir : {"/common/", "/chapters/", "/tests/"}) {
    if (const char* at = std::strstr(file, dir)) return at + 1;
  }
  return file;
}

#if MGPU_CUDA
void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw Error("CUDA error: " + std::string(call) + " at " + short_path(file) + ":" +
              std::to_string(line) + ": " + cudaGetErrorString(status) + " (" +
              cudaGetErrorName(status) + ")");
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error("cuBLAS error: " + std::string(call) + " at " + short_path(file) + ":" +
              std::to_string(line) + ": " + cublasGetStatusString(status) + " (" +
              cublasGetStatusName(status) + ")");
}
#endif

}  // namespace mgpu
