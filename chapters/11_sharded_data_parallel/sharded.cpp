#include "sharded.h"

#include <cmath>

#include "../02_data_parallel/data_parallel.h"  // split_batch: chapter 02's way to cut a batch
#include "common/batches.h"
#include "common/check.h"
#include "common/vector_ops.h"  // add_into

namespace zero {

ShardLayout::ShardLayout(std::int64_t n_, int k_) : n(n_), k(k_) {
  if (n < 1 || k < 1) throw mgpu::Error("ShardLayout: needs n >= 1 and k >= 1");
  shard = (n + k - 1) / k;  // rounded up: the last shard ends in padding
  padded = shard * k;
}

namespace {

// The optimizer state's length on a device: every element in stage 0, its shard in stage 1.
std::size_t state_elements(const ShardLayout& layout, int stage) {
  return static_cast<std::size_t>(stage == 0 ? layout.padded : layout.shard);
}

// A lenet::Params over one zeroed flat buffer of `padded` floats: the eight tensors at their
// chapter 03 offsets, the padding after the last one.
lenet::Params padded_params(const Device& d, std::int64_t padded) {
  lenet::Params p;
  p.storage.emplace_back(d, static_cast<std::size_t>(padded));
  p.storage[0].zero();
  for (int t = 0; t < lenet::kParamTensors; ++t) p.tensors[t] = p.storage[0].data() + lenet::offset_of(t);
  return p;
}

mgpu::Buffer<float> zeroed(const Device& d, std::size_t n) {
  mgpu::Buffer<float> b(d, n);
  b.zero();
  return b;
}

}  // namespace

std::string optimizer_name(OptimizerKind o) { return o == OptimizerKind::AdamW ? "adamw" : "sgd"; }

StateBytes state_bytes(const ShardLayout& layout, int stage, OptimizerKind optimizer) {
  const std::size_t f = sizeof(float), all = static_cast<std::size_t>(layout.padded);
  const std::size_t per_element = optimizer == OptimizerKind::AdamW ? 2 : 1;  // m and v, or the momentum buffer
  return StateBytes{all * f, all * f, per_element * state_elements(layout, stage) * f};
}

std::size_t bytes_sent_per_step(const ShardLayout& layout) {
  return 2 * static_cast<std::size_t>(layout.k - 1) * static_cast<std::size_t>(layout.shard) * sizeof(float);
}

ShardedReplica::ShardedReplica(const Device& d, const ShardLayout& layout, const Settings& s,
                               const lenet::HostParams& init, int shard_capacity)
    : device(&d),
      held_before(mgpu::device_memory(d).held),
      params(padded_params(d, layout.padded)),
      grads(padded_params(d, layout.padded)),
      m(zeroed(d, state_elements(layout, s.stage))),
      v(s.optimizer == OptimizerKind::AdamW ? zeroed(d, state_elements(layout, s.stage)) : mgpu::Buffer<float>()),
      model_state_bytes(mgpu::device_memory(d).held - held_before),
      batch(d, shard_capacity),
      lanes(lenet::make_lanes(d, shard_capacity)),
      metrics(d) {
  params.upload(init);
}

ShardCollectives::ShardCollectives(const DeviceSet& devices, const ShardLayout& layout)
    : devices_(devices), layout_(layout), sent_(devices.size(), 0) {
  if (layout.k != devices.size()) throw mgpu::Error("ShardCollectives: the layout is cut for another device count");
  if (devices.size() > 1)
    for (int i = 0; i < devices.size(); ++i) incoming_.emplace_back(devices[i], static_cast<std::size_t>(layout.shard));
}

void ShardCollectives::check(const std::vector<float*>& data) const {
  if (static_cast<int>(data.size()) != devices_.size())
    throw mgpu::Error("ShardCollectives: " + std::to_string(data.size()) + " buffers for " +
                      std::to_string(devices_.size()) + " devices");
}

void ShardCollectives::reduce_scatter(const std::vector<float*>& data) {
  check(data);
  const int k = devices_.size();
  if (k == 1) return;
  devices_.synchronize();  // every device's gradient is complete before any device reads it
  const mgpu::Elements shard{static_cast<std::size_t>(layout_.shard)};
  // Device i adds the other devices' copies of shard i into its own, in the order i+1, i+2, ...
  // (mod k). Each copy and its add are queued on device i's stream, so the next copy into the
  // staging buffer waits for the add before it. Every element is summed in one fixed order,
  // whatever the stage: stages 0 and 1 agree bit for bit.
  for (int step = 1; step < k; ++step)
    for (int i = 0; i < k; ++i) {
      const int from = (i + step) % k;
      mgpu::copy_peer(devices_[i], incoming_[i].data(), devices_[from], data[from] + layout_.begin(i), shard);
      mgpu::add_into(devices_[i], data[i] + layout_.begin(i), incoming_[i].data(), layout_.shard);
      sent_[from] += shard.count * sizeof(float);
    }
  devices_.synchronize();
}

void ShardCollectives::all_gather(const std::vector<float*>& data) {
  check(data);
  const int k = devices_.size();
  if (k == 1) return;
  devices_.synchronize();  // every device's shard is final before any device copies it
  const mgpu::Elements shard{static_cast<std::size_t>(layout_.shard)};
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j)
      if (j != i) {
        mgpu::copy_peer(devices_[i], data[i] + layout_.begin(j), devices_[j], data[j] + layout_.begin(j), shard);
        sent_[j] += shard.count * sizeof(float);
      }
  devices_.synchronize();
}

ShardedTrainer::ShardedTrainer(const DeviceSet& devices, const Settings& s, const lenet::HostParams& init,
                               int batch_capacity)
    : devices_(devices),
      settings_(s),
      layout_(lenet::flat_count(), devices.size()),
      collectives_(devices, layout_) {
  if (s.stage < 0 || s.stage > 1) throw mgpu::Error("ShardedTrainer: stage " + std::to_string(s.stage) + " (0 or 1)");
  const int largest_part = mgpu::shard_sizes(batch_capacity, devices.size())[0];
  for (int i = 0; i < devices.size(); ++i) replicas_.emplace_back(devices[i], layout_, s, init, largest_part);
  for (ShardedReplica& r : replicas_) {  // once replicas_ is whole: its elements no longer move
    grads_.push_back(r.grads.flat());
    params_.push_back(r.params.flat());
    replica_devices_.push_back(r.device);
    batches_.push_back(&r.batch);
  }
}

void ShardedTrainer::update(ShardedReplica& r, std::int64_t begin, std::int64_t count, float lr, float grad_scale) {
  float* p = r.params.flat() + begin;
  const float* g = r.grads.flat() + begin;
  if (settings_.optimizer == OptimizerKind::AdamW) {
    mgpu::AdamWSettings a = settings_.adamw;
    a.lr = lr;
    mgpu::adamw_update(*r.device, p, g, r.m.data(), r.v.data(), count, a, steps_, grad_scale);
  } else {
    mgpu::SgdMomentumSettings m = settings_.sgd;
    m.lr = lr;
    mgpu::sgd_momentum_update(*r.device, p, g, r.m.data(), count, m, steps_ == 1, grad_scale);
  }
}

void ShardedTrainer::step(std::vector<mgpu::DeviceData>& data, int first, int n, float lr) {
  const int k = devices_.size();
  ++steps_;
  // 1. Every device: forward and backward on its part of the batch (chapter 02's split).
  const std::vector<int> sizes = dp::split_batch(data, first, n, replica_devices_, batches_);
  for (int i = 0; i < k; ++i) {
    ShardedReplica& r = replicas_[i];
    r.grads.zero();
    lenet::accumulate_gradients(*r.device, r.params, r.grads, r.lanes, r.batch.x.data(), r.batch.y.data(), sizes[i],
                                r.metrics);
  }
  // 2. Reduce-scatter: device i now holds shard i of the gradient summed over the devices.
  collectives_.reduce_scatter(grads_);
  // 3. The gradient of the batch's mean loss is the sum / n; clipping scales it once more. Its
  //    squared norm is the sum of the shards' (each device knows its own shard's).
  float grad_scale = 1.0f / n;
  if (settings_.clip_norm > 0) {
    double squares = 0;
    for (int i = 0; i < k; ++i)
      squares += mgpu::sum_of_squares(devices_[i], grads_[i] + layout_.begin(i), layout_.shard);
    grad_scale *= mgpu::clip_coefficient(std::sqrt(squares) / n, settings_.clip_norm);
  }
  if (settings_.stage == 0) {
    // 4a. DDP: the all-gather completes the allreduce; every device steps every parameter.
    collectives_.all_gather(grads_);
    for (ShardedReplica& r : replicas_) update(r, 0, layout_.padded, lr, grad_scale);
  } else {
    // 4b. ZeRO-1: device i steps shard i only, with its shard of the state; the all-gather
    //     hands every device the updated parameters.
    for (int i = 0; i < k; ++i) update(replicas_[i], layout_.begin(i), layout_.shard, lr, grad_scale);
    collectives_.all_gather(params_);
  }
}

TrainResult train(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o, const Settings& s,
                  mgpu::TrainingLog& log) {
  const int k = devices.size();
  mgpu::check_batches_fit(data.train.count, o.batch_size, k);
  TrainResult result;
  result.trainer = std::make_unique<ShardedTrainer>(devices, s, lenet::init_params(o.seed),
                                                    mgpu::largest_batch(o.batch_size, data.train.count));
  ShardedTrainer& trainer = *result.trainer;
  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);
  const mgpu::DeviceImages test(devices[0], data.test);  // evaluated on device 0: every device has every parameter

  mgpu::EpochLoop loop;  // common/train_loop.h: this chapter's parts of d2l's train_ch13
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    for (ShardedReplica& r : trainer.replicas()) r.metrics.reset();
    for (mgpu::DeviceData& dd : train_data) dd.order.upload(order);
  };
  loop.step = [&](const mgpu::BatchOf& b) { trainer.step(train_data, b.first, b.size, b.lr); };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.devices = devices.all();  // the progress line counts their finished batches
  loop.train_metrics = [&] {
    mgpu::LossAndHits sum;
    for (const ShardedReplica& r : trainer.replicas()) {
      const auto m = r.metrics.read();
      sum.loss_sum += m[0], sum.hits += m[1];
    }
    return sum;
  };
  loop.test_accuracy = [&] {
    ShardedReplica& r0 = trainer.replicas()[0];
    return lenet::evaluate_accuracy(devices[0], r0.params, r0.lanes, test);
  };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, &log);
  result.params = trainer.replicas()[0].params.download();
  return result;
}

}  // namespace zero
