// The hook chapter 05's overlap rests on (lenet::GradientReady, chapters/01_lenet/lenet.h):
// accumulate_gradients announces each layer once, last layer first, and only when that layer's
// gradient is final, so an allreduce started from the announcement sums the right numbers.
#include <doctest/doctest.h>

#include <vector>

#include "chapters/01_lenet/lenet.h"
#include "common/random.h"
#include "helpers.h"

namespace {

constexpr int kPixels = 28 * 28;

struct Example {
  std::vector<float> x;         // [n][28][28]
  std::vector<std::int32_t> y;  // [n]
};

Example random_examples(int n, std::uint64_t seed) {
  mgpu::Rng rng(seed);
  Example e;
  e.x = testing::random_floats(std::size_t(n) * kPixels, rng, 0.0, 1.0);
  for (int i = 0; i < n; ++i) e.y.push_back(static_cast<std::int32_t>(rng.below(10)));
  return e;
}

// What accumulate_gradients leaves in g, and what each layer's tensors held when announced.
struct Announced {
  std::vector<int> order;                 // layers, in the order ready() was called
  lenet::HostParams at_announcement;      // tensor t as it was when its layer was announced
  lenet::HostParams final_grads;
};

Announced run(int n, int lanes, int chunk, bool with_hook) {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const Example e = random_examples(std::max(n, 1), 11);
  lenet::Params p = lenet::upload_params(d, lenet::init_params(3, 0.1f), lenet::Layout::Flat);
  lenet::Params g = lenet::zero_params(d, lenet::Layout::Flat);
  lenet::Lanes ln(d, lanes, chunk);
  mgpu::Metrics m(d);
  mgpu::Buffer<float> x(d, e.x.size());
  mgpu::Buffer<std::int32_t> y(d, e.y.size());
  x.upload(e.x);
  y.upload(e.y);

  Announced a;
  a.at_announcement.resize(lenet::kParamTensors);
  lenet::GradientReady ready;
  if (with_hook)
    ready = [&](int layer) {
      a.order.push_back(layer);
      const lenet::HostParams now = g.download();  // synchronizes: what the device holds now
      for (int t = 2 * layer; t <= 2 * layer + 1; ++t) a.at_announcement[t] = now[t];
    };
  lenet::accumulate_gradients(d, p, g, ln, x.data(), y.data(), n, m, ready);
  a.final_grads = g.download();
  return a;
}

void check_announcements(int n, int lanes, int chunk) {
  CAPTURE(n);
  CAPTURE(lanes);
  CAPTURE(chunk);
  const Announced with = run(n, lanes, chunk, true);
  CHECK(with.order == std::vector<int>{3, 2, 1, 0});
  for (int t = 0; t < lenet::kParamTensors; ++t) {
    CAPTURE(lenet::kParams[t].name);
    CHECK(with.at_announcement[t] == with.final_grads[t]);  // final when announced
    // ... and not trivially so: a backward pass that computed nothing would also be "final".
    CHECK(testing::has_nonzero(with.final_grads[t]));
  }
  // The hook changes nothing in the arithmetic.
  const Announced without = run(n, lanes, chunk, false);
  CHECK(without.order.empty());
  for (int t = 0; t < lenet::kParamTensors; ++t) testing::check_equal(with.final_grads[t], without.final_grads[t],
                                                                      lenet::kParams[t].name);
}

TEST_CASE("one lane, several chunks: each layer announced from the last chunk's backward pass") {
  check_announcements(20, 1, 8);  // chunks of 8, 8, 4
  check_announcements(5, 1, 8);   // one chunk
}

TEST_CASE("several lanes: each layer announced once the lanes' gradients are summed") {
  check_announcements(20, 2, 4);  // five chunks over two lanes
  check_announcements(3, 3, 1);
}

TEST_CASE("an empty batch: nothing to add, every layer announced, the gradients stay zero") {
  const Announced a = run(0, 1, 8, true);
  CHECK(a.order == std::vector<int>{3, 2, 1, 0});
  std::size_t nonzero = 0;
  for (const std::vector<float>& t : a.final_grads)
    for (float v : t) nonzero += v != 0.0f;
  CHECK(nonzero == 0);
}

}  // namespace
