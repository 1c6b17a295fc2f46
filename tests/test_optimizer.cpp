// The optimizers with state (common/optimizer.h): AdamW, SGD with momentum and clipping by the
// global norm, held to PyTorch's own numbers (tests/fixtures/optimizers_torch.txt, written by
// chapters/11_sharded_data_parallel/optimizers_torch.py with torch.optim and clip_grad_norm_),
// and the property chapter 11's sharding rests on: a step taken shard by shard is the step
// taken whole, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/optimizer.h"
#include "helpers.h"  // testing::on_device

namespace {

using testing::on_device;

constexpr int kSteps = 5;  // as optimizers_torch.py

// The script's inputs, the same exact fractions: p_i = ((37 (i + offset)) mod 101 - 50) / 64,
// g_i(t) = ((13 (i + offset) + 7 t) mod 53 - 26) / 32.
std::vector<float> params(int n, int offset = 0) {
  std::vector<float> p(n);
  for (int i = 0; i < n; ++i) p[i] = float((37 * (i + offset)) % 101 - 50) / 64.0f;
  return p;
}
std::vector<float> grads(int n, int step, int offset = 0) {
  std::vector<float> g(n);
  for (int i = 0; i < n; ++i) g[i] = float((13 * (i + offset) + 7 * step) % 53 - 26) / 32.0f;
  return g;
}

// The fixture: case name -> one row of values per step.
std::map<std::string, std::vector<std::vector<double>>> torch_reference() {
  const char* path = "tests/fixtures/optimizers_torch.txt";  // ctest runs the suites from the source folder
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), path, " not found (run the suite from the repository's folder)");
  std::map<std::string, std::vector<std::vector<double>>> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string name;
    int step = 0;
    words >> name >> step;
    std::vector<double> row;
    for (double x; words >> x;) row.push_back(x);
    cases[name].push_back(row);
    REQUIRE(static_cast<int>(cases[name].size()) == step);
  }
  return cases;
}

// Every value within 1e-6 of PyTorch's, relative to max(1, |PyTorch's|).
void check_row(const std::vector<float>& ours, const std::vector<double>& torch, std::size_t from,
               const std::string& what) {
  REQUIRE(torch.size() >= from + ours.size());
  double worst = 0;
  for (std::size_t i = 0; i < ours.size(); ++i)
    worst = std::max(worst, std::abs(ours[i] - torch[from + i]) / std::max(1.0, std::abs(torch[from + i])));
  INFO(what);
  CHECK(worst <= 1e-6);
}

// One tensor of n parameters trained kSteps steps by `update(p, g, step)`; the parameters after
// each step.
template <class Update>
std::vector<std::vector<float>> train(const mgpu::Device& d, int n, Update update) {
  auto p = on_device(d, params(n));
  std::vector<std::vector<float>> rows;
  for (int t = 1; t <= kSteps; ++t) {
    auto g = on_device(d, grads(n, t));
    update(p.data(), g.data(), t);
    rows.push_back(p.download());
  }
  return rows;
}

}  // namespace

TEST_CASE("AdamW and SGD with momentum take PyTorch's steps, to 1e-6") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const auto reference = torch_reference();
  const int n = 37;

  const auto adamw = [&](const mgpu::AdamWSettings& s) {
    mgpu::Buffer<float> m(d, n), v(d, n);
    m.zero();
    v.zero();
    return train(d, n, [&](float* p, const float* g, int t) { mgpu::adamw_update(d, p, g, m.data(), v.data(), n, s, t); });
  };
  const auto sgd = [&](const mgpu::SgdMomentumSettings& s) {
    auto buf = testing::poisoned(d, n);  // the first step must overwrite it: PyTorch's buffer starts as g
    return train(d, n, [&](float* p, const float* g, int t) {
      mgpu::sgd_momentum_update(d, p, g, buf.data(), n, s, /*first_step=*/t == 1);
    });
  };
  mgpu::AdamWSettings tuned;
  tuned.lr = 0.01, tuned.beta1 = 0.8, tuned.beta2 = 0.99, tuned.eps = 1e-6, tuned.weight_decay = 0.1;
  mgpu::SgdMomentumSettings decayed;
  decayed.lr = 0.05, decayed.weight_decay = 1e-3;

  const std::map<std::string, std::vector<std::vector<float>>> ours = {
      {"adamw_default", adamw(mgpu::AdamWSettings{})},
      {"adamw_tuned", adamw(tuned)},
      {"sgd_momentum", sgd(mgpu::SgdMomentumSettings{})},
      {"sgd_momentum_decay", sgd(decayed)},
  };
  for (const auto& [name, rows] : ours) {
    REQUIRE(reference.count(name) == 1);
    for (int t = 0; t < kSteps; ++t) check_row(rows[t], reference.at(name)[t], 0, name + " step " + std::to_string(t + 1));
  }
}

TEST_CASE("Clipping by the norm over two tensors, then AdamW: PyTorch's factor and steps") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const auto reference = torch_reference().at("adamw_clipped");
  const int na = 37, nb = 13;
  auto a = on_device(d, params(na)), b = on_device(d, params(nb, 100));
  mgpu::Buffer<float> ma(d, na), va(d, na), mb(d, nb), vb(d, nb);
  for (auto* s : {&ma, &va, &mb, &vb}) s->zero();
  for (int t = 1; t <= kSteps; ++t) {
    auto ga = on_device(d, grads(na, t)), gb = on_device(d, grads(nb, t, 100));
    // The model's norm: the square root of the sum of its tensors' sums of squares.
    const double norm = std::sqrt(mgpu::sum_of_squares(d, ga.data(), na) + mgpu::sum_of_squares(d, gb.data(), nb));
    const float factor = mgpu::clip_coefficient(norm, 1.0f);
    const std::vector<double>& row = reference[t - 1];
    CHECK(factor == doctest::Approx(row[0]).epsilon(1e-6));
    CHECK(factor < 1.0f);  // the case clips: its gradients' norm is above 1
    mgpu::adamw_update(d, a.data(), ga.data(), ma.data(), va.data(), na, {}, t, factor);
    mgpu::adamw_update(d, b.data(), gb.data(), mb.data(), vb.data(), nb, {}, t, factor);
    check_row(a.download(), row, 1, "tensor a, step " + std::to_string(t));
    check_row(b.download(), row, 1 + na, "tensor b, step " + std::to_string(t));
  }
}

TEST_CASE("A step taken shard by shard is the step taken whole, bit for bit") {
  // ZeRO's premise: every element's update reads only that element of p, g and the state.
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const int n = 37, cut = 20;  // shards [0, 20) and [20, 37): unequal, as padding-free shards are
  for (const bool adam : {true, false}) {
    CAPTURE(adam);
    auto whole = on_device(d, params(n)), sharded = on_device(d, params(n));
    mgpu::Buffer<float> m1(d, n), v1(d, n), m2(d, n), v2(d, n);
    for (auto* s : {&m1, &v1, &m2, &v2}) s->zero();
    for (int t = 1; t <= kSteps; ++t) {
      auto g = on_device(d, grads(n, t));
      const auto step = [&](float* p, const float* gp, float* m, float* v, int count) {
        if (adam)
          mgpu::adamw_update(d, p, gp, m, v, count, {}, t, 0.5f);
        else
          mgpu::sgd_momentum_update(d, p, gp, m, count, {}, t == 1, 0.5f);
      };
      step(whole.data(), g.data(), m1.data(), v1.data(), n);
      step(sharded.data(), g.data(), m2.data(), v2.data(), cut);
      step(sharded.data() + cut, g.data() + cut, m2.data() + cut, v2.data() + cut, n - cut);
    }
    CHECK(whole.download() == sharded.download());
    CHECK(m1.download() == m2.download());
    CHECK(v1.download() == v2.download());
  }
}

TEST_CASE("sum_of_squares: the plain sum, and shards' sums add up to the whole's") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  for (const int n : {0, 1, 1023, 1024, 1025, 100'003}) {
    CAPTURE(n);
    const std::vector<float> g = grads(n, 3);
    double want = 0;
    for (float x : g) want += double(x) * x;
    auto buffer = on_device(d, g);
    const double got = mgpu::sum_of_squares(d, buffer.data(), n);
    CHECK(got == doctest::Approx(want).epsilon(1e-12));
    if (n > 1) {
      const double halves = mgpu::sum_of_squares(d, buffer.data(), n / 2) +
                            mgpu::sum_of_squares(d, buffer.data() + n / 2, n - n / 2);
      CHECK(halves == doctest::Approx(want).epsilon(1e-12));
    }
  }
}

TEST_CASE("clip_coefficient: 1 within the bound, max_norm / (norm + 1e-6) above it; bad bounds refused") {
  CHECK(mgpu::clip_coefficient(0.5, 1.0f) == 1.0f);
  CHECK(mgpu::clip_coefficient(0.0, 1.0f) == 1.0f);
  CHECK(mgpu::clip_coefficient(4.0, 1.0f) == doctest::Approx(1.0 / (4.0 + 1e-6)));
  CHECK_THROWS_WITH_AS(mgpu::clip_coefficient(1.0, 0.0f), doctest::Contains("max_norm 0"), mgpu::Error);
  CHECK_THROWS_WITH_AS(mgpu::clip_coefficient(1.0, -2.0f), doctest::Contains("max_norm -2"), mgpu::Error);
  mgpu::DeviceSet devices(1);
  mgpu::Buffer<float> p(devices[0], 1), g(devices[0], 1), m(devices[0], 1), v(devices[0], 1);
  CHECK_THROWS_WITH_AS(mgpu::adamw_update(devices[0], p.data(), g.data(), m.data(), v.data(), 1, {}, 0),
                       doctest::Contains("step 0"), mgpu::Error);
}
