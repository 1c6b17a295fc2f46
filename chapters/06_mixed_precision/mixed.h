// LeNet's forward and backward passes with the matrix products in 16 bits (or tf32), and the
// kernels mixed precision needs around them. Chapter 01's layers do the work; what is new is
// WHERE values are rounded:
//
//   every GEMM input is rounded to the precision: the working copy of the weights (rounded
//   from the fp32 master weights once a step), the images, and each activation or activation
//   gradient a GEMM reads. The GEMM itself multiplies and accumulates in fp32, as tensor cores
//   do (cublasGemmEx with 16-bit inputs and CUBLAS_COMPUTE_32F): a product of two 16-bit
//   numbers is exact in fp32, so "round the inputs, then sgemm" IS that arithmetic, up to the
//   order of the additions. The bias adds, ReLU, pooling, softmax and the loss stay fp32, as
//   PyTorch's autocast keeps them.
//
// The activations a GEMM reads are rounded in place, so the stored copy the backward pass
// reads is the 16-bit one (AMP keeps those in 16-bit memory; here they keep the values but not
// yet the smaller memory, see the README's exercises).
#pragma once
#include <cstdint>

#include "../01_lenet/lenet.h"  // chapter 01's LeNet: the model this chapter trains in 16 bits
#include "formats.h"

namespace mixed {

using mgpu::Device;

// ---- Element-wise kernels (queued on d, as every kernel) ----------------------------------
// x[i] = round_to(p, x[i]) over n elements.
void round_in_place(const Device& d, Precision p, float* x, std::int64_t n);
// dst[i] = round_to(p, src[i]): the 16-bit working copy of the fp32 master weights.
void copy_rounded(const Device& d, Precision p, const float* src, float* dst, std::int64_t n);
// x[i] = round_to(p, scale * x[i]): a loss gradient, scaled (loss scaling) and made 16-bit.
void scale_and_round(const Device& d, Precision p, float* x, std::int64_t n, float scale);
// dst[i] = encode16(p, src[i]) and back (p is BF16 or FP16): a gradient to and from the wire.
void encode(const Device& d, Precision p, const float* src, std::uint16_t* dst, std::int64_t n);
void decode(const Device& d, Precision p, const std::uint16_t* src, float* dst, std::int64_t n);
// dst[i] += src[i] on 16-bit values (p is BF16 or FP16): a 16-bit ring's add. The two are
// added in fp32 and the sum rounded to p once.
void add_encoded(const Device& d, Precision p, std::uint16_t* dst, const std::uint16_t* src, std::int64_t n);
// GradScaler.unscale_: g[i] *= inv_scale, and *found_inf = 1 if any g[i] is inf or NaN, else 0.
// found_inf is one float on d (many threads may write 1 to it at once: all write the same).
void unscale_and_check(const Device& d, float* g, std::int64_t n, float inv_scale, float* found_inf);

// ---- LeNet in mixed precision (compare lenet::forward and lenet::backward) ----------------
// w: the working weights, already rounded to p (copy_rounded); x: images already rounded to p.
void forward(const Device& d, Precision p, lenet::Params& w, lenet::Workspace& ws, const float* x, int n);
// After forward() and lenet::loss(..., with_gradient = true): ADDS into g the gradient of
// loss_scale times the summed loss. Activation gradients are rounded to p before each GEMM
// reads them, so in fp16 a gradient too small for 16 bits becomes 0 (underflow) and one
// larger than 65504 becomes inf (overflow): what loss scaling manages.
void backward(const Device& d, Precision p, lenet::Params& w, lenet::Params& g, lenet::Workspace& ws, int n,
              float loss_scale);

// lenet::accumulate_gradients in precision p: the n examples x [n][28][28], y [n] cut into
// chunks over the lanes; the (scaled) gradient ADDED into g, loss and accuracy into m.
// g must be stored Flat (the lanes' gradients are summed into it with one kernel).
void accumulate_gradients(const Device& d, Precision p, float loss_scale, lenet::Params& w, lenet::Params& g,
                          lenet::Lanes& lanes, const float* x, const std::int32_t* y, int n, mgpu::Metrics& m);

// Fraction of `data` (pixels already rounded to p) that the working weights w classify right.
double evaluate_accuracy(const Device& d, Precision p, lenet::Params& w, lenet::Lanes& lanes,
                         const mgpu::DeviceImages& data);

}  // namespace mixed
