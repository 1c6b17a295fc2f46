// LeNet's layers once more, written the slow and obvious way: nested loops over every index,
// in double precision, on the host. The tests hold the library's fast versions (im2col + GEMM,
// Thrust kernels) against these. Each function is short enough to check by eye against the
// formula in its comment.
//
// Layout: the library's own, so results compare element by element with no reshuffling.
//   images     [C][B][H][W]  ("CNHW": channel-major, then image, row, column)
//   features   [F][B]        (the dense layers: one column per image)
//   conv W     [Cout][C][k][k],  dense W [in][out]   (d2l's shapes)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ref {

using Tensor = std::vector<double>;

// The shape of a [C][B][H][W] tensor and where element (c, b, y, x) lives in it.
struct Shape {
  int C, B, H, W;
  std::size_t size() const { return std::size_t(C) * B * H * W; }
  std::size_t at(int c, int b, int y, int x) const { return ((std::size_t(c) * B + b) * H + y) * W + x; }
};

// Calls f(pixel, entry) for every pair that im2col connects: entry (row (c, ky, kx), column
// (b, oy, ox)) of col [C*k*k][B*Ho*Wo] holds pixel x[c][b][oy+ky][ox+kx]. im2col copies along
// these pairs; col2im, its adjoint, adds back along the very same pairs.
template <class F>
void for_each_window_pair(Shape s, int k, F f) {
  const int Ho = s.H - k + 1, Wo = s.W - k + 1;
  const std::size_t columns = std::size_t(s.B) * Ho * Wo;
  for (int c = 0; c < s.C; ++c)
    for (int ky = 0; ky < k; ++ky)
      for (int kx = 0; kx < k; ++kx)
        for (int b = 0; b < s.B; ++b)
          for (int oy = 0; oy < Ho; ++oy)
            for (int ox = 0; ox < Wo; ++ox) {
              const std::size_t row = (std::size_t(c) * k + ky) * k + kx;
              const std::size_t column = (std::size_t(b) * Ho + oy) * Wo + ox;
              f(s.at(c, b, oy + ky, ox + kx), row * columns + column);
            }
}

// col [C*k*k][B*Ho*Wo]: row (c, ky, kx), column (b, oy, ox) holds x[c][b][oy+ky][ox+kx].
inline Tensor im2col(const Tensor& x, Shape s, int k) {
  Tensor col(std::size_t(s.C) * k * k * s.B * (s.H - k + 1) * (s.W - k + 1));
  for_each_window_pair(s, k, [&](std::size_t pixel, std::size_t entry) { col[entry] = x[pixel]; });
  return col;
}

// Each col entry added back onto the pixel it came from: dx [C][B][H][W].
inline Tensor col2im(const Tensor& col, Shape s, int k) {
  Tensor dx(s.size(), 0.0);
  for_each_window_pair(s, k, [&](std::size_t pixel, std::size_t entry) { dx[pixel] += col[entry]; });
  return dx;
}

// Valid convolution, stride 1 (strictly: cross-correlation, as in every deep-learning library):
//   z[o][b][oy][ox] = bias[o] + sum over c, ky, kx of W[o][c][ky][kx] * x[c][b][oy+ky][ox+kx]
// x [C][B][H][W], W [Cout][C][k][k], bias [Cout]  ->  z [Cout][B][H-k+1][W-k+1]
inline Tensor conv2d(const Tensor& x, Shape s, const Tensor& W, const Tensor& bias, int Cout, int k) {
  const Shape zs{Cout, s.B, s.H - k + 1, s.W - k + 1};
  Tensor z(zs.size());
  for (int o = 0; o < Cout; ++o)
    for (int b = 0; b < s.B; ++b)
      for (int oy = 0; oy < zs.H; ++oy)
        for (int ox = 0; ox < zs.W; ++ox) {
          double sum = bias[o];
          for (int c = 0; c < s.C; ++c)
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx)
                sum += W[((std::size_t(o) * s.C + c) * k + ky) * k + kx] * x[s.at(c, b, oy + ky, ox + kx)];
          z[zs.at(o, b, oy, ox)] = sum;
        }
  return z;
}

// max(z, 0), element by element.
inline Tensor relu(const Tensor& z) {
  Tensor h(z.size());
  for (std::size_t i = 0; i < z.size(); ++i) h[i] = z[i] > 0 ? z[i] : 0.0;
  return h;
}

// The mean of each 2x2 window, stride 2; an odd last row/column belongs to no window.
// x [C][B][H][W]  ->  y [C][B][H/2][W/2]
inline Tensor avgpool2(const Tensor& x, Shape s) {
  const Shape ys{s.C, s.B, s.H / 2, s.W / 2};
  Tensor y(ys.size());
  for (int c = 0; c < s.C; ++c)
    for (int b = 0; b < s.B; ++b)
      for (int oy = 0; oy < ys.H; ++oy)
        for (int ox = 0; ox < ys.W; ++ox)
          y[ys.at(c, b, oy, ox)] = (x[s.at(c, b, 2 * oy, 2 * ox)] + x[s.at(c, b, 2 * oy, 2 * ox + 1)] +
                                    x[s.at(c, b, 2 * oy + 1, 2 * ox)] + x[s.at(c, b, 2 * oy + 1, 2 * ox + 1)]) /
                                   4.0;
  return y;
}

// x [C][B][H][W]  ->  y [C*H*W][B], feature f = (c*H + y)*W + x (PyTorch's flatten order).
inline Tensor flatten(const Tensor& x, Shape s) {
  Tensor y(s.size());
  for (int c = 0; c < s.C; ++c)
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < s.H; ++i)
        for (int j = 0; j < s.W; ++j) {
          const std::size_t f = (std::size_t(c) * s.H + i) * s.W + j;
          y[f * s.B + b] = x[s.at(c, b, i, j)];
        }
  return y;
}

// z[o][b] = bias[o] + sum over i of W[i][o] * x[i][b]
// x [in][B], W [in][out], bias [out]  ->  z [out][B]
inline Tensor dense(const Tensor& x, int in, int B, const Tensor& W, const Tensor& bias, int out) {
  Tensor z(std::size_t(out) * B);
  for (int o = 0; o < out; ++o)
    for (int b = 0; b < B; ++b) {
      double sum = bias[o];
      for (int i = 0; i < in; ++i) sum += W[std::size_t(i) * out + o] * x[std::size_t(i) * B + b];
      z[std::size_t(o) * B + b] = sum;
    }
  return z;
}

// Cross-entropy of each example, from logits z [classes][B] and labels [B]:
//   loss[b] = log(sum over c of exp z[c][b]) - z[label_b][b]
// The log-sum-exp is taken around the column's largest logit m, so exp() never overflows:
//   log(sum exp z) = m + log(sum exp(z - m)).
inline Tensor softmax_cross_entropy(const Tensor& z, const std::vector<std::int32_t>& labels, int classes, int B) {
  Tensor loss(B);
  for (int b = 0; b < B; ++b) {
    double m = z[b];
    for (int c = 1; c < classes; ++c) m = std::max(m, z[std::size_t(c) * B + b]);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(z[std::size_t(c) * B + b] - m);
    loss[b] = m + std::log(sum) - z[std::size_t(labels[b]) * B + b];
  }
  return loss;
}

// The class with the largest logit in column b of z [classes][B].
inline int argmax(const Tensor& z, int classes, int B, int b) {
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (z[std::size_t(c) * B + b] > z[std::size_t(best) * B + b]) best = c;
  return best;
}

// sum over i of a[i] * b[i]
inline double dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

inline Tensor to_double(const std::vector<float>& v) { return Tensor(v.begin(), v.end()); }

}  // namespace ref
