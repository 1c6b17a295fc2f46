#include "nccl16.h"

#include <algorithm>
#include <exception>
#include <string>

#include "../04_nccl/nccl_allreduce.h"  // nccl::group_calls: chapter 04's group
#include "common/nccl.h"
#include "mixed.h"
#include "ring16.h"  // exchange16: the encode, sum, decode around the group of ncclAllReduce calls

namespace mixed {

Nccl16Allreduce::Nccl16Allreduce(const mgpu::DeviceSet& devices, Precision format, std::size_t max_elements)
    : devices_(devices), format_(format), max_elements_(max_elements), comms_(devices.size(), nullptr),
      exceptions_before_(std::uncaught_exceptions()) {
  if (format != Precision::BF16 && format != Precision::FP16)
    throw mgpu::Error("Nccl16Allreduce: the wire format must be bf16 or fp16");
  std::vector<int> gpus;
  for (int i = 0; i < devices.size(); ++i) {
    if (std::find(gpus.begin(), gpus.end(), devices[i].gpu) != gpus.end())
      throw mgpu::Error("--allreduce nccl: devices " + std::to_string(i) + " and another share cuda:" +
                        std::to_string(devices[i].gpu) + "; NCCL needs one GPU per device");
    gpus.push_back(devices[i].gpu);
    wire_.emplace_back(devices[i], max_elements);
  }
  MGPU_CHECK_NCCL(ncclCommInitAll(comms_.data(), devices.size(), gpus.data()));
}

Nccl16Allreduce::~Nccl16Allreduce() {
  const bool unwinding = std::uncaught_exceptions() > exceptions_before_;
  for (std::size_t i = 0; i < comms_.size(); ++i) {
    cudaSetDevice(devices_[static_cast<int>(i)].gpu);
    mgpu::close_communicator(comms_[i], unwinding);
  }
}

void Nccl16Allreduce::run(const std::vector<float*>& data, mgpu::Elements n) {
  if (data.size() != comms_.size()) throw mgpu::Error("Nccl16Allreduce: one buffer per device expected");
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
