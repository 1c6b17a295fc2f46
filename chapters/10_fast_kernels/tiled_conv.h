// Chapter 10's convolution for a CPU: chapter 09's im2col + GEMM done a few images at a time,
// so that the unfolded input of one slice (a "tile" of col) is written into the core's cache,
// read from there by the GEMM, and never goes out to memory at full size.
//
// Why. Chapter 09 unfolds the whole batch first: at stage 1 of a width-16 ResNet-18 that is col
// [144][256*28*28], 115 MB, written by im2col and read back by the GEMM (twice a step: the
// backward pass unfolds again, and col2im reads a dcol as large). On a 2-core machine that copies
// at about 22 GB/s those bytes alone are 10-20 ms a convolution, and the GEMMs on 200,704-column
// matrices stream them from memory too. A tile of one image is 144 x 784 floats, 451 KB: it fits
// a core's 1 MB L2 cache, so the same unfolding costs cache bandwidth only. Same arithmetic, same
// layout ([C][B][H][W] activations, chapter 09's), a hundred times less scratch.
//
// Three more steps, for the convolutions whose output is as large as their input (stride 1,
// 2p = k - 1: all 3x3 ones of ResNet-18 but the three that halve the image):
//   - the unfolding is one shifted copy per row of col (im2col_shifted_images, below) instead
//     of chapter 09's row-by-row functor;
//   - the input gradient is itself such a convolution: dx = (W flipped) convolved with dz, so
//     dz's tile is unfolded the same way and ONE GEMM writes dx's columns, [Cin x Cout*k*k] x
//     [Cout*k*k x columns]. Chapter 09's way, dcol = W^T dz then col2im, writes a dcol as large
//     as col and reads it back to add nine shifted copies of it together, row by row;
//   - on a CPU, both products (z = W x and dx = W flipped dz) skip col and the GEMM: a few
//     pixels' unfolding is packed straight into a small panel that the multiply reads from the
//     cache, with a block of outputs held in vector registers (multiplies_in_panels, below).
//
// How the work is shared. Each tile is a slice of whole images [first, first + count). A device's
// lanes (common/parallel.h: on a CPU, one OpenMP thread each) take the tiles in turn, lane l the
// tiles l, l + lanes, ...; inside a lane the GEMM runs single-threaded, on that core's tile.
//   forward   per tile: unfold -> col tile [K][count*Ho*Wo] -> z's columns of those images =
//             W col (a block of z: row length B*Ho*Wo); then z += b once (in panels: the
//             tile's pixels a panel at a time, each z block starting from b)
//   backward  per tile: unfold again; dW += dz_tile col^T (lane 0 into dW, lane l > 0 into its
//             own partial, added in at the end: two lanes never write one array); then dx's
//             columns of those images (whole images: no two lanes write one plane of dx):
//               stride 1, same size: dz_tile unfolded [Cout*k*k][count*Ho*Wo], and
//                                    dx_tile = W flipped [Cin x Cout*k*k] times that (in
//                                    panels: dz's panels times W flipped, no unfolded tile)
//               otherwise:           dcol tile = W^T dz_tile, folded back by col2im_images;
//             then db += dz ones once
// The sums of dW are taken tile by tile, and dx's (stride 1) in the order of the flipped
// convolution, so both differ from chapter 09's in the last bits (test_fast_kernels: to within
// rounding); z adds the same products in the same order per element as chapter 09's GEMM does
// up to the BLAS's own blocking.
#pragma once
#include <cstdint>

#include "../09_resnet/layers.h"  // ConvShape, ConvScratch, im2col_images, col2im_images
#include "common/device.h"

namespace fast {

using lenet::ImageShape;
using mgpu::Device;
using nn::ConvShape;

// The largest col tile, in floats: 128 Ki floats, 512 KB, half the 1 MB L2 cache of a core of the
// 2-core machine this was measured on (the other half holds the GEMM's packed panels of W and of
// the output); a tile is never less than one image. chapters/10_fast_kernels/README.md: the
// measured step time at 64 KB to 4 MB.
constexpr std::int64_t kTileFloats = std::int64_t(128) * 1024;
// The fewest output columns (images x Ho*Wo) a tile has, whatever its size. Every tile's GEMMs
// read all of W and read and write all of dW, Cout x K floats (2.4 M at stage 4 of a width-64
// net: 9.4 MB), for 2 * Cout * K * columns FLOP; with few columns that traffic, not arithmetic,
// sets the pace. With one-image tiles (16 columns at stage 4) a width-64 step was slower than the
// whole-batch plan. Against one-image tiles, tiles of at least 256 columns took 0.89 of the time
// and of at least 1024 columns 0.80, 2048 no less than 1024; with 1024 the tiled run took 0.89 of
// the whole-batch plan's (three steps and the program around them, alternating runs, medians of
// 4). So a tile at 4x4 holds at least 64 images, one at 28x28 at least 2.
constexpr int kMinTileColumns = 1024;

// How tiled_conv cuts a batch of B images on a device: `images` a tile (the last one may have
// fewer), `tiles` tiles shared among `lanes` lanes, and the scratch that takes.
struct TilePlan {
  int images = 1, tiles = 1, lanes = 1;
  // The input gradient as a convolution of dz (where unfolds_by_shifting: dz's tile unfolded,
  // one GEMM with W flipped), else as chapter 09 does it (dcol = W^T dz, then col2im).
  bool dx_by_convolution = false;
  std::int64_t tile_floats = 0;     // one col tile: K * images * Ho*Wo
  std::int64_t dcol_floats = 0;     // the backward's second tile: dcol, or dz unfolded (Cout*k*k x columns)
  std::int64_t partial_floats = 0;  // one lane's share of dW (lanes 1..), and W flipped: Cout * K
  // Winograd's transform of W (forward) or of W flipped (dx), 16 * Cout * Cin, where either pass
  // multiplies_by_winograd; else 0.
  std::int64_t winograd_floats = 0;
  // The weight gradient by Winograd (weight_gradient_by_winograd): per lane, its slice's
  // transforms (16 x T x (Cin + Cout), T the slice's 2x2 tiles rounded up to 16) and its sums dU
  // (16 x Cin x Cout); else 0.
  std::int64_t winograd_dw_floats = 0;
  // lanes x (col tile, second tile), then lanes - 1 partials of dW, then W flipped (if used), then
  // the Winograd transform (if used), then the weight gradient's (if used).
  std::int64_t scratch_floats() const {
    return lanes * (tile_floats + dcol_floats) + (lanes - 1 + (dx_by_convolution ? 1 : 0)) * partial_floats +
           winograd_floats + winograd_dw_floats;
  }
};
// The plan for input xs on `lanes` lanes: as many images a tile as tile_floats hold, but at
// least min_columns output columns' worth and at least one image.
TilePlan plan_tiles(int lanes, ImageShape xs, ConvShape c, std::int64_t tile_floats = kTileFloats,
                    int min_columns = kMinTileColumns);
// The plan for device d: as many lanes as d has (lanes_per_device), kTileFloats, kMinTileColumns.
TilePlan plan_tiles(const Device& d, ImageShape xs, ConvShape c);

// The unfolding of a tile where the output is as large as the input and the stride 1 (every 3x3
// convolution of ResNet-18 but the three that halve the image): chapter 09's im2col_images, the
// same bits, done as one contiguous copy per row of col at a fixed offset, plus zeros at the
// borders (Im2colShifted in tiled_conv.cu says why that is the same thing). Chapter 09's functor
// works row by row of each image (28, 14, 7 or 4 floats at a time), and that per-row work, not
// the bytes, was what it spent its time on. Other convolutions are refused (mgpu::Error).
bool unfolds_by_shifting(ImageShape xs, ConvShape c);  // stride 1 and 2 * padding == kernel - 1
// Whether the cpu build multiplies such a convolution in panels (tiled_conv.cu's PanelConv: the
// unfolding packed a few pixels at a time straight into the multiply's reach, never a col tile)
// rather than unfolding a col tile for a GEMM: a shifted convolution with k <= 11. Never in a
// cuda build (its tiles go to cuBLAS).
bool multiplies_in_panels(ImageShape xs, ConvShape c);
// Whether the cpu build multiplies such a convolution by Winograd's F(2x2, 3x3) (tiled_conv.cu's
// WinogradConv: 16 multiply-adds per 2x2 output pixels and channel pair where PanelConv does 36),
// before PanelConv: a 3x3 convolution with stride 1 and padding 1, at least 16 input channels,
// in a build for AVX-512 or AVX2 (its tiles are gathered by 128-bit loads and shuffles; where it
// was measured faster). Never in a cuda build.
bool multiplies_by_winograd(ImageShape xs, ConvShape c);
// Whether the cpu build takes such a convolution's weight gradient by Winograd's transforms too
// (tiled_conv.cu's WinogradWeightProducts: 16 multiply-adds per tile and channel pair where the
// unfolded GEMM does 36): where multiplies_by_winograd and the output channels are a multiple of 16.
bool weight_gradient_by_winograd(ImageShape xs, ConvShape c);
void im2col_shifted_images(const Device& d, const float* x, ImageShape xs, ConvShape c, int first, int count,
                           float* col);

// chapter 09's conv2d_forward and conv2d_backward (layers.h: the same arguments, the same
// results), tile by tile as `plan` cuts the batch (a plan for xs and c, with at most
// lanes_per_device(d) lanes); scratch holds plan.scratch_floats() floats (else mgpu::Error).
// dx == nullptr skips the input gradient. (chapter 10's "tiled" table passes plan_tiles(d, xs, c).)
void tiled_conv_forward(const Device& d, const TilePlan& plan, const float* x, ImageShape xs, ConvShape c,
                        const float* W, const float* b, nn::ConvScratch scratch, float* z);
void tiled_conv_backward(const Device& d, const TilePlan& plan, const float* dz, const float* x, ImageShape xs,
                         ConvShape c, const float* W, const float* ones, nn::ConvScratch scratch, float* dW, float* db,
                         float* dx);

}  // namespace fast
