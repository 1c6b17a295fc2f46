// The raw kernels of kernels.h, one section each: the host function that fills the kernel's
// arguments (both builds: the tests use it), then, in the cuda build only, the `__global__`
// function and its launcher together. What a thread computes is the MGPU_HD function in
// kernels.h; a kernel here only turns blockIdx and threadIdx into its index.
#include "kernels.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace fast {

using i64 = std::int64_t;

int index_count(i64 n, const char* what) {
  if (n < 0 || n > 0x7fffffff)
    throw mgpu::Error(std::string(what) + ": " + std::to_string(n) +
                      " elements; the raw kernels index with 32-bit ints, so at most 2^31 - 1 (a smaller batch)");
  return static_cast<int>(n);
}

namespace {

using nn::check_channels;  // chapter 09's: the input must have the convolution's channels

#if MGPU_CUDA
// Blocks of kThreads that cover `count` threads, one per index (count < 2^31, so fewer than
// 2^23 blocks: far below the grid's limit of 2^31 - 1).
unsigned blocks_for(int count) { return static_cast<unsigned>((count + kThreads - 1) / kThreads); }

// The index of this thread in a one-dimensional grid: block b's threads take b*kThreads onwards.
// In 32 bits: blockIdx.x * blockDim.x < 2^31 for every grid here.
__device__ inline int global_index() { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }
#endif

}  // namespace

// ---- (a) im2col

Im2colArgs im2col_args(const float* x, ImageShape xs, ConvShape c, float* col) {
  check_channels(xs, c, "im2col_raw");
  const ImageShape zs = nn::conv_output_shape(xs, c);
  index_count(i64(xs.size()), "im2col_raw's input");
  const int count = index_count(nn::conv_col_size(xs, c), "im2col_raw's col");
  return {x, col, xs.batch, xs.height, xs.width, c.kernel, c.stride, c.padding, zs.height, zs.width, count};
}

#if MGPU_CUDA
namespace {
__global__ void im2col_kernel(Im2colArgs a) {
  const int idx = global_index();
  if (idx < a.count) im2col_element(a, idx);
}
}  // namespace

void im2col_raw(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col) {
  const Im2colArgs a = im2col_args(x, xs, c, col);
  if (a.count == 0) return;
  mgpu::check_owned(d, x, sizeof(float) * xs.size(), "im2col_raw (x)");
  mgpu::check_owned(d, col, sizeof(float) * a.count, "im2col_raw (col)");
  mgpu::activate(d);
  im2col_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a);
  MGPU_CHECK_CUDA(cudaGetLastError());
}
#endif

// ---- (b) col2im

Col2imArgs col2im_args(const float* col, ImageShape xs, ConvShape c, float* dx) {
  check_channels(xs, c, "col2im_raw");
  const ImageShape zs = nn::conv_output_shape(xs, c);
  index_count(nn::conv_col_size(xs, c), "col2im_raw's col");
  const int count = index_count(i64(xs.size()), "col2im_raw's dx");
  return {col, dx, xs.batch, xs.height, xs.width, c.kernel, c.stride, c.padding, zs.height, zs.width, count};
}

#if MGPU_CUDA
namespace {
__global__ void col2im_kernel(Col2imArgs a) {
  const int idx = global_index();
  if (idx < a.count) col2im_element(a, idx);
}
}  // namespace

void col2im_raw(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx) {
  const Col2imArgs a = col2im_args(col, xs, c, dx);
  if (a.count == 0) return;
  mgpu::check_owned(d, col, sizeof(float) * nn::conv_col_size(xs, c), "col2im_raw (col)");
  mgpu::check_owned(d, dx, sizeof(float) * a.count, "col2im_raw (dx)");
  mgpu::activate(d);
  col2im_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a);
  MGPU_CHECK_CUDA(cudaGetLastError());
}
#endif

// ---- (c) BatchNorm's per-channel sums

int sums_blocks_per_channel(int channels, i64 n, int sms) {
  if (channels <= 0 || n <= 0) return 1;
  const i64 wanted = 2 * i64(std::max(sms, 1)) * (2048 / kThreads);  // blocks in all: every SM full, twice
  const i64 per_channel = (wanted + channels - 1) / channels;
  const i64 reads = n % 4 == 0 ? n / 4 : n;                      // a thread's reads: Vec4s or floats
  const i64 useful = std::max<i64>(1, reads / (4 * kThreads));  // at least 4 reads a thread
  return static_cast<int>(std::clamp<i64>(std::min(per_channel, useful), 1, kMaxSumBlocks));
}

SumsArgs sums_args(const float* z, int channels, i64 n, int blocks, double* partials, float* sums) {
  index_count(i64(channels) * n, "batch_norm_sums_raw's z");
  if (blocks < 1 || blocks > kMaxSumBlocks)
    throw mgpu::Error("batch_norm_sums_raw: " + std::to_string(blocks) + " blocks per channel, not 1 to " +
                      std::to_string(kMaxSumBlocks));
  return {z, partials, sums, channels, static_cast<int>(n), blocks, n % 4 == 0 && aligned16(z)};
}

#if MGPU_CUDA
namespace {
// Grid (blocks, channels): block (blockIdx.x, c) writes partials[c][blockIdx.x], the sum of its
// kThreads threads' thread_sum. The block's reduction: each warp adds its 32 values with
// shuffles (register to register, no memory), halving the distance each time; lane 0 of each
// warp puts its warp's sum in shared memory; warp 0 adds those 8 the same way.
__global__ void channel_partials_kernel(SumsArgs a) {
  const int c = blockIdx.y, block = blockIdx.x, thread = threadIdx.x;
  double sum = thread_sum(a, c, block, thread);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ double warp_sums[kThreads / 32];
  if (thread % 32 == 0) warp_sums[thread / 32] = sum;
  __syncthreads();
  if (thread < 32) {
    sum = thread < kThreads / 32 ? warp_sums[thread] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (thread == 0) a.partials[c * a.blocks + block] = sum;
  }
}

// One thread per channel: the channel's partials added in block order.
__global__ void finish_channels_kernel(SumsArgs a) {
  const int c = global_index();
  if (c < a.channels) finish_channel(a, c);
}
}  // namespace

int multiprocessors(const Device& d) {
  int sms = 0;
  MGPU_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d.gpu));
  return sms;
}

void batch_norm_sums_raw(const Device& d, const float* z, int channels, i64 n, double* partials, float* sums) {
  if (channels <= 0 || n <= 0) return;
  const int blocks = sums_blocks_per_channel(channels, n, multiprocessors(d));
  const SumsArgs a = sums_args(z, channels, n, blocks, partials, sums);
  mgpu::check_owned(d, z, sizeof(float) * channels * n, "batch_norm_sums_raw (z)");
  mgpu::check_owned(d, partials, sizeof(double) * channels * kMaxSumBlocks, "batch_norm_sums_raw (partials)");
  mgpu::check_owned(d, sums, sizeof(float) * channels, "batch_norm_sums_raw (sums)");
  if (channels > 65535) throw mgpu::Error("batch_norm_sums_raw: more than 65,535 channels (the grid's y)");
  mgpu::activate(d);
  channel_partials_kernel<<<dim3(blocks, channels), kThreads, 0, d.stream>>>(a);
  MGPU_CHECK_CUDA(cudaGetLastError());
  finish_channels_kernel<<<blocks_for(channels), kThreads, 0, d.stream>>>(a);
  MGPU_CHECK_CUDA(cudaGetLastError());
}
#endif

// ---- (d) BatchNorm's apply, fused

ApplyArgs apply_args(const float* z, int channels, i64 n, const float* stats, const float* gamma, const float* beta,
                     const float* residual, bool relu, float* y) {
  const int values = index_count(i64(channels) * n, "batch_norm_apply_raw's z");
  const bool vec4 = n % 4 == 0 && aligned16(z) && aligned16(y) && (!residual || aligned16(residual));
  return {z, stats, gamma, beta, residual, y, channels, static_cast<int>(n), relu, vec4, vec4 ? values / 4 : values};
}

#if MGPU_CUDA
namespace {
__global__ void apply_kernel(ApplyArgs a) {
  const int idx = global_index();
  if (idx < a.count) apply_element(a, idx);
}
__global__ void apply_vec4_kernel(ApplyArgs a) {
  const int q = global_index();
  if (q < a.count) apply_vec4(a, q);
}
}  // namespace

void batch_norm_apply_raw(const Device& d, const float* z, int channels, i64 n, const float* stats, const float* gamma,
                          const float* beta, const float* residual, lenet::Activation act, float* y) {
  const ApplyArgs a = apply_args(z, channels, n, stats, gamma, beta, residual, act == lenet::Activation::Relu, y);
  if (a.count == 0) return;
  const std::size_t bytes = sizeof(float) * channels * n;
  mgpu::check_owned(d, z, bytes, "batch_norm_apply_raw (z)");
  mgpu::check_owned(d, y, bytes, "batch_norm_apply_raw (y)");
  if (residual) mgpu::check_owned(d, residual, bytes, "batch_norm_apply_raw (residual)");
  mgpu::activate(d);
  if (a.vec4)
    apply_vec4_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a);
  else
    apply_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a);
  MGPU_CHECK_CUDA(cudaGetLastError());
}
#endif

}  // namespace fast
