// Chapter 09: d2l's ResNet-18 (section 13.6) from a small layer library, data parallel on k
// devices, with BatchNorm per device (d2l's DataParallel) or synchronized (SyncBN).
//   build/bin/09_resnet [--width 64] [--devices 1] [--bn device|sync] [-b 256] [--lr 0.1] ...
#include <cstdio>
#include <string>

#include "common/batches.h"  // largest_batch
#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/fashion_mnist.h"  // load_fashion_mnist: the dataset, found and checked
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "train.h"  // train, profile_step: ResNet-18's epoch loop (train.cpp); the network in resnet.h

namespace {

const mgpu::ChapterInfo kChapter{"09_resnet", "d2l's ResNet-18 from scratch, data parallel, BatchNorm per device or synced",
                                 /*default_devices=*/1, /*max_devices=*/1024, /*default_lr=*/0.1f};  // d2l 13.6's 1-GPU recipe

// The network, and how this run computes it: BatchNorm, the collective, the GEMMs (the precision
// asked for where this build can, a GPU, else fp32) and the layer kernels.
void say_network(const resnet::ResnetOptions& ro) {
  const resnet::Network net(ro.width);
  std::printf("ResNet-18, width %d (stages of %d, %d, %d, %d channels): %lld parameters, %.0f MFLOP per training "
              "image (forward and backward)\n",
              ro.width, ro.width, 2 * ro.width, 4 * ro.width, 8 * ro.width,
              static_cast<long long>(net.parameter_count()), net.training_flops_per_image() / 1e6);
  const mgpu::GemmPrecision precision = mgpu::precision_in_this_build(ro.precision);
  const std::string gemms =
      precision == mgpu::GemmPrecision::Fp32
          ? (ro.precision == mgpu::GemmPrecision::Fp32 ? "fp32" : "fp32 (--precision chooses for GPUs only)")
          : std::string(mgpu::to_string(precision)) + " inputs on tensor cores";
  std::string kernels = ro.kernels->name();
  if (const char* p = ro.kernels->convolution_precision()) kernels += std::string(" (") + p + " in the convolutions it takes)";
  std::printf("BatchNorm statistics: %s; collective: %s; GEMMs: %s; layer kernels: %s\n",
              ro.bn == resnet::BatchNormMode::Sync ? "synchronized over all devices (SyncBN)"
                                                   : "per device (as d2l's nn.DataParallel)",
              resnet::name_of(ro.collective).c_str(), gemms.c_str(), kernels.c_str());
  if (ro.graph)
    std::printf("each full batch's step: %s\n", mgpu::kCudaBackend
                                                   ? "recorded once as a CUDA graph, then replayed (--graph on)"
                                                   : "replayed (--graph on; the cpu backend has no launch cost to save)");
}

// --profile on: one training step, device 0's kernels one by one, before training.
void print_step_profile(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        const resnet::ResnetOptions& ro) {
  const resnet::StepProfile p = resnet::profile_step(devices, data, o, ro);
  std::printf("\none training step of %d images on %d device(s), device 0's kernels (%s):\n%s"
              "the same step without the profile's timers: %.1f ms\n\n",
              mgpu::largest_batch(o.batch_size, data.train.count), o.devices, mgpu::kBackendName,
              mgpu::format_profile(p.kernels).c_str(), p.wall_seconds * 1e3);
}

// The run's files are named after the settings that differ from the defaults: 09_resnet for
// d2l's recipe, 09_resnet_devices-2_width-16_bn-sync for SyncBN on a sixteenth of the width.
// The precision is the one the GEMMs used (on a CPU, fp32 whatever was asked), and the
// collective's default the one this machine picks (resolve_collective).
mgpu::RunSettings run_settings(const mgpu::Options& o, const resnet::ResnetOptions& ro) {
  resnet::ResnetOptions d;
  resnet::resolve_collective(d, o.devices);
  mgpu::RunSettings settings = mgpu::shared_settings(o, kChapter);
  settings.insert(settings.end(),
                  {{"width", std::to_string(ro.width), std::to_string(d.width)},
                   {"bn", ro.bn == resnet::BatchNormMode::Sync ? "sync" : "device", "device"},
                   {"allreduce", resnet::name_of(ro.collective), resnet::name_of(d.collective)},
                   {"precision", mgpu::to_string(mgpu::precision_in_this_build(ro.precision)),
                    mgpu::to_string(d.precision)},
                   {"kernels", ro.kernels->name(), d.kernels->name()},
                   {"profile", ro.profile ? "on" : "off", "off"},
                   {"graph", ro.graph ? "on" : "off", "off"}});
  return settings;
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  resnet::ResnetOptions ro;
  const mgpu::Options o =
      mgpu::parse_command_line(argc, argv, kChapter, [&ro](CLI::App& app) { resnet::add_resnet_flags(app, ro); });
  if (const std::string why = resnet::resolve_collective(ro, o.devices); !why.empty())
    mgpu::refuse_command_line(kChapter.name, why);
  if (const std::string why = resnet::check_kernels_precision(ro); !why.empty())
    mgpu::refuse_command_line(kChapter.name, why);
  if (const std::string why = resnet::check_graph(ro, o.devices); !why.empty())
    mgpu::refuse_command_line(kChapter.name, why);
  return mgpu::run_or_report(kChapter.name, [&] {
    const mgpu::DeviceSet devices(o.devices);
    std::printf("backend %s, %d logical device(s)\n%s%s", mgpu::kBackendName, o.devices, devices.mapping().c_str(),
                o.devices > 1 ? mgpu::enable_peer_access(devices).c_str() : "");
    say_network(ro);
    const mgpu::FashionMnist data = mgpu::load_data(o);
    if (ro.profile) print_step_profile(devices, data, o, ro);
    if (!ro.dump_step.empty()) {
      resnet::dump_step(devices, data, o, ro);
      return 0;
    }
    const mgpu::RunSettings settings = run_settings(o, ro);
    const std::string run = mgpu::run_name(kChapter.name, o.run_name, settings);
    mgpu::TrainingLog log(kChapter.name, run, o, settings, o.devices, data.train.count);
    resnet::train(devices, data, o, ro, log);
    log.finish();
    return 0;
  });
}
