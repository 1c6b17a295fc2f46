// LeNet's layers. Each kernel is a functor run by mgpu::for_each_index, one call per
// work item; the comment above each says what an item is. Items are chosen so that
// neighbouring items touch neighbouring memory (fast on a GPU) and integer divisions are
// few per element (they are slow on a CPU).
#include "layers.h"

#include <cmath>

#include "common/gemm.h"
#include "common/parallel.h"

namespace lenet {
namespace {

using mgpu::for_each_index;
using mgpu::gemm;
using mgpu::Transpose;
using i64 = std::int64_t;

// Item: one (row r = (c, ky, kx), image b) pair of col: Ho*Wo contiguous outputs, copied
// row by row from the input plane shifted by (ky, kx). Contiguous inner loops keep a CPU's
// vector units busy; a GPU gets C*k*k*B items, enough to fill it.
struct Im2col {
  const float* x;
  float* col;
  int C, B, H, W, k, Ho, Wo;
  MGPU_HD void operator()(i64 item) const {
    // 32-bit divisions: several times cheaper than 64-bit ones on a CPU.
    const int r = int(item / B), b = int(item % B);
    const int c = r / (k * k), ky = r / k % k, kx = r % k;
    // __restrict__: src and dst never overlap, so the compiler may vectorize the copy.
    const float* __restrict__ src = x + ((i64(c) * B + b) * H + ky) * W + kx;
    float* __restrict__ dst = col + (i64(r) * B + b) * Ho * Wo;  // = col[r][b*Ho*Wo]
    for (int oy = 0; oy < Ho; ++oy, src += W, dst += Wo)
      for (int ox = 0; ox < Wo; ++ox) dst[ox] = src[ox];
  }
};

// Item: one image plane (c, b) of dx. The adjoint of im2col: every col entry is added back
// to the pixel it was copied from. One item owns its whole plane, so no two items ever
// write the same element (no atomics needed).
struct Col2im {
  const float* col;
  float* dx;
  int C, B, H, W, k, Ho, Wo;
  MGPU_HD void operator()(i64 item) const {
    const i64 c = item / B, b = item % B;
    float* plane = dx + item * H * W;  // = dx[c][b]
    for (int i = 0; i < H * W; ++i) plane[i] = 0.0f;
    for (int ky = 0; ky < k; ++ky)
      for (int kx = 0; kx < k; ++kx) {
        const i64 r = (c * k + ky) * k + kx;
        const float* __restrict__ src = col + (r * B + b) * Ho * Wo;  // = col[r][b*Ho*Wo]
        float* __restrict__ dst = plane + ky * W + kx;
        for (int oy = 0; oy < Ho; ++oy, src += Wo, dst += W)
          for (int ox = 0; ox < Wo; ++ox) dst[ox] += src[ox];
      }
  }
};

// Item: one image plane (c, b): H x W in, Ho x Wo out.
struct AvgPoolForward {
  const float* x;
  float* y;
  int H, W, Ho, Wo;
  MGPU_HD void operator()(i64 plane) const {
    const float* __restrict__ in = x + plane * H * W;
    float* __restrict__ out = y + plane * Ho * Wo;
    for (int oy = 0; oy < Ho; ++oy, in += 2 * W, out += Wo)
      for (int ox = 0; ox < Wo; ++ox)
        out[ox] = 0.25f * (in[2 * ox] + in[2 * ox + 1] + in[W + 2 * ox] + in[W + 2 * ox + 1]);
  }
};

// Item: one image plane (c, b). Each input pixel in a window gets a quarter of that window's
// gradient; the pixels of a dropped odd last row or column get none.
struct AvgPoolBackward {
  const float* dy;
  float* dx;
  int H, W, Ho, Wo;
  MGPU_HD void operator()(i64 plane) const {
    const float* __restrict__ g = dy + plane * Ho * Wo;
    float* __restrict__ out = dx + plane * H * W;
    for (int oy = 0; oy < Ho; ++oy, g += Wo, out += 2 * W) {
      for (int ox = 0; ox < Wo; ++ox) {
        const float quarter = 0.25f * g[ox];
        out[2 * ox] = out[2 * ox + 1] = out[W + 2 * ox] = out[W + 2 * ox + 1] = quarter;
      }
      if (W > 2 * Wo) out[W - 1] = out[2 * W - 1] = 0.0f;  // odd width: last column
    }
    if (H > 2 * Ho)  // odd height: last row
      for (int x = 0; x < W; ++x) out[x] = 0.0f;
  }
};

// Item: one feature f = (c, s) of the flat output; it walks the batch.
struct Flatten {
  const float* x;
  float* y;
  int B, S;  // S = H * W
  MGPU_HD void operator()(i64 f) const {
    const i64 c = f / S, s = f % S;
    for (int b = 0; b < B; ++b) y[f * B + b] = x[(c * B + b) * S + s];
  }
};

// Item: one image plane (c, b); it walks the plane's S pixels.
struct Unflatten {
  const float* dy;
  float* dx;
  int B, S;
  MGPU_HD void operator()(i64 q) const {
    const i64 c = q / B, b = q % B;
    for (int s = 0; s < S; ++s) dx[q * S + s] = dy[(c * S + s) * B + b];
  }
};

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
    if (dz)
      for (int c = 0; c < classes; ++c) dz[c * B + b] = expf(z[c * B + b] - top) / sum - (c == y ? 1.0f : 0.0f);
  }
};

// Items of the element-wise kernels below: one element i each.
struct Relu {  // z = max(z, 0), in place
  float* z;
  MGPU_HD void operator()(i64 i) const { z[i] = z[i] > 0 ? z[i] : 0.0f; }
};
struct ReluGrad {  // dh passes where the unit was active (h > 0)
  const float* h;
  float* dh;
  MGPU_HD void operator()(i64 i) const { dh[i] = h[i] > 0 ? dh[i] : 0.0f; }
};
struct SgdStep {  // p -= scale * g
  float* p;
  const float* g;
  float scale;
  MGPU_HD void operator()(i64 i) const { p[i] -= scale * g[i]; }
};
struct Fill {
  float* p;
  float value;
  MGPU_HD void operator()(i64 i) const { p[i] = value; }
};
struct AddInto {  // dst += src
  float* dst;
  const float* src;
  MGPU_HD void operator()(i64 i) const { dst[i] += src[i]; }
};

}  // namespace

void im2col(const Device& d, const float* x, ImageShape s, int k, float* col) {
  const int Ho = s.height - k + 1, Wo = s.width - k + 1;
  for_each_index(d, i64(s.channels) * k * k * s.batch, Im2col{x, col, s.channels, s.batch, s.height, s.width, k, Ho, Wo});
}

void col2im(const Device& d, const float* col, ImageShape s, int k, float* dx) {
  const int Ho = s.height - k + 1, Wo = s.width - k + 1;
  for_each_index(d, i64(s.channels) * s.batch, Col2im{col, dx, s.channels, s.batch, s.height, s.width, k, Ho, Wo});
}

void conv2d_forward(const Device& d, const float* x, ImageShape s, const float* W, const float* b,
                    int out_channels, int k, const float* ones, float* col, float* z) {
  const int P = s.batch * (s.height - k + 1) * (s.width - k + 1);  // output pixels, all images
  const int K = s.channels * k * k;                                // inputs per output pixel
  im2col(d, x, s, k, col);
  // z = b ones^T            [Cout x P] = [Cout x 1][1 x P]
  gemm(d, Transpose::No, Transpose::No, out_channels, P, 1, 1.0f, b, ones, 0.0f, z);
  // z += W col              [Cout x P] = [Cout x K][K x P]
  gemm(d, Transpose::No, Transpose::No, out_channels, P, K, 1.0f, W, col, 1.0f, z);
}

void conv2d_backward(const Device& d, const float* dz, ImageShape s, const float* W, int out_channels, int k,
                     const float* col, const float* ones, float* dW, float* db, float* dcol, float* dx) {
  const int P = s.batch * (s.height - k + 1) * (s.width - k + 1);
  const int K = s.channels * k * k;
  // dW += dz col^T          [Cout x K] = [Cout x P][P x K]
  gemm(d, Transpose::No, Transpose::Yes, out_channels, K, P, 1.0f, dz, col, 1.0f, dW);
  // db += dz ones           [Cout x 1] = [Cout x P][P x 1]
  gemm(d, Transpose::No, Transpose::No, out_channels, 1, P, 1.0f, dz, ones, 1.0f, db);
  if (!dx) return;
  // dcol = W^T dz           [K x P] = [K x Cout][Cout x P]; then fold the windows back
  gemm(d, Transpose::Yes, Transpose::No, K, P, out_channels, 1.0f, W, dz, 0.0f, dcol);
  col2im(d, dcol, s, k, dx);
}

void relu_forward(const Device& d, float* z, i64 n) { for_each_index(d, n, Relu{z}); }

void relu_backward(const Device& d, const float* h, float* dh, i64 n) { for_each_index(d, n, ReluGrad{h, dh}); }

void avgpool2_forward(const Device& d, const float* x, ImageShape s, float* y) {
  const int Ho = s.height / 2, Wo = s.width / 2;
  for_each_index(d, i64(s.channels) * s.batch, AvgPoolForward{x, y, s.height, s.width, Ho, Wo});
}

void avgpool2_backward(const Device& d, const float* dy, ImageShape s, float* dx) {
  const int Ho = s.height / 2, Wo = s.width / 2;
  for_each_index(d, i64(s.channels) * s.batch, AvgPoolBackward{dy, dx, s.height, s.width, Ho, Wo});
}

void flatten(const Device& d, const float* x, ImageShape s, float* y) {
  const int S = s.height * s.width;
  for_each_index(d, i64(s.channels) * S, Flatten{x, y, s.batch, S});
}

void unflatten(const Device& d, const float* dy, ImageShape s, float* dx) {
  for_each_index(d, i64(s.channels) * s.batch, Unflatten{dy, dx, s.batch, s.height * s.width});
}

void dense_forward(const Device& d, const float* x, int in, int batch, const float* W, const float* b, int out,
                   const float* ones, float* z) {
  // z = b ones^T            [out x B] = [out x 1][1 x B]
  gemm(d, Transpose::No, Transpose::No, out, batch, 1, 1.0f, b, ones, 0.0f, z);
  // z += W^T x              [out x B] = [out x in][in x B]
  gemm(d, Transpose::Yes, Transpose::No, out, batch, in, 1.0f, W, x, 1.0f, z);
}

void dense_backward(const Device& d, const float* dz, const float* x, int in, int batch, const float* W, int out,
                    const float* ones, float* dW, float* db, float* dx) {
  // dW += x dz^T            [in x out] = [in x B][B x out]
  gemm(d, Transpose::No, Transpose::Yes, in, out, batch, 1.0f, x, dz, 1.0f, dW);
  // db += dz ones           [out x 1] = [out x B][B x 1]
  gemm(d, Transpose::No, Transpose::No, out, 1, batch, 1.0f, dz, ones, 1.0f, db);
  // dx = W dz               [in x B] = [in x out][out x B]
  if (dx) gemm(d, Transpose::No, Transpose::No, in, batch, out, 1.0f, W, dz, 0.0f, dx);
}

void softmax_cross_entropy(const Device& d, const float* logits, const std::int32_t* labels, int classes,
                           int batch, float* loss, float* correct, float* dlogits) {
  for_each_index(d, batch, SoftmaxCrossEntropy{logits, labels, loss, correct, dlogits, classes, batch});
}

void sgd_update(const Device& d, float* p, const float* g, i64 n, float scale) {
  for_each_index(d, n, SgdStep{p, g, scale});
}

void fill(const Device& d, float* p, i64 n, float value) { for_each_index(d, n, Fill{p, value}); }

void add_into(const Device& d, float* dst, const float* src, i64 n) {
  // The kernel every allreduce runs: both operands must be d's own memory (a peer copy first
  // brings the other device's values over). Checked because it is where that mistake is made.
  const std::size_t bytes = n > 0 ? std::size_t(n) * sizeof(float) : 0;
  mgpu::check_owned(d, dst, bytes, "add_into (destination)");
  mgpu::check_owned(d, src, bytes, "add_into (source)");
  for_each_index(d, n, AddInto{dst, src});
}

}  // namespace lenet
