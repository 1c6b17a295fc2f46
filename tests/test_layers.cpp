// LeNet's layers (chapters/01_lenet/layers.h) held against the plain loops of reference.h:
// every forward by value, every backward by finite differences. First, the two building
// blocks under them: device buffers and the matrix product.
//
// How a backward is checked. Take the scalar loss L = <out, R> = sum of out[i] * R[i] for a
// fixed random R. Its gradient with respect to the layer's output is R itself, so R goes into
// the backward function as dout, and what comes out must be dL/dinput and dL/dparams. Those we
// also get without any calculus: nudge one input by +-eps, re-run the REFERENCE forward (in
// double) and take the central difference. Every layer here is linear in each of its inputs
// taken one at a time (ReLU away from its kink, softmax aside), so in double the differences
// are exact to ~1e-12 and what is left to tolerate is only the library's float rounding.
// A wrong index, a missing transpose or a forgotten term would be off by O(1) and fail.
//
// Shapes: a few small odd ones (indexing bugs hide in square, even shapes) and LeNet's own
// with a batch of 2. All tensors are in the library's layout, [C][B][H][W] or [F][B].
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/01_lenet/layers.h"
#include "common/check.h"
#include "common/device.h"
#include "common/gemm.h"
#include "common/random.h"
#include "common/vector_ops.h"
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

// float against double: a few units in float's last place, relative to the tensor's scale.
constexpr double kTol = 1e-5;
constexpr double kEps = 1e-3;        // finite-difference step (the checked losses are linear in it)
constexpr std::size_t kProbes = 40;  // elements probed per gradient tensor (all, when it is smaller)

ref::Shape shape_of(ImageShape s) { return {s.channels, s.batch, s.height, s.width}; }

std::string describe(ImageShape s) {
  return std::to_string(s.channels) + "x" + std::to_string(s.batch) + "x" + std::to_string(s.height) + "x" +
         std::to_string(s.width);
}

// ------------------------------------------------------------------ the building blocks

TEST_CASE("Buffer: what goes up comes back; zero() clears; an upload that does not fit is refused") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(11);
  const std::vector<float> host = random_floats(1000, rng);
  mgpu::Buffer<float> b(d, host.size());
  CHECK(b.size() == host.size());
  b.upload(host);
  check_equal(b.download(), host, "round trip");
  b.zero();
  check_equal(b.download(), std::vector<float>(host.size(), 0.0f), "after zero()");
  b.upload(host.data(), 10);  // a prefix: the rest stays as it was
  std::vector<float> expected(host.size(), 0.0f);
  std::copy(host.begin(), host.begin() + 10, expected.begin());
  check_equal(b.download(), expected, "after a partial upload");
  CHECK_THROWS_AS(b.upload(std::vector<float>(1001, 1.0f)), mgpu::Error);

  mgpu::Buffer<float> moved = std::move(b);  // ownership moves, the numbers stay
  CHECK(moved.size() == host.size());
  check_equal(moved.download(), expected, "after a move");
  CHECK_THROWS_AS(mgpu::DeviceSet(0), mgpu::Error);
}

// C = alpha op(A) op(B) + beta C, all row-major, in all four combinations of transposes (the
// layers use three), with M, N, K all different so that a swapped dimension cannot hide.
TEST_CASE("gemm matches the textbook triple loop, for every combination of transposes, and for K = 0") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(12);
  const int M = 5, N = 7;
  using mgpu::Transpose;
  // K = 0 (a product over no images: a weight gradient of an empty shard) is C = beta * C. Both
  // BLAS libraries refuse a leading dimension of 0, which a stored [M][0] matrix would have.
  for (int K : {3, 0})
  for (Transpose ta : {Transpose::No, Transpose::Yes})
    for (Transpose tb : {Transpose::No, Transpose::Yes}) {
      INFO("K ", K, ", A ", std::string(ta == Transpose::Yes ? "transposed" : "as is"), ", B ",
           std::string(tb == Transpose::Yes ? "transposed" : "as is"));
      const std::vector<float> A = random_floats(M * K, rng), B = random_floats(K * N, rng), C0 = random_floats(M * N, rng);
      // op(A)[m][k] is A[m][k] as stored [M][K], or A[k][m] as stored [K][M]; likewise op(B).
      auto opA = [&](int m, int k) { return double(ta == Transpose::No ? A[m * K + k] : A[k * M + m]); };
      auto opB = [&](int k, int n) { return double(tb == Transpose::No ? B[k * N + n] : B[n * K + k]); };
      const float alpha = 0.5f, beta = 2.0f;
      ref::Tensor want(M * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double sum = 0;
          for (int k = 0; k < K; ++k) sum += opA(m, k) * opB(k, n);
          want[m * N + n] = alpha * sum + beta * C0[m * N + n];
        }
      mgpu::Buffer<float> A_d = on_device(d, A), B_d = on_device(d, B), C = on_device(d, C0);
      mgpu::gemm(d, ta, tb, M, N, K, alpha, A_d.data(), B_d.data(), beta, C.data());
      check_close(C.download(), want, kTol, "C [5][7]");
    }
  CHECK_THROWS_AS(mgpu::gemm(d, Transpose::No, Transpose::No, -1, 1, 1, 1.0f, nullptr, nullptr, 0.0f, nullptr),
                  mgpu::Error);
}

TEST_CASE("gemm precision: a device starts at fp32; tf32 and bf16 products stay within their rounding") {
  mgpu::DeviceSet devices(2);
  using mgpu::GemmPrecision;
  CHECK(mgpu::gemm_precision(devices[0]) == GemmPrecision::Fp32);
  mgpu::set_gemm_precision(devices, GemmPrecision::Bf16);
  CHECK(mgpu::gemm_precision(devices[0]) == GemmPrecision::Bf16);
  CHECK(mgpu::gemm_precision(devices[1]) == GemmPrecision::Bf16);
  {
    mgpu::DeviceSet others(1);  // what one DeviceSet chose is not another's
    CHECK(mgpu::gemm_precision(others[0]) == GemmPrecision::Fp32);
  }

  // C [64][48] = A [64][96] B [96][48], values in [-1, 1): each product has ~96 terms.
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(7);
  const int M = 64, N = 48, K = 96;
  const std::vector<float> A = random_floats(M * K, rng), B = random_floats(K * N, rng);
  ref::Tensor want(M * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += double(A[m * K + k]) * B[k * N + n];
      want[m * N + n] = sum;
    }
  const mgpu::Buffer<float> A_d = on_device(d, A), B_d = on_device(d, B);
  auto product = [&](GemmPrecision p) {
    mgpu::set_gemm_precision(devices, p);
    mgpu::Buffer<float> C(d, std::size_t(M) * N);
    mgpu::gemm(d, mgpu::Transpose::No, mgpu::Transpose::No, M, N, K, 1.0f, A_d.data(), B_d.data(), 0.0f, C.data());
    return C.download();
  };
  const std::vector<float> fp32 = product(GemmPrecision::Fp32);
  check_close(fp32, want, kTol, "fp32 C [64][48]");
  // Each input rounded to 10 (tf32) or 7 (bf16) bits of mantissa is off by at most 2^-11 or
  // 2^-8 of itself, a product by twice that; the errors of ~96 terms partly cancel. The
  // tolerances are a few times that, relative to C's scale.
  const std::vector<float> tf32 = product(GemmPrecision::Tf32), bf16 = product(GemmPrecision::Bf16);
  check_close(tf32, want, 2e-3, "tf32 C [64][48]");
  check_close(bf16, want, 1.5e-2, "bf16 C [64][48]");
  if (!mgpu::kCudaBackend) {  // the cpu build multiplies in fp32 whatever is set: the same bits
    CHECK(tf32 == fp32);
    CHECK(bf16 == fp32);
  }
  mgpu::set_gemm_precision(devices, GemmPrecision::Fp32);
}

// ------------------------------------------------------------------------------ the layers

// A convolution to test: input x [C][B][H][W], out_channels filters of k x k.
struct ConvCase {
  ImageShape x;
  int out_channels, k;
};
const ConvCase kConvCases[] = {
    {{3, 2, 7, 6}, 4, 3},
    {{2, 3, 5, 8}, 3, 3},
    {{2, 2, 8, 7}, 2, 5},
    {{1, 2, 28, 28}, 20, 3},   // LeNet's conv1
    {{20, 2, 13, 13}, 50, 5},  // LeNet's conv2
};

// Everything one convolution needs, random and on the device.
struct Conv {
  ImageShape xs;
  int cout, k, Ho, Wo;
  std::size_t P, K;                // output pixels over the batch (B*Ho*Wo); inputs per output pixel (C*k*k)
  std::vector<float> x, W, b;      // x [C][B][H][W], W [Cout][C][k][k], b [Cout]
  mgpu::Buffer<float> x_d, W_d, b_d, ones, col;  // on the device: x, W, b, ones [P], col [K][P]

  Conv(const mgpu::Device& d, const ConvCase& c, mgpu::Rng& rng)
      : xs(c.x), cout(c.out_channels), k(c.k), Ho(xs.height - k + 1), Wo(xs.width - k + 1),
        P(std::size_t(xs.batch) * Ho * Wo), K(std::size_t(xs.channels) * k * k),
        x(random_floats(xs.size(), rng)), W(random_floats(std::size_t(cout) * K, rng)),
        b(random_floats(cout, rng)), x_d(on_device(d, x)), W_d(on_device(d, W)), b_d(on_device(d, b)),
        ones(on_device(d, std::vector<float>(P, 1.0f))), col(d, K * P) {}
  std::size_t out_size() const { return std::size_t(cout) * P; }  // z [Cout][B][Ho][Wo]
};

TEST_CASE("im2col copies every k x k window into one column, exactly as the reference loops do") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(1);
  for (const ConvCase& c : kConvCases) {
    INFO("x ", describe(c.x), ", k ", c.k);
    Conv conv(d, c, rng);
    lenet::im2col(d, conv.x_d.data(), conv.xs, conv.k, conv.col.data());
    // A copy involves no arithmetic: exact (rtol 0).
    check_close(conv.col.download(), ref::im2col(ref::to_double(conv.x), shape_of(conv.xs), conv.k), 0.0, "col");
  }
}

TEST_CASE("col2im adds every column entry back onto the pixel it came from") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(2);
  for (const ConvCase& c : kConvCases) {
    INFO("x ", describe(c.x), ", k ", c.k);
    Conv conv(d, c, rng);
    const std::vector<float> col = random_floats(conv.K * conv.P, rng);  // [C*k*k][B*Ho*Wo]
    mgpu::Buffer<float> col_d = on_device(d, col);
    mgpu::Buffer<float> dx = poisoned(d, c.x.size());  // [C][B][H][W], must be overwritten
    lenet::col2im(d, col_d.data(), conv.xs, conv.k, dx.data());
    check_close(dx.download(), ref::col2im(ref::to_double(col), shape_of(conv.xs), conv.k), kTol, "dx");
  }
}

// The property the backward pass rests on: col2im is the transpose (adjoint) of im2col, so
// for any x [C][B][H][W] and any c [C*k*k][B*Ho*Wo],  <im2col(x), c> == <x, col2im(c)>.
TEST_CASE("col2im is the adjoint of im2col") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(3);
  for (const ConvCase& c : kConvCases) {
    INFO("x ", describe(c.x), ", k ", c.k);
    Conv conv(d, c, rng);
    const std::vector<float> cv = random_floats(conv.K * conv.P, rng);
    mgpu::Buffer<float> c_d = on_device(d, cv), dx(d, c.x.size());
    lenet::im2col(d, conv.x_d.data(), conv.xs, conv.k, conv.col.data());
    lenet::col2im(d, c_d.data(), conv.xs, conv.k, dx.data());
    const double lhs = ref::dot(ref::to_double(conv.col.download()), ref::to_double(cv));
    const double rhs = ref::dot(ref::to_double(conv.x), ref::to_double(dx.download()));
    CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
  }
}

TEST_CASE("conv2d_forward matches the reference convolution and leaves im2col(x) in col") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(4);
  for (const ConvCase& c : kConvCases) {
    INFO("x ", describe(c.x), ", k ", c.k, ", out channels ", c.out_channels);
    Conv conv(d, c, rng);
    mgpu::Buffer<float> z = poisoned(d, conv.out_size());  // [Cout][B][Ho][Wo]
    lenet::conv2d_forward(d, conv.x_d.data(), conv.xs, conv.W_d.data(), conv.b_d.data(), conv.cout, conv.k,
                          lenet::Activation::None, conv.col.data(), z.data());
    const ref::Shape s = shape_of(conv.xs);
    const ref::Tensor want =
        ref::conv2d(ref::to_double(conv.x), s, ref::to_double(conv.W), ref::to_double(conv.b), conv.cout, conv.k);
    check_close(z.download(), want, kTol, "z");
    // The backward pass reuses col instead of unfolding x again.
    check_close(conv.col.download(), ref::im2col(ref::to_double(conv.x), s, conv.k), 0.0, "col");
    // With the ReLU fused into the bias pass: relu(conv(x)).
    mgpu::Buffer<float> h = poisoned(d, conv.out_size());
    lenet::conv2d_forward(d, conv.x_d.data(), conv.xs, conv.W_d.data(), conv.b_d.data(), conv.cout, conv.k,
                          lenet::Activation::Relu, conv.col.data(), h.data());
    check_close(h.download(), ref::relu(want), kTol, "relu(z)");
  }
}

TEST_CASE("conv2d_backward: dW, db, dx match finite differences; dW and db accumulate, dx is overwritten") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(5);
  for (const ConvCase& c : kConvCases) {
    INFO("x ", describe(c.x), ", k ", c.k, ", out channels ", c.out_channels);
    Conv conv(d, c, rng);
    mgpu::Buffer<float> z(d, conv.out_size());  // the forward pass fills col, which backward reads
    lenet::conv2d_forward(d, conv.x_d.data(), conv.xs, conv.W_d.data(), conv.b_d.data(), conv.cout, conv.k,
                          lenet::Activation::None, conv.col.data(), z.data());

    const std::vector<float> R = random_floats(conv.out_size(), rng);  // dL/dz [Cout][B][Ho][Wo]
    mgpu::Buffer<float> dz = on_device(d, R), dW(d, conv.W.size()), db(d, conv.b.size()), dcol(d, conv.K * conv.P);
    mgpu::Buffer<float> dx = poisoned(d, conv.x.size());
    dW.zero();
    db.zero();
    auto backward = [&] {
      lenet::conv2d_backward(d, dz.data(), conv.xs, conv.W_d.data(), conv.cout, conv.k, conv.col.data(),
                             conv.ones.data(), dW.data(), db.data(), dcol.data(), dx.data());
    };
    backward();
    const std::vector<float> gW = dW.download(), gb = db.download(), gx = dx.download();

    // L(x, W, b) = <conv2d(x, W, b), R>, in double.
    ref::Tensor x = ref::to_double(conv.x), W = ref::to_double(conv.W), b = ref::to_double(conv.b);
    const ref::Tensor Rd = ref::to_double(R);
    const ref::Shape s = shape_of(conv.xs);
    auto L = [&] { return ref::dot(ref::conv2d(x, s, W, b, conv.cout, conv.k), Rd); };
    check_layer_gradients(gW, W, gb, b, gx, x, kProbes, rng, kEps, kTol, L);

    // A second call adds the same gradient again (how a batch's chunks sum up), but overwrites dx.
    check_second_call(backward, dW, gW, db, gb, dx, gx, kTol);

    // dx == nullptr (conv1 has no use for the images' gradient) still gives dW and db.
    dW.zero();
    db.zero();
    lenet::conv2d_backward(d, dz.data(), conv.xs, conv.W_d.data(), conv.cout, conv.k, conv.col.data(),
                           conv.ones.data(), dW.data(), db.data(), nullptr, nullptr);
    check_equal(dW.download(), gW, "dW without dx");
    check_equal(db.download(), gb, "db without dx");
  }
}

TEST_CASE("relu: forward is max(z, 0); backward passes dh only where the unit is active") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(6);
  // z [3][2][5][7], every |z| >= 0.05, so a step of eps = 1e-3 never crosses the kink at 0,
  // where the derivative is undefined and a finite difference would give half of R.
  const std::size_t n = 3 * 2 * 5 * 7;
  std::vector<float> z(n);
  for (float& v : z) v = float((rng.uniform() < 0.5 ? -1 : 1) * (0.05 + 0.95 * rng.uniform()));

  mgpu::Buffer<float> h = on_device(d, z);
  lenet::relu_forward(d, h.data(), n);  // in place: h = relu(z)
  const std::vector<float> hv = h.download();
  check_close(hv, ref::relu(ref::to_double(z)), 0.0, "h");  // no arithmetic: exact

  const std::vector<float> R = random_floats(n, rng);  // dL/dh
  mgpu::Buffer<float> dh = on_device(d, R);
  lenet::relu_backward(d, h.data(), dh.data(), n);  // in place: dh becomes dL/dz
  ref::Tensor zd = ref::to_double(z);
  const ref::Tensor Rd = ref::to_double(R);
  auto L = [&] { return ref::dot(ref::relu(zd), Rd); };
  check_gradient(dh.download(), zd, sample_indices(n, n, rng), kEps, kTol, L, "dz");
}

// Pooling: an odd side drops its last row/column, as PyTorch's avg_pool2d does (9x9 -> 4x4
// in LeNet), so those pixels take no part in the output and must get exactly zero gradient.
const ImageShape kPoolCases[] = {
    {2, 3, 9, 9}, {3, 2, 6, 8}, {1, 2, 5, 7}, {20, 2, 26, 26} /* LeNet's pool1 */, {50, 2, 9, 9} /* pool2 */,
};

TEST_CASE("avgpool2: forward averages each 2x2 window; backward spreads a quarter to each pixel") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(7);
  for (const ImageShape& xs : kPoolCases) {
    INFO("x ", describe(xs));
    const ref::Shape s = shape_of(xs), ys{xs.channels, xs.batch, xs.height / 2, xs.width / 2};
    const std::vector<float> x = random_floats(xs.size(), rng);  // [C][B][H][W]
    mgpu::Buffer<float> x_d = on_device(d, x), y = poisoned(d, ys.size());  // y [C][B][H/2][W/2]
    lenet::avgpool2_forward(d, x_d.data(), xs, y.data());
    check_close(y.download(), ref::avgpool2(ref::to_double(x), s), kTol, "y");

    const std::vector<float> R = random_floats(ys.size(), rng);  // dL/dy
    mgpu::Buffer<float> dy = on_device(d, R), dx = poisoned(d, xs.size());
    lenet::avgpool2_backward(d, dy.data(), xs, dx.data());
    const std::vector<float> gx = dx.download();
    ref::Tensor xd = ref::to_double(x);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(ref::avgpool2(xd, s), Rd); };
    check_gradient(gx, xd, sample_indices(xd.size(), kProbes * 4, rng), kEps, kTol, L, "dx");

    // The dropped row and column, element by element (the probes above may have missed them).
    int nonzero = 0;
    for (int c = 0; c < s.C; ++c)
      for (int b = 0; b < s.B; ++b)
        for (int i = 0; i < s.H; ++i)
          for (int j = 0; j < s.W; ++j) {
            const bool dropped = (s.H % 2 == 1 && i == s.H - 1) || (s.W % 2 == 1 && j == s.W - 1);
            if (dropped && gx[s.at(c, b, i, j)] != 0.0f) ++nonzero;
          }
    CHECK_MESSAGE(nonzero == 0, nonzero << " pixels of a dropped row/column got a gradient");

    // Given the ReLU output h that was pooled, the pass also applies ReLU's backward: exactly
    // relu_backward(h, avgpool2_backward(dy)), i.e. nothing where h <= 0.
    std::vector<float> hv = random_floats(xs.size(), rng);
    for (std::size_t i = 0; i < hv.size(); i += 3) hv[i] = 0.0f;  // an inactive unit's output is exactly 0
    mgpu::Buffer<float> h_d = on_device(d, hv), fused = poisoned(d, xs.size()), separate = on_device(d, gx);
    lenet::avgpool2_backward(d, dy.data(), xs, fused.data(), h_d.data());
    lenet::relu_backward(d, h_d.data(), separate.data(), xs.size());
    check_equal(fused.download(), separate.download(), "pool backward with the ReLU's backward fused in");
  }
}

TEST_CASE("flatten reorders [C][B][H][W] into [C*H*W][B]; unflatten is its exact inverse and its adjoint") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(8);
  for (const ImageShape xs : {ImageShape{50, 2, 4, 4} /* LeNet's */, ImageShape{3, 2, 5, 7}, ImageShape{1, 3, 1, 4}}) {
    INFO("x ", describe(xs));
    const ref::Shape s = shape_of(xs);
    const std::vector<float> x = random_floats(xs.size(), rng);
    mgpu::Buffer<float> x_d = on_device(d, x), f = poisoned(d, xs.size()), back = poisoned(d, xs.size());
    lenet::flatten(d, x_d.data(), xs, f.data());
    check_close(f.download(), ref::flatten(ref::to_double(x), s), 0.0, "flattened");
    lenet::unflatten(d, f.data(), xs, back.data());
    check_equal(back.download(), x, "unflatten(flatten(x))");

    // As a backward pass: unflatten(R) is the gradient of <flatten(x), R>.
    const std::vector<float> R = random_floats(xs.size(), rng);  // dL/df [C*H*W][B]
    mgpu::Buffer<float> df = on_device(d, R), dx = poisoned(d, xs.size());
    lenet::unflatten(d, df.data(), xs, dx.data());
    ref::Tensor xd = ref::to_double(x);
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(ref::flatten(xd, s), Rd); };
    check_gradient(dx.download(), xd, sample_indices(xd.size(), xd.size(), rng), kEps, kTol, L, "dx");
  }
}

struct DenseCase {
  int in, out, batch;
};

TEST_CASE("dense: forward is W^T x + b; backward matches finite differences; dW, db accumulate") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(9);
  for (const DenseCase& c : {DenseCase{7, 5, 3}, DenseCase{800, 128, 2} /* LeNet's dense3 */,
                             DenseCase{128, 10, 2} /* dense4 */}) {
    INFO("in ", c.in, ", out ", c.out, ", batch ", c.batch);
    const std::vector<float> x = random_floats(std::size_t(c.in) * c.batch, rng);  // [in][B]
    const std::vector<float> W = random_floats(std::size_t(c.in) * c.out, rng);    // [in][out]
    const std::vector<float> b = random_floats(c.out, rng);                        // [out]
    mgpu::Buffer<float> x_d = on_device(d, x), W_d = on_device(d, W), b_d = on_device(d, b);
    mgpu::Buffer<float> ones = on_device(d, std::vector<float>(c.batch, 1.0f));
    mgpu::Buffer<float> z = poisoned(d, std::size_t(c.out) * c.batch);  // [out][B]
    lenet::dense_forward(d, x_d.data(), c.in, c.batch, W_d.data(), b_d.data(), c.out, lenet::Activation::None,
                         z.data());
    ref::Tensor xd = ref::to_double(x), Wd = ref::to_double(W), bd = ref::to_double(b);
    check_close(z.download(), ref::dense(xd, c.in, c.batch, Wd, bd, c.out), kTol, "z");
    mgpu::Buffer<float> h = poisoned(d, std::size_t(c.out) * c.batch);  // with the ReLU fused in
    lenet::dense_forward(d, x_d.data(), c.in, c.batch, W_d.data(), b_d.data(), c.out, lenet::Activation::Relu,
                         h.data());
    check_close(h.download(), ref::relu(ref::dense(xd, c.in, c.batch, Wd, bd, c.out)), kTol, "relu(z)");

    const std::vector<float> R = random_floats(std::size_t(c.out) * c.batch, rng);  // dL/dz [out][B]
    mgpu::Buffer<float> dz = on_device(d, R), dW(d, W.size()), db(d, b.size()), dx = poisoned(d, x.size());
    dW.zero();
    db.zero();
    auto backward = [&] {
      lenet::dense_backward(d, dz.data(), x_d.data(), c.in, c.batch, W_d.data(), c.out, ones.data(), dW.data(),
                            db.data(), dx.data());
    };
    backward();
    const std::vector<float> gW = dW.download(), gb = db.download(), gx = dx.download();
    const ref::Tensor Rd = ref::to_double(R);
    auto L = [&] { return ref::dot(ref::dense(xd, c.in, c.batch, Wd, bd, c.out), Rd); };
    check_layer_gradients(gW, Wd, gb, bd, gx, xd, kProbes, rng, kEps, kTol, L);

    check_second_call(backward, dW, gW, db, gb, dx, gx, kTol);  // again: dW and db double, dx stays
  }
}

TEST_CASE("softmax_cross_entropy: loss is log-sum-exp minus the true logit; dlogits = softmax - onehot") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(10);
  const int classes = 10, B = 6;
  std::vector<float> z = random_floats(std::size_t(classes) * B, rng, -4.0, 4.0);  // logits [10][B]
  std::vector<std::int32_t> labels(B);                                           // [B]
  for (auto& y : labels) y = std::int32_t(rng.below(classes));
  // Make sure both outcomes occur: example 0 is classified right, example 1 wrong.
  const ref::Tensor zd0 = ref::to_double(z);
  labels[0] = ref::argmax(zd0, classes, B, 0);
  labels[1] = (ref::argmax(zd0, classes, B, 1) + 1) % classes;

  mgpu::Buffer<float> z_d = on_device(d, z), loss = poisoned(d, B), correct = poisoned(d, B);
  mgpu::Buffer<float> dz = poisoned(d, z.size());  // [10][B]
  mgpu::Buffer<std::int32_t> y_d(d, B);
  y_d.upload(labels);
  lenet::softmax_cross_entropy(d, z_d.data(), y_d.data(), classes, B, loss.data(), correct.data(), dz.data());

  ref::Tensor zd = ref::to_double(z);
  const std::vector<float> lv = loss.download(), cv = correct.download(), gz = dz.download();
  check_close(lv, ref::softmax_cross_entropy(zd, labels, classes, B), kTol, "loss");
  for (int b = 0; b < B; ++b) {
    CAPTURE(b);
    CHECK(cv[b] == (ref::argmax(zd, classes, B, b) == labels[b] ? 1.0f : 0.0f));
  }
  CHECK(cv[0] == 1.0f);
  CHECK(cv[1] == 0.0f);

  // dlogits against differences of the summed loss. Softmax is smooth, not linear: a smaller
  // step keeps the O(eps^2) error of central differences (~1e-9 here) far below kTol.
  auto L = [&] {
    double sum = 0;
    for (double l : ref::softmax_cross_entropy(zd, labels, classes, B)) sum += l;
    return sum;
  };
  check_gradient(gz, zd, sample_indices(zd.size(), zd.size(), rng), 1e-4, kTol, L, "dlogits");

  // softmax = dlogits + onehot: each column is a probability distribution.
  for (int b = 0; b < B; ++b) {
    CAPTURE(b);
    double sum = 0;
    for (int c = 0; c < classes; ++c) {
      const double p = gz[std::size_t(c) * B + b] + (c == labels[b] ? 1.0 : 0.0);
      CHECK(p >= 0.0);
      CHECK(p <= 1.0);
      sum += p;
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
  }

  // Without dlogits (evaluation): the same loss and flags.
  mgpu::Buffer<float> loss2(d, B), correct2(d, B);
  lenet::softmax_cross_entropy(d, z_d.data(), y_d.data(), classes, B, loss2.data(), correct2.data(), nullptr);
  check_equal(loss2.download(), lv, "loss without dlogits");
  check_equal(correct2.download(), cv, "correct without dlogits");
}

TEST_CASE("softmax_cross_entropy stays finite for logits far beyond exp()'s range") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const int classes = 10, B = 2;
  // exp(1000) overflows float (and double); only the max-subtracted form gets these right.
  //   column 0: 1000 for class 0, 999 for class 1, -1000 elsewhere; label 1 (wrong guess)
  //             loss = log(e^1000 + e^999 + ...) - 999 = 1 + log(1 + e^-1)
  //   column 1: -500 everywhere but class 3 at -499; label 3 (right guess)
  //             loss = log(e^-499 + 9 e^-500) + 499 = log(1 + 9/e)
  std::vector<float> z(classes * B);  // [10][2]
  for (int c = 0; c < classes; ++c) {
    z[c * B + 0] = c == 0 ? 1000.0f : c == 1 ? 999.0f : -1000.0f;
    z[c * B + 1] = c == 3 ? -499.0f : -500.0f;
  }
  const std::vector<std::int32_t> labels = {1, 3};
  mgpu::Buffer<float> z_d = on_device(d, z), loss(d, B), correct(d, B), dz(d, z.size());
  mgpu::Buffer<std::int32_t> y_d(d, B);
  y_d.upload(labels);
  lenet::softmax_cross_entropy(d, z_d.data(), y_d.data(), classes, B, loss.data(), correct.data(), dz.data());
  const std::vector<float> lv = loss.download(), cv = correct.download(), gz = dz.download();
  // Good to float's spacing at the logits' size (6e-5 near 1000), since the sum passes
  // through values that large; relative to losses of ~1, that is 1e-4.
  CHECK(lv[0] == doctest::Approx(1.0 + std::log(1.0 + std::exp(-1.0))).epsilon(1e-4));
  CHECK(lv[1] == doctest::Approx(std::log(1.0 + 9.0 / std::exp(1.0))).epsilon(1e-4));
  CHECK(cv[0] == 0.0f);
  CHECK(cv[1] == 1.0f);
  for (float g : gz) CHECK(std::isfinite(g));
  // class 0 of column 0 holds softmax e^1000 / (e^1000 + e^999) = 1 / (1 + e^-1)
  CHECK(gz[0] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
}

TEST_CASE("sgd_update is p - scale * g; fill sets every element") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  // Values with few bits, so every product and difference is exact in float.
  const std::vector<float> p = {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, 8.0f};
  const std::vector<float> g = {0.5f, -1.0f, 2.0f, 4.0f, 1.0f, -16.0f};
  mgpu::Buffer<float> p_d = on_device(d, p), g_d = on_device(d, g);
  mgpu::sgd_update(d, p_d.data(), g_d.data(), p.size(), 0.25f);
  check_equal(p_d.download(), {0.875f, 2.25f, -3.5f, -0.5f, -0.25f, 12.0f}, "p");
  check_equal(g_d.download(), g, "g (must be left alone)");

  mgpu::Buffer<float> f = poisoned(d, 37);
  mgpu::fill(d, f.data(), 37, 3.5f);
  check_equal(f.download(), std::vector<float>(37, 3.5f), "filled");
}

}  // namespace
