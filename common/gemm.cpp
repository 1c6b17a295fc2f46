#include "gemm.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "memory.h"   // BlasRoom
#include "profile.h"

#if !MGPU_CUDA
#include <cblas.h>
#include <omp.h>

#include "cpu_stream.h"
#endif

namespace mgpu {

namespace {
// Each device's GEMM precision, by device id (ids are never reused: a new device starts at the
// default, Fp32). Written before a training queues work, read by every gemm call.
std::mutex precision_mutex;
std::unordered_map<int, GemmPrecision> precision_by_device;
}  // namespace

const char* to_string(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::Fp32: return "fp32";
    case GemmPrecision::Tf32: return "tf32";
    case GemmPrecision::Bf16: return "bf16";
  }
  return "?";
}

std::optional<GemmPrecision> gemm_precision_named(const std::string& word) {
  for (GemmPrecision p : {GemmPrecision::Fp32, GemmPrecision::Tf32, GemmPrecision::Bf16})
    if (word == to_string(p)) return p;
  return std::nullopt;
}

void set_gemm_precision(const DeviceSet& devices, GemmPrecision p) {
  std::lock_guard<std::mutex> lock(precision_mutex);
  for (int i = 0; i < devices.size(); ++i) precision_by_device[devices[i].id] = p;
}

GemmPrecision gemm_precision(const Device& d) {
  std::lock_guard<std::mutex> lock(precision_mutex);
  const auto it = precision_by_device.find(d.id);
  return it == precision_by_device.end() ? GemmPrecision::Fp32 : it->second;
}

void gemm(const Device& d, Transpose ta, Transpose tb, int M, int N, int K, float alpha,
          const float* A, const float* B, float beta, float* C) {
  // Leading dimensions of row-major storage: the length of a stored row. BLAS wants at least 1
  // even where a row is empty (K = 0, a product over no images, which leaves beta * C): cuBLAS
  // refuses a 0 there. No element is read at all then, so 1 is as good as any.
  gemm(d, ta, tb, M, N, K, alpha, A, std::max(1, ta == Transpose::No ? K : M), B,
       std::max(1, tb == Transpose::No ? N : K), beta, C, std::max(1, N));
}

void gemm(const Device& d, Transpose ta, Transpose tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M < 0 || N < 0 || K < 0)
    throw Error("gemm: negative size M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K));
  if (M == 0 || N == 0) return;
  // A stored [rows x cols] block needs a row length of at least cols.
  const int a_rows = ta == Transpose::No ? M : K, a_cols = ta == Transpose::No ? K : M;
  const int b_rows = tb == Transpose::No ? K : N, b_cols = tb == Transpose::No ? N : K;
  if (lda < std::max(1, a_cols) || ldb < std::max(1, b_cols) || ldc < N)
    throw Error("gemm: row lengths lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) + " ldc=" +
                std::to_string(ldc) + " are shorter than the blocks' rows (" + std::to_string(a_cols) + ", " +
                std::to_string(b_cols) + ", " + std::to_string(N) + ")");
  // All three matrices must be d's own memory (a GPU cannot multiply another GPU's arrays
  // without peer access, which this repository never relies on). A block's bytes run from its
  // first element to its last: every row but the last at its full stored length.
  const auto bytes = [](int rows, int cols, int ld) {
    return (std::size_t(rows - 1) * std::size_t(ld) + std::size_t(cols)) * sizeof(float);
  };
  if (K > 0) {
    check_owned(d, A, bytes(a_rows, a_cols, lda), "gemm (A)");
    check_owned(d, B, bytes(b_rows, b_cols, ldb), "gemm (B)");
  }
  check_owned(d, C, bytes(M, N, ldc), "gemm (C)");
  // Named by its shape in a profile: each of LeNet's products is its own row.
  KernelProfile* profile = KernelProfile::of(d);
  const GemmPrecision precision = kCudaBackend ? gemm_precision(d) : GemmPrecision::Fp32;  // no lookup on a CPU
  const int call = profile ? profile->begin("gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                                std::to_string(K) + (ta == Transpose::Yes ? " T" : " N") +
                                                (tb == Transpose::Yes ? "T" : "N") +
                                                (precision == GemmPrecision::Fp32 ? "" : std::string(" ") + to_string(precision)),
                                            2.0 * M * N * K, 4.0 * (double(M) * K + double(K) * N + 2.0 * M * N))
                          : -1;
#if MGPU_CUDA
  // cuBLAS is column-major. A row-major C is a column-major C^T, and C^T = op(B)^T op(A)^T:
  // so we ask cuBLAS for that product, with A and B swapped, and nothing is copied.
  const cublasOperation_t opA = ta == Transpose::No ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t opB = tb == Transpose::No ? CUBLAS_OP_N : CUBLAS_OP_T;
  activate(d);
  if (precision == GemmPrecision::Fp32) {
    MGPU_CHECK_CUBLAS(cublasSgemm(d.blas, opB, opA, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
  } else {  // the same product, with fp32 arrays the tensor cores may read in fewer bits
    const cublasComputeType_t compute =
        precision == GemmPrecision::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_FAST_16BF;
    MGPU_CHECK_CUBLAS(cublasGemmEx(d.blas, opB, opA, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta,
                                   C, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
  }
  if (profile) profile->end(call);
#else
  const CBLAS_TRANSPOSE opA = ta == Transpose::No ? CblasNoTrans : CblasTrans;
  const CBLAS_TRANSPOSE opB = tb == Transpose::No ? CblasNoTrans : CblasTrans;
  cpu::stream_of(d).submit([=] {
    // Inside a lane OpenBLAS runs on the lane's thread alone (it sees the parallel region).
    // Outside, it forks its own OpenMP threads; Debian's OpenBLAS keeps one set of buffers for
    // that, so two devices' workers must not do it at the same time.
    static std::mutex one_multithreaded_call_at_a_time;
    std::unique_lock<std::mutex> lock(one_multithreaded_call_at_a_time, std::defer_lock);
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (threads > 1) lock.lock();
    // OpenBLAS may map a buffer for a product more than ever computed at once, and a mapping
    // that fails would hang it: under ulimit -v the room is asked for first (common/memory.h).
    const BlasRoom room;
    run_timed(profile, call, [&] { cblas_sgemm(CblasRowMajor, opA, opB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
  });
#endif
}

}  // namespace mgpu
