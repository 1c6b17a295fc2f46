// Chapter 09's layer library (chapters/09_resnet/layers.h) held against plain loops: every
// forward by value, every backward by finite differences, as test_layers.cpp does for LeNet's.
//
// How a backward is checked (as in test_layers.cpp). Take the scalar loss L = <out, R> for a
// fixed random R: its gradient with respect to the layer's output is R itself, so R goes into
// the backward function, and what comes out must be dL/dinput and dL/dparams. Those we also get
// without calculus: nudge one input by +-eps, re-run the REFERENCE forward below (in double) and
// take the central difference. A convolution and a pooling are linear in each input, so there
// the differences are exact up to double rounding. BatchNorm is not: its test says why central
// differences are still good enough there.
//
// The reference loops of chapter 01 (tests/reference.h) know neither stride nor padding nor
// BatchNorm; the new ones are in namespace nnref just below, one short function per formula.
// Shapes are small and odd (3 channels, 2 images, 7x5 pixels): a swapped height and width, or
// an index that only works for square even images, shows up there.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "chapters/01_lenet/layers.h"
#include "chapters/09_resnet/layers.h"
#include "common/check.h"
#include "common/device.h"
#include "common/random.h"
#include "helpers.h"
#include "reference.h"

// ------------------------------------------------------------------ the reference loops
// In double, on the host, in the library's layout: images [C][B][H][W], a BatchNorm input seen
// as [C][n] (n = B*H*W values per channel), conv W [Cout][Cin][k][k].
namespace nnref {

using ref::Shape;
using ref::Tensor;

// The number of positions o = 0, 1, ... of a k-wide window at o*s - p that still fits inside
// the padded input [-p, in + p): counted, not computed, so that it checks (in + 2p - k)/s + 1.
inline int out_size(int in, int k, int s, int p) {
  int o = 0;
  while (o * s - p + k <= in + p) ++o;
  return o;
}

// x[c][b][y][x], or 0 where (y, x) lies in the zero padding around the image.
inline double pixel(const Tensor& x, Shape s, int c, int b, int y, int xx) {
  return y < 0 || y >= s.H || xx < 0 || xx >= s.W ? 0.0 : x[s.at(c, b, y, xx)];
}

// col [Cin*k*k][B*Ho*Wo]: row (c, ky, kx), column (b, oy, ox) holds
//   x[c][b][oy*s + ky - p][ox*s + kx - p]   (0 in the padding)
// The loops run in the order of col's layout, so each value is simply appended.
inline Tensor im2col(const Tensor& x, Shape s, nn::ConvShape c) {
  const int Ho = out_size(s.H, c.kernel, c.stride, c.padding), Wo = out_size(s.W, c.kernel, c.stride, c.padding);
  Tensor col;
  for (int ch = 0; ch < s.C; ++ch)
    for (int ky = 0; ky < c.kernel; ++ky)
      for (int kx = 0; kx < c.kernel; ++kx)
        for (int b = 0; b < s.B; ++b)
          for (int oy = 0; oy < Ho; ++oy)
            for (int ox = 0; ox < Wo; ++ox)
              col.push_back(pixel(x, s, ch, b, oy * c.stride + ky - c.padding, ox * c.stride + kx - c.padding));
  return col;
}

// Strided, zero-padded convolution (cross-correlation):
//   z[o][b][oy][ox] = bias[o] + sum over c, ky, kx of W[o][c][ky][kx] * x[c][b][oy*s + ky - p][ox*s + kx - p]
inline Tensor conv2d(const Tensor& x, Shape s, nn::ConvShape c, const Tensor& W, const Tensor& bias) {
  const int k = c.kernel, Ho = out_size(s.H, k, c.stride, c.padding), Wo = out_size(s.W, k, c.stride, c.padding);
  Tensor z;  // [Cout][B][Ho][Wo], appended in that order
  for (int o = 0; o < c.out_channels; ++o)
    for (int b = 0; b < s.B; ++b)
      for (int oy = 0; oy < Ho; ++oy)
        for (int ox = 0; ox < Wo; ++ox) {
          double sum = bias[o];
          for (int ch = 0; ch < s.C; ++ch)
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx)
                sum += W[((std::size_t(o) * s.C + ch) * k + ky) * k + kx] *
                       pixel(x, s, ch, b, oy * c.stride + ky - c.padding, ox * c.stride + kx - c.padding);
          z.push_back(sum);
        }
  return z;
}

// Each channel's mean and BIASED variance (divided by n, what BatchNorm normalizes with), two
// passes over z [C][n]:   mean[c] = (1/n) sum_j z[c][j],   var[c] = (1/n) sum_j (z[c][j] - mean[c])^2
struct Moments {
  Tensor mean, var;
};
inline Moments moments(const Tensor& z, int C, std::size_t n) {
  Moments m{Tensor(C, 0.0), Tensor(C, 0.0)};
  for (int c = 0; c < C; ++c) {
    for (std::size_t j = 0; j < n; ++j) m.mean[c] += z[c * n + j] / n;
    for (std::size_t j = 0; j < n; ++j) m.var[c] += (z[c * n + j] - m.mean[c]) * (z[c * n + j] - m.mean[c]) / n;
  }
  return m;
}

// 1 / sqrt(var + eps), per channel.
inline Tensor inv_std(const Tensor& var, double eps) {
  Tensor r;
  for (double v : var) r.push_back(1.0 / std::sqrt(v + eps));
  return r;
}

// BatchNorm's normalization, given the statistics, with the residual add and the ReLU after it:
//   y[c][j] = act(gamma[c] * (z[c][j] - mean[c]) * inv_std[c] + beta[c] + residual[c][j])
// act = max(., 0) or nothing; residual may be null.
inline Tensor batch_norm_apply(const Tensor& z, int C, std::size_t n, const Tensor& mean, const Tensor& inv_std,
                               const Tensor& gamma, const Tensor& beta, const Tensor* residual, bool relu) {
  Tensor y(z.size());
  for (int c = 0; c < C; ++c)
    for (std::size_t j = 0; j < n; ++j) {
      double v = gamma[c] * (z[c * n + j] - mean[c]) * inv_std[c] + beta[c];
      if (residual) v += (*residual)[c * n + j];
      y[c * n + j] = relu && v < 0 ? 0.0 : v;
    }
  return y;
}

// BatchNorm in training: every channel normalized by its OWN batch's statistics,
//   y = gamma * (z - mean) / sqrt(var + eps) + beta,   mean, var (biased) = moments(z)
// Recomputed from z on every call, so finite differences of it include the paths through the
// mean and the variance.
inline Tensor batch_norm_train(const Tensor& z, int C, std::size_t n, const Tensor& gamma, const Tensor& beta,
                               double eps) {
  const Moments m = moments(z, C, n);
  return batch_norm_apply(z, C, n, m.mean, inv_std(m.var, eps), gamma, beta, nullptr, false);
}

// One step of the running statistics after a batch of `count` values per channel (PyTorch's rule):
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var * count / (count - 1)   (unbiased)
inline void update_running(Tensor& running_mean, Tensor& running_var, const Moments& m, double count,
                           double momentum) {
  for (std::size_t c = 0; c < running_mean.size(); ++c) {
    running_mean[c] = (1 - momentum) * running_mean[c] + momentum * m.mean[c];
    running_var[c] = (1 - momentum) * running_var[c] + momentum * m.var[c] * count / (count - 1);
  }
}

// BatchNorm in evaluation: the running statistics instead of the batch's,
//   y = gamma * (z - running_mean) / sqrt(running_var + eps) + beta
inline Tensor batch_norm_eval(const Tensor& z, int C, std::size_t n, const Tensor& running_mean,
                              const Tensor& running_var, const Tensor& gamma, const Tensor& beta, double eps) {
  return batch_norm_apply(z, C, n, running_mean, inv_std(running_var, eps), gamma, beta, nullptr, false);
}

// Global average pooling: y[c][b] = (1 / (H*W)) * sum over y, x of x[c][b][y][x]   ([C][B] out)
inline Tensor global_avg_pool(const Tensor& x, Shape s) {
  Tensor y(std::size_t(s.C) * s.B, 0.0);
  for (int c = 0; c < s.C; ++c)
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < s.H; ++i)
        for (int j = 0; j < s.W; ++j) y[std::size_t(c) * s.B + b] += x[s.at(c, b, i, j)] / (s.H * s.W);
  return y;
}

}  // namespace nnref

namespace {

using lenet::ImageShape;
using nn::ConvShape;
using testing::check_close;
using testing::check_equal;
using testing::check_gradient;
using testing::minus;
using testing::on_device;
using testing::poisoned;
using testing::random_floats;
using testing::sample_indices;

constexpr double kTol = 1e-5;        // float against double: a few units in float's last place, at the tensor's scale
constexpr double kEps = 1e-3;        // finite-difference step
constexpr std::size_t kProbes = 40;  // elements probed per gradient tensor (all, when it is smaller)
constexpr float kBnEps = 1e-5f;      // BatchNorm's eps and momentum, PyTorch's defaults
constexpr float kMomentum = 0.1f;

ref::Shape shape_of(ImageShape s) { return {s.channels, s.batch, s.height, s.width}; }

std::string describe(ImageShape s, ConvShape c) {
  return std::to_string(s.channels) + "x" + std::to_string(s.batch) + "x" + std::to_string(s.height) + "x" +
         std::to_string(s.width) + " -> " + std::to_string(c.out_channels) + " channels, k" +
         std::to_string(c.kernel) + " s" + std::to_string(c.stride) + " p" + std::to_string(c.padding);
}


// ------------------------------------------------------------------------- convolution

TEST_CASE("conv_output_size is (in + 2p - k) / s + 1: ResNet-18's sides and some odd ones") {
  struct SizeCase {
    int in, k, s, p, out;
  };
  const SizeCase cases[] = {
      {28, 3, 1, 1, 28},  // a 3x3 convolution with padding 1 keeps the side ("same")
      {28, 3, 2, 1, 14},  // the first convolution of a stage halves it ...
      {14, 3, 2, 1, 7},
      {7, 3, 2, 1, 4},    // ... rounding up on an odd side: the last window hangs into the padding
      {7, 1, 2, 0, 4},    // the 1x1 stride-2 shortcut beside it lands on the same 4x4
      {28, 1, 2, 0, 14},
      {5, 5, 1, 0, 1},    // the window is the whole image
      {8, 3, 2, 0, 3},    // windows at 0, 2, 4: pixel 7 is in none (floor division)
      {6, 2, 3, 0, 2},    // windows at 0, 3: a stride longer than the kernel skips pixels 2 and 5
      {4, 1, 1, 1, 6},    // padding wider than a 1x1 kernel reaches: outputs that see only padding
  };
  for (const SizeCase& c : cases) {
    INFO("in ", c.in, ", k ", c.k, ", s ", c.s, ", p ", c.p);
    CHECK(nn::conv_output_size(c.in, c.k, c.s, c.p) == c.out);
    CHECK(nnref::out_size(c.in, c.k, c.s, c.p) == c.out);  // the counting reference agrees
  }
  // A shape: channels from the convolution, batch kept, each side on its own.
  const ImageShape xs{3, 2, 7, 5};
  const ImageShape zs = nn::conv_output_shape(xs, ConvShape{3, 8, 3, 2, 1});
  CHECK(zs.channels == 8);
  CHECK(zs.batch == 2);
  CHECK(zs.height == 4);
  CHECK(zs.width == 3);
  // col holds Cin*k*k rows of B*Ho*Wo: 3*3*3 * 2*4*3.
  CHECK(nn::conv_col_size(xs, ConvShape{3, 8, 3, 2, 1}) == 27 * 24);
}

// A convolution to test: input shape and (Cin, Cout, k, s, p).
struct ConvCase {
  ImageShape x;
  ConvShape c;
};
const ConvCase kConvCases[] = {
    {{3, 2, 7, 5}, {3, 4, 3, 2, 1}},  // ResNet's downsampling 3x3, on an odd, non-square image
    {{3, 2, 7, 5}, {3, 4, 1, 2, 0}},  // ... and its 1x1 shortcut
    {{3, 2, 7, 5}, {3, 4, 3, 1, 1}},  // ResNet's ordinary 3x3
    {{3, 2, 7, 5}, {3, 4, 2, 3, 0}},  // stride > kernel: pixels no window sees
    {{3, 2, 7, 5}, {3, 4, 5, 1, 2}},  // a 5x5 with padding 2: most windows touch the padding
    {{2, 3, 4, 6}, {2, 3, 1, 1, 1}},  // a border of outputs that see only padding (z = bias there)
    {{8, 2, 7, 7}, {8, 16, 3, 2, 1}}, // stage 4's entry at 7x7 -> 4x4 (channels scaled down)
};

// Everything one convolution needs, random and on the device.
struct Conv {
  ImageShape xs, zs;
  ConvShape c;
  std::vector<float> x, W, b;  // x [Cin][B][H][W], W [Cout][Cin][k][k], b [Cout]
  mgpu::Buffer<float> x_d, W_d, b_d, ones;
  Conv(const mgpu::Device& d, const ConvCase& cc, mgpu::Rng& rng)
      : xs(cc.x), zs(nn::conv_output_shape(cc.x, cc.c)), c(cc.c), x(random_floats(xs.size(), rng)),
        W(random_floats(std::size_t(c.out_channels) * c.in_channels * c.kernel * c.kernel, rng)),
        b(random_floats(c.out_channels, rng)), x_d(on_device(d, x)), W_d(on_device(d, W)), b_d(on_device(d, b)),
        ones(on_device(d, std::vector<float>(std::size_t(zs.batch) * zs.height * zs.width, 1.0f))) {}
  std::size_t col_size() const { return std::size_t(nn::conv_col_size(xs, c)); }
  ref::Tensor reference(const ref::Tensor& xv, const ref::Tensor& Wv, const ref::Tensor& bv) const {
    return nnref::conv2d(xv, shape_of(xs), c, Wv, bv);
  }
};

TEST_CASE("im2col copies every strided, padded window into one column; padding entries are exactly 0") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(901);
  for (const ConvCase& cc : kConvCases) {
    INFO(describe(cc.x, cc.c));
    Conv conv(d, cc, rng);
    const ref::Tensor want = nnref::im2col(ref::to_double(conv.x), shape_of(conv.xs), conv.c);
    REQUIRE(want.size() == conv.col_size());
    mgpu::Buffer<float> col = poisoned(d, conv.col_size());
    nn::im2col(d, conv.x_d.data(), conv.xs, conv.c, col.data());
    // A copy does no arithmetic: exact (rtol 0). That includes every padding entry, which the
    // reference holds at 0: one left alone would still hold the poison, 1e30.
    check_close(col.download(), want, 0.0, "col");
  }
}

// col2im is what the backward pass runs; what it must be is the transpose (adjoint) of im2col:
// for every x and every c,  <im2col(x), c> == <x, col2im(c)>.  Both sides are dot products of
// downloaded floats taken in double; the only float rounding is inside col2im's sums (k*k terms
// at most per pixel), so they must agree to ~1e-7 of the total |term| mass. One misplaced,
// missing or doubled col entry would be off by about 1/N of that mass (N = col's size, here
// 10^2 .. 10^4): far more.
TEST_CASE("col2im is the adjoint of im2col, and overwrites its output") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(902);
  for (const ConvCase& cc : kConvCases) {
    INFO(describe(cc.x, cc.c));
    Conv conv(d, cc, rng);
    for (int trial = 0; trial < 3; ++trial) {  // a few random pairs (x, c)
      const std::vector<float> x = random_floats(conv.xs.size(), rng), cv = random_floats(conv.col_size(), rng);
      mgpu::Buffer<float> x_d = on_device(d, x), c_d = on_device(d, cv);
      mgpu::Buffer<float> col = poisoned(d, conv.col_size()), dx = poisoned(d, conv.xs.size());
      nn::im2col(d, x_d.data(), conv.xs, conv.c, col.data());
      nn::col2im(d, c_d.data(), conv.xs, conv.c, dx.data());
      const std::vector<float> colv = col.download(), dxv = dx.download();
      int untouched = 0;  // pixels no window sees must come out 0, not keep the poison
      for (float v : dxv) untouched += v == 1.0e30f;
      CHECK_MESSAGE(untouched == 0, untouched << " elements of dx were not written");
      double lhs = 0, rhs = 0, mass = 0;
      for (std::size_t j = 0; j < colv.size(); ++j) {
        lhs += double(colv[j]) * cv[j];
        mass += std::abs(double(colv[j]) * cv[j]);
      }
      for (std::size_t i = 0; i < x.size(); ++i) rhs += double(x[i]) * dxv[i];
      CHECK_MESSAGE(std::abs(lhs - rhs) <= 1e-6 * mass,
                    "<im2col(x), c> = " << lhs << " but <x, col2im(c)> = " << rhs << " (mass " << mass << ")");
    }
  }
}

TEST_CASE("conv2d_forward matches the strided, padded reference convolution, bias included") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(903);
  for (const ConvCase& cc : kConvCases) {
    INFO(describe(cc.x, cc.c));
    Conv conv(d, cc, rng);
    mgpu::Buffer<float> col = poisoned(d, conv.col_size()), z = poisoned(d, conv.zs.size());
    nn::conv2d_forward(d, conv.x_d.data(), conv.xs, conv.c, conv.W_d.data(), conv.b_d.data(), col.data(), z.data());
    check_close(z.download(), conv.reference(ref::to_double(conv.x), ref::to_double(conv.W), ref::to_double(conv.b)),
                kTol, "z");
  }
}

TEST_CASE("conv2d_backward: dW, db, dx match finite differences; dW and db are added into, dx overwritten") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(904);
  // The parameter gradients start at known nonzero values: whatever the call ADDED is the
  // downloaded value minus the start. A call that overwrote them would lose the start.
  const float W_start = 0.5f, b_start = -0.25f;
  for (const ConvCase& cc : kConvCases) {
    INFO(describe(cc.x, cc.c));
    Conv conv(d, cc, rng);
    const std::vector<float> R = random_floats(conv.zs.size(), rng);  // dL/dz [Cout][B][Ho][Wo]
    mgpu::Buffer<float> dz = on_device(d, R), col(d, conv.col_size()), dcol(d, conv.col_size());
    mgpu::Buffer<float> dW = on_device(d, std::vector<float>(conv.W.size(), W_start));
    mgpu::Buffer<float> db = on_device(d, std::vector<float>(conv.b.size(), b_start));
    mgpu::Buffer<float> dx = poisoned(d, conv.x.size());
    // No forward pass first: the backward unfolds x into col itself.
    nn::conv2d_backward(d, dz.data(), conv.x_d.data(), conv.xs, conv.c, conv.W_d.data(), conv.ones.data(),
                        col.data(), dcol.data(), dW.data(), db.data(), dx.data());
    const std::vector<float> dW_after = dW.download(), db_after = db.download();

    // L(x, W, b) = <conv2d(x, W, b), R>, in double: linear in each argument, so the central
    // differences are exact up to double rounding.
    ref::Tensor x = ref::to_double(conv.x), W = ref::to_double(conv.W), b = ref::to_double(conv.b);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(conv.reference(x, W, b), Rd); };
    check_gradient(minus(dW_after, W_start), W, sample_indices(W.size(), kProbes, rng), kEps, kTol, L, "dW");
    check_gradient(minus(db_after, b_start), b, sample_indices(b.size(), kProbes, rng), kEps, kTol, L, "db");
    check_gradient(dx.download(), x, sample_indices(x.size(), kProbes, rng), kEps, kTol, L, "dx");

    // dx == nullptr (a network's first convolution has no use for the images' gradient): the
    // same dW and db, to the bit.
    dW.upload(std::vector<float>(conv.W.size(), W_start));
    db.upload(std::vector<float>(conv.b.size(), b_start));
    nn::conv2d_backward(d, dz.data(), conv.x_d.data(), conv.xs, conv.c, conv.W_d.data(), conv.ones.data(),
                        col.data(), dcol.data(), dW.data(), db.data(), nullptr);
    check_equal(dW.download(), dW_after, "dW without dx");
    check_equal(db.download(), db_after, "db without dx");
  }
}

TEST_CASE("an input whose channel count is not the convolution's is refused") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const ImageShape xs{3, 2, 7, 5};
  const ConvShape c{2, 4, 3, 1, 1};  // expects 2 channels, is given 3
  // Buffers large enough for either reading, so that a missing check would fail the CHECK
  // below instead of writing out of bounds.
  const std::size_t big = std::size_t(nn::conv_col_size({3, 2, 7, 5}, {3, 4, 3, 1, 1}));
  mgpu::Buffer<float> x(d, big), W(d, big), b(d, big), ones(d, big), col(d, big), dcol(d, big), z(d, big);
  mgpu::Buffer<float> dW(d, big), db(d, big), dx(d, big);
  CHECK_THROWS_AS(nn::im2col(d, x.data(), xs, c, col.data()), mgpu::Error);
  CHECK_THROWS_AS(nn::col2im(d, col.data(), xs, c, dx.data()), mgpu::Error);
  CHECK_THROWS_AS(nn::conv2d_forward(d, x.data(), xs, c, W.data(), b.data(), col.data(), z.data()), mgpu::Error);
  CHECK_THROWS_AS(nn::conv2d_backward(d, z.data(), x.data(), xs, c, W.data(), ones.data(), col.data(), dcol.data(),
                                      dW.data(), db.data(), dx.data()),
                  mgpu::Error);
}

// The claim of layers.h: chapter 01's convolution is the special case stride 1, padding 0, so
// LeNet could be written with this library. Not "close": the same im2col copies, the same GEMM
// calls on the same operands, the same bias pass (the ReLU chapter 01 fuses into it is
// max(z + b, 0), relu_forward's max(z, 0) of the same z + b), the same col2im order.
TEST_CASE("nn's convolution with stride 1 and no padding IS chapter 01's, bit for bit (LeNet's conv1 and conv2)") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(905);
  const ConvCase lenet_cases[] = {
      {{1, 3, 28, 28}, {1, 20, 3, 1, 0}},   // conv1
      {{20, 3, 13, 13}, {20, 50, 5, 1, 0}}, // conv2
  };
  for (const ConvCase& cc : lenet_cases) {
    INFO(describe(cc.x, cc.c));
    Conv conv(d, cc, rng);
    const int k = conv.c.kernel, cout = conv.c.out_channels;
    const std::size_t nz = conv.zs.size();
    mgpu::Buffer<float> col_nn = poisoned(d, conv.col_size()), z_nn = poisoned(d, nz);
    mgpu::Buffer<float> col_lenet = poisoned(d, conv.col_size()), z_lenet = poisoned(d, nz);
    nn::conv2d_forward(d, conv.x_d.data(), conv.xs, conv.c, conv.W_d.data(), conv.b_d.data(), col_nn.data(),
                       z_nn.data());
    lenet::relu_forward(d, z_nn.data(), nz);
    lenet::conv2d_forward(d, conv.x_d.data(), conv.xs, conv.W_d.data(), conv.b_d.data(), cout, k,
                          lenet::Activation::Relu, col_lenet.data(), z_lenet.data());
    check_equal(z_nn.download(), z_lenet.download(), "relu(z)");
    check_equal(col_nn.download(), col_lenet.download(), "col");

    // Backward from the same dz: chapter 01 reads the col its forward pass kept; nn unfolds x
    // again into a scratch col (here a poisoned one, so a stale col could not help it).
    const std::vector<float> R = random_floats(nz, rng);
    mgpu::Buffer<float> dz = on_device(d, R), dcol_nn(d, conv.col_size()), dcol_lenet(d, conv.col_size());
    mgpu::Buffer<float> scratch = poisoned(d, conv.col_size());
    mgpu::Buffer<float> dW_nn(d, conv.W.size()), db_nn(d, conv.b.size()), dx_nn = poisoned(d, conv.x.size());
    mgpu::Buffer<float> dW_lenet(d, conv.W.size()), db_lenet(d, conv.b.size()), dx_lenet = poisoned(d, conv.x.size());
    dW_nn.zero(), db_nn.zero(), dW_lenet.zero(), db_lenet.zero();
    nn::conv2d_backward(d, dz.data(), conv.x_d.data(), conv.xs, conv.c, conv.W_d.data(), conv.ones.data(),
                        scratch.data(), dcol_nn.data(), dW_nn.data(), db_nn.data(), dx_nn.data());
    lenet::conv2d_backward(d, dz.data(), conv.xs, conv.W_d.data(), cout, k, col_lenet.data(), conv.ones.data(),
                           dW_lenet.data(), db_lenet.data(), dcol_lenet.data(), dx_lenet.data());
    check_equal(dW_nn.download(), dW_lenet.download(), "dW");
    check_equal(db_nn.download(), db_lenet.download(), "db");
    check_equal(dx_nn.download(), dx_lenet.download(), "dx");
  }
}

// --------------------------------------------------------------------------- BatchNorm

// Per-channel sums are accumulated in double and rounded to float once at the end, so each
// must be within float's half-ulp (6e-8) of its true value, i.e. well within 1e-7 of the sum
// of the |terms|. A dropped or doubled value is seen at that scale; the ends of each row,
// where an off-by-one drops or steals a value, hold a large one so that it would be.
TEST_CASE("batch_norm_sums: each channel's sum, for rows of 1 to 300001 values") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(906);
  const int C = 3;
  nn::ReductionScratch scratch(d, C);
  for (std::int64_t n : {std::int64_t(1), std::int64_t(7), std::int64_t(1000), std::int64_t(300001)}) {
    INFO("n = ", n);
    std::vector<float> z = random_floats(std::size_t(C) * n, rng, -1.0, 2.0);  // [C][n], mean 0.5: no cancelling
    for (int c = 0; c < C; ++c) {
      z[c * n + n - 1] = -1.75f;
      z[c * n] = 1.75f;  // (the same element when n == 1)
    }
    mgpu::Buffer<float> z_d = on_device(d, z), sums = poisoned(d, 2 * C);  // [2][C]; this pass fills [0]
    nn::batch_norm_sums(d, z_d.data(), C, n, scratch, sums.data());
    const std::vector<float> got = sums.download();
    for (int c = 0; c < C; ++c) {
      CAPTURE(c);
      double sum = 0, mass = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += z[c * n + j], mass += std::abs(z[c * n + j]);
      CHECK(std::abs(got[c] - sum) <= 1e-7 * mass);
    }
  }
}

// The second pass: sum (z - mean)^2 with mean = sums[0] / count, the first pass's result. Its
// terms are all positive, so it is good to float's rounding of the result however far the
// values sit from zero. Values around 1000 with a spread of 1 show why there are two passes:
// sum z^2 / n - mean^2 would be 10^6 - 10^6 in float, whose rounding (6e-8 * 10^6 = 0.06) is a
// fifth of the variance (1/3) itself. The mean taken from the ROUNDED sum is off by some
// delta ~ 1000 * 6e-8; that adds n * delta^2 to the sum (the cross term cancels), 1e-8 of it.
TEST_CASE("batch_norm_square_sums: each channel's sum of squared distances from its mean, even far from zero") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(913);
  const int C = 3;
  nn::ReductionScratch scratch(d, C);
  for (double centre : {0.5, 1000.0})
    for (std::int64_t n : {std::int64_t(1), std::int64_t(7), std::int64_t(1000), std::int64_t(300001)}) {
      INFO("values in [", centre - 1, ", ", centre + 1, "), n = ", n);
      const std::vector<float> z = random_floats(std::size_t(C) * n, rng, centre - 1, centre + 1);
      mgpu::Buffer<float> z_d = on_device(d, z), sums = poisoned(d, 2 * C);
      nn::batch_norm_sums(d, z_d.data(), C, n, scratch, sums.data());
      const std::vector<float> first = sums.download();
      nn::batch_norm_square_sums(d, z_d.data(), C, n, double(n), scratch, sums.data());
      const std::vector<float> got = sums.download();
      const nnref::Moments m = nnref::moments(ref::to_double(z), C, n);
      for (int c = 0; c < C; ++c) {
        CAPTURE(c);
        CHECK(got[c] == first[c]);  // the first pass's sum is read, not changed
        const double want = m.var[c] * n;  // sum (z - mean)^2; exactly 0 for a single value
        CHECK(std::abs(got[C + c] - want) <= 1e-6 * want);
      }
    }
  mgpu::Buffer<float> z(d, C), sums(d, 2 * C);
  z.zero(), sums.zero();
  CHECK_THROWS_AS(nn::batch_norm_square_sums(d, z.data(), C, 1, 0.0, scratch, sums.data()), mgpu::Error);
}

TEST_CASE("batch_norm_statistics: mean, 1/sqrt(biased var + eps), and the running statistics' momentum step") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const int C = 3;

  SUBCASE("from sums small enough to check by hand") {
    // sums [2][C] = (sum z, sum (z - mean)^2), count 10 in every channel:
    //   channel 0: 20, 10:   mean 2,    var 10/10 = 1,     unbiased 10/9
    //   channel 1: -3, 3.6:  mean -0.3, var 0.36,          unbiased 0.4
    //   channel 2: 3, 0:     ten values 0.3: var 0, so inv_std = 1/sqrt(eps) = 316.2
    mgpu::Buffer<float> sums = on_device(d, {20.0f, -3.0f, 3.0f, 10.0f, 3.6f, 0.0f});
    mgpu::Buffer<float> rm = on_device(d, {0.5f, -1.0f, 2.0f}), rv = on_device(d, {1.0f, 2.0f, 0.5f});
    mgpu::Buffer<float> stats = poisoned(d, 2 * C);
    nn::batch_norm_statistics(d, sums.data(), 10.0, C, kBnEps, kMomentum, rm.data(), rv.data(), stats.data());
    const std::vector<float> s = stats.download(), m = rm.download(), v = rv.download();
    const double eps = kBnEps, mom = kMomentum;  // as the library sees them (float, widened)
    CHECK(s[0] == doctest::Approx(2.0).epsilon(1e-7));
    CHECK(s[1] == doctest::Approx(-0.3).epsilon(1e-6));
    CHECK(s[2] == doctest::Approx(0.3).epsilon(1e-6));
    CHECK(s[3] == doctest::Approx(1 / std::sqrt(1.0 + eps)).epsilon(1e-6));
    CHECK(s[4] == doctest::Approx(1 / std::sqrt(0.36 + eps)).epsilon(1e-6));
    CHECK(s[5] == doctest::Approx(1 / std::sqrt(eps)).epsilon(1e-6));
    CHECK(m[0] == doctest::Approx((1 - mom) * 0.5 + mom * 2.0).epsilon(1e-6));
    CHECK(m[1] == doctest::Approx((1 - mom) * -1.0 + mom * -0.3).epsilon(1e-6));
    CHECK(m[2] == doctest::Approx((1 - mom) * 2.0 + mom * 0.3).epsilon(1e-6));
    CHECK(v[0] == doctest::Approx((1 - mom) * 1.0 + mom * 10.0 / 9.0).epsilon(1e-6));
    CHECK(v[1] == doctest::Approx((1 - mom) * 2.0 + mom * 0.4).epsilon(1e-6));
    CHECK(v[2] == doctest::Approx((1 - mom) * 0.5).epsilon(1e-6));
  }

  SUBCASE("from the two passes over data, against two-pass moments; twice, so the running statistics compound") {
    mgpu::Rng rng(907);
    const std::size_t n = 37;
    std::vector<float> z;  // [C][n], channel c around 2c - 1
    for (int c = 0; c < C; ++c)
      for (float v : random_floats(n, rng, 2.0 * c - 2.0, 2.0 * c)) z.push_back(v);
    const std::vector<float> rm0 = {0.25f, -0.5f, 1.0f}, rv0 = {1.0f, 0.5f, 2.0f};
    mgpu::Buffer<float> z_d = on_device(d, z), sums(d, 2 * C), stats = poisoned(d, 2 * C);
    mgpu::Buffer<float> rm = on_device(d, rm0), rv = on_device(d, rv0);
    nn::ReductionScratch scratch(d, C);
    const nnref::Moments mo = nnref::moments(ref::to_double(z), C, n);
    ref::Tensor want_rm = ref::to_double(rm0), want_rv = ref::to_double(rv0);
    for (int step = 1; step <= 2; ++step) {
      CAPTURE(step);
      nn::batch_norm_sums(d, z_d.data(), C, n, scratch, sums.data());
      nn::batch_norm_square_sums(d, z_d.data(), C, n, double(n), scratch, sums.data());
      nn::batch_norm_statistics(d, sums.data(), double(n), C, kBnEps, kMomentum, rm.data(), rv.data(), stats.data());
      nnref::update_running(want_rm, want_rv, mo, double(n), kMomentum);
      ref::Tensor want_stats = mo.mean;
      for (double s : nnref::inv_std(mo.var, kBnEps)) want_stats.push_back(s);
      check_close(stats.download(), want_stats, kTol, "stats (mean, inv_std)");
      check_close(rm.download(), want_rm, kTol, "running mean");
      check_close(rv.download(), want_rv, kTol, "running var");
    }
  }

  SUBCASE("a count below 1 is refused") {
    mgpu::Buffer<float> sums(d, 2 * C), rm(d, C), rv(d, C), stats(d, 2 * C);
    sums.zero(), rm.zero(), rv.zero();
    for (double count : {0.0, 0.5, -3.0, std::numeric_limits<double>::quiet_NaN()}) {
      CAPTURE(count);
      CHECK_THROWS_AS(nn::batch_norm_statistics(d, sums.data(), count, C, kBnEps, kMomentum, rm.data(), rv.data(),
                                                stats.data()),
                      mgpu::Error);
    }
  }
}

TEST_CASE("evaluation mode: batch_norm_inference_statistics + batch_norm_apply normalize with the running statistics") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(908);
  const int C = 3;
  const std::size_t n = 2 * 5 * 4;
  const std::vector<float> rm = random_floats(C, rng, -1.0, 1.0), rv = random_floats(C, rng, 0.1, 3.0);
  const std::vector<float> gamma = random_floats(C, rng, 0.5, 1.5), beta = random_floats(C, rng);
  const std::vector<float> z = random_floats(C * n, rng, -2.0, 2.0);
  mgpu::Buffer<float> rm_d = on_device(d, rm), rv_d = on_device(d, rv), stats = poisoned(d, 2 * C);
  nn::batch_norm_inference_statistics(d, rm_d.data(), rv_d.data(), C, kBnEps, stats.data());
  const std::vector<float> s = stats.download();
  for (int c = 0; c < C; ++c) {
    CAPTURE(c);
    CHECK(s[c] == rm[c]);  // the running mean as it is
    CHECK(s[C + c] == doctest::Approx(1 / std::sqrt(double(rv[c]) + kBnEps)).epsilon(1e-6));
  }
  mgpu::Buffer<float> z_d = on_device(d, z), g_d = on_device(d, gamma), b_d = on_device(d, beta);
  mgpu::Buffer<float> y = poisoned(d, C * n);
  nn::batch_norm_apply(d, z_d.data(), C, n, stats.data(), g_d.data(), b_d.data(), nullptr, lenet::Activation::None,
                       y.data());
  check_close(y.download(),
              nnref::batch_norm_eval(ref::to_double(z), C, n, ref::to_double(rm), ref::to_double(rv),
                                     ref::to_double(gamma), ref::to_double(beta), kBnEps),
              kTol, "y");
}

TEST_CASE("batch_norm_apply: gamma (z - mean) inv_std + beta, with and without the residual, with and without ReLU") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(909);
  const int C = 3;
  const std::size_t n = 2 * 5 * 4;  // 2 images of 5x4 per channel
  const std::vector<float> z = random_floats(C * n, rng, -2.0, 2.0), res = random_floats(C * n, rng);
  const std::vector<float> mean = random_floats(C, rng), inv_std = random_floats(C, rng, 0.5, 2.0);
  const std::vector<float> gamma = {1.25f, -0.75f, 0.5f}, beta = random_floats(C, rng);  // a negative gamma too
  std::vector<float> stats = mean;  // [2][C]: mean, inv_std
  stats.insert(stats.end(), inv_std.begin(), inv_std.end());
  mgpu::Buffer<float> z_d = on_device(d, z), r_d = on_device(d, res), s_d = on_device(d, stats);
  mgpu::Buffer<float> g_d = on_device(d, gamma), b_d = on_device(d, beta);
  const ref::Tensor zd = ref::to_double(z), rd = ref::to_double(res);
  for (bool residual : {false, true})
    for (bool relu : {false, true}) {
      INFO(std::string(residual ? "with" : "without"), " the residual, ", std::string(relu ? "with" : "without"),
           " ReLU");
      mgpu::Buffer<float> y = poisoned(d, C * n);
      nn::batch_norm_apply(d, z_d.data(), C, n, s_d.data(), g_d.data(), b_d.data(), residual ? r_d.data() : nullptr,
                           relu ? lenet::Activation::Relu : lenet::Activation::None, y.data());
      const std::vector<float> got = y.download();
      check_close(got, nnref::batch_norm_apply(zd, C, n, ref::to_double(mean), ref::to_double(inv_std),
                                               ref::to_double(gamma), ref::to_double(beta), residual ? &rd : nullptr,
                                               relu),
                  kTol, "y");
      if (relu) {  // both sides of the ReLU occurred, or it was not really tested
        int zeros = 0;
        for (float v : got) zeros += v == 0.0f;
        CHECK(zeros > 10);
        CHECK(zeros < int(got.size()) - 10);
      }
    }
}

// BatchNorm's training forward (sums -> statistics -> apply) and its backward, against finite
// differences of nnref::batch_norm_train, which recomputes the batch's mean and variance from z
// on every call: the differences with respect to z_i include the paths through the mean and the
// variance, which the two backward sums are there for.
//
// Why central differences still do here. L = <BN(z), R> is smooth but not linear in z_i: the
// mean and the variance move with z_i, and inv_std = 1/sqrt(var + eps) is curved. A central
// difference cancels the even terms of the two Taylor series around z_i, so
//   (L(z_i + h) - L(z_i - h)) / 2h = dL/dz_i + h^2/6 * d3L/dz_i^3 + O(h^4),
// an error of O(h^2), not the O(h) a one-sided difference would leave. How large: z_i reaches
// the normalized values through 1/sigma and the variance, so the third derivative grows like
// 1/sigma^3. Measured on these cases (sigma 0.3 to 0.6): at h = 1e-3 the truncation error is
// 2e-7 of the gradients' scale; at h = 1e-2, 100 times that (2e-5, enough to fail kTol); at
// h = 1e-4, 100 times less. So the suite's kEps = 1e-3 leaves it 50 times below the tolerance,
// and double's rounding in the difference (1e-16 * |L| / h, ~1e-12) does not matter.
//
// The tolerance is float's, kTol, for values around 0 and around 5 alike: the variance is the
// mean squared distance from the mean (batch_norm_square_sums), so a mean far from zero costs
// only the mean's own rounding (5 * 6e-8, times inv_std ~ 3.5: 1e-6 of a normalized unit).
TEST_CASE("BatchNorm training: forward and backward (dz, dgamma, dbeta) against finite differences of the reference") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(910);
  struct BnCase {
    const char* name;
    double lo, hi;  // z uniform in [lo, hi)
  };
  const BnCase cases[] = {{"values in [-1, 1)", -1.0, 1.0}, {"values in [4.5, 5.5): mean 5, spread 1", 4.5, 5.5}};
  const int C = 3;
  const ImageShape zs{C, 2, 5, 4};
  const std::size_t n = std::size_t(zs.batch) * zs.height * zs.width;  // 40 values per channel
  const float dgamma_start = 0.5f, dbeta_start = -0.25f;
  for (const BnCase& bc : cases) {
    INFO(bc.name);
    const std::vector<float> z = random_floats(C * n, rng, bc.lo, bc.hi);
    const std::vector<float> gamma = random_floats(C, rng, 0.5, 1.5), beta = random_floats(C, rng);
    mgpu::Buffer<float> z_d = on_device(d, z), g_d = on_device(d, gamma), b_d = on_device(d, beta);
    mgpu::Buffer<float> sums(d, 2 * C), stats(d, 2 * C), rm(d, C), rv(d, C), y = poisoned(d, C * n);
    rm.zero(), rv.zero();
    nn::ReductionScratch scratch(d, C);
    nn::batch_norm_sums(d, z_d.data(), C, n, scratch, sums.data());
    nn::batch_norm_square_sums(d, z_d.data(), C, n, double(n), scratch, sums.data());
    nn::batch_norm_statistics(d, sums.data(), double(n), C, kBnEps, kMomentum, rm.data(), rv.data(), stats.data());
    nn::batch_norm_apply(d, z_d.data(), C, n, stats.data(), g_d.data(), b_d.data(), nullptr, lenet::Activation::None,
                         y.data());
    ref::Tensor zd = ref::to_double(z), gd = ref::to_double(gamma), bd = ref::to_double(beta);
    const std::vector<float> yv = y.download();
    check_close(yv, nnref::batch_norm_train(zd, C, n, gd, bd, kBnEps), kTol, "y");
    // What normalizing means: every channel of y has mean beta and standard deviation |gamma|
    // (up to the eps in sqrt(var + eps), 1e-5 against var >= 1/12), wherever z was centred.
    const nnref::Moments ym = nnref::moments(ref::to_double(yv), C, n);
    for (int c = 0; c < C; ++c) {
      CAPTURE(c);
      CHECK(ym.mean[c] == doctest::Approx(beta[c]).epsilon(1e-4).scale(1.0));
      CHECK(std::sqrt(ym.var[c]) == doctest::Approx(gamma[c]).epsilon(1e-3));
    }

    // Backward, from dL/dy = R.
    const std::vector<float> R = random_floats(C * n, rng);
    mgpu::Buffer<float> dy = on_device(d, R), bsums = poisoned(d, 2 * C), dz = poisoned(d, C * n);
    mgpu::Buffer<float> dgamma = on_device(d, std::vector<float>(C, dgamma_start));
    mgpu::Buffer<float> dbeta = on_device(d, std::vector<float>(C, dbeta_start));
    nn::batch_norm_backward_sums(d, dy.data(), z_d.data(), C, n, stats.data(), scratch, bsums.data(), dgamma.data(),
                                 dbeta.data());
    nn::batch_norm_backward_input(d, dy.data(), z_d.data(), C, n, stats.data(), g_d.data(), bsums.data(), double(n),
                                  dz.data());
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(nnref::batch_norm_train(zd, C, n, gd, bd, kBnEps), Rd); };
    const std::vector<float> gz = dz.download();
    check_gradient(gz, zd, sample_indices(zd.size(), zd.size(), rng), kEps, kTol, L, "dz");
    check_gradient(minus(dgamma.download(), dgamma_start), gd, sample_indices(C, C, rng), kEps, kTol, L, "dgamma");
    check_gradient(minus(dbeta.download(), dbeta_start), bd, sample_indices(C, C, rng), kEps, kTol, L, "dbeta");
    // Adding a constant to a channel of z changes nothing after BatchNorm, so the gradient has
    // no component along it: each channel's dz sums to 0 (to float rounding of its terms).
    for (int c = 0; c < C; ++c) {
      CAPTURE(c);
      double sum = 0, mass = 0;
      for (std::size_t j = 0; j < n; ++j) sum += gz[c * n + j], mass += std::abs(gz[c * n + j]);
      CHECK(std::abs(sum) <= 1e-5 * mass);
    }
  }
}

// SyncBN (chapter README), without any devices: the batch split into two halves, as two
// replicas would hold it, each its own [C][B/2][H][W] tensor (two buffers on one device).
// Between the passes the replicas' sums are added up (the allreduce, done here by hand) and
// every count is the TOTAL one: each half then normalizes with the whole batch's statistics,
// and the backward pass gives each half the very dz that the whole-batch backward gives it.
TEST_CASE("SyncBN's arithmetic: two halves' sums added, with the total count, give the whole batch's BatchNorm") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(911);
  const int C = 3, B = 4, H = 3, W = 5, half_B = B / 2;
  const std::size_t plane = std::size_t(H) * W, n = B * plane, half_n = half_B * plane;
  const double count = double(n);  // what every replica passes: the values of ALL replicas
  // z [C][B][H][W]: image b's values around 0.5 b, so the two halves' own statistics differ.
  std::vector<float> z(C * n);
  for (int c = 0; c < C; ++c)
    for (int b = 0; b < B; ++b)
      for (std::size_t i = 0; i < plane; ++i) z[(c * B + b) * plane + i] = float(0.5 * b + 2 * rng.uniform() - 1);
  const std::vector<float> R = random_floats(C * n, rng), gamma = random_floats(C, rng, 0.5, 1.5),
                           beta = random_floats(C, rng);
  // Half h: images [h B/2, (h+1) B/2) of every channel, as its own [C][B/2][H][W] tensor.
  auto half_of = [&](const std::vector<float>& t, int h) {
    std::vector<float> r;
    for (int c = 0; c < C; ++c)
      r.insert(r.end(), t.begin() + (c * B + h * half_B) * plane, t.begin() + (c * B + (h + 1) * half_B) * plane);
    return r;
  };
  // The allreduce, by hand: elements [offset, offset + count) of both replicas' buffers replaced
  // by their sum (added in float, as an allreduce adds).
  auto allreduce = [](mgpu::Buffer<float>& a, mgpu::Buffer<float>& b, std::size_t offset, std::size_t count) {
    std::vector<float> va = a.download(), vb = b.download();
    for (std::size_t i = offset; i < offset + count; ++i) va[i] = vb[i] = va[i] + vb[i];
    a.upload(va);
    b.upload(vb);
  };
  mgpu::Buffer<float> g_d = on_device(d, gamma), b_d = on_device(d, beta);
  const std::vector<float> rm0 = {0.0f, 0.5f, -0.5f}, rv0 = {1.0f, 1.0f, 2.0f};

  // The whole batch on one device: forward statistics, then the backward.
  nn::ReductionScratch scratch(d, C);
  mgpu::Buffer<float> z_w = on_device(d, z), dy_w = on_device(d, R), sums_w(d, 2 * C), stats_w(d, 2 * C);
  mgpu::Buffer<float> rm_w = on_device(d, rm0), rv_w = on_device(d, rv0), bsums_w(d, 2 * C), dz_w(d, C * n);
  mgpu::Buffer<float> dgamma_w(d, C), dbeta_w(d, C);
  dgamma_w.zero(), dbeta_w.zero();
  nn::batch_norm_sums(d, z_w.data(), C, n, scratch, sums_w.data());
  nn::batch_norm_square_sums(d, z_w.data(), C, n, count, scratch, sums_w.data());
  nn::batch_norm_statistics(d, sums_w.data(), count, C, kBnEps, kMomentum, rm_w.data(), rv_w.data(), stats_w.data());
  nn::batch_norm_backward_sums(d, dy_w.data(), z_w.data(), C, n, stats_w.data(), scratch, bsums_w.data(),
                               dgamma_w.data(), dbeta_w.data());
  nn::batch_norm_backward_input(d, dy_w.data(), z_w.data(), C, n, stats_w.data(), g_d.data(), bsums_w.data(), count,
                                dz_w.data());
  const std::vector<float> stats_whole = stats_w.download(), dz_whole = dz_w.download();

  // The two halves, each with its own buffers and scratch, as on two devices.
  struct Half {
    mgpu::Buffer<float> z, dy, sums, stats, rm, rv, bsums, dz, dgamma, dbeta;
    nn::ReductionScratch scratch;
  };
  std::vector<Half> halves;
  for (int h = 0; h < 2; ++h)
    halves.push_back(Half{on_device(d, half_of(z, h)), on_device(d, half_of(R, h)), poisoned(d, 2 * C),
                          poisoned(d, 2 * C), on_device(d, rm0), on_device(d, rv0), poisoned(d, 2 * C),
                          poisoned(d, C * half_n), on_device(d, std::vector<float>(C, 0.0f)),
                          on_device(d, std::vector<float>(C, 0.0f)), nn::ReductionScratch(d, C)});
  Half &h0 = halves[0], &h1 = halves[1];

  // Forward pass 1: each half's sum z, then the allreduce of sums[0].
  for (Half& r : halves) nn::batch_norm_sums(d, r.z.data(), C, half_n, r.scratch, r.sums.data());
  {  // What plain BatchNorm would do instead: each replica its own statistics, not the batch's.
    mgpu::Buffer<float> own = on_device(d, h0.sums.download()), rm(d, C), rv(d, C), stats(d, 2 * C);
    rm.zero(), rv.zero();
    nn::batch_norm_square_sums(d, h0.z.data(), C, half_n, double(half_n), h0.scratch, own.data());
    nn::batch_norm_statistics(d, own.data(), double(half_n), C, kBnEps, kMomentum, rm.data(), rv.data(), stats.data());
    CHECK(std::abs(stats.download()[0] - stats_whole[0]) > 0.2);  // the halves' means are 0.5 apart
  }
  allreduce(h0.sums, h1.sums, 0, C);
  // Pass 2: each half's sum of (z - the WHOLE batch's mean)^2, then the allreduce of sums[1].
  for (Half& r : halves) nn::batch_norm_square_sums(d, r.z.data(), C, half_n, count, r.scratch, r.sums.data());
  allreduce(h0.sums, h1.sums, C, C);
  for (Half& r : halves)
    nn::batch_norm_statistics(d, r.sums.data(), count, C, kBnEps, kMomentum, r.rm.data(), r.rv.data(), r.stats.data());
  for (int h = 0; h < 2; ++h) {
    CAPTURE(h);
    check_close(halves[h].stats.download(), ref::to_double(stats_whole), kTol, "SyncBN's (mean, inv_std)");
    check_close(halves[h].rm.download(), ref::to_double(rm_w.download()), kTol, "running mean");
    check_close(halves[h].rv.download(), ref::to_double(rv_w.download()), kTol, "running var");
  }

  // Backward: each half's sums (and its share of dgamma, dbeta), the allreduce of both, then dz.
  for (Half& r : halves)
    nn::batch_norm_backward_sums(d, r.dy.data(), r.z.data(), C, half_n, r.stats.data(), r.scratch, r.bsums.data(),
                                 r.dgamma.data(), r.dbeta.data());
  allreduce(h0.bsums, h1.bsums, 0, 2 * C);
  for (int h = 0; h < 2; ++h) {
    CAPTURE(h);
    Half& r = halves[h];
    nn::batch_norm_backward_input(d, r.dy.data(), r.z.data(), C, half_n, r.stats.data(), g_d.data(), r.bsums.data(),
                                  count, r.dz.data());
    check_close(r.dz.download(), ref::to_double(half_of(dz_whole, h)), kTol, "this half's dz");
  }
  // And the parameter gradients' allreduce: the two shares add up to the whole batch's.
  const std::vector<float> dg0 = halves[0].dgamma.download(), dg1 = halves[1].dgamma.download();
  const std::vector<float> db0 = halves[0].dbeta.download(), db1 = halves[1].dbeta.download();
  ref::Tensor dgamma_sum, dbeta_sum;
  for (int c = 0; c < C; ++c) {
    dgamma_sum.push_back(double(dg0[c]) + dg1[c]);
    dbeta_sum.push_back(double(db0[c]) + db1[c]);
  }
  check_close(dgamma_w.download(), dgamma_sum, kTol, "dgamma, whole vs the halves' sum");
  check_close(dbeta_w.download(), dbeta_sum, kTol, "dbeta, whole vs the halves' sum");
}

TEST_CASE("the per-channel reduction: at least one slice; scratch too small for the channels is refused") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  CHECK(nn::reduction_slices() >= 1);
  nn::ReductionScratch scratch(d, 2);
  CHECK(scratch.max_channels == 2);
  // [2][2][P] doubles, P the most partial sums per channel any registered table asks for (this
  // suite links chapter 10's tables: its raw sums take more than this library's slices).
  const std::vector<const nn::LayerKernels*> tables = nn::registered_layer_kernels();
  REQUIRE(tables.size() >= 2);
  int most = 0;
  for (const nn::LayerKernels* k : tables) most = std::max(most, k->sum_partials_per_channel());
  CHECK(scratch.per_channel == most);
  CHECK(most >= nn::reduction_slices());
  CHECK(scratch.partials.size() == std::size_t(2) * 2 * most);
  const std::string too_many = std::to_string(most + 1) + " partial sums per channel, scratch for";
  CHECK_THROWS_WITH_AS(scratch.partials_for(2, most + 1, "test"), doctest::Contains(too_many.c_str()), mgpu::Error);
  const std::int64_t n = 10;
  mgpu::Buffer<float> z(d, 3 * n), dy(d, 3 * n), sums(d, 6), stats(d, 6), dgamma(d, 3), dbeta(d, 3);
  z.zero(), dy.zero(), stats.zero(), dgamma.zero(), dbeta.zero();
  // The same refusals whichever table does the sums (09_resnet --kernels NAME).
  for (const nn::LayerKernels* k : tables) {
    const std::string name = k->name();
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(k->batch_norm_sums(d, z.data(), 3, n, scratch, sums.data()),
                         doctest::Contains("3 channels, scratch for 2"), mgpu::Error);
    CHECK_THROWS_AS(k->batch_norm_backward_sums(d, dy.data(), z.data(), 3, n, stats.data(), scratch, sums.data(),
                                                dgamma.data(), dbeta.data()),
                    mgpu::Error);
    CHECK_THROWS_AS(k->batch_norm_square_sums(d, z.data(), 3, n, double(n), scratch, sums.data()), mgpu::Error);
    CHECK_THROWS_WITH_AS(k->batch_norm_moments(d, z.data(), 3, n, scratch, sums.data()),
                         doctest::Contains("3 channels, scratch for 2"), mgpu::Error);
    CHECK_THROWS_WITH_AS(k->batch_norm_moments(d, z.data(), 2, 0, scratch, sums.data()),
                         doctest::Contains("no values to normalize over"), mgpu::Error);
    CHECK_NOTHROW(k->batch_norm_sums(d, z.data(), 2, n, scratch, sums.data()));  // 2 channels fit
    CHECK_THROWS_WITH_AS(k->batch_norm_square_sums(d, z.data(), 2, n, 0.0, scratch, sums.data()),
                         doctest::Contains("no values to normalize over"), mgpu::Error);
  }
  mgpu::synchronize(d);
}

// ------------------------------------------------------------------ global average pooling

TEST_CASE("global_avg_pool: forward is each plane's mean; backward spreads dy / (H*W) over the plane") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(912);
  // ResNet-18 on 28x28 ends at 4x4 (here with 16 channels, not 512); 1x1 planes are a copy.
  for (const ImageShape xs : {ImageShape{3, 2, 5, 4}, ImageShape{16, 2, 4, 4}, ImageShape{2, 3, 1, 1},
                              ImageShape{1, 1, 7, 3}}) {
    INFO(xs.channels, "x", xs.batch, "x", xs.height, "x", xs.width);
    const ref::Shape s = shape_of(xs);
    const std::size_t ny = std::size_t(xs.channels) * xs.batch;  // y [C][B]
    const std::vector<float> x = random_floats(xs.size(), rng);
    mgpu::Buffer<float> x_d = on_device(d, x), y = poisoned(d, ny);
    nn::global_avg_pool_forward(d, x_d.data(), xs, y.data());
    check_close(y.download(), nnref::global_avg_pool(ref::to_double(x), s), kTol, "y");

    const std::vector<float> R = random_floats(ny, rng);  // dL/dy [C][B]
    mgpu::Buffer<float> dy = on_device(d, R), dx = poisoned(d, xs.size());
    nn::global_avg_pool_backward(d, dy.data(), xs, dx.data());
    ref::Tensor xd = ref::to_double(x);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(nnref::global_avg_pool(xd, s), Rd); };
    check_gradient(dx.download(), xd, sample_indices(xd.size(), xd.size(), rng), kEps, kTol, L, "dx");
  }
}

}  // namespace
