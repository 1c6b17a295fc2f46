// The one device a process drives. Chapters 02-04 had one process drive k devices (a
// DeviceSet); here every process has exactly one, picked by its local rank:
//   cuda build: GPU local_rank % (GPUs on this machine), with its own stream and cuBLAS handle;
//               with more ranks than GPUs on a machine, ranks share GPUs round-robin
//   cpu build:  the host, with its share of the machine's cores as OpenMP threads
#pragma once
#include <string>

#include "common/device.h"
#include "world.h"

namespace mp {

class RankDevice {
 public:
  explicit RankDevice(const World& w);
  ~RankDevice();
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  const mgpu::Device& device() const { return device_; }
  // How many ranks of this machine drive the same GPU as this one (1 in the cpu build).
  int ranks_per_gpu() const { return ranks_per_gpu_; }
  std::string describe() const;  // "cuda:1" or "cpu, 2 OpenMP threads"

 private:
  mgpu::Device device_;
  int ranks_per_gpu_ = 1;
};

// cpu build: the number of OpenMP threads (and so of lanes, lenet::Lanes) for this rank. With
// OMP_NUM_THREADS set, that. Otherwise the cores this process may run on (its affinity mask),
// divided among the ranks of this machine when mpirun did not bind them (every rank then sees
// every core); when it did bind them (mpirun binds each rank to a core for K <= 2), the mask
// already is this rank's share.
int cpu_threads_for(const World& w);

}  // namespace mp
