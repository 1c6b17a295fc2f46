// Chapter 04: the allreduce as production systems do it, with NCCL, from one process that
// drives every GPU.
//
//   ncclCommInitAll     one communicator per GPU, all of them in one call (one process)
//   ncclGroupStart/End  the k ncclAllReduce calls, one per GPU, as one operation
//   ncclBroadcast       device 0's starting parameters on every GPU, as DDP begins
//   ncclCommFinalize    flushes what is still queued, then ncclCommDestroy frees it
//
// Why the group: NCCL allows an ncclAllReduce call to wait until every other rank has joined
// the collective. With one thread issuing the k calls one after another, the first could then
// wait for the second, which that thread never reaches: a deadlock. (Whether a given NCCL
// version does wait there is the README's exercise 2.) Between ncclGroupStart and
// ncclGroupEnd the calls only queue; ncclGroupEnd launches all k together.
#pragma once
#include <nccl.h>

#include <functional>
#include <vector>

#include "common/collective.h"
#include "common/nccl.h"

namespace nccl {

enum class Reduction {
  Sum,      // ncclSum: every GPU gets the sum; the SGD step divides by the batch size
  Average,  // ncclAvg: every GPU gets sum / k; the SGD step must divide by batch / k
};

// One NCCL communicator per device of `devices`, made together by one ncclCommInitAll (every
// device must be on its own GPU: NCCL refuses two ranks of one communicator on one GPU), and
// closed together when this goes: finalized (which waits for every queued collective) and
// destroyed, or, while an exception unwinds the stack, aborted (a collective may be stuck
// waiting for a GPU that will never join it; abort does not wait). NcclAllreduce holds one;
// chapter 06's 16-bit NCCL exchange too.
class Communicators {
 public:
  explicit Communicators(const mgpu::DeviceSet& devices);
  ~Communicators();
  Communicators(const Communicators&) = delete;
  Communicators& operator=(const Communicators&) = delete;
  ncclComm_t operator[](int i) const { return comms_[static_cast<std::size_t>(i)]; }  // drives devices[i]
  int size() const { return static_cast<int>(comms_.size()); }

 private:
  const mgpu::DeviceSet& devices_;
  std::vector<ncclComm_t> comms_;
  int exceptions_before_;  // std::uncaught_exceptions() when made: more when this goes = unwinding
};

class NcclAllreduce : public mgpu::Collective {
 public:
  // One communicator per device (Communicators).
  NcclAllreduce(const mgpu::DeviceSet& devices, Reduction reduction);
  std::string name() const override { return reduction_ == Reduction::Sum ? "nccl" : "nccl_avg"; }

  // data[i] (n floats) lives on devices[i]; queued on each device's stream, no host wait.
  void run(const std::vector<float*>& data, mgpu::Elements n) override;
  float result_scale() const override;

 private:
  const mgpu::DeviceSet& devices_;
  Reduction reduction_;
  Communicators comms_;  // comms_[i] drives devices[i]
};

// Queues call(i) for i = 0 .. k-1, one NCCL call per communicator of this process, as one
// group (the "why" above), every NCCL call checked. NcclAllreduce::run groups its k allreduces
// with it; chapter 06's Nccl16Allreduce its k allreduces of 16-bit values.
void group_calls(int k, const std::function<void(int i)>& call);

// DDP's first step: every replica starts from one copy of the parameters. data[i] (n floats on
// devices[i]) ends holding data[root]'s values, by one grouped in-place ncclBroadcast per
// device; queued on each device's stream, no host wait. Throws, naming the numbers, where the
// buffers, devices and communicators differ in number or `root` is not a device.
void broadcast(const Communicators& comms, const mgpu::DeviceSet& devices, const mgpu::DeviceBuffers& data,
               mgpu::Elements n, int root);

// Adds this chapter's collectives to a program's menu (common/collective.h): "nccl" (ncclSum)
// and "nccl_avg" (ncclAvg), NcclAllreduces on `devices` (which must outlive what the menu makes).
void add_collectives(mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& devices);

// How many of `wanted` devices NCCL can use here: one per GPU (and at least one).
int usable_devices(int wanted);

}  // namespace nccl
