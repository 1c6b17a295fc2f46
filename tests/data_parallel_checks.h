// What the suites of chapters 02-04 share: an allreduce checked element by element, and a
// few training steps on random data with any allreduce.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "../chapters/02_data_parallel/data_parallel.h"
#include "helpers.h"

namespace testing {

// Runs an allreduce of n floats: data[i] lives on devices[i].
using AllreduceRun = std::function<void(const mgpu::DeviceSet& devices, const std::vector<float*>& data, mgpu::Elements n)>;

// k devices start from random inputs (drawn from `seed`); after run(), every element of every
// device must be the sum over devices, computed in double, to 1e-5 relative.
inline void check_allreduce_sums(int k, std::size_t n, std::uint64_t seed, const AllreduceRun& run) {
  CAPTURE(k);
  CAPTURE(n);
  mgpu::DeviceSet devices(k);
  mgpu::Rng rng(seed);
  std::vector<double> sum(n, 0.0);
  std::vector<mgpu::Buffer<float>> buffers;
  std::vector<float*> data;
  for (int i = 0; i < k; ++i) {
    const std::vector<float> host = random_floats(n, rng);
    for (std::size_t j = 0; j < n; ++j) sum[j] += host[j];
    buffers.emplace_back(devices[i], n);
    buffers.back().upload(host);
    data.push_back(buffers.back().data());
  }
  run(devices, data, mgpu::Elements{n});
  devices.synchronize();
  for (int i = 0; i < k; ++i) {
    CAPTURE(i);
    const std::vector<float> got = buffers[i].download();
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < n; ++j)
      if (!(std::abs(got[j] - sum[j]) <= 1e-5 * (1 + std::abs(sum[j])))) ++wrong;  // a NaN is wrong too
    CHECK(wrong == 0);
  }
}

// `steps` steps of `batch` examples, taken in turn from `set`, on every device of `devices`,
// from init_params(7, 0.1), gradients summed by `allreduce`: every replica's final parameters.
inline std::vector<lenet::HostParams> train_steps(const mgpu::DeviceSet& devices, dp::GradientAllreduce& allreduce,
                                                  const mgpu::LabeledImages& set, int batch, int steps, float lr) {
  const int k = devices.size();
  std::vector<dp::Replica> replicas;
  replicas.reserve(k);
  for (int i = 0; i < k; ++i)
    replicas.emplace_back(devices[i], lenet::init_params(7, 0.1f), dp::shard_sizes(batch, k)[0], allreduce.layout());
  for (int s = 0; s < steps; ++s)
    dp::train_batch(set.pixels.data() + std::size_t(s) * batch * 28 * 28, set.labels.data() + std::size_t(s) * batch,
                    batch, replicas, allreduce, lr);
  std::vector<lenet::HostParams> out;
  for (dp::Replica& r : replicas) out.push_back(r.params.download());
  return out;
}

}  // namespace testing
