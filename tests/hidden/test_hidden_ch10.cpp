// Chapter 10's hidden cases: im2col_element and col2im_element (ex10.im2col_element,
// ex10.col2im_element) at every index, against chapter 09's im2col and col2im, bit for bit, on
// shapes the visible tests never use: a 7x7 kernel with stride 3, padding as wide as the kernel
// (windows wholly in the padding), a stride larger than the kernel (pixels no window sees),
// one-pixel images, and a batch of five; apply_vec4 (ex10.apply_vec4) on rows of 4 values, 37
// channels and values that land exactly on ReLU's kink.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../chapters/10_fast_kernels/kernels.h"
#include "common/random.h"
#include "fast_kernels_checks.h"  // ConvCase, check_bitwise, the apply's inputs and checks
#include "helpers.h"

namespace {

using testing::ConvCase;

std::vector<ConvCase> hidden_shapes() {
  return {
      {{2, 2, 11, 9}, {2, 3, 7, 3, 3}},  // 7x7, stride 3, padding 3
      {{1, 3, 4, 4}, {1, 2, 3, 1, 3}},   // padding 3 with a 3x3 kernel: whole windows in the padding
      {{3, 2, 9, 8}, {3, 2, 2, 4, 0}},   // stride 4 > kernel 2: pixels no window sees get 0
      {{4, 5, 1, 1}, {4, 2, 1, 1, 0}},   // one-pixel images, a batch of five
      {{2, 1, 1, 1}, {2, 2, 3, 2, 1}},   // one pixel, a 3x3 window around it
  };
}

}  // namespace

TEST_CASE("hidden im2col_element: a 7x7 kernel with stride 3, windows in the padding, one-pixel images") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1010);
  for (const ConvCase& s : hidden_shapes()) {
    CAPTURE(testing::label(s));
    const std::vector<float> x = testing::random_floats(s.xs.size(), rng);
    const auto x_dev = testing::on_device(d, x);
    const std::int64_t cols = nn::conv_col_size(s.xs, s.c);
    auto want = testing::poisoned(d, cols);
    nn::im2col(d, x_dev.data(), s.xs, s.c, want.data());
    std::vector<float> col(cols, 1.0e30f);
    const fast::Im2colArgs a = fast::im2col_args(x.data(), s.xs, s.c, col.data());
    REQUIRE(a.count == cols);
    for (int idx = 0; idx < a.count; ++idx) fast::im2col_element(a, idx);
    testing::check_bitwise(col, want.download(), "im2col " + testing::label(s));
  }
}

TEST_CASE("hidden col2im_element: the same shapes, and a stride larger than the kernel") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1011);
  for (const ConvCase& s : hidden_shapes()) {
    CAPTURE(testing::label(s));
    const std::int64_t cols = nn::conv_col_size(s.xs, s.c);
    const std::vector<float> col = testing::random_floats(cols, rng);
    const auto col_dev = testing::on_device(d, col);
    auto want = testing::poisoned(d, s.xs.size());
    nn::col2im(d, col_dev.data(), s.xs, s.c, want.data());
    std::vector<float> dx(s.xs.size(), 1.0e30f);
    const fast::Col2imArgs a = fast::col2im_args(col.data(), s.xs, s.c, dx.data());
    REQUIRE(a.count == s.xs.size());
    for (int idx = 0; idx < a.count; ++idx) fast::col2im_element(a, idx);
    testing::check_bitwise(dx, want.download(), "col2im " + testing::label(s));
  }
}

TEST_CASE("hidden apply_vec4: rows of 4 values, 37 channels, values on ReLU's kink, every residual and ReLU choice") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1012);
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{37, 4}, {2, 8}, {1, 1024}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    testing::ApplyInputs in(C, n, rng);
    in.beta.assign(C, 0.0f);
    for (int c = 0; c < C; ++c) in.z[std::size_t(c) * n] = in.stats[c];  // each row's first value: exactly 0 after the shift
    CAPTURE(C);
    CAPTURE(n);
    testing::for_each_apply_choice(d, in, [&](const std::vector<float>& want, std::vector<float>& y,
                                              const fast::ApplyArgs& a) {
      REQUIRE(a.vec4);
      REQUIRE(a.count == C * n / 4);
      for (int q = 0; q < a.count; ++q) fast::apply_vec4(a, q);
      testing::check_host_apply(y, want, "apply_vec4");  // bit for bit on a CPU, a rounding on a GPU
    });
  }
}
