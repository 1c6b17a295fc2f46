// BatchNorm's channel sums block by block (blocked_sums.h says why).
#include "blocked_sums.h"

#include <string>

#include "common/parallel.h"  // for_each_index

namespace fast {
namespace {

using i64 = std::int64_t;

// The sum of term(i) over i = 0..m-1, in kLanes partial sums: lane l takes i = l, l + kLanes, ...
// The lanes' adds do not depend on one another, so the inner loop becomes one vector add.
template <class Term>
MGPU_HD double block_sum(int m, Term term) {
  double lane[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= m; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += term(i + l);
  double sum = 0;
  for (; i < m; ++i) sum += term(i);  // the last m % kLanes values
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  return sum;
}

MGPU_HD inline int block_length(i64 n, i64 first) { return n - first < kBlock ? int(n - first) : kBlock; }

// The sum of term(j) over j = 0..n-1, block by block (each block a block_sum, added in double).
template <class Term>
MGPU_HD double row_sum(i64 n, Term term) {
  double total = 0;
  for (i64 first = 0; first < n; first += kBlock)
    total += block_sum(block_length(n, first), [&](int i) { return term(first + i); });
  return total;
}

// Item: one channel c of z [C][n]: sum z and sum (z - mean)^2 in one read (Chan's merge of blocks).
struct Moments {
  const float* z;
  float* sums;  // [2][C]
  int channels;
  i64 n;
  MGPU_HD void operator()(i64 c) const {
    double count = 0, mean = 0, m2 = 0, total = 0;  // of the blocks merged so far
    for (i64 first = 0; first < n; first += kBlock) {
      const float* v = z + c * n + first;
      const int m = block_length(n, first);
      const double block_total = block_sum(m, [&](int i) { return double(v[i]); });
      const double block_mean = block_total / m;
      const double block_m2 = block_sum(m, [&](int i) {  // the block again, now from L1
        const double centered = v[i] - block_mean;
        return centered * centered;
      });
      const double merged = count + m, delta = block_mean - mean;
      mean += delta * m / merged;
      m2 += block_m2 + delta * delta * count * m / merged;
      count = merged;
      total += block_total;
    }
    sums[c] = float(total);
    sums[channels + c] = float(m2);
  }
};

// Item: one channel c: sum z into sums[c].
struct Sums {
  const float* z;
  float* sums;
  i64 n;
  MGPU_HD void operator()(i64 c) const {
    const float* v = z + c * n;
    sums[c] = float(row_sum(n, [&](i64 j) { return double(v[j]); }));
  }
};

// Item: one channel c: sum (z - mean)^2 into squares[c], mean = sums[c] / count.
struct SquareSums {
  const float* z;
  const float* sums;
  float* squares;
  double count;
  i64 n;
  MGPU_HD void operator()(i64 c) const {
    const double mean = sums[c] / count;
    const float* v = z + c * n;
    squares[c] = float(row_sum(n, [&](i64 j) {
      const double centered = v[j] - mean;
      return centered * centered;
    }));
  }
};

// Item: one channel c: sum dy and sum dy * xhat, xhat = (z - mean) * inv_std (chapter 09's
// arithmetic: xhat in float, the product in double).
struct BackwardSums {
  const float* dy;
  const float* z;
  const float* stats;  // [2][C]: mean, inv_std
  float* sums;         // [2][C]
  float* dgamma;       // may be null
  float* dbeta;        // may be null
  int channels;
  i64 n;
  MGPU_HD void operator()(i64 c) const {
    const float mean = stats[c], inv_std = stats[channels + c];
    double grad = 0, grad_xhat = 0;
    // Both sums a block at a time: the second reads dy's block again from L1, not from memory.
    for (i64 first = 0; first < n; first += kBlock) {
      const float* g = dy + c * n + first;
      const float* v = z + c * n + first;
      const int m = block_length(n, first);
      grad += block_sum(m, [&](int i) { return double(g[i]); });
      grad_xhat += block_sum(m, [&](int i) { return double(g[i]) * ((v[i] - mean) * inv_std); });
    }
    sums[c] = float(grad);
    sums[channels + c] = float(grad_xhat);
    if (dbeta) dbeta[c] += float(grad);
    if (dgamma) dgamma[c] += float(grad_xhat);
  }
};

void check_values(i64 n, const char* call) {
  if (n < 1) throw mgpu::Error(std::string(call) + ": no values to normalize over");
}

}  // namespace

void batch_norm_moments_blocked(const Device& d, const float* z, int channels, i64 n, float* sums) {
  check_values(n, "batch_norm_moments_blocked");
  mgpu::for_each_index(d, channels, Moments{z, sums, channels, n}, sizeof(float) * double(channels) * n);
}

void batch_norm_sums_blocked(const Device& d, const float* z, int channels, i64 n, float* sums) {
  mgpu::for_each_index(d, channels, Sums{z, sums, n}, sizeof(float) * double(channels) * n);
}

void batch_norm_square_sums_blocked(const Device& d, const float* z, int channels, i64 n, double count,
                                    float* sums) {
  if (!(count >= 1)) throw mgpu::Error("batch_norm_square_sums_blocked: no values to normalize over");
  mgpu::for_each_index(d, channels, SquareSums{z, sums, sums + channels, count, n},
                       sizeof(float) * double(channels) * n);
}

void batch_norm_backward_sums_blocked(const Device& d, const float* dy, const float* z, int channels, i64 n,
                                      const float* stats, float* sums, float* dgamma, float* dbeta) {
  mgpu::for_each_index(d, channels, BackwardSums{dy, z, stats, sums, dgamma, dbeta, channels, n},
                       2.0 * sizeof(float) * double(channels) * n);
}

}  // namespace fast
