// Measuring device work the way nccl-tests does, once for every benchmark here (chapter 03's and
// 04's allreduces, allreduce_bench.h; chapter 10's kernels):
//
//   1. warm-up calls, untimed for the result but timed to choose how many calls to time
//      (first touches of memory, library set-up, caches and clocks settling)
//   2. the check, outside the timed loop: from known inputs, one call, every element of the
//      result compared with the expected one; the benchmark's `wrong` column
//   3. the timed calls, between two drains of the devices: seconds per call
#pragma once
#include <cstdint>
#include <functional>

#include "device.h"

namespace mgpu {

// How many calls: `warmup` first; then `iters`, or when 0 as many as fill about fill_seconds
// by the warm-up's time per call, clamped to [min_iters, max_iters] (with no warm-up, min_iters).
struct Repeats {
  int warmup = 5;
  int iters = 0;
  double fill_seconds = 0.2;
  int min_iters = 10, max_iters = 10000;
};

struct Measured {
  double seconds_per_call = 0;
  int iters = 0;            // calls timed
  std::int64_t wrong = 0;   // what the check counted (0 without one)
};

// `call` queues one call's work on the devices; `check`, when given, runs once between the
// warm-up and the timed calls and returns the elements it found wrong (it may set its own
// inputs and call `call` itself: the timed calls start from whatever it leaves).
Measured measure(const DeviceSet& devices, const Repeats& repeats, const std::function<void()>& call,
                 const std::function<std::int64_t()>& check = {});

}  // namespace mgpu
