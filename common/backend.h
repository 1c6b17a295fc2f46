// The one place that says which backend this build is, and the macro that lets a
// functor be compiled for both: nvcc needs __host__ __device__, a plain C++ compiler
// does not know those words (CCCL's headers do not define them outside nvcc).
#pragma once

#ifndef MGPU_CUDA
#error "MGPU_CUDA must be defined (0 or 1) by the build"
#endif

#if defined(__CUDACC__)
#define MGPU_HD __host__ __device__
#else
#define MGPU_HD
#endif

namespace mgpu {
inline constexpr bool kCudaBackend = MGPU_CUDA != 0;
inline constexpr const char* kBackendName = MGPU_CUDA ? "cuda" : "cpu";
// The exit status of a program or test suite that cannot run in this build or on this machine
// (NCCL in a cpu build; a GPU suite where no GPU answers). 77 is the usual "skipped" code:
// ctest reports it as skipped (SKIP_RETURN_CODE), never as passed.
inline constexpr int kExitNotApplicable = 77;
}  // namespace mgpu
