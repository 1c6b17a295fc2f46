#include "ring16.h"

#include <string>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "mixed.h"

namespace mixed {

using mgpu::Elements;

Ring16Allreduce::Ring16Allreduce(const mgpu::DeviceSet& devices, Precision format, std::size_t max_elements)
    : devices_(devices),
      format_(format),
      max_elements_(max_elements) {
  if (format != Precision::BF16 && format != Precision::FP16)
    throw mgpu::Error("Ring16Allreduce: the wire format must be bf16 or fp16");
  const std::size_t largest_chunk = mgpu::chunk_of(Elements{max_elements_}, devices.size(), 0).count;
  for (int i = 0; i < devices.size(); ++i) {
    wire_.emplace_back(devices[i], max_elements_);
    staging_.emplace_back(devices[i], largest_chunk);
    step_done_.push_back(std::make_unique<mgpu::Event>(devices[i]));
  }
}

Ring16Allreduce::~Ring16Allreduce() {
  try {
    devices_.synchronize();
  } catch (...) {  // a destructor must not throw; the error was (or will be) reported elsewhere
  }
}

void Ring16Allreduce::mark_ready() {
  for (int i = 0; i < devices_.size(); ++i) step_done_[i]->record(devices_[i]);
}

void Ring16Allreduce::half(const std::vector<std::uint16_t*>& wire, Elements n, bool add) {
  // BEGIN EXERCISE ex06.ring16
  const int k = devices_.size();
  // Chapter 03's ring on 16-bit values: the same chunks, steps and waits.
  const int first_chunk = add ? 0 : 1;  // the chunk device i - 1 sends in step 0
  mark_ready();  // "my buffer is ready to be read"
  for (int s = 0; s < k - 1; ++s) {
    for (int i = 0; i < k; ++i) {
      const int from = (i + k - 1) % k;
      const mgpu::Chunk c = mgpu::chunk_of(n, k, ((from + first_chunk - s) % k + k) % k);
      step_done_[from]->make_wait(devices_[i]);  // the sender's previous step is done
      if (add) {  // reduce-scatter: through the staging buffer, added in fp32, rounded once
        mgpu::copy_peer(devices_[i], staging_[i].data(), devices_[from], wire[from] + c.begin, Elements{c.count});
        add_encoded(devices_[i], format_, wire[i] + c.begin, staging_[i].data(), std::int64_t(c.count));
      } else {  // all-gather: the complete chunk, stored
        mgpu::copy_peer(devices_[i], wire[i] + c.begin, devices_[from], wire[from] + c.begin, Elements{c.count});
      }
    }
    mark_ready();  // this step is done
  }
  // No device goes on (to the next half, or to reuse its buffer) before its successor has read it.
  for (int i = 0; i < k; ++i) step_done_[(i + 1) % k]->make_wait(devices_[i]);
  // END EXERCISE ex06.ring16
}

void Ring16Allreduce::run16(const std::vector<std::uint16_t*>& wire, Elements n) {
  if (static_cast<int>(wire.size()) != devices_.size())
    throw mgpu::Error("Ring16Allreduce: one buffer per device expected");
  if (n.count > max_elements_)
    throw mgpu::Error("Ring16Allreduce: " + std::to_string(n.count) + " elements exceed the " +
                      std::to_string(max_elements_) + " it was made for");
  if (devices_.size() == 1 || n.count == 0) return;
  half(wire, n, /*add=*/true);   // reduce-scatter: device i completes chunk (i + 1) mod k
  half(wire, n, /*add=*/false);  // all-gather: and passes it round
}

void exchange16(const mgpu::DeviceSet& devices, Precision format, const std::vector<float*>& data,
                std::vector<mgpu::Buffer<std::uint16_t>>& wire, mgpu::Elements n, const Sum16& sum16) {
  // BEGIN EXERCISE ex06.ring16
  const std::int64_t count = static_cast<std::int64_t>(n.count);
  std::vector<std::uint16_t*> wire16;
  for (int i = 0; i < devices.size(); ++i) {
    encode(devices[i], format, data[i], wire[i].data(), count);  // fp32 -> 16 bits
    wire16.push_back(wire[i].data());
  }
  sum16(wire16);
  // 16 bits -> fp32. With one device this is the rounding alone: the same gradient a k-device
  // run would see, so 1 and k devices stay comparable.
  for (int i = 0; i < devices.size(); ++i) decode(devices[i], format, wire[i].data(), data[i], count);
  // END EXERCISE ex06.ring16
}

void Ring16Allreduce::run(const std::vector<float*>& data, Elements n) {
  if (static_cast<int>(data.size()) != devices_.size())
    throw mgpu::Error("Ring16Allreduce: one buffer per device expected");
  if (n.count > max_elements_)
    throw mgpu::Error("Ring16Allreduce: " + std::to_string(n.count) + " elements exceed the " +
                      std::to_string(max_elements_) + " it was made for");
  exchange16(devices_, format_, data, wire_, n, [&](const std::vector<std::uint16_t*>& wire) { run16(wire, n); });
}

}  // namespace mixed
