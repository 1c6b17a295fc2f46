// Chapter 04: chapter 02/03's training with NCCL's allreduce, from one process driving every
// GPU. Trains LeNet three times from the same start and the same batches: with chapter 03's
// ring, with ncclSum and with ncclAvg; plots the curves; times one step's allreduce each way.
//   build/bin/04_nccl [--devices K] [--epochs 10] [--batch-size 256] [--lr 0.2] ...
// NCCL runs one rank per GPU: K is capped at the number of GPUs.
#include <cstdio>

#include "common/backend.h"
#include "common/cli.h"

#if MGPU_HAVE_NCCL
#include <filesystem>
#include <memory>

#include "../03_ring_allreduce/ring.h"
#include "common/report.h"
#include "nccl_allreduce.h"

namespace {

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
  const mgpu::FashionMnist data = mgpu::load_fashion_mnist(o.data_dir, o.limit_train);
  std::printf("Fashion-MNIST from %s: %d training, %d test images\n", data.dir.c_str(), data.train.count,
              data.test.count);

  struct Way {
    std::string label, run;
    std::unique_ptr<dp::GradientAllreduce> allreduce;
  };
  std::vector<Way> ways;
  ways.push_back({"chapter 03 ring", "ring", std::make_unique<ring::RingAllreduce>(devices)});
  ways.push_back({"ncclSum, SGD divides by batch", "nccl_sum",
                  std::make_unique<nccl::NcclAllreduce>(devices, nccl::Reduction::Sum)});
  ways.push_back({"ncclAvg, SGD divides by batch/k", "nccl_avg",
                  std::make_unique<nccl::NcclAllreduce>(devices, nccl::Reduction::Average)});

  std::vector<std::pair<std::string, std::string>> runs;  // (label, csv) for the plot
  for (Way& way : ways) {
    std::printf("\n== training on %d device(s) with %s\n", k, way.label.c_str());
    mgpu::TrainingLog log(chapter.name, chapter.name + "_" + way.run + "_k" + std::to_string(k), o, k,
                          data.train.count);
    dp::train(devices, data, o, *way.allreduce, log);
    log.finish();
    runs.emplace_back(way.label, log.csv_path());
  }
  const std::string png = (std::filesystem::path(o.out) / (chapter.name + ".png")).string();
  if (mgpu::plot_runs(png, chapter.name + ": " + std::to_string(k) + " GPU(s), ring vs NCCL", runs))
    std::printf("wrote %s\n", png.c_str());

  std::printf("\nper step on %d device(s) (mean of 20 steps, devices synchronized between phases):\n", k);
  std::printf("  %-36s %12s %14s\n", "allreduce", "compute ms", "allreduce ms");
  for (Way& way : ways) {
    const dp::StepTimes t = dp::profile_steps(devices, data, o, *way.allreduce, 20);
    std::printf("  %-36s %12.2f %14.3f\n", way.label.c_str(), 1e3 * t.compute / t.steps,
                1e3 * t.allreduce / t.steps);
  }
  return 0;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  const mgpu::ChapterInfo chapter{"04_nccl", "data-parallel LeNet with NCCL's allreduce, one process, one rank per GPU",
                                  /*default_devices=*/2, /*max_devices=*/1024};
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter);
#if MGPU_HAVE_NCCL
  try {
    return run(chapter, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "04_nccl: error: %s\n", e.what());
    return 1;
  }
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
