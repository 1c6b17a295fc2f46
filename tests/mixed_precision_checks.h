// What chapter 06's suite and its hidden cases share: k devices holding one random training
// set, and a collective (chapter 03's ring) that counts its calls and can make one device look
// as if it alone had overflowed.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../chapters/02_data_parallel/data_parallel.h"  // largest_gradient_sum
#include "../chapters/03_ring_allreduce/ring.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/device_data.h"
#include "common/random.h"
#include "helpers.h"

namespace testing {

// k devices with the same random training set (drawn from `seed`), the order 0, 1, 2, ...
struct MixedSetup {
  MixedSetup(int k, int examples, std::uint64_t seed = 60) : devices(k) {
    mgpu::Rng rng(seed);
    set = random_set(examples, rng);
    data = mgpu::put_on_every_device(devices, set);
  }
  mgpu::DeviceSet devices;
  mgpu::LabeledImages set;
  std::vector<mgpu::DeviceData> data;
};

// Chapter 03's ring, counting its calls and, when told, putting an inf into one device's
// gradient (at element poison_element) after the sum: a device that alone overflowed.
class CountingRing : public mgpu::Collective {
 public:
  explicit CountingRing(const mgpu::DeviceSet& devices)
      : devices_(devices), ring_(devices, dp::largest_gradient_sum(lenet::Layout::Flat)) {}
  std::string name() const override { return "counting ring"; }
  void run(const mgpu::DeviceBuffers& buffers, mgpu::Elements n) override {
    ++calls;
    ring_.run(buffers, n);
    if (poison_device >= 0) {
      const float inf = std::numeric_limits<float>::infinity();
      mgpu::copy_bytes_to_device(devices_[poison_device], buffers[poison_device] + poison_element, &inf, sizeof inf);
    }
  }
  int calls = 0;
  int poison_device = -1;  // the device whose sum gets an inf; -1: none
  int poison_element = 100;

 private:
  const mgpu::DeviceSet& devices_;
  ring::RingAllreduce ring_;
};

}  // namespace testing
