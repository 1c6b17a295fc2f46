// Chapter 10's raw kernels (chapters/10_fast_kernels/kernels.h) against chapter 09's.
//
// On every build: each kernel's per-thread function (im2col_element, col2im_element, thread_sum
// and finish_channel, apply_element and apply_vec4) is called here on the host for every index a
// grid would give it, over host copies of the data, and the result is held against chapter 09's
// kernel run on a device (the reference). So the 32-bit index arithmetic is checked on any
// machine, and under the asan and gpu-mapping presets too. Shapes are small and odd: non-square
// images, stride 2, padding 0 and 1, 1x1 and 5x5 kernels, channel counts and row lengths that
// are not multiples of 4 (the vectorised paths' fallbacks).
//
// The cases named "raw kernels: *" call the launchers and compare end to end: on a GPU in the
// cuda build (ctest runs them alone too, as fast_kernels_on_gpu), on the CPU in the cpu build.
//
// The cases named "tiled convolution: *" and "blocked sums: *" hold the CPU's table ("tiled":
// tiled_conv.h, blocked_sums.h) against chapter 09's functions the same way.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/09_resnet/layers.h"
#include "chapters/10_fast_kernels/blocked_sums.h"
#include "chapters/10_fast_kernels/kernels.h"
#include "chapters/10_fast_kernels/tiled_conv.h"
#include "common/check.h"
#include "common/device.h"
#include "common/random.h"
#include "common/vector_ops.h"  // fill
#include "fast_kernels_checks.h"  // ConvCase, check_bitwise, the apply's inputs and checks
#include "helpers.h"

namespace {

using lenet::ImageShape;
using nn::ConvShape;

using testing::ApplyInputs;
using testing::check_bitwise;
using testing::check_host_apply;
using testing::ConvCase;
using testing::label;
using testing::reference_apply;

// The convolutions the layout kernels are checked at: (input shape, kernel, stride, padding).
std::vector<ConvCase> conv_cases() {
  return {
      {{3, 2, 7, 5}, {3, 4, 3, 1, 1}},   // 3x3, stride 1, padding 1, non-square
      {{2, 3, 8, 6}, {2, 4, 3, 2, 1}},   // 3x3, stride 2: ResNet's downsampling
      {{3, 2, 7, 7}, {3, 4, 1, 2, 0}},   // 1x1, stride 2, no padding: the projection, odd side
      {{1, 1, 5, 5}, {1, 2, 3, 1, 0}},   // one channel, one image, no padding
      {{5, 2, 4, 4}, {5, 3, 3, 2, 1}},   // 4 -> 2 with stride 2 (ResNet's 7 -> 4 in small)
      {{3, 2, 7, 5}, {3, 2, 5, 1, 2}},   // 5x5, padding 2
      {{2, 1, 3, 3}, {2, 2, 3, 1, 1}},   // every window touches the padding
      {{3, 2, 9, 6}, {3, 2, 2, 2, 1}},   // an even kernel with padding: windows past the edge
      {{4, 3, 5, 6}, {4, 2, 3, 1, 1}},   // fewer output channels than input ones
      {{2, 2, 4, 3}, {2, 3, 1, 1, 0}},   // 1x1, stride 1: the unfolding is a copy
      // For the cpu build's panels (tiled_conv.cu's PanelConv): K = 576, two chunks of k; 19
      // output channels, register blocks and a remainder; a 7x7 kernel's wide shifts; a 13x13
      // kernel, beyond the panels' largest, which takes the GEMM instead.
      {{64, 2, 4, 4}, {64, 19, 3, 1, 1}},
      {{3, 2, 9, 8}, {3, 5, 7, 1, 3}},
      {{2, 1, 3, 3}, {2, 3, 13, 1, 6}},
      // For Winograd's F(2x2, 3x3) (the cpu build for AVX-512 or AVX2, from 16 input channels): above,
      // both passes of the 64-channel case (dx's flipped convolution has 19 channels in); here the
      // forward pass only (dx has 8 in: the panels), then dx only, on odd sides, whose last tile in
      // each row or column is half outside the image.
      {{32, 2, 7, 5}, {32, 8, 3, 1, 1}},
      {{8, 2, 5, 7}, {8, 24, 3, 1, 1}},
      // ...and its weight gradient (output channels a multiple of 16): 32 a panel row on odd
      // sides, 16 a panel row on even ones.
      {{16, 2, 7, 5}, {16, 32, 3, 1, 1}},
      {{32, 2, 6, 6}, {32, 16, 3, 1, 1}},
  };
}

// Host copies of chapter 09's inputs, and its result computed on the device.
struct Device1 {
  mgpu::DeviceSet devices{1};
  const mgpu::Device& d = devices[0];
};

}  // namespace

TEST_CASE("Divisor: n / d by a multiply and a shift equals n / d for every divisor tried") {
  // Every divisor a ResNet-18 at batch <= 1024 meets (sides, batch, kernel, stride) and more:
  // 1..4096 against n at the edges (0, d-1, d, d+1, multiples of d and their neighbours, the
  // largest ints) and at random; then divisors near powers of two and near 2^31.
  mgpu::Rng rng(1100);
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int e = 13; e <= 30; ++e)
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << e) + delta);
  divisors.push_back(0x7fffffff);
  divisors.push_back(0x7ffffffe);
  long long checked = 0, wrong = 0;
  int first_d = 0, first_n = 0;
  for (const int d : divisors) {
    const fast::Divisor by(d);
    std::vector<int> ns = {0, 1, d - 1, d, 0x7fffffff, 0x7ffffffe, 0x7fffffff - d};
    if (d < 0x7fffffff) ns.push_back(d + 1);
    for (long long q : {2LL, 3LL, 1000LL, 0x7fffffffLL / d}) {
      const long long n = q * d;
      for (long long m : {n - 1, n, n + 1})
        if (m >= 0 && m <= 0x7fffffff) ns.push_back(int(m));
    }
    for (int i = 0; i < 64; ++i) ns.push_back(int(rng.uniform() * 2147483647.0));
    for (const int n : ns) {
      int rem = -1;
      const int q = by.divmod(n, rem);
      ++checked;
      if ((q != n / d || rem != n % d || by.div(n) != q) && wrong++ == 0) first_d = d, first_n = n;
    }
  }
  CHECK_MESSAGE(wrong == 0, wrong << " of " << checked << " divisions wrong; first " << first_n << " / " << first_d);
  CHECK(checked > 4096 * 70);
  CHECK_THROWS_WITH_AS(fast::Divisor(0), doctest::Contains("0 is not a positive int"), mgpu::Error);
}

TEST_CASE("element bodies: im2col_element at every index is nn::im2col, bit for bit") {
  Device1 dev;
  mgpu::Rng rng(1001);
  for (const ConvCase& cc : conv_cases()) {
    CAPTURE(label(cc));
    const std::vector<float> x = testing::random_floats(cc.xs.size(), rng);  // [Cin][B][H][W]
    const auto x_dev = testing::on_device(dev.d, x);
    const std::int64_t cols = nn::conv_col_size(cc.xs, cc.c);
    auto col_dev = testing::poisoned(dev.d, cols);  // [Cin*k*k][B*Ho*Wo]
    nn::im2col(dev.d, x_dev.data(), cc.xs, cc.c, col_dev.data());

    std::vector<float> col(cols, 1.0e30f);
    const fast::Im2colArgs a = fast::im2col_args(x.data(), cc.xs, cc.c, col.data());
    REQUIRE(a.count == cols);
    for (int idx = 0; idx < a.count; ++idx) fast::im2col_element(a, idx);
    check_bitwise(col, col_dev.download(), "im2col " + label(cc));
  }
}

TEST_CASE("element bodies: col2im_element at every index is nn::col2im, bit for bit") {
  Device1 dev;
  mgpu::Rng rng(1002);
  for (const ConvCase& cc : conv_cases()) {
    CAPTURE(label(cc));
    const std::int64_t cols = nn::conv_col_size(cc.xs, cc.c);
    const std::vector<float> col = testing::random_floats(cols, rng);  // [Cin*k*k][B*Ho*Wo]
    const auto col_dev = testing::on_device(dev.d, col);
    auto dx_dev = testing::poisoned(dev.d, cc.xs.size());  // [Cin][B][H][W]
    nn::col2im(dev.d, col_dev.data(), cc.xs, cc.c, dx_dev.data());

    std::vector<float> dx(cc.xs.size(), 1.0e30f);
    const fast::Col2imArgs a = fast::col2im_args(col.data(), cc.xs, cc.c, dx.data());
    REQUIRE(a.count == cc.xs.size());
    for (int idx = 0; idx < a.count; ++idx) fast::col2im_element(a, idx);
    check_bitwise(dx, dx_dev.download(), "col2im " + label(cc));
  }
}

namespace {
// The sums kernels' work on the host, as the GPU cuts it: every (channel, block, thread) adds
// its reads (thread_sum), each block adds its threads' sums into partials[c][block] (here in
// thread order; the GPU's shuffle tree adds them in another), then finish_channel per channel.
std::vector<float> sums_on_host(const std::vector<float>& z, int C, std::int64_t n, int blocks, bool* vec4) {
  std::vector<double> partials(std::size_t(C) * blocks, -1e300);  // [C][blocks]
  std::vector<float> sums(C, 1.0e30f);                            // [C]
  const fast::SumsArgs a = fast::sums_args(z.data(), C, n, blocks, partials.data(), sums.data());
  *vec4 = a.vec4;
  for (int c = 0; c < C; ++c)
    for (int block = 0; block < blocks; ++block) {
      double sum = 0;
      for (int thread = 0; thread < fast::kThreads; ++thread) sum += fast::thread_sum(a, c, block, thread);
      partials[std::size_t(c) * blocks + block] = sum;
    }
  for (int c = 0; c < C; ++c) fast::finish_channel(a, c);
  return sums;
}

std::vector<float> reference_sums(const mgpu::Device& d, const std::vector<float>& z, int C, std::int64_t n) {
  const auto z_dev = testing::on_device(d, z);
  auto sums_dev = testing::poisoned(d, C);
  nn::ReductionScratch scratch(d, C);
  nn::batch_norm_sums(d, z_dev.data(), C, n, scratch, sums_dev.data());
  return sums_dev.download();
}

// (channels, n, blocks per channel): one block and many; rows that are and are not multiples of 4
// (the Vec4 reads and the float fallback); rows shorter than one block's threads.
struct SumsCase {
  int channels;
  std::int64_t n;
  int blocks;
};
const SumsCase kSumsCases[] = {{1, 1, 1},      {3, 7, 1},      {5, 100, 2},    {3, 1000, 3},
                               {2, 4096, 4},   {4, 4099, 5},   {7, 12544, 13}, {1, 3 * 1024 + 1, 256}};
}  // namespace

TEST_CASE("element bodies: the sums' blocks cover every value once (small integers, exact in any order)") {
  Device1 dev;
  mgpu::Rng rng(1003);
  for (const SumsCase& sc : kSumsCases) {
    CAPTURE(sc.channels);
    CAPTURE(sc.n);
    CAPTURE(sc.blocks);
    std::vector<float> z(std::size_t(sc.channels) * sc.n);
    for (float& v : z) v = float(int(rng.below(9)) - 4);  // sums of at most 2^24: exact in float and double
    bool vec4 = false;
    const std::vector<float> got = sums_on_host(z, sc.channels, sc.n, sc.blocks, &vec4);
    CHECK(vec4 == (sc.n % 4 == 0));  // std::vector's data is 16-byte aligned
    check_bitwise(got, reference_sums(dev.d, z, sc.channels, sc.n), "sums of integers");
  }
}

TEST_CASE("element bodies: the sums match nn::batch_norm_sums within 1e-6 of the sum of |z|") {
  Device1 dev;
  mgpu::Rng rng(1004);
  for (const SumsCase& sc : kSumsCases) {
    CAPTURE(sc.channels);
    CAPTURE(sc.n);
    CAPTURE(sc.blocks);
    std::vector<float> z = testing::random_floats(std::size_t(sc.channels) * sc.n, rng, -1.0, 3.0);  // mean 1
    bool vec4 = false;
    const std::vector<float> got = sums_on_host(z, sc.channels, sc.n, sc.blocks, &vec4);
    const std::vector<float> want = reference_sums(dev.d, z, sc.channels, sc.n);
    for (int c = 0; c < sc.channels; ++c) {
      double scale = 0;
      for (std::int64_t j = 0; j < sc.n; ++j) scale += std::abs(z[c * sc.n + j]);
      CHECK_MESSAGE(std::abs(double(got[c]) - want[c]) <= 1e-6 * scale, "channel " << c << ": got " << got[c]
                                                                                  << ", expected " << want[c]);
    }
  }
}

namespace {
// BatchNorm's two other sums, every way this chapter computes them, beside chapter 09's (the
// reference, on the device): on the host as a GPU cuts the work (for a chosen number of blocks
// per channel), and through the launchers (fast::batch_norm_*_sums_raw: a GPU's kernels in the
// cuda build, the same element functions on the CPU in the cpu build).
struct TermSumsCase {
  int C;
  std::int64_t n;
  std::vector<float> z, dy, stats, sums0, dgamma, dbeta;  // stats [2][C]; sums0 [C] = sum z
  TermSumsCase(int channels, std::int64_t values, mgpu::Rng& rng) : C(channels), n(values) {
    z = testing::random_floats(std::size_t(C) * n, rng, 0.5, 1.5);  // a mean far from 0: centring matters
    dy = testing::random_floats(std::size_t(C) * n, rng, -1.0, 1.0);
    stats = testing::random_floats(std::size_t(2) * C, rng, 0.5, 2.0);
    dgamma = testing::random_floats(C, rng, -1.0, 1.0);
    dbeta = testing::random_floats(C, rng, -1.0, 1.0);
    sums0.assign(C, 0.0f);
    for (int c = 0; c < C; ++c) {
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += z[c * n + j];
      sums0[c] = float(sum);
    }
  }
  // The scales the sums are compared at: per channel, sum (z - mean)^2, sum |dy|, sum |dy xhat|.
  void scales(std::vector<double>& square, std::vector<double>& grad, std::vector<double>& grad_xhat) const {
    square.assign(C, 0), grad.assign(C, 0), grad_xhat.assign(C, 0);
    for (int c = 0; c < C; ++c)
      for (std::int64_t j = 0; j < n; ++j) {
        const double centered = z[c * n + j] - double(sums0[c]) / n;
        const float xhat = (z[c * n + j] - stats[c]) * stats[C + c];
        square[c] += centered * centered;
        grad[c] += std::abs(dy[c * n + j]);
        grad_xhat[c] += std::abs(double(dy[c * n + j]) * xhat);
      }
  }
};

// Chapter 09's results: [0] sums[1] of the square sums; [1], [2] the backward's two sums;
// [3] dgamma, [4] dbeta after the backward sums added into them.
std::vector<std::vector<float>> term_sums_reference(const mgpu::Device& d, const TermSumsCase& t) {
  const auto z = testing::on_device(d, t.z), dy = testing::on_device(d, t.dy), stats = testing::on_device(d, t.stats);
  std::vector<float> sums_host = t.sums0;
  sums_host.resize(2 * t.C, 1.0e30f);
  auto sums = testing::on_device(d, sums_host), back = testing::poisoned(d, 2 * t.C);
  auto dgamma = testing::on_device(d, t.dgamma), dbeta = testing::on_device(d, t.dbeta);
  nn::ReductionScratch scratch(d, t.C);
  nn::batch_norm_square_sums(d, z.data(), t.C, t.n, double(t.n), scratch, sums.data());
  nn::batch_norm_backward_sums(d, dy.data(), z.data(), t.C, t.n, stats.data(), scratch, back.data(), dgamma.data(),
                               dbeta.data());
  const std::vector<float> square = sums.download(), b = back.download();
  return {std::vector<float>(square.begin() + t.C, square.end()), std::vector<float>(b.begin(), b.begin() + t.C),
          std::vector<float>(b.begin() + t.C, b.end()), dgamma.download(), dbeta.download()};
}

// The same five from this chapter's per-thread functions, run on the host for `blocks` blocks
// per channel (their threads in order).
template <class Term>
void term_sums_on_host(const Term& term, int C, std::int64_t n, int blocks, float* first, float* second,
                       float* dgamma, float* dbeta) {
  std::vector<double> partials(std::size_t(2) * C * blocks, -1e300);
  const fast::TermSumsArgs<Term> a{term, partials.data(), first, second, dgamma, dbeta, C, int(n), blocks};
  for (int c = 0; c < C; ++c)
    for (int block = 0; block < blocks; ++block) {
      fast::SumPair sum;
      for (int thread = 0; thread < fast::kThreads; ++thread) {
        const fast::SumPair v = fast::thread_term_sums(a, c, block, thread);
        sum.first += v.first, sum.second += v.second;
      }
      partials[std::size_t(c) * blocks + block] = sum.first;
      partials[(std::size_t(C) + c) * blocks + block] = sum.second;
    }
  for (int c = 0; c < C; ++c) fast::finish_term_channel(a, c);
}

void check_term_sums(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                     const TermSumsCase& t, const std::string& how) {
  std::vector<double> square, grad, grad_xhat;
  t.scales(square, grad, grad_xhat);
  const char* names[] = {"sum (z - mean)^2", "sum dy", "sum dy xhat", "dgamma", "dbeta"};
  const std::vector<double>* scale[] = {&square, &grad, &grad_xhat, &grad_xhat, &grad};
  for (int k = 0; k < 5; ++k)
    for (int c = 0; c < t.C; ++c)
      CHECK_MESSAGE(std::abs(double(got[k][c]) - want[k][c]) <= 1e-6 * (*scale[k])[c] + 1e-6,
                    how << ": " << names[k] << ", channel " << c << ": got " << got[k][c] << ", expected "
                        << want[k][c]);
}
}  // namespace

TEST_CASE("element bodies: the square sums and the backward's two sums match chapter 09's within 1e-6 of their scale") {
  Device1 dev;
  mgpu::Rng rng(1006);
  for (const SumsCase& sc : kSumsCases) {
    CAPTURE(sc.channels);
    CAPTURE(sc.n);
    CAPTURE(sc.blocks);
    const TermSumsCase t(sc.channels, sc.n, rng);
    const std::vector<std::vector<float>> want = term_sums_reference(dev.d, t);
    std::vector<std::vector<float>> got(5, std::vector<float>(t.C, 1.0e30f));
    got[3] = t.dgamma, got[4] = t.dbeta;
    term_sums_on_host(fast::CenteredSquareTerm{t.z.data(), t.sums0.data(), double(t.n)}, t.C, t.n, sc.blocks,
                      got[0].data(), nullptr, nullptr, nullptr);
    term_sums_on_host(fast::GradXhatTerm{t.dy.data(), t.z.data(), t.stats.data(), t.C}, t.C, t.n, sc.blocks,
                      got[1].data(), got[2].data(), got[3].data(), got[4].data());
    check_term_sums(got, want, t, "on the host");
  }
}

TEST_CASE("element bodies: the sums' launch plan fills a GPU and stays in its bounds") {
  // ResNet-18's BatchNorm shapes at batch 256 on an H100's 132 SMs: a full load of threads (132 x
  // 2,048) where the rows hold 4 reads (Vec4s) for each, else a thread for every 4 reads; chapter
  // 09 starts 8,192 to 65,536 threads.
  const int sms = 132;
  // (channels, values per channel); plain variables, not a structured binding: doctest's CAPTURE
  // takes them into a lambda, which C++17 does not allow for a binding (clang refuses it).
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{64, 200704}, {128, 50176}, {256, 12544}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    CAPTURE(C);
    const int blocks = fast::sums_blocks_per_channel(C, n, sms);
    CHECK(blocks >= 1);
    CHECK(blocks <= fast::kMaxSumBlocks);
    const std::int64_t threads = std::int64_t(C) * blocks * fast::kThreads;
    const std::int64_t four_reads_each = C * (n / 4 / (4 * fast::kThreads)) * fast::kThreads;
    CHECK(threads >= std::min<std::int64_t>(std::int64_t(sms) * 2048, four_reads_each));
    CHECK(threads >= 4 * 128 * C);  // chapter 09's 128 a channel, four times over at least
  }
  // 512 channels of 4,096 values: 1,024 Vec4s a row, one block's worth of 4 reads a thread.
  CHECK(fast::sums_blocks_per_channel(512, 4096, sms) == 1);
  CHECK(fast::sums_blocks_per_channel(1, 1, sms) == 1);
  CHECK(fast::sums_blocks_per_channel(1, std::int64_t(1) << 30, sms) == fast::kMaxSumBlocks);
}

TEST_CASE("element bodies: apply_element and apply_vec4 are nn::batch_norm_apply (bit for bit on a CPU)") {
  Device1 dev;
  mgpu::Rng rng(1005);
  // (channels, n): rows of 9 and 7 values (scalar path only), 12 and 16 (Vec4s too); channel
  // counts 3, 5 and 4.
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{3, 9}, {5, 7}, {3, 12}, {4, 16}, {5, 100}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    const ApplyInputs in(C, n, rng);
    CAPTURE(C);
    CAPTURE(n);
    for_each_apply_choice(dev.d, in, [&](const std::vector<float>& want, std::vector<float>& y,
                                         const fast::ApplyArgs& a) {
      CHECK(a.vec4 == (n % 4 == 0));
      for (int idx = 0; idx < C * n; ++idx) fast::apply_element(a, idx);  // the scalar path, always
      check_host_apply(y, want, "apply_element");
      if (n % 4 == 0) {  // the vectorised path
        std::fill(y.begin(), y.end(), 1.0e30f);
        REQUIRE(a.count == C * n / 4);
        for (int q = 0; q < a.count; ++q) fast::apply_vec4(a, q);
        check_host_apply(y, want, "apply_vec4");
      }
    });
  }
}

TEST_CASE("element bodies: the vectorised paths are chosen only where they are safe") {
  std::vector<float> buf(64 + 4);  // std::vector's data is 16-byte aligned; buf.data() + 1 is not
  float* aligned = buf.data();
  float* off = buf.data() + 1;
  const float params[8] = {};
  CHECK(fast::apply_args(aligned, 4, 16, params, params, params, nullptr, true, aligned).vec4);
  CHECK_FALSE(fast::apply_args(aligned, 4, 15, params, params, params, nullptr, true, aligned).vec4);  // 15 % 4
  CHECK_FALSE(fast::apply_args(off, 4, 16, params, params, params, nullptr, true, aligned).vec4);      // z
  CHECK_FALSE(fast::apply_args(aligned, 4, 16, params, params, params, off, true, aligned).vec4);      // residual
  CHECK_FALSE(fast::apply_args(aligned, 4, 16, params, params, params, nullptr, true, off).vec4);      // y
  double partials[4];
  float sums[4];
  CHECK(fast::sums_args(aligned, 4, 16, 1, partials, sums).vec4);
  CHECK_FALSE(fast::sums_args(off, 4, 16, 1, partials, sums).vec4);
  CHECK_FALSE(fast::sums_args(aligned, 4, 15, 1, partials, sums).vec4);
}

TEST_CASE("element bodies: a buffer beyond 32-bit indices is refused, naming it") {
  // Stage 1 of ResNet-18 at batch 5,000: col has 64*9 * 5000*28*28 = 2.26e9 elements > 2^31 - 1.
  const ImageShape xs{64, 5000, 28, 28};
  const ConvShape c{64, 64, 3, 1, 1};
  CHECK_THROWS_WITH_AS(fast::im2col_args(nullptr, xs, c, nullptr), doctest::Contains("im2col_raw's col"),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::col2im_args(nullptr, xs, c, nullptr), doctest::Contains("col2im_raw's col"),
                       mgpu::Error);
  CHECK_THROWS_AS(fast::apply_args(nullptr, 64, std::int64_t(1) << 26, nullptr, nullptr, nullptr, nullptr, false,
                                   nullptr),
                  mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::im2col_args(nullptr, {3, 1, 5, 5}, {4, 4, 3, 1, 1}, nullptr),
                       doctest::Contains("the input has 3 channels, the convolution expects 4"), mgpu::Error);
}

// ---- The launchers end to end against chapter 09's kernels on the same device: on a GPU the
// `__global__` kernels; in the cpu build the same element functions run by for_each_index.
TEST_CASE("raw kernels: im2col_raw and col2im_raw equal nn::im2col and nn::col2im, bit for bit") {
  Device1 dev;
  mgpu::Rng rng(1101);
  std::vector<ConvCase> cases = conv_cases();
  cases.push_back({{64, 8, 28, 28}, {64, 64, 3, 1, 1}});   // ResNet-18's stage 1 at batch 8
  cases.push_back({{128, 8, 14, 14}, {128, 256, 3, 2, 1}});
  for (const ConvCase& cc : cases) {
    CAPTURE(label(cc));
    const std::int64_t cols = nn::conv_col_size(cc.xs, cc.c);
    const auto x = testing::on_device(dev.d, testing::random_floats(cc.xs.size(), rng));
    auto col_ref = testing::poisoned(dev.d, cols), col_raw = testing::poisoned(dev.d, cols);
    nn::im2col(dev.d, x.data(), cc.xs, cc.c, col_ref.data());
    fast::im2col_raw(dev.d, x.data(), cc.xs, cc.c, col_raw.data());
    check_bitwise(col_raw.download(), col_ref.download(), "im2col_raw " + label(cc));

    const auto col = testing::on_device(dev.d, testing::random_floats(cols, rng));
    auto dx_ref = testing::poisoned(dev.d, cc.xs.size()), dx_raw = testing::poisoned(dev.d, cc.xs.size());
    nn::col2im(dev.d, col.data(), cc.xs, cc.c, dx_ref.data());
    fast::col2im_raw(dev.d, col.data(), cc.xs, cc.c, dx_raw.data());
    check_bitwise(dx_raw.download(), dx_ref.download(), "col2im_raw " + label(cc));
  }
}

TEST_CASE("raw kernels: batch_norm_sums_raw matches nn::batch_norm_sums, and repeats to the bit") {
  Device1 dev;
  mgpu::Rng rng(1102);
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{3, 7}, {5, 1001}, {64, 8 * 784}, {512, 4096}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    CAPTURE(C);
    CAPTURE(n);
    const std::vector<float> z = testing::random_floats(std::size_t(C) * n, rng, -1.0, 3.0);
    const auto z_dev = testing::on_device(dev.d, z);
    mgpu::Buffer<double> partials(dev.d, std::size_t(C) * fast::kMaxSumBlocks);
    auto sums = testing::poisoned(dev.d, C);
    fast::batch_norm_sums_raw(dev.d, z_dev.data(), C, n, partials.data(), sums.data());
    const std::vector<float> got = sums.download(), want = reference_sums(dev.d, z, C, n);
    for (int c = 0; c < C; ++c) {
      double scale = 0;
      for (std::int64_t j = 0; j < n; ++j) scale += std::abs(z[c * n + j]);
      CHECK_MESSAGE(std::abs(double(got[c]) - want[c]) <= 1e-6 * scale, "channel " << c);
    }
    fast::batch_norm_sums_raw(dev.d, z_dev.data(), C, n, partials.data(), sums.data());
    check_bitwise(sums.download(), got, "a second run");  // no atomics: the same order every time
  }
}

TEST_CASE("raw kernels: the square sums and the backward's two sums match chapter 09's, and repeat to the bit") {
  Device1 dev;
  mgpu::Rng rng(1104);
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{3, 7}, {5, 1001}, {64, 8 * 784}, {512, 4096}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    CAPTURE(C);
    CAPTURE(n);
    const TermSumsCase t(C, n, rng);
    const std::vector<std::vector<float>> want = term_sums_reference(dev.d, t);
    const auto z = testing::on_device(dev.d, t.z), dy = testing::on_device(dev.d, t.dy),
               stats = testing::on_device(dev.d, t.stats);
    mgpu::Buffer<double> partials(dev.d, std::size_t(2) * C * fast::kMaxSumBlocks);
    std::vector<std::vector<float>> runs[2];
    for (auto& got : runs) {
      std::vector<float> sums_host = t.sums0;
      sums_host.resize(2 * C, 1.0e30f);
      auto sums = testing::on_device(dev.d, sums_host), back = testing::poisoned(dev.d, 2 * C);
      auto dgamma = testing::on_device(dev.d, t.dgamma), dbeta = testing::on_device(dev.d, t.dbeta);
      fast::batch_norm_square_sums_raw(dev.d, z.data(), C, n, double(n), partials.data(), sums.data());
      fast::batch_norm_backward_sums_raw(dev.d, dy.data(), z.data(), C, n, stats.data(), partials.data(), back.data(),
                                         dgamma.data(), dbeta.data());
      const std::vector<float> square = sums.download(), b = back.download();
      CHECK(std::equal(square.begin(), square.begin() + C, t.sums0.begin()));  // sums[0] read, not written
      got = {std::vector<float>(square.begin() + C, square.end()), std::vector<float>(b.begin(), b.begin() + C),
             std::vector<float>(b.begin() + C, b.end()), dgamma.download(), dbeta.download()};
    }
    check_term_sums(runs[0], want, t, "raw");
    for (int k = 0; k < 5; ++k) check_bitwise(runs[1][k], runs[0][k], "a second run");  // no atomics
  }
}

TEST_CASE("raw kernels: batch_norm_apply_raw equals nn::batch_norm_apply, bit for bit") {
  Device1 dev;
  mgpu::Rng rng(1103);
  for (const auto& shape : std::vector<std::pair<int, std::int64_t>>{{3, 9}, {4, 16}, {64, 8 * 784}, {5, 1001}}) {
    const int C = shape.first;
    const std::int64_t n = shape.second;
    const ApplyInputs in(C, n, rng);
    const auto z = testing::on_device(dev.d, in.z), residual = testing::on_device(dev.d, in.residual);
    const auto stats = testing::on_device(dev.d, in.stats), gamma = testing::on_device(dev.d, in.gamma),
               beta = testing::on_device(dev.d, in.beta);
    for (const bool with_residual : {false, true})
      for (const bool relu : {false, true}) {
        CAPTURE(C);
        CAPTURE(n);
        CAPTURE(with_residual);
        CAPTURE(relu);
        auto y = testing::poisoned(dev.d, in.z.size());
        fast::batch_norm_apply_raw(dev.d, z.data(), C, n, stats.data(), gamma.data(), beta.data(),
                                   with_residual ? residual.data() : nullptr,
                                   relu ? lenet::Activation::Relu : lenet::Activation::None, y.data());
        check_bitwise(y.download(), reference_apply(dev.d, in, with_residual, relu), "batch_norm_apply_raw");
      }
  }
}

// ---------------------------------------------------------------- the tiled convolution (CPU)
// chapters/10_fast_kernels/tiled_conv.h: chapter 09's convolution done a few images at a time on
// a device's lanes. Held against chapter 09's conv2d_forward and conv2d_backward at the shapes
// above, for batches that do and do not divide into tiles, with one image a tile and with
// several, on one lane and on as many as the device has.

TEST_CASE("tiled convolution: plan_tiles cuts the batch into whole images, every lane with work") {
  const ImageShape xs{16, 256, 28, 28};
  const ConvShape c{16, 16, 3, 1, 1};  // stage 1 of a width-16 ResNet-18: K = 144, 784 pixels an image
  const std::int64_t per_image = 144 * 784;
  // The defaults: as many images as kTileFloats hold, at least kMinTileColumns columns' worth.
  const fast::TilePlan plan = fast::plan_tiles(2, xs, c);
  const std::int64_t for_columns = (fast::kMinTileColumns + 783) / 784;
  CHECK(plan.images == std::max<std::int64_t>({1, fast::kTileFloats / per_image, for_columns}));
  CHECK(plan.tiles == (256 + plan.images - 1) / plan.images);
  CHECK(plan.lanes == 2);
  CHECK(plan.tile_floats == per_image * plan.images);
  CHECK(plan.partial_floats == 16 * 144);
  // Stride 1, 28 -> 28: dx is a convolution of dz, whose unfolded tile is as large as col here
  // (Cout = Cin), and W flipped takes one more partial's room.
  CHECK(plan.dx_by_convolution);
  CHECK(plan.dcol_floats == plan.tile_floats);
  CHECK(plan.scratch_floats() ==
        2 * 2 * plan.tile_floats + 2 * plan.partial_floats + plan.winograd_floats + plan.winograd_dw_floats);
  // Stride 2: dcol and col2im, as chapter 09; twice the channels out: dz's unfolding is the larger.
  // The cpu build multiplies the shifted convolutions in panels, up to 11x11; a cuda build never.
  CHECK(fast::multiplies_in_panels(xs, c) == !mgpu::kCudaBackend);
  CHECK(fast::multiplies_in_panels({16, 4, 9, 9}, {16, 8, 11, 1, 5}) == !mgpu::kCudaBackend);
  CHECK_FALSE(fast::multiplies_in_panels({16, 4, 13, 13}, {16, 8, 13, 1, 6}));
  CHECK_FALSE(fast::multiplies_in_panels(xs, {16, 32, 3, 2, 1}));
  // Winograd's F(2x2, 3x3): 3x3, stride 1, padding 1, from 16 input channels, in a cpu build
  // for AVX-512 or AVX2 only; its transform of W (or of W flipped, for dx) takes 16 x Cout x Cin more.
#if defined(__AVX512F__) || defined(__AVX2__)  // (built with the kernels' flags: -march=native in the cpu build)
  const bool winograd = !mgpu::kCudaBackend;
#else
  const bool winograd = false;
#endif
  CHECK(fast::multiplies_by_winograd(xs, c) == winograd);
  CHECK(plan.winograd_floats == (winograd ? 16 * 16 * 16 : 0));
  CHECK(fast::multiplies_by_winograd({32, 4, 7, 5}, {32, 8, 3, 1, 1}) == winograd);
  CHECK_FALSE(fast::multiplies_by_winograd({8, 4, 14, 14}, {8, 32, 3, 1, 1}));     // 8 channels in
  CHECK_FALSE(fast::multiplies_by_winograd({32, 4, 14, 14}, {32, 32, 3, 2, 1}));   // stride 2
  CHECK_FALSE(fast::multiplies_by_winograd({32, 4, 14, 14}, {32, 32, 5, 1, 2}));   // 5x5
  CHECK_FALSE(fast::multiplies_by_winograd({32, 4, 14, 14}, {32, 32, 1, 1, 0}));   // 1x1
  const std::int64_t by_winograd = winograd ? 16 * 8 * 48 : 0;
  CHECK(fast::plan_tiles(2, {8, 4, 14, 14}, {8, 48, 3, 1, 1}).winograd_floats == by_winograd);  // dx only
  CHECK(fast::plan_tiles(2, {8, 4, 14, 14}, {8, 8, 3, 1, 1}).winograd_floats == 0);             // neither
  // The weight gradient by Winograd: where the passes are, with a multiple of 16 channels out. Per
  // lane, V and D for a slice's tile positions (2 images of 28x28: 392 tiles, 400 positions) and its dU.
  CHECK(fast::weight_gradient_by_winograd(xs, c) == winograd);
  CHECK_FALSE(fast::weight_gradient_by_winograd({32, 4, 7, 5}, {32, 8, 3, 1, 1}));
  CHECK_FALSE(fast::weight_gradient_by_winograd({8, 4, 14, 14}, {8, 32, 3, 1, 1}));
  CHECK(plan.winograd_dw_floats == (winograd ? 2 * 16 * (400 * (16 + 16) + 16 * 16) : 0));
  CHECK(plan.images == 2);
  const fast::TilePlan halving = fast::plan_tiles(2, xs, {16, 32, 3, 2, 1});
  CHECK_FALSE(halving.dx_by_convolution);
  CHECK(halving.dcol_floats == halving.tile_floats);
  CHECK(halving.scratch_floats() == 2 * 2 * halving.tile_floats + halving.partial_floats);
  const fast::TilePlan widening = fast::plan_tiles(2, xs, {16, 32, 3, 1, 1});
  CHECK(widening.dx_by_convolution);
  CHECK(widening.dcol_floats == 2 * widening.tile_floats);
  // A tile smaller than an image, and no column minimum, still holds one image; a column minimum
  // of 1,000 needs two 28x28 images, and 64 4x4 ones.
  CHECK(fast::plan_tiles(2, xs, c, 1, 1).images == 1);
  CHECK(fast::plan_tiles(2, xs, c, 1, 1000).images == 2);
  CHECK(fast::plan_tiles(2, {16, 256, 4, 4}, c, 1, 1000).images == 63);
  CHECK(fast::plan_tiles(2, {16, 256, 4, 4}, c, 1, 1024).images == 64);
  // A huge tile holds no more than a lane's share.
  const fast::TilePlan huge = fast::plan_tiles(3, xs, c, std::int64_t(1) << 40);
  CHECK(huge.images == 86);  // ceil(256 / 3)
  CHECK(huge.tiles == 3);
  CHECK(huge.lanes == 3);
  // Fewer tiles than lanes: only as many lanes as tiles (one image, four lanes).
  const fast::TilePlan single = fast::plan_tiles(4, {16, 1, 28, 28}, c);
  CHECK(single.tiles == 1);
  CHECK(single.lanes == 1);
  CHECK(single.scratch_floats() == 2 * single.tile_floats + single.partial_floats + single.winograd_floats +
                                       single.winograd_dw_floats);  // + W flipped
  const char* refused = "plan_tiles: needs lanes, a tile size, a column minimum and a batch";
  CHECK_THROWS_WITH_AS(fast::plan_tiles(0, xs, c), doctest::Contains(refused), mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::plan_tiles(2, {16, 0, 28, 28}, c), doctest::Contains(refused), mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::plan_tiles(2, xs, c, 1, 0), doctest::Contains(refused), mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::plan_tiles(2, {8, 4, 28, 28}, c), doctest::Contains("8 channels"), mgpu::Error);
}

TEST_CASE("tiled convolution: im2col_shifted_images is chapter 09's im2col_images, bit for bit, for every slice") {
  // The shifted copy reads neighbouring rows and images before it zeroes them: every slice of
  // every batch, so that the first and last images (where the copy is clamped) are among them.
  Device1 dev;
  mgpu::Rng rng(1211);
  int compared = 0;
  for (const ConvCase& cc : conv_cases()) {
    CAPTURE(label(cc));
    CHECK(fast::unfolds_by_shifting(cc.xs, cc.c) == (cc.c.stride == 1 && 2 * cc.c.padding == cc.c.kernel - 1));
    if (!fast::unfolds_by_shifting(cc.xs, cc.c)) {
      mgpu::Buffer<float> any(dev.d, 1);
      CHECK_THROWS_WITH_AS(fast::im2col_shifted_images(dev.d, any.data(), cc.xs, cc.c, 0, 1, any.data()),
                           doctest::Contains("im2col_shifted_images: needs stride 1"), mgpu::Error);
      continue;
    }
    ImageShape xs = cc.xs;
    xs.batch = 4;
    const auto x = testing::on_device(dev.d, testing::random_floats(xs.size(), rng));
    const ImageShape zs = nn::conv_output_shape(xs, cc.c);
    const std::int64_t per_image = std::int64_t(cc.c.in_channels) * cc.c.kernel * cc.c.kernel * zs.height * zs.width;
    for (int first = 0; first < xs.batch; ++first)
      for (int count = 1; first + count <= xs.batch; ++count) {
        CAPTURE(first);
        CAPTURE(count);
        auto want = testing::poisoned(dev.d, per_image * count), got = testing::poisoned(dev.d, per_image * count);
        nn::im2col_images(dev.d, x.data(), xs, cc.c, first, count, want.data());
        fast::im2col_shifted_images(dev.d, x.data(), xs, cc.c, first, count, got.data());
        check_bitwise(got.download(), want.download(), "im2col_shifted_images " + label(cc));
        ++compared;
      }
    mgpu::Buffer<float> any(dev.d, 1);
    CHECK_THROWS_WITH_AS(fast::im2col_shifted_images(dev.d, any.data(), xs, cc.c, 3, 2, any.data()),
                         doctest::Contains("im2col_shifted_images: images 3..4 of a batch of 4"), mgpu::Error);
  }
  CHECK(compared == 12 * 10);  // twelve convolutions qualify, ten slices of four images each
}

TEST_CASE("tiled convolution: forward and backward equal chapter 09's conv2d_forward and conv2d_backward") {
  Device1 dev;
  mgpu::Rng rng(1210);
  const int most_lanes = mgpu::lanes_per_device(dev.d);
  for (ConvCase cc : conv_cases()) {
    for (const int batch : {1, 3, 5}) {
      cc.xs.batch = batch;
      const ImageShape zs = nn::conv_output_shape(cc.xs, cc.c);
      const std::int64_t K = std::int64_t(cc.c.in_channels) * cc.c.kernel * cc.c.kernel;
      const std::int64_t per_image = K * zs.height * zs.width;
      const auto x = testing::on_device(dev.d, testing::random_floats(cc.xs.size(), rng));
      const auto W = testing::on_device(dev.d, testing::random_floats(std::size_t(cc.c.out_channels) * K, rng));
      const auto b = testing::on_device(dev.d, testing::random_floats(cc.c.out_channels, rng));
      const auto dz = testing::on_device(dev.d, testing::random_floats(zs.size(), rng));
      const std::vector<float> dW0 = testing::random_floats(std::size_t(cc.c.out_channels) * K, rng),
                               db0 = testing::random_floats(cc.c.out_channels, rng);
      mgpu::Buffer<float> ones(dev.d, std::size_t(zs.batch) * zs.height * zs.width);
      mgpu::fill(dev.d, ones.data(), std::int64_t(ones.size()), 1.0f);
      // The reference: chapter 09's whole-batch im2col and GEMMs (dW and db accumulate into dW0, db0).
      const std::int64_t col_size = nn::conv_col_size(cc.xs, cc.c);
      mgpu::Buffer<float> col(dev.d, col_size), dcol(dev.d, col_size), z_ref = testing::poisoned(dev.d, zs.size()),
          dx_ref = testing::poisoned(dev.d, cc.xs.size());
      auto dW_ref = testing::on_device(dev.d, dW0), db_ref = testing::on_device(dev.d, db0);
      nn::conv2d_forward(dev.d, x.data(), cc.xs, cc.c, W.data(), b.data(), col.data(), z_ref.data());
      nn::conv2d_backward(dev.d, dz.data(), x.data(), cc.xs, cc.c, W.data(), ones.data(), col.data(), dcol.data(),
                          dW_ref.data(), db_ref.data(), dx_ref.data());
      const std::vector<float> z_want = z_ref.download(), dx_want = dx_ref.download(), dW_want = dW_ref.download(),
                               db_want = db_ref.download();
      REQUIRE(testing::has_nonzero(dx_want));
      // One image a tile, two, and the whole batch in one; one lane and every lane.
      for (const std::int64_t tile : {std::int64_t(1), 2 * per_image, std::int64_t(1) << 40})
        for (const int lanes : {1, most_lanes}) {
          const fast::TilePlan plan = fast::plan_tiles(lanes, cc.xs, cc.c, tile, 1);
          CAPTURE(label(cc));
          CAPTURE(batch);
          CAPTURE(plan.images);
          CAPTURE(plan.lanes);
          mgpu::Buffer<float> scratch = testing::poisoned(dev.d, plan.scratch_floats());
          mgpu::Buffer<float> z = testing::poisoned(dev.d, zs.size()), dx = testing::poisoned(dev.d, cc.xs.size());
          auto dW = testing::on_device(dev.d, dW0), db = testing::on_device(dev.d, db0);
          const nn::ConvScratch s{scratch.data(), plan.scratch_floats()};
          fast::tiled_conv_forward(dev.d, plan, x.data(), cc.xs, cc.c, W.data(), b.data(), s, z.data());
          fast::tiled_conv_backward(dev.d, plan, dz.data(), x.data(), cc.xs, cc.c, W.data(), ones.data(), s,
                                    dW.data(), db.data(), dx.data());
          // Sums of up to a few hundred products: the tiles add dW's in another order, and dx
          // (stride 1, same size) is the flipped convolution's sum, in its order.
          testing::check_close(z.download(), ref::to_double(z_want), 1e-5, "z");
          testing::check_close(dx.download(), ref::to_double(dx_want), 1e-5, "dx");
          testing::check_close(dW.download(), ref::to_double(dW_want), 1e-5, "dW (added to what it held)");
          testing::check_close(db.download(), ref::to_double(db_want), 1e-5, "db (added to what it held)");
          // Without dx: the parameter gradients only, dx untouched.
          mgpu::Buffer<float> untouched = testing::poisoned(dev.d, cc.xs.size());
          const std::vector<float> poison = untouched.download();
          auto dW2 = testing::on_device(dev.d, dW0), db2 = testing::on_device(dev.d, db0);
          fast::tiled_conv_backward(dev.d, plan, dz.data(), x.data(), cc.xs, cc.c, W.data(), ones.data(), s,
                                    dW2.data(), db2.data(), nullptr);
          testing::check_close(dW2.download(), ref::to_double(dW_want), 1e-5, "dW without dx");
          testing::check_equal(untouched.download(), poison, "a dx nobody asked for");
        }
    }
  }
}

TEST_CASE("tiled convolution: scratch smaller than the plan, and a plan for another convolution, are refused") {
  Device1 dev;
  const ImageShape xs{3, 4, 7, 5};
  const ConvShape c{3, 4, 3, 1, 1};
  const fast::TilePlan plan = fast::plan_tiles(1, xs, c, 1, 1);
  mgpu::Buffer<float> big(dev.d, 4096);
  const nn::ConvScratch short_scratch{big.data(), plan.scratch_floats() - 1};
  CHECK_THROWS_WITH_AS(fast::tiled_conv_forward(dev.d, plan, big.data(), xs, c, big.data(), big.data(), short_scratch,
                                                big.data()),
                       doctest::Contains("tiled_conv_forward: scratch of"), mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::tiled_conv_backward(dev.d, plan, big.data(), big.data(), xs, c, big.data(), big.data(),
                                                 short_scratch, big.data(), big.data(), big.data()),
                       doctest::Contains("tiled_conv_backward: scratch of"), mgpu::Error);
  const fast::TilePlan other = fast::plan_tiles(1, {3, 4, 9, 9}, c, 1, 1);  // made for a larger image
  const nn::ConvScratch enough{big.data(), 4096};
  CHECK_THROWS_WITH_AS(fast::tiled_conv_forward(dev.d, other, big.data(), xs, c, big.data(), big.data(), enough,
                                                big.data()),
                       doctest::Contains("is not one for this convolution on this device"), mgpu::Error);
  fast::TilePlan too_many_lanes = plan;
  too_many_lanes.lanes = mgpu::lanes_per_device(dev.d) + 1;
  CHECK_THROWS_WITH_AS(fast::tiled_conv_forward(dev.d, too_many_lanes, big.data(), xs, c, big.data(), big.data(),
                                                enough, big.data()),
                       doctest::Contains("is not one for this convolution on this device"), mgpu::Error);
  mgpu::synchronize(dev.d);
}

// ---------------------------------------------------------------- the blocked sums (CPU)
// chapters/10_fast_kernels/blocked_sums.h: the tiled table's BatchNorm sums, a block of kBlock
// values at a time in kLanes partial sums, and the statistics in one read (Chan's merge of the
// blocks). Rows shorter than a block, of one block, one value either side of it, and of several
// blocks with a ragged end; then the hard case, values in [999, 1001), where E[z^2] - E[z]^2
// in float keeps no correct digit.

TEST_CASE("blocked sums: the tiled table's sums match chapter 09's within 1e-6 of their scale") {
  Device1 dev;
  mgpu::Rng rng(1212);
  const int C = 3;
  for (const std::int64_t n : {std::int64_t(1), std::int64_t(7), std::int64_t(fast::kBlock - 1),
                               std::int64_t(fast::kBlock), std::int64_t(fast::kBlock + 1),
                               std::int64_t(3 * fast::kBlock + 5), std::int64_t(12544)}) {
    CAPTURE(n);
    const TermSumsCase t(C, n, rng);
    const std::vector<std::vector<float>> want = term_sums_reference(dev.d, t);
    const auto z = testing::on_device(dev.d, t.z), dy = testing::on_device(dev.d, t.dy),
               stats = testing::on_device(dev.d, t.stats);
    auto dgamma = testing::on_device(dev.d, t.dgamma), dbeta = testing::on_device(dev.d, t.dbeta);
    // The two passes (SyncBN's): sum z, then the squares about sums[0] / n.
    auto passes = testing::poisoned(dev.d, 2 * C), moments = testing::poisoned(dev.d, 2 * C),
         back = testing::poisoned(dev.d, 2 * C);
    fast::batch_norm_sums_blocked(dev.d, z.data(), C, n, passes.data());
    fast::batch_norm_square_sums_blocked(dev.d, z.data(), C, n, double(n), passes.data());
    fast::batch_norm_moments_blocked(dev.d, z.data(), C, n, moments.data());
    fast::batch_norm_backward_sums_blocked(dev.d, dy.data(), z.data(), C, n, stats.data(), back.data(),
                                           dgamma.data(), dbeta.data());
    const std::vector<float> p = passes.download(), m = moments.download(), b = back.download();
    for (int c = 0; c < C; ++c) {
      CAPTURE(c);
      double mass = 0;
      for (std::int64_t j = 0; j < n; ++j) mass += std::abs(t.z[c * n + j]);
      CHECK(std::abs(double(p[c]) - t.sums0[c]) <= 1e-7 * mass);  // sum z, both ways
      CHECK(std::abs(double(m[c]) - t.sums0[c]) <= 1e-7 * mass);
    }
    const auto half = [&](const std::vector<float>& v, int h) {
      return std::vector<float>(v.begin() + h * C, v.begin() + (h + 1) * C);
    };
    check_term_sums({half(p, 1), half(b, 0), half(b, 1), dgamma.download(), dbeta.download()}, want, t,
                    "two passes, backward sums");
    check_term_sums({half(m, 1), want[1], want[2], want[3], want[4]}, want, t, "moments in one read");
  }
  mgpu::Buffer<float> any(dev.d, 2 * C);
  CHECK_THROWS_WITH_AS(fast::batch_norm_moments_blocked(dev.d, any.data(), C, 0, any.data()),
                       doctest::Contains("batch_norm_moments_blocked: no values to normalize over"), mgpu::Error);
  CHECK_THROWS_WITH_AS(fast::batch_norm_square_sums_blocked(dev.d, any.data(), C, 1, 0.0, any.data()),
                       doctest::Contains("no values to normalize over"), mgpu::Error);
}

TEST_CASE("blocked sums: the statistics in one read keep their digits far from zero (values in [999, 1001))") {
  Device1 dev;
  mgpu::Rng rng(1213);
  const int C = 2;
  const std::int64_t n = 300001;  // 146 blocks and a ragged end
  const std::vector<float> z = testing::random_floats(std::size_t(C) * n, rng, 999.0, 1001.0);
  const auto z_d = testing::on_device(dev.d, z);
  auto sums = testing::poisoned(dev.d, 2 * C);
  fast::batch_norm_moments_blocked(dev.d, z_d.data(), C, n, sums.data());
  const std::vector<float> got = sums.download();
  for (int c = 0; c < C; ++c) {
    CAPTURE(c);
    double mean = 0, m2 = 0;  // two passes in double: the exact answer to ~1e-12
    for (std::int64_t j = 0; j < n; ++j) mean += z[c * n + j];
    mean /= double(n);
    for (std::int64_t j = 0; j < n; ++j) m2 += (z[c * n + j] - mean) * (z[c * n + j] - mean);
    CHECK(std::abs(double(got[C + c]) - m2) <= 1e-6 * m2);  // about n/3: a variance of 1/3
    CHECK(std::abs(double(got[c]) - mean * double(n)) <= 1e-7 * mean * double(n));
  }
}
