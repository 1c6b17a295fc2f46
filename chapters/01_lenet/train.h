// d2l's train() for one device: SGD over shuffled batches, test accuracy after every epoch,
// time per epoch over the training loop only.
#pragma once
#include "common/cli.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/profile.h"
#include "common/report.h"
#include "lenet.h"

namespace lenet {

// Trains from init_params(o.seed) on devices[0]; prints one line per epoch into `log` and
// returns the final parameters.
HostParams train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                 mgpu::TrainingLog& log);

// One training step on the first batch, kernel by kernel (common/profile.h), after one untimed
// step that warms up (first touch of memory, library setup): the table's rows, and the step's
// wall time measured separately, without the profile's events or clock reads.
struct StepProfile {
  std::vector<mgpu::KernelStats> kernels;
  double wall_seconds = 0;
};
StepProfile profile_step(const mgpu::Device& d, const mgpu::FashionMnist& data, const mgpu::Options& o);

}  // namespace lenet
