// d2l 13.5, exercise 3, answered the way NCCL and Horovod answer it: a ring allreduce.
//
// k devices stand in a ring, device i sends to device i+1 (mod k). Each device's buffer of n
// elements is cut into k chunks (mgpu::chunk_of). Then:
//
//   reduce-scatter, k-1 steps: in each step every device sends one chunk to device i+1, which
//     adds it into its own copy of that chunk. Afterwards device i holds the complete sum of
//     chunk (i + 1) mod k.
//   all-gather, k-1 steps: in each step every device sends one complete chunk to device i+1,
//     which stores it. Afterwards every device holds every complete chunk.
//
// Each device sends and receives 2(k-1) chunks of n/k elements: 2(k-1)/k * n in all, whatever
// k is, and every link of the ring is busy at once. Chapter 02's allreduce sends 2(k-1) whole
// buffers through device 0 alone.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "common/collective.h"
#include "common/device.h"
#include "common/probe.h"

namespace ring {

using mgpu::Device;
using mgpu::DeviceSet;
using mgpu::Elements;

class RingAllreduce : public mgpu::Collective {
 public:
  // max_elements: the largest buffer run() will be given (each device keeps a staging buffer
  // for one incoming chunk of it).
  RingAllreduce(const DeviceSet& devices, std::size_t max_elements);
  ~RingAllreduce() override;  // waits for the devices: queued copies may still use the staging buffers
  std::string name() const override { return "ring"; }
  // data[i] (n elements) lives on devices[i]; afterwards every data[i] holds the sum. Only
  // queues work on the devices' streams: no host synchronization inside the ring.
  // run = reduce_scatter, then all_gather.
  void run(const std::vector<float*>& data, Elements n) override { run(data, n, mgpu::no_probe()); }
  // The same, telling `probe` (common/probe.h) where each device's part of each step is queued
  // (device_began before it, device_ended after it): timeline() passes one that stamps the
  // devices' streams there. The ring itself measures nothing.
  void run(const std::vector<float*>& data, Elements n, mgpu::StepProbe& probe);
  // The two halves, each a collective of its own (NCCL has both: ncclReduceScatter and
  // ncclAllGather). Chunks are mgpu::chunk_of(n, k, c).
  //   reduce_scatter: afterwards device i's chunk (i + 1) mod k holds that chunk's sum over
  //                   all devices; its other chunks hold partial sums.
  //   all_gather:     device i's chunk (i + 1) mod k is copied to every other device.
  // Each only queues work: a device's part of a step is a receive on its own stream (below),
  // ordered after its sender's work by the step_done_ events. Each half queues its receives
  // step by step and, within a step, device 0 first: timeline() reads its marks in that order.
  void reduce_scatter(const std::vector<float*>& data, Elements n);
  void all_gather(const std::vector<float*>& data, Elements n);
  // One run(data, n) as the devices ran it: when each device's stream began and ended its part
  // of each step (the copy in, and the add in the reduce-scatter), in seconds from the earliest
  // begin, from timestamps queued on the streams. Where the spans of one step overlap, the
  // devices' copies proceeded at the same time.
  struct StepSpan {
    int step, device;  // step 0..2(k-1)-1: the first k-1 reduce-scatter, the rest all-gather
    double began, ended;
  };
  std::vector<StepSpan> timeline(const std::vector<float*>& data, Elements n);

 private:
  // Refuses a wrong buffer count or size; false when there is nothing to do (k = 1 or n = 0).
  bool check(const std::vector<float*>& data, Elements n) const;
  // Queued on `to`'s stream: to's chunk += from's chunk (through to's staging buffer), or
  // to's chunk = from's chunk. Each tells the run's probe where it begins and ends.
  void receive_and_add(int to, float* dst, int from, const float* src, Elements n);
  void receive(int to, float* dst, int from, const float* src, Elements n);
  const DeviceSet& devices_;
  std::size_t max_elements_;
  std::vector<mgpu::Buffer<float>> staging_;              // per device: one incoming chunk
  std::vector<std::unique_ptr<mgpu::Event>> step_done_;  // per device: "my last step is done"
  mgpu::StepProbe* probe_ = &mgpu::no_probe();           // the probe of the run under way
};

// Adds this chapter's collective to a program's menu (common/collective.h): "ring", a
// RingAllreduce on `devices` (which must outlive what the menu makes).
void add_collectives(mgpu::CollectiveMenu& menu, const DeviceSet& devices);

}  // namespace ring
