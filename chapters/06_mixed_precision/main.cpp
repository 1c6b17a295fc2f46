// Chapter 06: mixed precision and gradient accumulation. Trains LeNet on k devices (--devices,
// default 2) with the GEMMs in --precision, fp32 master weights, dynamic loss scaling for fp16,
// gradients exchanged in 16 or 32 bits, and --accumulate micro-batches per step.
//   build/bin/06_mixed_precision [--precision bf16] [--accumulate 4] [--devices 2] [--epochs 10] ...
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "train.h"  // MixedTrainer, train: the mixed-precision step and its epoch loop

namespace {

const mgpu::ChapterInfo kChapter{"06_mixed_precision",
                                 "data-parallel LeNet in fp32, tf32, bf16 or fp16, with loss scaling and "
                                 "gradient accumulation",
                                 /*default_devices=*/2, /*max_devices=*/1024, /*default_lr=*/0.2f,
                                 /*eval_flag=*/false};

// The precision, the scaling, the gradients' bits and the accumulation, and what a step sends.
void say_recipe(const mgpu::Options& o, const mixed::MixedOptions& mo) {
  const int step_examples = o.batch_size * mo.accumulate;
  std::printf("precision %s (GEMM inputs; fp32 accumulation and master weights), loss scaling %s, gradients "
              "exchanged in %d bits (%s), %d micro-batch(es) of %d per step (%d examples a step)\n",
              mixed::name_of(mo.precision).c_str(), mo.loss_scaling ? "dynamic" : "none", mo.grad_bits,
              mo.nccl ? "NCCL" : "ring", mo.accumulate, o.batch_size, step_examples);
  const double wire = mixed::ring_bytes_per_device(mo, o.devices);
  std::printf("allreduced per step: a bucket of %zu bytes; each device sends %.0f bytes of it round the ring, "
              "%.1f bytes per training example\n",
              mixed::bucket_bytes(mo), wire, wire / step_examples);
}

// The run's files are named after the settings that differ from the defaults:
// 06_mixed_precision for fp32, 06_mixed_precision_precision-bf16_accumulate-4 for
// --precision bf16 --accumulate 4. Loss scaling and the gradients' bits are compared with
// what the precision chooses by itself (resolve_defaults): --precision fp16 alone scales.
mgpu::RunSettings run_settings(const mgpu::Options& o, const mixed::MixedOptions& mo) {
  const mixed::MixedOptions d;
  const bool sixteen = mixed::sixteen_bits(mo.precision);
  auto real = [](float x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return std::string(buf);
  };
  mgpu::RunSettings settings = mgpu::shared_settings(o, kChapter);
  settings.insert(settings.end(), {
      {"precision", mixed::name_of(mo.precision), mixed::name_of(d.precision)},
      {"loss-scale", mo.loss_scaling ? "dynamic" : "none", mo.precision == mixed::Precision::FP16 ? "dynamic" : "none"},
      {"initial-scale", real(mo.scaler.initial_scale), real(d.scaler.initial_scale)},
      {"scale-growth-interval", std::to_string(mo.scaler.growth_interval), std::to_string(d.scaler.growth_interval)},
      {"grad-bits", std::to_string(mo.grad_bits), sixteen ? "16" : "32"},
      {"accumulate", std::to_string(mo.accumulate), std::to_string(d.accumulate)},
      {"allreduce", mo.nccl ? "nccl" : "ring", "ring"},
      {"loss", mo.mean_loss ? "mean" : "sum", "sum"},
  });
  return settings;
}

// A second machine-readable line, what this chapter adds to the result line; then the loss
// scaler's CSV where it has something to say.
void report_scaler(const mgpu::Options& o, const mixed::MixedOptions& mo, const std::string& run,
                   const std::vector<mixed::ScalerEpoch>& scaler) {
  const int step_examples = o.batch_size * mo.accumulate;
  const double wire = mixed::ring_bytes_per_device(mo, o.devices);
  long skipped = 0;
  for (const mixed::ScalerEpoch& e : scaler) skipped += e.skipped;
  std::printf("mixed: precision=%s loss_scaling=%s grad_bits=%d accumulate=%d bucket_bytes=%zu "
              "ring_bytes_per_device=%.0f bytes_per_example=%.1f skipped_steps=%ld final_scale=%g loss=%s\n",
              mixed::name_of(mo.precision).c_str(), mo.loss_scaling ? "dynamic" : "none", mo.grad_bits, mo.accumulate,
              mixed::bucket_bytes(mo), wire, wire / step_examples, skipped, scaler.empty() ? 1.0 : scaler.back().scale,
              mo.mean_loss ? "mean" : "sum");
  if (mo.loss_scaling || mo.grad_bits == 16) {
    const std::string csv = mixed::write_scaler_csv(o.out, run, scaler);
    std::printf("wrote %s\n", csv.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  mixed::MixedFlags flags;
  mgpu::Options o = mgpu::parse_command_line(argc, argv, kChapter,
                                             [&flags](CLI::App& app) { mixed::add_mixed_flags(app, flags); });
  if (const std::string why = mixed::resolve_defaults(flags); !why.empty()) mgpu::refuse_command_line(kChapter.name, why);
  const mixed::MixedOptions& mo = flags.options;
  return mgpu::run_or_report(kChapter.name, [&] {
    const mgpu::DeviceSet devices(o.devices);
    std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, o.devices, devices.mapping().c_str(),
                mgpu::enable_peer_access(devices).c_str());
    const mgpu::FashionMnist data = mgpu::load_data(o);
    say_recipe(o, mo);
    const mgpu::RunSettings settings = run_settings(o, mo);
    const std::string run = mgpu::run_name(kChapter.name, o.run_name, settings);
    mgpu::TrainingLog log(kChapter.name, run, o, settings, o.devices, data.train.count);
    const std::vector<mixed::ScalerEpoch> scaler = mixed::train(devices, data, o, mo, log);
    log.finish();
    report_scaler(o, mo, run, scaler);
    return 0;
  });
}
