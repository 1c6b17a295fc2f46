// Chapter 02's training loop, and where a step's time goes.
//
//   train          d2l's train(num_gpus, batch_size, lr): train_batch as the step of the epoch loop
//                  every chapter shares (common/train_loop.h), then the test set
//   profile_steps  the same train_batch, timed phase by phase by a probe (common/probe.h)
#pragma once
#include <vector>

#include "common/cli.h"
#include "common/collective.h"
#include "common/report.h"
#include "data_parallel.h"

namespace dp {

// d2l's train(num_gpus, batch_size, lr) on `devices`, summing gradients with `allreduce` (made
// for the same devices, with room for largest_gradient_sum(layout) elements): returns the final
// parameters of device 0. `layout`: how the replicas store their gradients (see Replica).
lenet::HostParams train(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        mgpu::Collective& allreduce, mgpu::TrainingLog& log,
                        lenet::Layout layout = lenet::Layout::PerTensor);

// Where one step's time goes, in seconds, summed over the steps measured.
struct StepTimes {
  double split = 0, compute = 0, allreduce = 0, update = 0;
  // Device i's own forward and backward pass inside the compute phase: when its stream began
  // and ended that work, in seconds from the phase's start. Devices that compute at the same
  // time have spans that overlap; devices that take turns have spans that follow each other.
  std::vector<double> compute_began, compute_ended;  // [k]
  int steps = 0;
};

// Times `steps` training steps phase by phase (from init_params(o.seed), on fresh replicas):
// train_batch with a mgpu::PhaseTimer, which synchronizes the devices after each phase.
StepTimes profile_steps(const DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                        mgpu::Collective& allreduce, int steps, lenet::Layout layout = lenet::Layout::PerTensor);

}  // namespace dp
