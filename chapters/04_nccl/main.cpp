// Chapter 04: chapter 02/03's training with NCCL's allreduce, from one process driving every
// GPU. Trains LeNet three times from the same start and the same batches: with chapter 03's
// ring, with ncclSum and with ncclAvg; plots the curves; times one step's allreduce each way.
//   build/bin/04_nccl [--devices K] [--epochs 10] [--batch-size 256] [--lr 0.2] ...
// NCCL runs one rank per GPU: K is capped at the number of GPUs.
#include <cstdio>

#include "common/backend.h"  // kBackendName, kExitNotApplicable
#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does

#if MGPU_HAVE_NCCL
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../03_ring_allreduce/compare.h"  // chapter 03's comparison of ways to sum the gradients
#include "../03_ring_allreduce/ring.h"     // the ring, NCCL's baseline here
#include "nccl_allreduce.h"  // NcclAllreduce (ncclCommInitAll, grouped ncclAllReduce calls), broadcast

namespace {

// DDP's first step, shown on LeNet's parameters: each device makes its own start (seed + i, as
// processes not told one seed would), then one ncclBroadcast gives every device device 0's, and
// every element of every copy is checked. The trainings below need no broadcast: get_params
// makes every replica from one host copy; chapter 05's processes each make their own.
void show_first_broadcast(const mgpu::DeviceSet& devices, std::uint64_t seed) {
  const nccl::Communicators comms(devices);
  std::vector<lenet::Params> replicas;  // [k] flat: flat_count() floats each
  mgpu::DeviceBuffers flat;
  for (int i = 0; i < devices.size(); ++i) {
    replicas.push_back(lenet::upload_params(devices[i], lenet::init_params(seed + i), lenet::Layout::Flat));
    flat.push_back(replicas.back().flat());
  }
  nccl::broadcast(comms, devices, flat, mgpu::Elements{static_cast<std::size_t>(lenet::flat_count())}, /*root=*/0);
  devices.synchronize();
  const lenet::HostParams device0 = lenet::init_params(seed);
  for (int i = 0; i < devices.size(); ++i)
    if (replicas[i].download() != device0)
      throw mgpu::Error("ncclBroadcast: device " + std::to_string(i) + "'s parameters differ from device 0's");
  std::printf("ncclBroadcast: device 0's %lld starting parameters now on all %d device(s), every element checked\n",
              static_cast<long long>(lenet::parameter_count()), devices.size());
}

int run(const mgpu::ChapterInfo& chapter, mgpu::Options o) {
  const int k = nccl::usable_devices(o.devices);
  const mgpu::DeviceSet devices(k);  // where no GPU answers, this stops with a message
  if (k < o.devices)
    std::printf("NCCL runs one rank per GPU and this machine has %d: using %d device(s), not %d\n", k, k, o.devices);
  if (k == 1)
    std::printf("with one GPU, NCCL's allreduce has nobody to talk to: it runs, but two or more GPUs are "
                "needed to see communication\n");
  o.devices = k;
  std::printf("backend %s, NCCL %d.%d.%d, %d device(s)\n%s%s", mgpu::kBackendName, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
              k, devices.mapping().c_str(), mgpu::enable_peer_access(devices).c_str());
  show_first_broadcast(devices, o.seed);
  const mgpu::FashionMnist data = mgpu::load_data(o);

  // Every way hands the collective the whole flat gradient bucket in one call.
  const lenet::Layout flat = lenet::Layout::Flat;
  const std::size_t bucket = dp::largest_gradient_sum(flat);
  mgpu::CollectiveMenu menu;
  ring::add_collectives(menu, devices);  // "ring"
  nccl::add_collectives(menu, devices);  // "nccl", "nccl_avg"
  std::vector<ring::GradientSum> ways;
  ways.push_back({"chapter 03 ring", "ring", flat, menu.make("ring", bucket)});
  ways.push_back({"ncclSum, SGD divides by batch", "nccl_sum", flat, menu.make("nccl", bucket)});
  ways.push_back({"ncclAvg, SGD divides by batch/k", "nccl_avg", flat, menu.make("nccl_avg", bucket)});
  ring::train_each(devices, data, o, chapter, {&ways[0], &ways[1], &ways[2]});
  ring::print_step_times(devices, data, o, ways);
  return 0;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"04_nccl", "data-parallel LeNet with NCCL's allreduce, one process, one rank per GPU",
                                  /*default_devices=*/2, /*max_devices=*/1024};
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter);
#if MGPU_HAVE_NCCL
  return mgpu::run_or_report(chapter.name, [&] { return run(chapter, o); });
#else
  (void)o;
  std::printf("04_nccl: not applicable in this build: NCCL is a CUDA library and this is the %s build.\n"
              "Chapter 05 runs the same training with one process per device and MPI_Allreduce on the CPU:\n"
              "  mpirun -np 2 build/bin/05_multi_process\n"
              "(exit status %d means \"not applicable\"; the tests count it as skipped)\n",
              mgpu::kBackendName, mgpu::kExitNotApplicable);
  return mgpu::kExitNotApplicable;
#endif
}
