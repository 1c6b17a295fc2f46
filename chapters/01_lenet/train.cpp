#include "train.h"

#include <chrono>
#include <numeric>

#include "common/batches.h"
#include "common/timer.h"

namespace lenet {

HostParams train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                 mgpu::TrainingLog& log) {
  const mgpu::Device& d = devices[0];
  // One flat, aligned allocation each: one memset zeroes every gradient, one kernel updates
  // every parameter (the layers see eight views either way).
  Params params = upload_params(d, init_params(o.seed), Layout::Flat);
  Params grads = zero_params(d, Layout::Flat);
  Lanes lanes = make_lanes(d, o.batch_size);
  const DeviceImages train_set(d, data.train), test_set(d, data.test);  // uploaded once
  mgpu::ShuffledBatches batches(train_set.count, o.batch_size, o.seed);
  mgpu::Buffer<std::int32_t> order(d, train_set.count);  // this epoch's permutation, on the device
  Batch batch(d, o.batch_size);
  Metrics metrics(d);
  mgpu::SyncTimer timer(devices);

  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    metrics.reset();
    timer.start();
    batches.start_epoch(epoch);
    order.upload(batches.order());
    for (int b = 0; b < batches.count(); ++b) {
      const int n = batches.size(b);
      gather(d, train_set, order.data() + std::int64_t(b) * o.batch_size, n, batch);
      grads.zero();
      accumulate_gradients(d, params, grads, lanes, batch.x.data(), batch.y.data(), n, metrics);
      sgd(d, params, grads, o.lr, n);
      if (b % 16 == 0) log.progress(epoch + 1, b, batches.count());
    }
    const double seconds = timer.stop_seconds();
    const auto [loss_sum, hits] = metrics.read();
    mgpu::EpochRecord r;
    r.epoch = epoch + 1;
    r.train_loss = loss_sum / train_set.count;
    r.train_acc = hits / train_set.count;
    r.test_acc = evaluate_accuracy(d, params, lanes, test_set);
    r.seconds = seconds;
    log.end_epoch(r);
  }
  return params.download();
}

StepProfile profile_step(const mgpu::Device& d, const mgpu::FashionMnist& data, const mgpu::Options& o) {
  Params params = upload_params(d, init_params(o.seed), Layout::Flat);
  Params grads = zero_params(d, Layout::Flat);
  const int n = std::min(o.batch_size, data.train.count);
  Lanes lanes = make_lanes(d, n);
  const DeviceImages train_set(d, data.train);
  std::vector<int> first(n);
  std::iota(first.begin(), first.end(), 0);  // the batch: examples 0 .. n-1
  mgpu::Buffer<std::int32_t> order(d, n);
  order.upload(first);
  Batch batch(d, n);
  Metrics metrics(d);
  // Exactly the step of train() above.
  auto step = [&] {
    gather(d, train_set, order.data(), n, batch);
    grads.zero();
    accumulate_gradients(d, params, grads, lanes, batch.x.data(), batch.y.data(), n, metrics);
    sgd(d, params, grads, o.lr, n);
  };
  step();  // warm-up
  mgpu::synchronize(d);
  StepProfile result;
  const auto start = std::chrono::steady_clock::now();
  step();
  mgpu::synchronize(d);
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  mgpu::KernelProfile profile(d);
  step();
  result.kernels = profile.table();
  return result;
}

}  // namespace lenet
