// d2l 13.5.4-13.5.6 in C++: data-parallel training of chapter 01's LeNet on k devices,
// with every byte that moves between devices in plain sight.
//
//   get_params   the host parameters copied to a device, gradients zeroed
//   Allreduce    d2l's allreduce: sum every device's gradients on device 0, copy the sum back
//   DeviceData   the training set and the epoch's order, resident on every device
//   split_batch  a batch cut into k shards (remainder-aware), each gathered by its device
//   train_batch  forward + backward on every device, allreduce, the same SGD step everywhere
//   train        d2l's train(num_gpus, batch_size, lr)
#pragma once
#include <memory>
#include <vector>

#include "../01_lenet/lenet.h"
#include "common/cli.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/report.h"

namespace dp {

using mgpu::Device;
using mgpu::DeviceSet;

// d2l's get_params(params, device): a full copy of the host parameters on device d, tensor by
// tensor or in one flat allocation (`layout`, chapter 03).
lenet::Params get_params(const lenet::HostParams& params, const Device& d,
                         lenet::Layout layout = lenet::Layout::PerTensor);

// Everything one device holds while training: its copy of the model and its gradients, its
// shard of the current batch, the scratch its forward and backward passes need, its running
// loss/accuracy, and its slice of the test set. `layout` says how the parameters and gradients
// are stored: tensor by tensor (this chapter) or in one flat bucket (chapter 03).
struct Replica {
  Replica(const Device& d, const lenet::HostParams& params, int shard_capacity,
          lenet::Layout layout = lenet::Layout::PerTensor);
  const Device* device;
  lenet::Params params, grads;
  lenet::Batch shard;  // [n_i][28][28] images and [n_i] labels: this device's part of the batch
  lenet::Lanes lanes;
  lenet::Metrics metrics;
};

// What train_batch needs from a collective: afterwards, every replica's gradients hold the sum
// over all replicas. This chapter's Allreduce is one; chapter 03's ring and chapter 04's NCCL
// are others, and the same train_batch runs with any of them.
class GradientAllreduce {
 public:
  virtual ~GradientAllreduce() = default;
  virtual void run(std::vector<Replica>& replicas) = 0;
  // How the replicas must store their gradients for run() to work on them.
  virtual lenet::Layout layout() const = 0;
  // run() leaves result_scale() times the sum in every replica: 1 for a sum, 1/k for an average
  // (chapter 04's ncclAvg). train_batch's SGD step divides it back out.
  virtual float result_scale() const { return 1.0f; }
};

// Every replica's flat gradient bucket (lenet::flat_count() = 129,216 floats each): what a collective that sums
// everything in one call is given. Throws if the replicas store their gradients PerTensor.
std::vector<float*> flat_gradients(std::vector<Replica>& replicas);

// d2l's allreduce: device 0 pulls every other device's gradient (cudaMemcpyPeerAsync into a
// staging buffer), adds it to its own, then every device pulls the sum back. Ordered with
// events, never by waiting on the host: each device's stream waits for exactly the work it
// depends on.
class Allreduce : public GradientAllreduce {
 public:
  // For gradients stored PerTensor, run(replicas) makes one allreduce per tensor (d2l's way);
  // for Flat ones, a single allreduce of the whole flat bucket. The staging buffer holds the
  // largest single allreduce: max_elements, or by default what `layout` needs.
  explicit Allreduce(const DeviceSet& devices, lenet::Layout layout = lenet::Layout::PerTensor,
                     std::size_t max_elements = 0);
  ~Allreduce() override;  // waits for the devices: queued copies may still use the staging buffer
  Allreduce(const Allreduce&) = delete;
  Allreduce& operator=(const Allreduce&) = delete;
  // data[i] (n elements) lives on devices[i]; afterwards every data[i] holds the sum.
  void run(const std::vector<float*>& data, mgpu::Elements n);
  void run(std::vector<Replica>& replicas) override;
  lenet::Layout layout() const override { return layout_; }

 private:
  const DeviceSet& devices_;
  lenet::Layout layout_;
  mgpu::Buffer<float> staging_;                     // on device 0: one incoming gradient
  std::vector<std::unique_ptr<mgpu::Event>> done_;  // per device: "its part is finished"
};

// Shard sizes for a batch of n examples on k devices: n / k each, and one more for the first
// n % k devices (257 on 2 devices: 129 + 128). n < k is an error: a device would get nothing.
std::vector<int> shard_sizes(int n, int k);

// Before the first step: refuses (naming the numbers and what to change) a training set whose
// batches, the short last one of each epoch included, would leave a device without an example.
void check_batches_fit(int train_examples, int batch_size, int k);

// The training set on one device, uploaded once, and the epoch's order of its examples, uploaded
// once per epoch. d2l's loop hands every batch from the host (its DataLoader) to the devices;
// with the whole set on every device (188 MB of images: little beside a GPU's memory) no step
// moves an image across the host link, and a step needs nothing from the host but kernel
// launches. (The host's copy of the batch was a round trip per step, with a wait per device.)
struct DeviceData {
  DeviceData(const Device& d, const mgpu::LabeledImages& set);
  lenet::DeviceImages images;        // [count][28][28] pixels, [count] labels
  mgpu::Buffer<std::int32_t> order;  // [count]: the epoch's permutation (ShuffledBatches::order)
};
// One DeviceData per device, all with the whole of `set` (its order: 0, 1, 2, ... until set).
std::vector<DeviceData> put_on_every_device(const DeviceSet& devices, const mgpu::LabeledImages& set);

// d2l's split_batch(X, y, devices): the batch is the n examples order[first .. first + n) of
// the epoch's order; shard i (the next shard_sizes(n, k)[i] of them) is gathered by device i,
// from its own copy of the data, into replicas[i].shard. Returns the shard sizes.
std::vector<int> split_batch(std::vector<DeviceData>& data, int first, int n, std::vector<Replica>& replicas);

// Where one step's time goes, in seconds, summed over the steps measured.
struct StepTimes {
  double split = 0, compute = 0, allreduce = 0, update = 0;
  // Device i's own forward and backward pass inside the compute phase: when its stream began
  // and ended that work, in seconds from the phase's start. Devices that compute at the same
  // time have spans that overlap; devices that take turns have spans that follow each other.
  std::vector<double> compute_began, compute_ended;  // [k]
  int steps = 0;
};

// d2l's train_batch: split the batch, run forward and backward on every device (each on its
// own stream, so their work overlaps: on GPUs, and on the cpu backend's devices, which are
// streams with cores of their own), allreduce the gradients, and let every device take the
// same SGD step, dividing by the full batch size n. With `times`, the devices are synchronized
// after each phase and the phases timed: use it only to measure.
// The batch is order[first .. first + n) of every device's data (see split_batch).
void train_batch(std::vector<DeviceData>& data, int first, int n, std::vector<Replica>& replicas,
                 GradientAllreduce& allreduce, float lr, StepTimes* times = nullptr);

// d2l's train(num_gpus, batch_size, lr) on `devices`, summing gradients with `allreduce` (made
// for the same devices): returns the final parameters of device 0.
lenet::HostParams train(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        GradientAllreduce& allreduce, mgpu::TrainingLog& log);

// Times `steps` training steps phase by phase (from init_params(o.seed), on fresh replicas).
StepTimes profile_steps(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        GradientAllreduce& allreduce, int steps);

}  // namespace dp
