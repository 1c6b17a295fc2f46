// The whole LeNet (chapters/01_lenet/lenet.h): its parameters, its gradient by finite
// differences of the real network, and the pieces of a training step.
//
// Shapes, for a batch of B images (see lenet.h):
//   x [1][B][28][28] -> conv1+relu [20][B][26][26] -> pool [20][B][13][13]
//   -> conv2+relu [50][B][9][9] -> pool [50][B][4][4] -> flatten [800][B]
//   -> dense3+relu [128][B] -> dense4 [10][B] logits
//   W1 [20][1][3][3] b1 [20]  W2 [50][20][5][5] b2 [50]  W3 [800][128] b3 [128]  W4 [128][10] b4 [10]
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "chapters/01_lenet/lenet.h"
#include "chapters/01_lenet/train.h"
#include "common/profile.h"
#include "common/check.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/random.h"
#include "helpers.h"

namespace {

using lenet::HostParams;
using lenet::kParams;
using lenet::kParamTensors;
using testing::check_close;
using testing::check_equal;
using testing::random_floats;

constexpr int kPixels = 28 * 28;

// n random "images" with pixels in [0, 1] like Fashion-MNIST's, and random labels.
mgpu::LabeledImages random_images(int n, mgpu::Rng& rng) {
  mgpu::LabeledImages set;
  set.count = n;
  set.rows = set.cols = 28;
  set.pixels = random_floats(std::size_t(n) * kPixels, rng, 0.0, 1.0);  // [n][28*28]
  for (int i = 0; i < n; ++i) set.labels.push_back(std::int32_t(rng.below(mgpu::kClasses)));
  return set;
}

TEST_CASE("LeNet has 129,068 parameters in eight tensors of d2l's shapes") {
  CHECK(lenet::parameter_count() == 129068);
  const std::int64_t expected[kParamTensors] = {20 * 1 * 3 * 3, 20, 50 * 20 * 5 * 5, 50, 800 * 128, 128, 128 * 10, 10};
  for (int t = 0; t < kParamTensors; ++t) {
    INFO("tensor ", std::string(kParams[t].name));
    CHECK(kParams[t].count == expected[t]);
  }
}

TEST_CASE("init_params: reproducible, biases zero, weights drawn from N(0, 0.01^2)") {
  const HostParams a = lenet::init_params(42), b = lenet::init_params(42), c = lenet::init_params(43);
  REQUIRE(a.size() == std::size_t(kParamTensors));
  CHECK(a == b);  // same seed: the same numbers, bit for bit
  for (int t = 0; t < kParamTensors; ++t) {
    INFO("tensor ", std::string(kParams[t].name));
    REQUIRE(a[t].size() == std::size_t(kParams[t].count));
    if (kParams[t].name[0] == 'b') {
      CHECK(a[t] == std::vector<float>(a[t].size(), 0.0f));
    } else {
      CHECK(a[t] != c[t]);  // another seed: other weights
      double sum = 0, squares = 0;
      for (float w : a[t]) sum += w, squares += double(w) * w;
      const double n = double(a[t].size()), mean = sum / n, sd = std::sqrt(squares / n - mean * mean);
      // A sample of n draws estimates the mean to 0.01 / sqrt(n) and the deviation to about
      // 0.01 / sqrt(2n); the bounds below are 5 of those standard errors (W1 has only 180).
      CHECK(std::abs(mean) < 5 * 0.01 / std::sqrt(n));
      CHECK(std::abs(sd - 0.01) < 5 * 0.01 / std::sqrt(2 * n));
    }
  }
  // The scale multiplies the same draws.
  const HostParams big = lenet::init_params(42, 0.1f);
  for (std::size_t i = 0; i < a[2].size(); i += 97) CHECK(big[2][i] == doctest::Approx(10.0 * a[2][i]).epsilon(1e-6));
}

TEST_CASE("parameters go up to a device and come back unchanged; wrong sizes are refused") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const HostParams host = lenet::init_params(1, 0.1f);
  lenet::Params p = lenet::upload_params(d, host);
  CHECK(p.download() == host);

  lenet::Params z = lenet::zero_params(d);
  const HostParams zeros = lenet::init_params(1, 0.0f);  // every tensor all zero
  CHECK(z.download() == zeros);
  p.zero();
  CHECK(p.download() == zeros);

  HostParams short_W3 = host;
  short_W3[4].pop_back();
  CHECK_THROWS_WITH_AS(lenet::upload_params(d, short_W3), doctest::Contains("W3"), mgpu::Error);
  HostParams seven(host.begin(), host.begin() + 7);
  CHECK_THROWS_AS(lenet::upload_params(d, seven), mgpu::Error);
}

// LeNet's forward pass once more, from reference.h's loops, in double: the per-example
// losses [n] of images x [1][n][28][28] under the parameters P (kParams order).
ref::Tensor reference_losses(const std::vector<ref::Tensor>& P, const ref::Tensor& x,
                             const std::vector<std::int32_t>& labels, int n, ref::Tensor* logits = nullptr) {
  const ref::Shape in{1, n, 28, 28}, c1{20, n, 26, 26}, s1{20, n, 13, 13}, c2{50, n, 9, 9}, s2{50, n, 4, 4};
  const ref::Tensor h1 = ref::relu(ref::conv2d(x, in, P[0], P[1], 20, 3));   // [20][n][26][26]
  const ref::Tensor p1 = ref::avgpool2(h1, c1);                               // [20][n][13][13]
  const ref::Tensor h2 = ref::relu(ref::conv2d(p1, s1, P[2], P[3], 50, 5));  // [50][n][9][9]
  const ref::Tensor p2 = ref::avgpool2(h2, c2);                               // [50][n][4][4]
  const ref::Tensor f = ref::flatten(p2, s2);                                 // [800][n]
  const ref::Tensor h3 = ref::relu(ref::dense(f, 800, n, P[4], P[5], 128));   // [128][n]
  const ref::Tensor z4 = ref::dense(h3, 128, n, P[6], P[7], 10);              // [10][n]
  if (logits) *logits = z4;
  return ref::softmax_cross_entropy(z4, labels, 10, n);
}

// A small batch and a set of parameters for the checks below.
//
// The weights are drawn 10x larger than LeNet's N(0, 0.01^2). With d2l's 0.01 each layer
// shrinks its input (0.01 * sqrt(fan_in) < 1 for three of the four layers): the logits come
// out ~1e-4 and nearly equal whatever the image, so the images' path through the network
// would barely show in the loss or in its gradient. At 0.1 every layer matters.
// The biases are random too, so that nothing relies on them starting at zero.
struct GradientSetup {
  static constexpr int n = 4;
  mgpu::LabeledImages batch;  // [4][28][28] pixels in [0, 1], labels 0..9
  HostParams host;
  GradientSetup() {
    mgpu::Rng rng(2024);
    batch = random_images(n, rng);
    host = lenet::init_params(7, 0.1f);
    for (int t = 1; t < kParamTensors; t += 2) host[t] = random_floats(host[t].size(), rng, -0.1, 0.1);
  }
};

// GradientSetup's batch and parameters on device d, with a workspace for one pass over them.
struct SetupOnDevice {
  SetupOnDevice(const mgpu::Device& device, const GradientSetup& s)
      : d(device), n(s.n), x(d, s.batch.pixels.size()), y(d, s.n), p(lenet::upload_params(d, s.host)), ws(d, s.n) {
    x.upload(s.batch.pixels);
    y.upload(s.batch.labels);
  }
  // forward, loss and backward into zeroed gradient arrays: the library's gradient.
  HostParams gradient() {
    lenet::Params g = lenet::zero_params(d);
    lenet::forward(d, p, ws, x.data(), n);
    lenet::loss(d, ws, y.data(), n, /*with_gradient=*/true);
    lenet::backward(d, p, g, ws, n);
    return g.download();
  }
  const mgpu::Device& d;
  int n;
  mgpu::Buffer<float> x;         // [1][4][28][28]
  mgpu::Buffer<std::int32_t> y;  // [4]
  lenet::Params p;
  lenet::Workspace ws;
};

TEST_CASE("LeNet's forward pass gives the reference network's logits and losses") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const GradientSetup s;
  SetupOnDevice on(d, s);
  lenet::Workspace& ws = on.ws;
  lenet::forward(d, on.p, ws, on.x.data(), s.n);
  lenet::loss(d, ws, on.y.data(), s.n, /*with_gradient=*/false);

  std::vector<ref::Tensor> P;
  for (const auto& t : s.host) P.push_back(ref::to_double(t));
  ref::Tensor logits;
  const ref::Tensor losses = reference_losses(P, ref::to_double(s.batch.pixels), s.batch.labels, s.n, &logits);
  check_close(ws.z4.download(), logits, 1e-5, "logits [10][4]");
  std::vector<float> got_losses = ws.loss.download();
  got_losses.resize(s.n);
  check_close(got_losses, losses, 1e-5, "losses [4]");
}

// The test that holds the whole backward pass to account: for every one of the eight tensors,
// nudge single parameters up and down, see how the summed loss of the batch moves, and compare
// with the gradient backward() reported.
//
// Where the differences are taken matters. Of the library's own float loss they are blurred
// twice over: by rounding (a loss of ~10 in float is good to ~1e-6, which a step of 1e-3 turns
// into ~5e-4 of error in every derivative) and by ReLU kinks (a step moves all 2,704 units of
// a conv1 channel, and the few that cross zero bend the difference); in trials, errors of 5%
// to 100% on the conv layers' entries at steps from 1e-4 to 1e-3. So the differences are
// taken of the same network computed in double by reference.h's loops (the test above shows
// it is the same function), with a step of 1e-6: small enough that no unit is likely to sit
// that close to its kink, and still far above double's rounding. What is left to tolerate is
// the float rounding of backward() itself (~1e-5 relative; 1e-3 is allowed).
TEST_CASE("LeNet's backward matches finite differences of the summed loss, for every parameter tensor") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  GradientSetup s;
  SetupOnDevice on(d, s);
  const HostParams grad = on.gradient();

  std::vector<ref::Tensor> P;
  for (const auto& t : s.host) P.push_back(ref::to_double(t));
  const ref::Tensor xd = ref::to_double(s.batch.pixels);
  auto summed_loss = [&] {
    const ref::Tensor l = reference_losses(P, xd, s.batch.labels, s.n);
    return std::accumulate(l.begin(), l.end(), 0.0);
  };

  mgpu::Rng rng(99);
  const double eps = 1e-6, rtol = 1e-3;
  for (int t = 0; t < kParamTensors; ++t) {
    INFO("tensor ", std::string(kParams[t].name));
    double largest = 0;
    for (float v : grad[t]) largest = std::max(largest, double(std::abs(v)));
    REQUIRE(largest > 1e-3);  // the check means little if this tensor's gradient vanishes
    // Probes: the first and last entries, 4 random ones, and 4 random ones among entries whose
    // gradient is not tiny. Most of W3's are exactly 0 (ReLU units off for all four images,
    // pooled inputs that are 0), and random probes alone could land on zeros only.
    std::vector<std::size_t> probes = testing::sample_indices(P[t].size(), 6, rng), sizable;
    for (std::size_t i = 0; i < grad[t].size(); ++i)
      if (std::abs(grad[t][i]) >= 1e-2 * largest) sizable.push_back(i);
    for (int k = 0; k < 4; ++k) probes.push_back(sizable[rng.below(sizable.size())]);
    for (std::size_t i : probes) {
      const double fd = testing::central_difference(P[t], i, eps, summed_loss);
      // Relative to the gradient itself where it is not tiny; for entries under 1% of the
      // tensor's largest, relative to that 1% (an absolute floor: many entries are 0, where
      // a ReLU is off for all four images, or nearly so).
      const double tol = rtol * std::max(std::abs(fd), 1e-2 * largest);
      CAPTURE(i);
      CAPTURE(fd);
      CHECK(std::abs(grad[t][i] - fd) <= tol);
    }
  }
}

// The same gradient seen through the library's own float loss (ws.loss, summed in double).
// Single entries cannot be checked this way (see above), but a whole tensor can: moving
// tensor t by +h g_t (uphill) and by -h g_t (downhill) changes the loss, to first order,
// by +h |g_t|^2 and -h |g_t|^2, so
//   (L(w + h g_t) - L(w - h g_t)) / (2h)  =  |g_t|^2.
// h is chosen so that the loss moves by ~1e-2: far above float rounding (~1e-6), and small
// enough that the curvature (which the central difference cancels to second order) and the
// few ReLU kinks crossed stay well under the 2% allowed (measured: under 0.6%). A gradient
// with a wrong scale or sign, or scrambled entries, gives a rate far from |g_t|^2.
TEST_CASE("the library's own loss falls along each tensor's gradient at the rate |g|^2") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  GradientSetup s;
  SetupOnDevice on(d, s);
  const HostParams grad = on.gradient();

  // The summed loss with tensor t moved by step * g_t (the other tensors as they are).
  auto loss_moved = [&](int t, double step) {
    HostParams moved = s.host;
    for (std::size_t i = 0; i < moved[t].size(); ++i) moved[t][i] += float(step * grad[t][i]);
    on.p.upload(moved);
    lenet::forward(d, on.p, on.ws, on.x.data(), s.n);
    lenet::loss(d, on.ws, on.y.data(), s.n, /*with_gradient=*/false);
    on.p.upload(s.host);
    const std::vector<float> per_example = on.ws.loss.download();
    return std::accumulate(per_example.begin(), per_example.begin() + s.n, 0.0);
  };
  for (int t = 0; t < kParamTensors; ++t) {
    INFO("tensor ", std::string(kParams[t].name));
    double g2 = 0;  // |g_t|^2
    for (float v : grad[t]) g2 += double(v) * v;
    REQUIRE(g2 > 1.0);
    const double h = 1e-2 / g2;
    const double rate = (loss_moved(t, h) - loss_moved(t, -h)) / (2 * h);
    CHECK(rate == doctest::Approx(g2).epsilon(2e-2));
  }
}

TEST_CASE("gather copies the chosen examples and their labels into a batch") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(3);
  const mgpu::LabeledImages host = random_images(8, rng);
  const mgpu::DeviceImages data(d, host);
  const std::vector<std::int32_t> order = {5, 2, 7};
  mgpu::Buffer<std::int32_t> order_d(d, order.size());
  order_d.upload(order);
  mgpu::Batch batch(d, 4);
  mgpu::gather(d, data, order_d.data(), 3, batch);
  const std::vector<float> x = batch.x.download();  // [1][4][28][28], the first 3 filled
  const std::vector<std::int32_t> y = batch.y.download();
  for (int b = 0; b < 3; ++b) {
    CAPTURE(b);
    const auto image = host.pixels.begin() + std::size_t(order[b]) * kPixels;
    CHECK(std::equal(image, image + kPixels, x.begin() + std::size_t(b) * kPixels));
    CHECK(y[b] == host.labels[order[b]]);
  }
}

// The loss is a sum over examples, so its gradient is the sum of any split's gradients: chunks
// of 3 images (3, 3, 2) spread over 1 or 2 lanes (whose gradients are then summed) must give
// what one chunk of 8 gives, up to the order in which float sums are taken.
TEST_CASE("accumulate_gradients in chunks gives the gradient of the whole batch") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(4);
  const mgpu::DeviceImages data(d, random_images(8, rng));
  mgpu::Buffer<std::int32_t> order(d, 8);
  order.upload(std::vector<std::int32_t>{3, 1, 7, 0, 5, 2, 6, 4});
  lenet::Params p = lenet::upload_params(d, lenet::init_params(11, 0.1f));
  mgpu::Batch batch(d, 8);
  mgpu::gather(d, data, order.data(), 8, batch);

  struct Result {
    HostParams grad;
    std::array<double, 2> metrics;  // loss sum, correct count
  };
  auto run = [&](int lanes, int capacity) {
    lenet::Lanes l(d, lanes, capacity);
    lenet::Params g = lenet::zero_params(d);
    mgpu::Metrics m(d);
    lenet::accumulate_gradients(d, p, g, l, batch.x.data(), batch.y.data(), 8, m);
    return Result{g.download(), m.read()};
  };
  const Result whole = run(1, 8);
  // Plain ints, not a structured binding: CAPTURE's lambda cannot capture those (C++17, clang).
  for (const std::pair<int, int>& c : {std::pair{1, 3}, std::pair{2, 3}, std::pair{3, 1}}) {
    const int lanes = c.first, capacity = c.second;
    CAPTURE(lanes);
    CAPTURE(capacity);
    const Result chunked = run(lanes, capacity);
    for (int t = 0; t < kParamTensors; ++t)
      check_close(chunked.grad[t], ref::to_double(whole.grad[t]), 1e-5, std::string("d") + kParams[t].name);
    CHECK(chunked.metrics[0] == doctest::Approx(whole.metrics[0]).epsilon(1e-6));
    CHECK(chunked.metrics[1] == whole.metrics[1]);
  }

  // The chunkings agree with one another; the whole batch must also be the plain pass that the
  // finite-difference test above holds to account: forward, loss and backward over all 8 images
  // at once, into zeroed gradients (a wrapper that scaled or dropped a tensor would fail here).
  lenet::Workspace ws(d, 8);
  lenet::Params plain = lenet::zero_params(d);
  lenet::forward(d, p, ws, batch.x.data(), 8);
  lenet::loss(d, ws, batch.y.data(), 8, /*with_gradient=*/true);
  lenet::backward(d, p, plain, ws, 8);
  const HostParams plain_grad = plain.download();
  for (int t = 0; t < kParamTensors; ++t) {
    CAPTURE(kParams[t].name);
    check_close(whole.grad[t], ref::to_double(plain_grad[t]), 1e-5, std::string("d") + kParams[t].name);
    // And no tensor's gradient is zero (a bug that dropped it everywhere would still "agree").
    CHECK(testing::has_nonzero(whole.grad[t]));
  }

  // The accumulated metrics are the sums of the per-example losses and hits (the plain pass's).
  const std::vector<float> losses = ws.loss.download(), hits = ws.correct.download();
  CHECK(whole.metrics[0] == doctest::Approx(std::accumulate(losses.begin(), losses.end(), 0.0)).epsilon(1e-6));
  CHECK(whole.metrics[1] == std::accumulate(hits.begin(), hits.end(), 0.0));
}

TEST_CASE("evaluate_accuracy is the fraction classified right, whatever the chunks and lanes") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(5);
  const mgpu::DeviceImages data(d, random_images(10, rng));
  lenet::Params p = lenet::upload_params(d, lenet::init_params(12, 0.1f));

  lenet::Workspace all(d, 10);  // one pass over the 10 images, counted here
  lenet::forward(d, p, all, data.pixels.data(), 10);
  lenet::loss(d, all, data.labels.data(), 10, false);
  const std::vector<float> hits = all.correct.download();
  const double expected = std::accumulate(hits.begin(), hits.end(), 0.0) / 10;

  // Plain ints, not a structured binding: CAPTURE's lambda cannot capture those (C++17, clang).
  for (const std::pair<int, int>& c : {std::pair{1, 10}, std::pair{1, 4}, std::pair{2, 4}, std::pair{3, 1}}) {
    const int lanes = c.first, capacity = c.second;
    CAPTURE(lanes);
    CAPTURE(capacity);
    lenet::Lanes l(d, lanes, capacity);
    CHECK(lenet::evaluate_accuracy(d, p, l, data) == doctest::Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("chunk_images: between 1 and the batch size") {
  for (int batch : {1, 7, 16, 32, 64, 256, 1024}) {
    CAPTURE(batch);
    const int chunk = lenet::chunk_images(batch);
    CHECK(chunk >= 1);
    CHECK(chunk <= batch);
  }
}

TEST_CASE("sgd is d2l's p -= lr * g / batch_size, for all eight tensors") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  // Small whole numbers and lr / batch = 0.5 / 4 = 1/8: every step is exact in float.
  HostParams p0, g0, expected;
  for (const auto& info : kParams) {
    std::vector<float> p(info.count), g(info.count), e(info.count);
    for (std::int64_t i = 0; i < info.count; ++i) {
      p[i] = float(i % 7) - 3.0f;
      g[i] = float(i % 5) - 2.0f;
      e[i] = p[i] - g[i] / 8.0f;
    }
    p0.push_back(p), g0.push_back(g), expected.push_back(e);
  }
  lenet::Params p = lenet::upload_params(d, p0);
  const lenet::Params g = lenet::upload_params(d, g0);
  lenet::sgd(d, p, g, /*lr=*/0.5f, /*batch_size=*/4);
  const HostParams got = p.download();
  for (int t = 0; t < kParamTensors; ++t) check_equal(got[t], expected[t], kParams[t].name);
  CHECK(g.download() == g0);  // the gradient is read, not changed
}

}  // namespace

TEST_CASE("profile_step: every kernel of one step is timed once per call, GEMMs by their shapes") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(21);
  mgpu::FashionMnist data;
  data.train = random_images(40, rng);
  mgpu::Options o;
  o.batch_size = 20;
  const lenet::StepProfile p = lenet::profile_step(d, data, o);
  CHECK(p.wall_seconds > 0);

  std::map<std::string, mgpu::KernelStats> rows;
  double total = 0;
  for (const mgpu::KernelStats& r : p.kernels) {
    CAPTURE(r.name);
    CHECK(r.calls > 0);
    CHECK(r.seconds >= 0);
    total += r.seconds;
    rows[r.name] = r;
    // A GEMM's row is named "gemm MxNxK ..": its FLOPs are 2 M N K per call.
    int M = 0, N = 0, K = 0;
    if (std::sscanf(r.name.c_str(), "gemm %dx%dx%d", &M, &N, &K) == 3)
      CHECK(r.flops == doctest::Approx(2.0 * M * N * K * r.calls));
  }
  CHECK(total > 0);
  for (const char* kernel : {"GatherImages", "Im2col", "Col2im", "BiasActivation", "AvgPoolForward",
                             "AvgPoolBackward", "Flatten", "Unflatten", "SoftmaxCrossEntropy", "memset"}) {
    CAPTURE(kernel);
    CHECK(rows.count(kernel) == 1);
  }
  // The flat layout: one kernel updates all eight tensors, one memset zeroes all the gradients.
  REQUIRE(rows.count("SgdStep") == 1);
  CHECK(rows["SgdStep"].calls == 1);
  // Two convolutions per chunk of images (conv1, conv2) each unfold their input once.
  const int chunks = (o.batch_size + lenet::chunk_images(o.batch_size) - 1) / lenet::chunk_images(o.batch_size);
  CHECK(rows["Im2col"].calls == 2 * chunks);
  CHECK(rows["Col2im"].calls == chunks);  // only conv2 needs its input's gradient
  const std::string table = mgpu::format_profile(p.kernels);
  CHECK(table.find("Col2im") != std::string::npos);
  CHECK(table.find("total") != std::string::npos);

  // One profile at a time.
  mgpu::KernelProfile first(d);
  auto start_a_second = [&] { mgpu::KernelProfile second(d); };
  CHECK_THROWS_WITH_AS(start_a_second(), doctest::Contains("one profile at a time"), mgpu::Error);
}
