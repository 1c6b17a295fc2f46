// Chapter 10's tensor-core convolution (chapters/10_fast_kernels/implicit_gemm.h).
//
// The instruction's fragments first: the layout formulas the loaders use and the register tables
// the host model reads must describe the same thing, and every element of A, B and C must sit in
// exactly one lane. Then the model multiplies small integers exactly. Then the convolution: a
// warp's tile run by the host model on host memory (every build), and the launchers (the host
// model on a CPU, the mma.sync kernels on a GPU of the cuda build) against chapter 09's
// convolution run on the same inputs rounded to bf16, so that only the order of fp32 sums differs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "chapters/06_mixed_precision/formats.h"
#include "chapters/09_resnet/layers.h"
#include "chapters/10_fast_kernels/implicit_gemm.h"
#include "chapters/10_fast_kernels/tables.h"
#include "common/check.h"
#include "common/device.h"
#include "common/random.h"
#include "common/vector_ops.h"  // fill
#include "helpers.h"

namespace {

namespace tc = fast::tc;
using lenet::ImageShape;
using nn::ConvShape;

std::uint16_t bf16(float f) { return mixed::to_bf16(f); }
float rounded(float f) { return mixed::from_bf16(mixed::to_bf16(f)); }
std::vector<float> rounded(std::vector<float> v) {
  for (float& f : v) f = rounded(f);
  return v;
}

}  // namespace

TEST_CASE("mma fragments: the formulas and the PTX tables agree; each element of A, B, C is in one lane") {
  // The tables as mma_model reads them, register by register (implicit_gemm.h's comment).
  std::set<std::pair<int, int>> a_seen, b_seen, c_seen;
  for (int lane = 0; lane < tc::kWarp; ++lane) {
    const int g = lane / 4, p = lane % 4;
    const int a_row[4] = {g, g + 8, g, g + 8}, a_col[4] = {2 * p, 2 * p, 2 * p + 8, 2 * p + 8};
    for (int i = 0; i < 8; ++i) {
      const tc::RowCol at = tc::a_position(lane, i);
      CAPTURE(lane);
      CAPTURE(i);
      CHECK(at.row == a_row[i / 2]);
      CHECK(at.col == a_col[i / 2] + i % 2);
      a_seen.insert({at.row, at.col});
    }
    for (int i = 0; i < 4; ++i) {
      const tc::RowCol at = tc::b_position(lane, i);
      CHECK(at.row == (i < 2 ? 2 * p : 2 * p + 8) + i % 2);
      CHECK(at.col == g);
      b_seen.insert({at.row, at.col});
      const tc::RowCol c = tc::c_position(lane, i);
      CHECK(c.row == (i < 2 ? g : g + 8));
      CHECK(c.col == 2 * p + i % 2);
      c_seen.insert({c.row, c.col});
    }
  }
  // 32 lanes x 8 values = 256 = 16 x 16, each once; B and C: 32 x 4 = 128 = 16 x 8.
  CHECK(a_seen.size() == 256);
  CHECK(b_seen.size() == 128);
  CHECK(c_seen.size() == 128);
  for (const auto& [r, c] : a_seen) CHECK((r < 16 && c < 16));
  for (const auto& [r, c] : b_seen) CHECK((r < 16 && c < 8));
  for (const auto& [r, c] : c_seen) CHECK((r < 16 && c < 8));
}

TEST_CASE("mma_model: D = A B + C exactly for small integers dealt out by the formulas") {
  // Integers up to 8 are exact in bf16, and sums of 16 products of them exact in fp32.
  mgpu::Rng rng(43);
  float A[16][16], B[16][8], C[16][8];
  for (auto& row : A)
    for (float& v : row) v = float(int(rng.below(17)) - 8);
  for (auto& row : B)
    for (float& v : row) v = float(int(rng.below(17)) - 8);
  for (auto& row : C)
    for (float& v : row) v = float(int(rng.below(201)) - 100);
  tc::FragA a[tc::kWarp];
  tc::FragB b[tc::kWarp];
  tc::FragC c[tc::kWarp];
  for (int lane = 0; lane < tc::kWarp; ++lane) {
    for (int i = 0; i < 8; ++i) a[lane].v[i] = bf16(A[tc::a_position(lane, i).row][tc::a_position(lane, i).col]);
    for (int i = 0; i < 4; ++i) {
      b[lane].v[i] = bf16(B[tc::b_position(lane, i).row][tc::b_position(lane, i).col]);
      c[lane].v[i] = C[tc::c_position(lane, i).row][tc::c_position(lane, i).col];
    }
  }
  tc::mma_model(a, b, c);
  int wrong = 0;
  for (int lane = 0; lane < tc::kWarp; ++lane)
    for (int i = 0; i < 4; ++i) {
      const tc::RowCol at = tc::c_position(lane, i);
      float want = C[at.row][at.col];
      for (int k = 0; k < 16; ++k) want += A[at.row][k] * B[k][at.col];
      wrong += c[lane].v[i] != want;
    }
  CHECK(wrong == 0);
}

TEST_CASE("implicit GEMM: the conversions put each value where the layouts say") {
  mgpu::Rng rng(44);
  const int C = 3, B = 2, H = 4, W = 5;
  const std::vector<float> x = testing::random_floats(std::size_t(C) * B * H * W, rng);
  std::vector<std::uint16_t> x16(x.size());
  const tc::ChannelsLastArgs cl{x.data(), x16.data(), C, B * H * W, int(x.size())};
  for (int i = 0; i < cl.count; ++i) tc::channels_last_element(cl, i);
  for (int c = 0; c < C; ++c)
    for (int p = 0; p < B * H * W; ++p) REQUIRE(x16[std::size_t(p) * C + c] == bf16(x[std::size_t(c) * B * H * W + p]));

  const int co_n = 4, ci_n = 3, k = 3;
  const std::vector<float> Wf = testing::random_floats(std::size_t(co_n) * ci_n * k * k, rng);
  std::vector<std::uint16_t> w16(Wf.size()), turned(Wf.size());
  const int count = int(Wf.size());
  for (int i = 0; i < count; ++i) {
    tc::filter_element({Wf.data(), w16.data(), co_n, ci_n, k, false, count}, i);
    tc::filter_element({Wf.data(), turned.data(), co_n, ci_n, k, true, count}, i);
  }
  for (int co = 0; co < co_n; ++co)
    for (int ci = 0; ci < ci_n; ++ci)
      for (int ky = 0; ky < k; ++ky)
        for (int kx = 0; kx < k; ++kx) {
          const std::uint16_t w = bf16(Wf[((std::size_t(co) * ci_n + ci) * k + ky) * k + kx]);
          REQUIRE(w16[((std::size_t(co) * k + ky) * k + kx) * ci_n + ci] == w);  // [Cout][ky][kx][Cin]
          REQUIRE(turned[((std::size_t(ci) * k + (k - 1 - ky)) * k + (k - 1 - kx)) * co_n + co] == w);  // [Cin][ky'][kx'][Cout]
        }
}

namespace {

// The shapes the tensor path is checked at: 3x3, stride 1, padding 1, channels in multiples of
// 16; sides and batches that leave partial tiles (M and N not multiples of 32 or 64).
std::vector<std::pair<ImageShape, ConvShape>> tc_cases() {
  return {
      {{16, 2, 5, 7}, {16, 16, 3, 1, 1}},  // one tile of N, M = 70: a partial row tile
      {{32, 3, 4, 4}, {32, 16, 3, 1, 1}},  // K = 288, fewer channels out than in
      {{16, 1, 7, 7}, {16, 48, 3, 1, 1}},  // N = 48: a partial column tile; M = 49
      {{48, 2, 3, 2}, {48, 32, 3, 1, 1}},  // every window in the padding somewhere
  };
}

std::string label(ImageShape xs, ConvShape c) {
  return std::to_string(c.in_channels) + "->" + std::to_string(c.out_channels) + " ch, batch " +
         std::to_string(xs.batch) + ", " + std::to_string(xs.height) + "x" + std::to_string(xs.width);
}

}  // namespace

TEST_CASE("implicit GEMM: one warp tile on the host model is the convolution of the rounded inputs") {
  // Host memory only, in every build: the loop a GPU warp runs, with all 32 lanes' fragments.
  mgpu::Rng rng(45);
  const ImageShape xs{16, 2, 5, 6};
  const ConvShape c{16, 16, 3, 1, 1};
  const int M = xs.batch * xs.height * xs.width, K = 9 * xs.channels, N = c.out_channels;
  std::vector<std::uint16_t> x16(std::size_t(M) * xs.channels), w16(std::size_t(N) * K);
  for (auto& v : x16) v = bf16(float(2 * rng.uniform() - 1));
  for (auto& v : w16) v = bf16(float(2 * rng.uniform() - 1));
  std::vector<float> z(std::size_t(N) * M, -7.0f);  // poison: every element must be written
  tc::ConvGemm g{};
  g.x16 = x16.data(), g.w16 = w16.data(), g.out = z.data();
  g.batch = xs.batch, g.height = g.out_height = xs.height, g.width = g.out_width = xs.width;
  g.in_channels = xs.channels, g.out_channels = N, g.kernel = 3, g.padding = 1;
  g.m = M, g.n = N, g.k = K;
  for (int row0 = 0; row0 < M; row0 += tc::kWarpTileM)
    for (int col0 = 0; col0 < N; col0 += tc::kWarpTileN) {
      tc::WarpAccumulators acc[tc::kWarp] = {};
      tc::warp_tile_model<tc::ForwardOperands>(g, row0, col0, 0, K, acc);
      for (int lane = 0; lane < tc::kWarp; ++lane) tc::store_forward(g, acc[lane], row0, col0, lane);
    }
  // Plain loops over the channels-last input: z[co][b][y][x] = sum over (ky, kx, ci).
  double worst = 0;
  for (int co = 0; co < N; ++co)
    for (int m = 0; m < M; ++m) {
      const int x = m % xs.width, y = m / xs.width % xs.height, b = m / (xs.width * xs.height);
      double want = 0;
      for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx)
          for (int ci = 0; ci < xs.channels; ++ci) {
            const int iy = y + ky - 1, ix = x + kx - 1;
            if (iy < 0 || iy >= xs.height || ix < 0 || ix >= xs.width) continue;
            want += double(mixed::from_bf16(x16[((std::size_t(b) * xs.height + iy) * xs.width + ix) * xs.channels + ci])) *
                    mixed::from_bf16(w16[std::size_t(co) * K + (ky * 3 + kx) * xs.channels + ci]);
          }
      worst = std::max(worst, std::abs(z[std::size_t(co) * M + m] - want));
    }
  MESSAGE("the host model's tile differs from double sums by at most " << worst);
  CHECK(worst < 1e-4);  // 144 products of values below 1, summed in fp32
}

TEST_CASE("implicit GEMM: the block tiles staged in shared memory give the direct warp tiles' bits") {
  // The GPU kernels' loop (block_tile_model on a host: ForwardStage, WeightGradStage) against the
  // plain statement of each product (warp_tile_model): the same products added in the same
  // order, so the same bits, for partial tiles too (M = 70, N = 48; the weight gradient's K-steps
  // run over the 70 pixels, the last one partly past them).
  mgpu::Rng rng(47);
  const ImageShape xs{32, 2, 5, 7};
  const int N = 48, M = xs.batch * xs.height * xs.width, K = 9 * xs.channels;
  std::vector<std::uint16_t> x16(std::size_t(M) * xs.channels), w16(std::size_t(N) * K);
  for (auto& v : x16) v = bf16(float(2 * rng.uniform() - 1));
  for (auto& v : w16) v = bf16(float(2 * rng.uniform() - 1));
  const std::vector<float> dz = testing::random_floats(std::size_t(N) * M, rng);
  tc::ConvGemm g{};
  g.x16 = x16.data(), g.w16 = w16.data(), g.dz = dz.data();
  g.batch = xs.batch, g.height = g.out_height = xs.height, g.width = g.out_width = xs.width;
  g.in_channels = xs.channels, g.out_channels = N, g.kernel = 3, g.padding = 1;
  g.m = M, g.n = N, g.k = K;
  using Warp = tc::WarpAccumulators[tc::kWarp];
  using Block = tc::WarpAccumulators[tc::kWarpsPerBlock][tc::kWarp];

  // The forward product: z [N][M].
  std::vector<float> direct(std::size_t(N) * M, -7.0f), staged(std::size_t(N) * M, -9.0f);
  g.out = direct.data();
  for (int row0 = 0; row0 < M; row0 += tc::kWarpTileM)
    for (int col0 = 0; col0 < N; col0 += tc::kWarpTileN) {
      Warp acc = {};
      tc::warp_tile_model<tc::ForwardOperands>(g, row0, col0, 0, K, acc);
      for (int lane = 0; lane < tc::kWarp; ++lane) tc::store_forward(g, acc[lane], row0, col0, lane);
    }
  g.out = staged.data();
  for (int m0 = 0; m0 < M; m0 += tc::kBlockTileM)
    for (int n0 = 0; n0 < N; n0 += tc::kBlockTileN) {
      Block acc = {};
      tc::block_tile_model(tc::ForwardStage{g, m0, n0}, 0, K, acc);
      for (int w = 0; w < tc::kWarpsPerBlock; ++w)
        for (int lane = 0; lane < tc::kWarp; ++lane)
          tc::store_forward(g, acc[w][lane], m0 + tc::warp_row(w), n0 + tc::warp_col(w), lane);
    }
  CHECK(std::count(direct.begin(), direct.end(), -7.0f) == 0);  // every element written
  CHECK(staged == direct);

  // The weight gradient: dW [N][Cin][3][3], added to zeros.
  std::vector<float> dW_direct(std::size_t(N) * K, 0.0f), dW_staged(std::size_t(N) * K, 0.0f);
  g.out = dW_direct.data();
  for (int co0 = 0; co0 < N; co0 += tc::kWarpTileM)
    for (int kk0 = 0; kk0 < K; kk0 += tc::kWarpTileN) {
      Warp acc = {};
      tc::warp_tile_model<tc::WeightGradOperands>(g, co0, kk0, 0, M, acc);
      for (int lane = 0; lane < tc::kWarp; ++lane) tc::add_weight_grad(g, acc[lane], co0, kk0, lane);
    }
  g.out = dW_staged.data();
  for (int co0 = 0; co0 < N; co0 += tc::kBlockTileM)
    for (int kk0 = 0; kk0 < K; kk0 += tc::kBlockTileN) {
      Block acc = {};
      tc::block_tile_model(tc::WeightGradStage{g, co0, kk0}, 0, M, acc);
      for (int w = 0; w < tc::kWarpsPerBlock; ++w)
        for (int lane = 0; lane < tc::kWarp; ++lane)
          tc::add_weight_grad(g, acc[w][lane], co0 + tc::warp_row(w), kk0 + tc::warp_col(w), lane);
    }
  CHECK(testing::has_nonzero(dW_direct));
  CHECK(dW_staged == dW_direct);
}

TEST_CASE("implicit GEMM: forward, input and weight gradients equal chapter 09's on the bf16-rounded inputs") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::Rng rng(46);
  if (const std::string why = tc::unsupported_reason(d); !why.empty()) {
    // A GPU without bf16 tensor cores (before sm_80): the launchers refuse it, in these words.
    MESSAGE(why);
    const ImageShape xs{16, 1, 4, 4};
    const ConvShape c{16, 16, 3, 1, 1};
    mgpu::Buffer<float> x(d, xs.size()), W(d, std::size_t(16) * 16 * 9), z(d, xs.size()),
        scratch(d, std::size_t(tc::scratch_floats(xs, c)));
    CHECK_THROWS_WITH_AS(tc::conv_forward_tc(d, x.data(), xs, c, W.data(), nullptr, scratch.data(), z.data()),
                         doctest::Contains("compute capability 8.0"), mgpu::Error);
    return;
  }
  for (const auto& shape : tc_cases()) {  // no structured binding: CAPTURE is a lambda
    const ImageShape xs = shape.first;
    const ConvShape c = shape.second;
    CAPTURE(label(xs, c));
    REQUIRE(tc::takes(xs, c));
    const ImageShape zs = nn::conv_output_shape(xs, c);
    const std::size_t w_count = std::size_t(c.out_channels) * c.in_channels * 9;
    const std::vector<float> x = testing::random_floats(xs.size(), rng), W = testing::random_floats(w_count, rng),
                             b = testing::random_floats(c.out_channels, rng), dz = testing::random_floats(zs.size(), rng),
                             dW0 = testing::random_floats(w_count, rng), db0 = testing::random_floats(c.out_channels, rng);
    mgpu::Buffer<float> ones(d, std::size_t(zs.batch) * zs.height * zs.width);
    mgpu::fill(d, ones.data(), std::int64_t(ones.size()), 1.0f);

    // The reference: chapter 09's convolution on the inputs the tensor cores read, rounded to bf16.
    // (db sums dz as it is, in fp32, on both sides; the bias is added in fp32.)
    const auto xr = testing::on_device(d, rounded(x)), Wr = testing::on_device(d, rounded(W)),
               dzr = testing::on_device(d, rounded(dz)), dz_full = testing::on_device(d, dz), bias = testing::on_device(d, b);
    mgpu::Buffer<float> col(d, nn::conv_col_size(xs, c)), dcol(d, nn::conv_col_size(xs, c));
    mgpu::Buffer<float> z_ref(d, zs.size()), dx_ref(d, xs.size()), db_unused = testing::on_device(d, db0);
    auto dW_ref = testing::on_device(d, dW0), db_ref = testing::on_device(d, db0);
    nn::conv2d_forward(d, xr.data(), xs, c, Wr.data(), bias.data(), col.data(), z_ref.data());
    nn::conv2d_backward(d, dzr.data(), xr.data(), xs, c, Wr.data(), ones.data(), col.data(), dcol.data(), dW_ref.data(),
                        db_unused.data(), dx_ref.data());
    nn::conv2d_backward(d, dz_full.data(), xr.data(), xs, c, Wr.data(), ones.data(), col.data(), dcol.data(),
                        testing::on_device(d, dW0).data(), db_ref.data(), nullptr);

    // The tensor path on the unrounded inputs: it rounds them itself.
    const auto xd = testing::on_device(d, x), Wd = testing::on_device(d, W);
    mgpu::Buffer<float> scratch = testing::poisoned(d, tc::scratch_floats(xs, c));
    mgpu::Buffer<float> z = testing::poisoned(d, zs.size()), dx = testing::poisoned(d, xs.size());
    auto dW = testing::on_device(d, dW0), db = testing::on_device(d, db0);
    tc::conv_forward_tc(d, xd.data(), xs, c, Wd.data(), bias.data(), scratch.data(), z.data());
    tc::conv_backward_tc(d, dz_full.data(), xd.data(), xs, c, Wd.data(), ones.data(), scratch.data(), dW.data(),
                         db.data(), dx.data());
    const std::vector<float> dx_want = dx_ref.download();
    REQUIRE(testing::has_nonzero(dx_want));
    testing::check_close(z.download(), ref::to_double(z_ref.download()), 1e-5, "z");
    testing::check_close(dx.download(), ref::to_double(dx_want), 1e-5, "dx");
    testing::check_close(dW.download(), ref::to_double(dW_ref.download()), 1e-5, "dW (added to what it held)");
    testing::check_close(db.download(), ref::to_double(db_ref.download()), 1e-5, "db (added to what it held)");

    // And the rounding did happen: against chapter 09 on the unrounded inputs, z differs.
    mgpu::Buffer<float> z_fp32(d, zs.size());
    nn::conv2d_forward(d, xd.data(), xs, c, Wd.data(), bias.data(), col.data(), z_fp32.data());
    const std::vector<float> got = z.download(), fp32 = z_fp32.download();
    CHECK(got != fp32);

    // Without dx: dW and db only, dx untouched.
    mgpu::Buffer<float> untouched = testing::poisoned(d, xs.size());
    const std::vector<float> poison = untouched.download();
    auto dW2 = testing::on_device(d, dW0), db2 = testing::on_device(d, db0);
    tc::conv_backward_tc(d, dz_full.data(), xd.data(), xs, c, Wd.data(), ones.data(), scratch.data(), dW2.data(),
                         db2.data(), nullptr);
    testing::check_close(dW2.download(), ref::to_double(dW_ref.download()), 1e-5, "dW without dx");
    testing::check_equal(untouched.download(), poison, "a dx nobody asked for");
  }
}

TEST_CASE("implicit GEMM: shapes it does not take are left to raw's plan by the table, and refused by the launchers") {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  const std::vector<std::pair<ImageShape, ConvShape>> others = {
      {{1, 2, 8, 8}, {1, 16, 3, 1, 1}},    // the stem: one input channel
      {{16, 2, 8, 8}, {16, 32, 3, 2, 1}},  // stride 2
      {{16, 2, 8, 8}, {16, 32, 1, 2, 0}},  // the 1x1 projection
      {{8, 2, 8, 8}, {8, 16, 3, 1, 1}},    // 8 channels in
      {{16, 2, 8, 8}, {16, 24, 3, 1, 1}},  // 24 channels out
  };
  const nn::LayerKernels& table = fast::tensor_kernels();
  for (const auto& shape : others) {
    const ImageShape xs = shape.first;
    const ConvShape c = shape.second;
    CAPTURE(label(xs, c));
    CHECK_FALSE(tc::takes(xs, c));
    // The table hands them to the plan it derives from: raw's full-size col.
    CHECK(table.conv_scratch_floats(d, xs, c) == fast::raw_kernels().conv_scratch_floats(d, xs, c));
    mgpu::Buffer<float> x(d, xs.size()), W(d, std::size_t(c.out_channels) * c.in_channels * c.kernel * c.kernel),
        z(d, nn::conv_output_shape(xs, c).size()), scratch(d, std::size_t(nn::conv_col_size(xs, c)));
    CHECK_THROWS_WITH_AS(tc::conv_forward_tc(d, x.data(), xs, c, W.data(), nullptr, scratch.data(), z.data()),
                         doctest::Contains("only 3x3 convolutions of stride 1 and padding 1"), mgpu::Error);
  }
  // A scratch smaller than the table asked for is refused, with both sizes.
  const ImageShape xs{16, 2, 8, 8};
  const ConvShape c{16, 16, 3, 1, 1};
  REQUIRE(tc::takes(xs, c));
  const std::int64_t need = table.conv_scratch_floats(d, xs, c);
  CHECK(need == tc::scratch_floats(xs, c));
  CHECK(need < nn::conv_col_size(xs, c));  // smaller than col: nothing of col's size is written
  mgpu::Buffer<float> x(d, xs.size()), W(d, std::size_t(16) * 16 * 9), z(d, xs.size()), scratch(d, std::size_t(need));
  const std::string needed = std::to_string(need) + " needed";
  CHECK_THROWS_WITH_AS(table.conv_forward(d, x.data(), xs, c, W.data(), nullptr, {scratch.data(), need - 1}, z.data()),
                       doctest::Contains(needed.c_str()), mgpu::Error);
  CHECK(table.convolution_precision() == std::string("bf16"));
  CHECK(nn::reference_kernels().convolution_precision() == nullptr);
}
