// What the suites of chapters 02-04 (and the hidden cases) share: an allreduce checked element
// by element, buffers on every device, the shards split_batch gathers checked example by
// example, a reduce-scatter's chunks checked, and a few training steps on random data with any
// allreduce.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../chapters/02_data_parallel/data_parallel.h"
#include "common/allreduce_bench.h"  // bench::input: the inputs whose sums are exact
#include "../chapters/03_ring_allreduce/ring.h"
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

// n floats per device, device i's from host_of(i).
struct OnDevices {
  OnDevices(const mgpu::DeviceSet& devices, std::size_t n, const std::function<std::vector<float>(int)>& host_of) {
    for (int i = 0; i < devices.size(); ++i) {
      buffers.emplace_back(devices[i], n), data.push_back(buffers.back().data());
      buffers.back().upload(host_of(i));
    }
  }
  std::vector<mgpu::Buffer<float>> buffers;
  std::vector<float*> data;
};

// After split_batch put examples order[first ..) of `set` into the replicas' shards, sizes[i]
// of them into replica i's: every shard's images and labels, example by example.
inline void check_shards(const mgpu::LabeledImages& set, const std::vector<int>& order, int first,
                         const std::vector<int>& sizes, std::vector<dp::Replica>& replicas) {
  constexpr int kPixels = mgpu::kImagePixels;
  int start = first;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    const std::vector<float> x = replicas[i].shard.x.download();
    const std::vector<std::int32_t> y = replicas[i].shard.y.download();
    for (int j = 0; j < sizes[i]; ++j) {
      const int example = order[start + j];
      const auto image = set.pixels.begin() + std::size_t(example) * kPixels;
      CHECK(std::equal(image, image + kPixels, x.begin() + std::size_t(j) * kPixels));
      CHECK(y[j] == set.labels[example]);
    }
    start += sizes[i];
  }
}

// After a ring's reduce-scatter of n floats over k devices: device i's chunk (i + 1) mod k
// (mgpu::chunk_of) holds that chunk of `sum`.
inline void check_reduced_chunks(const std::vector<mgpu::Buffer<float>>& buffers, const std::vector<float>& sum) {
  const int k = static_cast<int>(buffers.size());
  for (int i = 0; i < k; ++i) {
    const mgpu::Chunk c = mgpu::chunk_of(mgpu::Elements{sum.size()}, k, (i + 1) % k);
    const std::vector<float> got = buffers[i].download();
    check_equal(std::vector<float>(got.begin() + c.begin, got.begin() + c.begin + c.count),
                std::vector<float>(sum.begin() + c.begin, sum.begin() + c.begin + c.count),
                "device " + std::to_string(i) + "'s chunk");
  }
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

// Rounds of reduce_scatter queued back to back, the host waiting for nothing in between: each
// round copies fresh inputs into the buffers, reduces, and copies each device's complete chunk
// aside, all on the devices' streams. Only the waits that end the reduce-scatter keep a round's
// fresh inputs from overwriting a buffer its neighbour is still reading. Device i's input of
// round r is bench::input(seed + i + seed_step * r, j): small integers, exact in any order.
inline void check_reduce_scatter_rounds(int k, std::size_t n, int rounds, int seed, int seed_step) {
  CAPTURE(k);
  CAPTURE(n);
  mgpu::DeviceSet devices(k);
  std::vector<mgpu::Buffer<float>> buffers, inputs, results;
  std::vector<float*> data;
  for (int i = 0; i < k; ++i) buffers.emplace_back(devices[i], n), data.push_back(buffers.back().data());
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < k; ++i) {
      std::vector<float> host(n);
      for (std::size_t j = 0; j < n; ++j) host[j] = bench::input(seed + i + seed_step * r, j);
      inputs.push_back(on_device(devices[i], host));  // inputs[r * k + i]
      results.emplace_back(devices[i], n);
    }
  devices.synchronize();
  ring::RingAllreduce ring(devices, n);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < k; ++i)
      mgpu::copy_peer(devices[i], data[i], devices[i], inputs[r * k + i].data(), mgpu::Elements{n});
    ring.reduce_scatter(data, mgpu::Elements{n});
    for (int i = 0; i < k; ++i) {
      const mgpu::Chunk c = mgpu::chunk_of(mgpu::Elements{n}, k, (i + 1) % k);
      mgpu::copy_peer(devices[i], results[r * k + i].data() + c.begin, devices[i], data[i] + c.begin,
                      mgpu::Elements{c.count});
    }
  }
  for (int r = 0; r < rounds; ++r) {
    CAPTURE(r);
    std::vector<float> sum(n, 0.0f);
    for (int i = 0; i < k; ++i)
      for (std::size_t j = 0; j < n; ++j) sum[j] += bench::input(seed + i + seed_step * r, j);
    for (int i = 0; i < k; ++i) {
      const mgpu::Chunk c = mgpu::chunk_of(mgpu::Elements{n}, k, (i + 1) % k);
      const std::vector<float> got = results[r * k + i].download();
      check_equal(std::vector<float>(got.begin() + c.begin, got.begin() + c.begin + c.count),
                           std::vector<float>(sum.begin() + c.begin, sum.begin() + c.begin + c.count),
                           "device " + std::to_string(i) + "'s complete chunk");
    }
  }
}

}  // namespace testing
