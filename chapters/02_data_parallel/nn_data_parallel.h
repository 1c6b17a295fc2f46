// PyTorch's nn.DataParallel in C++, beside this chapter's DDP-style trainer (data_parallel.h),
// to show why DistributedDataParallel replaced it. One process drives k devices, and device 0
// does everything that is not per example. One step:
//
//   1. broadcast  device 0's master parameters copied to every other device (one flat copy each)
//   2. scatter    the batch gathered on device 0 only; device i copies its shard from there
//   3. forward    every device on its shard, to the logits [10][n_i]
//   4. gather     the logits copied to device 0, which computes the loss and dlogits of all
//   5. scatter    each shard's dlogits copied back; backward on every device
//   6. reduce     the gradients summed on device 0, which alone takes the SGD step
//
// DDP (dp::train_batch) moves only gradients, and every device updates its own copy. Here every
// step also moves the parameters, the images, the logits and dlogits, all of it through device
// 0, and the other devices wait while device 0 computes the loss and the update.
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "data_parallel.h"

namespace dp {

// Bytes one step moves between devices, as the trainer counts them where it copies. With
// F = lenet::flat_count() = 129,216 floats (the 129,068 parameters and the Flat layout's
// padding), a step of n examples on k devices, device 0's shard n_0 = shard_sizes(n, k)[0]:
//   4 * ( (k-1) F               parameters broadcast
//       + (n - n_0) * 28 * 28   images scattered (labels stay on device 0: the loss is there)
//       + (n - n_0) * 10        logits gathered
//       + (n - n_0) * 10        dlogits scattered
//       + (k-1) F )             gradients reduced
// DDP's allreduce moves 2(k-1) * 129,068 floats, and nothing else.
//
// Bytes device 0 allocates beyond what a DDP replica holds (its parameters, gradients, shard and
// scratch), for batches of up to B examples, n_0 = shard_sizes(B, k)[0]:
//   4 * ( (B - n_0) * (28 * 28 + 1)   the rest of the batch: images and int32 labels
//       + 2 * 10 * B                   logits and dlogits of every shard
//       + 2 * B                        per-example loss and correctness
//       + B + 2                        a vector of ones and the epoch's two sums (the metrics)
//       + (k > 1 ? F : 0) )            the staging buffer each gradient is copied into
// (This chapter's Allreduce keeps a staging buffer on device 0 too: its largest tensor,
// 102,400 floats. Chapter 03's ring keeps none there.)
class DataParallel {
 public:
  // The master parameters `init` on devices[0]; room for batches of up to `batch_size`.
  DataParallel(const DeviceSet& devices, const lenet::HostParams& init, int batch_size);
  ~DataParallel();  // waits for the devices: queued copies may still use the buffers
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // One step on the examples order[first .. first + n) of `data`, which lives on devices[0].
  void step(mgpu::DeviceData& data, int first, int n, float lr);

  lenet::Params& master() { return workers_[0].params; }  // on devices[0]
  std::size_t step_bytes() const { return step_bytes_; }  // moved between devices by the last step
  std::size_t device0_extra_bytes() const { return device0_extra_bytes_; }
  void reset_metrics() { sums_.zero(); }
  std::array<double, 2> read_metrics() const;  // [loss sum, correct count] since the reset; synchronizes

 private:
  // What device i holds. Its shard is cut into chunks of lenet::chunk_images() (the whole shard
  // on a GPU, 8 images on a CPU, spread over its cores' lanes), and each chunk keeps its
  // activations in a Workspace of its own from forward until its dlogits come back. (A DDP
  // replica on a CPU runs forward and backward chunk by chunk and keeps one chunk's per lane.)
  struct Worker {
    const Device* device;
    lenet::Params params, grads;           // [F] each (Flat); device 0's params are the master copy
    mgpu::Buffer<float> x;                 // [n_i][28][28] its shard (devices i > 0; device 0 reads the front of batch_.x)
    std::vector<lenet::Workspace> chunks;  // z4 [10][m] logits and dz4 [10][m] dlogits of each chunk
    std::vector<lenet::Params> lane_grads; // [F] per extra lane (cpu: lanes 1 ..)
    int lanes = 1;
    std::unique_ptr<mgpu::Event> ready;    // marks this device's latest hand-off
  };
  // Copies n floats; adds their bytes to step_bytes_ when they cross between devices.
  void copy(const Device& to, float* dst, const Device& from, const float* src, std::size_t n);

  std::vector<Worker> workers_;
  int capacity_, chunk_;          // the largest batch; images per chunk
  mgpu::Batch batch_;            // on device 0: [B][28][28] images, [B] labels
  mgpu::Buffer<float> logits_;    // on device 0: [10][m] per chunk, in batch order: 10 B floats
  mgpu::Buffer<float> dlogits_;   // on device 0: the same layout
  mgpu::Buffer<float> loss_, correct_, ones_;  // on device 0: [B] each
  mgpu::Buffer<float> sums_;      // on device 0: [2] the epoch's loss sum and correct count
  mgpu::Buffer<float> staging_;   // on device 0: [F] one incoming gradient (k > 1)
  std::size_t step_bytes_ = 0, device0_extra_bytes_ = 0;
};

// What a DataParallel training run reports besides its log.
struct DataParallelRun {
  lenet::HostParams params;              // device 0's final master parameters
  std::size_t bytes_per_full_step = 0;   // counted on a step of a whole batch
  double mean_bytes_per_step = 0;        // over every step (an epoch's last batch may be short)
  std::size_t device0_extra_bytes = 0;
};

// d2l's train loop with the DataParallel step. The training set and the test set live on
// device 0 only, and the test accuracy is computed there (with the master parameters).
DataParallelRun train_dataparallel(const DeviceSet& devices, const mgpu::FashionMnist& data,
                                   const mgpu::Options& o, mgpu::TrainingLog& log);

}  // namespace dp
