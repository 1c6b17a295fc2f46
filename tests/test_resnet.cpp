// Chapter 09's network (chapters/09_resnet/resnet.h), assembled from layers that
// test_resnet_layers.cpp checks one by one. Here: the structure is d2l's, the whole backward
// pass is the derivative of the whole forward pass, and the property that defines each way of
// running BatchNorm on k devices:
//   SyncBN     k devices compute what ONE device computes on the whole batch
//   per device the gradient is the sum of k independent one-device gradients, one per shard
// and evaluation mode normalizes each image on its own (running statistics), so an image's
// logits do not depend on the batch it comes in.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/03_ring_allreduce/ring.h"
#include "chapters/06_mixed_precision/formats.h"     // to_bf16: the tensor table's rounding, for its oracle
#include "chapters/09_resnet/resnet.h"
#include "chapters/09_resnet/train.h"
#include "chapters/10_fast_kernels/implicit_gemm.h"  // which convolutions the tensor table takes
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/report.h"
#include "common/random.h"
#include "common/vector_ops.h"
#include "helpers.h"
#include "temp_dir.h"
#include "resnet_model.h"

namespace {

using resnet::BatchNormMode;
using resnet::Network;
using resnet::Replica;

// resnet_model.h: the network on k devices, shared with the hidden cases.
using resnet_testing::check_tensors_close;
using resnet_testing::feeds_batch_norm;
using resnet_testing::HostBatch;
using resnet_testing::Model;
using resnet_testing::random_batch;
using resnet_testing::relative_difference;

constexpr double kFiniteStep = 1e-3;

}  // namespace

TEST_CASE("structure: d2l's ResNet-18 at width 64 has 11,175,818 parameters, in PyTorch's names and order") {
  // By hand: stem conv 64*9 + 64 and BN 2*64: 768. Stage 1: two blocks of two 64->64 3x3 convs
  // (36,928 each) and two BNs (128 each): 148,224. Stage 2: conv1 73,856, conv2 147,584, the
  // projection 8,320, BNs 512; then a block of 2 x 147,584 + 512: 525,952. Stage 3: 295,168 +
  // 590,080 + 33,024 + 1,024 + (2 x 590,080 + 1,024) = 2,100,480. Stage 4: 1,180,160 + 2,359,808 +
  // 131,584 + 2,048 + (2 x 2,359,808 + 2,048) = 8,395,264. Dense 512*10 + 10: 5,130.
  const Network net(64);
  CHECK(net.parameter_count() == 11'175'818);
  CHECK(net.conv_count == 1 + 8 * 2 + 3);  // stem, two per block, three projections
  CHECK(net.bn_count == 1 + 8 * 2);
  CHECK(net.params.front().name == "0.weight");
  CHECK(net.params[2].name == "1.weight");  // the stem's BatchNorm: PyTorch calls gamma "weight"
  CHECK(net.params.back().name == "fc.1.bias");
  // A projection block registers conv1, conv2, conv3, bn1, bn2, as PyTorch's Residual does.
  std::vector<std::string> block2;
  for (const resnet::TensorInfo& t : net.params)
    if (t.name.rfind("resnet_block2.0.", 0) == 0) block2.push_back(t.name.substr(16));
  CHECK(block2 == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "conv3.weight",
                                           "conv3.bias", "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"});
  // Sides 28, 14, 7, 4 and channels 64..512; every tensor starts aligned.
  CHECK(net.blocks[1].bn2.side == 28);
  CHECK(net.blocks[2].conv1.out_side == 14);
  CHECK(net.blocks[4].conv3.out_side == 7);
  CHECK(net.blocks[7].bn2.side == 4);
  CHECK(net.features == 512);
  for (const resnet::TensorInfo& t : net.params) CHECK(t.offset % resnet::kAlignment == 0);
  // 2.7 GFLOP per training image, the figure the chapter's time estimates rest on.
  CHECK(net.training_flops_per_image() == doctest::Approx(2.73e9).epsilon(0.02));
}

TEST_CASE("init: d2l's init_weights: weights N(0, 0.01^2), biases U(+-1/sqrt(fan_in)), gamma 1, beta 0") {
  const Network net(8);
  const std::vector<float> p = resnet::init_params(net, 3);
  for (const resnet::TensorInfo& t : net.params) {
    CAPTURE(t.name);
    double sum = 0, sum_sq = 0, largest = 0;
    for (std::int64_t i = 0; i < t.count; ++i) {
      const double v = p[t.offset + i];
      sum += v, sum_sq += v * v, largest = std::max(largest, std::abs(v));
    }
    const bool batch_norm = t.name.find(".bn") != std::string::npos || t.name.rfind("1.", 0) == 0;
    if (batch_norm && t.name.find("weight") != std::string::npos) {
      CHECK(sum == t.count);  // gamma: all ones
    } else if (batch_norm) {
      CHECK(largest == 0);  // beta: all zeros
    } else if (t.name.find("weight") != std::string::npos) {
      CHECK(std::sqrt(sum_sq / t.count) == doctest::Approx(0.01).epsilon(t.count > 1000 ? 0.05 : 0.5));
    } else {  // a bias: uniform within 1/sqrt(fan_in) (the fan-in of the weight just before it)
      const resnet::TensorInfo& w = *(&t - 1);
      const double bound = 1.0 / std::sqrt(double(w.count / w.shape[t.name == "fc.1.bias" ? 1 : 0]));
      CHECK(largest <= bound);
      CHECK(largest > 0.3 * bound);
    }
  }
}

TEST_CASE("backward: the whole network's gradient against finite differences of its loss") {
  // Width 2 and four images keep it small; every tensor is probed at its largest gradient. The
  // loss is computed in float, so the step must stand out of its rounding, and the function must
  // be smooth on the step's scale: d2l's weights of 0.01 are not (a step of 0.001 is a tenth of
  // one, and BatchNorm divides by their spread), so the convolutions' weights are scaled up 30
  // times first. Even so the stem, whose BatchNorm sees 2 channels of 4 random images, bends
  // within a step of 0.01 (its difference quotient moves 0.15 -> 0.26 -> 0.38 -> 0.44 as the
  // step shrinks 0.03 -> 0.001, towards the 0.42 computed): 0.001 and 10% agreement is what float
  // allows here. An error in the backward pass (a wrong sum, a missing path through the mean or
  // the shortcut) is off by far more.
  Model m(1, 2, 4, BatchNormMode::PerDevice);
  m.scale_conv_weights(30.0f);
  m.load(random_batch(4, 11), {4});
  const std::vector<float> grad = m.gradient();
  int probed = 0;
  for (const resnet::TensorInfo& t : m.net.params) {
    CAPTURE(t.name);
    if (feeds_batch_norm(t.name)) continue;
    std::int64_t at = t.offset;  // the element with the largest |gradient|
    for (std::int64_t i = t.offset; i < t.offset + t.count; ++i)
      if (std::abs(grad[i]) > std::abs(grad[at])) at = i;
    const double eps = kFiniteStep;
    std::vector<float> p = m.params;
    p[at] += float(eps);
    m.replicas[0].params.upload(p);
    const double up = m.summed_loss();
    p[at] -= float(2 * eps);
    m.replicas[0].params.upload(p);
    const double down = m.summed_loss();
    const double numeric = (up - down) / (2 * eps);
    CHECK(grad[at] == doctest::Approx(numeric).epsilon(0.1));
    ++probed;
  }
  CHECK(probed == int(m.net.params.size()) - 17);  // every tensor but the 17 biases before a BatchNorm
}

TEST_CASE("backward: a bias right before a BatchNorm gets no gradient (the mean takes it away)") {
  Model m(1, 4, 5, BatchNormMode::PerDevice);
  m.load(random_batch(5, 2), {5});
  const std::vector<float> grad = m.gradient();
  double conv_bias = 0, conv_weight = 0;
  for (const resnet::Conv* c : m.net.convs()) {
    if (c->id != m.net.stem.id && !std::string(m.net.params[c->weight].name).empty()) {
      const resnet::TensorInfo& b = m.net.params[c->bias];
      const resnet::TensorInfo& w = m.net.params[c->weight];
      if (b.name.find("conv3") != std::string::npos) continue;  // the projection feeds the sum, not a BN
      for (std::int64_t i = 0; i < b.count; ++i) conv_bias = std::max(conv_bias, double(std::abs(grad[b.offset + i])));
      for (std::int64_t i = 0; i < w.count; ++i) conv_weight = std::max(conv_weight, double(std::abs(grad[w.offset + i])));
    }
  }
  CHECK(conv_weight > 1e-2);
  CHECK(conv_bias < 1e-4 * conv_weight);
}

TEST_CASE("SyncBN: k devices compute the gradient and the running statistics of one device on the whole batch") {
  const HostBatch b = random_batch(7, 5);
  Model one(1, 4, 7, BatchNormMode::Sync);
  one.load(b, {7});
  const std::vector<float> want = one.gradient();
  const std::vector<float> want_state = one.replicas[0].state.download();
  for (const std::vector<int>& sizes : {std::vector<int>{4, 3}, std::vector<int>{3, 2, 2}}) {
    const int k = static_cast<int>(sizes.size());
    CAPTURE(k);
    Model many(k, 4, sizes[0], BatchNormMode::Sync);
    many.load(b, sizes);
    const std::vector<float> got = many.gradient();
    check_tensors_close(many.net, many.net.params, got, want, 1e-4, "gradient");
    for (int i = 0; i < k; ++i)
      check_tensors_close(many.net, many.net.state, many.replicas[i].state.download(), want_state, 1e-5,
                          "device " + std::to_string(i) + " running statistic");
  }
}

TEST_CASE("per-device BatchNorm: the gradient is the sum of one-device gradients of each shard, not the whole batch's") {
  const HostBatch b = random_batch(6, 9);
  const HostBatch first{{b.pixels.begin(), b.pixels.begin() + 4 * 784}, {b.labels.begin(), b.labels.begin() + 4}, 4};
  const HostBatch second{{b.pixels.begin() + 4 * 784, b.pixels.end()}, {b.labels.begin() + 4, b.labels.end()}, 2};
  Model alone(1, 4, 4, BatchNormMode::PerDevice);
  alone.load(first, {4});
  std::vector<float> want = alone.gradient();
  const std::vector<float> device0_state = alone.replicas[0].state.download();
  alone.load(second, {2});
  const std::vector<float> g2 = alone.gradient();
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += g2[i];

  Model two(2, 4, 4, BatchNormMode::PerDevice);
  two.load(b, {4, 2});
  const std::vector<float> got = two.gradient();
  check_tensors_close(two.net, two.net.params, got, want, 1e-5, "gradient");
  // Device 0's running statistics saw its own shard only.
  check_tensors_close(two.net, two.net.state, two.replicas[0].state.download(), device0_state, 1e-6, "running statistic");

  // And it is a different computation from SyncBN's: the shards' statistics differ.
  Model whole(1, 4, 6, BatchNormMode::PerDevice);
  whole.load(b, {6});
  CHECK(relative_difference(got, whole.gradient()) > 1e-2);
}

TEST_CASE("evaluation mode: an image's logits do not depend on the batch it comes in; in training mode they do") {
  Model m(1, 4, 6, BatchNormMode::PerDevice);
  const HostBatch b = random_batch(6, 21);
  // Running statistics that are not the initial ones: one training pass moves them.
  m.load(b, {6});
  m.gradient();
  auto logits_of_first = [&](int n, bool training) {
    const HostBatch part{{b.pixels.begin(), b.pixels.begin() + std::size_t(n) * 784},
                         {b.labels.begin(), b.labels.begin() + n}, n};
    m.load(part, {n});
    resnet::Devices s = m.lockstep();
    resnet::forward(s, training);
    const std::vector<float> z = m.replicas[0].logits.download();  // [10][n]
    std::vector<float> first(10);
    for (int c = 0; c < 10; ++c) first[c] = z[std::size_t(c) * n];
    return first;
  };
  const std::vector<float> alone = logits_of_first(2, false), in_batch = logits_of_first(6, false);
  for (int c = 0; c < 10; ++c) CHECK(alone[c] == doctest::Approx(in_batch[c]).epsilon(1e-5));
  const std::vector<float> train_alone = logits_of_first(2, true), train_batch = logits_of_first(6, true);
  double differs = 0;
  for (int c = 0; c < 10; ++c) differs = std::max(differs, double(std::abs(train_alone[c] - train_batch[c])));
  CHECK(differs > 1e-4);
}

TEST_CASE("training: three SGD steps with SyncBN on 2 devices follow one device's parameters") {
  // From d2l's 0.01 weights the first step is violent (BatchNorm divides the gradient by the
  // small spread those weights give, so the step is far larger than the weights), and a rounding
  // difference of 1e-6 after one step grows to 1e-2 after three. With the convolutions' weights
  // scaled up, as in the finite-difference test, both runs stay within about 1e-7 of each other
  // (relative to the largest parameter); the check allows ten times that.
  const HostBatch b = random_batch(8, 31);
  Model one(1, 2, 8, BatchNormMode::Sync), two(2, 2, 4, BatchNormMode::Sync);
  one.scale_conv_weights(30.0f), two.scale_conv_weights(30.0f);
  for (int step = 0; step < 3; ++step) {
    for (Model* m : {&one, &two}) {
      m->load(b, m->replicas.size() == 1 ? std::vector<int>{8} : std::vector<int>{4, 4});
      m->gradient();
      for (Replica& r : m->replicas)
        mgpu::sgd_update(*r.device, r.params.data(), r.grads.data(), m->net.param_floats, 0.1f / 8);
    }
  }
  const std::vector<float> got = two.replicas[1].params.download(), want = one.replicas[0].params.download();
  MESSAGE("three SyncBN steps: 2 devices differ from 1 by " << relative_difference(got, want) << " of the scale");
  CHECK(relative_difference(got, want) < 1e-6);  // 1.05e-7 on the cpu build, both cuts
  CHECK(relative_difference(want, one.params) > 1e-3);  // the parameters did move
}

namespace {

// What a table whose convolutions multiply in bf16 (chapter 10's tensor) must equal: the
// reference with the inputs those convolutions read rounded to bf16 first (x, W and dz; db sums
// dz as it is), for the shapes such a table takes. Rounded here on the host, between a download
// and an upload: a test's table, never registered.
class RoundedReference : public nn::LayerKernels {
 public:
  const char* name() const override { return "reference, bf16 inputs"; }
  std::int64_t conv_scratch_floats(const mgpu::Device& d, lenet::ImageShape xs, nn::ConvShape c) const override {
    return 2 * nn::LayerKernels::conv_scratch_floats(d, xs, c);  // col and dcol
  }
  void conv_forward(const mgpu::Device& d, const float* x, lenet::ImageShape xs, nn::ConvShape c, const float* W,
                    const float* b, nn::ConvScratch scratch, float* z) const override {
    if (!fast::tc::takes(xs, c)) return nn::LayerKernels::conv_forward(d, x, xs, c, W, b, scratch, z);
    const auto xr = rounded(d, x, xs.size()), Wr = rounded(d, W, weights(c));
    nn::LayerKernels::conv_forward(d, xr.data(), xs, c, Wr.data(), b, scratch, z);
  }
  void conv_backward(const mgpu::Device& d, const float* dz, const float* x, lenet::ImageShape xs, nn::ConvShape c,
                     const float* W, const float* ones, nn::ConvScratch scratch, float* dW, float* db,
                     float* dx) const override {
    if (!fast::tc::takes(xs, c)) return nn::LayerKernels::conv_backward(d, dz, x, xs, c, W, ones, scratch, dW, db, dx);
    const std::int64_t dz_size = nn::conv_output_shape(xs, c).size();
    const auto xr = rounded(d, x, xs.size()), Wr = rounded(d, W, weights(c)), dzr = rounded(d, dz, dz_size);
    mgpu::Buffer<float> db_unused(d, std::size_t(c.out_channels)), dW_unused(d, weights(c));
    nn::LayerKernels::conv_backward(d, dzr.data(), xr.data(), xs, c, Wr.data(), ones, scratch, dW, db_unused.data(), dx);
    nn::LayerKernels::conv_backward(d, dz, xr.data(), xs, c, Wr.data(), ones, scratch, dW_unused.data(), db, nullptr);
  }

 private:
  static std::size_t weights(nn::ConvShape c) {
    return std::size_t(c.out_channels) * c.in_channels * c.kernel * c.kernel;
  }
  static mgpu::Buffer<float> rounded(const mgpu::Device& d, const float* p, std::int64_t n) {
    mgpu::Buffer<float> copy(d, std::size_t(n));
    mgpu::copy_peer(d, copy.data(), d, p, mgpu::Elements{std::size_t(n)});
    std::vector<float> host = copy.download();
    for (float& f : host) f = mixed::from_bf16(mixed::to_bf16(f));
    copy.upload(host);
    return copy;
  }
};

}  // namespace

TEST_CASE("layer kernels: three SGD steps with every registered table follow the reference's parameters") {
  // 09_resnet --kernels NAME runs the network's convolutions and BatchNorm through a table a later
  // chapter registered (layers.h); this suite links chapter 10's ("raw", "tiled", "tensor"). Each must
  // compute what the reference computes: raw's im2col, col2im and apply give the same bits, its
  // sums add in another order; tiled's dW is summed tile by tile. So the runs part by rounding
  // only. Weights scaled up as in the SyncBN test above, so that rounding does not grow into a
  // different trajectory. Each model is made after its table is chosen: the replica's
  // convolution scratch is the size its table asks for. A table whose convolutions multiply in
  // bf16 (chapter 10's tensor) follows the reference on bf16-rounded inputs (RoundedReference):
  // the same roundings, so again the sums' order only, but for one step: from the second on, the
  // two round values that differ in their last float bits, and a value on either side of a bf16
  // rounding boundary moves by 2^-8 of itself (measured on the cpu build: 1.3e-8 of the scale
  // after one step, 4.9e-5 after two, 1.2e-3 after three). So such a table takes one step, and
  // its gradients are checked too.
  const RoundedReference rounded_reference;
  struct Restore {  // the library's setting is the process's: put the reference back, even on failure
    ~Restore() { nn::use_layer_kernels(nn::reference_kernels()); }
  } restore;
  REQUIRE(&nn::layer_kernels() == &nn::reference_kernels());  // what every other test here relies on
  const std::vector<const nn::LayerKernels*> tables = nn::registered_layer_kernels();
  REQUIRE(tables.size() >= 4);  // the reference, chapter 10's raw, tiled and tensor
  const HostBatch b = random_batch(8, 37);
  const mgpu::DeviceSet here(1);  // where the models will run: can each table run there?
  for (const nn::LayerKernels* table : tables) {
    if (table == &nn::reference_kernels()) continue;
    const std::string name = table->name();
    CAPTURE(name);
    if (const std::string why = table->unavailable_on(here[0]); !why.empty()) {
      MESSAGE(name << " cannot run here, and says so: " << why);  // test_implicit_gemm checks the refusal
      continue;
    }
    const nn::LayerKernels& oracle =
        table->convolution_precision() ? static_cast<const nn::LayerKernels&>(rounded_reference) : nn::reference_kernels();
    nn::use_layer_kernels(oracle);
    Model reference(1, 2, 8, BatchNormMode::PerDevice);
    nn::use_layer_kernels(*table);
    Model fast(1, 2, 8, BatchNormMode::PerDevice);
    reference.scale_conv_weights(30.0f), fast.scale_conv_weights(30.0f);
    const int steps = table->convolution_precision() ? 1 : 3;
    for (int step = 0; step < steps; ++step)
      for (Model* m : {&reference, &fast}) {
        nn::use_layer_kernels(m == &fast ? *table : oracle);
        m->load(b, {8});
        m->gradient();
        Replica& r = m->replicas[0];
        mgpu::sgd_update(*r.device, r.params.data(), r.grads.data(), m->net.param_floats, 0.1f / 8);
      }
    const std::vector<float> got = fast.replicas[0].params.download(), want = reference.replicas[0].params.download();
    MESSAGE(steps << " step(s): " << std::string(table->name()) << " differs from "
                  << std::string(oracle.name()) << " by " << relative_difference(got, want) << " of the scale");
    CHECK(relative_difference(got, want) < 1e-6);
    CHECK(relative_difference(want, reference.params) > (steps == 1 ? 1e-4 : 1e-3));  // the parameters did move
    const std::vector<float> got_grads = fast.replicas[0].grads.download(),
                             want_grads = reference.replicas[0].grads.download();
    CHECK(relative_difference(got_grads, want_grads) < 1e-5);  // the last step's gradients
    const std::vector<float> got_state = fast.replicas[0].state.download(),
                             want_state = reference.replicas[0].state.download();
    CHECK(relative_difference(got_state, want_state) < 1e-6);  // the running statistics too
  }
}

TEST_CASE("layer kernels: a replica with the tensor table holds less than with raw's full-size col") {
  // The replica's convolution scratch is the most any layer's table asks for: raw's the largest
  // col (stage 1's 3x3, nine copies of its input) and its dcol; tensor's, where it takes stage 1,
  // two channels-last bf16 copies and the filters, so the largest is the stride-2 layer's col.
  // Everything else (parameters, activations) is the same. Counted as device_memory counts: what
  // the run's peak_mib reports.
  struct Restore {
    ~Restore() { nn::use_layer_kernels(nn::reference_kernels()); }
  } restore;
  const nn::LayerKernels* tensor = nn::find_layer_kernels("tensor");
  REQUIRE(tensor != nullptr);
  const Network net(16);
  mgpu::DeviceSet devices(1);
  std::size_t held[2] = {};
  for (int i = 0; i < 2; ++i) {
    nn::use_layer_kernels(i == 0 ? *nn::find_layer_kernels("raw") : *tensor);
    const std::size_t before = mgpu::device_memory(devices[0]).held;
    const Replica replica(devices[0], net, 64);
    held[i] = mgpu::device_memory(devices[0]).held - before;
  }
  MESSAGE("width 16, 64 images: a replica holds " << held[0] / 1e6 << " MB with raw, " << held[1] / 1e6
                                                  << " MB with tensor");
  CHECK(held[1] < held[0]);
}

TEST_CASE("graph: a recorded step replays the same arithmetic as the step queued kernel by kernel") {
  // 09_resnet --graph on, as chapter 01's: full batches replay one recorded step (a CUDA graph on
  // a GPU) after their shards are gathered; a warm-up epoch (its rate changes every step) and the
  // short last batch run the usual way. The same kernels on the same buffers in the same order:
  // the same bits. On the cpu backend both runs queue the same work (the bookkeeping is checked);
  // on a GPU, the graph itself.
  mgpu::FashionMnist data = mgpu::load_fashion_mnist("", /*limit_train=*/600);
  data.test.count = 200;
  data.test.pixels.resize(200u * 28 * 28);
  data.test.labels.resize(200);
  testing::TempDir out;
  mgpu::Options o;
  o.epochs = 2;
  o.batch_size = 64;  // 600 = 9 x 64 + 24: a short last batch
  o.warmup_epochs = 1;
  o.lr = 0.1f;
  o.out = out.path.string();
  mgpu::DeviceSet devices(1);
  resnet::ResnetOptions ro;
  ro.width = 2;
  ro.kernels = &nn::reference_kernels();
  auto run = [&](bool graph, long* replays) {
    ro.graph = graph;
    mgpu::TrainingLog log("09_resnet", graph ? "graph_on" : "graph_off", o, {}, 1, data.train.count);
    resnet::train(devices, data, o, ro, log, replays);
    return log.records();
  };
  long replays_on = -1, replays_off = -1;
  const std::vector<mgpu::EpochRecord> on = run(true, &replays_on), off = run(false, &replays_off);
  REQUIRE(on.size() == 2);
  REQUIRE(off.size() == 2);
  for (std::size_t e = 0; e < 2; ++e) {
    CHECK(on[e].train_loss == off[e].train_loss);
    CHECK(on[e].train_acc == off[e].train_acc);
    CHECK(on[e].test_acc == off[e].test_acc);
  }
  CHECK(on[1].train_loss != on[0].train_loss);  // it trained
  CHECK(replays_on == 9);  // epoch 2's full batches; epoch 1 warms up
  CHECK(replays_off == 0);
  ro.graph = true;
  CHECK(resnet::check_graph(ro, 1).empty());
  CHECK(resnet::check_graph(ro, 2).find("--devices 1") != std::string::npos);
}
