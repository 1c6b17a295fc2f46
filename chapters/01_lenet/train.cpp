#include "train.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "common/batches.h"
#include "common/train_loop.h"

namespace lenet {

namespace {

// What train() keeps on the device, and its training step; profile_step() times the same.
struct Trainer {
  Trainer(const mgpu::Device& d, const mgpu::LabeledImages& train, std::uint64_t seed, int batch_size)
      : d(d),
        // One flat, aligned allocation each: one memset zeroes every gradient, one kernel
        // updates every parameter (the layers see eight views either way).
        params(upload_params(d, init_params(seed), Layout::Flat)),
        grads(zero_params(d, Layout::Flat)),
        lanes(make_lanes(d, batch_size)),
        train_set(d, train),  // uploaded once
        batch(d, batch_size),
        metrics(d) {}

  // One SGD step at rate lr on the n examples order[0 .. n) of the training set (order is on
  // the device).
  void step(const std::int32_t* order, int n, float lr) {
    gather(d, train_set, order, n, batch);
    compute_and_update(n, lr);
  }
  // All of a step after the gather: the same buffers and the same kernels for every batch of n
  // examples at rate lr, so it can be recorded once and replayed (CapturedWork).
  void compute_and_update(int n, float lr) {
    grads.zero();
    accumulate_gradients(d, params, grads, lanes, batch.x.data(), batch.y.data(), n, metrics);
    sgd(d, params, grads, lr, n);
  }

  const mgpu::Device& d;
  Params params, grads;
  Lanes lanes;
  const mgpu::DeviceImages train_set;
  mgpu::Batch batch;
  mgpu::Metrics metrics;
};

}  // namespace

HostParams train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                 mgpu::TrainingLog& log, bool capture_step, long* replayed_steps) {
  const mgpu::Device& d = devices[0];
  Trainer t(d, data.train, o.seed, mgpu::largest_batch(o.batch_size, data.train.count));
  const mgpu::DeviceImages test_set(d, data.test);
  mgpu::Buffer<std::int32_t> order(d, t.train_set.count);  // this epoch's permutation, on the device
  // The recorded step (--graph on), made after the first step has run the usual way: that one
  // also pays for one-time set-up (cuBLAS's, loading the kernels), which must not be recorded.
  std::unique_ptr<mgpu::CapturedWork> recorded;
  long steps_done = 0, replays = 0;

  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): this chapter's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& epoch_order) {
    t.metrics.reset();
    order.upload(epoch_order);
  };
  loop.step = [&](const mgpu::BatchOf& b) {
    const std::int32_t* batch_order = order.data() + b.first;
    if (!capture_step || b.size != o.batch_size || b.lr != o.lr || steps_done == 0) {
      t.step(batch_order, b.size, b.lr);
    } else {
      if (!recorded)
        recorded = std::make_unique<mgpu::CapturedWork>(d, [&t, n = b.size, lr = b.lr] { t.compute_and_update(n, lr); });
      gather(d, t.train_set, batch_order, b.size, t.batch);  // which examples: the one thing that changes
      recorded->replay();
      ++replays;
    }
    ++steps_done;
  };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.devices = devices.all();  // the progress line counts their finished batches
  loop.train_metrics = [&] {
    const auto [loss_sum, hits] = t.metrics.read();
    return mgpu::LossAndHits{loss_sum, hits};
  };
  loop.test_accuracy = [&] { return evaluate_accuracy(d, t.params, t.lanes, test_set); };
  mgpu::train_epochs(o, t.train_set.count, o.batch_size, loop, &log);

  if (replayed_steps) *replayed_steps = replays;
  return t.params.download();
}

StepProfile profile_step(const mgpu::Device& d, const mgpu::FashionMnist& data, const mgpu::Options& o) {
  const int n = mgpu::largest_batch(o.batch_size, data.train.count);
  Trainer t(d, data.train, o.seed, n);
  std::vector<int> first(n);
  std::iota(first.begin(), first.end(), 0);  // the batch: examples 0 .. n-1
  mgpu::Buffer<std::int32_t> order(d, n);
  order.upload(first);
  t.step(order.data(), n, o.lr);  // the first step pays one-time costs: not timed
  mgpu::synchronize(d);
  StepProfile result;
  const auto start = std::chrono::steady_clock::now();
  t.step(order.data(), n, o.lr);
  mgpu::synchronize(d);
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  mgpu::KernelProfile profile(d);
  t.step(order.data(), n, o.lr);
  result.kernels = profile.table();
  return result;
}

}  // namespace lenet
