// Where a device's Thrust algorithms run. Include this only from .cu files: they are
// compiled by nvcc in the cuda build and by the host compiler in the cpu build.
//
//   cuda: the device's stream, without the synchronization Thrust would otherwise add
//         after each algorithm (we synchronize when we need a result, not before)
//   cpu:  OpenMP threads over host memory
#pragma once
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>

#include "device.h"
#if MGPU_CUDA
#include <thrust/system/cuda/execution_policy.h>
#else
#include <thrust/system/omp/execution_policy.h>
#endif

namespace mgpu {

inline auto policy(const Device& d) {
  activate(d);
#if MGPU_CUDA
  return thrust::cuda::par_nosync.on(d.stream);
#else
  (void)d;
  return thrust::omp::par;
#endif
}

// Calls f(i) for i = 0..n-1 on device d: the loop every kernel in this repository is.
template <class F>
void for_each_index(const Device& d, std::int64_t n, F f) {
  if (n <= 0) return;
  thrust::for_each_n(policy(d), thrust::counting_iterator<std::int64_t>(0), n, f);
}

}  // namespace mgpu
