// Chapter 01: LeNet from raw parameter arrays, trained on one device.
//   build/bin/01_lenet [--epochs 10] [-b 256] [--lr 0.2] ...   (--help for all)
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>  // CLI::App: where the chapter declares its own flags

#include "common/batches.h"  // largest_batch
#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/fashion_mnist.h"  // load_fashion_mnist: the dataset, found and checked
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "train.h"  // train, profile_step: the epoch loop (train.cpp); the model in lenet.h

namespace {

// --profile on: one training step kernel by kernel, before training.
void print_step_profile(const mgpu::Device& d, const mgpu::FashionMnist& data, const mgpu::Options& o) {
  const lenet::StepProfile p = lenet::profile_step(d, data, o);
  std::printf("\none training step of %d images, kernel by kernel (%s):\n%s"
              "the same step without the profile's timers: %.1f us\n\n",
              mgpu::largest_batch(o.batch_size, data.train.count), mgpu::kBackendName,
              mgpu::format_profile(p.kernels).c_str(), p.wall_seconds * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"01_lenet", "d2l's LeNet from raw parameter arrays, trained on one device",
                                  /*default_devices=*/1, /*max_devices=*/1};
  // The shared flags, and this chapter's own: --profile on|off, --graph on|off.
  bool profile = false, graph = true;
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter, [&](CLI::App& app) {
    mgpu::add_on_off(app, "--profile", profile,
                     "before training, time one step kernel by kernel and print the table");
    mgpu::add_on_off(app, "--graph", graph,
                     "record one training step and replay it for every full batch (a CUDA graph on a GPU: "
                     "one launch instead of dozens)");
  });
  return mgpu::run_or_report(chapter.name, [&] {
    const mgpu::DeviceSet devices(1);
    std::printf("backend %s, %lld parameters\n%s", mgpu::kBackendName,
                static_cast<long long>(lenet::parameter_count()), devices.mapping().c_str());
    const mgpu::FashionMnist data = mgpu::load_data(o);
    if (profile) print_step_profile(devices[0], data, o);
    // The run's files are named after the settings that differ from the defaults: 01_lenet for
    // d2l's recipe, 01_lenet_epochs-5_batch-size-64_limit-train-10000 for the quick look.
    mgpu::RunSettings settings = mgpu::shared_settings(o, chapter);
    settings.push_back({"profile", profile ? "on" : "off", "off"});
    settings.push_back({"graph", graph ? "on" : "off", "on"});
    mgpu::TrainingLog log(chapter.name, mgpu::run_name(chapter.name, o.run_name, settings), o, settings,
                          devices.size(), data.train.count);
    std::printf("training step: %s\n",
                !graph               ? "queued kernel by kernel (--graph off)"
                : mgpu::kCudaBackend ? "recorded once as a CUDA graph, replayed for every full batch (--graph on)"
                                     : "replayed for every full batch (--graph on; the cpu backend has no launch cost to save)");
    lenet::train(devices, data, o, log, graph);
    log.finish();
    return 0;
  });
}
