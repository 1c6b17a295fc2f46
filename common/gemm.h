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

}  // namespace mgpu
