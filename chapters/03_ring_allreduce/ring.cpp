#include "ring.h"

#include <algorithm>
#include <string>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/vector_ops.h"

namespace ring {

void add_collectives(mgpu::CollectiveMenu& menu, const DeviceSet& devices) {
  menu.add("ring", [&devices](std::size_t max_elements) { return std::make_unique<RingAllreduce>(devices, max_elements); });
}

RingAllreduce::RingAllreduce(const DeviceSet& devices, std::size_t max_elements)
    : devices_(devices), max_elements_(max_elements) {
  const std::size_t largest_chunk = mgpu::chunk_of(Elements{max_elements_}, devices.size(), 0).count;
  for (int i = 0; i < devices.size(); ++i) {
    staging_.emplace_back(devices[i], largest_chunk);
    step_done_.push_back(std::make_unique<mgpu::Event>(devices[i]));  // marks devices[i]'s steps only
  }
}

RingAllreduce::~RingAllreduce() {
  // Copies into the staging buffers may still be queued: wait for them before they are freed.
  try {
    devices_.synchronize();
  } catch (...) {  // a destructor must not throw; the error was (or will be) reported elsewhere
  }
}

void RingAllreduce::receive_and_add(int to, float* dst, int from, const float* src, Elements n) {
  probe_->device_began(to);
  // BEGIN EXERCISE ex03.reduce_scatter
  mgpu::copy_peer(devices_[to], staging_[to].data(), devices_[from], src, n);
  mgpu::add_into(devices_[to], dst, staging_[to].data(), static_cast<std::int64_t>(n.count));
  // END EXERCISE ex03.reduce_scatter
  probe_->device_ended(to);
}

void RingAllreduce::receive(int to, float* dst, int from, const float* src, Elements n) {
  probe_->device_began(to);
  // BEGIN EXERCISE ex03.all_gather
  mgpu::copy_peer(devices_[to], dst, devices_[from], src, n);
  // END EXERCISE ex03.all_gather
  probe_->device_ended(to);
}

bool RingAllreduce::check(const std::vector<float*>& data, Elements n) const {
  if (static_cast<int>(data.size()) != devices_.size())
    throw mgpu::Error("RingAllreduce: one buffer per device expected");
  if (n.count > max_elements_)
    throw mgpu::Error("RingAllreduce: " + std::to_string(n.count) + " elements exceed the " +
                      std::to_string(max_elements_) + " it was made for");
  return devices_.size() > 1 && n.count > 0;  // one device already holds the sum
}

void RingAllreduce::run(const std::vector<float*>& data, Elements n, mgpu::StepProbe& probe) {
  probe_ = &probe;
  try {
    reduce_scatter(data, n);
    all_gather(data, n);
  } catch (...) {
    probe_ = &mgpu::no_probe();
    throw;
  }
  probe_ = &mgpu::no_probe();
}

namespace {

// Stamps a device's stream where the ring says its part of a step begins and where it ends.
class StepStamps : public mgpu::StepProbe {
 public:
  struct Mark {
    int device;
    mgpu::Timestamp began, ended;
  };
  explicit StepStamps(const DeviceSet& devices) : devices_(devices) {}
  void device_began(int device) override { marks.push_back({device, {}, {}}), marks.back().began.record(devices_[device]); }
  void device_ended(int device) override { marks.back().ended.record(devices_[device]); }
  std::vector<Mark> marks;  // in the order the ring queued them

 private:
  const DeviceSet& devices_;
};

}  // namespace

void RingAllreduce::reduce_scatter(const std::vector<float*>& data, Elements n) {
  if (!check(data, n)) return;
  // BEGIN EXERCISE ex03.reduce_scatter
  const int k = devices_.size();
  // One rule orders everything: in every step the receiver waits for its sender's previous
  // step (step_done_), and for nothing else. It also keeps a sender from changing a chunk its
  // own receiver may still be reading from an earlier step: device i's step waits for device
  // i - 1's previous step, which waited for device i - 2's, and so on, k - 1 links back round
  // the ring to device i + 1 (README, "Step 2: the ring").
  for (int i = 0; i < k; ++i) step_done_[i]->record(devices_[i]);  // "my gradient is computed"
  // In step s device i receives chunk (i - 1 - s) mod k from device i - 1 and adds it to its own:
  // after k - 1 steps the chunk that arrives last, (i + 1) mod k, holds every device's share.
  for (int s = 0; s < k - 1; ++s) {
    for (int i = 0; i < k; ++i) {
      const int from = (i + k - 1) % k;
      const mgpu::Chunk c = mgpu::chunk_of(n, k, ((from - s) % k + k) % k);
      step_done_[from]->make_wait(devices_[i]);
      receive_and_add(i, data[i] + c.begin, from, data[from] + c.begin, Elements{c.count});
    }
    for (int i = 0; i < k; ++i) step_done_[i]->record(devices_[i]);  // this step is done
  }
  // Device i's buffer is read by device i + 1 in the last step: nothing queued on device i
  // after this (the all-gather, or the next step's zeroing of the gradients) may start before.
  for (int i = 0; i < k; ++i) step_done_[(i + 1) % k]->make_wait(devices_[i]);
  // END EXERCISE ex03.reduce_scatter
}

void RingAllreduce::all_gather(const std::vector<float*>& data, Elements n) {
  if (!check(data, n)) return;
  // BEGIN EXERCISE ex03.all_gather
  const int k = devices_.size();
  // The reduce-scatter's one rule, with stores instead of adds: each receiver waits for its
  // sender's previous step, and at the end no device goes on before its successor has read it.
  for (int i = 0; i < k; ++i) step_done_[i]->record(devices_[i]);  // "my complete chunk is ready"
  // In step s device i receives the complete chunk (i - s) mod k from device i - 1: in step 0
  // the one device i - 1 completed, then each step the one it received in the step before.
  for (int s = 0; s < k - 1; ++s) {
    for (int i = 0; i < k; ++i) {
      const int from = (i + k - 1) % k;
      const mgpu::Chunk c = mgpu::chunk_of(n, k, ((from + 1 - s) % k + k) % k);
      step_done_[from]->make_wait(devices_[i]);
      receive(i, data[i] + c.begin, from, data[from] + c.begin, Elements{c.count});
    }
    for (int i = 0; i < k; ++i) step_done_[i]->record(devices_[i]);  // this step is done
  }
  for (int i = 0; i < k; ++i) step_done_[(i + 1) % k]->make_wait(devices_[i]);
  // END EXERCISE ex03.all_gather
}

std::vector<RingAllreduce::StepSpan> RingAllreduce::timeline(const std::vector<float*>& data, Elements n) {
  devices_.synchronize();  // start from idle devices
  StepStamps stamps(devices_);
  run(data, n, stamps);
  // The marks came step by step and, within a step, device 0 first (ring.h asks the halves for
  // that order).
  const int k = devices_.size();
  std::vector<StepSpan> spans;
  double first = 0;
  for (std::size_t m = 0; m < stamps.marks.size(); ++m) {
    const StepStamps::Mark& mark = stamps.marks[m];
    spans.push_back({static_cast<int>(m) / k, mark.device, mark.began.seconds(), mark.ended.seconds()});
    first = spans.size() == 1 ? spans.back().began : std::min(first, spans.back().began);
  }
  for (StepSpan& s : spans) s.began -= first, s.ended -= first;
  return spans;
}

}  // namespace ring
