// Chapter 10's hidden cases: im2col_element and col2im_element (ex10.im2col_element,
// ex10.col2im_element) at every index, against chapter 09's im2col and col2im, bit for bit, on
// shapes the visible tests never use: a 7x7 kernel with stride 3, padding as wide as the kernel
// (windows wholly in the padding), a stride larger than the kernel (pixels no window sees),
// one-pixel images, and a batch of five; apply_vec4 (ex10.apply_vec4) on rows of 4 values, 37
// channels and values that land exactly on ReLU's kink.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <string>
#include <vector>

#include "../../chapters/10_fast_kernels/kernels.h"
#include "common/random.h"
#include "helpers.h"

namespace {

using nn::ConvShape;
using nn::ImageShape;

struct Shape {
  ImageShape xs;  // channels, batch, height, width
  ConvShape c;    // in_channels, out_channels, kernel, stride, padding
};

std::vector<Shape> hidden_shapes() {
  return {
      {{2, 2, 11, 9}, {2, 3, 7, 3, 3}},  // 7x7, stride 3, padding 3
      {{1, 3, 4, 4}, {1, 2, 3, 1, 3}},   // padding 3 with a 3x3 kernel: whole windows in the padding
      {{3, 2, 9, 8}, {3, 2, 2, 4, 0}},   // stride 4 > kernel 2: pixels no window sees get 0
      {{4, 5, 1, 1}, {4, 2, 1, 1, 0}},   // one-pixel images, a batch of five
      {{2, 1, 1, 1}, {2, 2, 3, 2, 1}},   // one pixel, a 3x3 window around it
  };
}

std::string label(const Shape& s) {
  return std::to_string(s.xs.channels) + "x" + std::to_string(s.xs.batch) + "x" + std::to_string(s.xs.height) + "x" +
         std::to_string(s.xs.width) + " k" + std::to_string(s.c.kernel) + " s" + std::to_string(s.c.stride) + " p" +
         std::to_string(s.c.padding);
}

// How many elements' bits differ.
std::size_t bits_differ(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  return bad;
}

}  // namespace

TEST_CASE("hidden im2col_element: a 7x7 kernel with stride 3, windows in the padding, one-pixel images") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1010);
  for (const Shape& s : hidden_shapes()) {
    CAPTURE(label(s));
    const std::vector<float> x = testing::random_floats(s.xs.size(), rng);
    const auto x_dev = testing::on_device(d, x);
    const std::int64_t cols = nn::conv_col_size(s.xs, s.c);
    auto want = testing::poisoned(d, cols);
    nn::im2col(d, x_dev.data(), s.xs, s.c, want.data());
    std::vector<float> col(cols, 1.0e30f);
    const fast::Im2colArgs a = fast::im2col_args(x.data(), s.xs, s.c, col.data());
    REQUIRE(a.count == cols);
    for (int idx = 0; idx < a.count; ++idx) fast::im2col_element(a, idx);
    CHECK(bits_differ(col, want.download()) == 0);
  }
}

TEST_CASE("hidden col2im_element: the same shapes, and a stride larger than the kernel") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1011);
  for (const Shape& s : hidden_shapes()) {
    CAPTURE(label(s));
    const std::int64_t cols = nn::conv_col_size(s.xs, s.c);
    const std::vector<float> col = testing::random_floats(cols, rng);
    const auto col_dev = testing::on_device(d, col);
    auto want = testing::poisoned(d, s.xs.size());
    nn::col2im(d, col_dev.data(), s.xs, s.c, want.data());
    std::vector<float> dx(s.xs.size(), 1.0e30f);
    const fast::Col2imArgs a = fast::col2im_args(col.data(), s.xs, s.c, dx.data());
    REQUIRE(a.count == s.xs.size());
    for (int idx = 0; idx < a.count; ++idx) fast::col2im_element(a, idx);
    CHECK(bits_differ(dx, want.download()) == 0);
  }
}

TEST_CASE("hidden apply_vec4: rows of 4 values, 37 channels, values on ReLU's kink, every residual and ReLU choice") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1012);
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{37, 4}, {2, 8}, {1, 1024}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    std::vector<float> z = testing::random_floats(std::size_t(C) * n, rng);
    const std::vector<float> residual = testing::random_floats(z.size(), rng);
    std::vector<float> stats = testing::random_floats(2 * C, rng);
    const std::vector<float> gamma = testing::random_floats(C, rng), beta(C, 0.0f);
    for (int c = 0; c < C; ++c) stats[C + c] = 0.5f + std::abs(stats[C + c]);
    for (int c = 0; c < C; ++c) z[std::size_t(c) * n] = stats[c];  // each row's first value: exactly 0 after the shift
    for (const bool with_residual : {false, true})
      for (const bool relu : {false, true}) {
        CAPTURE(C);
        CAPTURE(n);
        CAPTURE(with_residual);
        CAPTURE(relu);
        const auto z_dev = testing::on_device(d, z), res_dev = testing::on_device(d, residual);
        const auto stats_dev = testing::on_device(d, stats), gamma_dev = testing::on_device(d, gamma);
        const auto beta_dev = testing::on_device(d, beta);
        auto want = testing::poisoned(d, z.size());
        nn::batch_norm_apply(d, z_dev.data(), C, n, stats_dev.data(), gamma_dev.data(), beta_dev.data(),
                             with_residual ? res_dev.data() : nullptr,
                             relu ? lenet::Activation::Relu : lenet::Activation::None, want.data());
        std::vector<float> y(z.size(), 1.0e30f);
        const fast::ApplyArgs a = fast::apply_args(z.data(), C, n, stats.data(), gamma.data(), beta.data(),
                                                   with_residual ? residual.data() : nullptr, relu, y.data());
        REQUIRE(a.vec4);
        REQUIRE(a.count == C * n / 4);
        for (int q = 0; q < a.count; ++q) fast::apply_vec4(a, q);
        CHECK(bits_differ(y, want.download()) == 0);
      }
  }
}
