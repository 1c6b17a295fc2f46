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
#include <exception>
#include <vector>

#include "device.h"
#if MGPU_CUDA
#include <thrust/system/cuda/execution_policy.h>
#else
#include <omp.h>
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

// How many independent lanes of work one device runs at once: one per core on a CPU, where
// each core works through its own chunks of a batch (see lenet::Lanes); one on a GPU, whose
// parallelism is inside each kernel.
inline int lanes_per_device() {
#if MGPU_CUDA
  return 1;
#else
  return omp_get_max_threads();
#endif
}

// Calls f(lane) for lane = 0..lanes-1, on one OpenMP thread each in the cpu build. Inside a
// lane, Thrust's OpenMP loops and OpenBLAS see that they are already in a parallel region and
// run on that lane's thread alone. An exception thrown in a lane is re-thrown here, after
// all lanes have finished (it must not escape an OpenMP region).
template <class F>
void for_each_lane(int lanes, F f) {
  std::vector<std::exception_ptr> errors(lanes);
#if !MGPU_CUDA
#pragma omp parallel for schedule(static, 1) num_threads(lanes)
#endif
  for (int lane = 0; lane < lanes; ++lane) {
    try {
      f(lane);
    } catch (...) {
      errors[lane] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace mgpu
