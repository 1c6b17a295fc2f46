// Chapter 10's three tables of layer kernels (tables.h), and their registration.
#include "tables.h"

#include "blocked_sums.h"   // BatchNorm's sums block by block
#include "implicit_gemm.h"  // the 3x3 convolutions on tensor cores
#include "kernels.h"        // the raw kernels
#include "tiled_conv.h"     // the tiled convolution

namespace fast {
namespace {

using i64 = std::int64_t;

class RawKernels : public nn::LayerKernels {
 public:
  const char* name() const override { return "raw"; }
  bool preferred_in_this_build() const override { return mgpu::kCudaBackend; }
  void im2col(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col) const override {
    im2col_raw(d, x, xs, c, col);
  }
  void col2im(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx) const override {
    col2im_raw(d, col, xs, c, dx);
  }
  int sum_partials_per_channel() const override { return kMaxSumBlocks; }
  void batch_norm_sums(const Device& d, const float* z, int channels, i64 n, nn::ReductionScratch& scratch,
                       float* sums) const override {
    batch_norm_sums_raw(d, z, channels, n, scratch.partials_for(channels, kMaxSumBlocks, "batch_norm_sums"), sums);
  }
  void batch_norm_square_sums(const Device& d, const float* z, int channels, i64 n, double count,
                              nn::ReductionScratch& scratch, float* sums) const override {
    batch_norm_square_sums_raw(d, z, channels, n, count,
                               scratch.partials_for(channels, kMaxSumBlocks, "batch_norm_square_sums"), sums);
  }
  void batch_norm_apply(const Device& d, const float* z, int channels, i64 n, const float* stats, const float* gamma,
                        const float* beta, const float* residual, lenet::Activation act, float* y) const override {
    batch_norm_apply_raw(d, z, channels, n, stats, gamma, beta, residual, act, y);
  }
  void batch_norm_backward_sums(const Device& d, const float* dy, const float* z, int channels, i64 n,
                                const float* stats, nn::ReductionScratch& scratch, float* sums, float* dgamma,
                                float* dbeta) const override {
    batch_norm_backward_sums_raw(d, dy, z, channels, n, stats,
                                 scratch.partials_for(channels, kMaxSumBlocks, "batch_norm_backward_sums"), sums,
                                 dgamma, dbeta);
  }
};

// The raw table with its 3x3 stride-1 convolutions (16-channel multiples) done as an implicit
// GEMM in bf16 on tensor cores (implicit_gemm.h); every other convolution as raw's. Its
// convolutions round their inputs to bf16, so 09_resnet runs it with --precision bf16 only.
class TensorKernels : public RawKernels {
 public:
  const char* name() const override { return "tensor"; }
  bool preferred_in_this_build() const override { return false; }  // until a GPU has measured it
  const char* convolution_precision() const override { return "bf16"; }
  std::string unavailable_on(const Device& d) const override { return tc::unsupported_reason(d); }
  i64 conv_scratch_floats(const Device& d, ImageShape xs, ConvShape c) const override {
    return tc::takes(xs, c) ? tc::scratch_floats(xs, c) : RawKernels::conv_scratch_floats(d, xs, c);
  }
  void conv_forward(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                    nn::ConvScratch scratch, float* z) const override {
    if (!tc::takes(xs, c)) return RawKernels::conv_forward(d, x, xs, c, W, b, scratch, z);
    check_scratch(d, xs, c, scratch, "conv_forward");
    tc::conv_forward_tc(d, x, xs, c, W, b, scratch.data, z);
  }
  void conv_backward(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c, const float* W,
                     const float* ones, nn::ConvScratch scratch, float* dW, float* db, float* dx) const override {
    if (!tc::takes(xs, c)) return RawKernels::conv_backward(d, dz, x, xs, c, W, ones, scratch, dW, db, dx);
    check_scratch(d, xs, c, scratch, "conv_backward");
    tc::conv_backward_tc(d, dz, x, xs, c, W, ones, scratch.data, dW, db, dx);
  }

 private:
  void check_scratch(const Device& d, ImageShape xs, ConvShape c, nn::ConvScratch scratch, const char* call) const {
    if (scratch.floats < conv_scratch_floats(d, xs, c))
      throw mgpu::Error(std::string("tensor kernels' ") + call + ": scratch of " + std::to_string(scratch.floats) +
                        " floats, " + std::to_string(conv_scratch_floats(d, xs, c)) + " needed");
  }
};

class TiledKernels : public nn::LayerKernels {
 public:
  const char* name() const override { return "tiled"; }
  bool preferred_in_this_build() const override { return !mgpu::kCudaBackend; }
  i64 conv_scratch_floats(const Device& d, ImageShape xs, ConvShape c) const override {
    return plan_tiles(d, xs, c).scratch_floats();
  }
  void conv_forward(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                    nn::ConvScratch scratch, float* z) const override {
    tiled_conv_forward(d, plan_tiles(d, xs, c), x, xs, c, W, b, scratch, z);
  }
  void conv_backward(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c, const float* W,
                     const float* ones, nn::ConvScratch scratch, float* dW, float* db, float* dx) const override {
    tiled_conv_backward(d, plan_tiles(d, xs, c), dz, x, xs, c, W, ones, scratch, dW, db, dx);
  }
  // BatchNorm's sums block by block (blocked_sums.h). They need no partial sums, but refuse a
  // ReductionScratch made for fewer channels as every table does: the caller's bug shows with
  // whichever table it runs.
  void batch_norm_sums(const Device& d, const float* z, int channels, i64 n, nn::ReductionScratch& scratch,
                       float* sums) const override {
    scratch.partials_for(channels, 0, "batch_norm_sums");
    batch_norm_sums_blocked(d, z, channels, n, sums);
  }
  void batch_norm_square_sums(const Device& d, const float* z, int channels, i64 n, double count,
                              nn::ReductionScratch& scratch, float* sums) const override {
    scratch.partials_for(channels, 0, "batch_norm_square_sums");
    batch_norm_square_sums_blocked(d, z, channels, n, count, sums);
  }
  void batch_norm_moments(const Device& d, const float* z, int channels, i64 n, nn::ReductionScratch& scratch,
                          float* sums) const override {
    scratch.partials_for(channels, 0, "batch_norm_moments");
    batch_norm_moments_blocked(d, z, channels, n, sums);
  }
  void batch_norm_backward_sums(const Device& d, const float* dy, const float* z, int channels, i64 n,
                                const float* stats, nn::ReductionScratch& scratch, float* sums, float* dgamma,
                                float* dbeta) const override {
    scratch.partials_for(channels, 0, "batch_norm_backward_sums");
    batch_norm_backward_sums_blocked(d, dy, z, channels, n, stats, sums, dgamma, dbeta);
  }
};

// Registered while the program starts, before main() (a static object's initializer, as a
// doctest TEST_CASE registers itself): any program linked with this file offers all three tables.
[[maybe_unused]] const bool registered = [] {
  nn::register_layer_kernels(raw_kernels());
  nn::register_layer_kernels(tiled_kernels());
  nn::register_layer_kernels(tensor_kernels());
  return true;
}();

}  // namespace

const nn::LayerKernels& raw_kernels() {
  static const RawKernels table;
  return table;
}

const nn::LayerKernels& tiled_kernels() {
  static const TiledKernels table;
  return table;
}

const nn::LayerKernels& tensor_kernels() {
  static const TensorKernels table;
  return table;
}

}  // namespace fast
