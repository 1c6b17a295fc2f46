#include "train.h"

#include <algorithm>

#include "common/batches.h"
#include "common/exercise.h"  // the student copy's hole calls mgpu::exercise_not_done
#include "common/train_loop.h"

namespace ps {

std::vector<int> Placement::server_devices() const {
  std::vector<int> d;
  for (int j = 0; j < servers; ++j) d.push_back(j);
  return d;
}

std::vector<int> Placement::worker_devices() const {
  std::vector<int> d;
  for (int i = 0; i < workers; ++i) d.push_back(servers + i);
  return d;
}

RunResult train(const DeviceSet& devices, const Placement& placement, const mgpu::FashionMnist& data,
                const mgpu::Options& o, const Settings& settings, mgpu::TrainingLog& log) {
  if (devices.size() != placement.devices())
    throw mgpu::Error("ps::train: " + std::to_string(placement.devices()) + " devices expected, got " +
                      std::to_string(devices.size()));
  const int k = placement.workers;
  const std::vector<WorkItem> items = epoch_work(data.train.count, o.batch_size, k);  // checks the sizes
  const lenet::HostParams init = lenet::init_params(o.seed);

  // Each worker: a replica (its pulled copy of the model, its gradients, scratch) and the whole
  // training set, as in chapter 02. A worker's piece of a batch is at most the first shard's size.
  std::vector<dp::Replica> replicas;
  std::vector<mgpu::DeviceData> train_data;
  replicas.reserve(k);
  train_data.reserve(k);
  const int largest_piece = mgpu::shard_sizes(mgpu::largest_batch(o.batch_size, data.train.count), k)[0];
  for (int w : placement.worker_devices()) {
    replicas.emplace_back(devices[w], init, largest_piece, lenet::Layout::Flat);
    train_data.emplace_back(devices[w], data.train);
  }
  const mgpu::DeviceImages test_set(*replicas[0].device, data.test);
  // Made after the replicas, so destroyed before them: its threads and queued copies use them.
  ParameterServer server(devices, placement.server_devices(), placement.worker_devices(), init, settings.mode);

  RunResult result;
  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): the server's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    for (mgpu::DeviceData& dd : train_data) dd.order.upload(order);
    for (dp::Replica& r : replicas) r.metrics.reset();
  };
  // The workers walk the epoch's batches themselves, each at its own pace (run_epoch).
  loop.run_epoch = [&](int epoch, const mgpu::ShuffledBatches& batches, const std::function<void(int)>& progress) {
    result.steps_per_epoch = batches.count();
    const auto lr_of = [&](int batch) { return mgpu::learning_rate_at(o, epoch, batch, batches.count()); };
    // The log's progress counts batches: every batch is k items, one per worker.
    int batches_shown = 0;
    const auto show_progress = [&](std::size_t done, std::size_t) {
      const int batches_done = static_cast<int>(done / k);
      if (batches_done > batches_shown) progress(batches_done);
      batches_shown = std::max(batches_shown, batches_done);
    };
    result.workers.push_back(run_epoch(server, train_data, replicas, items, settings, epoch + 1, lr_of, show_progress));
  };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.train_metrics = [&] { return dp::sum_metrics(replicas); };
  loop.test_accuracy = [&] {
    dp::Replica& r0 = replicas[0];
    server.pull(0, r0.params, /*count_bytes=*/false);  // the master parameters, to evaluate
    return lenet::evaluate_accuracy(*r0.device, r0.params, r0.lanes, test_set);
  };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, &log);
  result.params = server.download();
  result.records = server.records();
  result.traffic = server.traffic();
  return result;
}

std::vector<std::int64_t> staleness_histogram(const std::vector<PushRecord>& records, int epoch) {
  std::vector<std::int64_t> counts;
  // BEGIN EXERCISE ex08.staleness
  for (const PushRecord& r : records) {
    // Every shard records each push once: counting shard 0's counts every push once.
    if (r.shard != 0 || (epoch != 0 && r.epoch != epoch)) continue;
    const std::size_t s = static_cast<std::size_t>(std::max<std::int64_t>(0, r.staleness()));
    if (counts.size() <= s) counts.resize(s + 1, 0);
    ++counts[s];
  }
  // END EXERCISE ex08.staleness
  return counts;
}

}  // namespace ps
