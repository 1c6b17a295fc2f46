// Matrix products: the one call every layer leans on, backed by cuBLAS or OpenBLAS.
#pragma once
#include "device.h"

namespace mgpu {

enum class Transpose { No, Yes };

// C = alpha * op(A) * op(B) + beta * C, every matrix row-major (C-style, as all arrays here):
//   op(A) is [M x K], op(B) is [K x N], C is [M x N].
// A is stored [M x K] when ta == No and [K x M] when ta == Yes; likewise B.
// beta = 1 accumulates into C (how gradients add up over chunks of a batch).
void gemm(const Device& d, Transpose ta, Transpose tb, int M, int N, int K, float alpha,
          const float* A, const float* B, float beta, float* C);

// Whether the devices' GEMMs may read their fp32 inputs as TF32 (10-bit mantissa) on a GPU's
// tensor cores, cuBLAS's CUBLAS_TF32_TENSOR_OP_MATH; off is plain fp32. The math mode belongs to
// each device's cuBLAS handle, so it holds for every later GEMM on these devices until set
// again: set it, both ways, wherever a training chooses. The cpu build computes fp32 either way.
void use_tf32(const DeviceSet& devices, bool on);

}  // namespace mgpu
