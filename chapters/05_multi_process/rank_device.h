// The one device a process drives. Chapters 02-04 had one process drive k devices (a
// DeviceSet); here every process has a DeviceSet of one, picked by its local rank:
//   cuda build: one of the GPUs this process sees, chosen by the local rank, with its own stream
//               and cuBLAS handle; with more ranks than GPUs on a machine, ranks share GPUs
//               round-robin
//   cpu build:  the host, with its share of the machine's cores as OpenMP threads
//
// Whether ranks share a GPU is asked of the GPUs themselves: every rank names its GPU by
// host and PCI bus id, and the names are compared. Counting ranks and GPUs would be wrong when
// the launcher gives each rank its own CUDA_VISIBLE_DEVICES (srun --gpus-per-task=1): every
// rank then sees one GPU, "GPU 0", and they are all different GPUs.
#pragma once
#include <string>

#include "common/device.h"
#include "world.h"

namespace mp {

class RankDevice {
 public:
  // Every rank of w must make its RankDevice: the ranks compare their GPUs (an MPI collective).
  explicit RankDevice(const World& w);
  ~RankDevice();
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  const mgpu::Device& device() const { return devices_[0]; }
  // How many ranks drive the same GPU as this one (1 in the cpu build).
  int ranks_per_gpu() const { return ranks_per_gpu_; }
  std::string describe() const;  // "cuda:1 (0000:3b:00.0)" or "cpu, 2 OpenMP threads"

 private:
  mgpu::DeviceSet devices_;  // exactly one
  std::string gpu_name_;     // host and PCI bus id (cuda build)
  int ranks_per_gpu_ = 1;
};

// cpu build: the number of OpenMP threads (and so of lanes, lenet::Lanes) for this rank. With
// OMP_NUM_THREADS set, that. Otherwise the cores this process may run on (its affinity mask),
// divided among the ranks of this machine when mpirun did not bind them (every rank then sees
// every core); when it did bind them (mpirun binds each rank to a core for K <= 2), the mask
// already is this rank's share.
int cpu_threads_for(const World& w);

}  // namespace mp
