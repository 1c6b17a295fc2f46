// Chapter 10's hidden cases: im2col_element and col2im_element (ex10.im2col_element,
// ex10.col2im_element) at every index, against chapter 09's im2col and col2im, bit for bit, on
// shapes the visible tests never use: a 7x7 kernel with stride 3, padding as wide as the kernel
// (windows wholly in the padding), a stride larger than the kernel (pixels no window sees),
// one-pixel images, and a batch of five.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
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
