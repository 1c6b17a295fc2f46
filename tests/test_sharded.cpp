// Chapter 11 (chapters/11_sharded_data_parallel/sharded.h): the shard layout, the two halves of
// the allreduce, the bytes each device holds (by the device allocator's count) and sends (copy by
// copy), each against its formula, and training: ZeRO-1 takes DDP's steps bit for bit, and k
// devices train as one does (to the order of float additions).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "chapters/11_sharded_data_parallel/sharded.h"
#include "common/batches.h"
#include "common/check.h"
#include "common/device.h"
#include "common/random.h"
#include "helpers.h"  // testing::random_set, check_same_training

namespace {

using zero::OptimizerKind;

// A settings object for a stage and optimizer (AdamW's and SGD's defaults but the rate).
zero::Settings settings(int stage, OptimizerKind optimizer, float clip = 0) {
  zero::Settings s;
  s.stage = stage;
  s.optimizer = optimizer;
  s.adamw.lr = 1e-3;
  s.sgd.lr = 0.3;  // LeNet's first steps are small: enough for every tensor to move in 20
  s.clip_norm = clip;
  return s;
}

// `steps` training steps of batch 32 on k devices from init_params(7), on made-up images; the
// parameters of every device afterwards, and the trainer's count of bytes sent.
struct Trained {
  std::vector<lenet::HostParams> params;  // [k]
  std::vector<std::size_t> sent;          // [k]
  std::vector<std::size_t> state_bytes;   // [k], the allocator's count
};
Trained train(int k, const zero::Settings& s, int steps) {
  mgpu::Rng rng(11);
  const mgpu::LabeledImages set = testing::random_set(128, rng);
  mgpu::DeviceSet devices(k);
  zero::ShardedTrainer trainer(devices, s, lenet::init_params(7), 32);
  std::vector<mgpu::DeviceData> data = mgpu::put_on_every_device(devices, set);
  mgpu::ShuffledBatches batches(set.count, 32, 5);
  batches.start_epoch(0);
  for (mgpu::DeviceData& dd : data) dd.order.upload(batches.order());
  for (int i = 0; i < steps; ++i) 
    trainer.step(data, (i % batches.count()) * 32, 32, float(s.optimizer == OptimizerKind::AdamW ? s.adamw.lr : s.sgd.lr));
  Trained t;
  for (zero::ShardedReplica& r : trainer.replicas()) {
    t.params.push_back(r.params.download());
    t.state_bytes.push_back(r.model_state_bytes);
  }
  t.sent = trainer.collectives().bytes_sent();
  return t;
}

}  // namespace

TEST_CASE("ShardLayout: k equal shards, the last one padded") {
  const zero::ShardLayout a(10, 4);
  CHECK(a.shard == 3);
  CHECK(a.padded == 12);
  CHECK(a.begin(3) == 9);
  const zero::ShardLayout b(lenet::flat_count(), 5);  // 129,216 floats: not a multiple of 5
  CHECK(b.shard == 25844);
  CHECK(b.padded == 129220);
  for (int k : {1, 2, 4, 8}) CHECK(zero::ShardLayout(lenet::flat_count(), k).padded == lenet::flat_count());
  CHECK_THROWS_AS(zero::ShardLayout(0, 2), mgpu::Error);
  CHECK_THROWS_AS(zero::ShardLayout(10, 0), mgpu::Error);
}

TEST_CASE("The formulas: 16 bytes a parameter for DDP with AdamW, 8 + 8/k for ZeRO-1; 12 and 8 + 4/k with SGD") {
  const zero::ShardLayout l(1000, 4);  // 250 floats a shard
  CHECK(zero::state_bytes(l, 0, OptimizerKind::AdamW).total() == 16 * 1000);
  CHECK(zero::state_bytes(l, 1, OptimizerKind::AdamW).total() == 8 * 1000 + 8 * 250);
  CHECK(zero::state_bytes(l, 0, OptimizerKind::SgdMomentum).total() == 12 * 1000);
  CHECK(zero::state_bytes(l, 1, OptimizerKind::SgdMomentum).total() == 8 * 1000 + 4 * 250);
  CHECK(zero::bytes_sent_per_step(l) == 2 * 3 * 250 * 4);  // 2(k-1)/k of the model, in bytes
}

TEST_CASE("reduce_scatter leaves device i the sum of shard i; all_gather hands every shard to every device") {
  for (int k : {2, 3, 4}) {
    CAPTURE(k);
    mgpu::DeviceSet devices(k);
    const zero::ShardLayout layout(10, k);
    std::vector<mgpu::Buffer<float>> bufs;
    std::vector<float*> data;
    for (int i = 0; i < k; ++i) {
      std::vector<float> host(layout.padded);
      for (std::int64_t j = 0; j < layout.padded; ++j) host[j] = float(100 * i + j);  // device i, element j
      bufs.push_back(testing::on_device(devices[i], host));
      data.push_back(bufs.back().data());
    }
    zero::ShardCollectives c(devices, layout);
    c.reduce_scatter(data);
    for (int i = 0; i < k; ++i) {
      const std::vector<float> got = bufs[i].download();
      for (std::int64_t j = 0; j < layout.padded; ++j) {
        const bool mine = j >= layout.begin(i) && j < layout.begin(i) + layout.shard;
        // The sum over devices of 100 d + j is 100 k(k-1)/2 + k j; other shards stay as they were.
        const float want = mine ? float(100 * k * (k - 1) / 2 + k * j) : float(100 * i + j);
        CHECK(got[j] == want);
      }
    }
    c.all_gather(data);
    for (int i = 0; i < k; ++i) {
      const std::vector<float> got = bufs[i].download();
      for (std::int64_t j = 0; j < layout.padded; ++j) CHECK(got[j] == float(100 * k * (k - 1) / 2 + k * j));
    }
    // Each device sent k - 1 shards in each half.
    for (std::size_t sent : c.bytes_sent()) CHECK(sent == 2 * std::size_t(k - 1) * layout.shard * sizeof(float));
  }
}

TEST_CASE("ZeRO-1 takes DDP's steps bit for bit, AdamW and SGD with momentum, with and without clipping") {
  for (int k : {2, 4}) {
    for (OptimizerKind o : {OptimizerKind::AdamW, OptimizerKind::SgdMomentum}) {
      for (float clip : {0.0f, 0.05f}) {
        CAPTURE(k);
        CAPTURE(zero::optimizer_name(o));
        CAPTURE(clip);
        const Trained ddp = train(k, settings(0, o, clip), 20), zero1 = train(k, settings(1, o, clip), 20);
        for (int i = 0; i < k; ++i) CHECK(zero1.params[i] == ddp.params[i]);  // every device, every float
        CHECK(ddp.params[0] != lenet::init_params(7));  // and they did train
      }
    }
  }
}

TEST_CASE("Clipping changes the steps (the bound is below the gradients' norm), and takes effect on every stage") {
  const Trained free = train(2, settings(1, OptimizerKind::SgdMomentum, 0), 5);
  const Trained clipped = train(2, settings(1, OptimizerKind::SgdMomentum, 0.05f), 5);
  CHECK(free.params[0] != clipped.params[0]);
}

TEST_CASE("k devices train as one device does, to the order of float additions") {
  const lenet::HostParams start = lenet::init_params(7);
  for (OptimizerKind o : {OptimizerKind::AdamW, OptimizerKind::SgdMomentum}) {
    const Trained one = train(1, settings(0, o), 20);
    for (int k : {2, 4}) {
      CAPTURE(k);
      const Trained many = train(k, settings(1, o), 20);
      testing::check_same_training(many.params[0], one.params[0], start, "zero-1, " + zero::optimizer_name(o));
      for (int i = 1; i < k; ++i) CHECK(many.params[i] == many.params[0]);  // the all-gather left every device the same
    }
  }
}

TEST_CASE("Model state on each device, by the allocator's count, equals the formula to the byte") {
  for (int k : {1, 2, 3, 4, 5}) {  // 3 and 5 do not divide 129,216: padded shards
    for (int stage : {0, 1}) {
      for (OptimizerKind o : {OptimizerKind::AdamW, OptimizerKind::SgdMomentum}) {
        CAPTURE(k);
        CAPTURE(stage);
        CAPTURE(zero::optimizer_name(o));
        const Trained t = train(k, settings(stage, o), 1);
        const zero::ShardLayout layout(lenet::flat_count(), k);
        for (std::size_t bytes : t.state_bytes) CHECK(bytes == zero::state_bytes(layout, stage, o).total());
        // And what each device sent in its one step, counted copy by copy.
        for (std::size_t sent : t.sent) CHECK(sent == zero::bytes_sent_per_step(layout));
      }
    }
  }
}

TEST_CASE("ShardedTrainer refuses a stage it does not have") {
  mgpu::DeviceSet devices(2);
  CHECK_THROWS_WITH_AS(zero::ShardedTrainer(devices, settings(2, OptimizerKind::AdamW), lenet::init_params(1), 32),
                       doctest::Contains("stage 2"), mgpu::Error);
}
