// Chapter 06: mixed precision and gradient accumulation. Trains LeNet on k devices (--devices,
// default 2) with the GEMMs in --precision, fp32 master weights, dynamic loss scaling for fp16,
// gradients exchanged in 16 or 32 bits, and --accumulate micro-batches per step.
//   build/bin/06_mixed_precision [--precision bf16] [--accumulate 4] [--devices 2] [--epochs 10] ...
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/program.h"  // start_program: line-buffered output, OpenMP's waits
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "train.h"  // MixedTrainer, train: the mixed-precision step and its epoch loop

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"06_mixed_precision",
                                  "data-parallel LeNet in fp32, tf32, bf16 or fp16, with loss scaling and "
                                  "gradient accumulation",
                                  /*default_devices=*/2, /*max_devices=*/1024, /*default_lr=*/0.2f,
                                  /*eval_flag=*/false};
  mixed::MixedFlags flags;
  mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter,
                                             [&flags](CLI::App& app) { mixed::add_mixed_flags(app, flags); });
  if (const std::string why = mixed::resolve_defaults(flags); !why.empty()) mgpu::refuse_command_line(chapter.name, why);
  const mixed::MixedOptions& mo = flags.options;
  try {
    const mgpu::DeviceSet devices(o.devices);
    std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, o.devices, devices.mapping().c_str(),
                mgpu::enable_peer_access(devices).c_str());
    const mgpu::FashionMnist data = mgpu::load_fashion_mnist(o.data_dir, o.limit_train);
    std::printf("Fashion-MNIST from %s: %d training, %d test images\n", data.dir.c_str(), data.train.count,
                data.test.count);
    const int step_examples = o.batch_size * mo.accumulate;
    std::printf("precision %s (GEMM inputs; fp32 accumulation and master weights), loss scaling %s, gradients "
                "exchanged in %d bits (%s), %d micro-batch(es) of %d per step (%d examples a step)\n",
                mixed::name_of(mo.precision).c_str(), mo.loss_scaling ? "dynamic" : "none", mo.grad_bits,
                mo.nccl ? "NCCL" : "ring", mo.accumulate, o.batch_size, step_examples);
    const double wire = mixed::ring_bytes_per_device(mo, o.devices);
    std::printf("allreduced per step: a bucket of %zu bytes; each device sends %.0f bytes of it round the ring, "
                "%.1f bytes per training example\n",
                mixed::bucket_bytes(mo), wire, wire / step_examples);

    // The run's files are named after what changes: 06_mixed_precision_bf16_g16_b256_m1_k2.csv
    const std::string run = chapter.name + "_" + mixed::name_of(mo.precision) + (mo.loss_scaling ? "_scaled" : "") +
                            (mo.mean_loss ? "_mean" : "") + "_g" + std::to_string(mo.grad_bits) + "_b" +
                            std::to_string(o.batch_size) + "_m" + std::to_string(mo.accumulate) + "_k" +
                            std::to_string(o.devices);
    mgpu::TrainingLog log(chapter.name, run, o, o.devices, data.train.count);
    const std::vector<mixed::ScalerEpoch> scaler = mixed::train(devices, data, o, mo, log);
    log.finish();
    long skipped = 0;
    for (const mixed::ScalerEpoch& e : scaler) skipped += e.skipped;
    // A second machine-readable line: what this chapter adds to the result line.
    std::printf("mixed: precision=%s loss_scaling=%s grad_bits=%d accumulate=%d bucket_bytes=%zu "
                "ring_bytes_per_device=%.0f bytes_per_example=%.1f skipped_steps=%ld final_scale=%g loss=%s\n",
                mixed::name_of(mo.precision).c_str(), mo.loss_scaling ? "dynamic" : "none", mo.grad_bits, mo.accumulate,
                mixed::bucket_bytes(mo), wire, wire / step_examples, skipped, scaler.empty() ? 1.0 : scaler.back().scale,
                mo.mean_loss ? "mean" : "sum");
    if (mo.loss_scaling || mo.grad_bits == 16) {
      const std::string csv = mixed::write_scaler_csv(o.out, run, scaler);
      std::printf("wrote %s\n", csv.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "06_mixed_precision: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
