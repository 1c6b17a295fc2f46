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

// Whether the kernels cut their work as a GPU wants it: one call per output element in
// for_each_span (common/parallel.h), the whole batch at once, many slices per channel sum.
// Always so in the cuda build. A cpu build configured with -DMGPU_GPU_MAPPING=ON cuts it the
// same way on its cores: slower, but it runs the very index arithmetic a GPU runs, under the
// sanitizers too (CMake preset gpu-mapping), where no GPU is.
#ifndef MGPU_GPU_MAPPING
#define MGPU_GPU_MAPPING MGPU_CUDA
#endif

namespace mgpu {
inline constexpr bool kCudaBackend = MGPU_CUDA != 0;
inline constexpr const char* kBackendName = MGPU_CUDA ? "cuda" : "cpu";
inline constexpr bool kGpuMapping = MGPU_GPU_MAPPING != 0;
// The exit status of a program or test suite that cannot run in this build or on this machine
// (NCCL in a cpu build; a GPU suite where no GPU answers). 77 is the usual "skipped" code:
// ctest reports it as skipped (SKIP_RETURN_CODE), never as passed.
inline constexpr int kExitNotApplicable = 77;
}  // namespace mgpu
