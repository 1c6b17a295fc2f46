#include "rank_device.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "common/check.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace mp {

int cpu_threads_for(const World& w) {
  // BEGIN EXERCISE ex05.bootstrap
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env) return std::max(1, std::atoi(env));
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  const int allowed = CPU_COUNT(&mask);
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const bool bound = allowed < online;
  return std::max(1, bound ? allowed : allowed / w.local_size);
  // END EXERCISE ex05.bootstrap
}

#if MGPU_CUDA

namespace {

// The GPU (among those this process sees) that this rank drives: local ranks 0, 1, ... take
// GPUs 0, 1, ... and start again from GPU 0 when there are more ranks than GPUs.
int gpu_for(const World& w) {
  const int gpus = mgpu::gpu_count();
  if (gpus == 0)
    throw mgpu::Error("this is a cuda build but no GPU answers (cudaGetDeviceCount = 0); "
                      "configure with -DMGPU_BACKEND=cpu to run on the CPU");
  // BEGIN EXERCISE ex05.bootstrap
  return w.local_rank % gpus;
  // END EXERCISE ex05.bootstrap
}

// "host/0000:3b:00.0": the same string on two ranks exactly when they drive the same GPU.
std::string physical_gpu_name(const World& w, int gpu) {
  char bus_id[32] = {};
  MGPU_CHECK_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, gpu));
  return w.host + "/" + bus_id;
}

}  // namespace

RankDevice::RankDevice(const World& w) : devices_(1, {gpu_for(w)}) {
  gpu_name_ = physical_gpu_name(w, device().gpu);
  ranks_per_gpu_ = count_ranks_with(w, gpu_name_);
}

RankDevice::~RankDevice() = default;

std::string RankDevice::describe() const {
  const std::string bus_id = gpu_name_.substr(gpu_name_.rfind('/') + 1);
  return device().name() + " (" + bus_id + ")" +
         (ranks_per_gpu_ > 1 ? ", shared by " + std::to_string(ranks_per_gpu_) + " ranks" : "");
}

#else

// The rank's device gets this rank's share of the cores: its worker's OpenMP threads, and so its lanes.
RankDevice::RankDevice(const World& w) : devices_(1, {}, cpu_threads_for(w)) {}

RankDevice::~RankDevice() = default;

std::string RankDevice::describe() const {
  const int threads = mgpu::lanes_per_device(device());
  return "cpu, " + std::to_string(threads) + " OpenMP thread" + (threads > 1 ? "s" : "");
}

#endif

}  // namespace mp
