// The tensor-core convolution of implicit_gemm.h: the instruction's host model, the layout
// conversions, the two GEMM kernels and the launchers that chapter 09's table calls. What a lane
// loads and stores is in the header (MGPU_HD, the same in both builds). In the cuda build a block
// runs block_tile below with the real instruction; in the cpu build each block tile is one index
// of mgpu::for_each_index, run by block_tile_model: the same staging, fragments and stores, with
// mma_model for the instruction, so chapter 09's `--kernels tensor` runs (and is tested) anywhere.
#include "implicit_gemm.h"

#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/gemm.h"      // db's product, as chapter 01's
#include "common/parallel.h"  // the cpu build's for_each_index
#include "launch.h"           // the cuda build's blocks_for, global_index, launch_timed

namespace fast::tc {

using i64 = std::int64_t;

// ---- The instruction's host model

void mma_model(const FragA a[kWarp], const FragB b[kWarp], FragC c[kWarp]) {
  // The PTX ISA's tables, register by register: register r of lane (g, p) holds two values, the
  // low half first. A's a0..a3 cover rows g, g+8, g, g+8 and columns from 2p, 2p, 2p+8, 2p+8.
  float A[kMmaM][kMmaK], B[kMmaK][kMmaN];
  for (int lane = 0; lane < kWarp; ++lane) {
    const int g = lane / 4, p = lane % 4;
    const int a_row[4] = {g, g + 8, g, g + 8}, a_col[4] = {2 * p, 2 * p, 2 * p + 8, 2 * p + 8};
    for (int r = 0; r < 4; ++r)
      for (int half = 0; half < 2; ++half) A[a_row[r]][a_col[r] + half] = mixed::from_bf16(a[lane].v[2 * r + half]);
    const int b_row[2] = {2 * p, 2 * p + 8};  // b0, b1: rows (k) from 2p and 2p+8, column (n) g
    for (int r = 0; r < 2; ++r)
      for (int half = 0; half < 2; ++half) B[b_row[r] + half][g] = mixed::from_bf16(b[lane].v[2 * r + half]);
  }
  float D[kMmaM][kMmaN];
  for (int i = 0; i < kMmaM; ++i)
    for (int j = 0; j < kMmaN; ++j) {
      float sum = 0;
      for (int k = 0; k < kMmaK; ++k) sum += A[i][k] * B[k][j];
      D[i][j] = sum;
    }
  for (int lane = 0; lane < kWarp; ++lane) {  // c0, c1 on row g; c2, c3 on row g+8; columns 2p, 2p+1
    const int g = lane / 4, p = lane % 4;
    const int c_row[4] = {g, g, g + 8, g + 8}, c_col[4] = {2 * p, 2 * p + 1, 2 * p, 2 * p + 1};
    for (int r = 0; r < 4; ++r) c[lane].v[r] += D[c_row[r]][c_col[r]];
  }
}

namespace {

// Halves (bf16 elements) rounded up to a whole 16-byte line, so that each tensor in the scratch
// starts aligned.
i64 aligned_halves(i64 halves) { return (halves + 7) / 8 * 8; }

#if MGPU_CUDA
// Refuses, by unsupported_reason's words, a GPU whose tensor cores cannot run the kernels below.
void require_bf16_tensor_cores(const Device& d) {
  if (const std::string why = unsupported_reason(d); !why.empty()) throw mgpu::Error(why);
}

#if __CUDA_ARCH__ >= 800
// Two bf16 as the 32-bit register the instruction takes, the first in the low half.
__device__ inline unsigned pair_of(std::uint16_t low, std::uint16_t high) {
  return unsigned(low) | (unsigned(high) << 16);
}
#endif

// The instruction: c += a b for the warp's 16 x 8 tile, each lane giving its fragments.
__device__ inline void mma_bf16(const FragA& a, const FragB& b, FragC& c) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c.v[0]), "+f"(c.v[1]), "+f"(c.v[2]), "+f"(c.v[3])
      : "r"(pair_of(a.v[0], a.v[1])), "r"(pair_of(a.v[2], a.v[3])), "r"(pair_of(a.v[4], a.v[5])),
        "r"(pair_of(a.v[6], a.v[7])), "r"(pair_of(b.v[0], b.v[1])), "r"(pair_of(b.v[2], b.v[3])));
#else
  __trap();  // never launched: the launchers refuse these GPUs (unsupported_reason)
#endif
}

// This thread's warp in its block.
__device__ inline int this_warp() { return static_cast<int>(threadIdx.x) / kWarp; }
#endif

// ---- The kernels (cuda) and their functors (cpu)

#if MGPU_CUDA
__global__ void channels_last_kernel(ChannelsLastArgs a) {
  const int idx = global_index();
  if (idx < a.count) channels_last_element(a, idx);
}
__global__ void filter_kernel(FilterArgs a) {
  const int idx = global_index();
  if (idx < a.count) filter_element(a, idx);
}
// A block's loop: K-steps [k_first, k_last), staged by `stage`, each warp's 2 x 4 instructions
// on its 32 x 32 part of the block's tile (block_tile_model is this loop on a host).
template <class Stage>
__device__ void block_tile(const Stage& stage, int k_first, int k_last, StagedTiles& tiles, WarpAccumulators& acc) {
  const int t = static_cast<int>(threadIdx.x), lane = t % kWarp;
  for (int k0 = k_first; k0 < k_last; k0 += kMmaK) {
    stage(k0, t, tiles);
    __syncthreads();  // the whole tile staged before any warp reads it
    FragA a[kTilesM];
    FragB b[kTilesN];
    for (int tm = 0; tm < kTilesM; ++tm) a[tm] = staged_a(tiles, warp_row(this_warp()) + tm * kMmaM, lane);
    for (int tn = 0; tn < kTilesN; ++tn) b[tn] = staged_b(tiles, warp_col(this_warp()) + tn * kMmaN, lane);
    for (int tm = 0; tm < kTilesM; ++tm)
      for (int tn = 0; tn < kTilesN; ++tn) mma_bf16(a[tm], b[tn], acc.c[tm][tn]);
    __syncthreads();  // every warp done reading before the next K-step overwrites the tiles
  }
}

// z^T = A B: block (bx, by) computes rows [64 bx, 64 bx + 64) and columns [64 by, ...).
__global__ void forward_kernel(ConvGemm g) {
  __shared__ StagedTiles tiles;
  const int m0 = static_cast<int>(blockIdx.x) * kBlockTileM, n0 = static_cast<int>(blockIdx.y) * kBlockTileN;
  WarpAccumulators acc{};
  block_tile(ForwardStage{g, m0, n0}, 0, g.k, tiles, acc);
  store_forward(g, acc, m0 + warp_row(this_warp()), n0 + warp_col(this_warp()), static_cast<int>(threadIdx.x) % kWarp);
}
// dW += dz A over the pixels [z * chunk, (z + 1) * chunk): blockIdx.z is the slice.
__global__ void weight_grad_kernel(ConvGemm g, int chunk) {
  __shared__ StagedTiles tiles;
  const int co0 = static_cast<int>(blockIdx.x) * kBlockTileM, kk0 = static_cast<int>(blockIdx.y) * kBlockTileN;
  const int first = static_cast<int>(blockIdx.z) * chunk;
  WarpAccumulators acc{};
  block_tile(WeightGradStage{g, co0, kk0}, first, std::min(first + chunk, g.m), tiles, acc);
  add_weight_grad(g, acc, co0 + warp_row(this_warp()), kk0 + warp_col(this_warp()), static_cast<int>(threadIdx.x) % kWarp);
}
#else
// The cpu build's grids: tiles of `tile` that cover `count`.
int blocks_of(int count, int tile) { return (count + tile - 1) / tile; }
struct ChannelsLastKernel {
  ChannelsLastArgs a;
  void operator()(i64 idx) const { channels_last_element(a, static_cast<int>(idx)); }
};
struct FilterKernel {
  FilterArgs a;
  void operator()(i64 idx) const { filter_element(a, static_cast<int>(idx)); }
};
// One block tile per index, as the GPU's blocks (row tiles fastest), run by the host model.
struct ForwardTiles {
  ConvGemm g;
  void operator()(i64 idx) const {
    const int row_tiles = blocks_of(g.m, kBlockTileM);
    const int m0 = static_cast<int>(idx % row_tiles) * kBlockTileM, n0 = static_cast<int>(idx / row_tiles) * kBlockTileN;
    WarpAccumulators acc[kWarpsPerBlock][kWarp] = {};
    block_tile_model(ForwardStage{g, m0, n0}, 0, g.k, acc);
    for (int w = 0; w < kWarpsPerBlock; ++w)
      for (int lane = 0; lane < kWarp; ++lane)
        store_forward(g, acc[w][lane], m0 + warp_row(w), n0 + warp_col(w), lane);
  }
};
// The weight gradient's block tiles, each over all the pixels: no two indices add into the same dW.
struct WeightGradTiles {
  ConvGemm g;
  void operator()(i64 idx) const {
    const int row_tiles = blocks_of(g.n, kBlockTileM);
    const int co0 = static_cast<int>(idx % row_tiles) * kBlockTileM, kk0 = static_cast<int>(idx / row_tiles) * kBlockTileN;
    WarpAccumulators acc[kWarpsPerBlock][kWarp] = {};
    block_tile_model(WeightGradStage{g, co0, kk0}, 0, g.m, acc);
    for (int w = 0; w < kWarpsPerBlock; ++w)
      for (int lane = 0; lane < kWarp; ++lane)
        add_weight_grad(g, acc[w][lane], co0 + warp_row(w), kk0 + warp_col(w), lane);
  }
};
#endif

// x [C][B][H][W] fp32 -> x16 [B][H][W][C] bf16.
void to_channels_last(const Device& d, const float* x, ImageShape xs, std::uint16_t* x16) {
  const ChannelsLastArgs a{x, x16, xs.channels, index_count(i64(xs.batch) * xs.height * xs.width, "the batch's pixels"),
                           index_count(i64(xs.size()), "a channels-last tensor")};
  const double bytes = 6.0 * a.count;  // 4 read, 2 written
#if MGPU_CUDA
  launch_timed(d, "ChannelsLastBf16", bytes,
               [&] { channels_last_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a); });
#else
  mgpu::for_each_index(d, a.count, ChannelsLastKernel{a}, bytes);
#endif
}

void filters_bf16(const Device& d, const float* W, ConvShape c, bool turned, std::uint16_t* w16) {
  const FilterArgs a{W, w16, c.out_channels, c.in_channels, c.kernel, turned,
                     index_count(i64(c.out_channels) * c.in_channels * c.kernel * c.kernel, "the filters")};
#if MGPU_CUDA
  launch_timed(d, "FiltersBf16", 6.0 * a.count,
               [&] { filter_kernel<<<blocks_for(a.count), kThreads, 0, d.stream>>>(a); });
#else
  mgpu::for_each_index(d, a.count, FilterKernel{a}, 6.0 * a.count);
#endif
}

// The GEMM's description for input xs16 (channels-last, `in` channels, h x w), `out` output
// channels, padding p, 3x3 stride 1 (the output's side is the input's).
ConvGemm conv_gemm(const std::uint16_t* x16, ImageShape xs, int out, int padding, const std::uint16_t* w16) {
  ConvGemm g{};
  g.x16 = x16;
  g.w16 = w16;
  g.batch = xs.batch;
  g.height = g.out_height = xs.height;
  g.width = g.out_width = xs.width;
  g.in_channels = xs.channels;
  g.out_channels = out;
  g.kernel = 3;
  g.padding = padding;
  g.m = index_count(i64(xs.batch) * xs.height * xs.width, "the convolution's pixels");
  g.n = out;
  g.k = 9 * xs.channels;
  index_count(i64(g.m) * std::max(g.n, xs.channels), "the convolution's output");
  return g;
}

// out [N][M] = the forward product of g (+ bias).
void forward_product(const Device& d, ConvGemm g) {
#if MGPU_CUDA
  require_bf16_tensor_cores(d);
  const dim3 grid(blocks_for(g.m, kBlockTileM), blocks_for(g.n, kBlockTileN));
  launch_timed(d, "ImplicitGemmForward", 0, [&] { forward_kernel<<<grid, kWarp * kWarpsPerBlock, 0, d.stream>>>(g); });
#else
  mgpu::for_each_index(d, i64(blocks_of(g.m, kBlockTileM)) * blocks_of(g.n, kBlockTileN), ForwardTiles{g}, 0);
#endif
}

void weight_grad_product(const Device& d, ConvGemm g) {
#if MGPU_CUDA
  require_bf16_tensor_cores(d);
  // Enough blocks to fill a large GPU: the pixels cut into slices, each a multiple of 16.
  const unsigned tiles = blocks_for(g.n, kBlockTileM) * blocks_for(g.k, kBlockTileN);
  const int slices = std::max(1, std::min<int>((g.m + 255) / 256, static_cast<int>(1024 / tiles)));
  const int chunk = ((g.m + slices - 1) / slices + kMmaK - 1) / kMmaK * kMmaK;
  const dim3 grid(blocks_for(g.n, kBlockTileM), blocks_for(g.k, kBlockTileN), blocks_for(g.m, chunk));
  launch_timed(d, "ImplicitGemmWeightGrad", 0,
               [&] { weight_grad_kernel<<<grid, kWarp * kWarpsPerBlock, 0, d.stream>>>(g, chunk); });
#else
  mgpu::for_each_index(d, i64(blocks_of(g.n, kBlockTileM)) * blocks_of(g.k, kBlockTileN), WeightGradTiles{g}, 0);
#endif
}

}  // namespace

std::string unsupported_reason(const Device& d) {
#if MGPU_CUDA
  // Tensor cores that execute mma.sync on bf16 came with sm_80 (A100). This build may hold code
  // for older GPUs too (CI compiles for sm_75): there the kernels trap, so nothing launches them.
  int major = 0, minor = 0;
  MGPU_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.gpu));
  MGPU_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d.gpu));
  if (major < 8)
    return "the tensor-core convolution needs a GPU of compute capability 8.0 or later (bf16 mma.sync); GPU " +
           std::to_string(d.gpu) + " is " + std::to_string(major) + "." + std::to_string(minor) + ": use --kernels raw";
#else
  (void)d;  // the host model runs anywhere
#endif
  return "";
}

bool takes(ImageShape xs, ConvShape c) {
  return c.kernel == 3 && c.stride == 1 && c.padding == 1 && xs.channels == c.in_channels && c.in_channels % 16 == 0 &&
         c.out_channels % 16 == 0;
}

namespace {
// The scratch's three tensors, in bf16 elements from its start: the input's channels-last copy
// (at 0), dz's (backward only), the filters'; each on a 16-byte line.
struct ScratchLayout {
  i64 dz16, w16, end;
};
ScratchLayout scratch_layout(ImageShape xs, ConvShape c) {
  const i64 pixels = i64(xs.batch) * xs.height * xs.width;  // stride 1, padding 1: the output's too
  const i64 dz16 = aligned_halves(pixels * c.in_channels), w16 = dz16 + aligned_halves(pixels * c.out_channels);
  return {dz16, w16, w16 + aligned_halves(i64(c.out_channels) * c.in_channels * 9)};
}
struct Scratch {
  std::uint16_t *x16, *dz16, *w16;
};
Scratch split(float* scratch, ImageShape xs, ConvShape c) {
  const ScratchLayout at = scratch_layout(xs, c);
  auto* base = reinterpret_cast<std::uint16_t*>(scratch);
  return {base, base + at.dz16, base + at.w16};
}
void check_takes(ImageShape xs, ConvShape c, const char* call) {
  nn::check_channels(xs, c, call);
  if (!takes(xs, c))
    throw mgpu::Error(std::string(call) + ": only 3x3 convolutions of stride 1 and padding 1 with channels in and out "
                      "multiples of 16; got k" + std::to_string(c.kernel) + " s" + std::to_string(c.stride) + " p" +
                      std::to_string(c.padding) + ", " + std::to_string(c.in_channels) + " -> " +
                      std::to_string(c.out_channels) + " channels");
}
}  // namespace

i64 scratch_floats(ImageShape xs, ConvShape c) { return (scratch_layout(xs, c).end + 1) / 2; }

void conv_forward_tc(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                     float* scratch, float* z) {
  check_takes(xs, c, "conv_forward_tc");
  const Scratch s = split(scratch, xs, c);
  to_channels_last(d, x, xs, s.x16);
  filters_bf16(d, W, c, false, s.w16);
  ConvGemm g = conv_gemm(s.x16, xs, c.out_channels, c.padding, s.w16);
  g.bias = b;
  g.out = z;
  forward_product(d, g);
}

void conv_backward_tc(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c, const float* W,
                      const float* ones, float* scratch, float* dW, float* db, float* dx) {
  check_takes(xs, c, "conv_backward_tc");
  const Scratch s = split(scratch, xs, c);
  // dW += dz A: A gathered from x's channels-last copy, as in the forward pass.
  to_channels_last(d, x, xs, s.x16);
  ConvGemm wg = conv_gemm(s.x16, xs, c.out_channels, c.padding, nullptr);
  wg.dz = dz;
  wg.out = dW;
  weight_grad_product(d, wg);
  // db += dz ones: each row of dz summed (chapter 01's product).
  mgpu::gemm(d, mgpu::Transpose::No, mgpu::Transpose::No, c.out_channels, 1, wg.m, 1.0f, dz, ones, 1.0f, db);
  if (!dx) return;
  // dx = dz convolved with the filters turned round: the forward product, dz as its input.
  const ImageShape zs{c.out_channels, xs.batch, xs.height, xs.width};
  to_channels_last(d, dz, zs, s.dz16);
  filters_bf16(d, W, c, true, s.w16);
  ConvGemm ig = conv_gemm(s.dz16, zs, c.in_channels, c.kernel - 1 - c.padding, s.w16);
  ig.out = dx;
  forward_product(d, ig);
}

}  // namespace fast::tc
