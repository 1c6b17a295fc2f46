// Chapters 03 and 04 run the same training with several allreduces and compare them: these
// two functions are that comparison.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../02_data_parallel/data_parallel.h"

namespace ring {

// One way to sum a step's gradients, with a label for tables and plots and a short name for files.
struct NamedAllreduce {
  std::string label, run;
  std::unique_ptr<dp::GradientAllreduce> allreduce;
};

// Trains with each allreduce from the same start and the same batches (dp::train), writing
// <out>/<chapter>_<run>_k<K>.csv, and plots all of their curves in <out>/<chapter>.png.
void train_each(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                const std::string& chapter, const std::vector<const NamedAllreduce*>& ways);

// Prints one step's compute and allreduce time for each (dp::profile_steps, 20 steps).
void print_step_times(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                      const std::vector<NamedAllreduce>& ways);

}  // namespace ring
