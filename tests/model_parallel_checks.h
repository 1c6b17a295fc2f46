// What chapter 07's suite and its hidden cases share: chapter 01's training steps on one device,
// the same steps through a pipeline, the two compared tensor by tensor, and the orders of the
// schedules written out as text.
#pragma once
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../chapters/07_model_parallel/pipeline.h"
#include "helpers.h"

namespace testing {

// "F0 F1 B0 ..." : a stage's ops as text, so that a wrong order prints as one.
inline std::string show(const std::vector<pp::Op>& ops) {
  std::string s;
  for (const pp::Op& op : ops) s += (op.kind == pp::Op::Forward ? "F" : "B") + std::to_string(op.micro) + " ";
  return s;
}

// Chapter 01's training step on one device: `steps` batches of `batch` examples, in order, from
// lenet::init_params(seed, 0.1). `metrics_out`, if given, receives the steps' summed loss and hit count.
inline lenet::HostParams one_device(const mgpu::LabeledImages& set, int batch, int steps, float lr,
                                    std::array<double, 2>* metrics_out = nullptr, std::uint64_t seed = 7) {
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  lenet::Params p = lenet::upload_params(d, lenet::init_params(seed, 0.1f));
  lenet::Params g = lenet::zero_params(d);
  lenet::Lanes lanes = lenet::make_lanes(d, batch);
  mgpu::Metrics metrics(d);
  mgpu::DeviceImages images(d, set);
  for (int s = 0; s < steps; ++s) {
    g.zero();
    lenet::accumulate_gradients(d, p, g, lanes, images.pixels.data() + std::int64_t(s) * batch * 784,
                                images.labels.data() + s * batch, batch, metrics);
    lenet::sgd(d, p, g, lr, batch);
  }
  if (metrics_out) *metrics_out = metrics.read();
  return p.download();
}

// The same steps through a pipeline made with `config`.
inline lenet::HostParams pipelined(const pp::PipelineConfig& config, const mgpu::LabeledImages& set, int batch,
                                   int steps, float lr, std::vector<pp::Span>* timeline = nullptr,
                                   std::uint64_t seed = 7) {
  pp::Pipeline pipeline(config, lenet::init_params(seed, 0.1f), batch);
  pipeline.set_training_data(set);
  std::vector<int> order(set.count);
  for (int i = 0; i < set.count; ++i) order[i] = i;
  pipeline.set_order(order);
  for (int s = 0; s < steps; ++s) pipeline.step(s * batch, batch, lr, timeline);
  return pipeline.download();
}

// Every tensor of `got` equal to `want`'s within float rounding (2e-4 relative: the stages sum
// in another order than one device does).
inline void check_same_params(const lenet::HostParams& got, const lenet::HostParams& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (int t = 0; t < lenet::kParamTensors; ++t)
    check_close(got[t], ref::Tensor(want[t].begin(), want[t].end()), 2e-4, what + " " + lenet::kParams[t].name);
}

inline pp::PipelineConfig pipeline_config(std::vector<int> cuts, pp::Schedule schedule, int m, int replicas = 1) {
  pp::PipelineConfig c;
  c.cuts = std::move(cuts);
  c.schedule = schedule;
  c.micro_batches = m;
  c.replicas = replicas;
  return c;
}

}  // namespace testing
