// What the device suites share: seeded test data, comparisons that report the first element
// that is off, and central finite differences.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/01_lenet/lenet.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/random.h"
#include "reference.h"

namespace testing {

// n numbers uniform in [lo, hi), the same ones on every run and every machine.
inline std::vector<float> random_floats(std::size_t n, mgpu::Rng& rng, double lo = -1.0, double hi = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return v;
}

// n random images [n][28][28] with pixels in [0, 1) and random labels, on the host.
inline mgpu::LabeledImages random_set(int n, mgpu::Rng& rng) {
  mgpu::LabeledImages s;
  s.count = n;
  s.rows = s.cols = 28;
  s.pixels = random_floats(std::size_t(n) * 28 * 28, rng, 0.0, 1.0);
  for (int i = 0; i < n; ++i) s.labels.push_back(static_cast<std::int32_t>(rng.below(10)));
  return s;
}

// A buffer on d holding a copy of `host`.
inline mgpu::Buffer<float> on_device(const mgpu::Device& d, const std::vector<float>& host) {
  mgpu::Buffer<float> b(d, host.size());
  b.upload(host);
  return b;
}

// A buffer on d filled with a value no correct computation produces, so a function that is
// meant to OVERWRITE its output is caught if it leaves an element alone (or adds to it).
inline mgpu::Buffer<float> poisoned(const mgpu::Device& d, std::size_t n) {
  mgpu::Buffer<float> b(d, n);
  b.upload(std::vector<float>(n, 1.0e30f));
  return b;
}

// Indices to probe in a tensor of n elements: all of them when n <= count, else the first,
// the last and count - 2 random ones in between (the ends are where index arithmetic slips).
inline std::vector<std::size_t> sample_indices(std::size_t n, std::size_t count, mgpu::Rng& rng) {
  std::vector<std::size_t> idx;
  if (n <= count) {
    for (std::size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  idx = {0, n - 1};
  while (idx.size() < count) idx.push_back(rng.below(n));
  return idx;
}

// got (the library, float) against want (the reference, double), element by element:
//   |got[i] - want[i]| <= rtol * (|want[i]| + max_j |want[j]|)
// The second term measures error against the tensor's own scale: a sum of many terms can
// cancel to nearly zero, and float cannot match such an element to rtol of itself.
// On failure, says how many elements are off and shows the worst one (named by where[i]
// when the elements were picked out of a larger tensor).
inline void check_close(const std::vector<float>& got, const ref::Tensor& want, double rtol, const std::string& what,
                        const std::vector<std::size_t>* where = nullptr) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": " << got.size() << " elements, expected " << want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  std::size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    const double tol = rtol * (std::abs(want[i]) + scale);
    if (!(err <= tol)) {  // written so that a NaN counts as bad
      ++bad;
      if (bad == 1 || err / tol > worst_excess) worst = i, worst_excess = err / tol;
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " elements off by more than rtol "
                               << rtol << "; worst at [" << (where ? (*where)[worst] : worst) << "]: got " << (bad ? got[worst] : 0.0f)
                               << ", expected " << (bad ? want[worst] : 0.0));
}

// Whether any element is nonzero: a gradient check that compares two zero tensors would pass
// whatever the code did, so the checks that compare gradients ask this too.
inline bool has_nonzero(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; });
}

// Bit-for-bit equality, reporting the first difference.
inline void check_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": " << got.size() << " elements, expected " << want.size());
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  const std::size_t i = diff.first - got.begin();
  CHECK_MESSAGE(diff.first == got.end(), what << ": first difference at [" << i << "]: got "
                                              << (i < got.size() ? got[i] : 0.0f) << ", expected "
                                              << (i < want.size() ? want[i] : 0.0f));
}

// The derivative of loss() with respect to theta[i] by central differences:
//   (L(theta + eps e_i) - L(theta - eps e_i)) / (2 eps)
// Exact for a function that is linear in theta[i] (up to rounding), and off by
// O(eps^2) for a smooth one. theta is restored before returning.
// v - start, element by element: what a backward pass ADDED into a gradient that held `start`.
inline std::vector<float> minus(const std::vector<float>& v, float start) {
  std::vector<float> r;
  for (float x : v) r.push_back(x - start);
  return r;
}

// A layer's backward pass called a second time on the same input: the parameter gradients dW
// and db, added into, are twice the first call's (gW, gb: how a batch's chunks sum up), and the
// input gradient dx, overwritten, is the first call's again, bit for bit (gx).
template <class Backward>
void check_second_call(Backward backward, const mgpu::Buffer<float>& dW, const std::vector<float>& gW,
                       const mgpu::Buffer<float>& db, const std::vector<float>& gb, const mgpu::Buffer<float>& dx,
                       const std::vector<float>& gx, double rtol) {
  backward();
  ref::Tensor twice_W, twice_b;
  for (float g : gW) twice_W.push_back(2.0 * g);
  for (float g : gb) twice_b.push_back(2.0 * g);
  check_close(dW.download(), twice_W, rtol, "dW after two calls");
  check_close(db.download(), twice_b, rtol, "db after two calls");
  check_equal(dx.download(), gx, "dx after two calls");
}

template <class Loss>
double central_difference(ref::Tensor& theta, std::size_t i, double eps, Loss loss) {
  const double saved = theta[i];
  theta[i] = saved + eps;
  const double up = loss();
  theta[i] = saved - eps;
  const double down = loss();
  theta[i] = saved;
  return (up - down) / (2 * eps);
}

// The library's gradient `got` (the whole tensor, downloaded) against central differences
// of loss() with respect to theta at the indices `at`. Passes when every probed element
// satisfies check_close's rule with the given rtol.
template <class Loss>
void check_gradient(const std::vector<float>& got, ref::Tensor& theta, const std::vector<std::size_t>& at,
                    double eps, double rtol, Loss loss, const std::string& what) {
  REQUIRE(got.size() == theta.size());
  std::vector<float> probed;
  ref::Tensor expected;
  for (std::size_t i : at) {
    probed.push_back(got[i]);
    expected.push_back(central_difference(theta, i, eps, loss));
  }
  check_close(probed, expected, rtol, what + " vs finite differences", &at);
}

// A layer's three gradients, dW, db and dx, each against the central differences of loss() with
// respect to W, b and x, at `probes` elements of each tensor (every element of a smaller one).
template <class Loss>
void check_layer_gradients(const std::vector<float>& gW, ref::Tensor& W, const std::vector<float>& gb, ref::Tensor& b,
                           const std::vector<float>& gx, ref::Tensor& x, std::size_t probes, mgpu::Rng& rng,
                           double eps, double rtol, Loss loss) {
  check_gradient(gW, W, sample_indices(W.size(), probes, rng), eps, rtol, loss, "dW");
  check_gradient(gb, b, sample_indices(b.size(), probes, rng), eps, rtol, loss, "db");
  check_gradient(gx, x, sample_indices(x.size(), probes, rng), eps, rtol, loss, "dx");
}

// got and want differ only by the order of float additions: per tensor, no element is further
// apart than a thousandth of how far the tensor moved from `start` (plus 1e-5). And each
// tensor did move, or the comparison would say nothing.
inline void check_same_training(const lenet::HostParams& got, const lenet::HostParams& want,
                                const lenet::HostParams& start, const std::string& what) {
  for (int t = 0; t < lenet::kParamTensors; ++t) {
    CAPTURE(what);
    CAPTURE(lenet::kParams[t].name);
    double worst = 0, moved = 0;
    for (std::size_t j = 0; j < want[t].size(); ++j) {
      worst = std::max(worst, double(std::abs(got[t][j] - want[t][j])));
      moved = std::max(moved, double(std::abs(want[t][j] - start[t][j])));
    }
    CHECK(moved > 1e-4);
    CHECK(worst <= 1e-5 + 1e-3 * moved);
  }
}

}  // namespace testing
