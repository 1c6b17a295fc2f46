// Chapter 03: chapter 02's training with a faster allreduce. Trains LeNet on k devices
// (--devices, default 2) twice from the same start and the same batches: with chapter 02's
// allreduce, then with the ring over one flat gradient bucket; plots both curves; then times
// one step's allreduce three ways (per tensor, one flat bucket, ring).
//   build/bin/03_ring_allreduce [--devices 2] [--epochs 10] [--batch-size 256] [--lr 0.2] ...
#include <cstdio>
#include <filesystem>
#include <memory>

#include "common/cli.h"
#include "common/device.h"
#include "common/report.h"
#include "ring.h"

int main(int argc, char** argv) {
  const mgpu::ChapterInfo chapter{"03_ring_allreduce",
                                  "data-parallel LeNet with a ring allreduce over one flat gradient bucket",
                                  /*default_devices=*/2, /*max_devices=*/1024};
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter);
  try {
    const mgpu::DeviceSet devices(o.devices);
    std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, o.devices, devices.mapping().c_str(),
                mgpu::enable_peer_access(devices).c_str());
    const mgpu::FashionMnist data = mgpu::load_fashion_mnist(o.data_dir, o.limit_train);
    std::printf("Fashion-MNIST from %s: %d training, %d test images\n", data.dir.c_str(), data.train.count,
                data.test.count);

    // The three ways to sum one step's gradients, each made for these devices.
    struct Way {
      std::string label, run;
      std::unique_ptr<dp::GradientAllreduce> allreduce;
    };
    std::vector<Way> ways;
    ways.push_back({"chapter 02: 8 tensors via device 0", "naive",
                    std::make_unique<dp::Allreduce>(devices, lenet::Layout::PerTensor)});
    ways.push_back({"chapter 02 allreduce, 1 flat bucket", "naive_flat",
                    std::make_unique<dp::Allreduce>(devices, lenet::Layout::Flat)});
    ways.push_back({"ring, 1 flat bucket", "ring", std::make_unique<ring::RingAllreduce>(devices)});

    // Train with the first and the last: the curves should match (same start, same batches).
    std::vector<std::pair<std::string, std::string>> runs;  // (label, csv) for the plot
    for (const Way* way : {&ways.front(), &ways.back()}) {
      std::printf("\n== training on %d device(s) with %s\n", o.devices, way->label.c_str());
      mgpu::TrainingLog log(chapter.name, chapter.name + "_" + way->run + "_k" + std::to_string(o.devices), o,
                            o.devices, data.train.count);
      dp::train(devices, data, o, *way->allreduce, log);
      log.finish();
      runs.emplace_back(way->label, log.csv_path());
    }
    const std::string png = (std::filesystem::path(o.out) / (chapter.name + ".png")).string();
    if (mgpu::plot_runs(png, chapter.name + ": " + std::to_string(o.devices) + " devices, chapter 02 allreduce vs the ring (" +
                                 mgpu::kBackendName + ")",
                        runs))
      std::printf("wrote %s\n", png.c_str());

    // One step's time, phase by phase, for each way (measured apart from the runs above: the
    // synchronization that measuring needs would slow them down).
    std::printf("\nper step on %d devices (mean of 20 steps, devices synchronized between phases):\n", o.devices);
    std::printf("  %-40s %12s %14s\n", "allreduce", "compute ms", "allreduce ms");
    for (Way& way : ways) {
      const dp::StepTimes t = dp::profile_steps(devices, data, o, *way.allreduce, 20);
      std::printf("  %-40s %12.2f %14.3f\n", way.label.c_str(), 1e3 * t.compute / t.steps,
                  1e3 * t.allreduce / t.steps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "03_ring_allreduce: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
