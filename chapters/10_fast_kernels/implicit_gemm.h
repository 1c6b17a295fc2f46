// Chapter 10, the tensor cores: the 3x3 convolutions as an implicit GEMM in bf16, on the
// instruction a tensor core executes (mma.sync m16n8k16), never writing col.
//
// Chapter 09 unfolds a layer's input into col [Cin*k*k][B*Ho*Wo] and multiplies; for ResNet-18
// at batch 256 those copies are 11.6 GB a step (README, "What a materialised im2col costs"),
// more memory traffic than the whole step may take. An implicit GEMM computes the same product,
//     z^T [M x N] = A [M x K] * B [K x N],   M = B*Ho*Wo pixels, N = Cout, K = k*k*Cin,
// but A, which is col^T, is never stored: the code that loads a piece of A into registers reads
// it from the input at the address the unfolding would have copied it from (gathered() below).
// CUTLASS's documentation of its implicit-GEMM convolutions describes the same mapping.
//
// Layouts of this path. The input is read channels-last, x16 [B][H][W][Cin] in bf16: the 16
// channels one K-step of 16 needs at one pixel and tap are then 32 contiguous bytes. The filters
// are w16 [Cout][k][k][Cin] in bf16, each output channel's row in the order K walks. The output
// z stays chapter 09's [Cout][B][Ho][Wo] in fp32, which its BatchNorm reads. The conversions
// below turn chapter 09's fp32 [C][B][H][W] tensors into these (channels_last_element,
// filter_element), so the path plugs into chapter 09's network through its table of layer
// kernels as it is.
//
// The three products of a training step, all on the same tiles:
//   forward         z[co][m]    = sum_kk A(m, kk) w[co][kk]                 (+ bias)
//   input gradient  dx = the forward convolution of dz with the filters turned round: for a
//                   3x3 stride-1 layer, w'[ci][ky][kx][co] = w[co][ci][2-ky][2-kx], padding 2-p
//   weight gradient dW[co][kk] += sum_m dz[co][m] A(m, kk)                    (K of this GEMM: M)
//
// How the code is cut, as the rest of this chapter (kernels.h): what one thread copies and one
// lane loads and stores are MGPU_HD functions of plain indices (the stages, the fragment loads,
// the epilogues); the tensor core's multiply is one instruction on a GPU (mma_bf16, in
// implicit_gemm.cu) and, on a host, mma_model: all 32 lanes' fragments in, the product out,
// arranged by the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16 with floating point
// type"). A whole block's tile then runs on a CPU, under the sanitizers, and is checked against
// chapter 09's convolution.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "../06_mixed_precision/formats.h"  // mixed::to_bf16, from_bf16: chapter 06's rounding, bit for bit
#include "kernels.h"                         // index_count, Device, ConvShape, ImageShape

namespace fast::tc {

// ---- The instruction: D [16 x 8] = A [16 x 16] * B [16 x 8] + C, A and B bf16, C and D fp32 -----
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80 onwards: A100, H100, H200). A warp
// executes it together; each of its 32 lanes holds a fragment of each matrix in registers:
// 8 values of A, 4 of B, 4 of C. Which values, the PTX ISA says with two numbers per lane,
//     group = lane / 4 (0..7)   and   pair = lane % 4 (0..3):
//   A: a0 = (row g,   cols 2p, 2p+1)   a1 = (row g+8, cols 2p, 2p+1)
//      a2 = (row g,   cols 2p+8, 2p+9) a3 = (row g+8, cols 2p+8, 2p+9)
//   B: b0 = (rows 2p, 2p+1 of column g)  b1 = (rows 2p+8, 2p+9 of column g)
//   C: c0, c1 = (row g, cols 2p, 2p+1)   c2, c3 = (row g+8, cols 2p, 2p+1)
// Each a and b register is 32 bits holding two bf16, the lower column (or row) in the low half.
constexpr int kWarp = 32;
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;

struct FragA {  // one lane's 8 values of A, bf16 bits, in register order a0.lo, a0.hi, a1.lo, ...
  std::uint16_t v[8];
};
struct FragB {  // one lane's 4 values of B: b0.lo, b0.hi, b1.lo, b1.hi
  std::uint16_t v[4];
};
struct FragC {  // one lane's 4 values of C (and D): c0..c3
  float v[4];
};

struct RowCol {
  int row, col;
};
// Where value i of a lane's fragment sits in its matrix: the tables above as formulas, which the
// loaders use. (mma_model reads the tables register by register instead, written out a second
// way; the tests check that the two agree for every lane and value.)
MGPU_HD inline RowCol a_position(int lane, int i) {  // A [16 x 16], i = 0..7
  const int group = lane >> 2, pair = lane & 3;
  return {group + 8 * ((i >> 1) & 1), 2 * pair + (i & 1) + 8 * (i >> 2)};
}
MGPU_HD inline RowCol b_position(int lane, int i) {  // B [16 x 8], i = 0..3: (k, n)
  const int group = lane >> 2, pair = lane & 3;
  return {2 * pair + (i & 1) + 8 * (i >> 1), group};
}
MGPU_HD inline RowCol c_position(int lane, int i) {  // C [16 x 8], i = 0..3
  const int group = lane >> 2, pair = lane & 3;
  return {group + 8 * (i >> 1), 2 * pair + (i & 1)};
}

// The instruction on a host: d[lane] = the fragments of A*B + C for all 32 lanes at once. A and B
// are rebuilt from the fragments register by register, multiplied in fp32 (a product of two
// bf16 is exact in fp32) adding k = 0..15 in order, and D dealt back the same way. The tensor
// core adds in an order of its own, so a GPU's D may differ in the last bits; tests allow that.
void mma_model(const FragA a[kWarp], const FragB b[kWarp], FragC c[kWarp]);

// ---- Channels-last bf16 tensors, from chapter 09's fp32 ones -------------------------------------

// x16[b][y][x][c] = to_bf16(x[c][b][y][x]) for x [C][B][H][W]; element idx of x16 (its own
// order, so that consecutive threads write consecutive addresses). Chapter 06's rounding.
struct ChannelsLastArgs {
  const float* x;
  std::uint16_t* x16;
  int channels, plane;  // plane = B*H*W: pixels of the batch
  int count;            // channels * plane
};
MGPU_HD inline void channels_last_element(const ChannelsLastArgs& a, int idx) {
  const int c = idx % a.channels, pixel = idx / a.channels;
  a.x16[idx] = mixed::to_bf16(a.x[c * a.plane + pixel]);
}

// The filters of a k x k convolution W [Cout][Cin][k][k] (chapter 09's) as w16, element idx:
//   forward:      w16[co][ky][kx][ci] = W[co][ci][ky][kx]
//   turned round: w16[ci][ky][kx][co] = W[co][ci][k-1-ky][k-1-kx]   (the input gradient's filters)
struct FilterArgs {
  const float* W;
  std::uint16_t* w16;
  int out_channels, in_channels, kernel;
  bool turned;
  int count;  // out_channels * in_channels * kernel * kernel
};
MGPU_HD inline void filter_element(const FilterArgs& a, int idx) {
  const int k = a.kernel, taps = k * k;
  // The w16 element's own indices: [rows][ky][kx][cols], rows and cols Cout, Cin or the reverse.
  const int cols = a.turned ? a.out_channels : a.in_channels;
  const int col = idx % cols, tap = (idx / cols) % taps, row = idx / (cols * taps);
  const int ky = tap / k, kx = tap % k;
  const int co = a.turned ? col : row, ci = a.turned ? row : col;
  const int wy = a.turned ? k - 1 - ky : ky, wx = a.turned ? k - 1 - kx : kx;
  a.w16[idx] = mixed::to_bf16(a.W[((co * a.in_channels + ci) * k + wy) * k + wx]);
}

// ---- The convolution as an implicit GEMM -------------------------------------------------------

// What the tiles of one convolution read and write (int indices: every tensor < 2^31 elements).
struct ConvGemm {
  const std::uint16_t* x16;  // [B][H][W][Cin] bf16: the input (the forward's x; the input gradient's dz)
  const std::uint16_t* w16;  // [Cout][k][k][Cin] bf16 (for the input gradient, the turned filters)
  const float* dz;           // weight gradient only: [Cout][B*Ho*Wo] fp32, read as bf16
  const float* bias;         // forward only: [Cout], or null
  float* out;                // forward: z [Cout][B*Ho*Wo]; weight gradient: dW [Cout][Cin][k][k] (added to)
  int batch, height, width, in_channels, out_channels, kernel, padding;  // stride 1
  int out_height, out_width;
  int m, n, k;  // the GEMM: M = B*Ho*Wo, N = Cout, K = k*k*Cin
};

// Where A(m, kk) lives in x16: pixel m's window, tap kk / Cin, channel kk % Cin; -1 where A is 0,
// in the padding and for m >= M or kk >= K (a tile's rows or columns past the matrix's end).
MGPU_HD inline int input_index(const ConvGemm& g, int m, int kk) {
  if (m >= g.m || kk >= g.k) return -1;
  const int c = kk % g.in_channels, tap = kk / g.in_channels;
  const int ox = m % g.out_width, oy = (m / g.out_width) % g.out_height, b = m / (g.out_width * g.out_height);
  const int y = oy + tap / g.kernel - g.padding, x = ox + tap % g.kernel - g.padding;
  if (y < 0 || y >= g.height || x < 0 || x >= g.width) return -1;  // the padding
  return ((b * g.height + y) * g.width + x) * g.in_channels + c;
}
// A(m, kk): the value col^T would hold.
MGPU_HD inline std::uint16_t gathered(const ConvGemm& g, int m, int kk) {
  const int i = input_index(g, m, kk);
  return i < 0 ? 0 : g.x16[i];
}

// The forward GEMM's operands: A(m, kk) = gathered, B(kk, n) = w16[n][kk] (0 for n >= N).
struct ForwardOperands {
  MGPU_HD static std::uint16_t a(const ConvGemm& g, int m, int kk) { return gathered(g, m, kk); }
  MGPU_HD static std::uint16_t b(const ConvGemm& g, int kk, int n) { return n < g.n ? g.w16[n * g.k + kk] : 0; }
};
// The weight gradient's: rows are output channels, its K runs over the pixels.
//   A(co, m) = dz[co][m] rounded to bf16 (0 past Cout or M),  B(m, kk) = gathered(m, kk)
struct WeightGradOperands {
  MGPU_HD static std::uint16_t a(const ConvGemm& g, int co, int m) {
    return co < g.n && m < g.m ? mixed::to_bf16(g.dz[co * g.m + m]) : 0;
  }
  MGPU_HD static std::uint16_t b(const ConvGemm& g, int m, int kk) { return gathered(g, m, kk); }
};

// One lane's fragment of the 16 x 16 block of A at (row0, k0), and of the 16 x 8 block of B at (k0, n0).
template <class Operands>
MGPU_HD inline FragA load_a(const ConvGemm& g, int row0, int k0, int lane) {
  FragA f;
  for (int i = 0; i < 8; ++i) {
    const RowCol p = a_position(lane, i);
    f.v[i] = Operands::a(g, row0 + p.row, k0 + p.col);
  }
  return f;
}
template <class Operands>
MGPU_HD inline FragB load_b(const ConvGemm& g, int k0, int n0, int lane) {
  FragB f;
  for (int i = 0; i < 4; ++i) {
    const RowCol p = b_position(lane, i);
    f.v[i] = Operands::b(g, k0 + p.row, n0 + p.col);
  }
  return f;
}

// A warp's tile of the product: 32 x 32, as 2 x 4 instructions' tiles of 16 x 8. A block of
// kWarpsPerBlock warps (2 x 2) computes 64 x 64.
constexpr int kWarpTileM = 32, kWarpTileN = 32;
constexpr int kTilesM = kWarpTileM / kMmaM, kTilesN = kWarpTileN / kMmaN;  // 2 x 4
constexpr int kWarpsPerBlock = 4, kBlockTileM = 64, kBlockTileN = 64;
struct WarpAccumulators {  // one lane's share of the warp's 32 x 32 fp32 results
  FragC c[kTilesM][kTilesN];
};
// Where warp w of a block sits in the block's 64 x 64 tile: its first row and first column.
MGPU_HD inline int warp_row(int w) { return w / 2 * kWarpTileM; }
MGPU_HD inline int warp_col(int w) { return w % 2 * kWarpTileN; }

// The forward's epilogue, one lane: z[n][m] = its values (+ bias[n]), for the rows and columns
// that exist (a tile may reach past M or N).
MGPU_HD inline void store_forward(const ConvGemm& g, const WarpAccumulators& acc, int m0, int n0, int lane) {
  for (int tm = 0; tm < kTilesM; ++tm)
    for (int tn = 0; tn < kTilesN; ++tn)
      for (int i = 0; i < 4; ++i) {
        const RowCol p = c_position(lane, i);
        const int m = m0 + tm * kMmaM + p.row, n = n0 + tn * kMmaN + p.col;
        if (m < g.m && n < g.n) g.out[n * g.m + m] = acc.c[tm][tn].v[i] + (g.bias ? g.bias[n] : 0.0f);
      }
}
// The weight gradient's value for dW[co][kk] (its GEMM's row co, column kk), kk = (ky*k + kx)*Cin
// + ci in this path's order, and where chapter 09 keeps it: dW[co][ci][ky][kx].
MGPU_HD inline int weight_index(const ConvGemm& g, int co, int kk) {
  const int ci = kk % g.in_channels, tap = kk / g.in_channels;
  return (co * g.in_channels + ci) * g.kernel * g.kernel + tap;
}

// The plain statement of a warp's 32 x 32 tile, on a host: each lane loads its own fragments
// straight from the tensors (load_a, load_b), all 32 lanes at each step, and mma_model multiplies.
// Over K-steps [k_first, k_last) of 16 (the forward: all of K; the weight gradient: the pixels).
// The staged version below, which the GPU runs, is checked against it bit for bit.
template <class Operands>
void warp_tile_model(const ConvGemm& g, int row0, int col0, int k_first, int k_last, WarpAccumulators acc[kWarp]) {
  FragA a[kWarp];
  FragB b[kWarp];
  FragC c[kWarp];
  for (int k0 = k_first; k0 < k_last; k0 += kMmaK)
    for (int tm = 0; tm < kTilesM; ++tm)
      for (int tn = 0; tn < kTilesN; ++tn) {
        for (int lane = 0; lane < kWarp; ++lane) {
          a[lane] = load_a<Operands>(g, row0 + tm * kMmaM, k0, lane);
          b[lane] = load_b<Operands>(g, k0, col0 + tn * kMmaN, lane);
          c[lane] = acc[lane].c[tm][tn];
        }
        mma_model(a, b, c);
        for (int lane = 0; lane < kWarp; ++lane) acc[lane].c[tm][tn] = c[lane];
      }
}

// ---- The products on a GPU: the block's tiles staged in shared memory -------------------------
//
// In warp_tile_model's loop each lane gathers its own 8 values of A with a pixel's and a tap's
// divisions for every one of them, and the warps of a block gather the same rows again: a GPU
// would spend its time on that index arithmetic, not on the instruction (README, "The tensor
// cores"). So the GPU's kernels stage: the 128 threads of a block copy the K-step's 64 x 16 block
// of A and 16 x 64 block of B into shared memory first, each thread one 16-byte piece of each
// (8 bf16: 8 channels of one pixel and tap), and the warps then read their fragments from there.
// warp_tile_model stays as the plain statement of the product, which the staged version is
// checked against bit for bit.
constexpr int kBlockThreads = kWarp * kWarpsPerBlock;  // 128
constexpr int kPiece = 8;                              // bf16 values a thread copies at once: 16 bytes
// A row of a staged tile: the K-step's 16 values and 8 of padding, so that the 32 lanes reading a
// fragment (rows g, columns 2p) hit 32 different banks: row r starts at word 12 r.
constexpr int kStagedRow = kMmaK + 8;
struct alignas(16) StagedTiles {
  std::uint16_t a[kBlockTileM][kStagedRow];  // A's rows m0 .. m0+63, the K-step's 16 columns
  std::uint16_t b[kBlockTileN][kStagedRow];  // B's columns n0 .. n0+63 (one row each), the K-step's 16 rows
};
struct Piece {  // 8 bf16, copied as one 16-byte access
  std::uint16_t v[kPiece];
};
MGPU_HD inline Piece load_piece(const std::uint16_t* p) {
#ifdef __CUDA_ARCH__
  const uint4 word = *reinterpret_cast<const uint4*>(p);  // p is 16-byte aligned: see the stages below
  Piece piece;
  std::memcpy(&piece, &word, sizeof piece);
  return piece;
#else
  Piece piece;
  std::memcpy(&piece, p, sizeof piece);
  return piece;
#endif
}
MGPU_HD inline void store_piece(std::uint16_t* p, const Piece& piece) {
#ifdef __CUDA_ARCH__
  uint4 word;
  std::memcpy(&word, &piece, sizeof word);
  *reinterpret_cast<uint4*>(p) = word;  // p is 16-byte aligned: a staged row is 48 bytes
#else
  std::memcpy(p, &piece, sizeof piece);
#endif
}

// A's 8 values at (pixel m, K index first .. first+7): 8 channels of one tap (Cin is a multiple
// of 16, first of 8), one 16-byte read; zeros in the padding and past M or K.
MGPU_HD inline Piece gathered_piece(const ConvGemm& g, int m, int first) {
  const int i = input_index(g, m, first);
  return i < 0 ? Piece{} : load_piece(g.x16 + i);
}

// Thread t's share of staging a K-step: what forward_kernel's and weight_grad_kernel's threads
// each copy before the barrier. Every address read is 16-byte aligned: channels and K are
// multiples of 16, and each tensor starts on a 16-byte line.
//
// The forward product at block (m0, n0), K-step k0: A's row t / 2 (pixel m0 + t / 2), its K
// columns 8 (t % 2) onwards; B's row (filter n0 + t / 2), the same 8 columns.
struct ForwardStage {
  ConvGemm g;
  int m0, n0;
  MGPU_HD void operator()(int k0, int t, StagedTiles& tiles) const {
    const int row = t / 2, half = kPiece * (t % 2);
    store_piece(&tiles.a[row][half], gathered_piece(g, m0 + row, k0 + half));
    Piece b{};
    if (n0 + row < g.n) b = load_piece(g.w16 + (n0 + row) * g.k + k0 + half);
    store_piece(&tiles.b[row][half], b);
  }
};
// The weight gradient at block (co0, kk0), K-step m0 (16 pixels): A's row t / 2 (output channel
// co0 + t / 2), dz at pixels m0 + 8 (t % 2) .. +7, rounded to bf16; B's 16 pixels x 64 columns
// as 128 pieces along K: pixel m0 + t / 8, columns kk0 + 8 (t % 8) .. +7, stored turned ([kk][m]).
struct WeightGradStage {
  ConvGemm g;
  int co0, kk0;
  MGPU_HD void operator()(int m0, int t, StagedTiles& tiles) const {
    const int row = t / 2, half = kPiece * (t % 2), co = co0 + row;
    Piece a{};
    for (int i = 0; i < kPiece; ++i) {
      const int m = m0 + half + i;
      if (co < g.n && m < g.m) a.v[i] = mixed::to_bf16(g.dz[co * g.m + m]);
    }
    store_piece(&tiles.a[row][half], a);
    const int pixel = t / 8, column = kPiece * (t % 8);
    const Piece b = gathered_piece(g, m0 + pixel, kk0 + column);
    for (int i = 0; i < kPiece; ++i) tiles.b[column + i][pixel] = b.v[i];
  }
};

// A lane's fragments of the staged tiles: A's 16 x 16 block at the tile's row r0, B's 16 x 8 at column c0.
MGPU_HD inline FragA staged_a(const StagedTiles& tiles, int r0, int lane) {
  FragA f;
  for (int i = 0; i < 8; ++i) {
    const RowCol p = a_position(lane, i);
    f.v[i] = tiles.a[r0 + p.row][p.col];
  }
  return f;
}
MGPU_HD inline FragB staged_b(const StagedTiles& tiles, int c0, int lane) {
  FragB f;
  for (int i = 0; i < 4; ++i) {
    const RowCol p = b_position(lane, i);  // (k, n)
    f.v[i] = tiles.b[c0 + p.col][p.row];
  }
  return f;
}

// A block's 64 x 64 tile on a host: the kernels' loop over K-steps [k_first, k_last), its 128
// threads' staging run one after the other (the barrier between staging and reading is the
// loop's order here) and mma_model for the instruction; acc[w][lane] gets warp w's results
// (warp w: from warp_row(w), warp_col(w) of the tile). Stage: ForwardStage or WeightGradStage.
template <class Stage>
void block_tile_model(const Stage& stage, int k_first, int k_last, WarpAccumulators acc[kWarpsPerBlock][kWarp]) {
  StagedTiles tiles;
  FragA a[kWarp];
  FragB b[kWarp];
  FragC c[kWarp];
  for (int k0 = k_first; k0 < k_last; k0 += kMmaK) {
    for (int t = 0; t < kBlockThreads; ++t) stage(k0, t, tiles);
    for (int w = 0; w < kWarpsPerBlock; ++w)
      for (int tm = 0; tm < kTilesM; ++tm)
        for (int tn = 0; tn < kTilesN; ++tn) {
          for (int lane = 0; lane < kWarp; ++lane) {
            a[lane] = staged_a(tiles, warp_row(w) + tm * kMmaM, lane);
            b[lane] = staged_b(tiles, warp_col(w) + tn * kMmaN, lane);
            c[lane] = acc[w][lane].c[tm][tn];
          }
          mma_model(a, b, c);
          for (int lane = 0; lane < kWarp; ++lane) acc[w][lane].c[tm][tn] = c[lane];
        }
  }
}

// The weight gradient's epilogue, one lane: dW[co][ci][ky][kx] += its values, for the rows and
// columns that exist. On a GPU several blocks (the pixels' slices) add into the same dW: atomically.
MGPU_HD inline void add_weight_grad(const ConvGemm& g, const WarpAccumulators& acc, int co0, int kk0, int lane) {
  for (int tm = 0; tm < kTilesM; ++tm)
    for (int tn = 0; tn < kTilesN; ++tn)
      for (int i = 0; i < 4; ++i) {
        const RowCol p = c_position(lane, i);
        const int co = co0 + tm * kMmaM + p.row, kk = kk0 + tn * kMmaN + p.col;
        if (co >= g.n || kk >= g.k) continue;
#ifdef __CUDA_ARCH__
        atomicAdd(&g.out[weight_index(g, co, kk)], acc.c[tm][tn].v[i]);
#else
        g.out[weight_index(g, co, kk)] += acc.c[tm][tn].v[i];
#endif
      }
}

// ---- The launchers: chapter 09's convolution jobs, for the shapes this path takes ------------

// Why device d cannot run this path ("" if it can): a GPU before compute capability 8.0 (no bf16
// mma.sync). A CPU always can (the host model). The launchers throw these words.
std::string unsupported_reason(const Device& d);

// Whether this path computes convolution c on input xs: 3x3, stride 1, padding 1, and channels
// in and out multiples of 16 (a K-step of 16 then stays in one tap, and the weight gradient's
// rows fill whole 16-row tiles). The stem (1 input channel) and the stride-2 and 1x1 layers do not.
bool takes(ImageShape xs, ConvShape c);
// bf16 elements of scratch conv_forward_tc and conv_backward_tc need, counted in floats (two a float).
std::int64_t scratch_floats(ImageShape xs, ConvShape c);

// z [Cout][B][Ho][Wo] = conv(x, W) + b, inputs rounded to bf16, sums in fp32. x, W, b, z as
// chapter 09's conv2d_forward; scratch of scratch_floats(xs, c) floats.
void conv_forward_tc(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                     float* scratch, float* z);
// dW += dz (x's windows)^T, db += dz's rows, dx = the input gradient (skipped for dx == nullptr),
// as chapter 09's conv2d_backward; ones holds at least B*Ho*Wo values of 1.0f (for db).
void conv_backward_tc(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c, const float* W,
                      const float* ones, float* scratch, float* dW, float* db, float* dx);

}  // namespace fast::tc
