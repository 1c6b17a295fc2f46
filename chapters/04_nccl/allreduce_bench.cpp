// Chapter 03's benchmark with a third column set: NCCL's allreduce beside chapter 02's and the
// ring, in one table and one plot. NCCL needs one GPU per rank, so by default the device
// counts are 1, 2, 4, 8 up to the number of GPUs.
//   build/bin/04_allreduce_bench [-g 1,2] [-b 4] [-e 256M] [-f 2] ...   (nccl-tests' flags)
#include <algorithm>
#include <cstdio>
#include <memory>

#include "common/allreduce_bench.h"  // the benchmark harness chapter 03 teaches: this adds a column
#include "common/backend.h"
#include "common/program.h"

namespace {

const char* const kProgram = "04_allreduce_bench";

// 1, 2, 4, 8 up to the number of GPUs (1 where there is none: the cpu build's usage text).
bench::Settings chapter_defaults() {
  bench::Settings defaults;
  defaults.device_counts.clear();
  for (int k = 1; k <= 8 && k <= std::max(1, mgpu::gpu_count()); k *= 2) defaults.device_counts.push_back(k);
  return defaults;
}

}  // namespace

#if MGPU_HAVE_NCCL
#include "../01_lenet/lenet.h"                  // flat_count: LeNet's gradient bucket, a size the cost model prices
#include "../02_data_parallel/data_parallel.h"  // dp::add_collectives: "naive"
#include "../03_ring_allreduce/ring.h"          // ring::add_collectives: "ring"
#include "nccl_allreduce.h"                     // nccl::add_collectives: "nccl", the third column

int main(int argc, char** argv) {
  bench::Contenders contenders;
  contenders.add_collectives = [](mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& devices) {
    dp::add_collectives(menu, devices);
    ring::add_collectives(menu, devices);
    if (nccl::usable_devices(devices.size()) < devices.size()) {
      std::printf("(%d devices on %d GPUs: NCCL needs one GPU per rank, so no nccl column here)\n", devices.size(),
                  mgpu::gpu_count());
      return;
    }
    nccl::add_collectives(menu, devices);
  };
  contenders.names = {"naive", "ring", "nccl"};
  contenders.bucket_label = "LeNet's gradients";
  contenders.bucket_bytes = double(lenet::flat_count()) * sizeof(float);  // the flat bucket
  return bench::main_program(argc, argv, kProgram, contenders, chapter_defaults());
}

#else

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // as bench::main_program does in the cuda build
  // The command line first, as in the cuda build: a bad one exits 2 in every build, --help works.
  (void)bench::parse_command_line(argc, argv, kProgram, chapter_defaults());
  std::printf("%s: not applicable in this build: NCCL is a CUDA library and this is the %s build.\n"
              "03_allreduce_bench measures chapter 02's allreduce and the ring here.\n"
              "(exit status %d means \"not applicable\"; the tests count it as skipped)\n",
              kProgram, mgpu::kBackendName, mgpu::kExitNotApplicable);
  return mgpu::kExitNotApplicable;
}

#endif
