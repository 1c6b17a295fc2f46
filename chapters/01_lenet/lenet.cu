// LeNet's forward and backward passes, the training step's pieces, and evaluation.
#include "lenet.h"

#include <algorithm>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/parallel.h"
#include "common/random.h"
#include "common/vector_ops.h"

namespace lenet {

using mgpu::kImagePixels;

std::int64_t parameter_count() {
  std::int64_t n = 0;
  for (const ParamInfo& p : kParams) n += p.count;
  return n;
}

HostParams init_params(std::uint64_t seed, float scale) {
  mgpu::Rng rng(seed);
  HostParams host;
  for (const ParamInfo& info : kParams) {
    std::vector<float> t(info.count, 0.0f);  // biases (names starting with 'b') stay zero
    if (info.name[0] == 'W')
      for (float& w : t) w = static_cast<float>(rng.normal() * scale);
    host.push_back(std::move(t));
  }
  return host;
}

std::int64_t offset_of(int t) {
  std::int64_t offset = 0;
  for (int i = 0; i < t; ++i) {
    offset += kParams[i].count;
    offset = (offset + kFlatAlignment - 1) / kFlatAlignment * kFlatAlignment;  // round up
  }
  return offset;
}

std::int64_t flat_count() { return offset_of(kParamTensors); }

float* Params::flat() {
  if (layout() != Layout::Flat) throw mgpu::Error("Params::flat: these parameters are stored tensor by tensor");
  return storage[0].data();
}

const float* Params::flat() const { return const_cast<Params*>(this)->flat(); }

void Params::zero() {
  for (auto& buffer : storage) buffer.zero();  // one memset for Flat, eight for PerTensor
}

HostParams Params::download() const {
  HostParams host;
  const Device& d = storage.at(0).device();
  for (int i = 0; i < kParamTensors; ++i) {
    host.emplace_back(kParams[i].count);
    mgpu::copy_bytes_to_host(d, host[i].data(), tensors[i], host[i].size() * sizeof(float));
  }
  return host;
}

Params zero_params(const Device& d, Layout layout) {
  Params p;
  if (layout == Layout::Flat) {
    p.storage.emplace_back(d, flat_count());
    for (int i = 0; i < kParamTensors; ++i) p.tensors[i] = p.storage[0].data() + offset_of(i);
  } else {
    for (int i = 0; i < kParamTensors; ++i) {
      p.storage.emplace_back(d, kParams[i].count);
      p.tensors[i] = p.storage[i].data();
    }
  }
  p.zero();
  return p;
}

void Params::upload(const HostParams& host) {
  if (host.size() != kParamTensors) throw mgpu::Error("upload_params: expected 8 tensors");
  for (int i = 0; i < kParamTensors; ++i) {
    if (std::int64_t(host[i].size()) != kParams[i].count)
      throw mgpu::Error(std::string("upload_params: ") + kParams[i].name + " has " +
                        std::to_string(host[i].size()) + " elements, expected " + std::to_string(kParams[i].count));
    mgpu::copy_bytes_to_device(storage.at(0).device(), tensors[i], host[i].data(), host[i].size() * sizeof(float));
  }
}

Params upload_params(const Device& d, const HostParams& host, Layout layout) {
  Params p = zero_params(d, layout);
  p.upload(host);
  return p;
}

Workspace::Workspace(const Device& d, int B)
    : capacity(B),
      col1(d, std::size_t(9) * B * 26 * 26), h1(d, std::size_t(20) * B * 26 * 26), p1(d, std::size_t(20) * B * 13 * 13),
      col2(d, std::size_t(500) * B * 9 * 9), h2(d, std::size_t(50) * B * 9 * 9), p2(d, std::size_t(50) * B * 4 * 4),
      f(d, std::size_t(800) * B), h3(d, std::size_t(128) * B), z4(d, std::size_t(10) * B),
      dz4(d, std::size_t(10) * B), dh3(d, std::size_t(128) * B), df(d, std::size_t(800) * B),
      dp2(d, std::size_t(50) * B * 4 * 4), dh2(d, std::size_t(50) * B * 9 * 9), dcol2(d, std::size_t(500) * B * 9 * 9),
      dp1(d, std::size_t(20) * B * 13 * 13), dh1(d, std::size_t(20) * B * 26 * 26),
      loss(d, B), correct(d, B), ones(d, std::size_t(B) * 26 * 26) {
  mgpu::fill(d, ones.data(), ones.size(), 1.0f);
}

void forward(const Device& d, Params& p, Workspace& ws, const float* x, int n) {
  const ImageShape in{1, n, 28, 28}, c1{20, n, 26, 26}, s1{20, n, 13, 13}, c2{50, n, 9, 9}, s2{50, n, 4, 4};
  conv2d_forward(d, x, in, p.W1(), p.b1(), 20, 3, Activation::Relu, ws.col1.data(), ws.h1.data());
  avgpool2_forward(d, ws.h1.data(), c1, ws.p1.data());
  conv2d_forward(d, ws.p1.data(), s1, p.W2(), p.b2(), 50, 5, Activation::Relu, ws.col2.data(), ws.h2.data());
  avgpool2_forward(d, ws.h2.data(), c2, ws.p2.data());
  flatten(d, ws.p2.data(), s2, ws.f.data());
  dense_forward(d, ws.f.data(), 800, n, p.W3(), p.b3(), 128, Activation::Relu, ws.h3.data());
  dense_forward(d, ws.h3.data(), 128, n, p.W4(), p.b4(), 10, Activation::None, ws.z4.data());
}

void loss(const Device& d, Workspace& ws, const std::int32_t* labels, int n, bool with_gradient) {
  softmax_cross_entropy(d, ws.z4.data(), labels, 10, n, ws.loss.data(), ws.correct.data(),
                        with_gradient ? ws.dz4.data() : nullptr);
}

void layer_backward(const Device& d, int l, Params& p, Params& g, const LayerTensors& t, int n,
                    const BeforeGemm& before_gemm) {
  // BEGIN EXERCISE ex01.network_backward
  auto about_to_read = [&](float* gradient, std::int64_t count) {
    if (before_gemm) before_gemm(gradient, count);
  };
  // The forward pass in reverse. dense3's ReLU backward is a kernel of its own (relu_backward);
  // the convolutions' ride along with avgpool2_backward, given the ReLU's output.
  const ImageShape in{1, n, 28, 28}, c1{20, n, 26, 26}, s1{20, n, 13, 13}, c2{50, n, 9, 9}, s2{50, n, 4, 4};
  switch (l) {
    case 3:  // dz4 [10][n] -> dh3 [128][n]
      about_to_read(t.dy, std::int64_t(10) * n);
      dense_backward(d, t.dy, t.in, 128, n, p.W4(), 10, t.ones, g.W4(), g.b4(), t.dx);
      break;
    case 2:  // dh3 -> dz3 (through the ReLU) -> df [800][n]
      relu_backward(d, t.relu_out, t.dy, std::int64_t(128) * n);
      about_to_read(t.dy, std::int64_t(128) * n);
      dense_backward(d, t.dy, t.in, 800, n, p.W3(), 128, t.ones, g.W3(), g.b3(), t.dx);
      break;
    case 1:  // df -> dp2 [50][n][4][4] -> dz2 [50][n][9][9] -> dp1 [20][n][13][13]
      unflatten(d, t.dy, s2, t.dpool);
      avgpool2_backward(d, t.dpool, c2, t.dconv, /*relu_output=*/t.relu_out);
      about_to_read(t.dconv, c2.size());
      conv2d_backward(d, t.dconv, s1, p.W2(), 50, 5, t.col, t.ones, g.W2(), g.b2(), t.dcol, t.dx);
      break;
    case 0:  // dp1 -> dz1 [20][n][26][26]; the images need no gradient: dW1 and db1 only
      avgpool2_backward(d, t.dy, c1, t.dconv, /*relu_output=*/t.relu_out);
      about_to_read(t.dconv, c1.size());
      conv2d_backward(d, t.dconv, in, p.W1(), 20, 3, t.col, t.ones, g.W1(), g.b1(), nullptr, nullptr);
      break;
    default:
      throw mgpu::Error("layer_backward: LeNet has layers 0 to 3, not " + std::to_string(l));
  }
  // END EXERCISE ex01.network_backward
}

void backward(const Device& d, Params& p, Params& g, Workspace& ws, int n, const GradientReady& ready,
              const BeforeGemm& before_gemm) {
  // BEGIN EXERCISE ex01.network_backward
  // Each layer's tensors in the workspace: its input's gradient is the next layer's dy.
  LayerTensors t[kLayers];
  t[3].in = ws.h3.data(), t[3].dy = ws.dz4.data(), t[3].dx = ws.dh3.data();
  t[2].in = ws.f.data(), t[2].relu_out = ws.h3.data(), t[2].dy = ws.dh3.data(), t[2].dx = ws.df.data();
  t[1].col = ws.col2.data(), t[1].relu_out = ws.h2.data(), t[1].dy = ws.df.data(), t[1].dx = ws.dp1.data();
  t[1].dpool = ws.dp2.data(), t[1].dconv = ws.dh2.data(), t[1].dcol = ws.dcol2.data();
  t[0].col = ws.col1.data(), t[0].relu_out = ws.h1.data(), t[0].dy = ws.dp1.data(), t[0].dconv = ws.dh1.data();
  for (int l = kLayers - 1; l >= 0; --l) {
    t[l].ones = ws.ones.data();
    layer_backward(d, l, p, g, t[l], n, before_gemm);
    if (ready) ready(l);  // layer l's dW and db are whole
  }
  // END EXERCISE ex01.network_backward
}

void accumulate_metrics(const Device& d, const Workspace& ws, int n, mgpu::Metrics& m) {
  mgpu::accumulate_metrics(d, ws.loss.data(), ws.correct.data(), n, m);
}

Lanes::Lanes(const Device& d, int lanes, int capacity) {
  if (lanes < 1 || capacity < 1) throw mgpu::Error("Lanes: need lanes >= 1 and capacity >= 1");
  for (int l = 0; l < lanes; ++l) {
    workspaces.emplace_back(d, capacity);
    metrics.emplace_back(d);
    if (l > 0) grads.push_back(zero_params(d, Layout::Flat));
  }
}

Lanes make_lanes(const Device& d, int batch_size) {
  const int capacity = chunk_images(batch_size);
  const int chunks = (batch_size + capacity - 1) / capacity;
  return Lanes(d, std::min(mgpu::lanes_per_device(d), chunks), capacity);
}

namespace {

// g's tensors of layer l (2l and 2l + 1) += those of lane_g (Flat): one kernel when g is Flat
// too (the two tensors and the padding between them are neighbours), else one per tensor.
void add_layer(const Device& d, Params& g, const Params& lane_g, int layer) {
  if (g.layout() == Layout::Flat) {
    const std::int64_t begin = offset_of(2 * layer), end = offset_of(2 * layer + 2);
    mgpu::add_into(d, g.flat() + begin, lane_g.flat() + begin, end - begin);
  } else {
    for (int i = 2 * layer; i <= 2 * layer + 1; ++i) mgpu::add_into(d, g.tensors[i], lane_g.tensors[i], kParams[i].count);
  }
}

// Calls f(lane, start, size) for every chunk [start, start + size) of n examples: chunk c goes
// to lane c % lanes.count(), and the lanes run at once (see for_each_lane).
template <class F>
void for_each_chunk(const Device& d, Lanes& lanes, int n, F f) {
  const int capacity = lanes.capacity(), count = lanes.count();
  const int chunks = (n + capacity - 1) / capacity;
  mgpu::for_each_lane(d, count, [&](int lane) {
    for (int c = lane; c < chunks; c += count) f(lane, c * capacity, std::min(capacity, n - c * capacity));
  });
}

}  // namespace

void accumulate_gradients(const Device& d, Params& p, Params& g, Lanes& lanes, const float* x,
                          const std::int32_t* y, int n, mgpu::Metrics& m, const GradientReady& ready) {
  for (Params& lane_g : lanes.grads) lane_g.zero();
  for (mgpu::Metrics& lm : lanes.metrics) lm.reset();
  // With one lane, the chunk that ends the batch is the last to add into g, so each layer is
  // complete as soon as that chunk's backward pass has passed it: ready() is called from there.
  const bool one_lane = lanes.count() == 1;
  bool told = false;
  // The loss is a sum over examples, so the gradient of a batch is the sum of its chunks' gradients.
  for_each_chunk(d, lanes, n, [&](int lane, int start, int size) {
    Workspace& ws = lanes.workspaces[lane];
    forward(d, p, ws, x + std::int64_t(start) * kImagePixels, size);
    loss(d, ws, y + start, size, /*with_gradient=*/true);
    accumulate_metrics(d, ws, size, lanes.metrics[lane]);
    const bool last_chunk = one_lane && start + size == n;
    backward(d, p, lane == 0 ? g : lanes.grads[lane - 1], ws, size, last_chunk ? ready : GradientReady{});
    if (last_chunk && ready) told = true;  // one lane: only this thread writes it
  });
  // Sum the lanes, a small allreduce between the cores of one device, layer by layer from the
  // last, so that each layer can be announced as soon as it is complete.
  for (int layer = kLayers - 1; layer >= 0; --layer) {
    for (const Params& lane_g : lanes.grads) add_layer(d, g, lane_g, layer);
    if (ready && !told) ready(layer);
  }
  for (const mgpu::Metrics& lm : lanes.metrics) mgpu::add_metrics(d, m, lm);
}

void sgd(const Device& d, Params& p, const Params& g, float lr, int batch_size) {
  if (p.layout() == Layout::Flat && g.layout() == Layout::Flat) {  // one kernel for everything
    mgpu::sgd_update(d, p.flat(), g.flat(), flat_count(), lr / batch_size);
    return;
  }
  for (int i = 0; i < kParamTensors; ++i)
    mgpu::sgd_update(d, p.tensors[i], g.tensors[i], kParams[i].count, lr / batch_size);
}

double evaluate_accuracy(const Device& d, Params& p, Lanes& lanes, const mgpu::DeviceImages& data) {
  for (mgpu::Metrics& lm : lanes.metrics) lm.reset();
  for_each_chunk(d, lanes, data.count, [&](int lane, int start, int size) {
    Workspace& ws = lanes.workspaces[lane];
    forward(d, p, ws, data.pixels.data() + std::int64_t(start) * kImagePixels, size);
    loss(d, ws, data.labels.data() + start, size, /*with_gradient=*/false);
    accumulate_metrics(d, ws, size, lanes.metrics[lane]);
  });
  double hits = 0;
  for (const mgpu::Metrics& lm : lanes.metrics) hits += lm.read()[1];
  return hits / data.count;
}

int chunk_images(int batch_size) {
  // A GPU wants the whole batch at once: more parallel work per launch. A CPU lane wants
  // chunks small enough that conv2's unfolded input (500 x 81 floats, 162 KB per image) stays
  // in its core's cache between im2col and the GEMMs that read it. Measured on a 2-core AMD
  // EPYC with 2 lanes (chapter README): 8 images per chunk beat 2, 4, 16, 32 and 64.
  constexpr int kCpuChunk = 8;
  return mgpu::kGpuMapping ? batch_size : std::min(batch_size, kCpuChunk);
}

}  // namespace lenet
