// d2l's LeNet (section 13.5.3), from eight plain parameter arrays:
//
//   X [1][B][28][28]
//   conv 3x3, 1 -> 20, ReLU      -> [20][B][26][26]     W1 [20][1][3][3]   b1 [20]
//   avg pool 2x2                 -> [20][B][13][13]
//   conv 5x5, 20 -> 50, ReLU     -> [50][B][9][9]       W2 [50][20][5][5]  b2 [50]
//   avg pool 2x2                 -> [50][B][4][4]
//   flatten                      -> [800][B]
//   dense 800 -> 128, ReLU       -> [128][B]            W3 [800][128]      b3 [128]
//   dense 128 -> 10              -> [10][B] logits      W4 [128][10]       b4 [10]
//
// 129,068 parameters. Weights are drawn from N(0, 0.01^2), biases start at zero.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/device_data.h"  // DeviceImages, Batch, gather, Metrics: taught here, kept in common/
#include "common/fashion_mnist.h"
#include "layers.h"

namespace lenet {

inline constexpr int kParamTensors = 8;
struct ParamInfo {
  const char* name;
  std::int64_t count;
};
inline constexpr std::array<ParamInfo, kParamTensors> kParams = {{
    {"W1", 20 * 1 * 3 * 3}, {"b1", 20}, {"W2", 50 * 20 * 5 * 5}, {"b2", 50},
    {"W3", 800 * 128},      {"b3", 128}, {"W4", 128 * 10},       {"b4", 10},
}};
std::int64_t parameter_count();  // 129,068

// Host copies of the eight arrays, in kParams order: the same numbers for a given seed,
// whatever the device count, so every run can start from the same point.
using HostParams = std::vector<std::vector<float>>;
HostParams init_params(std::uint64_t seed, float scale = 0.01f);

// The eight arrays on one device, as eight views (W1 .. b4) into memory the Params owns.
// Gradients use the same type. Where that memory lives is the Layout:
//   PerTensor  eight allocations, one per tensor (chapter 02 teaches d2l's tensor-by-tensor way)
//   Flat       one allocation of flat_count() floats, tensor t at offset_of(t), so that one
//              collective moves every gradient at once (chapter 03) and one kernel updates
//              every parameter. Each tensor starts on a multiple of kFlatAlignment floats (256
//              bytes): GEMM, reduction and NCCL kernels use their widest (vectorized) loads
//              only on aligned addresses. The few padding floats between tensors stay zero.
// The layers only ever see the views, so forward and backward do not care which.
enum class Layout { PerTensor, Flat };
inline constexpr std::int64_t kFlatAlignment = 64;  // floats

struct Params {
  std::array<float*, kParamTensors> tensors{};  // views, in kParams order
  float* W1() { return tensors[0]; }
  float* b1() { return tensors[1]; }
  float* W2() { return tensors[2]; }
  float* b2() { return tensors[3]; }
  float* W3() { return tensors[4]; }
  float* b3() { return tensors[5]; }
  float* W4() { return tensors[6]; }
  float* b4() { return tensors[7]; }
  Layout layout() const { return storage.size() == 1 ? Layout::Flat : Layout::PerTensor; }
  // Flat layout only: all flat_count() values, [W1 | pad | b1 | pad | W2 | ... | b4 | pad].
  float* flat();
  const float* flat() const;
  void zero();
  void upload(const HostParams& host);  // checks every tensor's size
  HostParams download() const;
  // What the views point into: eight buffers, or one (Flat). Moving a Params moves these
  // buffers without moving their memory, so the views stay valid.
  std::vector<mgpu::Buffer<float>> storage;
};
Params upload_params(const Device& d, const HostParams& host, Layout layout = Layout::PerTensor);
Params zero_params(const Device& d, Layout layout = Layout::PerTensor);
// Where tensor t starts in the Flat layout: the end of tensor t - 1 rounded up to a multiple
// of kFlatAlignment (W1 0, b1 192, W2 256, b2 25,280, W3 25,344, b3 127,744, W4 127,872, b4 129,152).
// offset_of(kParamTensors) is flat_count().
std::int64_t offset_of(int t);
// The Flat layout's length: the 129,068 parameters and the padding, 129,216 floats.
std::int64_t flat_count();

// Every intermediate tensor of one forward + backward pass for up to `capacity` images.
// Comments give shapes for B = capacity.
struct Workspace {
  Workspace(const Device& d, int capacity);
  int capacity;
  mgpu::Buffer<float> col1;      // [9][B*26*26]     conv1's unfolded input
  mgpu::Buffer<float> h1;        // [20][B][26][26]  conv1 + ReLU
  mgpu::Buffer<float> p1;        // [20][B][13][13]  pool
  mgpu::Buffer<float> col2;      // [500][B*9*9]     conv2's unfolded input
  mgpu::Buffer<float> h2;        // [50][B][9][9]    conv2 + ReLU
  mgpu::Buffer<float> p2;        // [50][B][4][4]    pool
  mgpu::Buffer<float> f;         // [800][B]         flattened
  mgpu::Buffer<float> h3;        // [128][B]         dense3 + ReLU
  mgpu::Buffer<float> z4;        // [10][B]          logits
  // gradients of the loss with respect to each of the above
  mgpu::Buffer<float> dz4, dh3, df, dp2, dh2, dcol2, dp1, dh1;
  mgpu::Buffer<float> loss, correct;  // [B] per example
  mgpu::Buffer<float> ones;           // [B*26*26] all 1.0f (bias gradients: dz * ones)
};

// Logits ws.z4 [10][n] for n <= capacity images x [1][n][28][28].
void forward(const Device& d, Params& p, Workspace& ws, const float* x, int n);
// Per-example loss and correctness into ws.loss / ws.correct; with_gradient also fills ws.dz4.
void loss(const Device& d, Workspace& ws, const std::int32_t* labels, int n, bool with_gradient);
// LeNet's four layers with parameters, in forward order: layer l owns tensors 2l (its W) and
// 2l + 1 (its b), which are also neighbours in the Flat layout.
inline constexpr int kLayers = 4;
// Called when one layer's parameter gradients are complete, last layer (3) first, first layer
// (0) last: a trainer can start summing that layer across devices while the earlier layers'
// gradients are still being computed (chapter 05's overlap). Empty: nobody is told.
using GradientReady = std::function<void(int layer)>;

// What layer l's backward pass reads and writes, for n images. backward() fills it from a
// Workspace; a program that keeps the activations elsewhere (chapter 07's pipeline stages, each
// with the buffers of its own layers) fills it from its own.
struct LayerTensors {
  const float* in = nullptr;        // layers 2-3: the input the forward pass saw, f [800][n] or h3 [128][n]
  const float* col = nullptr;       // layers 0-1: the unfolded input the forward pass kept (col1, col2)
  const float* relu_out = nullptr;  // layers 0-2: the output of the layer's ReLU (h1, h2, h3)
  float* dy = nullptr;              // the gradient of the layer's output (z4, h3, p2 flattened, p1); overwritten
  float* dx = nullptr;              // where the gradient of its input goes (nullptr: not wanted)
  float* dpool = nullptr;           // layer 1: scratch [50][n][4][4], dy unflattened (dp2)
  float* dconv = nullptr;           // layers 0-1: scratch, the gradient of the convolution's output (dh1, dh2)
  float* dcol = nullptr;            // layer 1: scratch of col2's size (dcol2)
  const float* ones = nullptr;      // at least n*26*26 values of 1.0f
};
// Called on every gradient just before a GEMM of the backward pass reads it (ws.dz4, dz3, dh2,
// dh1), with its element count: chapter 06 rounds it to 16 bits there.
using BeforeGemm = std::function<void(float* gradient, std::int64_t count)>;

// Layer l's backward pass: 3 is dense4; 2 is dense3's ReLU, then dense3; 1 is the unflatten,
// the pooling with conv2's ReLU, then conv2; 0 is the pooling with conv1's ReLU, then conv1
// (whose input, the images, needs no gradient). Adds the layer's dW and db into g.
void layer_backward(const Device& d, int l, Params& p, Params& g, const LayerTensors& t, int n,
                    const BeforeGemm& before_gemm = {});
// Adds the gradient of the summed loss of the last forward() and loss() (n images) into g:
// layer_backward for layers 3, 2, 1, 0, calling ready(l) as soon as layer l's gradients have
// been added.
void backward(const Device& d, Params& p, Params& g, Workspace& ws, int n, const GradientReady& ready = {},
              const BeforeGemm& before_gemm = {});

// Adds ws.loss and ws.correct of n examples into m.
void accumulate_metrics(const Device& d, const Workspace& ws, int n, mgpu::Metrics& m);
// How one device works through a batch: in chunks of at most capacity() images, spread over
// count() lanes. Each lane has its own Workspace, gradient arrays and metrics, and takes every
// count()-th chunk. A GPU runs one lane over the whole batch (its parallelism is inside each
// kernel). A CPU runs one lane per core: each core then does small single-threaded GEMMs on
// data that stays in its own cache, and the lanes' gradients are summed at the end. That is
// data parallelism across cores, the idea chapter 02 applies across devices.
struct Lanes {
  Lanes(const Device& d, int lanes, int capacity);
  int count() const { return static_cast<int>(workspaces.size()); }
  int capacity() const { return workspaces[0].capacity; }
  std::vector<Workspace> workspaces;
  std::vector<Params> grads;    // lanes 1..count()-1 (lane 0 adds straight into the caller's g)
  std::vector<mgpu::Metrics> metrics; // one per lane
};
// This backend's choice for batches of batch_size: min(lanes_per_device(d), number of chunks)
// lanes, each taking chunks of chunk_images() images.
Lanes make_lanes(const Device& d, int batch_size);

// The gradient of the summed loss over the n examples x [n][28][28], y [n] (on d) is ADDED
// into g; loss and accuracy are added into m. ready(l), when given, is called once per layer,
// 3 down to 0, as soon as layer l's gradient in g holds the whole batch: during the last
// chunk's backward pass when one lane does all the work (a GPU, or a CPU with one thread),
// after the lanes are summed when several do, and at the end when n == 0 (g is complete).
void accumulate_gradients(const Device& d, Params& p, Params& g, Lanes& lanes, const float* x,
                          const std::int32_t* y, int n, mgpu::Metrics& m, const GradientReady& ready = {});

// p -= lr * g / batch_size for all eight tensors: d2l's sgd(params, lr, batch_size).
void sgd(const Device& d, Params& p, const Params& g, float lr, int batch_size);

// Fraction of `data` classified correctly.
double evaluate_accuracy(const Device& d, Params& p, Lanes& lanes, const mgpu::DeviceImages& data);

// How many images one lane's forward/backward pass takes at a time on this backend (lenet.cu).
int chunk_images(int batch_size);

}  // namespace lenet
