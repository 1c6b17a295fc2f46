#include "train.h"

#include "common/batches.h"
#include "common/timer.h"

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
  mgpu::ShuffledBatches batches(data.train.count, o.batch_size, o.seed);
  mgpu::SyncTimer timer(devices);

  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    for (Replica& r : replicas) r.metrics.reset();
    timer.start();
    batches.start_epoch(epoch);
    for (mgpu::DeviceData& dd : train_data) dd.order.upload(batches.order());  // once per epoch
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

namespace {

// train_batch's phases (data_parallel.cpp), with every device synchronized and the clock read
// after each, and each device's compute span stamped on its stream. Only for measuring: the
// waits stop the phases from overlapping, as they do in training.
class TimedStep {
 public:
  explicit TimedStep(std::vector<Replica>& replicas) : replicas_(replicas), t_(synchronized_now()) {}

  void run(std::vector<mgpu::DeviceData>& data, int first, int n, mgpu::Collective& allreduce, float lr,
           StepTimes& times) {
    const std::vector<int> sizes = split_batch(data, first, n, replicas_);
    lap(times.split);
    const std::size_t k = replicas_.size();
    std::vector<mgpu::Timestamp> began(k), ended(k);
    for (std::size_t i = 0; i < k; ++i) {
      began[i].record(*replicas_[i].device);
      compute_gradients(replicas_[i], sizes[i]);
      ended[i].record(*replicas_[i].device);
    }
    const double compute_start = t_;
    lap(times.compute);
    times.compute_began.resize(k, 0.0);
    times.compute_ended.resize(k, 0.0);
    for (std::size_t i = 0; i < k; ++i) {
      times.compute_began[i] += began[i].seconds() - compute_start;
      times.compute_ended[i] += ended[i].seconds() - compute_start;
    }
    allreduce_gradients(replicas_, allreduce);
    lap(times.allreduce);
    sgd_step(replicas_, lr, n, allreduce);
    lap(times.update);
    ++times.steps;
  }

 private:
  double synchronized_now() const {
    for (const Replica& r : replicas_) mgpu::synchronize(*r.device);
    return mgpu::steady_seconds();
  }
  void lap(double& phase) {
    const double now = synchronized_now();
    phase += now - t_;
    t_ = now;
  }
  std::vector<Replica>& replicas_;
  double t_;  // when the phase being timed began
};

}  // namespace

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
  StepTimes times;
  TimedStep step(replicas);
  for (int s = 1; s <= steps; ++s) {
    const int b = s % batches.count(), n = batches.size(b);
    step.run(train_data, b * o.batch_size, n, allreduce, o.lr, times);
  }
  return times;
}

}  // namespace dp
