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
#include "common/memory.h"  // error_text
#include "common/program.h"  // start_program: line-buffered output, OpenMP's waits
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "data_parallel.h"  // get_params, Allreduce, split_batch, train_batch: d2l 13.5
#include "nn_data_parallel.h"  // DataParallel: PyTorch's nn.DataParallel step, for comparison
#include "train.h"  // train, profile_steps: the epoch loop and where a step's time goes

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"02_data_parallel",
                                  "d2l's data-parallel LeNet: get_params, allreduce, split_batch, train_batch",
                                  /*default_devices=*/2, /*max_devices=*/1024};
  // The shared flags, and this chapter's own: --trainer ddp|dataparallel, --baseline on|off.
  bool dataparallel = false, baseline = true;
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter, [&](CLI::App& app) {
    app.add_option_function<std::string>(
           "--trainer", [&dataparallel](const std::string& v) { dataparallel = v == "dataparallel"; },
           "ddp: every device steps, gradients allreduced; dataparallel: torch.nn.DataParallel's step, "
           "device 0 holds the master parameters, the loss and the update (and evaluates)")
        ->check(CLI::IsMember({"ddp", "dataparallel"}))
        ->default_str("ddp");
    mgpu::add_on_off(app, "--baseline", baseline,
                     "train on 1 device first, then on --devices, and compare; off: the --devices run alone");
  });
  try {
    {
      const mgpu::DeviceSet all(o.devices);
      std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, o.devices, all.mapping().c_str(),
                  mgpu::enable_peer_access(all).c_str());
    }
    const mgpu::FashionMnist data = mgpu::load_fashion_mnist(o.data_dir, o.limit_train);
    std::printf("Fashion-MNIST from %s: %d training, %d test images\n", data.dir.c_str(), data.train.count,
                data.test.count);
    // Refuse now, before the 1-device run, what would stop the k-device run (dp::train checks
    // its own devices only). A bad --out is refused by the first TrainingLog, also before any step.
    mgpu::check_batches_fit(data.train.count, o.batch_size, o.devices);

    // The 1-device run is the baseline the k-device run is compared with (same start, same
    // batches); --baseline off skips it. Each run's files are the program's name (from the
    // settings that differ from the defaults) and its device count: 02_data_parallel_k1 and
    // _k2 for the defaults, 02_data_parallel_devices-4_k1 and _k4 for --devices 4. Both runs
    // claim their files now, so that a name taken by another run stops the program before any
    // training.
    mgpu::RunSettings settings = mgpu::shared_settings(o, chapter);
    settings.push_back({"trainer", dataparallel ? "dataparallel" : "ddp", "ddp"});
    settings.push_back({"baseline", baseline ? "on" : "off", "on"});
    const std::string name = mgpu::run_name(chapter.name, o.run_name, settings);
    const std::set<int> device_counts = baseline ? std::set<int>{1, o.devices} : std::set<int>{o.devices};
    std::vector<mgpu::TrainingLog> logs;
    for (int k : device_counts)
      logs.emplace_back(chapter.name, name + "_k" + std::to_string(k), o, settings, k, data.train.count);

    std::vector<std::pair<std::string, std::string>> runs;  // (label, csv) for the plot
    for (mgpu::TrainingLog& log : logs) {
      const int k = log.devices();
      std::printf("\n== training on %d device(s), batch %d (%s per device), %sevaluating on %s\n", k, o.batch_size,
                  k == 1 ? "all of it" : "a shard", dataparallel ? "DataParallel's step, " : "",
                  o.eval_all_devices && !dataparallel ? "all devices" : "device 0");
      const mgpu::DeviceSet devices(k);
      if (k > 1) mgpu::enable_peer_access(devices);
      if (dataparallel) {
        const dp::DataParallelRun r = dp::train_dataparallel(devices, data, o, log);
        std::printf("bytes moved between devices per step: %zu (a whole batch of %d), %.0f on average over the run\n",
                    r.bytes_per_full_step, o.batch_size, r.mean_bytes_per_step);
        std::printf("device 0's extra memory (beyond a DDP replica's): %zu bytes\n", r.device0_extra_bytes);
        log.finish();
        runs.emplace_back(std::to_string(k) + " device" + (k > 1 ? "s" : ""), log.csv_path());
        continue;
      }
      // d2l's: gather on device 0, broadcast back, tensor by tensor (so room for the largest tensor)
      dp::Allreduce allreduce(devices, dp::largest_gradient_sum(lenet::Layout::PerTensor));
      dp::train(devices, data, o, allreduce, log);

      // Where a step's time goes, measured apart from the run above (the synchronization
      // that measuring needs would slow the run down).
      const dp::StepTimes t = dp::profile_steps(devices, data, o, allreduce, 20);
      const double ms = 1e3 / t.steps;
      std::printf("per step (mean of %d, devices synchronized between phases): split %.2f ms, compute %.2f ms, "
                  "allreduce %.3f ms, sgd %.3f ms\n",
                  t.steps, t.split * ms, t.compute * ms, t.allreduce * ms, t.update * ms);
      // The compute phase device by device: spans that overlap mean the devices ran at once.
      double busy = 0;
      for (int i = 0; i < k; ++i) {
        std::printf("  device %d computes from %.2f to %.2f ms of the compute phase\n", i, t.compute_began[i] * ms,
                    t.compute_ended[i] * ms);
        busy += t.compute_ended[i] - t.compute_began[i];
      }
      if (k > 1) {
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
      log.finish();
      runs.emplace_back(std::to_string(k) + " device" + (k > 1 ? "s" : ""), log.csv_path());
    }
    const std::string png = (std::filesystem::path(o.out) / (name + ".png")).string();
    const std::string compared = baseline ? "1 device vs " + std::to_string(o.devices) : std::to_string(o.devices) + " devices";
    if (mgpu::plot_runs(png, name + ": " + compared + " (" + mgpu::kBackendName + ")", runs))
      std::printf("wrote %s\n", png.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "02_data_parallel: error: %s\n", mgpu::error_text(e).c_str());
    return 1;
  }
  return 0;
}
