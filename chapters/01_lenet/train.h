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
// returns the final parameters. capture_step (--graph on): after the first step, every step of
// a full batch at the final rate (o.lr; warm-up steps and the last short batch are not) gathers
// its batch and then replays one recorded step (mgpu::CapturedWork: a CUDA graph on a GPU) instead
// of queueing its kernels one by one. The arithmetic is the same either way. replayed_steps, if
// given, receives how many steps replayed the recorded one (what the tests check).
HostParams train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                 mgpu::TrainingLog& log, bool capture_step = true, long* replayed_steps = nullptr);

// One training step on the first batch, kernel by kernel (common/profile.h), after one untimed
// step that warms up (first touch of memory, library setup): the table's rows, and the step's
// wall time measured separately, without the profile's events or clock reads.
struct StepProfile {
  std::vector<mgpu::KernelStats> kernels;
  double wall_seconds = 0;
};
StepProfile profile_step(const mgpu::Device& d, const mgpu::FashionMnist& data, const mgpu::Options& o);

}  // namespace lenet
