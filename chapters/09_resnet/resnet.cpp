// ResNet-18's structure, its initialization, and its forward and backward passes over every
// device in lockstep. Host code only: the kernels are the layer library's (layers.cu) and
// chapter 01's.
#include "resnet.h"

#include <algorithm>
#include <cmath>

#include "common/exercise.h"  // the student copy's hole calls mgpu::exercise_not_done
#include "common/random.h"
#include "common/vector_ops.h"

namespace resnet {
namespace {

using lenet::Activation;
using lenet::ImageShape;
using i64 = std::int64_t;

// Builds the tables of a Network: each add_* appends a tensor and returns its index.
struct TableBuilder {
  std::vector<TensorInfo>& table;
  i64& floats;
  int add(const std::string& name, std::vector<int> shape) {
    TensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.count = 1;
    for (int s : t.shape) t.count *= s;
    t.offset = floats;
    floats = (floats + t.count + kAlignment - 1) / kAlignment * kAlignment;  // the next one starts aligned
    table.push_back(t);
    return static_cast<int>(table.size()) - 1;
  }
};

}  // namespace

Network::Network(int w) : width(w) {
  if (w < 1 || w > 1024) throw mgpu::Error("resnet::Network: width " + std::to_string(w) + " is not in 1..1024");
  TableBuilder p{params, param_floats}, st{state, state_floats};
  auto conv = [&](const std::string& name, int in, int out, int k, int stride, int pad, int side) {
    Conv c;
    c.shape = {in, out, k, stride, pad};
    c.in_side = side;
    c.out_side = nn::conv_output_size(side, k, stride, pad);
    c.weight = p.add(name + ".weight", {out, in, k, k});
    c.bias = p.add(name + ".bias", {out});
    c.id = conv_count++;
    return c;
  };
  auto batch_norm = [&](const std::string& name, int channels, int side) {
    BatchNorm b;
    b.channels = channels;
    b.side = side;
    b.gamma = p.add(name + ".weight", {channels});
    b.beta = p.add(name + ".bias", {channels});
    b.running_mean = st.add(name + ".running_mean", {channels});
    b.running_var = st.add(name + ".running_var", {channels});
    b.id = bn_count++;
    return b;
  };
  // d2l's nn.Sequential: conv "0", BatchNorm "1", ReLU "2", then the named stages.
  stem = conv("0", 1, w, 3, 1, 1, 28);
  stem_bn = batch_norm("1", w, 28);
  int channels = w, side = 28;
  for (int stage = 1; stage <= 4; ++stage) {
    const int out = w << (stage - 1);
    for (int i = 0; i < 2; ++i) {
      Block b;
      b.name = "resnet_block" + std::to_string(stage) + "." + std::to_string(i);
      const int stride = stage > 1 && i == 0 ? 2 : 1;  // the first block of stages 2-4 halves the side
      b.projection = stride != 1;                      // ... and is where the channel count changes
      // PyTorch registers a Residual's modules in the order conv1, conv2, conv3, bn1, bn2.
      b.conv1 = conv(b.name + ".conv1", channels, out, 3, stride, 1, side);
      b.conv2 = conv(b.name + ".conv2", out, out, 3, 1, 1, b.conv1.out_side);
      if (b.projection) b.conv3 = conv(b.name + ".conv3", channels, out, 1, stride, 0, side);
      b.bn1 = batch_norm(b.name + ".bn1", out, b.conv1.out_side);
      b.bn2 = batch_norm(b.name + ".bn2", out, b.conv1.out_side);
      blocks.push_back(b);
      channels = out, side = b.conv1.out_side;
    }
  }
  features = channels;
  max_channels = channels;
  fc_weight = p.add("fc.1.weight", {features, 10});  // [in][out]: chapter 01's dense layout
  fc_bias = p.add("fc.1.bias", {10});
}

i64 Network::parameter_count() const {
  i64 n = 0;
  for (const TensorInfo& t : params) n += t.count;
  return n;
}

std::vector<const Conv*> Network::convs() const {
  std::vector<const Conv*> all{&stem};
  for (const Block& b : blocks) {
    all.push_back(&b.conv1);
    all.push_back(&b.conv2);
    if (b.projection) all.push_back(&b.conv3);
  }
  return all;
}

std::vector<const BatchNorm*> Network::batch_norms() const {
  std::vector<const BatchNorm*> all{&stem_bn};
  for (const Block& b : blocks) {
    all.push_back(&b.bn1);
    all.push_back(&b.bn2);
  }
  return all;
}

i64 Network::max_activation(int batch) const {
  i64 most = 0;
  for (const Conv* c : convs()) most = std::max(most, i64(c->shape.out_channels) * batch * c->out_side * c->out_side);
  return most;
}

i64 Network::max_conv_scratch(const nn::LayerKernels& kernels, const Device& d, int batch) const {
  i64 most = 0;
  for (const Conv* c : convs())
    most = std::max(most,
                    kernels.conv_scratch_floats(d, {c->shape.in_channels, batch, c->in_side, c->in_side}, c->shape));
  return most;
}

double Network::training_flops_per_image() const {
  double flops = 0;
  for (const Conv* c : convs()) {
    const double forward = 2.0 * c->shape.out_channels * c->shape.in_channels * c->shape.kernel * c->shape.kernel *
                           c->out_side * c->out_side;
    // backward: dW (one product as large as the forward one) and dx (another; not for the images)
    flops += forward * (c == &stem ? 2 : 3);
  }
  return flops + 3 * 2.0 * features * 10;
}

std::vector<float> init_params(const Network& net, std::uint64_t seed) {
  mgpu::Rng rng(seed);
  std::vector<float> flat(net.param_floats, 0.0f);
  auto fill = [&](int t, auto draw) {
    const TensorInfo& info = net.params[t];
    for (i64 i = 0; i < info.count; ++i) flat[info.offset + i] = static_cast<float>(draw());
  };
  auto weights_and_bias = [&](int weight, int bias, int fan_in) {
    fill(weight, [&] { return 0.01 * rng.normal(); });
    const double bound = 1.0 / std::sqrt(double(fan_in));
    fill(bias, [&] { return bound * (2.0 * rng.uniform() - 1.0); });
  };
  for (const Conv* c : net.convs())
    weights_and_bias(c->weight, c->bias, c->shape.in_channels * c->shape.kernel * c->shape.kernel);
  for (const BatchNorm* b : net.batch_norms()) fill(b->gamma, [] { return 1.0; });  // beta stays 0
  weights_and_bias(net.fc_weight, net.fc_bias, net.features);
  return flat;
}

std::vector<float> init_state(const Network& net) {
  std::vector<float> flat(net.state_floats, 0.0f);
  for (const BatchNorm* b : net.batch_norms()) {
    const TensorInfo& var = net.state[b->running_var];
    std::fill(flat.begin() + var.offset, flat.begin() + var.offset + var.count, 1.0f);
  }
  return flat;
}

Replica::Replica(const Device& d, const Network& net, int B)
    : device(&d),
      capacity(B),
      params(d, net.param_floats),
      grads(d, net.param_floats),
      state(d, net.state_floats),
      shard(d, B),
      pooled(d, std::size_t(net.features) * B),
      logits(d, std::size_t(10) * B),
      dlogits(d, std::size_t(10) * B),
      dpooled(d, std::size_t(net.features) * B),
      loss(d, B),
      correct(d, B),
      conv_scratch(d, net.max_conv_scratch(nn::layer_kernels(), d, B)),
      ones(d, std::size_t(B) * 28 * 28),
      reduction(d, net.max_channels),
      metrics(d) {
  for (const Conv* c : net.convs()) z.emplace_back(d, std::size_t(c->shape.out_channels) * B * c->out_side * c->out_side);
  for (const BatchNorm* b : net.batch_norms()) {
    y.emplace_back(d, std::size_t(b->channels) * B * b->side * b->side);
    bn_sums.emplace_back(d, 2 * b->channels);
    bn_stats.emplace_back(d, 2 * b->channels);
  }
  for (int i = 0; i < 3; ++i) grad.emplace_back(d, net.max_activation(B));
  mgpu::fill(d, ones.data(), ones.size(), 1.0f);
  grads.zero();  // the padding between tensors stays zero for good
}

std::int64_t Replica::bytes_needed(const Device& d, const Network& net, int B) {
  i64 floats = 2 * net.param_floats + net.state_floats  // params, grads, state
               + i64(B) * 28 * 28 + i64(B) * 28 * 28    // the shard's images, ones
               + 2 * i64(net.features) * B + 2 * i64(10) * B + 2 * i64(B)  // pooled, dpooled, logits, dlogits, loss, correct
               + net.max_conv_scratch(nn::layer_kernels(), d, B)  // the convolutions' scratch
               + 3 * net.max_activation(B);                       // grad
  for (const Conv* c : net.convs()) floats += i64(c->shape.out_channels) * B * c->out_side * c->out_side;
  for (const BatchNorm* b : net.batch_norms()) floats += i64(b->channels) * B * b->side * b->side + 4 * b->channels;
  return floats * i64(sizeof(float)) + i64(B) * i64(sizeof(std::int32_t));  // and the shard's labels
}

namespace {

// The shape of a [C][n][side][side] activation of replica r.
ImageShape shape_of(const Replica& r, int channels, int side) { return {channels, r.n, side, side}; }

// Which replicas take part in a pass (all of them in training; in evaluation a device whose
// slice of the test set has run out sits out).
template <class F>
void for_each_replica(Devices& s, F f) {
  for (Replica& r : s.replicas)
    if (r.n > 0) f(r);
}

// Values per channel over every device taking part: what a synchronized BatchNorm divides by.
double total_values(Devices& s, int side) {
  double n = 0;
  for (const Replica& r : s.replicas) n += r.n;
  return n * side * side;
}

// The program's table of layer kernels (layers.h): every convolution and BatchNorm goes through it.
const nn::LayerKernels& kernels() { return nn::layer_kernels(); }

nn::ConvScratch scratch_of(Replica& r) { return {r.conv_scratch.data(), static_cast<i64>(r.conv_scratch.size())}; }

void conv_forward(Devices& s, const Conv& c, const std::function<const float*(Replica&)>& input) {
  for_each_replica(s, [&](Replica& r) {
    kernels().conv_forward(*r.device, input(r), shape_of(r, c.shape.in_channels, c.in_side), c.shape,
                           r.param(s.net, c.weight), r.param(s.net, c.bias), scratch_of(r), r.z[c.id].data());
  });
}

// y[bn.id] = act(BN(z[conv.id]) + residual): batch statistics (synchronized or not) in training,
// running statistics in evaluation.
void batch_norm_forward(Devices& s, const BatchNorm& bn, const Conv& conv,
                        const std::function<const float*(Replica&)>& residual, bool training) {
  const int C = bn.channels;
  auto values = [&](const Replica& r) { return i64(r.n) * bn.side * bn.side; };
  auto running_mean = [&](Replica& r) { return r.stat(s.net, bn.running_mean); };
  auto running_var = [&](Replica& r) { return r.stat(s.net, bn.running_var); };
  if (training) {
    // SyncBN: each pass's sums, summed over the devices, are the whole batch's.
    const bool sync = s.bn == BatchNormMode::Sync && s.replicas.size() > 1;
    auto count = [&](const Replica& r) { return sync ? total_values(s, bn.side) : double(values(r)); };
    auto sum_over_devices = [&](int half) {  // half 0: sum z; half 1: sum (z - mean)^2
      // BEGIN EXERCISE ex09.sync_batch_norm
      std::vector<float*> sums;
      for (Replica& r : s.replicas) sums.push_back(r.bn_sums[bn.id].data() + half * C);
      s.allreduce.run(sums, mgpu::Elements{std::size_t(C)});
      // END EXERCISE ex09.sync_batch_norm
    };
    if (sync) {  // the mean of every device's values first, then the squares about it
      for_each_replica(s, [&](Replica& r) {
        kernels().batch_norm_sums(*r.device, r.z[conv.id].data(), C, values(r), r.reduction, r.bn_sums[bn.id].data());
      });
      sum_over_devices(0);
      for_each_replica(s, [&](Replica& r) {
        kernels().batch_norm_square_sums(*r.device, r.z[conv.id].data(), C, values(r), count(r), r.reduction,
                                         r.bn_sums[bn.id].data());
      });
      sum_over_devices(1);
    } else {  // each device its own: both sums in one call (one read of z where the table can)
      for_each_replica(s, [&](Replica& r) {
        kernels().batch_norm_moments(*r.device, r.z[conv.id].data(), C, values(r), r.reduction,
                                     r.bn_sums[bn.id].data());
      });
    }
    for_each_replica(s, [&](Replica& r) {
      nn::batch_norm_statistics(*r.device, r.bn_sums[bn.id].data(), count(r), C, kBatchNormEps, kBatchNormMomentum,
                                running_mean(r), running_var(r), r.bn_stats[bn.id].data());
    });
  } else {
    for_each_replica(s, [&](Replica& r) {
      nn::batch_norm_inference_statistics(*r.device, running_mean(r), running_var(r), C, kBatchNormEps,
                                          r.bn_stats[bn.id].data());
    });
  }
  for_each_replica(s, [&](Replica& r) {
    kernels().batch_norm_apply(*r.device, r.z[conv.id].data(), C, values(r), r.bn_stats[bn.id].data(),
                               r.param(s.net, bn.gamma), r.param(s.net, bn.beta), residual ? residual(r) : nullptr,
                               Activation::Relu, r.y[bn.id].data());
  });
}

// BatchNorm's backward pass, from dy (its output's gradient, ReLU's backward applied) to dz,
// its input's; dgamma and dbeta added into the replica's grads.
void batch_norm_backward(Devices& s, const BatchNorm& bn, const Conv& conv, const std::function<float*(Replica&)>& dy,
                         const std::function<float*(Replica&)>& dz) {
  // BEGIN EXERCISE ex09.sync_batch_norm
  const int C = bn.channels;
  auto values = [&](const Replica& r) { return i64(r.n) * bn.side * bn.side; };
  // 1. On each device, the two channel sums of its values (sum dy, sum dy * xhat), which are
  //    also dbeta and dgamma, into bn_sums [2][C].
  for_each_replica(s, [&](Replica& r) {
    kernels().batch_norm_backward_sums(*r.device, dy(r), r.z[conv.id].data(), C, values(r), r.bn_stats[bn.id].data(),
                                       r.reduction, r.bn_sums[bn.id].data(), r.grad_of(s.net, bn.gamma),
                                       r.grad_of(s.net, bn.beta));
  });
  // 2. SyncBN: the mean and variance were the whole batch's, so every device's values moved
  //    them: the two sums that carry that back are the whole batch's too.
  const bool sync = s.bn == BatchNormMode::Sync && s.replicas.size() > 1;
  if (sync) {
    std::vector<float*> sums;
    for (Replica& r : s.replicas) sums.push_back(r.bn_sums[bn.id].data());
    s.allreduce.run(sums, mgpu::Elements{std::size_t(2) * C});
  }
  // 3. Each value's input gradient, from the sums over the values they were taken over.
  for_each_replica(s, [&](Replica& r) {
    const double count = sync ? total_values(s, bn.side) : double(values(r));
    kernels().batch_norm_backward_input(*r.device, dy(r), r.z[conv.id].data(), C, values(r), r.bn_stats[bn.id].data(),
                                        r.param(s.net, bn.gamma), r.bn_sums[bn.id].data(), count, dz(r));
  });
  // END EXERCISE ex09.sync_batch_norm
}

// dW, db of convolution c added into grads, from dz; dx (nullptr: not wanted) overwritten.
void conv_backward(Devices& s, const Conv& c, const std::function<const float*(Replica&)>& dz,
                   const std::function<const float*(Replica&)>& input, const std::function<float*(Replica&)>& dx) {
  for_each_replica(s, [&](Replica& r) {
    kernels().conv_backward(*r.device, dz(r), input(r), shape_of(r, c.shape.in_channels, c.in_side), c.shape,
                            r.param(s.net, c.weight), r.ones.data(), scratch_of(r), r.grad_of(s.net, c.weight),
                            r.grad_of(s.net, c.bias), dx ? dx(r) : nullptr);
  });
}

// dh *= (h > 0) over an activation [C][n][side][side] of every replica: ReLU's backward pass.
void relu_backward(Devices& s, int channels, int side, const std::function<const float*(Replica&)>& h,
                   const std::function<float*(Replica&)>& dh) {
  for_each_replica(s, [&](Replica& r) {
    lenet::relu_backward(*r.device, h(r), dh(r), i64(channels) * r.n * side * side);
  });
}

}  // namespace

void forward(Devices& s, bool training) {
  const Network& net = s.net;
  auto images = [](Replica& r) -> const float* { return r.x; };
  auto output_of = [](const BatchNorm& bn) { return [&bn](Replica& r) -> const float* { return r.y[bn.id].data(); }; };
  auto conv_output = [](const Conv& c) { return [&c](Replica& r) -> const float* { return r.z[c.id].data(); }; };

  conv_forward(s, net.stem, images);
  batch_norm_forward(s, net.stem_bn, net.stem, nullptr, training);
  const BatchNorm* input = &net.stem_bn;  // whose output the next block reads
  for (const Block& b : net.blocks) {
    conv_forward(s, b.conv1, output_of(*input));
    batch_norm_forward(s, b.bn1, b.conv1, nullptr, training);                   // h = ReLU(BN1(conv1 x))
    conv_forward(s, b.conv2, output_of(b.bn1));
    if (b.projection) conv_forward(s, b.conv3, output_of(*input));
    const std::function<const float*(Replica&)> shortcut =
        b.projection ? std::function<const float*(Replica&)>(conv_output(b.conv3)) : output_of(*input);
    batch_norm_forward(s, b.bn2, b.conv2, shortcut, training);                 // ReLU(BN2(conv2 h) + shortcut)
    input = &b.bn2;
  }
  const BatchNorm& last = *input;
  for_each_replica(s, [&](Replica& r) {
    const Device& d = *r.device;
    nn::global_avg_pool_forward(d, r.y[last.id].data(), shape_of(r, net.features, last.side), r.pooled.data());
    lenet::dense_forward(d, r.pooled.data(), net.features, r.n, r.param(net, net.fc_weight), r.param(net, net.fc_bias),
                         10, Activation::None, r.logits.data());
  });
}

void loss(Devices& s, bool with_gradient) {
  for_each_replica(s, [&](Replica& r) {
    lenet::softmax_cross_entropy(*r.device, r.logits.data(), r.labels, 10, r.n, r.loss.data(), r.correct.data(),
                                 with_gradient ? r.dlogits.data() : nullptr);
    mgpu::accumulate_metrics(*r.device, r.loss.data(), r.correct.data(), r.n, r.metrics);
  });
}

void backward(Devices& s) {
  const Network& net = s.net;
  // Three gradient buffers per replica, each as large as the largest activation, used in turn:
  // g_out holds the gradient with respect to a block's output; the block's backward pass works
  // in the other two and leaves the gradient with respect to its input in one of them, which is
  // then the next (earlier) block's g_out.
  int g_out = 0, g_a = 1, g_b = 2;
  auto buffer = [](const int& which) { return [&which](Replica& r) { return r.grad[which].data(); }; };
  auto output_of = [](const BatchNorm& bn) { return [&bn](Replica& r) -> const float* { return r.y[bn.id].data(); }; };

  // The head: dense layer, then global average pooling spread back over the 4x4 planes.
  const BatchNorm& last = net.blocks.back().bn2;
  for_each_replica(s, [&](Replica& r) {
    const Device& d = *r.device;
    lenet::dense_backward(d, r.dlogits.data(), r.pooled.data(), net.features, r.n, r.param(net, net.fc_weight), 10,
                          r.ones.data(), r.grad_of(net, net.fc_weight), r.grad_of(net, net.fc_bias), r.dpooled.data());
    nn::global_avg_pool_backward(d, r.dpooled.data(), shape_of(r, net.features, last.side), r.grad[g_out].data());
  });
  for (int i = static_cast<int>(net.blocks.size()) - 1; i >= 0; --i) {
    const Block& b = net.blocks[i];
    const BatchNorm& input = i > 0 ? net.blocks[i - 1].bn2 : net.stem_bn;  // whose output x was
    const int C = b.bn2.channels, side = b.bn2.side;
    // out = ReLU(BN2(conv2 h) + shortcut(x)): g = dL/d(BN2 + shortcut), in place in g_out
    relu_backward(s, C, side, output_of(b.bn2), buffer(g_out));
    batch_norm_backward(s, b.bn2, b.conv2, buffer(g_out), buffer(g_a));         // dz2 in g_a
    conv_backward(s, b.conv2, buffer(g_a), output_of(b.bn1), buffer(g_b));     // dh in g_b
    relu_backward(s, C, side, output_of(b.bn1), buffer(g_b));                  // through h's ReLU
    batch_norm_backward(s, b.bn1, b.conv1, buffer(g_b), buffer(g_a));          // dz1 in g_a
    conv_backward(s, b.conv1, buffer(g_a), output_of(input), buffer(g_b));     // dx, main path, in g_b
    // The shortcut's share of dx, added in: g itself (identity), or through the projection.
    if (b.projection) {
      conv_backward(s, b.conv3, buffer(g_out), output_of(input), buffer(g_a));  // in g_a
      for_each_replica(s, [&](Replica& r) {
        mgpu::add_into(*r.device, r.grad[g_b].data(), r.grad[g_a].data(),
                       i64(b.conv3.shape.in_channels) * r.n * b.conv3.in_side * b.conv3.in_side);
      });
    } else {
      for_each_replica(s, [&](Replica& r) {
        mgpu::add_into(*r.device, r.grad[g_b].data(), r.grad[g_out].data(), i64(C) * r.n * side * side);
      });
    }
    std::swap(g_out, g_b);  // dx is the earlier block's g_out
  }
  // The stem: ReLU, BatchNorm, and the convolution's parameters (the images need no gradient).
  relu_backward(s, net.stem_bn.channels, 28, output_of(net.stem_bn), buffer(g_out));
  batch_norm_backward(s, net.stem_bn, net.stem, buffer(g_out), buffer(g_a));
  conv_backward(s, net.stem, buffer(g_a), [](Replica& r) -> const float* { return r.x; }, nullptr);
}

}  // namespace resnet
