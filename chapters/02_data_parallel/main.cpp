// Chapter 02: data-parallel training from scratch. Trains LeNet on 1 device, then on k
// (--devices, default 2), from the same initial weights and the same batches, and compares.
// --trainer picks the step: ddp (data_parallel.h, the default) or dataparallel (nn_data_parallel.h, PyTorch's nn.DataParallel).
//   build/bin/02_data_parallel [--devices 2] [--trainer ddp] [--epochs 10] [-b 256] ...
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>  // CLI::App: where the chapter declares its own flags

#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "data_parallel.h"  // get_params, Allreduce, split_batch, train_batch: d2l 13.5
#include "nn_data_parallel.h"  // DataParallel: PyTorch's nn.DataParallel step, for comparison
#include "train.h"  // train, profile_steps: the epoch loop and where a step's time goes

namespace {

const mgpu::ChapterInfo kChapter{"02_data_parallel",
                                 "d2l's data-parallel LeNet: get_params, allreduce, split_batch, train_batch",
                                 /*default_devices=*/2, /*max_devices=*/1024};

// This chapter's own flags: --trainer ddp|dataparallel, --baseline on|off.
struct Flags {
  bool dataparallel = false, baseline = true;
};

mgpu::Options parse_flags(int argc, char** argv, Flags& f) {
  return mgpu::parse_command_line(argc, argv, kChapter, [&](CLI::App& app) {
    app.add_option_function<std::string>(
           "--trainer", [&f](const std::string& v) { f.dataparallel = v == "dataparallel"; },
           "ddp: every device steps, gradients allreduced; dataparallel: torch.nn.DataParallel's step, "
           "device 0 holds the master parameters, the loss and the update (and evaluates)")
        ->check(CLI::IsMember({"ddp", "dataparallel"}))
        ->default_str("ddp");
    mgpu::add_on_off(app, "--baseline", f.baseline,
                     "train on 1 device first, then on --devices, and compare; off: the --devices run alone");
  });
}

void say_devices(int k) {
  const mgpu::DeviceSet all(k);
  std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, k, all.mapping().c_str(),
              mgpu::enable_peer_access(all).c_str());
}

// The 1-device run is the baseline the k-device run is compared with (same start, same
// batches); --baseline off skips it. Each run's files are the program's name (from the settings
// that differ from the defaults, `name`) and its device count: 02_data_parallel_k1 and _k2 for
// the defaults, 02_data_parallel_devices-4_k1 and _k4 for --devices 4. Both runs claim their
// files now, so that a name taken by another run stops the program before any training.
std::vector<mgpu::TrainingLog> claim_runs(const mgpu::Options& o, const Flags& f, int train_count, std::string& name) {
  mgpu::RunSettings settings = mgpu::shared_settings(o, kChapter);
  settings.push_back({"trainer", f.dataparallel ? "dataparallel" : "ddp", "ddp"});
  settings.push_back({"baseline", f.baseline ? "on" : "off", "on"});
  name = mgpu::run_name(kChapter.name, o.run_name, settings);
  std::vector<mgpu::TrainingLog> logs;
  for (int k : f.baseline ? std::set<int>{1, o.devices} : std::set<int>{o.devices})
    logs.emplace_back(kChapter.name, name + "_k" + std::to_string(k), o, settings, k, train_count);
  return logs;
}

// --trainer dataparallel: PyTorch's nn.DataParallel step, and what it moves.
void train_like_dataparallel(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                             mgpu::TrainingLog& log) {
  const dp::DataParallelRun r = dp::train_dataparallel(devices, data, o, log);
  std::printf("bytes moved between devices per step: %zu (a whole batch of %d), %.0f on average over the run\n",
              r.bytes_per_full_step, o.batch_size, r.mean_bytes_per_step);
  std::printf("device 0's extra memory (beyond a DDP replica's): %zu bytes\n", r.device0_extra_bytes);
}

// Where a step's time goes, phase by phase, and the compute phase device by device: spans that
// overlap mean the devices ran at once.
void print_step_times(const dp::StepTimes& t, int k) {
  const double ms = 1e3 / t.steps;
  std::printf("per step (mean of %d, devices synchronized between phases): split %.2f ms, compute %.2f ms, "
              "allreduce %.3f ms, sgd %.3f ms\n",
              t.steps, t.split * ms, t.compute * ms, t.allreduce * ms, t.update * ms);
  if (static_cast<int>(t.compute_began.size()) != k) {  // a train_batch that tells its probe nothing of the devices
    std::printf("  (train_batch did not tell its probe when each device computed: no spans to show)\n");
    return;
  }
  double busy = 0;
  for (int i = 0; i < k; ++i) {
    std::printf("  device %d computes from %.2f to %.2f ms of the compute phase\n", i, t.compute_began[i] * ms,
                t.compute_ended[i] * ms);
    busy += t.compute_ended[i] - t.compute_began[i];
  }
  if (k == 1) return;
  std::printf("  the devices' compute adds up to %.2f ms in a phase of %.2f ms: %.2f devices busy at once "
              "on average\n",
              busy * ms, t.compute * ms, busy / t.compute);
  // On a CPU a device is a share of the cores: with more devices than cores, "busy" devices
  // are queued work taking turns, not work running at once.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (!mgpu::kCudaBackend && cores > 0 && k > cores)
    std::printf("  (on %d core(s): at most %d device(s) compute at once; the spans of the others overlap "
                "because their work waits, not because it runs)\n",
                cores, cores);
}

// --trainer ddp: d2l's train with d2l's allreduce (gather on device 0, broadcast back, tensor by
// tensor: room for the largest tensor), then where a step's time goes, measured apart from the
// run (the synchronization that measuring needs would slow the run down).
void train_like_ddp(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                    mgpu::TrainingLog& log) {
  dp::Allreduce allreduce(devices, dp::largest_gradient_sum(lenet::Layout::PerTensor));
  dp::train(devices, data, o, allreduce, log);
  print_step_times(dp::profile_steps(devices, data, o, allreduce, 20), devices.size());
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  Flags f;
  const mgpu::Options o = parse_flags(argc, argv, f);
  return mgpu::run_or_report(kChapter.name, [&] {
    say_devices(o.devices);
    const mgpu::FashionMnist data = mgpu::load_data(o);
    // Refuse now, before the 1-device run, what would stop the k-device run (dp::train checks
    // its own devices only). A bad --out is refused by the first TrainingLog, also before any step.
    mgpu::check_batches_fit(data.train.count, o.batch_size, o.devices);
    std::string name;
    std::vector<mgpu::TrainingLog> logs = claim_runs(o, f, data.train.count, name);
    std::vector<std::pair<std::string, std::string>> runs;  // (label, csv) for the plot
    for (mgpu::TrainingLog& log : logs) {
      const int k = log.devices();
      std::printf("\n== training on %d device(s), batch %d (%s per device), %sevaluating on %s\n", k, o.batch_size,
                  k == 1 ? "all of it" : "a shard", f.dataparallel ? "DataParallel's step, " : "",
                  o.eval_all_devices && !f.dataparallel ? "all devices" : "device 0");
      const mgpu::DeviceSet devices(k);
      if (k > 1) mgpu::enable_peer_access(devices);
      if (f.dataparallel)
        train_like_dataparallel(devices, data, o, log);
      else
        train_like_ddp(devices, data, o, log);
      log.finish();
      runs.emplace_back(std::to_string(k) + " device" + (k > 1 ? "s" : ""), log.csv_path());
    }
    const std::string png = (std::filesystem::path(o.out) / (name + ".png")).string();
    const std::string compared = f.baseline ? "1 device vs " + std::to_string(o.devices) : std::to_string(o.devices) + " devices";
    if (mgpu::plot_runs(png, name + ": " + compared + " (" + mgpu::kBackendName + ")", runs))
      std::printf("wrote %s\n", png.c_str());
    return 0;
  });
}
