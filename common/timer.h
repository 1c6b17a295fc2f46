// Wall-clock timing of device work. Device work is asynchronous, so the clock is read
// only after every device has finished what was queued (d2l calls torch.cuda.synchronize()).
#pragma once
#include <chrono>

#include "device.h"

namespace mgpu {

// Now, in seconds on the host's steady clock: the clock Timestamp (device.h) reports in, so that
// host and device times can be drawn on one timeline.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class SyncTimer {
 public:
  explicit SyncTimer(const DeviceSet& devices) : devices_(devices) {}
  void start() {
    devices_.synchronize();
    begin_ = std::chrono::steady_clock::now();
  }
  double stop_seconds() {  // seconds since start(), with the devices drained
    devices_.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  }

 private:
  const DeviceSet& devices_;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace mgpu
