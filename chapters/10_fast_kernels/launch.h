// How this chapter's raw kernels are launched, in the cuda build: the grid that covers a count,
// a thread's index in it, and a launch checked and timed by chapter 09's --profile. Included by
// the .cu files that hold `__global__` functions (kernels.cu, implicit_gemm.cu); empty in the
// cpu build, whose launchers call mgpu::for_each_index instead.
#pragma once
#include "common/backend.h"  // MGPU_CUDA

#if MGPU_CUDA
#include "common/check.h"
#include "common/device.h"
#include "common/profile.h"
#include "kernels.h"  // kThreads

namespace fast {

// Blocks of `per_block` that cover `count` (threads, or a tile's rows): count < 2^31, so fewer
// than 2^23 blocks of kThreads, far below the grid's limit of 2^31 - 1.
inline unsigned blocks_for(int count, int per_block = kThreads) {
  return static_cast<unsigned>((count + per_block - 1) / per_block);
}

// The index of this thread in a one-dimensional grid: block b's threads take b*kThreads onwards.
// In 32 bits: blockIdx.x * blockDim.x < 2^31 for every grid here.
__device__ inline int global_index() { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }

// Runs launch() (one `kernel<<<...>>>` on d's stream), checks that the launch was accepted, and
// times it as `name` when a KernelProfile is timing d (common/profile.h: events around it), as
// for_each_index times the functors: the profile's table then shows raw and reference side by side.
template <class Launch>
void launch_timed(const Device& d, const char* name, double bytes, Launch launch) {
  mgpu::KernelProfile* profile = mgpu::KernelProfile::of(d);
  const int call = profile ? profile->begin(name, 0, bytes) : -1;
  mgpu::activate(d);
  launch();
  MGPU_CHECK_CUDA(cudaGetLastError());
  if (profile) profile->end(call);
}

}  // namespace fast
#endif
