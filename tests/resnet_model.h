// Chapter 09's network on k devices for tests (test_resnet.cpp, and the hidden cases of
// tests/hidden/test_hidden_ch09.cpp): random batches, a Model of k replicas with chapter 03's
// ring between them, and comparisons tensor by tensor.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/03_ring_allreduce/ring.h"
#include "chapters/09_resnet/resnet.h"
#include "common/device.h"
#include "common/random.h"
#include "helpers.h"

namespace resnet_testing {

using resnet::BatchNormMode;
using resnet::Network;
using resnet::Replica;

// n random images [n][28][28] with pixels in [0, 1), and labels, on the host.
struct HostBatch {
  std::vector<float> pixels;
  std::vector<std::int32_t> labels;
  int n;
};
inline HostBatch random_batch(int n, std::uint64_t seed) {
  mgpu::Rng rng(seed);
  const mgpu::LabeledImages set = testing::random_set(n, rng);
  return {set.pixels, set.labels, n};
}

// k replicas of a width-w network from init_params(seed), with chapter 03's ring between them.
struct Model {
  Model(int k, int width, int capacity, BatchNormMode bn, std::uint64_t seed = 7)
      : devices(k), net(width), ring(devices, std::max<std::size_t>(net.param_floats, 2 * net.max_channels)) {
    params = resnet::init_params(net, seed);
    state = resnet::init_state(net);
    for (int i = 0; i < k; ++i) {
      replicas.emplace_back(devices[i], net, capacity);
      replicas.back().params.upload(params);
      replicas.back().state.upload(state);
    }
    mode = bn;
  }
  // Every convolution's weights times `factor`, on every device. BatchNorm after each makes the
  // loss blind to their scale, but the gradient scales by 1 / factor and a finite difference of
  // a fixed step sees a function that is smoother at larger weights.
  void scale_conv_weights(float factor) {
    for (const resnet::Conv* c : net.convs()) {
      const resnet::TensorInfo& w = net.params[c->weight];
      for (std::int64_t i = 0; i < w.count; ++i) params[w.offset + i] *= factor;
    }
    for (Replica& r : replicas) r.params.upload(params);
  }
  resnet::Devices lockstep() {
    return {net, replicas, mode, ring};
  }
  // Shards of `b`: sizes[i] images to device i, in order.
  void load(const HostBatch& b, const std::vector<int>& sizes) {
    int start = 0;
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      Replica& r = replicas[i];
      r.shard.x.upload(b.pixels.data() + std::size_t(start) * 28 * 28, std::size_t(sizes[i]) * 28 * 28);
      r.shard.y.upload(b.labels.data() + start, sizes[i]);
      r.x = r.shard.x.data(), r.labels = r.shard.y.data(), r.n = sizes[i];
      start += sizes[i];
    }
  }
  // Forward, loss and backward of the loaded batch; the gradients of the summed loss summed over
  // the devices (the allreduce); returns device 0's.
  std::vector<float> gradient() {
    resnet::Devices s = lockstep();
    for (Replica& r : replicas) r.grads.zero();
    resnet::forward(s, true);
    resnet::loss(s, true);
    resnet::backward(s);
    std::vector<float*> grads;
    for (Replica& r : replicas) grads.push_back(r.grads.data());
    s.allreduce.run(grads, mgpu::Elements{std::size_t(net.param_floats)});
    return replicas[0].grads.download();
  }
  // The summed loss of the loaded batch in training mode, in double.
  double summed_loss() {
    resnet::Devices s = lockstep();
    resnet::forward(s, true);
    resnet::loss(s, false);
    double sum = 0;
    for (Replica& r : replicas) {
      const std::vector<float> l = r.loss.download();
      for (int i = 0; i < r.n; ++i) sum += l[i];
    }
    return sum;
  }
  mgpu::DeviceSet devices;
  Network net;
  ring::RingAllreduce ring;
  std::vector<float> params, state;
  std::vector<Replica> replicas;
  BatchNormMode mode;
};

// The biases of convolutions that a BatchNorm follows: their gradient is zero up to rounding
// (see "a bias right before a BatchNorm"), so comparing it says nothing.
inline bool feeds_batch_norm(const std::string& name) {
  return name == "0.bias" || name.find("conv1.bias") != std::string::npos ||
         name.find("conv2.bias") != std::string::npos;
}

// got vs want, tensor by tensor of the network's table: within rtol of the tensor's largest
// |value| (sums in a different order differ by rounding, scaled by the tensor's size).
inline void check_tensors_close(const Network& net, const std::vector<resnet::TensorInfo>& table,
                         const std::vector<float>& got, const std::vector<float>& want, double rtol,
                         const std::string& what) {
  for (const resnet::TensorInfo& t : table) {
    if (feeds_batch_norm(t.name)) continue;
    std::vector<float> g(got.begin() + t.offset, got.begin() + t.offset + t.count);
    ref::Tensor w(want.begin() + t.offset, want.begin() + t.offset + t.count);
    testing::check_close(g, w, rtol, what + " " + t.name);
  }
  (void)net;
}

// The largest difference between two flat tensors, relative to want's largest |value|.
inline double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, double(std::abs(got[i] - want[i])));
    scale = std::max(scale, double(std::abs(want[i])));
  }
  return diff / scale;
}

}  // namespace resnet_testing
