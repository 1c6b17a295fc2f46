// The kernels of vector_ops.h, written once for both backends: each is a functor run by
// for_each_index (one call per element), directly above the function that launches it.
#include "vector_ops.h"

#include "parallel.h"

namespace mgpu {
namespace {
using i64 = std::int64_t;
constexpr double kF = sizeof(float);  // bytes per element, for the profile's GB/s
}  // namespace

namespace {
// Item: one element i: p -= scale * g.
struct SgdStep {
  float* p;
  const float* g;
  float scale;
  MGPU_HD void operator()(i64 i) const { p[i] -= scale * g[i]; }
};
}  // namespace

void sgd_update(const Device& d, float* p, const float* g, i64 n, float scale) {
  for_each_index(d, n, SgdStep{p, g, scale}, 3.0 * kF * n);
}

namespace {
// Item: one element i: p = value.
struct Fill {
  float* p;
  float value;
  MGPU_HD void operator()(i64 i) const { p[i] = value; }
};
}  // namespace

void fill(const Device& d, float* p, i64 n, float value) { for_each_index(d, n, Fill{p, value}, kF * n); }

namespace {
// Item: one element i: dst += src.
struct AddInto {
  float* dst;
  const float* src;
  MGPU_HD void operator()(i64 i) const { dst[i] += src[i]; }
};
}  // namespace

void add_into(const Device& d, float* dst, const float* src, i64 n) {
  // The kernel every allreduce runs: both operands must be d's own memory (a peer copy first
  // brings the other device's values over). Checked because it is where that mistake is made.
  const std::size_t bytes = n > 0 ? std::size_t(n) * sizeof(float) : 0;
  check_owned(d, dst, bytes, "add_into (destination)");
  check_owned(d, src, bytes, "add_into (source)");
  for_each_index(d, n, AddInto{dst, src}, 3.0 * kF * n);
}

}  // namespace mgpu
