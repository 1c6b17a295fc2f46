#include "data_parallel.h"

#include <algorithm>
#include <chrono>

#include "common/batches.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/timer.h"
#include "common/vector_ops.h"

namespace dp {

constexpr int kPixels = 28 * 28;

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

namespace {

std::size_t largest_tensor() {
  std::int64_t n = 0;
  for (const lenet::ParamInfo& p : lenet::kParams) n = std::max(n, p.count);
  return static_cast<std::size_t>(n);
}

}  // namespace

std::vector<float*> flat_gradients(std::vector<Replica>& replicas) {
  std::vector<float*> data;
  for (Replica& r : replicas) data.push_back(r.grads.flat());
  return data;
}

Allreduce::Allreduce(const DeviceSet& devices, lenet::Layout layout, std::size_t max_elements)
    : devices_(devices),
      layout_(layout),
      staging_(devices[0], max_elements       ? max_elements
                           : layout == lenet::Layout::Flat ? std::size_t(lenet::flat_count())
                                                           : largest_tensor()) {
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

void Allreduce::run(std::vector<Replica>& replicas) {
  if (layout_ == lenet::Layout::Flat) {  // one transfer of everything
    run(flat_gradients(replicas), mgpu::Elements{static_cast<std::size_t>(lenet::flat_count())});
    return;
  }
  for (int t = 0; t < lenet::kParamTensors; ++t) {  // eight transfers, one per tensor
    std::vector<float*> data;
    for (Replica& r : replicas) data.push_back(r.grads.tensors[t]);
    run(data, mgpu::Elements{static_cast<std::size_t>(lenet::kParams[t].count)});
  }
}

std::vector<int> shard_sizes(int n, int k) {
  if (k < 1) throw mgpu::Error("shard_sizes: need at least one device, got " + std::to_string(k));
  if (n < k)
    throw mgpu::Error("a batch of " + std::to_string(n) + " examples cannot be split across " + std::to_string(k) +
                      " devices: every device needs at least one example");
  std::vector<int> sizes(k, n / k);
  for (int i = 0; i < n % k; ++i) ++sizes[i];
  return sizes;
}

void check_batches_fit(int train_examples, int batch_size, int k) {
  const int smallest = train_examples % batch_size ? train_examples % batch_size : batch_size;
  if (train_examples < k)
    throw mgpu::Error("only " + std::to_string(train_examples) + " training images for " + std::to_string(k) +
                      " devices: every device needs at least one example of every batch (raise --limit-train)");
  if (smallest < k)
    throw mgpu::Error(std::to_string(train_examples) + " training images in batches of " + std::to_string(batch_size) +
                      " leave a last batch of " + std::to_string(smallest) + " example(s) in every epoch, fewer than the " +
                      std::to_string(k) + " devices: every device needs at least one example of every batch (change "
                      "--limit-train or --batch-size)");
}

DeviceData::DeviceData(const Device& d, const mgpu::LabeledImages& set) : images(d, set), order(d, set.count) {}

std::vector<DeviceData> put_on_every_device(const DeviceSet& devices, const mgpu::LabeledImages& set) {
  std::vector<int> identity(set.count);
  for (int i = 0; i < set.count; ++i) identity[i] = i;
  std::vector<DeviceData> data;
  data.reserve(devices.size());
  for (int i = 0; i < devices.size(); ++i) {
    data.emplace_back(devices[i], set);
    data.back().order.upload(identity);
  }
  return data;
}

std::vector<int> split_batch(std::vector<DeviceData>& data, int first, int n, std::vector<Replica>& replicas) {
  if (data.size() != replicas.size()) throw mgpu::Error("split_batch: one DeviceData per replica expected");
  const std::vector<int> sizes = shard_sizes(n, static_cast<int>(replicas.size()));
  if (first < 0 || first + n > data[0].images.count)
    throw mgpu::Error("split_batch: examples " + std::to_string(first) + ".." + std::to_string(first + n) +
                      " of the order run past the " + std::to_string(data[0].images.count) + " examples");
  // BEGIN EXERCISE ex02.split_batch
  int start = first;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    // Queued on device i: the next sizes[i] indices of the order pick the examples it copies.
    lenet::gather(*replicas[i].device, data[i].images, data[i].order.data() + start, sizes[i], replicas[i].shard);
    start += sizes[i];
  }
  // END EXERCISE ex02.split_batch
  return sizes;
}

namespace {

// For measuring only: wait for every device, then read the clock.
double synchronized_now(const std::vector<Replica>& replicas) {
  for (const Replica& r : replicas) mgpu::synchronize(*r.device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

std::vector<Replica> make_replicas(const DeviceSet& devices, const lenet::HostParams& init, int batch_size,
                                   lenet::Layout layout) {
  const int largest_shard = shard_sizes(batch_size, devices.size())[0];
  std::vector<Replica> replicas;
  replicas.reserve(devices.size());
  for (int i = 0; i < devices.size(); ++i) replicas.emplace_back(devices[i], init, largest_shard, layout);
  return replicas;
}

}  // namespace

void train_batch(std::vector<DeviceData>& data, int first, int n, std::vector<Replica>& replicas,
                 GradientAllreduce& allreduce, float lr, StepTimes* times) {
  double t = times ? synchronized_now(replicas) : 0;
  auto lap = [&](double StepTimes::*phase) {
    if (!times) return;
    const double now = synchronized_now(replicas);
    times->*phase += now - t;
    t = now;
  };

  // BEGIN EXERCISE ex02.train_batch
  const std::vector<int> sizes = split_batch(data, first, n, replicas);
  lap(&StepTimes::split);
  // Each call only queues work on its device's stream and returns, so the devices compute at
  // the same time. When measuring, each device's stream also notes when it began and ended.
  const std::size_t k = replicas.size();
  std::vector<mgpu::Timestamp> began(times ? k : 0), ended(times ? k : 0);
  for (std::size_t i = 0; i < k; ++i) {
    Replica& r = replicas[i];
    if (times) began[i].record(*r.device);
    r.grads.zero();
    lenet::accumulate_gradients(*r.device, r.params, r.grads, r.lanes, r.shard.x.data(), r.shard.y.data(), sizes[i],
                                r.metrics);
    if (times) ended[i].record(*r.device);
  }
  const double compute_start = t;
  lap(&StepTimes::compute);
  if (times) {
    times->compute_began.resize(k, 0.0);
    times->compute_ended.resize(k, 0.0);
    for (std::size_t i = 0; i < k; ++i) {
      times->compute_began[i] += began[i].seconds() - compute_start;
      times->compute_ended[i] += ended[i].seconds() - compute_start;
    }
  }
  allreduce.run(replicas);
  lap(&StepTimes::allreduce);
  // Every device now holds the same summed gradient and takes the same step, dividing by the
  // whole batch's size: exactly what one device would do with the whole batch. (An allreduce
  // that averages instead of summing left sum/k: the larger rate makes up for it.)
  for (Replica& r : replicas) lenet::sgd(*r.device, r.params, r.grads, lr / allreduce.result_scale(), n);
  lap(&StepTimes::update);
  // END EXERCISE ex02.train_batch
  if (times) ++times->steps;
}

lenet::HostParams train(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        GradientAllreduce& allreduce, mgpu::TrainingLog& log) {
  const int k = devices.size();
  check_batches_fit(data.train.count, o.batch_size, k);  // now, not when the epoch's last batch comes
  std::vector<Replica> replicas =
      make_replicas(devices, lenet::init_params(o.seed), mgpu::largest_batch(o.batch_size, data.train.count),
                    allreduce.layout());

  // The test set: a slice per device (d2l's exercise 4), or all of it on device 0 (d2l's way).
  std::vector<lenet::DeviceImages> test_sets;
  const std::vector<int> test_sizes =
      o.eval_all_devices ? shard_sizes(data.test.count, k) : std::vector<int>{data.test.count};
  for (std::size_t i = 0, start = 0; i < test_sizes.size(); start += test_sizes[i], ++i)
    test_sets.emplace_back(devices[i], slice(data.test, static_cast<int>(start), test_sizes[i]));

  std::vector<DeviceData> train_data = put_on_every_device(devices, data.train);  // once per run
  mgpu::ShuffledBatches batches(data.train.count, o.batch_size, o.seed);
  mgpu::SyncTimer timer(devices);

  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    for (Replica& r : replicas) r.metrics.reset();
    timer.start();
    batches.start_epoch(epoch);
    for (DeviceData& dd : train_data) dd.order.upload(batches.order());  // once per epoch
    for (int b = 0; b < batches.count(); ++b) {
      const int n = batches.size(b);
      train_batch(train_data, b * o.batch_size, n, replicas, allreduce,
                  mgpu::learning_rate_at(o, epoch, b, batches.count()));
      log.progress(epoch + 1, b, batches.count());
    }
    const double seconds = timer.stop_seconds();

    double loss_sum = 0, hits = 0, test_hits = 0;
    for (const Replica& r : replicas) {
      const auto [l, h] = r.metrics.read();
      loss_sum += l;
      hits += h;
    }
    for (std::size_t i = 0; i < test_sets.size(); ++i)
      test_hits += lenet::evaluate_accuracy(devices[i], replicas[i].params, replicas[i].lanes, test_sets[i]) *
                   test_sets[i].count;
    mgpu::EpochRecord r;
    r.epoch = epoch + 1;
    r.train_loss = loss_sum / data.train.count;
    r.train_acc = hits / data.train.count;
    r.test_acc = test_hits / data.test.count;
    r.seconds = seconds;
    log.end_epoch(r);
  }
  return replicas[0].params.download();
}

StepTimes profile_steps(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        GradientAllreduce& allreduce, int steps) {
  std::vector<Replica> replicas =
      make_replicas(devices, lenet::init_params(o.seed), mgpu::largest_batch(o.batch_size, data.train.count),
                    allreduce.layout());
  std::vector<DeviceData> train_data = put_on_every_device(devices, data.train);
  mgpu::ShuffledBatches batches(data.train.count, o.batch_size, o.seed);
  batches.start_epoch(0);
  for (DeviceData& dd : train_data) dd.order.upload(batches.order());
  StepTimes times;
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up (first-touch of memory, library setup)
    const int b = s % batches.count(), n = batches.size(b);
    train_batch(train_data, b * o.batch_size, n, replicas, allreduce, o.lr, s == 0 ? nullptr : &times);
  }
  return times;
}

}  // namespace dp
