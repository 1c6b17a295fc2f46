// Matrix products: the one call every layer leans on, backed by cuBLAS or OpenBLAS.
#pragma once
#include <optional>
#include <string>

#include "device.h"

namespace mgpu {

enum class Transpose { No, Yes };

// C = alpha * op(A) * op(B) + beta * C, every matrix row-major (C-style, as all arrays here):
//   op(A) is [M x K], op(B) is [K x N], C is [M x N].
// A is stored [M x K] when ta == No and [K x M] when ta == Yes; likewise B.
// beta = 1 accumulates into C (how gradients add up over chunks of a batch).
void gemm(const Device& d, Transpose ta, Transpose tb, int M, int N, int K, float alpha,
          const float* A, const float* B, float beta, float* C);
// The same on blocks of larger matrices: lda, ldb, ldc are the stored row lengths of the arrays
// A, B and C are blocks of (at least the block's own row length). The form above passes each
// block's own, the matrices being whole. (Chapter 10's tiled convolution writes a few images'
// columns of a [Cout][B*Ho*Wo] output: ldc = B*Ho*Wo.)
void gemm(const Device& d, Transpose ta, Transpose tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// What a device's GEMMs do with their fp32 inputs on a GPU (the arrays stay fp32 in memory):
//   Fp32  multiply them as they are: cublasSgemm (the default)
//   Tf32  let the tensor cores read them as TF32 (10-bit mantissa; fp32 accumulation):
//         cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32
//   Bf16  let the tensor cores read them as bf16 (7-bit mantissa; fp32 accumulation), or as TF32
//         where cuBLAS finds that faster: CUBLAS_COMPUTE_32F_FAST_16BF. The arithmetic of chapter
//         06's bf16 GEMMs, at the tensor cores' rate.
// The cpu build multiplies in fp32 whatever is set: its BLAS has no such mode.
enum class GemmPrecision { Fp32, Tf32, Bf16 };
const char* to_string(GemmPrecision p);  // "fp32", "tf32", "bf16"
// The precision named by to_string's word, or nullopt for any other word.
std::optional<GemmPrecision> gemm_precision_named(const std::string& word);
// What this build's GEMMs do when asked for p: p in the cuda build, Fp32 in the cpu build.
constexpr GemmPrecision precision_in_this_build(GemmPrecision p) { return kCudaBackend ? p : GemmPrecision::Fp32; }

// Sets the precision of every later GEMM on these devices (and on their side streams) until set
// again; a new DeviceSet's devices start at Fp32. Set it before queueing work on the devices.
void set_gemm_precision(const DeviceSet& devices, GemmPrecision p);
GemmPrecision gemm_precision(const Device& d);

}  // namespace mgpu
