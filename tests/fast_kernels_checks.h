// What chapter 10's suite and its hidden cases share: the shape of a convolution case and its
// label, the bit-for-bit comparison, and BatchNorm apply's inputs with chapter 09's result and
// the comparison of the host's apply against it (bit for bit on a CPU, a rounding apart on a GPU).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/09_resnet/layers.h"
#include "chapters/10_fast_kernels/kernels.h"  // ApplyArgs, apply_args
#include "common/backend.h"
#include "common/device.h"
#include "common/random.h"
#include "helpers.h"

namespace testing {

// A convolution the layout kernels are checked at: (input shape, kernel, stride, padding).
struct ConvCase {
  lenet::ImageShape xs;
  nn::ConvShape c;
};
inline std::string label(const ConvCase& cc) {
  std::ostringstream s;
  s << cc.xs.channels << "x" << cc.xs.batch << "x" << cc.xs.height << "x" << cc.xs.width << " k" << cc.c.kernel
    << " s" << cc.c.stride << " p" << cc.c.padding;
  return s.str();
}

// Elements whose bits differ (0.0f and -0.0f differ; NaNs of the same bits do not), with the first.
inline void check_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": " << got.size() << " elements, expected " << want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " elements differ in their bits; first at ["
                               << first << "]: got " << got[first] << ", expected " << want[first]);
}

// BatchNorm apply's inputs on the host: z and residual [C][n], stats [2][C] (mean, inv_std > 0),
// gamma and beta [C].
struct ApplyInputs {
  int C;
  std::int64_t n;
  std::vector<float> z, residual, stats, gamma, beta;
  ApplyInputs(int C, std::int64_t n, mgpu::Rng& rng)
      : C(C),
        n(n),
        z(random_floats(std::size_t(C) * n, rng)),
        residual(random_floats(std::size_t(C) * n, rng)),
        stats(random_floats(2 * C, rng)),
        gamma(random_floats(C, rng)),
        beta(random_floats(C, rng)) {
    for (int c = 0; c < C; ++c) stats[C + c] = 0.5f + std::abs(stats[C + c]);
  }
};

// Chapter 09's batch_norm_apply of `in` on device d.
inline std::vector<float> reference_apply(const mgpu::Device& d, const ApplyInputs& in, bool with_residual, bool relu) {
  const auto z = on_device(d, in.z), residual = on_device(d, in.residual);
  const auto stats = on_device(d, in.stats), gamma = on_device(d, in.gamma), beta = on_device(d, in.beta);
  auto y = poisoned(d, in.z.size());
  nn::batch_norm_apply(d, z.data(), in.C, in.n, stats.data(), gamma.data(), beta.data(),
                       with_residual ? residual.data() : nullptr,
                       relu ? lenet::Activation::Relu : lenet::Activation::None, y.data());
  return y.download();
}

// The host's apply against the device's: bit for bit in the cpu build (one compiler, one order).
// In the cuda build the reference ran on the GPU, where nvcc fuses (z - mean) * scale + shift into
// one FMA (one rounding) and the host compiler does not (two): they may differ in the last bit,
// so there the check is 2^-20 of the value's scale (a few roundings). (On the GPU, raw against
// reference, both fused: bit for bit, test_fast_kernels' "raw kernels: batch_norm_apply_raw".)
inline void check_host_apply(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if constexpr (!mgpu::kCudaBackend) {
    check_bitwise(got, want, what);
  } else {
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(std::abs(got[i] - want[i]) <= 0x1p-20f * std::max(1.0f, std::abs(want[i])))) ++bad;
    CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " elements beyond a rounding");
  }
}

// The four choices of BatchNorm's apply on `in` (with and without the residual, with and
// without ReLU), each as f(want, y, a): want is chapter 09's result on device d, y an output of
// in.z's size filled with 1e30 (an element the apply leaves alone shows), a the apply's
// arguments, which write y.
template <class F>
void for_each_apply_choice(const mgpu::Device& d, const ApplyInputs& in, F f) {
  for (const bool with_residual : {false, true})
    for (const bool relu : {false, true}) {
      CAPTURE(with_residual);
      CAPTURE(relu);
      const std::vector<float> want = reference_apply(d, in, with_residual, relu);
      std::vector<float> y(in.z.size(), 1.0e30f);
      const fast::ApplyArgs a = fast::apply_args(in.z.data(), in.C, in.n, in.stats.data(), in.gamma.data(),
                                                 in.beta.data(), with_residual ? in.residual.data() : nullptr, relu,
                                                 y.data());
      f(want, y, a);
    }
}

}  // namespace testing
