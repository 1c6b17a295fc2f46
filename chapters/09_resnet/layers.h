// The layers a ResNet adds to chapter 01's: a convolution with any stride and padding,
// BatchNorm (batch statistics for training, running statistics for evaluation, the backward
// pass written out), the residual add and global average pooling. A small library of free
// functions over explicit buffers, in chapter 01's conventions, and nothing more: the network
// (resnet.h) calls them in order, as chapter 01's lenet.cu calls its layers.
//
// Layout, as in chapter 01: activations are [C][B][H][W] ("CNHW"), so one channel of a whole
// batch is one contiguous row of B*H*W values. A convolution is then one GEMM, and BatchNorm's
// per-channel statistics are sums along rows.
//
// The network (resnet.cpp) does not call the convolution and BatchNorm functions below directly:
// it calls them through a LayerKernels, the table at the end of this file, so that a later chapter
// can hand in faster versions of the same jobs without this chapter knowing them. The functions
// below are the reference: the readable version every faster one is checked against.
//
// Conventions, as in chapter 01: forward functions overwrite their outputs; backward functions
// ADD parameter gradients into their dW, db, dgamma, dbeta and overwrite the input gradient.
// Chapter 01's layers that need no change are used as they are: lenet::dense_forward /
// dense_backward, lenet::softmax_cross_entropy, lenet::relu_backward, and the three products of
// the convolution's backward pass (lenet::conv2d_backward_products, here between an im2col and a
// col2im that know strides and padding); so are the vector kernels it
// taught, mgpu::add_into and mgpu::sgd_update (common/vector_ops.h). (test_resnet_layers.cpp checks
// that conv2d_forward with stride 1 and no padding IS chapter 01's convolution, to the bit, so
// LeNet could be written with this library.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "../01_lenet/layers.h"  // chapter 01's layers: ResNet reuses its dense layer, loss, ReLU and conv products
#include "common/backend.h"  // MGPU_CUDA
#include "common/device.h"

namespace nn {

class LayerKernels;
const LayerKernels& reference_kernels();  // the table of this file's functions (the end of this file)

using lenet::ImageShape;
using mgpu::Device;

// --- convolution: kernel k x k, stride s, zero padding p on every side
struct ConvShape {
  int in_channels, out_channels, kernel, stride, padding;
};
// Output side for an input side: (in + 2p - k) / s + 1 (28 -> 28 for k3 s1 p1; 28 -> 14 for
// k3 s2 p1; 7 -> 4 for both k3 s2 p1 and k1 s2 p0).
int conv_output_size(int in, int kernel, int stride, int padding);
// The output's shape for input xs.
ImageShape conv_output_shape(ImageShape xs, ConvShape c);
// Throws mgpu::Error, naming `call`, unless xs has the convolution's input channels.
void check_channels(ImageShape xs, ConvShape c, const char* call);
// Throws mgpu::Error, naming `call`, unless [first, first + count) is a slice of xs's batch.
void check_slice(ImageShape xs, int first, int count, const char* call);

// col [Cin*k*k][B*Ho*Wo]: row (c, ky, kx), column (b, oy, ox) holds x[c][b][oy*s + ky - p][ox*s + kx - p],
// or 0 where that pixel lies in the padding.
void im2col(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col);
// The adjoint: dx[c][b][y][x] = the sum of every col entry that copied x[c][b][y][x] (padding
// entries go nowhere).
void col2im(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx);
// The same for `count` images of the batch, from image `first` on: col [Cin*k*k][count*Ho*Wo]
// holds their columns only, and col2im_images overwrites their planes of dx only. im2col and
// col2im are these with first = 0, count = B. (A convolution done a few images at a time, as
// chapter 10's, unfolds one such slice into a small col that stays in cache.)
void im2col_images(const Device& d, const float* x, ImageShape xs, ConvShape c, int first, int count, float* col);
void col2im_images(const Device& d, const float* col, ImageShape xs, ConvShape c, int first, int count, float* dx);

// z [Cout][B][Ho][Wo] = W * im2col(x) + b, with W [Cout][Cin][k][k] and b [Cout]; col is scratch
// of conv_col_size(xs, c) floats. No activation: in a ResNet a BatchNorm comes next. `layout`
// does the unfolding (its im2col): this library's, or a faster table's (chapter 10's raw kernels).
void conv2d_forward(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W, const float* b,
                    float* col, float* z, const LayerKernels& layout = reference_kernels());
// From dz [Cout][B][Ho][Wo] and the forward pass's input x: dW += dz col^T, db += dz ones,
// dx = col2im(W^T dz) (dx == nullptr skips it). The backward pass unfolds x again into the
// scratch col instead of keeping every layer's col from the forward pass: one more im2col per
// layer against, for ResNet-18 at batch 256, 3.4 GB of unfolded inputs kept. dcol is scratch
// of col's size; ones holds at least B*Ho*Wo values of 1.0f.
void conv2d_backward(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c, const float* W,
                     const float* ones, float* col, float* dcol, float* dW, float* db, float* dx,
                     const LayerKernels& layout = reference_kernels());
// Floats of scratch one col (or dcol) needs: Cin*k*k * B*Ho*Wo.
std::int64_t conv_col_size(ImageShape xs, ConvShape c);

// --- per-channel sums: the reduction BatchNorm is made of
// A sum over one channel's row of B*H*W values is a reduction. It is done in two passes: each
// item (c, s) adds up its slice, the values j = s, s + S, s + 2S, ... of channel c's row (in
// double), into partials [C][S]; then one item per channel adds its S partials. Consecutive
// slices read consecutive addresses, so a GPU's neighbouring threads read neighbouring floats.
// kSlices (S) is chosen per backend in one place, layers.cu: many on a GPU (to fill it with
// threads), one on a CPU (a core then walks its channel's row in order).
int reduction_slices();
// Scratch for the sums of up to max_channels channels: [2][max_channels][P] doubles, P the most
// partial sums per channel any registered LayerKernels asks for (this library's: reduction_slices()).
struct ReductionScratch {
  ReductionScratch(const Device& d, int max_channels);
  // The partials, for `channels` channels of `per_channel` partial sums each; mgpu::Error naming
  // `call` if the scratch is too small for that.
  double* partials_for(int channels, int per_channel, const char* call);
  int max_channels, per_channel;
  mgpu::Buffer<double> partials;
};

// --- BatchNorm over the channels of z [C][B][H][W] (n = B*H*W values per channel)
//
// Training normalizes with the batch's own statistics, computed in two passes over z: the mean
// first, then the variance as the mean square distance from it. (One pass, with sum z and sum z^2,
// would take var = E[z^2] - E[z]^2, a difference of two nearly equal numbers wherever the mean is
// large beside the spread: float keeps 7 digits, and a mean of 0.2 with a spread of 0.006, which
// the conv biases of d2l's net produce, leaves 3 of them. test_resnet shows what that does.)
// Each pass ends in sums, so that SyncBN (chapter README) can add them up over every device:
//   1. batch_norm_sums(z):            sums [0][C] = sum z, this device's values
//      (SyncBN: sums[0] summed over the devices; count = the values of all devices)
//   2. batch_norm_square_sums(z):     sums [1][C] = sum (z - mean)^2, mean = sums[0] / count
//      (SyncBN: sums[1] summed over the devices)
//   3. batch_norm_statistics:         stats [2][C] = (mean, 1 / sqrt(var + eps)), var = sums[1] /
//                                     count (biased, as PyTorch normalizes); the running statistics
//                                     move towards the batch's: running = (1 - momentum) running +
//                                     momentum * batch, with the unbiased variance var * count /
//                                     (count - 1), as PyTorch does
// then batch_norm_apply normalizes. Evaluation uses the running statistics instead
// (batch_norm_inference_statistics), and the same apply.
void batch_norm_sums(const Device& d, const float* z, int channels, std::int64_t n, ReductionScratch& scratch,
                     float* sums);
void batch_norm_square_sums(const Device& d, const float* z, int channels, std::int64_t n, double count,
                            ReductionScratch& scratch, float* sums);
void batch_norm_statistics(const Device& d, const float* sums, double count, int channels, float eps, float momentum,
                           float* running_mean, float* running_var, float* stats);
// stats [2][C] = (running_mean, 1 / sqrt(running_var + eps)): what evaluation normalizes with.
void batch_norm_inference_statistics(const Device& d, const float* running_mean, const float* running_var,
                                     int channels, float eps, float* stats);

// y = act(gamma * (z - mean) * inv_std + beta + residual), per channel c of z [C][B][H][W], with
// (mean, inv_std) from stats. residual (the shortcut of a residual block, z's shape) may be null.
// ReLU or not: lenet::Activation. One pass over z: BatchNorm, the residual add and the ReLU fused.
void batch_norm_apply(const Device& d, const float* z, int channels, std::int64_t n, const float* stats,
                      const float* gamma, const float* beta, const float* residual, lenet::Activation act, float* y);

// Backward, from dy (the gradient with respect to BatchNorm's output, before any ReLU: the
// caller applies lenet::relu_backward first), in three steps as the forward pass:
//   1. batch_norm_backward_sums: sums [2][C] = (sum dy, sum dy * xhat) per channel, with
//      xhat = (z - mean) * inv_std recomputed from z and stats; dbeta += the first, dgamma +=
//      the second (this device's share of the parameter gradients)
//   2. (SyncBN only) sums summed over the devices, count over all devices
//   3. batch_norm_backward_input: dz from dy, xhat and the two sums, value by value
// The gradient reaches z through xhat directly and through the mean and variance, which every
// value of the channel shares: hence the two sums. (The formula and its derivation: the chapter
// README, "BatchNorm, backward".)
void batch_norm_backward_sums(const Device& d, const float* dy, const float* z, int channels, std::int64_t n,
                              const float* stats, ReductionScratch& scratch, float* sums, float* dgamma, float* dbeta);
void batch_norm_backward_input(const Device& d, const float* dy, const float* z, int channels, std::int64_t n,
                               const float* stats, const float* gamma, const float* sums, double count, float* dz);

// --- global average pooling: y [C][B] = the mean of each plane of x [C][B][H][W]. [C][B] is
// the layout lenet::dense_forward takes, so no flatten is needed after it.
void global_avg_pool_forward(const Device& d, const float* x, ImageShape xs, float* y);
// dx [C][B][H][W] = dy[c][b] / (H*W) at every pixel of plane (c, b).
void global_avg_pool_backward(const Device& d, const float* dy, ImageShape xs, float* dx);

// --- the table of layer kernels: what the network calls, and what a later chapter may replace
//
// resnet.cpp reaches the convolutions and BatchNorm only through the LayerKernels a program
// chose (layer_kernels()). This class's own methods are the reference: each calls this library's
// function of the same job, above (batch_norm_moments, which has none: this table's own
// batch_norm_sums, then its batch_norm_square_sums). A later chapter derives from it, overrides the jobs it does faster,
// and registers an instance (register_layer_kernels); 09_resnet --kernels NAME then runs it.
// Chapter 10 registers "raw" (raw CUDA kernels for im2col, col2im and BatchNorm), "tiled" (the
// convolution a few images at a time, each slice's col in cache; BatchNorm's sums block by block,
// the statistics in one read) and "tensor" (raw, with the 3x3 convolutions as an implicit GEMM in
// bf16 on tensor cores); this chapter knows none of them. Every table computes the same functions:
// a faster one is checked against this one (tensor's on inputs rounded to bf16, as it reads them).
struct ConvScratch {  // a convolution's scratch: `floats` floats at `data`
  float* data;
  std::int64_t floats;
};

class LayerKernels {
 public:
  virtual ~LayerKernels() = default;
  virtual const char* name() const { return "reference"; }
  // Whether a program in this build runs this table when none is named: the fastest, measured.
  virtual bool preferred_in_this_build() const { return false; }
  // The precision this table's convolutions multiply in whatever the GEMMs are set to ("bf16":
  // chapter 10's tensor-core table rounds their inputs), or nullptr: the GEMMs' precision, as here.
  // 09_resnet runs such a table only with that --precision.
  virtual const char* convolution_precision() const { return nullptr; }
  // Why this table cannot run on device d ("" if it can): chapter 10's tensor table on a GPU
  // without bf16 tensor cores. 09_resnet asks before training.
  virtual std::string unavailable_on(const Device&) const { return ""; }

  // Convolution (conv2d_forward, conv2d_backward). The reference's plan: im2col, then GEMMs.
  // Scratch floats conv_forward and conv_backward need for input xs on device d; callers hand
  // them at least that much (the reference: col and dcol at full size).
  virtual std::int64_t conv_scratch_floats(const Device& d, ImageShape xs, ConvShape c) const;
  virtual void conv_forward(const Device& d, const float* x, ImageShape xs, ConvShape c, const float* W,
                            const float* b, ConvScratch scratch, float* z) const;
  virtual void conv_backward(const Device& d, const float* dz, const float* x, ImageShape xs, ConvShape c,
                             const float* W, const float* ones, ConvScratch scratch, float* dW, float* db,
                             float* dx) const;
  // The unfolding the reference's convolution calls: a table may replace only these.
  virtual void im2col(const Device& d, const float* x, ImageShape xs, ConvShape c, float* col) const;
  virtual void col2im(const Device& d, const float* col, ImageShape xs, ConvShape c, float* dx) const;

  // BatchNorm's kernels (the functions of the same names above).
  virtual int sum_partials_per_channel() const;  // what a ReductionScratch must hold per channel and sum
  virtual void batch_norm_sums(const Device& d, const float* z, int channels, std::int64_t n,
                               ReductionScratch& scratch, float* sums) const;
  virtual void batch_norm_square_sums(const Device& d, const float* z, int channels, std::int64_t n, double count,
                                      ReductionScratch& scratch, float* sums) const;
  // Steps 1 and 2 for one device's own statistics (BatchNorm per device: count = n, nothing
  // summed in between): sums [2][C] = (sum z, sum (z - mean)^2). Here this table's two passes,
  // one after the other; a table may do both in one read of z (chapter 10's "tiled": Chan's merge).
  virtual void batch_norm_moments(const Device& d, const float* z, int channels, std::int64_t n,
                                  ReductionScratch& scratch, float* sums) const;
  virtual void batch_norm_apply(const Device& d, const float* z, int channels, std::int64_t n, const float* stats,
                                const float* gamma, const float* beta, const float* residual, lenet::Activation act,
                                float* y) const;
  virtual void batch_norm_backward_sums(const Device& d, const float* dy, const float* z, int channels, std::int64_t n,
                                        const float* stats, ReductionScratch& scratch, float* sums, float* dgamma,
                                        float* dbeta) const;
  virtual void batch_norm_backward_input(const Device& d, const float* dy, const float* z, int channels,
                                         std::int64_t n, const float* stats, const float* gamma, const float* sums,
                                         double count, float* dz) const;
};

// The registry. A table registers itself once, at the program's start (a static object of the
// chapter that defines it: chapter 10 links its tables into 09_resnet that way), and lives as
// long as the program. Names are unique: a second table of a registered name is refused.
void register_layer_kernels(const LayerKernels& k);
std::vector<const LayerKernels*> registered_layer_kernels();  // the reference first, then in registration order
const LayerKernels* find_layer_kernels(const std::string& name);  // nullptr if none has that name
// The table a program runs when none is named: the one registered as this build's preferred, else the reference.
const LayerKernels& default_layer_kernels();
// The program's choice, made before any layer runs (the devices' threads read it); the reference until then.
void use_layer_kernels(const LayerKernels& k);
const LayerKernels& layer_kernels();

}  // namespace nn
