#include "ring.h"

#include <algorithm>
#include <string>

#include "../01_lenet/layers.h"

namespace ring {

Chunk chunk_of(Elements n, int k, int c) {
  const std::size_t base = n.count / k, extra = n.count % k, uc = static_cast<std::size_t>(c);
  return Chunk{uc * base + std::min(uc, extra), base + (uc < extra ? 1 : 0)};
}

RingAllreduce::RingAllreduce(const DeviceSet& devices, std::size_t max_elements)
    : devices_(devices), max_elements_(max_elements ? max_elements : std::size_t(lenet::flat_count())) {
  const std::size_t largest_chunk = chunk_of(Elements{max_elements_}, devices.size(), 0).count;
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
  mgpu::copy_peer(devices_[to], staging_[to].data(), devices_[from], src, n);
  lenet::add_into(devices_[to], dst, staging_[to].data(), static_cast<std::int64_t>(n.count));
}

void RingAllreduce::run(const std::vector<float*>& data, Elements n) {
  const int k = devices_.size();
  if (static_cast<int>(data.size()) != k) throw mgpu::Error("RingAllreduce: one buffer per device expected");
  if (n.count > max_elements_)
    throw mgpu::Error("RingAllreduce: " + std::to_string(n.count) + " elements exceed the " +
                      std::to_string(max_elements_) + " it was made for");
  if (k == 1 || n.count == 0) return;  // one device already holds the sum
  auto next = [k](int i) { return (i + 1) % k; };
  auto prev = [k](int i) { return (i + k - 1) % k; };
  auto chunk = [&](int c) { return chunk_of(n, k, ((c % k) + k) % k); };
  auto mark = [&](int i) {  // only while timeline() runs: a timestamp on device i's stream
    if (marks_) marks_->emplace_back().record(devices_[i]);
  };

  // Every device marks "my gradient is computed"; in each step, the receiver waits only for
  // its sender's previous step. That one rule also keeps a sender from overwriting a chunk
  // before its receiver has read it: the wait chains all the way round the ring (README).
  for (int i = 0; i < k; ++i) step_done_[i]->record(devices_[i]);
  auto end_step = [&] {
    for (int i = 0; i < k; ++i) step_done_[i]->record(devices_[i]);
  };

  // Reduce-scatter: in step s device i receives chunk (i - 1 - s) from device i - 1 and adds it.
  for (int s = 0; s < k - 1; ++s) {
    for (int i = 0; i < k; ++i) {
      const int from = prev(i);
      const Chunk c = chunk(from - s);
      step_done_[from]->make_wait(devices_[i]);
      mark(i);
      receive_and_add(i, data[i] + c.begin, from, data[from] + c.begin, Elements{c.count});
      mark(i);
    }
    end_step();
  }
  // All-gather: in step s device i receives the complete chunk (i - s) from device i - 1.
  for (int s = 0; s < k - 1; ++s) {
    for (int i = 0; i < k; ++i) {
      const int from = prev(i);
      const Chunk c = chunk(from + 1 - s);
      step_done_[from]->make_wait(devices_[i]);
      mark(i);
      mgpu::copy_peer(devices_[i], data[i] + c.begin, devices_[from], data[from] + c.begin, Elements{c.count});
      mark(i);
    }
    end_step();
  }
  // Device i's buffer is read by device i+1 in the last step: nothing queued on device i after
  // the ring (the next step zeroes its gradients) may start before that read is done.
  for (int i = 0; i < k; ++i) step_done_[next(i)]->make_wait(devices_[i]);
}

std::vector<RingAllreduce::StepSpan> RingAllreduce::timeline(const std::vector<float*>& data, Elements n) {
  std::vector<mgpu::Timestamp> marks;
  marks.reserve(std::size_t(4) * devices_.size() * devices_.size());
  devices_.synchronize();  // start from idle devices
  marks_ = &marks;
  try {
    run(data, n);
  } catch (...) {
    marks_ = nullptr;
    throw;
  }
  marks_ = nullptr;
  // The marks came in pairs, step by step, device by device (run()'s loops).
  const int k = devices_.size();
  std::vector<StepSpan> spans;
  double first = 0;
  for (std::size_t m = 0; m + 1 < marks.size(); m += 2) {
    const int pair = static_cast<int>(m / 2);
    spans.push_back({pair / k, pair % k, marks[m].seconds(), marks[m + 1].seconds()});
    first = spans.size() == 1 ? spans.back().began : std::min(first, spans.back().began);
  }
  for (StepSpan& s : spans) s.began -= first, s.ended -= first;
  return spans;
}

void RingAllreduce::run(std::vector<dp::Replica>& replicas) {
  run(dp::flat_gradients(replicas), Elements{static_cast<std::size_t>(lenet::flat_count())});
}

}  // namespace ring
