// Chapter 01's hidden cases: LeNet's backward passes on shapes and inputs the visible tests
// (tests/test_layers.cpp) never use: one image, one channel, a single output pixel, a kernel as
// large as the image, rows of odd length, a dense layer of one unit, softmax over 2 and 37
// classes, units exactly at ReLU's kink. The same properties: finite differences of a reference
// loss (tests/reference.h) in double, accumulation into dW and db, dx overwritten. And the
// network's backward pass on batches of one, three and seven images with another seed.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "chapters/01_lenet/layers.h"
#include "chapters/01_lenet/lenet.h"
#include "common/device.h"
#include "common/random.h"
#include "helpers.h"
#include "reference.h"

namespace {

using lenet::ImageShape;
using testing::check_close;
using testing::check_equal;
using testing::check_gradient;
using testing::check_layer_gradients;
using testing::check_second_call;
using testing::on_device;
using testing::poisoned;
using testing::random_floats;
using testing::sample_indices;

constexpr double kTol = 1e-5;
constexpr double kEps = 1e-3;
constexpr std::size_t kEveryElement = SIZE_MAX;  // probes: every element of the small tensors here

}  // namespace

TEST_CASE("hidden conv2d_backward: one image, one channel, one output pixel, a kernel the image's size") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(101);
  struct Case {
    ImageShape x;
    int cout, k;
  };
  for (const Case& c : {Case{{1, 1, 6, 9}, 1, 3}, Case{{4, 1, 5, 5}, 3, 5} /* one output pixel */,
                        Case{{1, 5, 3, 11}, 6, 2}, Case{{7, 1, 4, 4}, 2, 1} /* 1x1 */}) {
    INFO("x ", c.x.channels, "x", c.x.batch, "x", c.x.height, "x", c.x.width, ", k ", c.k, ", out ", c.cout);
    const int Ho = c.x.height - c.k + 1, Wo = c.x.width - c.k + 1;
    const std::size_t P = std::size_t(c.x.batch) * Ho * Wo, K = std::size_t(c.x.channels) * c.k * c.k;
    const std::vector<float> x = random_floats(c.x.size(), rng), W = random_floats(c.cout * K, rng),
                             b = random_floats(c.cout, rng), R = random_floats(c.cout * P, rng);
    mgpu::Buffer<float> x_d = on_device(d, x), W_d = on_device(d, W), b_d = on_device(d, b), col(d, K * P),
                        ones = on_device(d, std::vector<float>(P, 1.0f)), z(d, c.cout * P);
    lenet::conv2d_forward(d, x_d.data(), c.x, W_d.data(), b_d.data(), c.cout, c.k, lenet::Activation::None,
                          col.data(), z.data());
    mgpu::Buffer<float> dz = on_device(d, R), dW(d, W.size()), db(d, b.size()), dcol(d, K * P),
                        dx = poisoned(d, x.size());
    dW.zero();
    db.zero();
    auto backward = [&] {
      lenet::conv2d_backward(d, dz.data(), c.x, W_d.data(), c.cout, c.k, col.data(), ones.data(), dW.data(),
                             db.data(), dcol.data(), dx.data());
    };
    backward();
    const std::vector<float> gW = dW.download(), gb = db.download(), gx = dx.download();
    ref::Tensor xd = ref::to_double(x), Wd = ref::to_double(W), bd = ref::to_double(b);
    const ref::Tensor Rd = ref::to_double(R);
    const ref::Shape s{c.x.channels, c.x.batch, c.x.height, c.x.width};
    auto L = [&] { return ref::dot(ref::conv2d(xd, s, Wd, bd, c.cout, c.k), Rd); };
    check_layer_gradients(gW, Wd, gb, bd, gx, xd, kEveryElement, rng, kEps, kTol, L);
    check_second_call(backward, dW, gW, db, gb, dx, gx, kTol);
  }
}

TEST_CASE("hidden dense: one unit, one example, and a layer wider than it is deep") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(102);
  struct Case {
    int in, out, batch;
  };
  for (const Case& c : {Case{1, 1, 1}, Case{3, 1, 5}, Case{2, 40, 1}, Case{33, 17, 4}}) {
    INFO("in ", c.in, ", out ", c.out, ", batch ", c.batch);
    const std::vector<float> x = random_floats(std::size_t(c.in) * c.batch, rng), W = random_floats(c.in * c.out, rng),
                             b = random_floats(c.out, rng), R = random_floats(std::size_t(c.out) * c.batch, rng);
    mgpu::Buffer<float> x_d = on_device(d, x), W_d = on_device(d, W), ones = on_device(d, std::vector<float>(c.batch, 1.0f));
    mgpu::Buffer<float> dz = on_device(d, R), dW(d, W.size()), db(d, b.size()), dx = poisoned(d, x.size());
    dW.zero();
    db.zero();
    auto backward = [&] {
      lenet::dense_backward(d, dz.data(), x_d.data(), c.in, c.batch, W_d.data(), c.out, ones.data(), dW.data(),
                            db.data(), dx.data());
    };
    backward();
    const std::vector<float> gW = dW.download(), gb = db.download(), gx = dx.download();
    ref::Tensor xd = ref::to_double(x), Wd = ref::to_double(W), bd = ref::to_double(b);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(ref::dense(xd, c.in, c.batch, Wd, bd, c.out), Rd); };
    check_layer_gradients(gW, Wd, gb, bd, gx, xd, kEveryElement, rng, kEps, kTol, L);
    check_second_call(backward, dW, gW, db, gb, dx, gx, kTol);
  }
}

TEST_CASE("hidden avgpool2: a 2x2 image, a 3x1 one, and rows of odd length") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(103);
  for (const ImageShape xs : {ImageShape{1, 1, 2, 2}, ImageShape{2, 3, 3, 2}, ImageShape{3, 1, 11, 5}}) {
    INFO("x ", xs.channels, "x", xs.batch, "x", xs.height, "x", xs.width);
    const ref::Shape s{xs.channels, xs.batch, xs.height, xs.width};
    const std::size_t ny = std::size_t(xs.channels) * xs.batch * (xs.height / 2) * (xs.width / 2);
    const std::vector<float> x = random_floats(xs.size(), rng), R = random_floats(ny, rng);
    mgpu::Buffer<float> dy = on_device(d, R), dx = poisoned(d, xs.size());
    lenet::avgpool2_backward(d, dy.data(), xs, dx.data());
    ref::Tensor xd = ref::to_double(x);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(ref::avgpool2(xd, s), Rd); };
    // Every pixel: the dropped row and column must get exactly what the differences give, 0.
    check_gradient(dx.download(), xd, sample_indices(xd.size(), xd.size(), rng), kEps, kTol, L, "dx");
  }
}

TEST_CASE("hidden relu: units exactly at 0 get no gradient; a long row") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(104);
  const std::size_t n = 10007;
  std::vector<float> h = random_floats(n, rng);
  for (std::size_t i = 0; i < n; ++i)
    if (h[i] < 0 || i % 5 == 0) h[i] = 0.0f;  // ReLU's output: 0 where the unit is off, and at the kink
  const std::vector<float> R = random_floats(n, rng);
  mgpu::Buffer<float> h_d = on_device(d, h), dh = on_device(d, R);
  lenet::relu_backward(d, h_d.data(), dh.data(), n);
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = h[i] > 0 ? R[i] : 0.0f;
  check_equal(dh.download(), want, "dz");
}

TEST_CASE("hidden softmax_cross_entropy: 2 classes, 37 classes, one example") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(105);
  struct Case {
    int classes, batch;
  };
  for (const Case& c : {Case{2, 9}, Case{37, 3}, Case{10, 1}}) {
    INFO(c.classes, " classes, batch ", c.batch);
    const std::vector<float> z = random_floats(std::size_t(c.classes) * c.batch, rng, -6.0, 6.0);
    std::vector<std::int32_t> labels(c.batch);
    for (auto& y : labels) y = std::int32_t(rng.below(c.classes));
    mgpu::Buffer<float> z_d = on_device(d, z), loss = poisoned(d, c.batch), correct = poisoned(d, c.batch),
                        dz = poisoned(d, z.size());
    mgpu::Buffer<std::int32_t> y_d(d, c.batch);
    y_d.upload(labels);
    lenet::softmax_cross_entropy(d, z_d.data(), y_d.data(), c.classes, c.batch, loss.data(), correct.data(),
                                 dz.data());
    ref::Tensor zd = ref::to_double(z);
    check_close(loss.download(), ref::softmax_cross_entropy(zd, labels, c.classes, c.batch), kTol, "loss");
    auto L = [&] {
      double sum = 0;
      for (double l : ref::softmax_cross_entropy(zd, labels, c.classes, c.batch)) sum += l;
      return sum;
    };
    check_gradient(dz.download(), zd, sample_indices(zd.size(), zd.size(), rng), 1e-4, kTol, L, "dlogits");
  }
}

namespace {

// LeNet on n images of `set` from `first` on, with parameters `host`: the gradient of the summed
// loss, and the order in which backward() announced the layers.
struct NetworkGradient {
  lenet::HostParams grad;
  std::vector<int> announced;
};
NetworkGradient network_gradient(const mgpu::Device& d, const lenet::HostParams& host, const mgpu::LabeledImages& set,
                                 int first, int n) {
  mgpu::Buffer<float> x(d, std::size_t(n) * 28 * 28);
  mgpu::Buffer<std::int32_t> y(d, n);
  x.upload(std::vector<float>(set.pixels.begin() + std::size_t(first) * 28 * 28,
                              set.pixels.begin() + std::size_t(first + n) * 28 * 28));
  y.upload(std::vector<std::int32_t>(set.labels.begin() + first, set.labels.begin() + first + n));
  lenet::Params p = lenet::upload_params(d, host), g = lenet::zero_params(d);
  lenet::Workspace ws(d, n);
  NetworkGradient out;
  lenet::forward(d, p, ws, x.data(), n);
  lenet::loss(d, ws, y.data(), n, /*with_gradient=*/true);
  lenet::backward(d, p, g, ws, n, [&](int layer) { out.announced.push_back(layer); });
  out.grad = g.download();
  return out;
}

// The summed loss of those images with every tensor t moved by step * direction[t].
double moved_loss(const mgpu::Device& d, const lenet::HostParams& host, const lenet::HostParams& direction, double step,
                  const mgpu::LabeledImages& set, int n) {
  lenet::HostParams moved = host;
  for (std::size_t t = 0; t < moved.size(); ++t)
    for (std::size_t i = 0; i < moved[t].size(); ++i) moved[t][i] += float(step * direction[t][i]);
  mgpu::Buffer<float> x(d, std::size_t(n) * 28 * 28);
  mgpu::Buffer<std::int32_t> y(d, n);
  x.upload(std::vector<float>(set.pixels.begin(), set.pixels.begin() + std::size_t(n) * 28 * 28));
  y.upload(std::vector<std::int32_t>(set.labels.begin(), set.labels.begin() + n));
  lenet::Params p = lenet::upload_params(d, moved);
  lenet::Workspace ws(d, n);
  lenet::forward(d, p, ws, x.data(), n);
  lenet::loss(d, ws, y.data(), n, /*with_gradient=*/false);
  const std::vector<float> per_example = ws.loss.download();
  return std::accumulate(per_example.begin(), per_example.begin() + n, 0.0);
}

}  // namespace

TEST_CASE("hidden network backward: one, three and seven images; the images' own gradients summed; the loss's rate along each tensor") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(4242);
  const mgpu::LabeledImages set = testing::random_set(7, rng);
  lenet::HostParams host = lenet::init_params(31, 0.1f);
  for (std::size_t t = 1; t < host.size(); t += 2) host[t] = random_floats(host[t].size(), rng, -0.1, 0.1);
  for (int n : {1, 3, 7}) {
    CAPTURE(n);
    const NetworkGradient batch = network_gradient(d, host, set, 0, n);
    CHECK(batch.announced == std::vector<int>{3, 2, 1, 0});
    // The summed loss's gradient is the sum of each image's own.
    lenet::HostParams summed = network_gradient(d, host, set, 0, 1).grad;
    for (int i = 1; i < n; ++i) {
      const lenet::HostParams one = network_gradient(d, host, set, i, 1).grad;
      for (std::size_t t = 0; t < summed.size(); ++t)
        for (std::size_t j = 0; j < summed[t].size(); ++j) summed[t][j] += one[t][j];
    }
    for (std::size_t t = 0; t < summed.size(); ++t) {
      CAPTURE(t);
      double largest = 0;
      for (float v : summed[t]) largest = std::max(largest, double(std::abs(v)));
      std::size_t far = 0;
      for (std::size_t j = 0; j < summed[t].size(); ++j)
        if (std::abs(batch.grad[t][j] - summed[t][j]) > 1e-4 * largest + 1e-7) ++far;
      CHECK(far == 0);
    }
    // Moving tensor t by +-h g_t changes the loss by +-h |g_t|^2 (to first order): a gradient
    // that is wrong in scale, sign or layout moves it otherwise.
    for (std::size_t t = 0; t < batch.grad.size(); ++t) {
      CAPTURE(t);
      double g2 = 0;
      for (float v : batch.grad[t]) g2 += double(v) * v;
      if (g2 < 1e-2) continue;  // too flat to measure in float (checked by the sum above)
      lenet::HostParams direction(batch.grad.size());
      for (std::size_t u = 0; u < direction.size(); ++u)
        direction[u] = u == t ? batch.grad[u] : std::vector<float>(batch.grad[u].size(), 0.0f);
      const double h = 1e-2 / g2;
      const double rate = (moved_loss(d, host, direction, h, set, n) - moved_loss(d, host, direction, -h, set, n)) / (2 * h);
      CHECK(rate == doctest::Approx(g2).epsilon(3e-2));
    }
  }
}
