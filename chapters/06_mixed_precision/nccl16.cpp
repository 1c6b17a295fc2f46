#include "nccl16.h"

#include <algorithm>
#include <exception>
#include <string>

#include "common/nccl.h"
#include "mixed.h"

namespace mixed {

Nccl16Allreduce::Nccl16Allreduce(const mgpu::DeviceSet& devices, Precision format)
    : devices_(devices), format_(format), comms_(devices.size(), nullptr),
      exceptions_before_(std::uncaught_exceptions()) {
  if (format != Precision::BF16 && format != Precision::FP16)
    throw mgpu::Error("Nccl16Allreduce: the wire format must be bf16 or fp16");
  std::vector<int> gpus;
  for (int i = 0; i < devices.size(); ++i) {
    if (std::find(gpus.begin(), gpus.end(), devices[i].gpu) != gpus.end())
      throw mgpu::Error("--allreduce nccl: devices " + std::to_string(i) + " and another share cuda:" +
                        std::to_string(devices[i].gpu) + "; NCCL needs one GPU per device");
    gpus.push_back(devices[i].gpu);
    wire_.emplace_back(devices[i], static_cast<std::size_t>(lenet::flat_count()));
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

void Nccl16Allreduce::run(std::vector<dp::Replica>& replicas) {
  const std::int64_t n = lenet::flat_count();
  const ncclDataType_t type = format_ == Precision::FP16 ? ncclFloat16 : ncclBfloat16;
  for (std::size_t i = 0; i < replicas.size(); ++i)
    encode(*replicas[i].device, format_, replicas[i].grads.flat(), wire_[i].data(), n);
  // Chapter 04's group: the k calls queue, ncclGroupEnd launches them together. NCCL counts
  // elements of `type`: n 16-bit values, never bytes.
  MGPU_CHECK_NCCL(ncclGroupStart());
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    mgpu::activate(*replicas[i].device);
    MGPU_CHECK_NCCL_COMM(ncclAllReduce(wire_[i].data(), wire_[i].data(), static_cast<std::size_t>(n), type, ncclSum,
                                       comms_[i], replicas[i].device->stream),
                         comms_[i]);
  }
  MGPU_CHECK_NCCL(ncclGroupEnd());
  for (std::size_t i = 0; i < replicas.size(); ++i)
    decode(*replicas[i].device, format_, wire_[i].data(), replicas[i].grads.flat(), n);
}

}  // namespace mixed
