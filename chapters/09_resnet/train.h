// d2l 13.6's train(net, num_gpus, batch_size, lr) for the scratch ResNet-18: data parallel on k
// devices with chapter 02's way of splitting a batch, a collective of chapters 02-04 for the
// gradients (and for SyncBN's sums), and one SGD step on every device.
#pragma once
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/gemm.h"
#include "common/profile.h"
#include "common/report.h"
#include "resnet.h"

namespace resnet {

// Which collective sums across devices:
//   Ring   chapter 03's ring (every backend)
//   Naive  chapter 02's: everything through device 0
//   Nccl   chapter 04's ncclAllReduce (the cuda build with NCCL, one device per GPU)
enum class CollectiveKind { Ring, Naive, Nccl };
std::string name_of(CollectiveKind c);
std::string name_of(BatchNormMode m);

// This chapter's own flags, beside the shared ones.
struct ResnetOptions {
  int width = 64;
  BatchNormMode bn = BatchNormMode::PerDevice;
  CollectiveKind collective = CollectiveKind::Ring;
  bool collective_given = false;  // --allreduce given (else: NCCL where it can run, the ring elsewhere)
  mgpu::GemmPrecision precision = mgpu::GemmPrecision::Fp32;  // --precision: the GEMMs' (cuda build)
  // --kernels: the table of layer kernels (layers.h): the reference, or one a later chapter registered
  const nn::LayerKernels* kernels = &nn::default_layer_kernels();
  std::string dump_step;          // --dump-step DIR: one step written out for crosscheck.py
  bool profile = false;           // --profile on: one step, kernel by kernel, before training
  bool graph = false;             // --graph on: one device's step recorded once, then replayed (a CUDA graph)
};
// Declares them on the program's CLI11 app (parse_command_line's own flags).
void add_resnet_flags(CLI::App& app, ResnetOptions& ro);
// The collective this machine will use: the one asked for, or the default; refuses NCCL where
// it cannot run (returns the reason; empty: fine).
std::string resolve_collective(ResnetOptions& ro, int devices);
// Why the table of layer kernels cannot run at the chosen precision ("" if it can): a table whose
// convolutions multiply in a precision of their own (chapter 10's tensor, bf16) needs that --precision.
std::string check_kernels_precision(const ResnetOptions& ro);
// Why --graph on cannot run on `devices` devices ("" if it can): it records one device's step.
std::string check_graph(const ResnetOptions& ro, int devices);

// Trains from init_params(o.seed) on `devices`; prints one line per epoch into `log`. With
// ro.graph, *replayed_steps (if given) says how many steps replayed the recorded one.
void train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
           const ResnetOptions& ro, mgpu::TrainingLog& log, long* replayed_steps = nullptr);

// Device 0's kernels during one training step on the first batch (after one untimed step that
// warms up), as common/profile.h tables them; and the step's wall time without the profile.
struct StepProfile {
  std::vector<mgpu::KernelStats> kernels;
  double wall_seconds = 0;
};
StepProfile profile_step(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                         const ResnetOptions& ro);

// One training step on the first o.batch_size training images (in order, no shuffle), split over
// the devices, written to ro.dump_step in PyTorch's layouts for crosscheck.py (see README).
void dump_step(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
               const ResnetOptions& ro);

}  // namespace resnet
