// The optimizers with state that chapter 11 teaches (chapters/11_sharded_data_parallel/README.md),
// kept here because every later chapter trains with them: AdamW, SGD with momentum, and clipping
// by the global gradient norm, each written out as PyTorch computes it (torch.optim.AdamW,
// torch.optim.SGD(momentum=...), torch.nn.utils.clip_grad_norm_), so that the same inputs give
// the same floats to within rounding (tests/test_optimizer.cpp holds them to PyTorch's own).
//
// Every update is element-wise: element i of the parameters changes with element i of the
// gradient and of the state alone. That is what lets ZeRO cut the optimizer state into k
// shards: a device that holds elements [b, e) of p, g, m and v can take its part of the step
// without seeing any other element. n counts floats; every pointer is memory of device d.
#pragma once
#include <cstdint>

#include "device.h"

namespace mgpu {

// torch.optim.AdamW's hyperparameters, with its defaults. Doubles, as PyTorch's are (Python
// numbers): the host computes the bias corrections in double, the kernel gets floats.
struct AdamWSettings {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p shrinks by lr * weight_decay, outside the moments
};

// One AdamW step over n elements; `step` counts from 1 (the bias corrections 1 - beta^step):
//   g' = grad_scale * g                              (clipping's factor, or 1 / batch size)
//   p  = p * (1 - lr * weight_decay)
//   m  = beta1 m + (1 - beta1) g'                    the first moment, [n]
//   v  = beta2 v + (1 - beta2) g'^2                  the second moment, [n]
//   p  = p - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// m and v start at zero (8 bytes of state per parameter, the 8 of ZeRO's 16).
void adamw_update(const Device& d, float* p, const float* g, float* m, float* v, std::int64_t n,
                  const AdamWSettings& s, long step, float grad_scale = 1.0f);

// torch.optim.SGD's hyperparameters with momentum (no dampening, not Nesterov).
struct SgdMomentumSettings {
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0.0;  // coupled, as SGD's: added to the gradient
};

// One step of SGD with momentum over n elements:
//   g'  = grad_scale * g + weight_decay * p
//   buf = g' on the first step (PyTorch clones the first gradient), else momentum * buf + g'
//   p   = p - lr * buf
// buf: 4 bytes of state per parameter.
void sgd_momentum_update(const Device& d, float* p, const float* g, float* buf, std::int64_t n,
                         const SgdMomentumSettings& s, bool first_step, float grad_scale = 1.0f);

// The sum of g[i]^2 over n elements, accumulated in double. Waits for d (the host needs the
// number). A model's squared norm is the sum of its pieces' sums: over tensors, or, with the
// gradients sharded, over devices (chapter 11), which is why this returns the square.
double sum_of_squares(const Device& d, const float* g, std::int64_t n);

// clip_grad_norm_'s factor for a gradient of norm `total_norm`: max_norm / (total_norm + 1e-6),
// at most 1 (a gradient within the bound is left as it is). Refuses max_norm <= 0.
float clip_coefficient(double total_norm, float max_norm);

}  // namespace mgpu
