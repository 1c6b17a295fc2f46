// Chapter 03's benchmark program, 03_allreduce_bench: chapter 02's allreduce against the ring,
// nccl-tests style. Everything but the choice of collectives is the harness in common/, which
// chapter 04's 04_allreduce_bench runs with NCCL beside them:
//   common/benchmark.h         measuring: warm up, check every element, time
//   common/allreduce_bench.h   the allreduce benchmark: its table, CSV and plot; its program
//                              (command line, memory check, cost model, files)
//   build/bin/03_allreduce_bench [-g 2,4,8] [-b 4] [-e 256M] [-f 2] ...   (nccl-tests' flags)
#include "../01_lenet/lenet.h"       // flat_count: LeNet's gradient bucket, a size the cost model prices
#include "../02_data_parallel/data_parallel.h"  // dp::add_collectives: "naive"
#include "common/allreduce_bench.h"  // main_program, Contenders: the nccl-tests-style harness
#include "ring.h"                    // ring::add_collectives: "ring"

int main(int argc, char** argv) {
  bench::Contenders contenders;
  contenders.add_collectives = [](mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& devices) {
    dp::add_collectives(menu, devices);
    ring::add_collectives(menu, devices);
  };
  contenders.names = {"naive", "ring"};
  contenders.bucket_label = "LeNet's gradients";
  contenders.bucket_bytes = double(lenet::flat_count()) * sizeof(float);  // the flat bucket
  return bench::main_program(argc, argv, "03_allreduce_bench", contenders);
}
