// LeNet's layers, in the order of layers.h. Each kernel is a functor run by mgpu::for_each_index
// (one call per element) or mgpu::for_each_span (one call per block of contiguous output, cut into
// single elements on a GPU and kept whole on a CPU); the comment above each says what its items are.
// Each functor sits directly above the function that launches it, so that the rule for one item
// and its launch (how many items, how many bytes) read together; the unnamed namespace around it
// keeps it private to this file. Only what several kernels share comes first.
#include "layers.h"

#include <cmath>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/gemm.h"
#include "common/parallel.h"

namespace lenet {
namespace {

using mgpu::for_each_index;
using mgpu::for_each_row_segment;
using mgpu::for_each_span;
using mgpu::gemm;
using mgpu::Transpose;
using i64 = std::int64_t;
constexpr double kF = sizeof(float);  // bytes per element, for the profile's GB/s

// The inner loops of the layout kernels are small functions over elements [x0, x1) of one row:
// zero_row, which two kernels use, is here; each of the others sits above its kernel. __restrict__ on
// a function's parameters promises the compiler that the arrays do not overlap, which is what lets
// it vectorize these loops on a CPU without checking for overlap at run time.
MGPU_HD inline void zero_row(float* __restrict__ out, int x0, int x1) {
  for (int x = x0; x < x1; ++x) out[x] = 0.0f;
}
// ReLU's backward for one unit (relu_backward's, and avgpool2_backward's with relu_output):
// dL/dz from dL/dh, given the unit's output h = max(z, 0).
MGPU_HD inline float relu_grad(float h, float dh) {
  // BEGIN EXERCISE ex01.relu_backward
  return h > 0 ? dh : 0.0f;  // the unit passed z on where z > 0, i.e. where h > 0
  // END EXERCISE ex01.relu_backward
}

}  // namespace

// The layout kernels below are for_each_span functors (common/parallel.h): f(item, begin,
// end) computes elements [begin, end) of the item's contiguous block of OUTPUT, each element
// written by its one owner (no atomics). A GPU runs them one element per thread, a CPU core
// one whole item at a time.

// --- convolution (valid padding, stride 1) through im2col + GEMM

namespace {
MGPU_HD inline void copy_row(const float* __restrict__ in, float* __restrict__ out, int x0, int x1) {
  for (int x = x0; x < x1; ++x) out[x] = in[x];
}

// Item: one (row r = (c, ky, kx), image b) pair of col, a block of Ho*Wo contiguous outputs:
// col[r][b][oy][ox] = x[c][b][oy + ky][ox + kx].
struct Im2col {
  const float* x;
  float* col;
  int B, H, W, k, Ho, Wo;
  MGPU_HD void operator()(i64 item, int begin, int end) const {
    // 32-bit divisions: several times cheaper than 64-bit ones on a CPU.
    const int r = int(item / B), b = int(item % B);
    const int c = r / (k * k), ky = r / k % k, kx = r % k;
    const float* src = x + ((i64(c) * B + b) * H + ky) * W + kx;  // = &x[c][b][ky][kx]
    float* dst = col + item * Ho * Wo;                            // = &col[r][b][0][0]
    for_each_row_segment(begin, end, Wo, [&](int oy, int x0, int x1) { copy_row(src + oy * W, dst + oy * Wo, x0, x1); });
  }
};
}  // namespace

void im2col(const Device& d, const float* x, ImageShape s, int k, float* col) {
  const int Ho = s.height - k + 1, Wo = s.width - k + 1;
  const i64 items = i64(s.channels) * k * k * s.batch;
  // bytes: each col element read once from x (give or take the cache) and written once
  for_each_span(d, items, Ho * Wo, Im2col{x, col, s.batch, s.height, s.width, k, Ho, Wo}, 2.0 * kF * items * Ho * Wo);
}

namespace {
MGPU_HD inline void add_row(const float* __restrict__ in, float* __restrict__ out, int x0, int x1) {
  for (int x = x0; x < x1; ++x) out[x] += in[x];
}

// Item: one image plane (c, b) of dx, H*W outputs. The adjoint of im2col: pixel (y, x) is the
// sum of the k*k col entries that copied it, those of the windows (ky, kx) with
// 0 <= y - ky < Ho and 0 <= x - kx < Wo. Each output has one owner, so no atomics are needed.
// The owner of a whole plane (a CPU core) adds the windows' col blocks in one after the other,
// streaming through col in order; the owner of one pixel (a GPU thread) gathers its k*k terms.
// Both add a pixel's terms in the same order, (ky, kx) ascending, so both give the same bits.
struct Col2im {
  const float* col;
  float* dx;
  int B, H, W, k, Ho, Wo;
  MGPU_HD void operator()(i64 item, int begin, int end) const {
    const i64 c = item / B, b = item % B;
    float* plane = dx + item * H * W;  // = &dx[c][b][0][0]
    if (begin == 0 && end == H * W) {  // the whole plane
      zero_row(plane, 0, H * W);
      for (int ky = 0; ky < k; ++ky)
        for (int kx = 0; kx < k; ++kx) {
          const float* block = col + (((c * k + ky) * k + kx) * B + b) * Ho * Wo;  // = &col[r][b][0][0]
          for (int oy = 0; oy < Ho; ++oy) add_row(block + oy * Wo, plane + (oy + ky) * W + kx, 0, Wo);
        }
      return;
    }
    for (int i = begin; i < end; ++i) {  // pixel by pixel
      const int y = i / W, x = i % W;
      float sum = 0.0f;
      for (int ky = 0; ky < k; ++ky)
        for (int kx = 0; kx < k; ++kx) {
          const int oy = y - ky, ox = x - kx;
          if (oy >= 0 && oy < Ho && ox >= 0 && ox < Wo) sum += col[((((c * k + ky) * k + kx) * B + b) * Ho + oy) * Wo + ox];
        }
      plane[i] = sum;
    }
  }
};
}  // namespace

void col2im(const Device& d, const float* col, ImageShape s, int k, float* dx) {
  const int Ho = s.height - k + 1, Wo = s.width - k + 1;
  const i64 planes = i64(s.channels) * s.batch;
  for_each_span(d, planes, s.height * s.width, Col2im{col, dx, s.batch, s.height, s.width, k, Ho, Wo},
                kF * planes * (double(k) * k * Ho * Wo + s.height * s.width));  // all of col read, dx written
}

namespace {
// Item: one output row r (a channel, or a dense layer's output unit), n outputs:
// z[r][j] = act(z[r][j] + b[r]). Adding the bias here instead of in a separate product
// (b ones^T) and applying ReLU in the same pass reads and writes z once instead of three times.
struct BiasActivation {
  float* z;
  const float* b;
  i64 n;
  bool relu;
  MGPU_HD void operator()(i64 r, int begin, int end) const {
    float* row = z + r * n;
    const float bias = b[r];
    if (relu)
      for (int j = begin; j < end; ++j) row[j] = row[j] + bias > 0 ? row[j] + bias : 0.0f;
    else
      for (int j = begin; j < end; ++j) row[j] += bias;
  }
};
}  // namespace

void bias_activation(const Device& d, float* z, const float* b, int rows, i64 row_length, Activation act) {
  for_each_span(d, rows, static_cast<int>(row_length), BiasActivation{z, b, row_length, act == Activation::Relu},
                2.0 * kF * rows * row_length);
}

void conv2d_forward(const Device& d, const float* x, ImageShape s, const float* W, const float* b,
                    int out_channels, int k, Activation act, float* col, float* z) {
  const int P = s.batch * (s.height - k + 1) * (s.width - k + 1);  // output pixels, all images
  const int K = s.channels * k * k;                                // inputs per output pixel
  im2col(d, x, s, k, col);
  // z = W col               [Cout x P] = [Cout x K][K x P]
  gemm(d, Transpose::No, Transpose::No, out_channels, P, K, 1.0f, W, col, 0.0f, z);
  // z = act(z + b), the bias broadcast along each channel's row of P pixels
  bias_activation(d, z, b, out_channels, P, act);
}

void conv2d_backward_products(const Device& d, const float* dz, const float* col, const float* W, const float* ones,
                              int out_channels, int K, int P, float* dW, float* db, float* dcol) {
  // BEGIN EXERCISE ex01.conv_backward
  // dW += dz col^T          [Cout x K] = [Cout x P][P x K]
  gemm(d, Transpose::No, Transpose::Yes, out_channels, K, P, 1.0f, dz, col, 1.0f, dW);
  // db += dz ones           [Cout x 1] = [Cout x P][P x 1]: each row of dz summed
  gemm(d, Transpose::No, Transpose::No, out_channels, 1, P, 1.0f, dz, ones, 1.0f, db);
  if (!dcol) return;
  // dcol = W^T dz           [K x P] = [K x Cout][Cout x P]
  gemm(d, Transpose::Yes, Transpose::No, K, P, out_channels, 1.0f, W, dz, 0.0f, dcol);
  // END EXERCISE ex01.conv_backward
}

void conv2d_backward(const Device& d, const float* dz, ImageShape s, const float* W, int out_channels, int k,
                     const float* col, const float* ones, float* dW, float* db, float* dcol, float* dx) {
  const int P = s.batch * (s.height - k + 1) * (s.width - k + 1);  // output pixels, all images
  const int K = s.channels * k * k;                                // inputs per output pixel
  conv2d_backward_products(d, dz, col, W, ones, out_channels, K, P, dW, db, dx ? dcol : nullptr);
  if (dx) col2im(d, dcol, s, k, dx);  // every window's gradient folded back onto the image
}

// --- ReLU

namespace {
// Item: one element i: z = max(z, 0).
struct Relu {
  float* z;
  MGPU_HD void operator()(i64 i) const { z[i] = z[i] > 0 ? z[i] : 0.0f; }
};
}  // namespace

void relu_forward(const Device& d, float* z, i64 n) { for_each_index(d, n, Relu{z}, 2.0 * kF * n); }

namespace {
// Item: one element i: dh passes where the unit was active (h > 0).
struct ReluGrad {
  const float* h;
  float* dh;
  MGPU_HD void operator()(i64 i) const { dh[i] = relu_grad(h[i], dh[i]); }
};
}  // namespace

void relu_backward(const Device& d, const float* h, float* dh, i64 n) {
  for_each_index(d, n, ReluGrad{h, dh}, 3.0 * kF * n);
}

// --- 2x2 average pooling, stride 2

namespace {
// out[x] = mean of the 2x2 window whose top-left pixel is in[2x] (`width` apart: the next row)
MGPU_HD inline void average_row(const float* __restrict__ in, int width, float* __restrict__ out, int x0, int x1) {
  for (int x = x0; x < x1; ++x) out[x] = 0.25f * (in[2 * x] + in[2 * x + 1] + in[width + 2 * x] + in[width + 2 * x + 1]);
}

// Item: one image plane (c, b) of y, Ho*Wo outputs: the mean of each 2x2 window of x.
struct AvgPoolForward {
  const float* x;
  float* y;
  int H, W, Ho, Wo;
  MGPU_HD void operator()(i64 plane, int begin, int end) const {
    for_each_row_segment(begin, end, Wo, [&](int oy, int x0, int x1) {
      average_row(x + (plane * H + 2 * oy) * W, W, y + (plane * Ho + oy) * Wo, x0, x1);
    });
  }
};
}  // namespace

void avgpool2_forward(const Device& d, const float* x, ImageShape s, float* y) {
  const int Ho = s.height / 2, Wo = s.width / 2;
  for_each_span(d, i64(s.channels) * s.batch, Ho * Wo, AvgPoolForward{x, y, s.height, s.width, Ho, Wo},
                kF * (s.size() + i64(s.channels) * s.batch * Ho * Wo));
}

namespace {
// out[x] = a quarter of g[x / 2], the gradient of the window pixel x belongs to; with h, ReLU's
// backward applied too. The quarter is computed before the choice: no branch.
MGPU_HD inline void quarter_row(const float* __restrict__ g, const float* __restrict__ h, float* __restrict__ out,
                                int x0, int x1) {
  // BEGIN EXERCISE ex01.avgpool_backward
  if (h) {
    for (int x = x0; x < x1; ++x) out[x] = relu_grad(h[x], 0.25f * g[x >> 1]);
  } else {
    for (int x = x0; x < x1; ++x) out[x] = 0.25f * g[x >> 1];
  }
  // END EXERCISE ex01.avgpool_backward
}

// Item: one image plane (c, b) of dx, H*W outputs, as a gather: pixel (y, x) gets a quarter of
// its window's gradient, or nothing in a dropped odd last row or column. With relu_output
// (the forward ReLU's output h, the pooling's input) ReLU's backward is applied in the same
// pass: nothing where h <= 0.
struct AvgPoolBackward {
  const float* dy;
  const float* relu_output;  // may be null
  float* dx;
  int H, W, Ho, Wo;
  MGPU_HD void operator()(i64 plane, int begin, int end) const {
    // BEGIN EXERCISE ex01.avgpool_backward
    for_each_row_segment(begin, end, W, [&](int y, int x0, int x1) {
      float* out = dx + (plane * H + y) * W;
      // Pixels [x0, xe) lie in a window; the rest of the segment was dropped by the pooling.
      const int xe = y < 2 * Ho ? (x1 < 2 * Wo ? x1 : 2 * Wo) : x0;
      if (xe > x0)
        quarter_row(dy + (plane * Ho + y / 2) * Wo, relu_output ? relu_output + (plane * H + y) * W : nullptr, out,
                    x0, xe);
      zero_row(out, xe > x0 ? xe : x0, x1);
    });
    // END EXERCISE ex01.avgpool_backward
  }
};
}  // namespace

void avgpool2_backward(const Device& d, const float* dy, ImageShape s, float* dx, const float* relu_output) {
  const int Ho = s.height / 2, Wo = s.width / 2;
  for_each_span(d, i64(s.channels) * s.batch, s.height * s.width,
                AvgPoolBackward{dy, relu_output, dx, s.height, s.width, Ho, Wo},
                kF * ((relu_output ? 2 : 1) * s.size() + i64(s.channels) * s.batch * Ho * Wo));
}

// --- flatten [C][B][H][W] -> [C*H*W][B], and back

namespace {
// Item: one feature f = (c, s) of the flat output, a row of B outputs y[f][0..B).
struct Flatten {
  const float* x;
  float* y;
  int B, S;  // S = H * W
  MGPU_HD void operator()(i64 f, int begin, int end) const {
    const i64 c = f / S, s = f % S;
    for (int b = begin; b < end; ++b) y[f * B + b] = x[(c * B + b) * S + s];
  }
};
}  // namespace

void flatten(const Device& d, const float* x, ImageShape s, float* y) {
  const int S = s.height * s.width;
  for_each_span(d, i64(s.channels) * S, s.batch, Flatten{x, y, s.batch, S}, 2.0 * kF * s.size());
}

namespace {
// Item: one image plane (c, b), S outputs dx[c][b][0..S).
struct Unflatten {
  const float* dy;
  float* dx;
  int B, S;
  MGPU_HD void operator()(i64 q, int begin, int end) const {
    const i64 c = q / B, b = q % B;
    for (int s = begin; s < end; ++s) dx[q * S + s] = dy[(c * S + s) * B + b];
  }
};
}  // namespace

void unflatten(const Device& d, const float* dy, ImageShape s, float* dx) {
  const int S = s.height * s.width;
  for_each_span(d, i64(s.channels) * s.batch, S, Unflatten{dy, dx, s.batch, S}, 2.0 * kF * s.size());
}

// --- dense: two matrix products and bias_activation, no kernel of its own

void dense_forward(const Device& d, const float* x, int in, int batch, const float* W, const float* b, int out,
                   Activation act, float* z) {
  // z = W^T x               [out x B] = [out x in][in x B]
  gemm(d, Transpose::Yes, Transpose::No, out, batch, in, 1.0f, W, x, 0.0f, z);
  // z = act(z + b)
  bias_activation(d, z, b, out, batch, act);
}

void dense_backward(const Device& d, const float* dz, const float* x, int in, int batch, const float* W, int out,
                    const float* ones, float* dW, float* db, float* dx) {
  // BEGIN EXERCISE ex01.dense_backward
  // dW += x dz^T            [in x out] = [in x B][B x out]
  gemm(d, Transpose::No, Transpose::Yes, in, out, batch, 1.0f, x, dz, 1.0f, dW);
  // db += dz ones           [out x 1] = [out x B][B x 1]
  gemm(d, Transpose::No, Transpose::No, out, 1, batch, 1.0f, dz, ones, 1.0f, db);
  // dx = W dz               [in x B] = [in x out][out x B]
  if (dx) gemm(d, Transpose::No, Transpose::No, in, batch, out, 1.0f, W, dz, 0.0f, dx);
  // END EXERCISE ex01.dense_backward
}

// --- softmax cross-entropy

namespace {
// Item: one example b; it walks the example's column of logits.
struct SoftmaxCrossEntropy {
  const float* z;
  const std::int32_t* labels;
  float* loss;
  float* correct;
  float* dz;  // may be null
  int classes, B;
  MGPU_HD void operator()(i64 b) const {
    // Subtracting the max keeps exp() from overflowing; it cancels in the ratio.
    int best = 0;
    float top = z[b];
    for (int c = 1; c < classes; ++c)
      if (z[c * B + b] > top) top = z[c * B + b], best = c;
    float sum = 0;
    for (int c = 0; c < classes; ++c) sum += expf(z[c * B + b] - top);
    const int y = labels[b];
    loss[b] = (top - z[y * B + b]) + logf(sum);  // this order is exact when the label is the argmax
    correct[b] = best == y ? 1.0f : 0.0f;
    if (dz) {
      // BEGIN EXERCISE ex01.softmax_gradient
      for (int c = 0; c < classes; ++c) dz[c * B + b] = expf(z[c * B + b] - top) / sum - (c == y ? 1.0f : 0.0f);
      // END EXERCISE ex01.softmax_gradient
    }
  }
};
}  // namespace

void softmax_cross_entropy(const Device& d, const float* logits, const std::int32_t* labels, int classes,
                           int batch, float* loss, float* correct, float* dlogits) {
  for_each_index(d, batch, SoftmaxCrossEntropy{logits, labels, loss, correct, dlogits, classes, batch});
}

}  // namespace lenet
