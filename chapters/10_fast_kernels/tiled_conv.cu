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
// Winograd's F(2x2, 3x3) (below) is built for CPUs with AVX-512 (16 floats a vector) or AVX2 (8).
#if !MGPU_CUDA && (defined(__AVX512F__) || defined(__AVX2__))
#define FAST_WINOGRAD 1
#include <immintrin.h>  // the 128-bit loads and inserts that gather Winograd's tiles
#else
#define FAST_WINOGRAD 0
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

// The tile positions the weight gradient's V and D hold for a slice of `count` images: its 2x2
// tiles, rounded up to whole groups of 16 (kLanes with AVX-512, two groups of kLanes with AVX2).
i64 winograd_tile_positions(int H, int W, int count) {
  const i64 tiles = i64(count) * ((H + 1) / 2) * ((W + 1) / 2);
  return (tiles + 15) / 16 * 16;
}
// Room for the weight gradient by Winograd (weight_gradient_by_winograd): per lane, V [16][Cin][T]
// and D [16][T][Cout] for a slice of `images` images, and the lane's dU [16][Cin][Cout]; else 0.
i64 winograd_dw_floats_of(ImageShape xs, ConvShape c, int images, int lanes) {
  if (!weight_gradient_by_winograd(xs, c)) return 0;
  const i64 T = winograd_tile_positions(xs.height, xs.width, images);
  return lanes * 16 * (T * (c.in_channels + c.out_channels) + i64(c.in_channels) * c.out_channels);
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
                    plan.winograd_floats == winograd_floats_of(xs, c) &&
                    plan.winograd_dw_floats == winograd_dw_floats_of(xs, c, plan.images, plan.lanes);
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
// `width` of the panel's NV * kLanes columns (a row of the panel: NV vectors, kPanel floats unless
// NV = 1); z starts from `init` (the bias, or null for 0) unless `accumulate` (z holds sums so far).
template <int R, int NV = kVectors>
void multiply_panel(const float* panel, int K, const float* W, std::int64_t ldw, const float* init, bool accumulate,
                    float* z, std::int64_t ldz, int width) {
  constexpr int kWide = NV * kLanes;
  vf acc[R][NV];
  float partial[R][kWide];  // a last, narrower panel goes through here
  for (int r = 0; r < R; ++r) {
    if (accumulate && width < kWide)
      for (int j = 0; j < kWide; ++j) partial[r][j] = j < width ? z[r * ldz + j] : 0.0f;
    for (int v = 0; v < NV; ++v) {
      if (accumulate)
        acc[r][v] = load_vector((width < kWide ? partial[r] : z + r * ldz) + kLanes * v);
      else
        acc[r][v] = vf{} + (init ? init[r] : 0.0f);
    }
  }
  for (int k = 0; k < K; ++k) {
    vf in[NV];
    for (int v = 0; v < NV; ++v) {
      in[v] = load_vector(panel + std::int64_t(k) * kWide + kLanes * v);
#if defined(__x86_64__)
      // Into a register, once: left alone, GCC reads it again from the panel in each of the
      // kRows multiply-adds (a memory operand), and the loads, not the multiply-adds, set the
      // pace. (An empty asm that "changes" the register: the compiler must keep it there.)
      __asm__("" : "+x"(in[v]));
#endif
    }
    for (int r = 0; r < R; ++r) {
      const float w = W[r * ldw + k];
      for (int v = 0; v < NV; ++v) acc[r][v] += w * in[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    if (width == kWide) {
      for (int v = 0; v < NV; ++v) store_vector(z + r * ldz + kLanes * v, acc[r][v]);
    } else {
      for (int v = 0; v < NV; ++v) store_vector(partial[r] + kLanes * v, acc[r][v]);
      for (int j = 0; j < width; ++j) z[r * ldz + j] = partial[r][j];
    }
  }
}

// multiply_panel for `rows` (1..kRows) rows of W: one register block of that height.
template <int NV = kVectors>
void multiply_rows(int rows, const float* panel, int K, const float* W, std::int64_t ldw, const float* init,
                   bool accumulate, float* z, std::int64_t ldz, int width) {
  switch (rows) {  // (cases 7 and 8 are there for AVX-512's kRows = 8; with AVX2's 6 they never run)
    case 8: return multiply_panel<8, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    case 7: return multiply_panel<7, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    case 6: return multiply_panel<6, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    case 5: return multiply_panel<5, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    case 4: return multiply_panel<4, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    case 3: return multiply_panel<3, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    case 2: return multiply_panel<2, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
    default: return multiply_panel<1, NV>(panel, K, W, ldw, init, accumulate, z, ldz, width);
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
        multiply_rows(std::min(kRows, Cout - co), panel, rows, Wr, K, ir, accumulate, zr, ldz, width);
      }
    }
  }
};

#if FAST_WINOGRAD
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
// (load_blocks), and the 2x2 outputs leave through the same transpose backwards. Built for
// AVX-512 (a vector is four 128-bit blocks: four tiles' rows at once) and for AVX2 (two blocks),
// and used only where the README's measurements found it faster than PanelConv: from 16 input
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

// Tiles are taken kLanes at a time, one per lane of a vector, in a transposed order: lane 4r + q
// (r: its 128-bit block of the vector, q: its place in the block) holds the group's tile
// kBlocks q + r. That is the order in which four 16-byte rows of kBlocks tiles' blocks a vector
// come out of the transpose in winograd_inputs; the products do not care, and the masks, the
// outputs' addresses and the weight gradient's tiles are made in the same order.
constexpr int kBlocks = kLanes / 4;  // 128-bit blocks in a vector: 4 with AVX-512, 2 with AVX2
inline int tile_in_lane(int lane) { return kBlocks * (lane % 4) + lane / 4; }
inline int lane_of_tile(int tile) { return 4 * (tile % kBlocks) + tile / kBlocks; }  // its inverse

// Where kLanes tiles t0.. of a slice's count images lie (tile t is image t / (Th*Tw), tile row
// t / Tw % Th, tile column t % Tw; Th = ceil(H/2), Tw = ceil(W/2)); a lane whose tile is past the
// slice's last (t >= tiles) has every mask bit 0. Offsets are within one channel's slice.
struct TileGroup {
  std::int32_t block_at[kLanes];  // lane l: its 4x4 block's corner (2ty - 1, 2tx - 1)
  std::int32_t out_at[kLanes];    // lane l: its 2x2 output's corner (2ty, 2tx)
  // By tile (not lane): where row i of tile t's block starts, or a row of the tile's own where
  // row i lies outside the image, so that every 16-byte row load stays in x.
  std::int32_t row_at[4][kLanes];
  std::uint32_t row_in[4] = {}, col_in[4] = {}, live = 0;  // bit l: lane l's row / column i inside; a tile
  vi inside[4][4];  // lane l: all bits set where pixel (i, j) of lane l's block is inside the image, else 0
  std::int32_t lowest = 0, highest = 0;  // what the row loads touch: [lowest, highest)

  TileGroup(int t0, int tiles, int H, int W) {
    const int Th = (H + 1) / 2, Tw = (W + 1) / 2, plane = H * W;
    for (int l = 0; l < kLanes; ++l) {
      const int tile = tile_in_lane(l), t = t0 + tile;
      const std::uint32_t bit = 1u << l;
      const int image = t / (Th * Tw), ty = t / Tw % Th, tx = t % Tw;
      const bool real = t < tiles;
      block_at[l] = real ? image * plane + (2 * ty - 1) * W + 2 * tx - 1 : 0;
      out_at[l] = real ? image * plane + 2 * ty * W + 2 * tx : 0;
      if (real) live |= bit;
      for (int s = 0; s < 4; ++s) {
        const bool row_inside = real && 2 * ty - 1 + s >= 0 && 2 * ty - 1 + s < H;
        if (row_inside) row_in[s] |= bit;
        if (real && 2 * tx - 1 + s >= 0 && 2 * tx - 1 + s < W) col_in[s] |= bit;
        row_at[s][tile] = real ? image * plane + (row_inside ? 2 * ty - 1 + s : 2 * ty) * W + 2 * tx - 1 : 0;
        lowest = std::min(lowest, row_at[s][tile]);
        highest = std::max(highest, row_at[s][tile] + 4);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < kLanes; ++l) inside[i][j][l] = (row_in[i] & col_in[j]) >> l & 1 ? -1 : 0;
  }
};

// Shuffles within each 128-bit block (the same in every block, as x86's unpack and shuffle
// instructions work), written with the compiler's generic shuffle (GCC 12 warns about the
// intrinsics' own undefined start value):
//   unpack_low / unpack_high   a's and b's first two floats interleaved, or their last two
//                              (_mm512_unpacklo_ps / _mm256_unpacklo_ps, and ..hi..)
//   pairs_low / pairs_high     a's first two floats then b's, or their last two (_mm*_shuffle_ps
//                              with 0x44 and 0xEE)
// and across blocks:
//   blocks_even / blocks_odd   a's even-numbered 128-bit blocks then b's, or the odd ones
//                              (_mm512_shuffle_f32x4 with 0x88 and 0xDD; with AVX2's two blocks,
//                              _mm256_permute2f128_ps with 0x20 and 0x31)
#if defined(__AVX512F__)
inline vf unpack_low(vf a, vf b) {
  return __builtin_shufflevector(a, b, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
}
inline vf unpack_high(vf a, vf b) {
  return __builtin_shufflevector(a, b, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
}
inline vf pairs_low(vf a, vf b) {
  return __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
}
inline vf pairs_high(vf a, vf b) {
  return __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}
inline vf blocks_even(vf a, vf b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
}
inline vf blocks_odd(vf a, vf b) {
  return __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
#else  // AVX2
inline vf unpack_low(vf a, vf b) { return __builtin_shufflevector(a, b, 0, 8, 1, 9, 4, 12, 5, 13); }
inline vf unpack_high(vf a, vf b) { return __builtin_shufflevector(a, b, 2, 10, 3, 11, 6, 14, 7, 15); }
inline vf pairs_low(vf a, vf b) { return __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13); }
inline vf pairs_high(vf a, vf b) { return __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15); }
inline vf blocks_even(vf a, vf b) { return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11); }
inline vf blocks_odd(vf a, vf b) { return __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15); }
#endif

// v[i][4L + j] becomes v[j][4L + i]: in each 128-bit block L, the 4 x 4 matrix that the four
// vectors' blocks make is transposed (12 shuffles). load_blocks turns kBlocks tiles' block rows a
// vector into columns with it, winograd_outputs four outputs into each tile's four, and
// transpose_lanes starts with it.
inline void transpose_in_blocks(vf v[4]) {
  const vf lo01 = unpack_low(v[0], v[1]), hi01 = unpack_high(v[0], v[1]);
  const vf lo23 = unpack_low(v[2], v[3]), hi23 = unpack_high(v[2], v[3]);
  v[0] = pairs_low(lo01, lo23);
  v[1] = pairs_high(lo01, lo23);
  v[2] = pairs_low(hi01, hi23);
  v[3] = pairs_high(hi01, hi23);
}
// r[i][j] becomes r[j][i] for a kLanes x kLanes block held as kLanes vectors (r[i] a row): each
// quadruple of rows transposed in its blocks, then 128-bit blocks across quadruples (64 shuffles
// for AVX-512's 16 x 16, 16 for AVX2's 8 x 8), no memory.
inline void transpose_lanes(vf r[kLanes]) {
  vf u[kLanes];  // u[k + m], block L: column 4L + m of rows k..k+3
  for (int k = 0; k < kLanes; k += 4) {
    for (int m = 0; m < 4; ++m) u[k + m] = r[k + m];
    transpose_in_blocks(u + k);
  }
  for (int m = 0; m < 4; ++m) {
#if defined(__AVX512F__)  // column 4L + m = blocks L of u[m], u[4 + m], u[8 + m], u[12 + m]
    const vf even01 = blocks_even(u[m], u[4 + m]), odd01 = blocks_odd(u[m], u[4 + m]);
    const vf even23 = blocks_even(u[8 + m], u[12 + m]), odd23 = blocks_odd(u[8 + m], u[12 + m]);
    r[m] = blocks_even(even01, even23);
    r[4 + m] = blocks_even(odd01, odd23);
    r[8 + m] = blocks_odd(even01, even23);
    r[12 + m] = blocks_odd(odd01, odd23);
#else  // AVX2: column 4L + m = block L of u[m], then block L of u[4 + m]
    r[m] = blocks_even(u[m], u[4 + m]);
    r[4 + m] = blocks_odd(u[m], u[4 + m]);
#endif
  }
}

// kBlocks rows of four floats, slice + at[0], slice + at[1], ..., one in each 128-bit block.
inline vf load_rows(const float* slice, const std::int32_t* at) {
#if defined(__AVX512F__)
  __m512 v = _mm512_zextps128_ps512(_mm_loadu_ps(slice + at[0]));
  v = _mm512_insertf32x4(v, _mm_loadu_ps(slice + at[1]), 1);
  v = _mm512_insertf32x4(v, _mm_loadu_ps(slice + at[2]), 2);
  return (vf)_mm512_insertf32x4(v, _mm_loadu_ps(slice + at[3]), 3);
#else
  return (vf)_mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(slice + at[0])), _mm_loadu_ps(slice + at[1]), 1);
#endif
}

// Rows [row_begin, row_end) of the group's 4x4 blocks in one channel: d[i][j] is pixel
// (2ty - 1 + i, 2tx - 1 + j) of each lane's tile, 0 outside the image. slice is that channel's
// count images, at `offset` floats into the tensor (x_floats long). A block's row is four
// contiguous floats: one 16-byte load; kBlocks tiles' rows make a vector (one per 128-bit block),
// and a 4x4 transpose inside the blocks turns four such vectors into the four columns
// d[i][0..3], each lane one tile. Only where that would read past either end of the tensor (its
// very first or last tile) are the pixels read one by one instead, those inside the image only.
inline void load_blocks(const TileGroup& g, const float* slice, std::int64_t offset, std::int64_t x_floats, int W,
                        int row_begin, int row_end, vf d[4][4]) {
  if (offset + g.lowest >= 0 && offset + g.highest <= x_floats) {
    for (int i = row_begin; i < row_end; ++i) {
      vf rows[4];  // rows[q], block r: row i of tile kBlocks q + r
      for (int q = 0; q < 4; ++q) rows[q] = load_rows(slice, g.row_at[i] + kBlocks * q);
      transpose_in_blocks(rows);  // rows[j]: column j of the four rows, one tile a lane
      for (int j = 0; j < 4; ++j) d[i][j] = (vf)((vi)rows[j] & g.inside[i][j]);
    }
  } else {
    for (int i = row_begin; i < row_end; ++i)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < kLanes; ++l) d[i][j][l] = g.inside[i][j][l] ? slice[g.block_at[l] + i * W + j] : 0.0f;
  }
}

// V[ξ] = (Bᵀ d B)[ξ] for the group's tiles in one channel (load_blocks' arguments).
inline void winograd_inputs(const TileGroup& g, const float* slice, std::int64_t offset, std::int64_t x_floats, int W,
                            vf V[16]) {
  vf d[4][4];
  load_blocks(g, slice, offset, x_floats, W, 0, 4, d);
  vf Bd[4][4];  // Bᵀ d: rows combined
  for (int j = 0; j < 4; ++j) {
    Bd[0][j] = d[0][j] - d[2][j];
    Bd[1][j] = d[1][j] + d[2][j];
    Bd[2][j] = d[2][j] - d[1][j];
    Bd[3][j] = d[1][j] - d[3][j];
  }
  for (int i = 0; i < 4; ++i) {  // (Bᵀ d) B: columns combined
    V[4 * i + 0] = Bd[i][0] - Bd[i][2];
    V[4 * i + 1] = Bd[i][1] + Bd[i][2];
    V[4 * i + 2] = Bd[i][2] - Bd[i][1];
    V[4 * i + 3] = Bd[i][1] - Bd[i][3];
  }
}

// The group's 2x2 outputs in one channel, y = Aᵀ m A + bias, from its 16 sums m[ξ] (a vector of
// tiles each), written to zr (the channel's slice of z): (2ty, 2tx) always, the column 2tx + 1 and
// the row 2ty + 1 only where they lie inside the image (odd sides: the last tile's half). The four
// vectors y00, y01, y10, y11 go through load_blocks' transpose backwards (it is its own inverse),
// which gathers each tile's four values into one 128-bit block, [y00 y01 y10 y11]: two 8-byte
// stores a tile. (AVX-512's scatters, one per vector, cost a third of this kernel's time.)
inline void winograd_outputs(const TileGroup& g, const vf m[16], float bias, float* zr, int W) {
  vf Am[2][4];  // Aᵀ m: rows combined
  for (int j = 0; j < 4; ++j) {
    Am[0][j] = m[j] + m[4 + j] + m[8 + j];
    Am[1][j] = m[4 + j] - m[8 + j] - m[12 + j];
  }
  vf out4[4] = {Am[0][0] + Am[0][1] + Am[0][2] + bias, Am[0][1] - Am[0][2] - Am[0][3] + bias,
                Am[1][0] + Am[1][1] + Am[1][2] + bias, Am[1][1] - Am[1][2] - Am[1][3] + bias};
  transpose_in_blocks(out4);  // out4[q], block r: tile kBlocks q + r's [y00 y01 y10 y11]
  alignas(64) float y[kLanes][4];  // y[t]: tile t's [y00 y01 y10 y11], in tile order
  for (int q = 0; q < 4; ++q) store_vector(y[kBlocks * q], out4[q]);
  for (int t = 0; t < kLanes; ++t) {
    const int lane = lane_of_tile(t);
    const std::uint32_t bit = 1u << lane;
    if (!(g.live & bit)) break;  // the slice's tiles are done
    float* out = zr + g.out_at[lane];
    const bool right = g.col_in[2] & bit, below = g.row_in[2] & bit;  // 2tx + 1 < W, 2ty + 1 < H
    if (right && below) {
      std::memcpy(out, y[t], 8);
      std::memcpy(out + W, y[t] + 2, 8);
      continue;
    }
    out[0] = y[t][0];
    if (right) out[1] = y[t][1];
    if (below) out[W] = y[t][2];
  }
}

// Item: one panel of kPanel tiles (two groups) of a slice's count images, for every output
// channel: the 2x2 pixels of each tile, z[co][e] = b[co] + (the convolution), e in the slice's
// columns of z. Per panel: V [16][Cin][kPanel], the tiles' Bᵀ d B for every input channel (in the
// thread's own buffer: items of one call may run on several threads at once); then kRows output
// channels at a time, the 16 products U[ξ] V[ξ] into M [16][kRows][kPanel], and y = Aᵀ M A.
struct WinogradConv {
  const float* x;  // [Cin][B][H][W]
  const float* U;  // [16][Cout][Cin], WinogradWeights'
  const float* b;  // [Cout], or null: no bias
  float* z;        // the slice's first output column: z[co * ldz + e]
  std::int64_t ldz;
  int B, first, count, H, Wd, Cin, Cout;

  void operator()(std::int64_t item) const {
    const int tiles = count * ((H + 1) / 2) * ((Wd + 1) / 2), plane = H * Wd;
    const TileGroup groups[kVectors] = {{int(item) * kPanel, tiles, H, Wd}, {int(item) * kPanel + kLanes, tiles, H, Wd}};
    // 1. V = Bᵀ d B for every input channel.
    thread_local std::vector<float> inputs;
    inputs.resize(std::size_t(16) * Cin * kPanel);
    float* V = inputs.data();  // V[ξ][ci][l]: row ci of ξ's panel at V + (ξ * Cin + ci) * kPanel
    const std::int64_t x_floats = std::int64_t(Cin) * B * plane;
    for (int ci = 0; ci < Cin; ++ci) {
      const std::int64_t offset = (std::int64_t(ci) * B + first) * plane;  // channel ci's count images
      for (int v = 0; v < kVectors; ++v) {
        vf tile_inputs[16];
        winograd_inputs(groups[v], x + offset, offset, x_floats, Wd, tile_inputs);
        for (int xi = 0; xi < 16; ++xi) store_vector(V + (std::int64_t(xi) * Cin + ci) * kPanel + kLanes * v, tile_inputs[xi]);
      }
    }
    // 2. kRows output channels at a time: M[ξ] = U[ξ] V[ξ], then y = Aᵀ M A.
    alignas(64) float M[16][kRows][kPanel];
    for (int co = 0; co < Cout; co += kRows) {
      const int rows = std::min(kRows, Cout - co);
      for (int xi = 0; xi < 16; ++xi)
        multiply_rows(rows, V + std::int64_t(xi) * Cin * kPanel, Cin, U + (std::int64_t(xi) * Cout + co) * Cin, Cin,
                      nullptr, false, &M[xi][0][0], kPanel, kPanel);
      for (int r = 0; r < rows; ++r)
        for (int v = 0; v < kVectors; ++v) {
          vf m[16];
          for (int xi = 0; xi < 16; ++xi) m[xi] = load_vector(&M[xi][r][kLanes * v]);
          winograd_outputs(groups[v], m, b ? b[co + r] : 0.0f, z + std::int64_t(co + r) * ldz, Wd);
        }
    }
  }
};

// --- The weight gradient by the same transforms (step 7, second part)
//
// y = Aᵀ [U ⊙ V] A is linear in U, so the loss's gradient with respect to U is, summed over the
// tiles, (A dy Aᵀ) ⊙ V, with dy a tile's 2x2 of dz; and as U = G g Gᵀ, dg = Gᵀ dU G. So, per
// slice of images: V as the forward pass makes it, D = A dy Aᵀ (4x4 from 2x2, additions only) for
// every tile and output channel, then for each ξ one product dU[ξ] [Cin x Cout] += V[ξ] [Cin x
// tiles] D[ξ] [tiles x Cout], summed over the tiles: 16 of them, 16 multiply-adds per tile and
// channel pair where im2col's product does 36. Each lane sums its own dU over its slices; at the
// end dW += Gᵀ (Σ over lanes dU) G, in lane order: a fixed order, as the GEMM path's partials.
//   V   [16][Cin][T]              T: the slice's tiles rounded up to kLanes, in tile_in_lane order
//   D   [16][Cout / w][T][w]      w (16 or 32 output channels) a panel row: multiply_panel's layout
//   dU  [lanes][16][Cin][Cout]

// Item: one group of kLanes tiles of the slice: V[ξ][ci][16 * item + l] for every input channel.
struct WinogradTileInputs {
  const float* x;  // [Cin][B][H][W]
  float* V;        // [16][Cin][T]
  std::int64_t T;
  int B, first, count, H, Wd, Cin;
  void operator()(std::int64_t item) const {
    const int tiles = count * ((H + 1) / 2) * ((Wd + 1) / 2), plane = H * Wd;
    const TileGroup g(int(item) * kLanes, tiles, H, Wd);
    const std::int64_t x_floats = std::int64_t(Cin) * B * plane;
    for (int ci = 0; ci < Cin; ++ci) {
      const std::int64_t offset = (std::int64_t(ci) * B + first) * plane;
      vf tile_inputs[16];
      winograd_inputs(g, x + offset, offset, x_floats, Wd, tile_inputs);
      for (int xi = 0; xi < 16; ++xi) store_vector(V + (std::int64_t(xi) * Cin + ci) * T + kLanes * item, tile_inputs[xi]);
    }
  }
};

// Item: one group of kLanes tiles, positions 16 * item.. of T (as V holds them): D[ξ][cb][p][...]
// = (A dy Aᵀ)[ξ] for every output channel, dy the tile's 2x2 of dz, 0 outside the image. A
// channel's 2x2 blocks are rows and columns 1..2 of the same 4x4 windows the input's are
// (load_blocks), so A dy Aᵀ comes out as 16 vectors over the group's tiles; for kLanes channels
// those make, for each ξ, a kLanes x kLanes block [channel][tile], which transpose_lanes turns
// into D's rows [tile][channel]. (The rows of the products' panels run along the output channels.)
struct WinogradTileGradients {
  const float* dz;  // [Cout][B][H][W]
  float* D;         // [16][Cout / w][T][w]
  std::int64_t T;
  int B, first, count, H, Wd, Cout, w;
  void operator()(std::int64_t item) const {
    const int tiles = count * ((H + 1) / 2) * ((Wd + 1) / 2), plane = H * Wd;
    const TileGroup g(int(item) * kLanes, tiles, H, Wd);
    const std::int64_t dz_floats = std::int64_t(Cout) * B * plane;
    for (int co = 0; co < Cout; co += kLanes) {
      vf block[16][kLanes];  // block[ξ][channel co + c]: a vector over the group's tiles
      for (int c = 0; c < kLanes; ++c) {
        const std::int64_t offset = (std::int64_t(co + c) * B + first) * plane;
        vf d[4][4];
        load_blocks(g, dz + offset, offset, dz_floats, Wd, 1, 3, d);
        const vf dy00 = d[1][1], dy01 = d[1][2], dy10 = d[2][1], dy11 = d[2][2];
        const vf Ady[4][2] = {{dy00, dy01}, {dy00 + dy10, dy01 + dy11}, {dy00 - dy10, dy01 - dy11}, {-dy10, -dy11}};
        for (int i = 0; i < 4; ++i) {  // (A dy) Aᵀ: columns combined
          block[4 * i + 0][c] = Ady[i][0];
          block[4 * i + 1][c] = Ady[i][0] + Ady[i][1];
          block[4 * i + 2][c] = Ady[i][0] - Ady[i][1];
          block[4 * i + 3][c] = -Ady[i][1];
        }
      }
      const int cb = co / w, in_row = co % w;  // these channels' place in D's panel rows
      for (int xi = 0; xi < 16; ++xi) {
        transpose_lanes(block[xi]);  // block[xi][l]: lane l's tile, across the kLanes channels
        float* row = D + ((std::int64_t(xi) * (Cout / w) + cb) * T + kLanes * item) * w + in_row;
        for (int l = 0; l < kLanes; ++l) store_vector(row + std::int64_t(l) * w, block[xi][l]);
      }
    }
  }
};

// Item (ξ, cb, ci block): dU[ξ][ci..ci+kRows)[cb * w..) += V[ξ][ci..][all T] D[ξ][cb][all T][..].
struct WinogradWeightProducts {
  const float* V;  // [16][Cin][T]
  const float* D;  // [16][Cout / w][T][w]
  float* dU;       // [16][Cin][Cout], this lane's
  std::int64_t T;
  int Cin, Cout, w;
  void operator()(std::int64_t item) const {
    const int blocks = (Cin + kRows - 1) / kRows, per_xi = (Cout / w) * blocks;
    const int xi = int(item / per_xi), cb = int(item / blocks % (Cout / w)), ci = int(item % blocks) * kRows;
    const float* panel = D + (std::int64_t(xi) * (Cout / w) + cb) * T * w;
    const float* Vr = V + (std::int64_t(xi) * Cin + ci) * T;
    float* out = dU + (std::int64_t(xi) * Cin + ci) * Cout + cb * w;
    if (w == 2 * kLanes)
      multiply_rows<2>(std::min(kRows, Cin - ci), panel, int(T), Vr, T, nullptr, true, out, Cout, w);
    else
      multiply_rows<1>(std::min(kRows, Cin - ci), panel, int(T), Vr, T, nullptr, true, out, Cout, w);
  }
};

// Item (co, ci): dW[co][ci] (3x3) += Gᵀ (Σ over lanes dU[lane][·][ci][co]) G.
struct WinogradWeightGradientSum {
  const float* dU;  // [lanes][16][Cin][Cout]
  float* dW;        // [Cout][Cin][3][3]
  int lanes, Cin, Cout;
  void operator()(std::int64_t item) const {
    const int co = int(item / Cin), ci = int(item % Cin);
    const std::int64_t plane = std::int64_t(Cin) * Cout;
    float u[4][4] = {};
    for (int lane = 0; lane < lanes; ++lane)
      for (int xi = 0; xi < 16; ++xi) u[xi / 4][xi % 4] += dU[(lane * 16 + xi) * plane + std::int64_t(ci) * Cout + co];
    float Gu[3][4];  // Gᵀ u: rows combined
    for (int j = 0; j < 4; ++j) {
      Gu[0][j] = u[0][j] + 0.5f * (u[1][j] + u[2][j]);
      Gu[1][j] = 0.5f * (u[1][j] - u[2][j]);
      Gu[2][j] = 0.5f * (u[1][j] + u[2][j]) + u[3][j];
    }
    float* g = dW + item * 9;  // item = co * Cin + ci
    for (int i = 0; i < 3; ++i) {  // (Gᵀ u) G: columns combined
      g[3 * i + 0] += Gu[i][0] + 0.5f * (Gu[i][1] + Gu[i][2]);
      g[3 * i + 1] += 0.5f * (Gu[i][1] - Gu[i][2]);
      g[3 * i + 2] += 0.5f * (Gu[i][1] + Gu[i][2]) + Gu[i][3];
    }
  }
};
#endif  // FAST_WINOGRAD
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
#if !FAST_WINOGRAD
  (void)xs, (void)c;
  return false;
#else
  return c.kernel == 3 && c.stride == 1 && c.padding == 1 && c.in_channels >= kWinogradMinChannels &&
         xs.height > 0 && xs.width > 0;
#endif
}

bool weight_gradient_by_winograd(ImageShape xs, ConvShape c) {
#if !FAST_WINOGRAD
  (void)xs, (void)c;
  return false;
#else
  // Whole groups of 16 channels: one vector of AVX-512's, two of AVX2's (D's panel rows).
  return multiplies_by_winograd(xs, c) && c.out_channels % 16 == 0;
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
#if !FAST_WINOGRAD
  (void)d, (void)W, (void)c, (void)U;
  throw mgpu::Error("winograd_weights: a kernel of the cpu build for AVX-512 or AVX2 only");
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
#if !FAST_WINOGRAD
  (void)d, (void)x, (void)xs, (void)c, (void)U, (void)b, (void)first, (void)count, (void)z, (void)ldz;
  throw mgpu::Error("winograd_conv_images: a kernel of the cpu build for AVX-512 or AVX2 only");
#else
  const i64 tiles = i64(count) * ((xs.height + 1) / 2) * ((xs.width + 1) / 2);
  const i64 pixels = i64(count) * xs.height * xs.width;
  mgpu::for_each_index(d, (tiles + kPanel - 1) / kPanel,
                       WinogradConv{x, U, b, z, ldz, xs.batch, first, count, xs.height, xs.width, c.in_channels,
                                    c.out_channels},
                       sizeof(float) * double(pixels) * (c.in_channels + c.out_channels));
#endif
}

// The weight gradient of one slice of images [first, first + count) by Winograd's transforms, for
// a convolution that weight_gradient_by_winograd: this lane's dU [16][Cin][Cout] += the slice's
// sums; `work` holds its V and D (winograd_dw_floats_of's share of a lane, less dU).
void winograd_weight_gradient_images(const Device& d, const float* x, const float* dz, ImageShape xs, ConvShape c,
                                     int first, int count, float* work, float* dU) {
#if !FAST_WINOGRAD
  (void)d, (void)x, (void)dz, (void)xs, (void)c, (void)first, (void)count, (void)work, (void)dU;
  throw mgpu::Error("winograd_weight_gradient_images: a kernel of the cpu build for AVX-512 or AVX2 only");
#else
  const int Cin = c.in_channels, Cout = c.out_channels, w = Cout % (2 * kLanes) == 0 ? 2 * kLanes : kLanes;
  const i64 T = winograd_tile_positions(xs.height, xs.width, count);
  float* V = work;                        // [16][Cin][T]
  float* D = V + 16 * i64(Cin) * T;       // [16][Cout / w][T][w]
  const double plane_bytes = sizeof(float) * double(count) * xs.height * xs.width;
  mgpu::for_each_index(d, T / kLanes, WinogradTileInputs{x, V, T, xs.batch, first, count, xs.height, xs.width, Cin},
                       plane_bytes * Cin + sizeof(float) * 16.0 * Cin * T);
  mgpu::for_each_index(d, T / kLanes, WinogradTileGradients{dz, D, T, xs.batch, first, count, xs.height, xs.width, Cout, w},
                       plane_bytes * Cout + sizeof(float) * 16.0 * Cout * T);
  mgpu::for_each_index(d, 16 * i64(Cout / w) * ((Cin + kRows - 1) / kRows),
                       WinogradWeightProducts{V, D, dU, T, Cin, Cout, w},
                       sizeof(float) * 16.0 * (i64(Cin) * T + i64(Cout) * T + 2 * i64(Cin) * Cout));
#endif
}

// dW += Gᵀ (the lanes' dU, summed in lane order) G.
void winograd_weight_gradient_sum(const Device& d, const float* dU, int lanes, ConvShape c, float* dW) {
#if !FAST_WINOGRAD
  (void)d, (void)dU, (void)lanes, (void)c, (void)dW;
  throw mgpu::Error("winograd_weight_gradient_sum: a kernel of the cpu build for AVX-512 or AVX2 only");
#else
  const i64 pairs = i64(c.out_channels) * c.in_channels;
  mgpu::for_each_index(d, pairs, WinogradWeightGradientSum{dU, dW, lanes, c.in_channels, c.out_channels},
                       sizeof(float) * double(pairs) * (16.0 * lanes + 18));
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
  plan.winograd_dw_floats = winograd_dw_floats_of(xs, c, plan.images, plan.lanes);
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
    float* U = scratch.data + plan.scratch_floats() - plan.winograd_dw_floats - plan.winograd_floats;
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
  const int kk = c.kernel * c.kernel;
  const ImageShape zs = nn::conv_output_shape(xs, c);
  const ConvShape flipped_conv = flipped_of(c);  // dx = W flipped, convolved with dz (where dx_by_convolution)
  const bool dx_by_winograd = dx && plan.dx_by_convolution && multiplies_by_winograd(zs, flipped_conv);
  float* U = flipped + (plan.dx_by_convolution ? plan.partial_floats : 0);  // its Winograd transform, if used
  // The weight gradient by Winograd (where weight_gradient_by_winograd): each lane's V and D, then
  // the lanes' dU, zeroed here and summed into dW after the tiles.
  const bool dW_by_winograd = plan.winograd_dw_floats > 0;
  const i64 dw_work = plan.winograd_dw_floats / plan.lanes - 16 * i64(c.in_channels) * c.out_channels;
  float* dw_work_of_lanes = U + plan.winograd_floats;                     // [lanes][dw_work]
  float* dU_of_lanes = dw_work_of_lanes + plan.lanes * dw_work;            // [lanes][16][Cin][Cout]
  // The lanes' sums start from 0: dU where the weight gradient is by Winograd, else the partials.
  if (dW_by_winograd)
    mgpu::fill(d, dU_of_lanes, plan.lanes * 16 * i64(c.in_channels) * c.out_channels, 0.0f);
  else
    mgpu::fill(d, partials, (plan.lanes - 1) * plan.partial_floats, 0.0f);
  if (dx && plan.dx_by_convolution) flip_weights(d, W, c, flipped);
  if (dx_by_winograd) winograd_weights(d, flipped, flipped_conv, U);
  for_each_tile(d, plan, xs.batch, [&](int lane, int first, int count) {
    float* col = scratch.data + lane * (plan.tile_floats + plan.dcol_floats);  // [K][count*Q]
    float* second = col + plan.tile_floats;  // dcol [K][count*Q], or dz unfolded [Cout*k*k][count*Q]
    float* dW_lane = lane == 0 ? dW : partials + (lane - 1) * plan.partial_floats;
    const float* dz_tile = dz + i64(first) * s.Q;  // [Cout][count*Q], a block of dz [Cout][P]
    const int columns = count * s.Q;
    if (dW_by_winograd) {
      winograd_weight_gradient_images(d, x, dz, xs, c, first, count, dw_work_of_lanes + lane * dw_work,
                                      dU_of_lanes + lane * 16 * i64(c.in_channels) * c.out_channels);
    } else {
      unfold_tile(d, x, xs, c, first, count, col);  // the forward pass's tile, unfolded again
      // dW += dz_tile col^T      [Cout x K] = [Cout x columns][columns x K]
      gemm(d, Transpose::No, Transpose::Yes, c.out_channels, s.K, columns, 1.0f, dz_tile, s.P, col, columns, 1.0f,
           dW_lane, s.K);
    }
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
  if (dW_by_winograd) winograd_weight_gradient_sum(d, dU_of_lanes, plan.lanes, c, dW);
  for (int lane = 1; lane < plan.lanes && !dW_by_winograd; ++lane)
    mgpu::add_into(d, dW, partials + (lane - 1) * plan.partial_floats, plan.partial_floats);
  // db += dz ones             [Cout x 1] = [Cout x P][P x 1]
  gemm(d, Transpose::No, Transpose::No, c.out_channels, 1, s.P, 1.0f, dz, ones, 1.0f, db);
}

}  // namespace fast
