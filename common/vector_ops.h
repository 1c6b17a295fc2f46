// The element-wise kernels over float vectors that every chapter's training step runs: taught in
// chapter 01 (chapters/01_lenet/README.md, "What graduates to common/") and kept here once
// chapters 02-09 need them, as d2l's #@save keeps a function in its library. n counts floats;
// every pointer is memory of the device d the kernel is queued on.
#pragma once
#include <cstdint>

#include "device.h"

namespace mgpu {

// SGD: p -= scale * g over n elements (scale = lr / batch size, as d2l's sgd()).
void sgd_update(const Device& d, float* p, const float* g, std::int64_t n, float scale);

// p = value over n elements.
void fill(const Device& d, float* p, std::int64_t n, float value);

// dst += src over n elements (summing gradients: lanes in chapter 01, devices from chapter 02 on).
// Both must be memory of d: refused otherwise (check_owned), in both builds.
void add_into(const Device& d, float* dst, const float* src, std::int64_t n);

}  // namespace mgpu
