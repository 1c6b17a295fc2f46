// The tiled convolution (tiled_conv.h). Host code that queues chapter 09's im2col/col2im
// functors and GEMMs on a device's lanes; it is built as device code only because the lanes
// (common/parallel.h) are.
#include "tiled_conv.h"

#include <algorithm>
#include <string>

#include "common/gemm.h"
#include "common/parallel.h"    // for_each_lane
#include "common/vector_ops.h"  // fill, add_into

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

// Refuses (mgpu::Error naming `call`) a plan made for another convolution or for more lanes than
// d has, and scratch smaller than the plan needs.
void check_plan(const Device& d, const TilePlan& plan, ImageShape xs, ConvShape c, nn::ConvScratch scratch,
                const char* call) {
  const ConvSizes s = sizes_of(xs, c);
  const bool fits = plan.images >= 1 && plan.tiles == ceil_div(xs.batch, plan.images) && plan.lanes >= 1 &&
                    plan.lanes <= std::min(plan.tiles, mgpu::lanes_per_device(d)) &&
                    plan.tile_floats == i64(s.K) * s.Q * plan.images &&
                    plan.partial_floats == i64(c.out_channels) * s.K;
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
  plan.tile_floats = per_image * plan.images;
  plan.partial_floats = i64(c.out_channels) * s.K;
  return plan;
}

TilePlan plan_tiles(const Device& d, ImageShape xs, ConvShape c) {
  return plan_tiles(mgpu::lanes_per_device(d), xs, c);
}

void tiled_conv_forward(const Device& d, const TilePlan& plan, const float* x, ImageShape xs, ConvShape c,
                        const float* W, const float* b, nn::ConvScratch scratch, float* z) {
  check_plan(d, plan, xs, c, scratch, "tiled_conv_forward");
  const ConvSizes s = sizes_of(xs, c);
  for_each_tile(d, plan, xs.batch, [&](int lane, int first, int count) {
    float* col = scratch.data + lane * 2 * plan.tile_floats;  // [K][count*Q]: this tile's unfolded images
    const int columns = count * s.Q;
    nn::im2col_images(d, x, xs, c, first, count, col);
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
  float* partials = scratch.data + plan.lanes * 2 * plan.tile_floats;  // [lanes - 1][Cout][K]
  mgpu::fill(d, partials, (plan.lanes - 1) * plan.partial_floats, 0.0f);
  for_each_tile(d, plan, xs.batch, [&](int lane, int first, int count) {
    float* col = scratch.data + lane * 2 * plan.tile_floats;  // [K][count*Q]
    float* dcol = col + plan.tile_floats;                     // [K][count*Q]
    float* dW_lane = lane == 0 ? dW : partials + (lane - 1) * plan.partial_floats;
    const float* dz_tile = dz + i64(first) * s.Q;  // [Cout][count*Q], a block of dz [Cout][P]
    const int columns = count * s.Q;
    nn::im2col_images(d, x, xs, c, first, count, col);  // the forward pass's tile, unfolded again
    // dW += dz_tile col^T      [Cout x K] = [Cout x columns][columns x K]
    gemm(d, Transpose::No, Transpose::Yes, c.out_channels, s.K, columns, 1.0f, dz_tile, s.P, col, columns, 1.0f,
         dW_lane, s.K);
    if (!dx) return;
    // dcol = W^T dz_tile       [K x columns] = [K x Cout][Cout x columns]; then folded back
    gemm(d, Transpose::Yes, Transpose::No, s.K, columns, c.out_channels, 1.0f, W, s.K, dz_tile, s.P, 0.0f, dcol,
         columns);
    nn::col2im_images(d, dcol, xs, c, first, count, dx);
  });
  for (int lane = 1; lane < plan.lanes; ++lane)
    mgpu::add_into(d, dW, partials + (lane - 1) * plan.partial_floats, plan.partial_floats);
  // db += dz ones             [Cout x 1] = [Cout x P][P x 1]
  gemm(d, Transpose::No, Transpose::No, c.out_channels, 1, s.P, 1.0f, dz, ones, 1.0f, db);
}

}  // namespace fast
