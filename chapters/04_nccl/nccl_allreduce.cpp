#include "nccl_allreduce.h"

#include <algorithm>
#include <exception>
#include <string>

#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace nccl {

void add_collectives(mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& devices) {
  // NCCL needs no staging of its own: max_elements is not used.
  menu.add("nccl", [&devices](std::size_t) { return std::make_unique<NcclAllreduce>(devices, Reduction::Sum); });
  menu.add("nccl_avg", [&devices](std::size_t) { return std::make_unique<NcclAllreduce>(devices, Reduction::Average); });
}

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
  // BEGIN EXERCISE ex04.group_calls
  if (static_cast<int>(data.size()) != comms_.size()) throw mgpu::Error("NcclAllreduce: one buffer per device expected");
  const ncclRedOp_t op = reduction_ == Reduction::Sum ? ncclSum : ncclAvg;
  group_calls(devices_.size(), [&](int i) { mgpu::allreduce(comms_[i], devices_[i], data[i], n, op); });
  // END EXERCISE ex04.group_calls
}

float NcclAllreduce::result_scale() const {
  // BEGIN EXERCISE ex04.group_calls
  return reduction_ == Reduction::Sum ? 1.0f : 1.0f / static_cast<float>(comms_.size());
  // END EXERCISE ex04.group_calls
}

void broadcast(const Communicators& comms, const mgpu::DeviceSet& devices, const mgpu::DeviceBuffers& data,
               mgpu::Elements n, int root) {
  // BEGIN EXERCISE ex04.broadcast
  const int k = comms.size();
  if (devices.size() != k || static_cast<int>(data.size()) != k)
    throw mgpu::Error("broadcast: " + std::to_string(data.size()) + " buffers on " + std::to_string(devices.size()) +
                      " devices for " + std::to_string(k) + " communicators; one of each per device expected");
  if (root < 0 || root >= k)
    throw mgpu::Error("broadcast: root " + std::to_string(root) + " is not one of the " + std::to_string(k) +
                      " devices (0 to " + std::to_string(k - 1) + ")");
  // One group, as for the allreduce: the root's call and the receivers' calls launch together.
  group_calls(k, [&](int i) { mgpu::broadcast(comms[i], devices[i], data[i], n, root); });
  // END EXERCISE ex04.broadcast
}

}  // namespace nccl
