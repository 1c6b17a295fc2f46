// The 16-bit gradient exchange through NCCL (cuda build with NCCL only): chapter 04's grouped
// ncclAllReduce calls on the bucket encoded in bf16 or fp16 (ncclBfloat16 / ncclFloat16), so
// NCCL moves half the bytes. NCCL adds 16-bit values as Ring16Allreduce does: each partial sum
// is computed in fp32 and rounded back to 16 bits, once per hop of its ring.
#pragma once
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "../04_nccl/nccl_allreduce.h"  // nccl::Communicators, nccl::group_calls
#include "common/collective.h"
#include "formats.h"

namespace mixed {

class Nccl16Allreduce : public mgpu::Collective {
 public:
  // One communicator per device (chapter 04's Communicators: every device on its own GPU).
  // max_elements: the largest buffer run() will be given (each device keeps its 16-bit copy).
  Nccl16Allreduce(const mgpu::DeviceSet& devices, Precision format, std::size_t max_elements);
  std::string name() const override { return "nccl16"; }

  // data[i] (n fp32 values on devices[i]): encoded, one grouped 16-bit ncclAllReduce (sum), decoded.
  void run(const std::vector<float*>& data, mgpu::Elements n) override;

 private:
  const mgpu::DeviceSet& devices_;
  Precision format_;
  std::size_t max_elements_;
  std::vector<mgpu::Buffer<std::uint16_t>> wire_;  // per device: its bucket in 16 bits
  nccl::Communicators comms_;                      // made last, so closed first
};

}  // namespace mixed
