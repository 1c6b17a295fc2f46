// Chapter 02's DataParallel-style trainer (nn_data_parallel.h): k devices compute what one device
// computes, and every byte it moves between devices is the one its header's formula says.
#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "../chapters/02_data_parallel/nn_data_parallel.h"
#include "common/random.h"
#include "data_parallel_checks.h"
#include "helpers.h"

namespace {

constexpr std::size_t kF = 129216;  // lenet::flat_count(): the parameters and the Flat layout's padding

// A DataParallel trainer on k devices for batches of `batch`, with `set` on device 0 in its
// own order (0, 1, 2, ...).
struct Setup {
  Setup(int k, const mgpu::LabeledImages& set, int batch)
      : devices(k), trainer(devices, lenet::init_params(7, 0.1f), batch), data(devices[0], set) {
    std::vector<int> identity(set.count);
    for (int i = 0; i < set.count; ++i) identity[i] = i;
    data.order.upload(identity);
  }
  mgpu::DeviceSet devices;
  dp::DataParallel trainer;
  mgpu::DeviceData data;
};

// The header's formulas, written out: bytes moved by a step of n on k devices, and device 0's
// extra bytes for batches of up to b.
std::size_t bytes_per_step(int n, int k) {
  const std::size_t rest = n - mgpu::shard_sizes(n, k)[0];  // examples not on device 0
  return 4 * (2 * (k - 1) * kF + rest * (28 * 28 + 10 + 10));
}
std::size_t device0_extra(int b, int k) {
  const std::size_t rest = b - mgpu::shard_sizes(b, k)[0];
  return 4 * (rest * (28 * 28 + 1) + 2 * 10 * b + 2 * b + b + 2 + (k > 1 ? kF : 0));
}

}  // namespace

TEST_CASE("DataParallel: 3 steps on k = 1, 2 and 3 devices give the parameters of 3 steps on 1 device") {
  // Batch 13 does not divide by 2 or 3: the uneven split is exercised. Batch 37 gives every
  // shard several chunks on the cpu backend (8 images each), and lanes where a device has cores.
  for (int batch : {13, 37}) {
    CAPTURE(batch);
    mgpu::Rng rng(2024 + batch);
    const int steps = 3;
    const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
    mgpu::DeviceSet one_device(1);
    dp::Allreduce allreduce(one_device, dp::largest_gradient_sum(lenet::Layout::PerTensor));
    const lenet::HostParams want =
        testing::train_steps(one_device, allreduce, lenet::Layout::PerTensor, set, batch, steps, 0.5f)[0];
    const lenet::HostParams init = lenet::init_params(7, 0.1f);
    for (int k : {1, 2, 3}) {
      CAPTURE(k);
      Setup s(k, set, batch);
      for (int step = 0; step < steps; ++step) s.trainer.step(s.data, step * batch, batch, 0.5f);
      testing::check_same_training(s.trainer.master().download(), want, init, "device 0, k = " + std::to_string(k));
    }
  }
}

TEST_CASE("DataParallel: the bytes moved per step and device 0's extra memory are the header's formulas") {
  CHECK(static_cast<std::size_t>(lenet::flat_count()) == kF);
  // By hand, for the chapter's batch of 256 on 2 devices: 2 F floats of parameters and gradients,
  // and 128 images, 128 x 10 logits and 128 x 10 dlogits of device 1's shard.
  CHECK(bytes_per_step(256, 2) == 4 * (2 * kF + 128 * 784 + 128 * 20));
  CHECK(bytes_per_step(256, 1) == 0);
  mgpu::Rng rng(7);
  const int batch = 13;
  const mgpu::LabeledImages set = testing::random_set(2 * batch, rng);
  for (int k = 1; k <= 4; ++k) {
    CAPTURE(k);
    Setup s(k, set, batch);
    CHECK(s.trainer.device0_extra_bytes() == device0_extra(batch, k));
    s.trainer.step(s.data, 0, batch, 0.1f);  // a whole batch
    CHECK(s.trainer.step_bytes() == bytes_per_step(batch, k));
    s.trainer.step(s.data, batch, 9, 0.1f);  // a short last batch: the shards shrink, F does not
    CHECK(s.trainer.step_bytes() == bytes_per_step(9, k));
  }
}

TEST_CASE("DataParallel: a batch larger than its buffers, or beyond the data, is refused") {
  mgpu::Rng rng(3);
  Setup s(2, testing::random_set(20, rng), 8);
  CHECK_THROWS_WITH_AS(s.trainer.step(s.data, 0, 9, 0.1f), doctest::Contains("exceeds the 8 it was made for"),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(s.trainer.step(s.data, 16, 8, 0.1f), doctest::Contains("run past the 20 examples"),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(s.trainer.step(s.data, 0, 1, 0.1f), doctest::Contains("cannot be split across 2 devices"),
                       mgpu::Error);
}
