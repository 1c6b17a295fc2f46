// The raw kernels of kernels.h, one section each: the host function that fills the kernel's
// arguments, the kernel, and its launcher. What a thread computes is the MGPU_HD function in
// kernels.h. In the cuda build the kernel is a `__global__` function that turns blockIdx and
// threadIdx into its index; in the cpu build it is a functor of the same name that
// mgpu::for_each_index calls for every index on the device's cores: the same element functions,
// so chapter 09's `--kernels raw` runs (and is tested) on any machine, only not fast.
#include "kernels.h"

#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/parallel.h"  // the cpu build's for_each_index
#include "launch.h"           // the cuda build's blocks_for, global_index, launch_timed

namespace fast {

using i64 = std::int64_t;

int index_count(i64 n, const char* what) {
  if (n < 0 || n > 0x7fffffff)
    throw mgpu::Error(std::string(what) + ": " + std::to_string(n) +
                      " elements; the raw kernels index with 32-bit ints, so at most 2^31 - 1 (a smaller batch)");
  return static_cast<int>(n);
}

Divisor::Divisor(int divisor) : d(divisor) {
  if (divisor < 1) throw mgpu::Error("Divisor: " + std::to_string(divisor) + " is not a positive int");
  while ((std::uint64_t(1) << s) < std::uint64_t(divisor)) ++s;  // the smallest s with 2^s >= d
  // m = floor(2^32 (2^s - d) / d) + 1: below 2^32, since 2^s - d < d
  m = static_cast<unsigned>(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << s) - divisor)) / divisor + 1);
}

namespace {

using nn::check_channels;  // chapter 09's: the input must have the convolution's channels

}  // namespace

// ---- (a) im2col

Im2colArgs im2col_args(const float* x, ImageShape xs, ConvShape c, float* col) {
  check_channels(xs, c, "im2col_raw");
  const ImageShape zs = nn::conv_output_shape(xs, c);
  index_count(i64(xs.size()), "im2col_raw's input");
  const int count = index_count(nn::conv_col_size(xs, c), "im2col_raw's col");
  return {x, col, xs.batch, xs.height, xs.width, c.kernel, c.stride, c.padding, zs.height, zs.width, count,
          Divisor(zs.width), Divisor(zs.height), Divisor(xs.batch), Divisor(c.kernel)};
}

namespace {
#if MGPU_CUDA
__global__ void im2col_kernel(Im2colArgs a) {
  const int idx = global_index();
  if (idx < a.count) im2col_element(a, idx);
}
#else
struct Im2colKernel {
  Im2colArgs a;
  void operator()(i64 idx) const { im2col_element(a, static_cast<int>(idx)); }
};
#endif
}  // namespace

void im2col_raw(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col) {
  const Im2colArgs a = im2col_args(x, xs, c, col);
  if (a.count == 0) return;
  mgpu::check_owned(d, x, sizeof(float) * xs.size(), "im2col_raw (x)");
  mgpu::check_owned(d, col, sizeof(float) * a.count, "im2col_raw (col)");
  // For the profile's GB/s, this chapter's count: x read once, col written once (chapter 09's
  // Im2col counts col twice, read and written).
  const double bytes = sizeof(float) * (double(xs.size()) + a.count);
#if MGPU_CUDA
  launch_timed(d, "Im2colKernel", bytes, [&] { im2col_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a); });
#else
  mgpu::for_each_index(d, a.count, Im2colKernel{a}, bytes);
#endif
}

// ---- (b) col2im

Col2imArgs col2im_args(const float* col, ImageShape xs, ConvShape c, float* dx) {
  check_channels(xs, c, "col2im_raw");
  const ImageShape zs = nn::conv_output_shape(xs, c);
  index_count(nn::conv_col_size(xs, c), "col2im_raw's col");
  const int count = index_count(i64(xs.size()), "col2im_raw's dx");
  return {col, dx, xs.batch, xs.height, xs.width, c.kernel, c.stride, c.padding, zs.height, zs.width, count,
          Divisor(xs.width), Divisor(xs.height), Divisor(xs.batch), Divisor(c.stride)};
}

namespace {
#if MGPU_CUDA
__global__ void col2im_kernel(Col2imArgs a) {
  const int idx = global_index();
  if (idx < a.count) col2im_element(a, idx);
}
#else
struct Col2imKernel {
  Col2imArgs a;
  void operator()(i64 idx) const { col2im_element(a, static_cast<int>(idx)); }
};
#endif
}  // namespace

void col2im_raw(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx) {
  const Col2imArgs a = col2im_args(col, xs, c, dx);
  if (a.count == 0) return;
  const i64 cols = nn::conv_col_size(xs, c);
  mgpu::check_owned(d, col, sizeof(float) * cols, "col2im_raw (col)");
  mgpu::check_owned(d, dx, sizeof(float) * a.count, "col2im_raw (dx)");
  const double bytes = sizeof(float) * (double(cols) + a.count);  // col read once, dx written once
#if MGPU_CUDA
  launch_timed(d, "Col2imKernel", bytes, [&] { col2im_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a); });
#else
  mgpu::for_each_index(d, a.count, Col2imKernel{a}, bytes);
#endif
}

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

namespace {
#if MGPU_CUDA
// The sum of v over the block's kThreads threads, returned to thread 0 (the others get part of
// it). Each warp adds its 32 values with shuffles (register to register, no memory), halving the
// distance each time; lane 0 of each warp puts its warp's sum in shared memory; warp 0 adds those
// 8 the same way. The barrier first lets a block call it twice in a row: no warp writes the
// shared array while warp 0 may still read the previous call's.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  const int thread = threadIdx.x;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  __syncthreads();
  if (thread % 32 == 0) warp_sums[thread / 32] = v;
  __syncthreads();
  if (thread < 32) {
    v = thread < kThreads / 32 ? warp_sums[thread] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Grid (blocks, channels): block (blockIdx.x, c) writes partials[c][blockIdx.x], the sum of its
// kThreads threads' thread_sum.
__global__ void channel_partials_kernel(SumsArgs a) {
  const int c = blockIdx.y, block = blockIdx.x;
  const double sum = block_sum(thread_sum(a, c, block, threadIdx.x));
  if (threadIdx.x == 0) a.partials[c * a.blocks + block] = sum;
}

// One thread per channel: the channel's partials added in block order.
__global__ void finish_channels_kernel(SumsArgs a) {
  const int c = global_index();
  if (c < a.channels) finish_channel(a, c);
}
#else
// Item (c, block): the block's threads' sums added in thread order (a GPU adds them as a tree;
// the sum is the same within rounding).
struct ChannelPartialsKernel {
  SumsArgs a;
  void operator()(i64 item) const {
    const int c = static_cast<int>(item / a.blocks), block = static_cast<int>(item % a.blocks);
    double sum = 0;
    for (int thread = 0; thread < kThreads; ++thread) sum += thread_sum(a, c, block, thread);
    a.partials[item] = sum;  // = partials[c][block]
  }
};
struct FinishChannelsKernel {
  SumsArgs a;
  void operator()(i64 c) const { finish_channel(a, static_cast<int>(c)); }
};
#endif
}  // namespace

int multiprocessors(const Device& d) {
#if MGPU_CUDA
  int sms = 0;
  MGPU_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d.gpu));
  return sms;
#else
  (void)d;
  return 1;  // a CPU device: the plan then gives a channel as few blocks as it may
#endif
}

namespace {
// The blocks per channel of a sums launch on d, the grid being (blocks, channels): refuses more
// channels than a grid's y may hold, naming `name`.
int sums_grid_blocks(const Device& d, int channels, i64 n, const char* name) {
  if (channels > 65535) throw mgpu::Error(std::string(name) + ": more than 65,535 channels (the grid's y)");
  return sums_blocks_per_channel(channels, n, multiprocessors(d));
}
}  // namespace

void batch_norm_sums_raw(const Device& d, const float* z, int channels, i64 n, double* partials, float* sums) {
  if (channels <= 0 || n <= 0) return;
  const int blocks = sums_grid_blocks(d, channels, n, "batch_norm_sums_raw");
  const SumsArgs a = sums_args(z, channels, n, blocks, partials, sums);
  mgpu::check_owned(d, z, sizeof(float) * channels * n, "batch_norm_sums_raw (z)");
  mgpu::check_owned(d, partials, sizeof(double) * channels * kMaxSumBlocks, "batch_norm_sums_raw (partials)");
  mgpu::check_owned(d, sums, sizeof(float) * channels, "batch_norm_sums_raw (sums)");
  const double bytes = sizeof(float) * double(channels) * n;
#if MGPU_CUDA
  launch_timed(d, "ChannelPartialsKernel", bytes,
               [&] { channel_partials_kernel<<<dim3(blocks, channels), kThreads, 0, d.stream>>>(a); });
  launch_timed(d, "FinishChannelsKernel", 0,
               [&] { finish_channels_kernel<<<blocks_for(channels), kThreads, 0, d.stream>>>(a); });
#else
  mgpu::for_each_index(d, i64(channels) * blocks, ChannelPartialsKernel{a}, bytes);
  mgpu::for_each_index(d, channels, FinishChannelsKernel{a});
#endif
}

// ---- (c') BatchNorm's two other sums

namespace {
#if MGPU_CUDA
// As channel_partials_kernel, two sums: partials[0][c][block] and partials[1][c][block].
template <class Term>
__global__ void channel_term_partials_kernel(TermSumsArgs<Term> a) {
  const int c = blockIdx.y, block = blockIdx.x;
  const SumPair mine = thread_term_sums(a, c, block, threadIdx.x);
  const double first = block_sum(mine.first), second = block_sum(mine.second);
  if (threadIdx.x == 0) {
    a.partials[c * a.blocks + block] = first;
    a.partials[(a.channels + c) * a.blocks + block] = second;
  }
}
template <class Term>
__global__ void finish_term_channels_kernel(TermSumsArgs<Term> a) {
  const int c = global_index();
  if (c < a.channels) finish_term_channel(a, c);
}
#else
template <class Term>
struct ChannelTermPartialsKernel {  // item (c, block), its threads in order
  TermSumsArgs<Term> a;
  void operator()(i64 item) const {
    const int c = static_cast<int>(item / a.blocks), block = static_cast<int>(item % a.blocks);
    SumPair sum;
    for (int thread = 0; thread < kThreads; ++thread) {
      const SumPair v = thread_term_sums(a, c, block, thread);
      sum.first += v.first;
      sum.second += v.second;
    }
    a.partials[item] = sum.first;
    a.partials[i64(a.channels) * a.blocks + item] = sum.second;
  }
};
template <class Term>
struct FinishTermChannelsKernel {
  TermSumsArgs<Term> a;
  void operator()(i64 c) const { finish_term_channel(a, static_cast<int>(c)); }
};
#endif

// The launch both two-sum functions share: `name` for the profile, `values` floats read per value.
template <class Term>
void term_sums(const Device& d, const char* name, int values, Term term, int channels, i64 n, double* partials,
               float* first, float* second, float* dgamma, float* dbeta) {
  if (channels <= 0 || n <= 0) return;
  index_count(i64(channels) * n, name);
  const int blocks = sums_grid_blocks(d, channels, n, name);
  mgpu::check_owned(d, partials, sizeof(double) * 2 * channels * kMaxSumBlocks, name);
  const TermSumsArgs<Term> a{term, partials, first, second, dgamma, dbeta, channels, static_cast<int>(n), blocks};
  const double bytes = sizeof(float) * double(values) * channels * n;
#if MGPU_CUDA
  launch_timed(d, name, bytes,
               [&] { channel_term_partials_kernel<<<dim3(blocks, channels), kThreads, 0, d.stream>>>(a); });
  launch_timed(d, "FinishTermChannelsKernel", 0,
               [&] { finish_term_channels_kernel<<<blocks_for(channels), kThreads, 0, d.stream>>>(a); });
#else
  mgpu::for_each_index(d, i64(channels) * blocks, ChannelTermPartialsKernel<Term>{a}, bytes);
  mgpu::for_each_index(d, channels, FinishTermChannelsKernel<Term>{a});
#endif
}
}  // namespace

void batch_norm_square_sums_raw(const Device& d, const float* z, int channels, i64 n, double count, double* partials,
                                float* sums) {
  if (!(count >= 1)) throw mgpu::Error("batch_norm_square_sums_raw: no values to normalize over");
  mgpu::check_owned(d, z, sizeof(float) * channels * n, "batch_norm_square_sums_raw (z)");
  mgpu::check_owned(d, sums, sizeof(float) * 2 * channels, "batch_norm_square_sums_raw (sums)");
  term_sums(d, "CenteredSquarePartialsKernel", 1, CenteredSquareTerm{z, sums, count}, channels, n, partials,
            sums + channels, nullptr, nullptr, nullptr);
}

void batch_norm_backward_sums_raw(const Device& d, const float* dy, const float* z, int channels, i64 n,
                                  const float* stats, double* partials, float* sums, float* dgamma, float* dbeta) {
  const std::size_t size = sizeof(float) * channels * n;
  mgpu::check_owned(d, dy, size, "batch_norm_backward_sums_raw (dy)");
  mgpu::check_owned(d, z, size, "batch_norm_backward_sums_raw (z)");
  mgpu::check_owned(d, sums, sizeof(float) * 2 * channels, "batch_norm_backward_sums_raw (sums)");
  term_sums(d, "GradXhatPartialsKernel", 2, GradXhatTerm{dy, z, stats, channels}, channels, n, partials, sums,
            sums + channels, dgamma, dbeta);
}

// ---- (d) BatchNorm's apply, fused

ApplyArgs apply_args(const float* z, int channels, i64 n, const float* stats, const float* gamma, const float* beta,
                     const float* residual, bool relu, float* y) {
  const int values = index_count(i64(channels) * n, "batch_norm_apply_raw's z");
  const bool vec4 = n % 4 == 0 && aligned16(z) && aligned16(y) && (!residual || aligned16(residual));
  return {z, stats, gamma, beta, residual, y, channels, static_cast<int>(n), relu, vec4, vec4 ? values / 4 : values};
}

namespace {
#if MGPU_CUDA
__global__ void apply_kernel(ApplyArgs a) {
  const int idx = global_index();
  if (idx < a.count) apply_element(a, idx);
}
__global__ void apply_vec4_kernel(ApplyArgs a) {
  const int q = global_index();
  if (q < a.count) apply_vec4(a, q);
}
#else
struct ApplyKernel {
  ApplyArgs a;
  void operator()(i64 idx) const { apply_element(a, static_cast<int>(idx)); }
};
struct ApplyVec4Kernel {
  ApplyArgs a;
  void operator()(i64 q) const { apply_vec4(a, static_cast<int>(q)); }
};
#endif
}  // namespace

void batch_norm_apply_raw(const Device& d, const float* z, int channels, i64 n, const float* stats, const float* gamma,
                          const float* beta, const float* residual, lenet::Activation act, float* y) {
  const ApplyArgs a = apply_args(z, channels, n, stats, gamma, beta, residual, act == lenet::Activation::Relu, y);
  if (a.count == 0) return;
  const std::size_t size = sizeof(float) * channels * n;
  mgpu::check_owned(d, z, size, "batch_norm_apply_raw (z)");
  mgpu::check_owned(d, y, size, "batch_norm_apply_raw (y)");
  if (residual) mgpu::check_owned(d, residual, size, "batch_norm_apply_raw (residual)");
  const double bytes = double(size) * (residual ? 3 : 2);
#if MGPU_CUDA
  if (a.vec4)
    launch_timed(d, "ApplyVec4Kernel", bytes,
                 [&] { apply_vec4_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a); });
  else
    launch_timed(d, "ApplyKernel", bytes, [&] { apply_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a); });
#else
  if (a.vec4)
    mgpu::for_each_index(d, a.count, ApplyVec4Kernel{a}, bytes);
  else
    mgpu::for_each_index(d, a.count, ApplyKernel{a}, bytes);
#endif
}

}  // namespace fast
