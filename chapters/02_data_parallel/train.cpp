#include "train.h"

#include "common/batches.h"
#include "common/probe.h"
#include "common/train_loop.h"

namespace dp {

namespace {

constexpr int kPixels = 28 * 28;

// Examples [start, start + count) of a host dataset, as a new dataset.
mgpu::LabeledImages slice(const mgpu::LabeledImages& set, int start, int count) {
  mgpu::LabeledImages s;
  s.count = count;
  s.rows = set.rows;
  s.cols = set.cols;
  s.pixels.assign(set.pixels.begin() + std::size_t(start) * kPixels,
                  set.pixels.begin() + std::size_t(start + count) * kPixels);
  s.labels.assign(set.labels.begin() + start, set.labels.begin() + start + count);
  return s;
}

}  // namespace

lenet::HostParams train(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        mgpu::Collective& allreduce, mgpu::TrainingLog& log, lenet::Layout layout) {
  const int k = devices.size();
  mgpu::check_batches_fit(data.train.count, o.batch_size, k);  // now, not when the epoch's last batch comes
  std::vector<Replica> replicas =
      make_replicas(devices, lenet::init_params(o.seed), mgpu::largest_batch(o.batch_size, data.train.count), layout);

  // The test set: a slice per device (d2l's exercise 4), or all of it on device 0 (d2l's way).
  std::vector<mgpu::DeviceImages> test_sets;
  const std::vector<int> test_sizes =
      o.eval_all_devices ? mgpu::shard_sizes(data.test.count, k) : std::vector<int>{data.test.count};
  for (std::size_t i = 0, start = 0; i < test_sizes.size(); start += test_sizes[i], ++i)
    test_sets.emplace_back(devices[i], slice(data.test, static_cast<int>(start), test_sizes[i]));

  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);  // once per run

  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): this chapter's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    for (Replica& r : replicas) r.metrics.reset();
    for (mgpu::DeviceData& dd : train_data) dd.order.upload(order);  // once per epoch
  };
  loop.step = [&](const mgpu::BatchOf& b) { train_batch(train_data, b.first, b.size, replicas, allreduce, b.lr); };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.devices = devices.all();  // the progress line counts their finished batches
  loop.train_metrics = [&] { return sum_metrics(replicas); };
  loop.test_accuracy = [&] {
    double test_hits = 0;
    for (std::size_t i = 0; i < test_sets.size(); ++i)
      test_hits += lenet::evaluate_accuracy(devices[i], replicas[i].params, replicas[i].lanes, test_sets[i]) *
                   test_sets[i].count;
    return test_hits / data.test.count;
  };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, &log);
  return replicas[0].params.download();
}

StepTimes profile_steps(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        mgpu::Collective& allreduce, int steps, lenet::Layout layout) {
  std::vector<Replica> replicas =
      make_replicas(devices, lenet::init_params(o.seed), mgpu::largest_batch(o.batch_size, data.train.count), layout);
  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);
  mgpu::ShuffledBatches batches(data.train.count, o.batch_size, o.seed);
  batches.start_epoch(0);
  for (mgpu::DeviceData& dd : train_data) dd.order.upload(batches.order());
  // Step 0 warms up (first-touch of memory, library setup), untimed.
  train_batch(train_data, 0, batches.size(0), replicas, allreduce, o.lr);
  std::vector<const Device*> stamped;  // the devices whose compute spans the timer stamps
  for (const Replica& r : replicas) stamped.push_back(r.device);
  mgpu::PhaseTimer timer([&] { devices.synchronize(); }, stamped);
  for (int s = 1; s <= steps; ++s) {
    const int b = s % batches.count(), n = batches.size(b);
    timer.start_step();
    train_batch(train_data, b * o.batch_size, n, replicas, allreduce, o.lr, timer);
  }
  StepTimes times;
  times.steps = steps;
  times.split = timer.seconds("split");
  times.compute = timer.seconds("compute");
  times.allreduce = timer.seconds("allreduce");
  times.update = timer.seconds("update");
  if (const mgpu::PhaseTimer::Phase* compute = timer.phase("compute"))
    times.compute_began = compute->device_began, times.compute_ended = compute->device_ended;
  return times;
}

}  // namespace dp
