// A whole run of chapter 08: LeNet trained on Fashion-MNIST through a parameter server, epoch by
// epoch, with what the chapter measures (staleness, traffic, each worker's waiting).
#pragma once
#include <cstdint>
#include <vector>

#include "common/cli.h"
#include "common/fashion_mnist.h"
#include "common/report.h"
#include "parameter_server.h"

namespace ps {

// The devices of a run: the s server shards first (devices 0 .. s-1), then the k workers
// (devices s .. s+k-1). On GPUs these are logical devices, placed round-robin on the GPUs there are.
struct Placement {
  int servers = 1, workers = 2;
  std::vector<int> server_devices() const;
  std::vector<int> worker_devices() const;
  int devices() const { return servers + workers; }
};

struct RunResult {
  lenet::HostParams params;                       // the master parameters at the end
  std::vector<PushRecord> records;                // every push of every shard
  Traffic traffic;                                // bytes through the servers, training only
  std::vector<std::vector<WorkerStats>> workers;  // [epoch][worker]
  int steps_per_epoch = 0;                        // batches per epoch
};

// Trains from lenet::init_params(o.seed), o.epochs epochs of o.batch_size, evaluating the master
// parameters on the test set after each epoch (on worker 0's device: a pull that is no part of the
// traffic). Each epoch's line and record go to `log`.
RunResult train(const DeviceSet& devices, const Placement& placement, const mgpu::FashionMnist& data,
                const mgpu::Options& o, const Settings& settings, mgpu::TrainingLog& log);

// How many pushes of shard 0 (each push is applied by every shard: shard 0's count them once) had
// each staleness, 0 .. the largest seen; epoch 0 means all epochs.
std::vector<std::int64_t> staleness_histogram(const std::vector<PushRecord>& records, int epoch = 0);

}  // namespace ps
