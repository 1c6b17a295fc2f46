// Chapter 09's hidden cases. BatchNorm's backward pass (ex09.batch_norm_backward) on shapes and
// values the visible test (tests/test_resnet_layers.cpp, "BatchNorm training") never uses: two
// values a channel, one channel, many channels of one pixel, one image, values far from zero,
// a gamma near zero and a negative one. The same properties: dz, dgamma and dbeta against finite
// differences of a reference BatchNorm in double; dgamma and dbeta added to what they held.
// SyncBN (ex09.sync_batch_norm) on four devices with uneven shards, one of a single image.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/09_resnet/layers.h"
#include "common/device.h"
#include "common/random.h"
#include "helpers.h"
#include "reference.h"
#include "resnet_model.h"  // the network on k devices (test_resnet.cpp's Model)

namespace {

using testing::check_gradient;
using testing::minus;
using testing::on_device;
using testing::poisoned;
using testing::random_floats;
using testing::sample_indices;

constexpr float kBnEps = 1e-5f, kMomentum = 0.1f;
constexpr double kTol = 1e-5, kEps = 1e-3;

// Training-mode BatchNorm over z [C][n], in double: (z - mean) / sqrt(var + eps) * gamma + beta,
// mean and (biased) var the channel's own.
ref::Tensor batch_norm(const ref::Tensor& z, int C, std::size_t n, const ref::Tensor& gamma,
                       const ref::Tensor& beta) {
  ref::Tensor y(z.size());
  for (int c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < n; ++j) mean += z[c * n + j] / n;
    for (std::size_t j = 0; j < n; ++j) var += (z[c * n + j] - mean) * (z[c * n + j] - mean) / n;
    for (std::size_t j = 0; j < n; ++j)
      y[c * n + j] = gamma[c] * (z[c * n + j] - mean) / std::sqrt(var + kBnEps) + beta[c];
  }
  return y;
}

}  // namespace

TEST_CASE("hidden BatchNorm backward: two values a channel, one channel, one-pixel channels, far from zero") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(901);
  struct Case {
    int C;
    std::size_t n;
    double lo, hi;  // z uniform in [lo, hi)
  };
  const float start = 0.75f;  // what dgamma and dbeta held before
  for (const Case& k : {Case{2, 2, -1.0, 1.0}, Case{1, 173, -2.0, 3.0}, Case{9, 16, -1.0, 1.0},
                        Case{3, 49, 99.5, 100.5} /* a mean 100 times the spread */}) {
    INFO("C ", k.C, ", n ", k.n, ", z in [", k.lo, ", ", k.hi, ")");
    const int C = k.C;
    const std::size_t n = k.n;
    const std::vector<float> z = random_floats(C * n, rng, k.lo, k.hi), R = random_floats(C * n, rng);
    std::vector<float> gamma = random_floats(C, rng, 0.5, 1.5);
    const std::vector<float> beta = random_floats(C, rng);
    gamma[0] = -0.8f;  // a negative scale
    if (C > 1) gamma[1] = 1e-3f;  // nearly switched off
    mgpu::Buffer<float> z_d = on_device(d, z), g_d = on_device(d, gamma), sums(d, 2 * C), stats(d, 2 * C), rm(d, C),
                        rv(d, C);
    rm.zero(), rv.zero();
    nn::ReductionScratch scratch(d, C);
    nn::batch_norm_sums(d, z_d.data(), C, n, scratch, sums.data());
    nn::batch_norm_square_sums(d, z_d.data(), C, n, double(n), scratch, sums.data());
    nn::batch_norm_statistics(d, sums.data(), double(n), C, kBnEps, kMomentum, rm.data(), rv.data(), stats.data());
    mgpu::Buffer<float> dy = on_device(d, R), bsums = poisoned(d, 2 * C), dz = poisoned(d, C * n);
    mgpu::Buffer<float> dgamma = on_device(d, std::vector<float>(C, start)),
                        dbeta = on_device(d, std::vector<float>(C, start));
    nn::batch_norm_backward_sums(d, dy.data(), z_d.data(), C, n, stats.data(), scratch, bsums.data(), dgamma.data(),
                                 dbeta.data());
    nn::batch_norm_backward_input(d, dy.data(), z_d.data(), C, n, stats.data(), g_d.data(), bsums.data(), double(n),
                                  dz.data());
    ref::Tensor zd = ref::to_double(z), gd = ref::to_double(gamma), bd = ref::to_double(beta);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(batch_norm(zd, C, n, gd, bd), Rd); };
    // Far from zero a step of 1e-3 is still 1e-3 of the spread: the loss stays smooth at that scale.
    check_gradient(dz.download(), zd, sample_indices(zd.size(), zd.size(), rng), kEps, kTol, L, "dz");
    check_gradient(minus(dgamma.download(), start), gd, sample_indices(C, C, rng), kEps, kTol, L, "dgamma");
    check_gradient(minus(dbeta.download(), start), bd, sample_indices(C, C, rng), kEps, kTol, L, "dbeta");
  }
}

TEST_CASE("hidden SyncBN: four devices with shards of 1, 3, 2 and 1 images compute one device's gradient") {
  // The visible case splits 7 images 4 + 3 and 3 + 2 + 2; here one device holds a single image
  // (its own statistics would be a single value per channel at stage 4: 1x1 pixels) and the
  // network is another width, so a SyncBN that skips a device's sums, or counts its own
  // images only, is far off.
  const resnet_testing::HostBatch b = resnet_testing::random_batch(7, 77);
  resnet_testing::Model one(1, 2, 7, resnet::BatchNormMode::Sync);
  one.load(b, {7});
  const std::vector<float> want = one.gradient();
  const std::vector<float> want_state = one.replicas[0].state.download();
  resnet_testing::Model many(4, 2, 3, resnet::BatchNormMode::Sync);
  many.load(b, {1, 3, 2, 1});
  const std::vector<float> got = many.gradient();
  resnet_testing::check_tensors_close(many.net, many.net.params, got, want, 1e-4, "gradient");
  for (int i = 0; i < 4; ++i)
    resnet_testing::check_tensors_close(many.net, many.net.state, many.replicas[i].state.download(), want_state, 1e-5,
                                        "device " + std::to_string(i) + " running statistic");
}
