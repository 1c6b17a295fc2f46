#include "rank_device.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "common/check.h"
#if !MGPU_CUDA
#include <omp.h>
#endif

namespace mp {

int cpu_threads_for(const World& w) {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env) return std::max(1, std::atoi(env));
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  const int allowed = CPU_COUNT(&mask);
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const bool bound = allowed < online;
  return std::max(1, bound ? allowed : allowed / w.local_size);
}

#if MGPU_CUDA

RankDevice::RankDevice(const World& w) {
  const int gpus = mgpu::gpu_count();
  if (gpus == 0)
    throw mgpu::Error("this is a cuda build but no GPU answers (cudaGetDeviceCount = 0); "
                      "configure with -DMGPU_BACKEND=cpu to run on the CPU");
  device_.index = 0;
  device_.gpu = w.local_rank % gpus;
  ranks_per_gpu_ = (w.local_size + gpus - 1 - device_.gpu) / gpus;  // local ranks g, g + gpus, g + 2 gpus, ...
  MGPU_CHECK_CUDA(cudaSetDevice(device_.gpu));
  MGPU_CHECK_CUDA(cudaStreamCreateWithFlags(&device_.stream, cudaStreamNonBlocking));
  MGPU_CHECK_CUBLAS(cublasCreate(&device_.blas));
  MGPU_CHECK_CUBLAS(cublasSetStream(device_.blas, device_.stream));
}

RankDevice::~RankDevice() {  // destructors must not throw: errors here are ignored
  cudaSetDevice(device_.gpu);
  cudaStreamSynchronize(device_.stream);
  cublasDestroy(device_.blas);
  cudaStreamDestroy(device_.stream);
}

std::string RankDevice::describe() const {
  return device_.name() + (ranks_per_gpu_ > 1 ? " (shared by " + std::to_string(ranks_per_gpu_) + " ranks)" : "");
}

#else

RankDevice::RankDevice(const World& w) {
  device_.index = 0;
  device_.gpu = -1;
  omp_set_num_threads(cpu_threads_for(w));  // before the first parallel region: lanes follow it
}

RankDevice::~RankDevice() = default;

std::string RankDevice::describe() const {
  const int threads = omp_get_max_threads();
  return "cpu, " + std::to_string(threads) + " OpenMP thread" + (threads > 1 ? "s" : "");
}

#endif

}  // namespace mp
