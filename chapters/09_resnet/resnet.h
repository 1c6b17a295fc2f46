// d2l's ResNet-18 (section 13.6) for Fashion-MNIST, from the layer library (layers.h), run
// data-parallel on k devices with BatchNorm per device or synchronized across them.
//
//   X [1][B][28][28]
//   stem: conv 3x3 1 -> w, pad 1 + BN + ReLU          -> [w][B][28][28]   (no max-pool)
//   stage 1: 2 residual blocks, w -> w                  -> [w][B][28][28]
//   stage 2: 2 blocks, w -> 2w, the first with stride 2 -> [2w][B][14][14]
//   stage 3: 2 blocks, 2w -> 4w, stride 2               -> [4w][B][7][7]
//   stage 4: 2 blocks, 4w -> 8w, stride 2               -> [8w][B][4][4]
//   global average pooling                              -> [8w][B]
//   dense 8w -> 10                                      -> [10][B] logits
//
// A residual block (d2l's Residual):  h = ReLU(BN1(conv1 x));  out = ReLU(BN2(conv2 h) + s(x)),
// conv1 3x3 with the block's stride, conv2 3x3, both pad 1; the shortcut s is x itself, or,
// where the shape changes, a 1x1 convolution with the stride ("projection", d2l's conv3).
// w = --width, 64 in d2l (11.2 million parameters); every convolution has a bias, as d2l's
// nn.Conv2d layers do (the README's exercise 1 asks what a bias before a BatchNorm is worth).
//
// Every tensor is named as PyTorch's state_dict names d2l's net ("resnet_block2.0.conv3.weight"),
// so a tensor can be matched with the PyTorch twin's by name (crosscheck.py).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/collective.h"
#include "common/device.h"
#include "common/device_data.h"  // Batch, Metrics
#include "layers.h"

namespace resnet {

using mgpu::Device;

// One tensor in a flat allocation: its PyTorch name and shape, and where it starts (a multiple
// of kAlignment floats, as chapter 01's Flat layout: aligned for vectorized loads).
struct TensorInfo {
  std::string name;
  std::vector<int> shape;
  std::int64_t count = 0, offset = 0;
};
inline constexpr std::int64_t kAlignment = 64;  // floats

// A convolution of the network: its shape, where its input comes from, and where its
// parameters and output live.
struct Conv {
  nn::ConvShape shape;
  int in_side = 0, out_side = 0;  // square images: 28, 14, 7 or 4
  int weight = 0, bias = 0;       // indices into Network::params
  int id = 0;                     // its output is Replica::z[id]
};
struct BatchNorm {
  int channels = 0, side = 0;
  int gamma = 0, beta = 0;                // indices into Network::params ("weight" and "bias" in PyTorch)
  int running_mean = 0, running_var = 0;  // indices into Network::state
  int id = 0;                             // its output (after the residual add and ReLU) is Replica::y[id]
};
struct Block {
  std::string name;  // "resnet_block2.0"
  Conv conv1, conv2;
  BatchNorm bn1, bn2;
  bool projection = false;  // conv3 is the shortcut (else the shortcut is the input itself)
  Conv conv3;
};

struct Network {
  explicit Network(int width);  // 1 <= width <= 1024
  int width;
  Conv stem;
  BatchNorm stem_bn;
  std::vector<Block> blocks;  // 8: two per stage
  int features;               // 8 * width: what the dense layer reads
  int fc_weight, fc_bias;     // indices into params; fc_weight is [features][10] (chapter 01's
                              // dense layout; PyTorch's nn.Linear stores its transpose)
  std::vector<TensorInfo> params;  // the trained tensors, in PyTorch's state_dict order
  std::vector<TensorInfo> state;   // BatchNorm's running means and variances (not trained)
  std::int64_t param_floats = 0, state_floats = 0;  // the flat allocations' sizes, padding included
  int conv_count = 0, bn_count = 0;
  int max_channels = 0;               // 8 * width
  std::int64_t parameter_count() const;  // without the padding
  // For a shard of `batch` images on device d: the largest activation (floats), and the most
  // scratch any convolution asks of `kernels` (the reference: col and dcol at full size).
  std::int64_t max_activation(int batch) const;
  std::int64_t max_conv_scratch(const nn::LayerKernels& kernels, const Device& d, int batch) const;
  // Every convolution, in forward order.
  std::vector<const Conv*> convs() const;
  std::vector<const BatchNorm*> batch_norms() const;
  // Floating-point operations of one training image, forward and backward: 2 per multiply-add
  // of the convolutions' and the dense layer's GEMMs (the rest is a few percent).
  double training_flops_per_image() const;
};

inline constexpr float kBatchNormEps = 1e-5f;       // PyTorch's BatchNorm2d defaults
inline constexpr float kBatchNormMomentum = 0.1f;

// d2l's initialization, on the host, flat (param_floats; padding zero): every convolution's and
// the dense layer's weights from N(0, 0.01^2) (d2l's init_weights); their biases as PyTorch
// leaves them, uniform in +-1/sqrt(fan_in); BatchNorm's gamma 1 and beta 0.
std::vector<float> init_params(const Network& net, std::uint64_t seed);
// Running means 0 and variances 1, flat (state_floats).
std::vector<float> init_state(const Network& net);

// How BatchNorm computes its batch statistics when k devices share a batch:
//   PerDevice  each device normalizes with its own shard's statistics (what d2l's
//              nn.DataParallel does); each keeps its own running statistics, and evaluation
//              uses device 0's (DataParallel keeps only device 0's updates)
//   Sync       SyncBN: each BatchNorm's per-channel sums are summed over all devices before
//              normalizing (forward: two allreduces of C floats, sum z then sum (z - mean)^2;
//              backward: one of 2C), so k devices compute exactly what one device would on the
//              whole batch
enum class BatchNormMode { PerDevice, Sync };

// Everything one device holds: the model, its gradients and running statistics (one flat
// allocation each), the batch's shard, every activation of a forward pass for up to `capacity`
// images, and scratch (the convolutions' as much as the program's LayerKernels asks for).
struct Replica {
  Replica(const Device& d, const Network& net, int capacity);
  // The bytes the constructor allocates on d (but for the reduction scratch and the metrics, a
  // few KB): what a run checks against the devices' memory before it allocates anything.
  static std::int64_t bytes_needed(const Device& d, const Network& net, int capacity);
  const Device* device;
  int capacity;
  mgpu::Buffer<float> params, grads, state;  // param_floats, param_floats, state_floats
  mgpu::Batch shard;                        // [n][28][28] images and [n] labels
  // What the next forward pass reads: n images x [n][28][28] and labels [n] (the shard, or a
  // slice of the test set), n <= capacity; n == 0: this device sits the pass out.
  const float* x = nullptr;
  const std::int32_t* labels = nullptr;
  int n = 0;
  std::vector<mgpu::Buffer<float>> z;  // per Conv::id: its output [Cout][B][side][side]
  std::vector<mgpu::Buffer<float>> y;  // per BatchNorm::id: its output, after residual and ReLU
  std::vector<mgpu::Buffer<float>> bn_sums, bn_stats;  // per BatchNorm::id: [2][C] each
  mgpu::Buffer<float> pooled, logits, dlogits, dpooled;  // [8w][B], [10][B], [10][B], [8w][B]
  mgpu::Buffer<float> loss, correct;                     // [B] per example
  std::vector<mgpu::Buffer<float>> grad;  // 3 buffers of max_activation: the backward pass's gradients
  mgpu::Buffer<float> conv_scratch, ones;  // the convolutions' scratch; ones [B*28*28]
  nn::ReductionScratch reduction;
  mgpu::Metrics metrics;
  float* param(const Network& net, int t) { return params.data() + net.params[t].offset; }
  float* grad_of(const Network& net, int t) { return grads.data() + net.params[t].offset; }
  float* stat(const Network& net, int t) { return state.data() + net.state[t].offset; }
};

// The replicas working on one batch in lockstep, and how they combine. Every function below
// queues one layer on every device before the next layer: BatchNorm's sums can then be
// allreduced between two layers (SyncBN) while the host never waits.
struct Devices {
  const Network& net;
  std::vector<Replica>& replicas;
  BatchNormMode bn;
  mgpu::Collective& allreduce;  // chapter 02's, 03's or 04's collective (train.cpp chooses)
};

// Logits [10][n] of every replica's n images (r.x), in training mode (batch statistics, running
// statistics updated) or evaluation mode (running statistics).
void forward(Devices& s, bool training);
// Per-example loss and correctness into every replica's loss / correct, and added into its
// metrics; with_gradient also fills dlogits (softmax - onehot: the gradient of the summed loss).
void loss(Devices& s, bool with_gradient);
// Adds the gradient of the summed loss of the last forward(training) and loss() into every
// replica's grads: that device's images' share (an allreduce then sums the shares).
void backward(Devices& s);

}  // namespace resnet
