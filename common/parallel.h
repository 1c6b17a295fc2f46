// How a kernel is queued on a device. Include this only from files built as device code (.cu
// files, or sources listed in mgpu_device_sources): they are compiled by nvcc in the cuda build
// and by the host compiler in the cpu build.
//
//   cuda: a Thrust algorithm on the device's stream, without the synchronization Thrust
//         would otherwise add after each algorithm (we synchronize when we need a result)
//   cpu:  the same algorithm, queued on the device's stream (common/cpu_stream.h), run by the
//         device's worker on OpenMP threads over host memory
#pragma once
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <typeinfo>

#include "device.h"
#include "profile.h"
#if MGPU_CUDA
#include <thrust/system/cuda/execution_policy.h>
#else
#include <thrust/system/omp/execution_policy.h>

#include "cpu_stream.h"
#endif

namespace mgpu {

// The two mappings for_each_span chooses between (below).
template <class F>
struct SpanElement {  // item i * span + j -> element j of row i
  F f;
  int span;
  MGPU_HD void operator()(std::int64_t i) const {
    const std::int64_t item = i / span;
    const int j = static_cast<int>(i - item * span);
    f(item, j, j + 1);
  }
};
template <class F>
struct SpanWhole {  // item i -> all of row i
  F f;
  int span;
  MGPU_HD void operator()(std::int64_t item) const { f(item, 0, span); }
};

// Calls f(i) for i = 0..n-1 on device d: the loop every kernel in this repository is. Queued
// on d's stream; the call returns at once. f is copied, as CUDA copies a kernel's arguments:
// it holds pointers to d's memory and sizes, never references to the caller's variables.
// `bytes` (read and written, if the caller counts them) only feeds a KernelProfile's GB/s.
template <class F>
void for_each_index(const Device& d, std::int64_t n, F f, double bytes = 0) {
  if (n <= 0) return;
  KernelProfile* profile = KernelProfile::of(d);  // almost always nullptr
  const int call = profile ? profile->begin(kernel_name_of(typeid(F).name()), 0, bytes) : -1;
#if MGPU_CUDA
  activate(d);
  thrust::for_each_n(thrust::cuda::par_nosync.on(d.stream), thrust::counting_iterator<std::int64_t>(0), n, f);
  if (profile) profile->end(call);
#else  // OpenMP threads: the device's share of cores, or one lane's thread (for_each_lane)
  cpu::stream_of(d).submit([n, f, profile, call] {
    run_timed(profile, call,
              [&] { thrust::for_each_n(thrust::omp::par, thrust::counting_iterator<std::int64_t>(0), n, f); });
  });
#endif
}

// Calls f(item, begin, end) so that, together, the calls cover elements [0, span) of every
// item = 0..items-1: a kernel whose output is `items` rows of `span` contiguous elements
// (image planes, matrix rows). f computes elements [begin, end) of its item's row.
//
// THIS is where a work item's size differs between the backends, and the only place:
//   cuda: one thread per element, f(item, j, j + 1). Thread t writes element t of the output,
//         so neighbouring threads touch neighbouring addresses (a warp's 32 stores coalesce
//         into a few transactions) and items * span threads are enough to fill every SM.
//   cpu:  one call per item, f(item, 0, span). A core walks the whole row with contiguous,
//         vectorizable inner loops and computes the item's indices once, not per element.
// The functor is the same for both; only the partition of [0, items * span) changes.
// (A cpu build with MGPU_GPU_MAPPING takes the GPU's cut, to test it: common/backend.h.)
template <class F>
void for_each_span(const Device& d, std::int64_t items, int span, F f, double bytes = 0) {
  if (items <= 0 || span <= 0) return;
  if constexpr (kGpuMapping)
    for_each_index(d, items * span, SpanElement<F>{f, span}, bytes);
  else
    for_each_index(d, items, SpanWhole<F>{f, span}, bytes);
}

// Inside a for_each_span functor whose item is a row-major plane `width` elements wide: calls
// g(row, x0, x1) for each row segment of the plane's elements [begin, end), i.e. elements
// x0..x1-1 of row `row`. One division, then whole rows: a CPU core gets contiguous inner loops,
// a GPU thread (begin + 1 == end) one element.
template <class G>
MGPU_HD void for_each_row_segment(int begin, int end, int width, G g) {
  int row = begin / width, x0 = begin - row * width;
  while (begin < end) {
    const int x1 = x0 + (end - begin) < width ? x0 + (end - begin) : width;
    g(row, x0, x1);
    begin += x1 - x0;
    ++row, x0 = 0;
  }
}

// Calls f(lane) for lane = 0..lanes-1 (at most lanes_per_device(d)), to queue each lane's work
// on d; the lanes then run at once. A GPU has one lane. In the cpu build each lane runs on one
// OpenMP thread of d's worker, where Thrust's OpenMP loops and OpenBLAS see that they are
// already in a parallel region and run on that lane's thread alone. f runs on the host and may
// only queue kernels and copies on d (no events, no downloads: cpu_stream.h's run_lanes).
// An exception thrown while a lane runs is reported by d's next synchronize.
template <class F>
void for_each_lane(const Device& d, int lanes, F f) {
  if (lanes == 1) {  // the work goes straight into d's queue
    f(0);
    return;
  }
#if MGPU_CUDA
  for (int lane = 0; lane < lanes; ++lane) f(lane);  // one stream: the lanes' kernels queue in turn
#else
  cpu::run_lanes(cpu::stream_of(d), lanes, f);
#endif
}

}  // namespace mgpu
