// The ResNet layers, in the order of layers.h. As in chapter 01, each kernel is a functor run by
// mgpu::for_each_index (one call per item) or mgpu::for_each_span (one call per block of contiguous
// output, cut into single elements on a GPU and kept whole on a CPU); the comment above each says
// what its items are. Each functor sits directly above the function that launches it, in an
// unnamed namespace that keeps it private to this file. What several functions share comes before
// them: the helpers at the top, the machinery of the per-channel sums at the head of their section.
#include "layers.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <string>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/gemm.h"
#include "common/parallel.h"

namespace nn {
namespace {

using mgpu::for_each_index;
using mgpu::for_each_row_segment;
using mgpu::for_each_span;
using mgpu::gemm;
using mgpu::Transpose;
using i64 = std::int64_t;
constexpr double kF = sizeof(float);  // bytes per element, for the profile's GB/s

// THE per-backend choice of this file: how many slices a channel's sum is cut into (see
// layers.h, "per-channel sums"). A GPU needs tens of thousands of threads in flight, and a layer
// has 64 to 512 channels: 128 slices each gives 8,192 to 65,536 threads, each reading a float
// 128 apart from its previous one and next to its neighbour thread's. A CPU core is fastest
// walking one channel's row in order, so there each channel is one slice. (kGpuMapping: the
// GPU's choice, also in a cpu build made to test it; common/backend.h.)
constexpr int kSlices = mgpu::kGpuMapping ? 128 : 1;

MGPU_HD inline int ceil_div(int a, int b) { return (a + b - 1) / b; }  // for a >= 0, b > 0

// A row of n values is walked with int indices by for_each_span.
int row_length(i64 n, const char* call) {
  if (n < 0 || n > 0x7fffffff) throw mgpu::Error(std::string(call) + ": a channel of " + std::to_string(n) + " values");
  return static_cast<int>(n);
}

}  // namespace

// --- convolution: kernel k x k, stride s, zero padding p on every side

int conv_output_size(int in, int kernel, int stride, int padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

ImageShape conv_output_shape(ImageShape xs, ConvShape c) {
  return {c.out_channels, xs.batch, conv_output_size(xs.height, c.kernel, c.stride, c.padding),
          conv_output_size(xs.width, c.kernel, c.stride, c.padding)};
}

void check_channels(ImageShape xs, ConvShape c, const char* call) {
  if (xs.channels != c.in_channels)
    throw mgpu::Error(std::string(call) + ": the input has " + std::to_string(xs.channels) +
                      " channels, the convolution expects " + std::to_string(c.in_channels));
}

namespace {
// Item: one (row r = (c, ky, kx), image j) pair of col, a block of Ho*Wo contiguous outputs:
// col[r][j][oy][ox] = x[c][first + j][oy*s + ky - p][ox*s + kx - p], 0 in the padding, for the
// `count` images j of the slice (the whole batch: first = 0, count = B).
struct Im2col {
  const float* x;
  float* col;
  int B, first, count, H, W, k, s, p, Ho, Wo;
  MGPU_HD void operator()(i64 item, int begin, int end) const {
    const int r = int(item / count), j = int(item % count);
    const int c = r / (k * k), ky = r / k % k, kx = r % k;
    const float* plane = x + (i64(c) * B + first + j) * H * W;  // = &x[c][first + j][0][0]
    float* dst = col + item * Ho * Wo;                          // = &col[r][j][0][0]
    // Output columns ox whose input column ox*s + kx - p lies inside the image: [lo, hi).
    const int lo = p > kx ? ceil_div(p - kx, s) : 0;
    const int hi_raw = W - 1 + p - kx >= 0 ? (W - 1 + p - kx) / s + 1 : 0;
    const int hi = hi_raw < Wo ? hi_raw : Wo;
    for_each_row_segment(begin, end, Wo, [&](int oy, int x0, int x1) {
      float* out = dst + oy * Wo;
      const int y = oy * s + ky - p;
      if (y < 0 || y >= H) {  // a padding row
        for (int ox = x0; ox < x1; ++ox) out[ox] = 0.0f;
        return;
      }
      const float* in = plane + y * W;  // in[ox*s + kx - p] = x[c][b][y][ox*s + kx - p], for lo <= ox < hi
      // Three plain loops (padding, image, padding) rather than one with a choice per element:
      // the middle one is a copy the compiler vectorizes (a contiguous one when s == 1).
      const int a = x0 > lo ? x0 : lo, e = x1 < hi ? x1 : hi;
      for (int ox = x0; ox < (a < x1 ? a : x1); ++ox) out[ox] = 0.0f;
      for (int ox = a; ox < e; ++ox) out[ox] = in[ox * s + kx - p];
      for (int ox = (e > a ? e : a); ox < x1; ++ox) out[ox] = 0.0f;
    });
  }
};
}  // namespace

void check_slice(ImageShape xs, int first, int count, const char* call) {
  if (first < 0 || count < 0 || first > xs.batch - count)
    throw mgpu::Error(std::string(call) + ": images " + std::to_string(first) + ".." +
                      std::to_string(i64(first) + count - 1) + " of a batch of " + std::to_string(xs.batch));
}

void im2col_images(const Device& d, const float* x, ImageShape xs, ConvShape c, int first, int count, float* col) {
  check_channels(xs, c, "im2col");
  check_slice(xs, first, count, "im2col");
  const ImageShape zs = conv_output_shape(xs, c);
  const i64 items = i64(c.in_channels) * c.kernel * c.kernel * count;
  for_each_span(d, items, zs.height * zs.width,
                Im2col{x, col, xs.batch, first, count, xs.height, xs.width, c.kernel, c.stride, c.padding, zs.height,
                       zs.width},
                2.0 * kF * items * zs.height * zs.width);
}

void im2col(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col) {
  im2col_images(d, x, xs, c, 0, xs.batch, col);
}

namespace {
// Item: one image plane (c, first + j) of dx, H*W outputs, each the gather of the col entries
// that copied it: pixel (y, x) was copied into window (ky, kx) at output (oy, ox) wherever
// y = oy*s + ky - p and x = ox*s + kx - p for some oy < Ho, ox < Wo. Every output has one owner,
// so no atomics are needed; every pixel adds its terms in the order (ky, kx) ascending, whichever
// mapping for_each_span chose, so both backends give the same bits. col holds the `count`
// images j of the slice (Im2col's layout).
struct Col2im {
  const float* col;
  float* dx;
  int B, first, count, H, W, k, s, p, Ho, Wo;
  MGPU_HD void operator()(i64 item, int begin, int end) const {
    const i64 c = item / count, j = item % count;
    float* plane = dx + (c * B + first + j) * H * W;  // = &dx[c][first + j][0][0]
    for_each_row_segment(begin, end, W, [&](int y, int x0, int x1) {
      float* out = plane + y * W;
      for (int x = x0; x < x1; ++x) out[x] = 0.0f;
      for (int ky = 0; ky < k; ++ky) {
        const int oy_s = y + p - ky;  // oy * s, if this window row saw pixel row y
        if (oy_s < 0 || oy_s % s != 0 || oy_s / s >= Ho) continue;
        for (int kx = 0; kx < k; ++kx) {
          const float* row = col + ((((c * k + ky) * k + kx) * count + j) * Ho + oy_s / s) * Wo;  // = &col[r][j][oy][0]
          // The window columns ox whose pixel x = ox*s + kx - p lies in [x0, x1): [lo, hi).
          const int lo = x0 + p - kx > 0 ? ceil_div(x0 + p - kx, s) : 0;
          const int hi_raw = x1 + p - kx > 0 ? ceil_div(x1 + p - kx, s) : 0;
          const int hi = hi_raw < Wo ? hi_raw : Wo;
          for (int ox = lo; ox < hi; ++ox) out[ox * s + kx - p] += row[ox];
        }
      }
    });
  }
};
}  // namespace

void col2im_images(const Device& d, const float* col, ImageShape xs, ConvShape c, int first, int count, float* dx) {
  check_channels(xs, c, "col2im");
  check_slice(xs, first, count, "col2im");
  const ImageShape zs = conv_output_shape(xs, c);
  const i64 planes = i64(xs.channels) * count;
  const double slice_values = double(planes) * xs.height * xs.width;
  for_each_span(d, planes, xs.height * xs.width,
                Col2im{col, dx, xs.batch, first, count, xs.height, xs.width, c.kernel, c.stride, c.padding, zs.height,
                       zs.width},
                kF * (double(c.kernel) * c.kernel * zs.height * zs.width * planes + slice_values));
}

void col2im(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx) {
  col2im_images(d, col, xs, c, 0, xs.batch, dx);
}

void conv2d_forward(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                    float* col, float* z, const LayerKernels& layout) {
  const ImageShape zs = conv_output_shape(xs, c);
  const int P = zs.batch * zs.height * zs.width;        // output pixels, all images
  const int K = c.in_channels * c.kernel * c.kernel;  // inputs per output pixel
  layout.im2col(d, x, xs, c, col);
  // z = W col               [Cout x P] = [Cout x K][K x P]
  gemm(d, Transpose::No, Transpose::No, c.out_channels, P, K, 1.0f, W, col, 0.0f, z);
  // z += b, broadcast along each channel's row of P pixels
  lenet::bias_activation(d, z, b, c.out_channels, P, lenet::Activation::None);
}

void conv2d_backward(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c, const float* W,
                     const float* ones, float* col, float* dcol, float* dW, float* db, float* dx,
                     const LayerKernels& layout) {
  const ImageShape zs = conv_output_shape(xs, c);
  const int P = zs.batch * zs.height * zs.width;
  const int K = c.in_channels * c.kernel * c.kernel;
  layout.im2col(d, x, xs, c, col);  // the forward pass's col, unfolded again
  // chapter 1's three products: dW += dz col^T, db += dz ones, dcol = W^T dz
  lenet::conv2d_backward_products(d, dz, col, W, ones, c.out_channels, K, P, dW, db, dx ? dcol : nullptr);
  if (dx) layout.col2im(d, dcol, xs, c, dx);  // every window folded back
}

std::int64_t conv_col_size(ImageShape xs, ConvShape c) {
  const ImageShape zs = conv_output_shape(xs, c);
  return i64(c.in_channels) * c.kernel * c.kernel * zs.batch * zs.height * zs.width;
}

// --- per-channel sums: the reduction BatchNorm is made of

int reduction_slices() { return kSlices; }

namespace {
int most_partials_per_channel() {
  int most = 0;
  for (const LayerKernels* k : registered_layer_kernels()) most = std::max(most, k->sum_partials_per_channel());
  return most;
}
}  // namespace

ReductionScratch::ReductionScratch(const Device& d, int max_channels)
    : max_channels(max_channels),
      per_channel(most_partials_per_channel()),
      partials(d, std::size_t(2) * max_channels * per_channel) {}

double* ReductionScratch::partials_for(int channels, int wanted_per_channel, const char* call) {
  if (channels > max_channels)
    throw mgpu::Error(std::string(call) + ": " + std::to_string(channels) + " channels, scratch for " +
                      std::to_string(max_channels));
  if (wanted_per_channel > per_channel)
    throw mgpu::Error(std::string(call) + ": " + std::to_string(wanted_per_channel) +
                      " partial sums per channel, scratch for " + std::to_string(per_channel));
  return partials.data();
}

namespace {
// Two sums carried together (BatchNorm needs two per channel, in both directions).
struct TwoSums {
  double first = 0, second = 0;
};

// Item: one slice (c, s) of a channel's row of n values: partials[0][c][s] and partials[1][c][s]
// are the sums of term(c, j) over j = s, s + kSlices, s + 2 kSlices, ... < n.
template <class Term>
struct SliceSums {
  Term term;
  double* partials;  // [2][channels][kSlices]
  int channels;
  i64 n;
  MGPU_HD void operator()(i64 item) const {
    const i64 c = item / kSlices;
    TwoSums t;
    for (i64 j = item % kSlices; j < n; j += kSlices) {
      const TwoSums v = term(c, c * n + j);
      t.first += v.first, t.second += v.second;
    }
    partials[item] = t.first;
    partials[i64(channels) * kSlices + item] = t.second;
  }
};

// Item: one channel c: adds up its kSlices partials of each sum. Where the sums go: first into
// first[c], second (when wanted) into second[c]; with dgamma and dbeta (backward), they are also
// added into the parameter gradients.
struct FinishSums {
  const double* partials;
  float* first;
  float* second;  // may be null
  float* dgamma;  // may be null
  float* dbeta;   // may be null
  int channels;
  MGPU_HD void operator()(i64 c) const {
    double a = 0, b = 0;
    for (int s = 0; s < kSlices; ++s)
      a += partials[c * kSlices + s], b += partials[(i64(channels) + c) * kSlices + s];
    first[c] = float(a);
    if (second) second[c] = float(b);
    if (dbeta) dbeta[c] += float(a);
    if (dgamma) dgamma[c] += float(b);
  }
};

template <class Term>
void channel_sums(const Device& d, int channels, i64 n, Term term, ReductionScratch& scratch, float* first,
                  float* second, float* dgamma, float* dbeta, double bytes) {
  double* partials = scratch.partials_for(channels, kSlices, "channel_sums");
  for_each_index(d, i64(channels) * kSlices, SliceSums<Term>{term, partials, channels, n}, bytes);
  for_each_index(d, channels, FinishSums{partials, first, second, dgamma, dbeta, channels});
}
}  // namespace

// --- BatchNorm

namespace {
// The terms of BatchNorm's sums (this one, CenteredSquare and GradAndGradXhat below), each summed
// by channel_sums; item i is element i of z's [C][n] values. The forward pass's two passes use one
// sum each (`second` stays 0).
struct Value {  // pass 1: z
  const float* z;
  MGPU_HD TwoSums operator()(i64, i64 i) const { return {z[i], 0.0}; }
};
}  // namespace

void batch_norm_sums(const Device& d, const float* z, int channels, i64 n, ReductionScratch& scratch, float* sums) {
  channel_sums(d, channels, n, Value{z}, scratch, sums, nullptr, nullptr, nullptr, kF * channels * n);
}

namespace {
struct CenteredSquare {  // pass 2: (z - mean)^2, mean = sum / count
  const float* z;
  const float* sums;  // [0][C]: sum z
  double count;
  MGPU_HD TwoSums operator()(i64 c, i64 i) const {
    const double centered = z[i] - sums[c] / count;
    return {centered * centered, 0.0};
  }
};
}  // namespace

void batch_norm_square_sums(const Device& d, const float* z, int channels, i64 n, double count,
                            ReductionScratch& scratch, float* sums) {
  if (!(count >= 1)) throw mgpu::Error("batch_norm_square_sums: no values to normalize over");
  channel_sums(d, channels, n, CenteredSquare{z, sums, count}, scratch, sums + channels, nullptr, nullptr, nullptr,
               kF * channels * n);
}

namespace {
// Item: one channel c: its batch statistics from the sums, and one step of its running ones.
struct Statistics {
  const float* sums;  // [2][C]: sum z, sum (z - mean)^2 over `count` values
  double count;
  float eps, momentum;
  float* running_mean;
  float* running_var;
  float* stats;  // [2][C]: mean, inv_std
  int channels;
  MGPU_HD void operator()(i64 c) const {
    const double mean = sums[c] / count;
    const double var = sums[channels + c] / count;  // biased: what the batch is normalized by
    stats[c] = float(mean);
    stats[channels + c] = float(1.0 / sqrt(var + eps));
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    running_mean[c] = float((1 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = float((1 - momentum) * running_var[c] + momentum * unbiased);
  }
};
}  // namespace

void batch_norm_statistics(const Device& d, const float* sums, double count, int channels, float eps, float momentum,
                           float* running_mean, float* running_var, float* stats) {
  if (!(count >= 1)) throw mgpu::Error("batch_norm_statistics: no values to normalize over");
  for_each_index(d, channels, Statistics{sums, count, eps, momentum, running_mean, running_var, stats, channels});
}

namespace {
struct InferenceStatistics {  // item: one channel c
  const float* running_mean;
  const float* running_var;
  float eps;
  float* stats;
  int channels;
  MGPU_HD void operator()(i64 c) const {
    stats[c] = running_mean[c];
    stats[channels + c] = float(1.0 / sqrt(double(running_var[c]) + eps));
  }
};
}  // namespace

void batch_norm_inference_statistics(const Device& d, const float* running_mean, const float* running_var,
                                     int channels, float eps, float* stats) {
  for_each_index(d, channels, InferenceStatistics{running_mean, running_var, eps, stats, channels});
}

namespace {
// Item: one channel c's row of n outputs: y = act(gamma (z - mean) inv_std + beta + residual).
struct BatchNormApply {
  const float* z;
  const float* stats;
  const float* gamma;
  const float* beta;
  const float* residual;  // may be null
  float* y;
  i64 n;
  int channels;
  bool relu;
  MGPU_HD void operator()(i64 c, int begin, int end) const {
    const float mean = stats[c], scale = gamma[c] * stats[channels + c], shift = beta[c];
    const float* zr = z + c * n;
    float* yr = y + c * n;
    const float* rr = residual ? residual + c * n : nullptr;
    for (int j = begin; j < end; ++j) {
      float v = (zr[j] - mean) * scale + shift;
      if (rr) v += rr[j];
      yr[j] = relu && v < 0 ? 0.0f : v;
    }
  }
};
}  // namespace

void batch_norm_apply(const Device& d, const float* z, int channels, i64 n, const float* stats, const float* gamma,
                      const float* beta, const float* residual, lenet::Activation act, float* y) {
  for_each_span(d, channels, row_length(n, "batch_norm_apply"),
                BatchNormApply{z, stats, gamma, beta, residual, y, n, channels, act == lenet::Activation::Relu},
                kF * channels * n * (residual ? 3.0 : 2.0));
}

namespace {
struct GradAndGradXhat {  // backward: (dy, dy * xhat), xhat = (z - mean) * inv_std recomputed
  const float* dy;
  const float* z;
  const float* stats;  // [2][C]: mean, inv_std
  int channels;
  MGPU_HD TwoSums operator()(i64 c, i64 i) const {
    const float xhat = (z[i] - stats[c]) * stats[channels + c];
    return {dy[i], double(dy[i]) * xhat};
  }
};
}  // namespace

void batch_norm_backward_sums(const Device& d, const float* dy, const float* z, int channels, i64 n,
                              const float* stats, ReductionScratch& scratch, float* sums, float* dgamma, float* dbeta) {
  channel_sums(d, channels, n, GradAndGradXhat{dy, z, stats, channels}, scratch, sums, sums + channels, dgamma, dbeta,
               2.0 * kF * channels * n);
}

namespace {
// Item: one channel c's row of n outputs: BatchNorm's input gradient (layers.h, step 3).
struct BatchNormBackwardInput {
  const float* dy;
  const float* z;
  const float* stats;
  const float* gamma;
  const float* sums;  // [2][C]: sum dy, sum dy * xhat, over `count` values
  float* dz;
  i64 n;
  int channels;
  float count;
  MGPU_HD void operator()(i64 c, int begin, int end) const {
    // BEGIN EXERCISE ex09.batch_norm_backward
    const float mean = stats[c], inv_std = stats[channels + c];
    const float mean_dy = sums[c] / count, mean_dy_xhat = sums[channels + c] / count;
    const float k = gamma[c] * inv_std;
    const float* dyr = dy + c * n;
    const float* zr = z + c * n;
    float* dzr = dz + c * n;
    for (int j = begin; j < end; ++j) {
      const float xhat = (zr[j] - mean) * inv_std;
      dzr[j] = k * (dyr[j] - mean_dy - xhat * mean_dy_xhat);
    }
    // END EXERCISE ex09.batch_norm_backward
  }
};
}  // namespace

void batch_norm_backward_input(const Device& d, const float* dy, const float* z, int channels, i64 n,
                               const float* stats, const float* gamma, const float* sums, double count, float* dz) {
  for_each_span(d, channels, row_length(n, "batch_norm_backward_input"),
                BatchNormBackwardInput{dy, z, stats, gamma, sums, dz, n, channels, float(count)},
                3.0 * kF * channels * n);
}

// --- global average pooling

namespace {
// Item: one plane (c, b): y[c][b] = the mean of its S values.
struct GlobalAvgPool {
  const float* x;
  float* y;
  int S;
  MGPU_HD void operator()(i64 plane) const {
    float sum = 0;
    for (int i = 0; i < S; ++i) sum += x[plane * S + i];
    y[plane] = sum / S;
  }
};
}  // namespace

void global_avg_pool_forward(const Device& d, const float* x, ImageShape xs, float* y) {
  const i64 planes = i64(xs.channels) * xs.batch;
  for_each_index(d, planes, GlobalAvgPool{x, y, xs.height * xs.width}, kF * (xs.size() + planes));
}

namespace {
// Item: one plane (c, b) of dx, S outputs: each gets dy[c][b] / S.
struct GlobalAvgPoolBackward {
  const float* dy;
  float* dx;
  int S;
  MGPU_HD void operator()(i64 plane, int begin, int end) const {
    const float g = dy[plane] / S;
    for (int i = begin; i < end; ++i) dx[plane * S + i] = g;
  }
};
}  // namespace

void global_avg_pool_backward(const Device& d, const float* dy, ImageShape xs, float* dx) {
  const i64 planes = i64(xs.channels) * xs.batch;
  for_each_span(d, planes, xs.height * xs.width, GlobalAvgPoolBackward{dy, dx, xs.height * xs.width},
                kF * (xs.size() + planes));
}

// --- the table of layer kernels: this library's functions as the reference table, and the registry

std::int64_t LayerKernels::conv_scratch_floats(const Device&, ImageShape xs, ConvShape c) const {
  return 2 * conv_col_size(xs, c);  // col, then dcol
}

namespace {
// Throws mgpu::Error, naming `call`, unless the scratch holds what `kernels` asks for.
void check_scratch(const LayerKernels& kernels, const Device& d, ImageShape xs, ConvShape c, ConvScratch scratch,
                   const char* call) {
  const i64 needed = kernels.conv_scratch_floats(d, xs, c);
  if (scratch.floats < needed)
    throw mgpu::Error(std::string(call) + " (" + kernels.name() + "): scratch of " + std::to_string(scratch.floats) +
                      " floats, " + std::to_string(needed) + " needed");
}
}  // namespace

void LayerKernels::conv_forward(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W,
                                const float* b, ConvScratch scratch, float* z) const {
  check_scratch(*this, d, xs, c, scratch, "conv_forward");
  conv2d_forward(d, x, xs, c, W, b, scratch.data, z, *this);
}

void LayerKernels::conv_backward(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c,
                                 const float* W, const float* ones, ConvScratch scratch, float* dW, float* db,
                                 float* dx) const {
  check_scratch(*this, d, xs, c, scratch, "conv_backward");
  const i64 col = conv_col_size(xs, c);
  conv2d_backward(d, dz, x, xs, c, W, ones, scratch.data, scratch.data + col, dW, db, dx, *this);
}

void LayerKernels::im2col(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col) const {
  nn::im2col(d, x, xs, c, col);
}

void LayerKernels::col2im(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx) const {
  nn::col2im(d, col, xs, c, dx);
}

int LayerKernels::sum_partials_per_channel() const { return kSlices; }

void LayerKernels::batch_norm_sums(const Device& d, const float* z, int channels, i64 n, ReductionScratch& scratch,
                                   float* sums) const {
  nn::batch_norm_sums(d, z, channels, n, scratch, sums);
}

void LayerKernels::batch_norm_square_sums(const Device& d, const float* z, int channels, i64 n, double count,
                                          ReductionScratch& scratch, float* sums) const {
  nn::batch_norm_square_sums(d, z, channels, n, count, scratch, sums);
}

void LayerKernels::batch_norm_moments(const Device& d, const float* z, int channels, i64 n, ReductionScratch& scratch,
                                      float* sums) const {
  // This table's own two passes (a table that overrides only those gets them here too).
  batch_norm_sums(d, z, channels, n, scratch, sums);
  batch_norm_square_sums(d, z, channels, n, double(n), scratch, sums);
}

void LayerKernels::batch_norm_apply(const Device& d, const float* z, int channels, i64 n, const float* stats,
                                    const float* gamma, const float* beta, const float* residual,
                                    lenet::Activation act, float* y) const {
  nn::batch_norm_apply(d, z, channels, n, stats, gamma, beta, residual, act, y);
}

void LayerKernels::batch_norm_backward_sums(const Device& d, const float* dy, const float* z, int channels, i64 n,
                                            const float* stats, ReductionScratch& scratch, float* sums,
                                            float* dgamma, float* dbeta) const {
  nn::batch_norm_backward_sums(d, dy, z, channels, n, stats, scratch, sums, dgamma, dbeta);
}

void LayerKernels::batch_norm_backward_input(const Device& d, const float* dy, const float* z, int channels, i64 n,
                                             const float* stats, const float* gamma, const float* sums, double count,
                                             float* dz) const {
  nn::batch_norm_backward_input(d, dy, z, channels, n, stats, gamma, sums, count, dz);
}

namespace {
// The registry: made on first use (tables register from other files' static objects, whose
// order of construction C++ leaves open), guarded because a table may register from any thread.
struct Registry {
  std::mutex mutex;
  std::vector<const LayerKernels*> tables;
  std::atomic<const LayerKernels*> chosen{nullptr};  // the program's choice; read by the devices' threads
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

const LayerKernels& reference_kernels() {
  static const LayerKernels reference;
  return reference;
}

void register_layer_kernels(const LayerKernels& k) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (std::string(k.name()) == reference_kernels().name())
    throw mgpu::Error(std::string("register_layer_kernels: the name '") + k.name() + "' is the reference's");
  for (const LayerKernels* t : r.tables)
    if (std::string(t->name()) == k.name())
      throw mgpu::Error(std::string("register_layer_kernels: a table named '") + k.name() + "' is registered already");
  r.tables.push_back(&k);
}

std::vector<const LayerKernels*> registered_layer_kernels() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const LayerKernels*> all{&reference_kernels()};
  all.insert(all.end(), r.tables.begin(), r.tables.end());
  return all;
}

const LayerKernels* find_layer_kernels(const std::string& name) {
  for (const LayerKernels* k : registered_layer_kernels())
    if (name == k->name()) return k;
  return nullptr;
}

const LayerKernels& default_layer_kernels() {
  for (const LayerKernels* k : registered_layer_kernels())
    if (k->preferred_in_this_build()) return *k;
  return reference_kernels();
}

void use_layer_kernels(const LayerKernels& k) { registry().chosen.store(&k, std::memory_order_relaxed); }

const LayerKernels& layer_kernels() {
  const LayerKernels* k = registry().chosen.load(std::memory_order_relaxed);
  return k ? *k : reference_kernels();
}

}  // namespace nn
