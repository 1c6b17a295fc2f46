// The tiled convolution (tiled_conv.h). Host code that queues chapter 09's im2col/col2im
// functors and GEMMs on a device's lanes; it is built as device code only because the lanes
// (common/parallel.h) are.
#include "tiled_conv.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/gemm.h"
#include "common/parallel.h"    // for_each_lane, for_each_span, for_each_index
#include "common/vector_ops.h"  // fill, add_into
#if !MGPU_CUDA && defined(__AVX512F__)
#include <immintrin.h>  // AVX-512's masked gathers and scatters, for Winograd's tiles
#endif

namespace fast {
namespace {

using i64 = std::int64_t;
using mgpu::gemm;
using mgpu::Transpose;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The shapes every step below uses: K inputs per output pixel, Q output pixels per image, P in
// the whole batch.
struct ConvSizes {
  int K, Q, P;
};
ConvSizes sizes_of(ImageShape xs, ConvShape c) {
  const ImageShape zs = nn::conv_output_shape(xs, c);
  return {c.in_channels * c.kernel * c.kernel, zs.height * zs.width, zs.batch * zs.height * zs.width};
}

// Rows of the backward pass's second tile: dz unfolded (Cout*k*k) where dx is a convolution of
// dz, else dcol (K = Cin*k*k).
int second_tile_rows(ImageShape xs, ConvShape c) {
  const int K = c.in_channels * c.kernel * c.kernel;
  return unfolds_by_shifting(xs, c) ? std::max(K, c.out_channels * c.kernel * c.kernel) : K;
}

// The flipped convolution whose result is dx (where dx_by_convolution): dz's channels in, x's out.
ConvShape flipped_of(ConvShape c) { return {c.out_channels, c.in_channels, c.kernel, 1, c.padding}; }

// Room for Winograd's U (16 x Cout x Cin) where the forward pass or dx multiplies by Winograd.
i64 winograd_floats_of(ImageShape xs, ConvShape c) {
  const bool dx_too = unfolds_by_shifting(xs, c) && multiplies_by_winograd(nn::conv_output_shape(xs, c), flipped_of(c));
  return multiplies_by_winograd(xs, c) || dx_too ? 16 * i64(c.in_channels) * c.out_channels : 0;
}

// Refuses (mgpu::Error naming `call`) a plan made for another convolution or for more lanes than
// d has, and scratch smaller than the plan needs.
void check_plan(const Device& d, const TilePlan& plan, ImageShape xs, ConvShape c, nn::ConvScratch scratch,
                const char* call) {
  const ConvSizes s = sizes_of(xs, c);
  const bool fits = plan.images >= 1 && plan.tiles == ceil_div(xs.batch, plan.images) && plan.lanes >= 1 &&
                    plan.lanes <= std::min(plan.tiles, mgpu::lanes_per_device(d)) &&
                    plan.dx_by_convolution == unfolds_by_shifting(xs, c) &&
                    plan.tile_floats == i64(s.K) * s.Q * plan.images &&
                    plan.dcol_floats == i64(second_tile_rows(xs, c)) * s.Q * plan.images &&
                    plan.partial_floats == i64(c.out_channels) * s.K &&
                    plan.winograd_floats == winograd_floats_of(xs, c);
  if (!fits)
    throw mgpu::Error(std::string(call) + ": the tile plan (" + std::to_string(plan.images) + " images a tile, " +
                      std::to_string(plan.tiles) + " tiles, " + std::to_string(plan.lanes) +
                      " lanes) is not one for this convolution on this device");
  if (scratch.floats < plan.scratch_floats())
    throw mgpu::Error(std::string(call) + ": scratch of " + std::to_string(scratch.floats) + " floats, " +
                      std::to_string(plan.scratch_floats()) + " needed");
}

// Calls f(lane, first, count) for every tile [first, first + count) of the batch, tile t on lane
// t % plan.lanes, the lanes at once.
template <class F>
void for_each_tile(const Device& d, const TilePlan& plan, int batch, F f) {
  mgpu::for_each_lane(d, plan.lanes, [&](int lane) {
    for (int t = lane; t < plan.tiles; t += plan.lanes) {
      const int first = t * plan.images;
      f(lane, first, std::min(plan.images, batch - first));
    }
  });
}

// Item: one row r = (c, ky, kx) of a col tile, [count][H][W] (im2col_images' layout), for a
// stride-1 convolution whose output is as large as its input (2p == k - 1). Then window (ky, kx)
// of output pixel (oy, ox) reads pixel (oy + dy, ox + dx), dy = ky - p, dx = kx - p: the whole
// row is the slice's plane of channel c, x[c][first..first+count)[H][W] (contiguous), read at a
// constant offset dy*W + dx. So: one long contiguous copy at that offset, then zeros where the
// shifted read left its own image (|dy| rows an image, |dx| columns a row), where the copy took a
// neighbouring row's or image's pixel. Chapter 09's Im2col does the same, row by row.
MGPU_HD inline int clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }  // for lo <= hi

struct Im2colShifted {
  const float* x;
  float* col;
  int B, first, count, H, W, k, p;
  MGPU_HD void operator()(i64 r, int begin, int end) const {
    const int c = int(r / (k * k)), dy = int(r / k % k) - p, dx = int(r % k) - p;
    const float* plane = x + (i64(c) * B + first) * H * W;  // = &x[c][first][0][0], count*H*W floats
    float* dst = col + r * count * H * W;                    // = &col[r][0][0][0]
    const int n = count * H * W, shift = dy * W + dx;
    // 1. dst[e] = plane[e + shift] wherever e + shift lies in the slice, 0 elsewhere.
    const int lo = clamp(-shift, begin, end), hi = clamp(n - shift, lo, end);
    for (int e = begin; e < lo; ++e) dst[e] = 0.0f;
    for (int e = lo; e < hi; ++e) dst[e] = plane[e + shift];  // a copy the compiler vectorizes
    for (int e = hi; e < end; ++e) dst[e] = 0.0f;
    // 2. Zeros where the pixel read was not (oy + dy, ox + dx) of its own image. The padding rows
    // (|dy| whole rows an image) are one short run each; the border columns (|dx| a row) are
    // strided stores down the rows. (Not a loop over rows that zeroes a few floats in each: the
    // compiler makes each of those a call to memset, and those calls were most of this kernel.)
    const int first_row = begin / W, last_row = (end - 1) / W;  // rows j*H + oy of the segment
    for (int j = first_row / H; j <= last_row / H; ++j) {
      const int pad_begin = (j * H + (dy < 0 ? 0 : H - dy)) * W, pad_end = pad_begin + (dy < 0 ? -dy : dy) * W;
      for (int e = clamp(pad_begin, begin, end); e < clamp(pad_end, begin, end); ++e) dst[e] = 0.0f;
    }
    const int border_begin = dx < 0 ? 0 : W - dx, border_end = dx < 0 ? -dx : W;  // the columns ox
    for (int ox = border_begin; ox < border_end; ++ox)
      for (int row = first_row; row <= last_row; ++row) {
        const int e = row * W + ox;
        if (e >= begin && e < end) dst[e] = 0.0f;
      }
  }
};

}  // namespace
#if !MGPU_CUDA
namespace {
// --- The CPU's kernel for the shifted convolutions: the unfolding packed straight into
// registers' reach (step 6 of the README's CPU lesson)
//
// The shifted copy (above) writes a col tile into the cache, and then OpenBLAS copies it again,
// into the panel layout its kernel reads (`sgemm_itcopy`), and zeroes z's block before adding
// into it (`sgemm_beta`): three passes over data that one pass can make. PanelConv makes, for
// kPanel output pixels at a time, the panel [K][kPanel] of their unfolded inputs, straight from
// x (the same shifted reads, masked where the window leaves the image), in the layout the
// multiply reads; then kRows output channels at a time hold their kPanel sums in vector
// registers while k runs over the panel: per k, two loads of the panel and kRows broadcasts of W
// feed 2 * kRows vector multiply-adds. The panel is kChunk rows of k at most (kChunk * kPanel
// floats: 64 KB with AVX-512, in L2) so that it sits on the thread's stack; a longer K is done
// chunk by chunk, z holding the partial sums in between. z starts from the bias: no zeroing
// pass, no bias pass.
//
// GCC's and Clang's vector extension: vf is one vector register of floats, as wide as the
// machine's (-march=native: 16 floats with AVX-512, 8 with AVX2, 4 with SSE or NEON). A panel is
// two of them a row, and a register block kRows rows: 2 * kRows accumulators, 16 of AVX-512's 32
// registers, 12 of AVX2's 16 (the panel's two vectors and a broadcast take three more).
#if defined(__AVX512F__)
constexpr int kLanes = 16, kRows = 8;
#elif defined(__AVX__)
constexpr int kLanes = 8, kRows = 6;
#else
constexpr int kLanes = 4, kRows = 6;
#endif
typedef float vf __attribute__((vector_size(4 * kLanes)));
typedef std::int32_t vi __attribute__((vector_size(4 * kLanes)));
constexpr int kVectors = 2;                 // vectors a panel row
constexpr int kPanel = kVectors * kLanes;   // output pixels a panel: 32, 16 or 8
constexpr int kChunk = 512;                 // rows of k a panel holds at most
constexpr int kMaxPanelKernel = 11;         // the largest k x k kernel PanelConv takes (its masks' arrays)

inline vf load_vector(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vector(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// z[r][j] (+)= sum over k of W[r][k] * panel[k][j], for r < R (one register block) and the first
// `width` of the panel's kPanel columns; z starts from `init` (the bias, or null for 0) unless
// `accumulate` (a later chunk of k: z holds the sums so far).
template <int R>
void multiply_panel(const float* panel, int K, const float* W, int ldw, const float* init, bool accumulate, float* z,
                    std::int64_t ldz, int width) {
  vf acc[R][kVectors];
  float partial[R][kPanel];  // a last, narrower panel goes through here
  for (int r = 0; r < R; ++r) {
    if (accumulate && width < kPanel)
      for (int j = 0; j < kPanel; ++j) partial[r][j] = j < width ? z[r * ldz + j] : 0.0f;
    for (int v = 0; v < kVectors; ++v) {
      if (accumulate)
        acc[r][v] = load_vector((width < kPanel ? partial[r] : z + r * ldz) + kLanes * v);
      else
        acc[r][v] = vf{} + (init ? init[r] : 0.0f);
    }
  }
  for (int k = 0; k < K; ++k) {
    vf in[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      in[v] = load_vector(panel + k * kPanel + kLanes * v);
#if defined(__x86_64__)
      // Into a register, once: left alone, GCC reads it again from the panel in each of the
      // kRows multiply-adds (a memory operand), and the loads, not the multiply-adds, set the
      // pace. (An empty asm that "changes" the register: the compiler must keep it there.)
      __asm__("" : "+x"(in[v]));
#endif
    }
    for (int r = 0; r < R; ++r) {
      const float w = W[r * ldw + k];
      for (int v = 0; v < kVectors; ++v) acc[r][v] += w * in[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    if (width == kPanel) {
      for (int v = 0; v < kVectors; ++v) store_vector(z + r * ldz + kLanes * v, acc[r][v]);
    } else {
      for (int v = 0; v < kVectors; ++v) store_vector(partial[r] + kLanes * v, acc[r][v]);
      for (int j = 0; j < width; ++j) z[r * ldz + j] = partial[r][j];
    }
  }
}

// Item: one panel of kPanel output pixels e = e0.. of a tile's count images ([count][H][W],
// e0 = item * kPanel), for every output channel: z[co][e] = b[co] + sum over k of W[co][k] *
// unfold(x)[k][e], k = (ci, ky, kx), for a stride-1 convolution whose output is as large as its
// input (unfolds_by_shifting). unfold(x)[k][e] is x's plane of channel ci read at e + dy*W + dx
// (dy = ky - p, dx = kx - p), or 0 where that pixel is not (oy + dy, ox + dx) of e's own image:
// Im2colShifted's row k, at e.
struct PanelConv {
  const float* x;  // [Cin][B][H][W]
  const float* W;  // [Cout][K]
  const float* b;  // [Cout], or null: no bias
  float* z;        // the tile's first output column: z[co * ldz + e]
  std::int64_t ldz;
  int B, first, count, H, Wd, Cin, Cout, k, p;
  void operator()(std::int64_t item) const {
    const int kk = k * k, K = Cin * kk, n = count * H * Wd, e0 = int(item) * kPanel;
    const int width = std::min(kPanel, n - e0);
    // Which of the panel's pixels each shift of a row, and of a column, keeps inside the image:
    // row_ok[ky][j] (0 <= oy + ky - p < H), col_ok[kx][j]; all bits set or none, for an AND.
    std::int32_t row_ok[kMaxPanelKernel][kPanel], col_ok[kMaxPanelKernel][kPanel];
    // (oy, ox) of pixel e0 by division, then stepped along the row: three divisions per pixel
    // cost as much as a third of the multiply-adds of a 16-channel panel.
    int oy = e0 % (H * Wd) / Wd, ox = e0 % Wd;
    for (int j = 0; j < kPanel; ++j) {
      for (int t = 0; t < k; ++t) {
        row_ok[t][j] = j < width && oy + t - p >= 0 && oy + t - p < H ? -1 : 0;
        col_ok[t][j] = j < width && ox + t - p >= 0 && ox + t - p < Wd ? -1 : 0;
      }
      if (++ox == Wd) {
        ox = 0;
        if (++oy == H) oy = 0;
      }
    }
    const std::int64_t x_floats = std::int64_t(Cin) * B * H * Wd;
    alignas(64) float panel[kChunk * kPanel];
    for (int k0 = 0; k0 < K; k0 += kChunk) {
      const int rows = std::min(kChunk, K - k0);
      // 1. The panel: rows k0.. of the unfolding, at this panel's pixels.
      for (int r = 0; r < rows; ++r) {
        const int kr = k0 + r, ci = kr / kk, ky = kr / k % k, kx = kr % k;
        const std::int64_t at = (std::int64_t(ci) * B + first) * H * Wd + e0 + (ky - p) * Wd + (kx - p);
        float* dst = panel + r * kPanel;
        if (at >= 0 && at + kPanel <= x_floats) {  // the usual case: one masked copy
          const float* src = x + at;
          for (int v = 0; v < kVectors; ++v) {
            vi ok_row, ok_col;
            std::memcpy(&ok_row, row_ok[ky] + kLanes * v, sizeof ok_row);
            std::memcpy(&ok_col, col_ok[kx] + kLanes * v, sizeof ok_col);
            store_vector(dst + kLanes * v, (vf)((vi)load_vector(src + kLanes * v) & ok_row & ok_col));
          }
        } else {  // at x's very start or end: read only what the window keeps
          for (int j = 0; j < kPanel; ++j) dst[j] = row_ok[ky][j] & col_ok[kx][j] ? x[at + j] : 0.0f;
        }
      }
      // 2. Every output channel, kRows at a time, against the panel.
      const bool accumulate = k0 > 0;
      const float* init = accumulate ? nullptr : b;
      for (int co = 0; co < Cout; co += kRows) {
        const float* Wr = W + std::int64_t(co) * K + k0;
        const float* ir = init ? init + co : nullptr;
        float* zr = z + co * ldz + e0;
        // (Cases 7 and 8 are there for AVX-512's kRows = 8; with AVX2's 6 they never run.)
        switch (std::min(kRows, Cout - co)) {
          case 8: multiply_panel<8>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          case 7: multiply_panel<7>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          case 6: multiply_panel<6>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          case 5: multiply_panel<5>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          case 4: multiply_panel<4>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          case 3: multiply_panel<3>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          case 2: multiply_panel<2>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
          default: multiply_panel<1>(panel, rows, Wr, K, ir, accumulate, zr, ldz, width); break;
        }
      }
    }
  }
};

#if defined(__AVX512F__)
// --- Winograd's F(2x2, 3x3): the 3x3 convolutions with 16 multiplies where there were 36
// (step 7 of the README's CPU lesson)
//
// PanelConv runs near what a core can do at all (its multiply-adds at 75-100 GFLOP/s a core), so
// the next gain must come from doing fewer of them. A 3x3 convolution (stride 1, padding 1) makes
// each 2x2 block of output pixels (a "tile") from the 4x4 block of input around it, d: 36
// multiply-adds per input channel and output channel. Winograd's minimal filtering (Lavin and
// Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016) gets the same four sums as
//     y (2x2) = Aᵀ [ Σ_ci (G g Gᵀ) ⊙ (Bᵀ d B) ] A,        g = W[co][ci] (3x3)
//     Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1]
//     Aᵀ = [1 1 1 0; 0 1 -1 -1]
// where ⊙ multiplies element by element: 16 multiply-adds per channel pair. U = G g Gᵀ (4x4) is
// computed once per call for every (co, ci) (WinogradWeights); V = Bᵀ d B (additions only) once per
// tile and input channel; then, for each of the 16 positions ξ of the 4x4, the tiles' sums are a
// product [Cout x Cin] x [Cin x tiles], made by PanelConv's multiply_panel on panels of kPanel
// tiles; Aᵀ · A (additions only) turns each tile's 16 sums back into its 4 pixels.
//
// What it costs instead: the transforms, which are additions and data movement, not multiply-
// adds; the tiles that stick out of an odd-sided image (a 7x7 image is 4x4 tiles, 64 pixels'
// work for 49); and a tile's 4x4 input is not contiguous (consecutive tiles' blocks are 2 floats
// apart, and the tiles of a panel span rows and images). Each row of a block is four contiguous
// floats, so the rows are read as 16-byte loads and transposed into vectors of tiles
// (load_block_rows); the 2x2 outputs are written with AVX-512's masked scatters. AVX-512 only,
// and only where the README's measurements found it faster than PanelConv: from 16 input
// channels up (below, the transforms, which grow with the channels in and out, cost more than
// the saved multiply-adds). The sums come out in another order and through the transforms'
// halves: not PanelConv's bits, equal to within rounding (test_fast_kernels).
constexpr int kWinogradMinChannels = 16;

// Item (co, ci): U[ξ][co][ci] = (G g Gᵀ)[ξ], g = W[co][ci] (3x3), ξ = 4 * row + column.
struct WinogradWeights {
  const float* W;  // [Cout][Cin][3][3]
  float* U;        // [16][Cout][Cin]
  int Cin, Cout;
  void operator()(std::int64_t item) const {
    const float* g = W + item * 9;  // item = co * Cin + ci
    float Gg[4][3];                 // G g: rows of g combined
    for (int j = 0; j < 3; ++j) {
      Gg[0][j] = g[j];
      Gg[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
      Gg[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
      Gg[3][j] = g[6 + j];
    }
    const std::int64_t plane = std::int64_t(Cout) * Cin;  // one ξ's [Cout][Cin]
    for (int i = 0; i < 4; ++i) {                          // (G g) Gᵀ: its columns combined
      const float* r = Gg[i];
      const float u[4] = {r[0], 0.5f * (r[0] + r[1] + r[2]), 0.5f * (r[0] - r[1] + r[2]), r[2]};
      for (int j = 0; j < 4; ++j) U[(4 * i + j) * plane + item] = u[j];
    }
  }
};

// A panel's lanes hold its tiles in a transposed order: lane 4r + m of each kLanes-lane vector
// holds the vector's tile 4m + r. That is the order in which four 16-byte rows of four tiles'
// blocks come out of the transpose below (load_block_rows); the products do not care, and the
// masks and the scatters' addresses are made in the same order.
inline int tile_in_lane(int lane) { return 4 * (lane % 4) + lane / 4; }

// Item: one panel of kPanel tiles of a slice's count images (tile t is image t / (Th*Tw), tile row
// t / Tw % Th, tile column t % Tw; Th = ceil(H/2), Tw = ceil(W/2)), for every output channel: the
// 2x2 pixels of each tile, z[co][e] = b[co] + (the convolution), e in the slice's columns of z.
// Per panel: V [16][Cin][kPanel], the tiles' Bᵀ d B for every input channel (in the thread's own
// buffer: items of one call may run on several threads at once); then kRows output channels at a
// time, the 16 products U[ξ] V[ξ] into M [16][kRows][kPanel] and each tile's y = Aᵀ M A.
struct WinogradConv {
  const float* x;  // [Cin][B][H][W]
  const float* U;  // [16][Cout][Cin], WinogradWeights'
  const float* b;  // [Cout], or null: no bias
  float* z;        // the slice's first output column: z[co * ldz + e]
  std::int64_t ldz;
  int B, first, count, H, Wd, Cin, Cout;

  // In each 128-bit block, a's and b's first two floats interleaved (unpack_low) or their last two
  // (unpack_high): _mm512_unpacklo_ps and _mm512_unpackhi_ps, written as shuffles because GCC 12
  // warns about those intrinsics' own undefined start value.
  static __m512 unpack_low(__m512 a, __m512 b) {
    return __builtin_shufflevector(a, b, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
  }
  static __m512 unpack_high(__m512 a, __m512 b) {
    return __builtin_shufflevector(a, b, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }

  // Rows i = 0..3 of the kLanes tiles' 4x4 blocks of one channel, d[i][j] (column j), in lane
  // order, 0 outside the image. row_at[i][t]: where row i of tile t's block starts in the channel's
  // slice (column 2tx - 1; a row of the tile's own if row i lies outside the image, so that every
  // read stays in x); its four floats are one 16-byte load. Four tiles' rows make a 64-byte vector
  // (one per 128-bit block), and a 4x4 transpose inside each block turns four such vectors into
  // the four columns, each lane one tile (in tile_in_lane's order).
  static void load_block_rows(const float* slice, const std::int32_t (*row_at)[kLanes], const __mmask16* row_in,
                              const __mmask16* col_in, vf d[4][4]) {
    for (int i = 0; i < 4; ++i) {
      __m512 rows[4];  // rows[q], block r: row i of tile 4q + r
      for (int q = 0; q < 4; ++q) {
        const std::int32_t* at = row_at[i] + 4 * q;
        __m512 v = _mm512_zextps128_ps512(_mm_loadu_ps(slice + at[0]));
        v = _mm512_insertf32x4(v, _mm_loadu_ps(slice + at[1]), 1);
        v = _mm512_insertf32x4(v, _mm_loadu_ps(slice + at[2]), 2);
        rows[q] = _mm512_insertf32x4(v, _mm_loadu_ps(slice + at[3]), 3);
      }
      const __m512 lo01 = unpack_low(rows[0], rows[1]), hi01 = unpack_high(rows[0], rows[1]);
      const __m512 lo23 = unpack_low(rows[2], rows[3]), hi23 = unpack_high(rows[2], rows[3]);
      d[i][0] = (vf)_mm512_maskz_shuffle_ps(row_in[i] & col_in[0], lo01, lo23, 0x44);
      d[i][1] = (vf)_mm512_maskz_shuffle_ps(row_in[i] & col_in[1], lo01, lo23, 0xEE);
      d[i][2] = (vf)_mm512_maskz_shuffle_ps(row_in[i] & col_in[2], hi01, hi23, 0x44);
      d[i][3] = (vf)_mm512_maskz_shuffle_ps(row_in[i] & col_in[3], hi01, hi23, 0xEE);
    }
  }

  void operator()(std::int64_t item) const {
    const int Th = (H + 1) / 2, Tw = (Wd + 1) / 2, tiles = count * Th * Tw, plane = H * Wd;
    // Per lane: where its 2x2 output starts (out_at) and its 4x4 block (block_at: row 2ty - 1,
    // column 2tx - 1), relative to a channel's slice; which of the block's rows and columns lie in
    // the image, as AVX-512 masks (bit l for lane l); and per vector the range the 16-byte row
    // loads touch, [lowest, highest).
    alignas(64) std::int32_t block_at[kPanel], out_at[kPanel];
    std::int32_t row_at[kVectors][4][kLanes];  // by tile, not lane: load_block_rows' input
    __mmask16 row_in[kVectors][4] = {}, col_in[kVectors][4] = {}, live[kVectors] = {};
    std::int32_t lowest[kVectors], highest[kVectors];
    for (int v = 0; v < kVectors; ++v) lowest[v] = highest[v] = 0;
    for (int l = 0; l < kPanel; ++l) {
      const int v = l / kLanes, in_vector = tile_in_lane(l % kLanes), t = int(item) * kPanel + v * kLanes + in_vector;
      const __mmask16 bit = __mmask16(1u << (l % kLanes));
      const int image = t / (Th * Tw), ty = t / Tw % Th, tx = t % Tw;
      const bool real = t < tiles;  // else past the slice's last tile: every mask bit stays 0
      block_at[l] = real ? image * plane + (2 * ty - 1) * Wd + 2 * tx - 1 : 0;
      out_at[l] = real ? image * plane + 2 * ty * Wd + 2 * tx : 0;
      if (real) live[v] |= bit;
      for (int s = 0; s < 4; ++s) {
        const bool row_inside = real && 2 * ty - 1 + s >= 0 && 2 * ty - 1 + s < H;
        if (row_inside) row_in[v][s] |= bit;
        if (real && 2 * tx - 1 + s >= 0 && 2 * tx - 1 + s < Wd) col_in[v][s] |= bit;
        const int at = real ? image * plane + (row_inside ? 2 * ty - 1 + s : 2 * ty) * Wd + 2 * tx - 1 : 0;
        row_at[v][s][in_vector] = at;
        lowest[v] = std::min(lowest[v], at);
        highest[v] = std::max(highest[v], at + 4);
      }
    }
    // 1. V = Bᵀ d B for every input channel, kLanes tiles at a time.
    thread_local std::vector<float> inputs;
    inputs.resize(std::size_t(16) * Cin * kPanel);
    float* V = inputs.data();  // V[ξ][ci][l]: row ci of ξ's panel at V + (ξ * Cin + ci) * kPanel
    const std::int64_t x_floats = std::int64_t(Cin) * B * plane;
    for (int ci = 0; ci < Cin; ++ci) {
      const std::int64_t offset = (std::int64_t(ci) * B + first) * plane;  // channel ci's count images
      const float* slice = x + offset;
      for (int v = 0; v < kVectors; ++v) {
        vf d[4][4];  // d[i][j]: pixel (2ty - 1 + i, 2tx - 1 + j) of each lane's tile, 0 outside
        if (offset + lowest[v] >= 0 && offset + highest[v] <= x_floats) {
          load_block_rows(slice, row_at[v], row_in[v], col_in[v], d);
        } else {  // the very first or last tile of x, whose block reaches a float past either end:
                  // the masked gathers read only the pixels inside the image
          const __m512i at = _mm512_load_si512(block_at + kLanes * v);
          for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j)
              d[i][j] = (vf)_mm512_mask_i32gather_ps(_mm512_setzero_ps(), row_in[v][i] & col_in[v][j], at,
                                                     slice + i * Wd + j, 4);
        }
        vf Bd[4][4];  // Bᵀ d: rows combined
        for (int j = 0; j < 4; ++j) {
          Bd[0][j] = d[0][j] - d[2][j];
          Bd[1][j] = d[1][j] + d[2][j];
          Bd[2][j] = d[2][j] - d[1][j];
          Bd[3][j] = d[1][j] - d[3][j];
        }
        for (int i = 0; i < 4; ++i) {  // (Bᵀ d) B: columns combined
          float* row = V + (std::int64_t(4 * i) * Cin + ci) * kPanel + kLanes * v;
          const std::int64_t next = std::int64_t(Cin) * kPanel;  // ξ to ξ + 1
          store_vector(row, Bd[i][0] - Bd[i][2]);
          store_vector(row + next, Bd[i][1] + Bd[i][2]);
          store_vector(row + 2 * next, Bd[i][2] - Bd[i][1]);
          store_vector(row + 3 * next, Bd[i][1] - Bd[i][3]);
        }
      }
    }
    // 2. kRows output channels at a time: M[ξ] = U[ξ] V[ξ], then y = Aᵀ M A for each tile.
    alignas(64) float M[16][kRows][kPanel];
    for (int co = 0; co < Cout; co += kRows) {
      const int rows = std::min(kRows, Cout - co);
      for (int xi = 0; xi < 16; ++xi) {
        const float* Ur = U + (std::int64_t(xi) * Cout + co) * Cin;
        const float* Vr = V + std::int64_t(xi) * Cin * kPanel;
        float* Mr = &M[xi][0][0];
        switch (rows) {  // (as PanelConv's: cases 7 and 8 for AVX-512's kRows = 8)
          case 8: multiply_panel<8>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          case 7: multiply_panel<7>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          case 6: multiply_panel<6>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          case 5: multiply_panel<5>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          case 4: multiply_panel<4>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          case 3: multiply_panel<3>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          case 2: multiply_panel<2>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
          default: multiply_panel<1>(Vr, Cin, Ur, Cin, nullptr, false, Mr, kPanel, kPanel); break;
        }
      }
      for (int r = 0; r < rows; ++r) {
        float* zr = z + std::int64_t(co + r) * ldz;
        const float bias = b ? b[co + r] : 0.0f;
        for (int v = 0; v < kVectors; ++v) {
          vf m[16];
          for (int xi = 0; xi < 16; ++xi) m[xi] = load_vector(&M[xi][r][kLanes * v]);
          vf Am[2][4];  // Aᵀ M: rows combined
          for (int j = 0; j < 4; ++j) {
            Am[0][j] = m[j] + m[4 + j] + m[8 + j];
            Am[1][j] = m[4 + j] - m[8 + j] - m[12 + j];
          }
          // (Aᵀ M) A, each pixel scattered to its place: (2ty, 2tx) always; the column 2tx + 1 and
          // the row 2ty + 1 only where they lie inside the image (odd sides: the last tile's half).
          const __m512i at = _mm512_load_si512(out_at + kLanes * v);
          const __mmask16 right = live[v] & col_in[v][2], below = live[v] & row_in[v][2];
          _mm512_mask_i32scatter_ps(zr, live[v], at, (__m512)(Am[0][0] + Am[0][1] + Am[0][2] + bias), 4);
          _mm512_mask_i32scatter_ps(zr + 1, right, at, (__m512)(Am[0][1] - Am[0][2] - Am[0][3] + bias), 4);
          _mm512_mask_i32scatter_ps(zr + Wd, below, at, (__m512)(Am[1][0] + Am[1][1] + Am[1][2] + bias), 4);
          _mm512_mask_i32scatter_ps(zr + Wd + 1, right & below, at,
                                    (__m512)(Am[1][1] - Am[1][2] - Am[1][3] + bias), 4);
        }
      }
    }
  }
};
#endif  // __AVX512F__
}  // namespace
#endif

bool unfolds_by_shifting(ImageShape xs, ConvShape c) {
  return c.stride == 1 && 2 * c.padding == c.kernel - 1 && xs.height > 0 && xs.width > 0;
}

bool multiplies_in_panels(ImageShape xs, ConvShape c) {
#if MGPU_CUDA
  (void)xs, (void)c;
  return false;
#else
  return unfolds_by_shifting(xs, c) && c.kernel <= kMaxPanelKernel;
#endif
}

bool multiplies_by_winograd(ImageShape xs, ConvShape c) {
#if MGPU_CUDA || !defined(__AVX512F__)
  (void)xs, (void)c;
  return false;
#else
  return c.kernel == 3 && c.stride == 1 && c.padding == 1 && c.in_channels >= kWinogradMinChannels &&
         xs.height > 0 && xs.width > 0;
#endif
}

namespace {
// z's columns of images [first, first + count) (a block of z [Cout][B*H*W], row length ldz) =
// W x + b, the convolution of x [Cin][B][H][W] that multiplies_in_panels; b may be null.
void panel_conv_images(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                       int first, int count, float* z, i64 ldz) {
#if MGPU_CUDA
  (void)d, (void)x, (void)xs, (void)c, (void)W, (void)b, (void)first, (void)count, (void)z, (void)ldz;
  throw mgpu::Error("panel_conv_images: a CPU kernel, not in a cuda build");
#else
  const i64 pixels = i64(count) * xs.height * xs.width;
  mgpu::for_each_index(d, ceil_div(int(pixels), kPanel),
                       PanelConv{x, W, b, z, ldz, xs.batch, first, count, xs.height, xs.width, c.in_channels,
                                 c.out_channels, c.kernel, c.padding},
                       sizeof(float) * double(pixels) * (c.in_channels + c.out_channels));
#endif
}

// U [16][Cout][Cin] = Winograd's transform of W [Cout][Cin][3][3] (WinogradWeights).
void winograd_weights(const Device& d, const float* W, ConvShape c, float* U) {
#if MGPU_CUDA || !defined(__AVX512F__)
  (void)d, (void)W, (void)c, (void)U;
  throw mgpu::Error("winograd_weights: a kernel of the cpu build with AVX-512 only");
#else
  const i64 pairs = i64(c.out_channels) * c.in_channels;
  mgpu::for_each_index(d, pairs, WinogradWeights{W, U, c.in_channels, c.out_channels},
                       sizeof(float) * double(pairs) * (9 + 16));
#endif
}

// z's columns of images [first, first + count) (a block of z [Cout][B*H*W], row length ldz) =
// W x + b by Winograd's F(2x2, 3x3), U = winograd_weights(W), for a convolution that
// multiplies_by_winograd; b may be null.
void winograd_conv_images(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* U,
                          const float* b, int first, int count, float* z, i64 ldz) {
#if MGPU_CUDA || !defined(__AVX512F__)
  (void)d, (void)x, (void)xs, (void)c, (void)U, (void)b, (void)first, (void)count, (void)z, (void)ldz;
  throw mgpu::Error("winograd_conv_images: a kernel of the cpu build with AVX-512 only");
#else
  const i64 tiles = i64(count) * ((xs.height + 1) / 2) * ((xs.width + 1) / 2);
  const i64 pixels = i64(count) * xs.height * xs.width;
  mgpu::for_each_index(d, (tiles + kPanel - 1) / kPanel,
                       WinogradConv{x, U, b, z, ldz, xs.batch, first, count, xs.height, xs.width, c.in_channels,
                                    c.out_channels},
                       sizeof(float) * double(pixels) * (c.in_channels + c.out_channels));
#endif
}
}  // namespace

void im2col_shifted_images(const Device& d, const float* x, ImageShape xs, ConvShape c, int first, int count,
                           float* col) {
  nn::check_channels(xs, c, "im2col_shifted_images");
  if (!unfolds_by_shifting(xs, c))
    throw mgpu::Error("im2col_shifted_images: needs stride 1 and an output as large as the input (2p = k - 1); got k" +
                      std::to_string(c.kernel) + " s" + std::to_string(c.stride) + " p" + std::to_string(c.padding));
  nn::check_slice(xs, first, count, "im2col_shifted_images");
  const int rows = c.in_channels * c.kernel * c.kernel, span = count * xs.height * xs.width;
  mgpu::for_each_span(d, rows, span,
                      Im2colShifted{x, col, xs.batch, first, count, xs.height, xs.width, c.kernel, c.padding},
                      2.0 * sizeof(float) * double(rows) * span);
}

namespace {
// Item i = (ci, co, t) of W flipped, [Cin][Cout][k*k]: W[co][ci] with its k*k taps reversed.
// Pixel (y, x) of dx gets W[co][ci][ky][kx] * dz[co][y + p - ky][x + p - kx]: a convolution of dz
// (padding p again, as 2p = k - 1) whose tap (ky', kx') = (k-1-ky, k-1-kx), from ci's side.
struct FlipWeights {
  const float* W;  // [Cout][Cin][k*k]
  float* flipped;  // [Cin][Cout][k*k]
  int Cin, Cout, kk;
  MGPU_HD void operator()(i64 i) const {
    const i64 ci = i / (i64(Cout) * kk), co = i / kk % Cout, t = i % kk;
    flipped[i] = W[(co * Cin + ci) * kk + (kk - 1 - t)];
  }
};
void flip_weights(const Device& d, const float* W, ConvShape c, float* flipped) {
  const int kk = c.kernel * c.kernel;
  const i64 n = i64(c.in_channels) * c.out_channels * kk;
  mgpu::for_each_index(d, n, FlipWeights{W, flipped, c.in_channels, c.out_channels, kk}, 2.0 * sizeof(float) * n);
}

// The unfolding a tile uses: the shifted copy where it applies, chapter 09's im2col elsewhere.
void unfold_tile(const Device& d, const float* x, ImageShape xs, ConvShape c, int first, int count, float* col) {
  if (unfolds_by_shifting(xs, c))
    im2col_shifted_images(d, x, xs, c, first, count, col);
  else
    nn::im2col_images(d, x, xs, c, first, count, col);
}
}  // namespace

TilePlan plan_tiles(int lanes, ImageShape xs, ConvShape c, i64 tile_floats, int min_columns) {
  nn::check_channels(xs, c, "plan_tiles");
  if (lanes < 1 || tile_floats < 1 || xs.batch < 1 || min_columns < 1)
    throw mgpu::Error("plan_tiles: needs lanes, a tile size, a column minimum and a batch of at least 1 (got " +
                      std::to_string(lanes) + ", " + std::to_string(tile_floats) + ", " + std::to_string(min_columns) +
                      ", " + std::to_string(xs.batch) + ")");
  const ConvSizes s = sizes_of(xs, c);
  const i64 per_image = i64(s.K) * s.Q;  // one image's col
  TilePlan plan;
  // As many images as the tile holds, and at least enough for kMinTileColumns columns (one image
  // at the least); no more than an even share of the batch, so that every lane gets work.
  const i64 for_columns = ceil_div(min_columns, s.Q);
  plan.images = static_cast<int>(
      std::clamp<i64>(std::max(tile_floats / per_image, for_columns), 1, ceil_div(xs.batch, lanes)));
  plan.tiles = ceil_div(xs.batch, plan.images);
  plan.lanes = std::min(lanes, plan.tiles);
  plan.dx_by_convolution = unfolds_by_shifting(xs, c);
  plan.tile_floats = per_image * plan.images;
  plan.dcol_floats = i64(second_tile_rows(xs, c)) * s.Q * plan.images;
  plan.partial_floats = i64(c.out_channels) * s.K;
  plan.winograd_floats = winograd_floats_of(xs, c);
  return plan;
}

TilePlan plan_tiles(const Device& d, ImageShape xs, ConvShape c) {
  return plan_tiles(mgpu::lanes_per_device(d), xs, c);
}

void tiled_conv_forward(const Device& d, const TilePlan& plan, const float* x, ImageShape xs, ConvShape c,
                        const float* W, const float* b, nn::ConvScratch scratch, float* z) {
  check_plan(d, plan, xs, c, scratch, "tiled_conv_forward");
  const ConvSizes s = sizes_of(xs, c);
  if (multiplies_by_winograd(xs, c)) {  // the CPU's fewer multiplies: U once, then tile by tile
    float* U = scratch.data + plan.scratch_floats() - plan.winograd_floats;
    winograd_weights(d, W, c, U);
    for_each_tile(d, plan, xs.batch, [&](int, int first, int count) {
      winograd_conv_images(d, x, xs, c, U, b, first, count, z + i64(first) * s.Q, s.P);
    });
    return;
  }
  if (multiplies_in_panels(xs, c)) {  // the CPU's kernel: no col, z starts from the bias
    for_each_tile(d, plan, xs.batch, [&](int, int first, int count) {
      panel_conv_images(d, x, xs, c, W, b, first, count, z + i64(first) * s.Q, s.P);
    });
    return;
  }
  for_each_tile(d, plan, xs.batch, [&](int lane, int first, int count) {
    // [K][count*Q]: this tile's unfolded images
    float* col = scratch.data + lane * (plan.tile_floats + plan.dcol_floats);
    const int columns = count * s.Q;
    unfold_tile(d, x, xs, c, first, count, col);
    // z's columns of these images = W col    [Cout x columns] = [Cout x K][K x columns], in z [Cout][P]
    gemm(d, Transpose::No, Transpose::No, c.out_channels, columns, s.K, 1.0f, W, s.K, col, columns, 0.0f,
         z + i64(first) * s.Q, s.P);
  });
  // z += b, broadcast along each channel's row of P pixels
  lenet::bias_activation(d, z, b, c.out_channels, s.P, lenet::Activation::None);
}

void tiled_conv_backward(const Device& d, const TilePlan& plan, const float* dz, const float* x, ImageShape xs,
                         ConvShape c, const float* W, const float* ones, nn::ConvScratch scratch, float* dW, float* db,
                         float* dx) {
  check_plan(d, plan, xs, c, scratch, "tiled_conv_backward");
  const ConvSizes s = sizes_of(xs, c);
  float* partials = scratch.data + plan.lanes * (plan.tile_floats + plan.dcol_floats);  // [lanes - 1][Cout][K]
  float* flipped = partials + (plan.lanes - 1) * plan.partial_floats;  // [Cin][Cout*k*k], if dx_by_convolution
  mgpu::fill(d, partials, (plan.lanes - 1) * plan.partial_floats, 0.0f);
  const int kk = c.kernel * c.kernel;
  const ImageShape zs = nn::conv_output_shape(xs, c);
  const ConvShape flipped_conv = flipped_of(c);  // dx = W flipped, convolved with dz (where dx_by_convolution)
  const bool dx_by_winograd = dx && plan.dx_by_convolution && multiplies_by_winograd(zs, flipped_conv);
  float* U = scratch.data + plan.scratch_floats() - plan.winograd_floats;  // its Winograd transform, if used
  if (dx && plan.dx_by_convolution) flip_weights(d, W, c, flipped);
  if (dx_by_winograd) winograd_weights(d, flipped, flipped_conv, U);
  for_each_tile(d, plan, xs.batch, [&](int lane, int first, int count) {
    float* col = scratch.data + lane * (plan.tile_floats + plan.dcol_floats);  // [K][count*Q]
    float* second = col + plan.tile_floats;  // dcol [K][count*Q], or dz unfolded [Cout*k*k][count*Q]
    float* dW_lane = lane == 0 ? dW : partials + (lane - 1) * plan.partial_floats;
    const float* dz_tile = dz + i64(first) * s.Q;  // [Cout][count*Q], a block of dz [Cout][P]
    const int columns = count * s.Q;
    unfold_tile(d, x, xs, c, first, count, col);  // the forward pass's tile, unfolded again
    // dW += dz_tile col^T      [Cout x K] = [Cout x columns][columns x K]
    gemm(d, Transpose::No, Transpose::Yes, c.out_channels, s.K, columns, 1.0f, dz_tile, s.P, col, columns, 1.0f,
         dW_lane, s.K);
    if (!dx) return;
    if (plan.dx_by_convolution) {
      // dx's columns of these images = W flipped, convolved with dz's (same padding: 2p = k - 1)
      //   [Cin x columns] = [Cin x Cout*k*k][Cout*k*k x columns], in dx [Cin][B*H*W]
      if (dx_by_winograd) {  // the CPU's fewer multiplies, as the forward pass's
        winograd_conv_images(d, dz, zs, flipped_conv, U, nullptr, first, count, dx + i64(first) * s.Q, s.P);
        return;
      }
      if (multiplies_in_panels(zs, flipped_conv)) {  // the CPU's kernel, as the forward pass's
        panel_conv_images(d, dz, zs, flipped_conv, flipped, nullptr, first, count, dx + i64(first) * s.Q, s.P);
        return;
      }
      im2col_shifted_images(d, dz, zs, flipped_conv, first, count, second);
      gemm(d, Transpose::No, Transpose::No, c.in_channels, columns, c.out_channels * kk, 1.0f, flipped,
           c.out_channels * kk, second, columns, 0.0f, dx + i64(first) * s.Q, s.P);
      return;
    }
    // dcol = W^T dz_tile       [K x columns] = [K x Cout][Cout x columns]; then folded back
    gemm(d, Transpose::Yes, Transpose::No, s.K, columns, c.out_channels, 1.0f, W, s.K, dz_tile, s.P, 0.0f, second,
         columns);
    nn::col2im_images(d, second, xs, c, first, count, dx);
  });
  for (int lane = 1; lane < plan.lanes; ++lane)
    mgpu::add_into(d, dW, partials + (lane - 1) * plan.partial_floats, plan.partial_floats);
  // db += dz ones             [Cout x 1] = [Cout x P][P x 1]
  gemm(d, Transpose::No, Transpose::No, c.out_channels, 1, s.P, 1.0f, dz, ones, 1.0f, db);
}

}  // namespace fast
