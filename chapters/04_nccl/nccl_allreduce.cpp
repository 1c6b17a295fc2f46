#include "nccl_allreduce.h"

#include <algorithm>
#include <exception>
#include <string>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace nccl {

int usable_devices(int wanted) {
  // The cpu build's NCCL stand-in (tests/nccl_standin/nccl.h) makes each logical device a rank.
  if (!mgpu::kCudaBackend) return std::max(1, wanted);
  // At least one: where no GPU answers, making the DeviceSet is what says so.
  return std::max(1, std::min(wanted, mgpu::gpu_count()));
}

Communicators::Communicators(const mgpu::DeviceSet& devices)
    : devices_(devices), comms_(devices.size(), nullptr), exceptions_before_(std::uncaught_exceptions()) {
  // BEGIN EXERCISE ex04.communicators
  std::vector<int> gpus;
  for (int i = 0; i < devices.size(); ++i) {
    // (A cpu device has no GPU, gpu == -1: under the cpu build's stand-in each is a rank.)
    if (devices[i].gpu >= 0 && std::find(gpus.begin(), gpus.end(), devices[i].gpu) != gpus.end())
      throw mgpu::Error("NCCL: devices " + std::to_string(i) + " and another share cuda:" +
                        std::to_string(devices[i].gpu) + "; NCCL needs one GPU per rank");
    gpus.push_back(devices[i].gpu);
  }
  MGPU_CHECK_NCCL(ncclCommInitAll(comms_.data(), devices.size(), gpus.data()));
  // END EXERCISE ex04.communicators
}

Communicators::~Communicators() {
  // Errors are reported, not thrown (close_communicator): a destructor must not throw.
  // BEGIN EXERCISE ex04.communicators
  const bool unwinding = std::uncaught_exceptions() > exceptions_before_;
  for (std::size_t i = 0; i < comms_.size(); ++i) {
#if MGPU_CUDA  // the cpu build's stand-in has no device to select
    cudaSetDevice(devices_[static_cast<int>(i)].gpu);
#endif
    mgpu::close_communicator(comms_[i], unwinding);
  }
  // END EXERCISE ex04.communicators
}

NcclAllreduce::NcclAllreduce(const mgpu::DeviceSet& devices, Reduction reduction)
    : devices_(devices), reduction_(reduction), comms_(devices) {}

void group_calls(int k, const std::function<void(int i)>& call) {
  // BEGIN EXERCISE ex04.group_calls
  MGPU_CHECK_NCCL(ncclGroupStart());
  for (int i = 0; i < k; ++i) call(i);
  MGPU_CHECK_NCCL(ncclGroupEnd());  // launches all k; the streams are not waited for here
  // END EXERCISE ex04.group_calls
}

void NcclAllreduce::run(const std::vector<float*>& data, mgpu::Elements n) {
  if (static_cast<int>(data.size()) != comms_.size()) throw mgpu::Error("NcclAllreduce: one buffer per device expected");
  const ncclRedOp_t op = reduction_ == Reduction::Sum ? ncclSum : ncclAvg;
  group_calls(devices_.size(), [&](int i) { mgpu::allreduce(comms_[i], devices_[i], data[i], n, op); });
}

float NcclAllreduce::result_scale() const {
  return reduction_ == Reduction::Sum ? 1.0f : 1.0f / static_cast<float>(comms_.size());
}

}  // namespace nccl
