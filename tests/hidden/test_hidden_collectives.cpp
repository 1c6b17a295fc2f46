// The hidden cases of chapters 02 and 03: the same properties the visible tests check, on
// inputs those tests never use. More devices (5 to 8), sizes on either side of the device
// count and of the staging buffer, other seeds, another permutation of the examples, the flat
// gradient layout, and each collective run several times in a row on the same buffers. A
// solution that is right passes them as it passes the visible ones; one written to fit the
// visible tests (a size, a device count, a seed it happens to work for) does not.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../chapters/02_data_parallel/data_parallel.h"
#include "common/allreduce_bench.h"
#include "../../chapters/03_ring_allreduce/ring.h"
#include "common/random.h"
#include "data_parallel_checks.h"
#include "helpers.h"

namespace {

using mgpu::Elements;

// Chapter 02's allreduce, made once with a staging buffer of `capacity` elements.
testing::MakeAllreduce chapter02(std::size_t capacity) {
  return [capacity](const mgpu::DeviceSet& devices) -> testing::AllreduceRun {
    auto allreduce = std::make_shared<dp::Allreduce>(devices, capacity);
    return [allreduce](const std::vector<float*>& data, Elements count) { allreduce->run(data, count); };
  };
}

testing::MakeAllreduce ring_of(std::size_t capacity) {
  return [capacity](const mgpu::DeviceSet& devices) -> testing::AllreduceRun {
    auto ring = std::make_shared<ring::RingAllreduce>(devices, capacity);
    return [ring](const std::vector<float*>& data, Elements count) { ring->run(data, count); };
  };
}

}  // namespace

TEST_CASE("hidden allreduce: 5 to 8 devices, sizes below and above a staging buffer larger than them, 5 rounds") {
  for (int k = 5; k <= 8; ++k)
    for (std::size_t n : {std::size_t(2), std::size_t(k + 1), std::size_t(4097), std::size_t(65537)}) {
      CAPTURE(k);
      CAPTURE(n);
      // The staging buffer is larger than n: a solution must reduce n elements, not the buffer.
      CHECK(testing::count_wrong_sums(k, n, 90210 + 31 * k + n, chapter02(n + 100), 5) == 0);
    }
}

TEST_CASE("hidden split_batch: other batch sizes, device counts, starts and a shuffled order, twice in a row") {
  struct Shape {
    int n, k, first;
  };
  for (const Shape& c : {Shape{11, 4, 0}, Shape{5, 5, 9}, Shape{9, 2, 3}, Shape{23, 6, 1}}) {
    const int n = c.n, k = c.k, first = c.first;
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(first);
    mgpu::DeviceSet devices(k);
    mgpu::Rng rng(7000 + n * 10 + k);
    const mgpu::LabeledImages set = testing::random_set(first + 2 * n + 3, rng);
    const std::vector<int> order = mgpu::random_permutation(set.count, rng);
    std::vector<mgpu::DeviceData> data = mgpu::put_on_every_device(devices, set);
    for (mgpu::DeviceData& dd : data) dd.order.upload(order);
    std::vector<dp::Replica> replicas;
    replicas.reserve(k);
    for (int i = 0; i < k; ++i) replicas.emplace_back(devices[i], lenet::init_params(1), mgpu::shard_sizes(n, k)[0]);
    for (int batch = 0; batch < 2; ++batch) {  // the second batch overwrites the first's shards
      CAPTURE(batch);
      const int start_of_batch = first + batch * n;
      const std::vector<int> sizes = dp::split_batch(data, start_of_batch, n, replicas);
      REQUIRE(sizes == mgpu::shard_sizes(n, k));
      testing::check_shards(set, order, start_of_batch, sizes, replicas);
    }
  }
}

TEST_CASE("hidden train_batch: 4 devices, flat gradients, batch 21, give the steps of 1 device") {
  mgpu::Rng rng(31337);
  const int batch = 21, steps = 2;
  const float lr = 0.3f;
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  const lenet::HostParams init = lenet::init_params(7, 0.1f);
  std::vector<lenet::HostParams> one;
  {
    mgpu::DeviceSet devices(1);
    dp::Allreduce allreduce(devices, dp::largest_gradient_sum(lenet::Layout::PerTensor));
    one = testing::train_steps(devices, allreduce, lenet::Layout::PerTensor, set, batch, steps, lr);
  }
  mgpu::DeviceSet devices(4);
  dp::Allreduce allreduce(devices, dp::largest_gradient_sum(lenet::Layout::Flat));
  const std::vector<lenet::HostParams> many =
      testing::train_steps(devices, allreduce, lenet::Layout::Flat, set, batch, steps, lr);
  for (int i = 0; i < 4; ++i) testing::check_same_training(many[i], one[0], init, "device " + std::to_string(i));
}

TEST_CASE("hidden reduce_scatter: 6 to 8 devices, fewer elements than devices and odd sizes, run twice") {
  for (int k = 6; k <= 8; ++k)
    for (std::size_t n : {std::size_t(1), std::size_t(5), std::size_t(k), std::size_t(4099)}) {
      CAPTURE(k);
      CAPTURE(n);
      mgpu::DeviceSet devices(k);
      ring::RingAllreduce allreduce(devices, n + 64);
      for (int run = 0; run < 2; ++run) {
        CAPTURE(run);
        std::vector<float> sum(n, 0.0f);
        testing::OnDevices on(devices, n, [&](int i) {
          std::vector<float> host(n);
          for (std::size_t j = 0; j < n; ++j) host[j] = bench::input(i + 3 * run + 1, j), sum[j] += host[j];
          return host;
        });
        allreduce.reduce_scatter(on.data, Elements{n});
        testing::check_reduced_chunks(on.buffers, sum);
      }
    }
}

TEST_CASE("hidden all_gather: 6 to 8 devices, fewer elements than devices and odd sizes, run twice") {
  for (int k = 6; k <= 8; ++k)
    for (std::size_t n : {std::size_t(1), std::size_t(5), std::size_t(k), std::size_t(4099)}) {
      CAPTURE(k);
      CAPTURE(n);
      mgpu::DeviceSet devices(k);
      ring::RingAllreduce allreduce(devices, n + 64);
      for (int run = 0; run < 2; ++run) {
        CAPTURE(run);
        std::vector<float> expected(n);
        for (std::size_t j = 0; j < n; ++j) expected[j] = bench::input(11 + run, j);
        testing::OnDevices on(devices, n, [&](int i) {
          const mgpu::Chunk own = mgpu::chunk_of(Elements{n}, k, (i + 1) % k);
          std::vector<float> host(n, -1.0f);
          for (std::size_t j = own.begin; j < own.begin + own.count; ++j) host[j] = expected[j];
          return host;
        });
        allreduce.all_gather(on.data, Elements{n});
        for (int i = 0; i < k; ++i)
          testing::check_equal(on.buffers[i].download(), expected, "device " + std::to_string(i));
      }
    }
}

TEST_CASE("hidden ring allreduce: other seeds, a buffer larger than the data, 5 rounds") {
  for (int k : {2, 3, 6, 7})
    for (std::size_t n : {std::size_t(2), std::size_t(3 * k + 2), std::size_t(65537)}) {
      CAPTURE(k);
      CAPTURE(n);
      CHECK(testing::count_wrong_sums(k, n, 424242 + 13 * k + n, ring_of(n + 1000), 5) == 0);
    }
}

TEST_CASE("hidden get_params: every device of four, other weights, each call a copy of its own") {
  mgpu::DeviceSet devices(4);
  const lenet::HostParams host = lenet::init_params(99, 0.5f);  // another seed and scale than the visible case's
  for (lenet::Layout layout : {lenet::Layout::PerTensor, lenet::Layout::Flat}) {
    CAPTURE(layout == lenet::Layout::Flat);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      lenet::Params p = dp::get_params(host, devices[i], layout);
      CHECK(p.layout() == layout);
      CHECK(p.download() == host);  // bit for bit
      for (int t = 0; t < lenet::kParamTensors; ++t) {
        const std::size_t bytes = std::size_t(lenet::kParams[t].count) * sizeof(float);
        CHECK_NOTHROW(mgpu::check_owned(devices[i], p.tensors[t], bytes, "get_params"));
        for (int j = 0; j < 4; ++j)
          if (j != i) CHECK_THROWS_AS(mgpu::check_owned(devices[j], p.tensors[t], bytes, "get_params"), mgpu::Error);
      }
    }
  }
  // Two calls for one device: two copies, not one shared (a replica's SGD step must not move another's).
  lenet::Params a = dp::get_params(host, devices[2], lenet::Layout::Flat);
  lenet::Params b = dp::get_params(host, devices[2], lenet::Layout::Flat);
  for (int t = 0; t < lenet::kParamTensors; ++t) CHECK(a.tensors[t] != b.tensors[t]);
}
