// What the suites of chapters 02-04 share: an allreduce checked element by element, and a
// few training steps on random data with any allreduce.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "../chapters/02_data_parallel/data_parallel.h"
#include "common/vector_ops.h"
#include "helpers.h"

namespace testing {

// Runs an allreduce of n floats: data[i] lives on the check's devices[i].
using AllreduceRun = std::function<void(const std::vector<float*>& data, mgpu::Elements n)>;
// Makes the allreduce under test for `devices`, once: it then runs round after round, as in
// training, without being remade (a destructor that synchronizes would hide a missing wait).
using MakeAllreduce = std::function<AllreduceRun(const mgpu::DeviceSet& devices)>;

// k devices start from random inputs (drawn from `seed`); after run(), every element of every
// device must be the sum over devices, computed in double, to 1e-5 relative. Returns how many
// elements were wrong, over all devices and rounds (a NaN is wrong too).
//
// The inputs are made, and the sums used, by work queued on the devices with no host wait in
// between, as in a training step: each device copies its input into place (the backward pass
// that makes the gradient), run() queues the allreduce, and each device at once copies its sum
// away and overwrites its buffer with NaN (the next step zeroes its gradients). An allreduce
// that leaves out an event wait then reads a gradient before it is made, or a sum after it is
// overwritten: on the cpu backend's concurrent devices, and more surely under chaos mode
// (MGPU_CHAOS), that shows up here as wrong elements. Each of `rounds` rounds is another chance.
inline std::size_t count_wrong_sums(int k, std::size_t n, std::uint64_t seed, const MakeAllreduce& make,
                                    int rounds = 3) {
  mgpu::DeviceSet devices(k);
  mgpu::Rng rng(seed);
  std::vector<double> sum(n, 0.0);
  std::vector<mgpu::Buffer<float>> inputs, buffers, sums;
  std::vector<float*> data;
  for (int i = 0; i < k; ++i) {
    const std::vector<float> host = random_floats(n, rng);
    for (std::size_t j = 0; j < n; ++j) sum[j] += host[j];
    inputs.emplace_back(devices[i], n);
    inputs.back().upload(host);
    buffers.emplace_back(devices[i], n);
    sums.emplace_back(devices[i], n);
    data.push_back(buffers.back().data());
  }
  const mgpu::Elements count{n};
  const AllreduceRun run = make(devices);  // destroyed before the buffers and devices
  std::size_t wrong = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int i = 0; i < k; ++i) mgpu::copy_peer(devices[i], data[i], devices[i], inputs[i].data(), count);
    run(data, count);
    for (int i = 0; i < k; ++i) {
      mgpu::copy_peer(devices[i], sums[i].data(), devices[i], data[i], count);
      mgpu::fill(devices[i], data[i], static_cast<std::int64_t>(n), std::nanf(""));
    }
    for (int i = 0; i < k; ++i) {
      const std::vector<float> got = sums[i].download();
      for (std::size_t j = 0; j < n; ++j)
        if (!(std::abs(got[j] - sum[j]) <= 1e-5 * (1 + std::abs(sum[j])))) ++wrong;
    }
  }
  return wrong;
}

inline void check_allreduce_sums(int k, std::size_t n, std::uint64_t seed, const MakeAllreduce& make) {
  CAPTURE(k);
  CAPTURE(n);
  CHECK(count_wrong_sums(k, n, seed, make) == 0);
}

// `steps` steps of `batch` examples, taken in turn from `set`, on every device of `devices`,
// from init_params(7, 0.1), gradients (stored as `layout` says) summed by `allreduce`: every
// replica's final parameters.
inline std::vector<lenet::HostParams> train_steps(const mgpu::DeviceSet& devices, mgpu::Collective& allreduce,
                                                  lenet::Layout layout, const mgpu::LabeledImages& set, int batch,
                                                  int steps, float lr) {
  const int k = devices.size();
  std::vector<dp::Replica> replicas;
  replicas.reserve(k);
  for (int i = 0; i < k; ++i)
    replicas.emplace_back(devices[i], lenet::init_params(7, 0.1f), mgpu::shard_sizes(batch, k)[0], layout);
  std::vector<mgpu::DeviceData> data = mgpu::put_on_every_device(devices, set);  // order: 0, 1, 2, ...
  for (int s = 0; s < steps; ++s) dp::train_batch(data, s * batch, batch, replicas, allreduce, lr);
  std::vector<lenet::HostParams> out;
  for (dp::Replica& r : replicas) out.push_back(r.params.download());
  return out;
}

}  // namespace testing
