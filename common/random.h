// Seeded randomness that gives the same numbers with every compiler and standard library:
// std::mt19937_64 is specified bit for bit, but std::normal_distribution and std::shuffle
// are not, so the two transformations below are written out.
#pragma once
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace mgpu {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return (gen_() >> 11) * 0x1.0p-53; }

  // Standard normal by the Box-Muller transform (one of the pair is kept: simple, not thrifty).
  double normal() {
    const double u1 = 1.0 - uniform();  // in (0, 1], so log() is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

  // Uniform integer in [0, n). The modulo bias is below 2^-40 for the n used here.
  std::uint64_t below(std::uint64_t n) { return gen_() % n; }

 private:
  std::mt19937_64 gen_;
};

// 0..n-1 in a random order (Fisher-Yates).
inline std::vector<int> random_permutation(int n, Rng& rng) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  return order;
}

}  // namespace mgpu
