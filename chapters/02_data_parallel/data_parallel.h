// d2l 13.5.4-13.5.6 in C++: data-parallel training of chapter 01's LeNet on k devices,
// with every byte that moves between devices in plain sight.
//
//   get_params   the host parameters copied to a device, gradients zeroed
//   Allreduce    d2l's allreduce (a mgpu::Collective): sum every device's gradients on device 0,
//                copy the sum back
//   DeviceData   the training set and the epoch's order, resident on every device (common/)
//   split_batch  a batch cut into k shards (remainder-aware), each gathered by its device
//   train_batch  forward + backward on every device, allreduce, the same SGD step everywhere
//   train        d2l's train(num_gpus, batch_size, lr): train.h
#pragma once
#include <memory>
#include <vector>

#include "../01_lenet/lenet.h"  // chapter 01's model: what every device trains
#include "common/batches.h"      // shard_sizes, check_batches_fit (taught here, kept in common/)
#include "common/cli.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/probe.h"        // StepProbe: what a timed step is told
#include "common/report.h"
#include "common/train_loop.h"   // LossAndHits

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
  mgpu::Batch shard;  // [n_i][28][28] images and [n_i] labels: this device's part of the batch
  lenet::Lanes lanes;
  mgpu::Metrics metrics;
};

// Every replica's flat gradient bucket (lenet::flat_count() = 129,216 floats each): what a collective that sums
// everything in one call is given. Throws if the replicas store their gradients PerTensor.
std::vector<float*> flat_gradients(std::vector<Replica>& replicas);

// The most elements allreduce_gradients() hands a collective at once: the whole bucket (Flat),
// or the largest tensor (PerTensor: W3, 102,400 floats). A collective's staging is sized from it.
std::size_t largest_gradient_sum(lenet::Layout layout);

// Sums every replica's gradients over the devices with `collective` (common/collective.h):
// tensor by tensor, eight calls, for gradients stored PerTensor (d2l's way); the whole flat
// bucket in one call for Flat ones (chapter 03). The collective knows nothing of LeNet: the
// trainer decides what to hand it.
void allreduce_gradients(std::vector<Replica>& replicas, mgpu::Collective& collective);

// d2l's allreduce: device 0 pulls every other device's gradient (cudaMemcpyPeerAsync into a
// staging buffer), adds it to its own, then every device pulls the sum back. Ordered with
// events, never by waiting on the host: each device's stream waits for exactly the work it
// depends on.
class Allreduce : public mgpu::Collective {
 public:
  // max_elements: the largest buffer run() will be given (device 0's staging buffer holds one).
  Allreduce(const DeviceSet& devices, std::size_t max_elements);
  ~Allreduce() override;  // waits for the devices: queued copies may still use the staging buffer
  std::string name() const override { return "naive"; }
  // data[i] (n elements) lives on devices[i]; afterwards every data[i] holds the sum.
  void run(const std::vector<float*>& data, mgpu::Elements n) override;

 private:
  const DeviceSet& devices_;
  mgpu::Buffer<float> staging_;                     // on device 0: one incoming gradient
  std::vector<std::unique_ptr<mgpu::Event>> done_;  // per device: "its part is finished"
};

// Adds this chapter's collective to a program's menu (common/collective.h): "naive", an
// Allreduce on `devices` (which must outlive what the menu makes).
void add_collectives(mgpu::CollectiveMenu& menu, const DeviceSet& devices);

// d2l's split_batch(X, y, devices): the batch is the n examples order[first .. first + n) of
// the epoch's order; shard i (the next mgpu::shard_sizes(n, k)[i] of them) is gathered by device i,
// from its own copy of the data, into replicas[i].shard. Returns the shard sizes.
std::vector<int> split_batch(std::vector<mgpu::DeviceData>& data, int first, int n, std::vector<Replica>& replicas);
// The same for any model's replicas (chapter 09's ResNet calls it): shard i gathered by
// *devices[i] into *shards[i]; one data, device and shard per replica.
std::vector<int> split_batch(std::vector<mgpu::DeviceData>& data, int first, int n,
                             const std::vector<const Device*>& devices, const std::vector<mgpu::Batch*>& shards);

// Forward and backward on replica r's shard of n examples (split_batch put it there): its
// gradients are zeroed, then the shard's gradient is added in. Only queues work on r's device.
void compute_gradients(Replica& r, int n);

// d2l's train_batch: split the batch, run forward and backward on every device (each on its
// own stream, so their work overlaps: on GPUs, and on the cpu backend's devices, which are
// streams with cores of their own), allreduce the gradients, and let every device take the
// same SGD step, dividing by the full batch size n.
// The batch is order[first .. first + n) of every device's data (see split_batch).
// `probe` (common/probe.h) is told where each phase ends ("split", "compute", "allreduce",
// "update") and when each device's compute is queued: training passes none, profile_steps a
// timer, so the step that is timed is this one.
void train_batch(std::vector<mgpu::DeviceData>& data, int first, int n, std::vector<Replica>& replicas,
                 mgpu::Collective& allreduce, float lr, mgpu::StepProbe& probe = mgpu::no_probe());

// The SGD step every device takes after the allreduce: p -= lr * g / n on each replica, with
// the collective's result_scale() divided out (an allreduce that averages left sum / k).
void sgd_step(std::vector<Replica>& replicas, float lr, int n, const mgpu::Collective& allreduce);

// The loss sum and correct answers of every replica since their metrics were reset, added up
// (each read from its device: it waits for it).
mgpu::LossAndHits sum_metrics(const std::vector<Replica>& replicas);

// The replicas train() starts from: init on every device, room for the largest shard of a batch.
std::vector<Replica> make_replicas(const DeviceSet& devices, const lenet::HostParams& init, int batch_size,
                                   lenet::Layout layout);

}  // namespace dp
