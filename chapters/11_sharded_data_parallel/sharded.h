// Chapter 11: sharded data parallelism, ZeRO's first stage, on chapter 01's LeNet over k devices
// of one process (as chapters 02-04).
//
// Data parallelism as chapters 02-05 teach it (DDP, "stage 0") keeps the whole model state on
// every device: parameters, gradients and the optimizer's state, 16 bytes a parameter with
// AdamW in fp32 (4 + 4 + 8), whatever k is. ZeRO (Rajbhandari et al., SC 2020) notices that
// the optimizer's step is element-wise (common/optimizer.h): each device can update 1/k of the
// parameters with 1/k of the state, if it has the summed gradient for that 1/k. Chapter 03's
// ring allreduce is two halves, and the halves are exactly what that needs:
//
//   stage 0 (DDP)  reduce-scatter + all-gather of the gradients (an allreduce); every device
//                  takes the whole step with the whole optimizer state
//   stage 1        reduce-scatter the gradients: device i ends with the sum of shard i; it
//                  updates shard i of the parameters with its shard of the state; all-gather
//                  the parameters: every device has every updated shard again
//
// Both send 2(k-1)/k of the model per device per step; stage 1 holds 4 + 4 + 8/k bytes a
// parameter instead of 16. With the same reduce-scatter and all-gather, the two stages add the
// same numbers in the same order: their parameters are equal bit for bit.
//
// The shards: the flat bucket of chapter 03 (lenet::flat_count() floats, tensor after tensor),
// padded at its end to a multiple of k, cut into k equal shards, shard i on device i (PyTorch
// FSDP pads its flat parameter the same way, so that every device's shard has one size).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../01_lenet/lenet.h"  // chapter 01's model and its flat layout
#include "common/cli.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/optimizer.h"  // AdamW, SGD with momentum, clipping: taught in this chapter
#include "common/report.h"
#include "common/train_loop.h"  // LossAndHits

namespace zero {

using mgpu::Device;
using mgpu::DeviceSet;

// How the flat bucket is cut: n floats padded to `padded` (a multiple of k), shard i is
// elements [i * shard, (i + 1) * shard).
struct ShardLayout {
  ShardLayout(std::int64_t n, int k);
  std::int64_t n, padded, shard;
  int k;
  std::int64_t begin(int i) const { return i * shard; }
};

enum class OptimizerKind { AdamW, SgdMomentum };
std::string optimizer_name(OptimizerKind o);  // "adamw", "sgd"

struct Settings {
  int stage = 1;  // 0 (DDP) or 1
  OptimizerKind optimizer = OptimizerKind::AdamW;
  mgpu::AdamWSettings adamw;           // its lr is the run's --lr
  mgpu::SgdMomentumSettings sgd;       // likewise
  float clip_norm = 0;                 // clip the gradient's global norm to this; 0: no clipping
};

// Bytes of model state one device holds, by kind, for the layout's padded bucket: what
// ShardedReplica allocates, and what chapter 11's README's formulas say.
struct StateBytes {
  std::size_t params = 0, grads = 0, optimizer = 0;
  std::size_t total() const { return params + grads + optimizer; }
};
StateBytes state_bytes(const ShardLayout& layout, int stage, OptimizerKind optimizer);

// Bytes each device sends per step: 2(k-1) shards (reduce-scatter + all-gather), both stages.
std::size_t bytes_sent_per_step(const ShardLayout& layout);

// Everything one device holds: its full copy of the parameters and of the gradients (padded
// flat buffers; lenet::Params views into them), the optimizer state for the elements it
// updates (all of them in stage 0, its shard in stage 1), and its part of the batch.
// (Members are made in this order: the model state first, so that the device allocator's count
// of what it took can be read right after.)
struct ShardedReplica {
  ShardedReplica(const Device& d, const ShardLayout& layout, const Settings& s, const lenet::HostParams& init,
                 int shard_capacity);
  const Device* device;
  std::size_t held_before;      // the device's allocated bytes before this replica
  lenet::Params params, grads;  // [padded] each
  mgpu::Buffer<float> m, v;     // AdamW's moments; SGD's momentum buffer is m (v empty): [padded] or [shard]
  std::size_t model_state_bytes;  // what params, grads, m and v took, by the device allocator's count
  mgpu::Batch batch;              // [n_i][28][28] images, [n_i] labels
  lenet::Lanes lanes;
  mgpu::Metrics metrics;
};

// The two halves of an allreduce over one padded flat buffer per device, written directly
// rather than around a ring: each device fetches the k - 1 pieces it needs from the others (a
// peer copy each, through a staging buffer of one shard). Each device receives, and sends,
// 2(k-1) shards per allreduce, as in chapter 03's ring.
//   reduce_scatter: shard i of device i's buffer becomes the sum of shard i over all devices
//                   (its other shards are left as they were)
//   all_gather:     shard j of every device's buffer becomes device j's shard j
// Both leave the devices synchronized (the host waits): this chapter's lesson is where the
// bytes go and what each device must hold, not overlap.
class ShardCollectives {
 public:
  ShardCollectives(const DeviceSet& devices, const ShardLayout& layout);
  void reduce_scatter(const std::vector<float*>& data);
  void all_gather(const std::vector<float*>& data);
  // Bytes device i has sent since it was made: counted copy by copy.
  const std::vector<std::size_t>& bytes_sent() const { return sent_; }

 private:
  void check(const std::vector<float*>& data) const;
  const DeviceSet& devices_;
  ShardLayout layout_;
  std::vector<mgpu::Buffer<float>> incoming_;  // per device: one shard from a peer, [shard]
  std::vector<std::size_t> sent_;              // per device
};

// The trainer: k replicas and one step.
class ShardedTrainer {
 public:
  ShardedTrainer(const DeviceSet& devices, const Settings& s, const lenet::HostParams& init, int batch_capacity);
  // One step on the batch order[first .. first + n) of every device's data, at learning rate lr.
  void step(std::vector<mgpu::DeviceData>& data, int first, int n, float lr);
  std::vector<ShardedReplica>& replicas() { return replicas_; }
  const ShardLayout& layout() const { return layout_; }
  const ShardCollectives& collectives() const { return collectives_; }
  long steps() const { return steps_; }

 private:
  // Replica r's optimizer step over elements [begin, begin + count) of its flat buffers, with
  // its optimizer state from the state's first element on.
  void update(ShardedReplica& r, std::int64_t begin, std::int64_t count, float lr, float grad_scale);
  const DeviceSet& devices_;
  Settings settings_;
  ShardLayout layout_;
  std::vector<ShardedReplica> replicas_;
  ShardCollectives collectives_;
  std::vector<float*> grads_, params_;  // each replica's flat buffers
  std::vector<const Device*> replica_devices_;  // each replica's device, for chapter 02's split_batch
  std::vector<mgpu::Batch*> batches_;           // each replica's part of the batch
  long steps_ = 0;
};

// d2l's train(num_gpus, batch_size, lr) with a sharded step: the trainer as training left it
// (its replicas, its counts of bytes sent) and device 0's final parameters.
struct TrainResult {
  std::unique_ptr<ShardedTrainer> trainer;
  lenet::HostParams params;
};
TrainResult train(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o, const Settings& s,
                  mgpu::TrainingLog& log);

}  // namespace zero
