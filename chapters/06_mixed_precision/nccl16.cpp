#include "nccl16.h"

#include <string>

#include "common/nccl.h"
#include "mixed.h"
#include "ring16.h"  // exchange16: the encode, sum, decode around the group of ncclAllReduce calls

namespace mixed {

namespace {
// Each device's 16-bit copy of the bucket; refuses a format that is not 16 bits first.
std::vector<mgpu::Buffer<std::uint16_t>> make_wire(const mgpu::DeviceSet& devices, Precision format,
                                                   std::size_t max_elements) {
  if (format != Precision::BF16 && format != Precision::FP16)
    throw mgpu::Error("Nccl16Allreduce: the wire format must be bf16 or fp16");
  std::vector<mgpu::Buffer<std::uint16_t>> wire;
  for (int i = 0; i < devices.size(); ++i) wire.emplace_back(devices[i], max_elements);
  return wire;
}
}  // namespace

Nccl16Allreduce::Nccl16Allreduce(const mgpu::DeviceSet& devices, Precision format, std::size_t max_elements)
    : devices_(devices), format_(format), max_elements_(max_elements), wire_(make_wire(devices, format, max_elements)),
      comms_(devices) {}

void Nccl16Allreduce::run(const std::vector<float*>& data, mgpu::Elements n) {
  if (static_cast<int>(data.size()) != comms_.size()) throw mgpu::Error("Nccl16Allreduce: one buffer per device expected");
  if (n.count > max_elements_)
    throw mgpu::Error("Nccl16Allreduce: " + std::to_string(n.count) + " elements exceed the " +
                      std::to_string(max_elements_) + " it was made for");
  const ncclDataType_t type = format_ == Precision::FP16 ? ncclFloat16 : ncclBfloat16;
  exchange16(devices_, format_, data, wire_, n, [&](const std::vector<std::uint16_t*>& wire) {
    // Chapter 04's group of k calls. NCCL counts elements of `type`: n 16-bit values, never bytes.
    nccl::group_calls(devices_.size(), [&](int i) {
      const mgpu::Device& d = devices_[i];
      mgpu::activate(d);
      MGPU_CHECK_NCCL_COMM(ncclAllReduce(wire[i], wire[i], n.count, type, ncclSum, comms_[i], d.stream), comms_[i]);
    });
  });
}

}  // namespace mixed
