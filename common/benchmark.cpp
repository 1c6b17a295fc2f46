#include "benchmark.h"

#include <algorithm>

#include "timer.h"

namespace mgpu {

Measured measure(const DeviceSet& devices, const Repeats& repeats, const std::function<void()>& call,
                 const std::function<std::int64_t()>& check) {
  SyncTimer timer(devices);
  timer.start();
  for (int i = 0; i < repeats.warmup; ++i) call();
  const double warmup_seconds = timer.stop_seconds();

  Measured m;
  if (check) m.wrong = check();

  m.iters = repeats.iters;
  if (m.iters == 0) {
    const double per_call = repeats.warmup > 0 ? warmup_seconds / repeats.warmup : 0;
    m.iters = repeats.warmup > 0 ? static_cast<int>(std::clamp(repeats.fill_seconds / std::max(per_call, 1e-9),
                                                               double(repeats.min_iters), double(repeats.max_iters)))
                                 : repeats.min_iters;
  }
  timer.start();
  for (int i = 0; i < m.iters; ++i) call();
  m.seconds_per_call = timer.stop_seconds() / m.iters;
  return m;
}

}  // namespace mgpu
