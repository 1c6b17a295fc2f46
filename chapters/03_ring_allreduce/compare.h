// Chapters 03 and 04 run the same training with several allreduces and compare them: these
// two functions are that comparison.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../02_data_parallel/train.h"  // the lesson here is chapter 02's training, with another collective
#include "common/collective.h"

namespace ring {

// One way to sum a step's gradients: a collective, and how the replicas hand their gradients
// to it (tensor by tensor, or one flat bucket); a label for tables and plots, a short name for files.
struct GradientSum {
  std::string label, run;
  lenet::Layout layout;
  std::unique_ptr<mgpu::Collective> collective;
};

// Trains with each way from the same start and the same batches (dp::train), writing each
// way's files as <out>/<name>_<run>.csv (.json, .png), and plots all of their curves in
// <out>/<name>.png; <name> is the program's run name (mgpu::run_name: 03_ring_allreduce for
// the defaults, 03_ring_allreduce_devices-4 for --devices 4).
void train_each(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                const mgpu::ChapterInfo& chapter, const std::vector<const GradientSum*>& ways);

// Prints one step's compute and allreduce time for each (dp::profile_steps, 20 steps).
void print_step_times(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                      const std::vector<GradientSum>& ways);

}  // namespace ring
