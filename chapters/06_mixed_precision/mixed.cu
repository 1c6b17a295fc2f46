// Mixed precision's kernels, and LeNet's passes with the roundings put where autocast puts them.
#include "mixed.h"

#include <algorithm>

#include "../01_lenet/layers.h"  // chapter 01's layers: this chapter runs them on rounded inputs
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/parallel.h"
#include "common/vector_ops.h"

namespace mixed {
namespace {

using i64 = std::int64_t;
using lenet::ImageShape;
constexpr int kPixels = 28 * 28;

// Items of the kernels below: one element i each.
struct RoundInPlace {
  Precision p;
  float* x;
  MGPU_HD void operator()(i64 i) const { x[i] = round_to(p, x[i]); }
};
struct CopyRounded {
  Precision p;
  const float* src;
  float* dst;
  MGPU_HD void operator()(i64 i) const { dst[i] = round_to(p, src[i]); }
};
struct ScaleAndRound {
  Precision p;
  float* x;
  float scale;
  MGPU_HD void operator()(i64 i) const { x[i] = round_to(p, scale * x[i]); }
};
struct Encode {
  Precision p;
  const float* src;
  std::uint16_t* dst;
  MGPU_HD void operator()(i64 i) const { dst[i] = encode16(p, src[i]); }
};
struct Decode {
  Precision p;
  const std::uint16_t* src;
  float* dst;
  MGPU_HD void operator()(i64 i) const { dst[i] = decode16(p, src[i]); }
};
struct AddEncoded {
  Precision p;
  std::uint16_t* dst;
  const std::uint16_t* src;
  MGPU_HD void operator()(i64 i) const {
    // BEGIN EXERCISE ex06.ring16
    dst[i] = encode16(p, decode16(p, dst[i]) + decode16(p, src[i]));
    // END EXERCISE ex06.ring16
  }
};
struct UnscaleAndCheck {
  float* g;
  float inv_scale;
  float* found_inf;
  MGPU_HD void operator()(i64 i) const {
    // BEGIN EXERCISE ex06.loss_scaler_update
    g[i] *= inv_scale;
    // Every thread that finds one writes the same 1.0f: a race whose outcome does not depend on
    // who wins, so no atomic is needed (PyTorch's found_inf is set the same way).
    if (!is_finite(g[i])) *found_inf = 1.0f;
    // END EXERCISE ex06.loss_scaler_update
  }
};
struct AddSums {  // dst[i] += src[i], over a Metrics' partial sums
  double* dst;
  const double* src;
  MGPU_HD void operator()(i64 i) const { dst[i] += src[i]; }
};

}  // namespace

void round_in_place(const Device& d, Precision p, float* x, i64 n) {
  if (p != Precision::FP32) mgpu::for_each_index(d, n, RoundInPlace{p, x}, 8.0 * n);
}
void copy_rounded(const Device& d, Precision p, const float* src, float* dst, i64 n) {
  mgpu::for_each_index(d, n, CopyRounded{p, src, dst}, 8.0 * n);
}
void scale_and_round(const Device& d, Precision p, float* x, i64 n, float scale) {
  if (p != Precision::FP32 || scale != 1.0f) mgpu::for_each_index(d, n, ScaleAndRound{p, x, scale}, 8.0 * n);
}
void encode(const Device& d, Precision p, const float* src, std::uint16_t* dst, i64 n) {
  mgpu::for_each_index(d, n, Encode{p, src, dst}, 6.0 * n);
}
void decode(const Device& d, Precision p, const std::uint16_t* src, float* dst, i64 n) {
  mgpu::for_each_index(d, n, Decode{p, src, dst}, 6.0 * n);
}
void add_encoded(const Device& d, Precision p, std::uint16_t* dst, const std::uint16_t* src, i64 n) {
  const std::size_t bytes = n > 0 ? std::size_t(n) * sizeof(std::uint16_t) : 0;
  mgpu::check_owned(d, dst, bytes, "add_encoded (destination)");
  mgpu::check_owned(d, src, bytes, "add_encoded (source)");
  mgpu::for_each_index(d, n, AddEncoded{p, dst, src}, 6.0 * n);
}
void unscale_and_check(const Device& d, float* g, i64 n, float inv_scale, float* found_inf) {
  // BEGIN EXERCISE ex06.loss_scaler_update
  mgpu::zero_bytes(d, found_inf, sizeof(float));  // queued before the kernel: "none found" unless it finds one
  // END EXERCISE ex06.loss_scaler_update
  mgpu::for_each_index(d, n, UnscaleAndCheck{g, inv_scale, found_inf}, 8.0 * n);
}

void forward(const Device& d, Precision p, lenet::Params& w, lenet::Workspace& ws, const float* x, int n) {
  using lenet::Activation;
  const ImageShape in{1, n, 28, 28}, c1{20, n, 26, 26}, s1{20, n, 13, 13}, c2{50, n, 9, 9}, s2{50, n, 4, 4};
  // lenet::forward, with the input of each GEMM rounded to p first. x and w already are.
  lenet::conv2d_forward(d, x, in, w.W1(), w.b1(), 20, 3, Activation::Relu, ws.col1.data(), ws.h1.data());
  lenet::avgpool2_forward(d, ws.h1.data(), c1, ws.p1.data());
  round_in_place(d, p, ws.p1.data(), s1.size());  // conv2 reads it (its im2col copies rounded values)
  lenet::conv2d_forward(d, ws.p1.data(), s1, w.W2(), w.b2(), 50, 5, Activation::Relu, ws.col2.data(), ws.h2.data());
  lenet::avgpool2_forward(d, ws.h2.data(), c2, ws.p2.data());
  lenet::flatten(d, ws.p2.data(), s2, ws.f.data());
  round_in_place(d, p, ws.f.data(), std::int64_t(800) * n);  // dense3 reads it
  lenet::dense_forward(d, ws.f.data(), 800, n, w.W3(), w.b3(), 128, Activation::Relu, ws.h3.data());
  round_in_place(d, p, ws.h3.data(), std::int64_t(128) * n);  // dense4 reads it
  lenet::dense_forward(d, ws.h3.data(), 128, n, w.W4(), w.b4(), 10, Activation::None, ws.z4.data());
  // The logits stay fp32: the softmax and the loss are computed in fp32.
}

void backward(const Device& d, Precision p, lenet::Params& w, lenet::Params& g, lenet::Workspace& ws, int n,
              float loss_scale) {
  // lenet::backward, with every activation gradient rounded to p before a GEMM reads it. The
  // first is where loss scaling happens: d(scale * loss)/dz4 = scale * dz4, and the chain rule
  // carries the factor through every layer below, into every parameter gradient. (lenet::backward
  // rounds dz4 again before its GEMM: a value already rounded to p stays as it is.)
  scale_and_round(d, p, ws.dz4.data(), std::int64_t(10) * n, loss_scale);
  lenet::backward(d, w, g, ws, n, /*ready=*/{},
                  [&](float* gradient, std::int64_t count) { round_in_place(d, p, gradient, count); });
}

namespace {

// Calls f(lane, start, size) for every chunk of n examples, chunk c on lane c % lanes (as
// lenet.cu's for_each_chunk: the lanes run at once on a CPU, one after the other on a GPU).
template <class F>
void for_each_chunk(const Device& d, lenet::Lanes& lanes, int n, F f) {
  const int capacity = lanes.capacity(), count = lanes.count();
  const int chunks = (n + capacity - 1) / capacity;
  mgpu::for_each_lane(d, count, [&](int lane) {
    for (int c = lane; c < chunks; c += count) f(lane, c * capacity, std::min(capacity, n - c * capacity));
  });
}

}  // namespace

void accumulate_gradients(const Device& d, Precision p, float loss_scale, lenet::Params& w, lenet::Params& g,
                          lenet::Lanes& lanes, const float* x, const std::int32_t* y, int n, mgpu::Metrics& m) {
  if (g.layout() != lenet::Layout::Flat) throw mgpu::Error("mixed::accumulate_gradients: g must be stored Flat");
  for (lenet::Params& lane_g : lanes.grads) lane_g.zero();
  for (mgpu::Metrics& lm : lanes.metrics) lm.reset();
  for_each_chunk(d, lanes, n, [&](int lane, int start, int size) {
    lenet::Workspace& ws = lanes.workspaces[lane];
    forward(d, p, w, ws, x + std::int64_t(start) * kPixels, size);
    lenet::loss(d, ws, y + start, size, /*with_gradient=*/true);
    lenet::accumulate_metrics(d, ws, size, lanes.metrics[lane]);
    backward(d, p, w, lane == 0 ? g : lanes.grads[lane - 1], ws, size, loss_scale);
  });
  for (const lenet::Params& lane_g : lanes.grads) mgpu::add_into(d, g.flat(), lane_g.flat(), lenet::flat_count());
  for (const mgpu::Metrics& lm : lanes.metrics)
    mgpu::for_each_index(d, 2 * mgpu::Metrics::kSlots, AddSums{m.sums.data(), lm.sums.data()});
}

double evaluate_accuracy(const Device& d, Precision p, lenet::Params& w, lenet::Lanes& lanes,
                         const mgpu::DeviceImages& data) {
  for (mgpu::Metrics& lm : lanes.metrics) lm.reset();
  for_each_chunk(d, lanes, data.count, [&](int lane, int start, int size) {
    lenet::Workspace& ws = lanes.workspaces[lane];
    forward(d, p, w, ws, data.pixels.data() + std::int64_t(start) * kPixels, size);
    lenet::loss(d, ws, data.labels.data() + start, size, /*with_gradient=*/false);
    lenet::accumulate_metrics(d, ws, size, lanes.metrics[lane]);
  });
  double hits = 0;
  for (const mgpu::Metrics& lm : lanes.metrics) hits += lm.read()[1];
  return hits / data.count;
}

}  // namespace mixed
