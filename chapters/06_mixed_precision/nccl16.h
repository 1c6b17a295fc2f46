// The 16-bit gradient exchange through NCCL (cuda build with NCCL only): chapter 04's grouped
// ncclAllReduce calls on the bucket encoded in bf16 or fp16 (ncclBfloat16 / ncclFloat16), so
// NCCL moves half the bytes. NCCL adds 16-bit values as Ring16Allreduce does: each partial sum
// is computed in fp32 and rounded back to 16 bits, once per hop of its ring.
#pragma once
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "../02_data_parallel/data_parallel.h"
#include "formats.h"

namespace mixed {

class Nccl16Allreduce : public dp::GradientAllreduce {
 public:
  // One communicator per device; every device on its own GPU (NCCL refuses two on one).
  Nccl16Allreduce(const mgpu::DeviceSet& devices, Precision format);
  ~Nccl16Allreduce() override;
  Nccl16Allreduce(const Nccl16Allreduce&) = delete;
  Nccl16Allreduce& operator=(const Nccl16Allreduce&) = delete;

  // Encode every replica's flat bucket, one grouped 16-bit ncclAllReduce (sum), decode.
  void run(std::vector<dp::Replica>& replicas) override;
  lenet::Layout layout() const override { return lenet::Layout::Flat; }

 private:
  const mgpu::DeviceSet& devices_;
  Precision format_;
  std::vector<ncclComm_t> comms_;
  std::vector<mgpu::Buffer<std::uint16_t>> wire_;  // per device: its bucket in 16 bits
  int exceptions_before_;                          // as chapter 04's: abort, not finalize, while unwinding
};

}  // namespace mixed
