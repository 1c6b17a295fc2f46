#include "data_parallel.h"

#include <algorithm>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/vector_ops.h"  // add_into

namespace dp {

lenet::Params get_params(const lenet::HostParams& params, const Device& d, lenet::Layout layout) {
  // BEGIN EXERCISE ex02.get_params
  return lenet::upload_params(d, params, layout);
  // END EXERCISE ex02.get_params
}

Replica::Replica(const Device& d, const lenet::HostParams& host, int shard_capacity, lenet::Layout layout)
    : device(&d),
      params(get_params(host, d, layout)),
      grads(lenet::zero_params(d, layout)),
      shard(d, shard_capacity),
      lanes(lenet::make_lanes(d, shard_capacity)),
      metrics(d) {}

std::vector<float*> flat_gradients(std::vector<Replica>& replicas) {
  std::vector<float*> data;
  for (Replica& r : replicas) data.push_back(r.grads.flat());
  return data;
}

std::size_t largest_gradient_sum(lenet::Layout layout) {
  if (layout == lenet::Layout::Flat) return static_cast<std::size_t>(lenet::flat_count());
  std::int64_t n = 0;
  for (const lenet::ParamInfo& p : lenet::kParams) n = std::max(n, p.count);
  return static_cast<std::size_t>(n);
}

void allreduce_gradients(std::vector<Replica>& replicas, mgpu::Collective& collective) {
  if (replicas.empty()) return;
  if (replicas[0].grads.layout() == lenet::Layout::Flat) {  // one transfer of everything
    collective.run(flat_gradients(replicas), mgpu::Elements{static_cast<std::size_t>(lenet::flat_count())});
    return;
  }
  for (int t = 0; t < lenet::kParamTensors; ++t) {  // eight transfers, one per tensor
    std::vector<float*> data;
    for (Replica& r : replicas) data.push_back(r.grads.tensors[t]);
    collective.run(data, mgpu::Elements{static_cast<std::size_t>(lenet::kParams[t].count)});
  }
}

Allreduce::Allreduce(const DeviceSet& devices, std::size_t max_elements)
    : devices_(devices), staging_(devices[0], max_elements) {
  // Each event belongs to its device: done_[i] marks work of devices[i] only.
  for (int i = 0; i < devices.size(); ++i) done_.push_back(std::make_unique<mgpu::Event>(devices[i]));
}

Allreduce::~Allreduce() {
  // Copies into staging_ may still be queued: wait for them before the buffer is freed.
  try {
    devices_.synchronize();
  } catch (...) {  // a destructor must not throw; the error was (or will be) reported elsewhere
  }
}

void Allreduce::run(const std::vector<float*>& data, mgpu::Elements n) {
  const int k = devices_.size();
  if (static_cast<int>(data.size()) != k) throw mgpu::Error("Allreduce: one buffer per device expected");
  if (n.count > staging_.size())
    throw mgpu::Error("Allreduce: " + std::to_string(n.count) + " elements exceed the staging buffer's " +
                      std::to_string(staging_.size()));
  if (k == 1) return;  // one device already holds the sum
  // BEGIN EXERCISE ex02.allreduce
  const Device& d0 = devices_[0];

  // 1. Device 0 may read device i's gradient only once device i has finished computing it.
  for (int i = 1; i < k; ++i) {
    done_[i]->record(devices_[i]);
    done_[i]->make_wait(d0);
  }
  // 2. Reduce on device 0: pull each gradient into the staging buffer, add it to device 0's.
  //    Both are queued on device 0's stream, so each add follows its copy, and the next copy
  //    into the same staging buffer follows the add.
  for (int i = 1; i < k; ++i) {
    mgpu::copy_peer(d0, staging_.data(), devices_[i], data[i], n);
    mgpu::add_into(d0, data[0], staging_.data(), static_cast<std::int64_t>(n.count));
  }
  // 3. Broadcast: every device waits for the sum, then pulls it into its own buffer.
  done_[0]->record(d0);
  for (int i = 1; i < k; ++i) {
    done_[0]->make_wait(devices_[i]);
    mgpu::copy_peer(devices_[i], data[i], d0, data[0], n);
  }
  // 4. Device 0 must not overwrite its sum (the next step zeroes it) before all have read it.
  for (int i = 1; i < k; ++i) {
    done_[i]->record(devices_[i]);
    done_[i]->make_wait(d0);
  }
  // END EXERCISE ex02.allreduce
}

void add_collectives(mgpu::CollectiveMenu& menu, const DeviceSet& devices) {
  menu.add("naive", [&devices](std::size_t max_elements) { return std::make_unique<Allreduce>(devices, max_elements); });
}

std::vector<int> split_batch(std::vector<mgpu::DeviceData>& data, int first, int n,
                             const std::vector<const Device*>& devices, const std::vector<mgpu::Batch*>& shards) {
  if (data.size() != devices.size() || shards.size() != devices.size())
    throw mgpu::Error("split_batch: one mgpu::DeviceData and one shard per device expected");
  const std::vector<int> sizes = mgpu::shard_sizes(n, static_cast<int>(devices.size()));
  if (first < 0 || first + n > data[0].images.count)
    throw mgpu::Error("split_batch: examples " + std::to_string(first) + ".." + std::to_string(first + n) +
                      " of the order run past the " + std::to_string(data[0].images.count) + " examples");
  // BEGIN EXERCISE ex02.split_batch
  int start = first;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    // Queued on device i: the next sizes[i] indices of the order pick the examples it copies.
    mgpu::gather(*devices[i], data[i].images, data[i].order.data() + start, sizes[i], *shards[i]);
    start += sizes[i];
  }
  // END EXERCISE ex02.split_batch
  return sizes;
}

std::vector<int> split_batch(std::vector<mgpu::DeviceData>& data, int first, int n, std::vector<Replica>& replicas) {
  std::vector<const Device*> devices;
  std::vector<mgpu::Batch*> shards;
  for (Replica& r : replicas) devices.push_back(r.device), shards.push_back(&r.shard);
  return split_batch(data, first, n, devices, shards);
}

std::vector<Replica> make_replicas(const DeviceSet& devices, const lenet::HostParams& init, int batch_size,
                                   lenet::Layout layout) {
  const int largest_shard = mgpu::shard_sizes(batch_size, devices.size())[0];
  std::vector<Replica> replicas;
  replicas.reserve(devices.size());
  for (int i = 0; i < devices.size(); ++i) replicas.emplace_back(devices[i], init, largest_shard, layout);
  return replicas;
}

mgpu::LossAndHits sum_metrics(const std::vector<Replica>& replicas) {
  mgpu::LossAndHits sum;
  for (const Replica& r : replicas) {
    const auto [loss_sum, hits] = r.metrics.read();
    sum.loss_sum += loss_sum;
    sum.hits += hits;
  }
  return sum;
}

void compute_gradients(Replica& r, int n) {
  r.grads.zero();
  lenet::accumulate_gradients(*r.device, r.params, r.grads, r.lanes, r.shard.x.data(), r.shard.y.data(), n,
                              r.metrics);
}

void sgd_step(std::vector<Replica>& replicas, float lr, int n, const mgpu::Collective& allreduce) {
  // Every device holds the same summed gradient and takes the same step, dividing by the whole
  // batch's size: exactly what one device would do with the whole batch. (An allreduce that
  // averages instead of summing left sum/k: the larger rate makes up for it.)
  for (Replica& r : replicas) lenet::sgd(*r.device, r.params, r.grads, lr / allreduce.result_scale(), n);
}

void train_batch(std::vector<mgpu::DeviceData>& data, int first, int n, std::vector<Replica>& replicas,
                 mgpu::Collective& allreduce, float lr, mgpu::StepProbe& probe) {
  // BEGIN EXERCISE ex02.train_batch
  const std::vector<int> sizes = split_batch(data, first, n, replicas);
  probe.phase_done("split");
  // Each call only queues work on its device's stream and returns, so the devices compute at
  // the same time.
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    probe.device_began(static_cast<int>(i));
    compute_gradients(replicas[i], sizes[i]);
    probe.device_ended(static_cast<int>(i));
  }
  probe.phase_done("compute");
  allreduce_gradients(replicas, allreduce);
  probe.phase_done("allreduce");
  sgd_step(replicas, lr, n, allreduce);
  probe.phase_done("update");
  // END EXERCISE ex02.train_batch
}

}  // namespace dp
