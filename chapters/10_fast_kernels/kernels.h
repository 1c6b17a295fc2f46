// Chapter 10's raw CUDA kernels: four of chapter 09's kernels written again as plain
// `__global__` functions, each with its own launch configuration and 32-bit index arithmetic:
//   (a) im2col                          nn::im2col, one thread per element of col
//   (b) col2im                          nn::col2im, one thread per pixel of dx (a gather)
//   (c) BatchNorm's per-channel sums    nn::batch_norm_sums, many blocks per channel, a block
//                                       reduction, then a small kernel that adds the blocks'
//                                       partial sums in a fixed order; (c') the same plan for
//                                       the square sums and the backward's two sums
//   (d) BatchNorm's fused apply         nn::batch_norm_apply, four values per thread (float4)
//                                       where the row length allows
// Each must give what chapter 09's version gives: the same bits for (a), (b) and (d), whose
// arithmetic runs in the same order; (c) adds in another order, to within 1e-6 of the channel's
// sum of |z| (test_fast_kernels, and the benchmark's check, say so element by element).
//
// How the code is cut. What one thread computes is an `MGPU_HD` function of a flat 32-bit index
// and a struct of arguments (im2col_element(const Im2colArgs&, int idx), ...), here in the header,
// written once for both builds: a cpu test calls it for every index and compares with chapter
// 09's result, which checks the index arithmetic on any machine, under the sanitizers too. What
// only a GPU runs (the `__global__` function that computes idx from blockIdx and threadIdx, and
// the launcher that picks the grid) sits in kernels.cu, one `#if MGPU_CUDA` block per kernel
// right after the host function that fills its arguments. In the cpu build the launchers run
// the same element functions on the CPU, so everything that calls them runs everywhere.
//
// Layouts are chapter 09's (layers.h): activations [C][B][H][W], so one channel of the batch is
// one contiguous row of n = B*H*W values; col [Cin*k*k][B*Ho*Wo].
#pragma once
#include <cstdint>
#include <cstring>

#include "../09_resnet/layers.h"  // nn::ConvShape, conv_output_shape: the shapes and the references
#include "common/backend.h"         // MGPU_HD, MGPU_CUDA
#include "common/device.h"          // Device, Buffer
#include "common/exercise.h"        // the student copy's holes call mgpu::exercise_not_done

namespace fast {

using lenet::ImageShape;
using mgpu::Device;
using nn::ConvShape;

// Every index here is an int: 32-bit arithmetic, which a GPU does in a few instructions where a
// 64-bit division is a long software routine. So every buffer a kernel indexes must hold fewer
// than 2^31 elements; this returns n as an int, or throws mgpu::Error naming `what`.
int index_count(std::int64_t n, const char* what);

// Threads per block of every kernel here: 8 warps. An H100 SM holds up to 2,048 threads, so 8
// such blocks at once; small enough that a short grid still spreads over every SM.
constexpr int kThreads = 256;

// Four floats read or written as one 16-byte access (a GPU's widest per thread: one instruction
// instead of four). On the host a memcpy, which is how C++ reads a float array as another type.
struct alignas(16) Vec4 {
  float x, y, z, w;
};
MGPU_HD inline Vec4 load4(const float* p) {
#ifdef __CUDA_ARCH__
  const float4 v = *reinterpret_cast<const float4*>(p);
  return {v.x, v.y, v.z, v.w};
#else
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
MGPU_HD inline void store4(float* p, Vec4 v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<float4*>(p) = make_float4(v.x, v.y, v.z, v.w);
#else
  std::memcpy(p, &v, sizeof v);
#endif
}
// Whether p may be read as Vec4s (16-byte aligned; cudaMalloc gives 256).
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// A division by a number that is fixed for a whole launch (a side, the batch, the kernel size),
// in three instructions instead of about twenty. A GPU has no integer divide instruction: n / d
// compiles to a short routine, and the first version of im2col below, with five of them per
// element, ran at 18% of an H200's copy rate, bound by that arithmetic rather than by memory.
// The host precomputes a multiplier m and a shift s for d; then, for every 0 <= n < 2^31,
//     n / d == (mulhi(n, m) + n) >> s,   mulhi = the high 32 bits of the 64-bit product n * m
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994; s is
// the smallest with 2^s >= d, and m + 2^32 = floor(2^(32+s) / d) + 1 rounds 1/d up just enough).
// test_fast_kernels checks it against `/` for every divisor a ResNet uses, and many others.
struct Divisor {
  int d = 1;
  unsigned m = 1;
  int s = 0;
  Divisor() = default;
  explicit Divisor(int divisor);  // 1 <= divisor < 2^31, else mgpu::Error
  MGPU_HD int div(int n) const {  // n / d, for 0 <= n < 2^31
#ifdef __CUDA_ARCH__
    const unsigned hi = __umulhi(static_cast<unsigned>(n), m);
#else
    const unsigned hi = static_cast<unsigned>((std::uint64_t(static_cast<unsigned>(n)) * m) >> 32);
#endif
    return static_cast<int>((hi + static_cast<unsigned>(n)) >> s);
  }
  // Returns n / d and sets rem = n % d: a flat index unpacked one dimension at a time.
  MGPU_HD int divmod(int n, int& rem) const {
    const int q = div(n);
    rem = n - q * d;
    return q;
  }
};

// ---- (a) im2col: col[r][b][oy][ox] = x[c][b][oy*s + ky - p][ox*s + kx - p], 0 in the padding,
// with r = (c*k + ky)*k + kx (layers.h).
struct Im2colArgs {
  const float* x;  // [Cin][B][H][W]
  float* col;      // [Cin*k*k][B][Ho][Wo]
  int B, H, W, k, s, p, Ho, Wo;
  int count;  // col's elements: one thread each
  Divisor by_Wo, by_Ho, by_B, by_k;  // Wo, Ho, B and k as Divisors: the index's unpacking
};
Im2colArgs im2col_args(const float* x, ImageShape xs, ConvShape c, float* col);

// Thread idx writes col's element idx: neighbouring threads write neighbouring addresses (one
// warp, 32 floats in a row: a coalesced store), and read neighbouring pixels of one input row
// (s apart). The index is unpacked from the innermost dimension out, one Divisor each.
MGPU_HD inline void im2col_element(const Im2colArgs& a, int idx) {
  // BEGIN EXERCISE ex10.im2col_element
  int ox, oy, b, kx, ky;
  int t = a.by_Wo.divmod(idx, ox);
  t = a.by_Ho.divmod(t, oy);
  t = a.by_B.divmod(t, b);  // t = r = (c*k + ky)*k + kx
  t = a.by_k.divmod(t, kx);
  const int c = a.by_k.divmod(t, ky);
  const int y = oy * a.s + ky - a.p, x = ox * a.s + kx - a.p;  // the input pixel, maybe in the padding
  const bool inside = y >= 0 && y < a.H && x >= 0 && x < a.W;
  a.col[idx] = inside ? a.x[((c * a.B + b) * a.H + y) * a.W + x] : 0.0f;
  // END EXERCISE ex10.im2col_element
}

// ---- (b) col2im: dx[c][b][y][x] = the sum of the col entries that copied x[c][b][y][x].
struct Col2imArgs {
  const float* col;  // [Cin*k*k][B][Ho][Wo]
  float* dx;         // [Cin][B][H][W]
  int B, H, W, k, s, p, Ho, Wo;
  int count;  // dx's elements: one thread each
  Divisor by_W, by_H, by_B, by_s;  // W, H, B and the stride as Divisors
};
Col2imArgs col2im_args(const float* col, ImageShape xs, ConvShape c, float* dx);

// Thread idx owns pixel idx of dx and gathers its terms: window row ky saw pixel row y at output
// row oy where oy*s = y + p - ky, so only every s-th ky can (ky = (y + p) % s, then + s), and
// likewise kx. The terms are added in the order (ky, kx) ascending, from 0.0f, as nn::col2im
// adds them: the same bits.
MGPU_HD inline void col2im_element(const Col2imArgs& a, int idx) {
  // BEGIN EXERCISE ex10.col2im_element
  int x, y, b;
  int t = a.by_W.divmod(idx, x);
  t = a.by_H.divmod(t, y);
  const int c = a.by_B.divmod(t, b);
  float sum = 0.0f;
  int ky0, kx0;  // the first window row (column) that can have seen this pixel: (y + p) % s
  a.by_s.divmod(y + a.p, ky0);
  a.by_s.divmod(x + a.p, kx0);
  for (int ky = ky0; ky < a.k && ky <= y + a.p; ky += a.s) {
    const int oy = a.by_s.div(y + a.p - ky);  // exact: y + p - ky is a multiple of s
    if (oy >= a.Ho) continue;                 // a window below the last output row
    // = &col[(c*k + ky)*k + 0][b][oy][0]; window column kx adds k*B*Ho*Wo rows further on
    const float* row = a.col + (((c * a.k + ky) * a.k * a.B + b) * a.Ho + oy) * a.Wo;
    for (int kx = kx0; kx < a.k && kx <= x + a.p; kx += a.s) {
      const int ox = a.by_s.div(x + a.p - kx);
      if (ox >= a.Wo) continue;
      sum += row[kx * a.B * a.Ho * a.Wo + ox];
    }
  }
  a.dx[idx] = sum;
  // END EXERCISE ex10.col2im_element
}

// ---- (c) BatchNorm's per-channel sums: sums[c] = sum over j of z[c][j] (nn::batch_norm_sums).
//
// Chapter 09 cuts each channel into 128 slices, one thread each: 8,192 threads for 64 channels,
// a few per SM of an H100's 132 (which holds 2,048 each), each walking its slice 128 floats at a
// time. Here each channel gets `blocks` blocks of kThreads threads (sums_blocks_per_channel: enough
// for about two full loads of the GPU), each thread adds its share of the row in double, the
// block adds its threads' sums (warp shuffles, then shared memory) into partials[c][block], and a
// second kernel, one thread per channel, adds a channel's partials in block order. No atomics:
// the result is the same on every run.
struct SumsArgs {
  const float* z;     // [C][n]
  double* partials;   // [C][blocks]
  float* sums;        // [C]
  int channels, n;
  int blocks;         // per channel
  bool vec4;          // n % 4 == 0 and z 16-byte aligned: each row is read as n/4 Vec4s
};
// The most blocks a channel gets: the scratch for partials is channels * kMaxSumBlocks doubles.
constexpr int kMaxSumBlocks = 256;
// Blocks per channel for `channels` rows of n values on a GPU with `sms` multiprocessors: about
// 2 * sms * (2048 / kThreads) blocks in all, so that every SM is full twice over, but never so many
// that a thread gets fewer than 4 reads, and from 1 to kMaxSumBlocks.
int sums_blocks_per_channel(int channels, std::int64_t n, int sms);
// partials must hold channels * blocks doubles.
SumsArgs sums_args(const float* z, int channels, std::int64_t n, int blocks, double* partials, float* sums);

// What thread `thread` of block `block` of channel c adds up: its reads are block*kThreads +
// thread, then every blocks*kThreads further on, so a warp reads 32 neighbouring floats (or
// Vec4s) at a time.
MGPU_HD inline double thread_sum(const SumsArgs& a, int c, int block, int thread) {
  const float* row = a.z + c * a.n;  // c * n < 2^31: index_count checked channels * n
  const int step = a.blocks * kThreads;
  double sum = 0;
  if (a.vec4) {
    for (int q = block * kThreads + thread; q < a.n / 4; q += step) {
      const Vec4 v = load4(row + 4 * q);
      sum += v.x;
      sum += v.y;
      sum += v.z;
      sum += v.w;
    }
  } else {
    for (int j = block * kThreads + thread; j < a.n; j += step) sum += row[j];
  }
  return sum;
}
// Channel c's sum from its blocks' partials, added in block order: deterministic.
MGPU_HD inline void finish_channel(const SumsArgs& a, int c) {
  double sum = 0;
  for (int block = 0; block < a.blocks; ++block) sum += a.partials[c * a.blocks + block];
  a.sums[c] = float(sum);
}

// ---- (c') BatchNorm's two other sums, in the same plan: two sums at once, of a term per value.
//   square sums (forward pass 2):  sums[1][c] = sum (z - mean)^2, mean = sums[0][c] / count
//                                  (nn::batch_norm_square_sums)
//   backward sums:                 (sum dy, sum dy * xhat), xhat = (z - mean) inv_std; dbeta +=
//                                  the first, dgamma += the second (nn::batch_norm_backward_sums)
// A term type says what one value contributes; its channel(c, n) computes the channel's
// constants once per thread (mean = sums / count is a double division: once, not per value).
struct SumPair {
  double first = 0, second = 0;
};
struct CenteredSquareTerm {
  const float* z;     // [C][n]
  const float* sums;  // [0][C]: sum z (this call writes [1][C])
  double count;
  struct Channel {
    const float* z;  // the channel's row
    double mean;
    MGPU_HD SumPair operator()(int j) const {
      const double centered = z[j] - mean;  // as nn::batch_norm_square_sums: in double
      return {centered * centered, 0.0};
    }
  };
  MGPU_HD Channel channel(int c, int n) const { return {z + c * n, sums[c] / count}; }
};
struct GradXhatTerm {
  const float* dy;     // [C][n]
  const float* z;      // [C][n]
  const float* stats;  // [2][C]: mean, inv_std
  int channels;
  struct Channel {
    const float* dy;
    const float* z;
    float mean, inv_std;
    MGPU_HD SumPair operator()(int j) const {
      const float xhat = (z[j] - mean) * inv_std;  // as nn::batch_norm_backward_sums: in float
      return {dy[j], double(dy[j]) * xhat};
    }
  };
  MGPU_HD Channel channel(int c, int n) const { return {dy + c * n, z + c * n, stats[c], stats[channels + c]}; }
};

template <class Term>
struct TermSumsArgs {
  Term term;
  double* partials;  // [2][C][blocks]
  float* first;      // [C]
  float* second;     // [C], or null
  float* dgamma;     // [C] += the second sum, or null
  float* dbeta;      // [C] += the first sum, or null
  int channels, n;
  int blocks;  // per channel
};
// What thread `thread` of block `block` of channel c adds up: the reads of thread_sum's scalar path.
template <class Term>
MGPU_HD SumPair thread_term_sums(const TermSumsArgs<Term>& a, int c, int block, int thread) {
  const typename Term::Channel channel = a.term.channel(c, a.n);
  SumPair sum;
  for (int j = block * kThreads + thread; j < a.n; j += a.blocks * kThreads) {
    const SumPair v = channel(j);
    sum.first += v.first;
    sum.second += v.second;
  }
  return sum;
}
// Channel c's two sums from its blocks' partials, in block order, written where they go.
template <class Term>
MGPU_HD void finish_term_channel(const TermSumsArgs<Term>& a, int c) {
  double first = 0, second = 0;
  for (int block = 0; block < a.blocks; ++block) {
    first += a.partials[c * a.blocks + block];
    second += a.partials[(a.channels + c) * a.blocks + block];
  }
  a.first[c] = float(first);
  if (a.second) a.second[c] = float(second);
  if (a.dbeta) a.dbeta[c] += float(first);
  if (a.dgamma) a.dgamma[c] += float(second);
}

// ---- (d) BatchNorm's apply, fused: y = act(gamma (z - mean) inv_std + beta + residual)
// (nn::batch_norm_apply), per channel c of z [C][n], (mean, inv_std) from stats [2][C].
struct ApplyArgs {
  const float* z;         // [C][n]
  const float* stats;     // [2][C]: mean, inv_std
  const float* gamma;     // [C]
  const float* beta;      // [C]
  const float* residual;  // [C][n], or null
  float* y;               // [C][n]
  int channels, n;
  bool relu;
  bool vec4;  // n % 4 == 0 and z, residual, y 16-byte aligned: a thread does 4 values
  int count;  // threads: C*n, or C*n/4 with vec4
};
ApplyArgs apply_args(const float* z, int channels, std::int64_t n, const float* stats, const float* gamma,
                     const float* beta, const float* residual, bool relu, float* y);

// One value, in nn::batch_norm_apply's words and order (so the same bits).
MGPU_HD inline float apply_value(const ApplyArgs& a, float z, float mean, float scale, float shift, float r) {
  float v = (z - mean) * scale + shift;
  if (a.residual) v += r;
  return a.relu && v < 0 ? 0.0f : v;
}
// Thread idx of the scalar path: element idx of [C][n].
MGPU_HD inline void apply_element(const ApplyArgs& a, int idx) {
  const int c = idx / a.n;
  const float mean = a.stats[c], scale = a.gamma[c] * a.stats[a.channels + c], shift = a.beta[c];
  a.y[idx] = apply_value(a, a.z[idx], mean, scale, shift, a.residual ? a.residual[idx] : 0.0f);
}
// Thread q of the vectorised path: elements 4q .. 4q+3, all in channel 4q / n (n % 4 == 0): one
// 16-byte load of z (and of the residual), one 16-byte store of y.
MGPU_HD inline void apply_vec4(const ApplyArgs& a, int q) {
  // BEGIN EXERCISE ex10.apply_vec4
  const int i = 4 * q, c = i / a.n;
  const float mean = a.stats[c], scale = a.gamma[c] * a.stats[a.channels + c], shift = a.beta[c];
  const Vec4 z = load4(a.z + i);
  const Vec4 r = a.residual ? load4(a.residual + i) : Vec4{0, 0, 0, 0};
  store4(a.y + i, {apply_value(a, z.x, mean, scale, shift, r.x), apply_value(a, z.y, mean, scale, shift, r.y),
                   apply_value(a, z.z, mean, scale, shift, r.z), apply_value(a, z.w, mean, scale, shift, r.w)});
  // END EXERCISE ex10.apply_vec4
}

// ---- The launchers: each queues its kernel(s) on d's stream and returns at once, taking the
// arguments of the chapter 09 function it replaces. cuda build: the `__global__` kernels of
// kernels.cu. cpu build: the same element functions, called for every index by
// mgpu::for_each_index on the device's cores (correct, not fast: a CPU wants chapter 09's rows).
void im2col_raw(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col);
void col2im_raw(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx);
// partials: scratch of at least channels * kMaxSumBlocks doubles on d (the two-sum kernels: twice that).
void batch_norm_sums_raw(const Device& d, const float* z, int channels, std::int64_t n, double* partials,
                         float* sums);
// sums [2][C]: reads sums[0] (sum z), writes sums[1] = sum (z - sums[0]/count)^2.
void batch_norm_square_sums_raw(const Device& d, const float* z, int channels, std::int64_t n, double count,
                                double* partials, float* sums);
// sums [2][C] = (sum dy, sum dy * xhat); dbeta += sums[0], dgamma += sums[1].
void batch_norm_backward_sums_raw(const Device& d, const float* dy, const float* z, int channels, std::int64_t n,
                                  const float* stats, double* partials, float* sums, float* dgamma, float* dbeta);
void batch_norm_apply_raw(const Device& d, const float* z, int channels, std::int64_t n, const float* stats,
                          const float* gamma, const float* beta, const float* residual, lenet::Activation act,
                          float* y);
// d's GPU's multiprocessors (cudaDevAttrMultiProcessorCount); 1 in the cpu build.
int multiprocessors(const Device& d);

}  // namespace fast
