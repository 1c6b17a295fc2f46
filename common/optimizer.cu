// The kernels of optimizer.h, written once for both backends (one functor call per element, as
// vector_ops.cu). The scalars that do not depend on i (the bias corrections, 1 - lr * wd) are
// computed once on the host, in double as PyTorch's Python code computes them, then used as
// floats, as PyTorch's kernels use a Python number on a float tensor.
#include "optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "check.h"
#include "parallel.h"

namespace mgpu {
namespace {
using i64 = std::int64_t;
constexpr double kF = sizeof(float);  // bytes per element, for the profile's GB/s

// Item: element i of an AdamW step (optimizer.h gives the formulas).
struct AdamWStep {
  float *p, *m, *v;
  const float* g;
  float grad_scale, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps, step_size;
  MGPU_HD void operator()(i64 i) const {
    const float gi = g[i] * grad_scale;
    const float pi = p[i] * decay;
    const float mi = m[i] * beta1 + one_minus_beta1 * gi;
    const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    const float denom = sqrtf(vi) / bias2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + -step_size * (mi / denom);
  }
};

// Item: element i of a step of SGD with momentum.
struct SgdMomentumStep {
  float *p, *buf;
  const float* g;
  float grad_scale, weight_decay, momentum, lr;
  bool first;
  MGPU_HD void operator()(i64 i) const {
    float gi = g[i] * grad_scale;
    if (weight_decay != 0.0f) gi = gi + weight_decay * p[i];
    const float b = first ? gi : buf[i] * momentum + gi;
    buf[i] = b;
    p[i] = p[i] + -lr * b;
  }
};

// Item: part j of a sum of squares, the elements [j * per_part, (j + 1) * per_part) of g, in
// double, into partial[j]. Few enough parts for the host to add them up.
struct PartialSquares {
  const float* g;
  double* partial;
  i64 n, per_part;
  MGPU_HD void operator()(i64 j) const {
    const i64 begin = j * per_part, end = begin + per_part < n ? begin + per_part : n;
    double s = 0;
    for (i64 i = begin; i < end; ++i) s += double(g[i]) * g[i];
    partial[j] = s;
  }
};
}  // namespace

void adamw_update(const Device& d, float* p, const float* g, float* m, float* v, i64 n, const AdamWSettings& s,
                  long step, float grad_scale) {
  if (step < 1) throw Error("adamw_update: step " + std::to_string(step) + " (the first step is 1)");
  const double bias1 = 1.0 - std::pow(s.beta1, double(step));
  const double bias2 = 1.0 - std::pow(s.beta2, double(step));
  const AdamWStep f{p,
                    m,
                    v,
                    g,
                    grad_scale,
                    float(1.0 - s.lr * s.weight_decay),
                    float(s.beta1),
                    float(1.0 - s.beta1),
                    float(s.beta2),
                    float(1.0 - s.beta2),
                    float(std::sqrt(bias2)),
                    float(s.eps),
                    float(s.lr / bias1)};
  for_each_index(d, n, f, 7.0 * kF * n);  // reads p, g, m, v; writes p, m, v
}

void sgd_momentum_update(const Device& d, float* p, const float* g, float* buf, i64 n, const SgdMomentumSettings& s,
                         bool first_step, float grad_scale) {
  const SgdMomentumStep f{p, buf, g, grad_scale, float(s.weight_decay), float(s.momentum), float(s.lr), first_step};
  for_each_index(d, n, f, 5.0 * kF * n);  // reads p, g, buf; writes p, buf
}

double sum_of_squares(const Device& d, const float* g, i64 n) {
  if (n <= 0) return 0;
  constexpr i64 kParts = 1024;  // enough parallel parts for every core or a GPU's SMs
  const i64 per_part = (n + kParts - 1) / kParts, parts = (n + per_part - 1) / per_part;
  Buffer<double> partial(d, static_cast<std::size_t>(parts));  // [parts]
  for_each_index(d, parts, PartialSquares{g, partial.data(), n, per_part}, kF * n);
  double sum = 0;
  for (double x : partial.download()) sum += x;  // download waits for the kernel
  return sum;
}

float clip_coefficient(double total_norm, float max_norm) {
  if (!(max_norm > 0)) throw Error("clip_coefficient: max_norm " + std::to_string(max_norm) + " (must be > 0)");
  const double c = double(max_norm) / (total_norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

}  // namespace mgpu
