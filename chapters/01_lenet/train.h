// d2l's train() for one device: SGD over shuffled batches, test accuracy after every epoch,
// time per epoch over the training loop only.
#pragma once
#include "common/cli.h"
#include "common/device.h"
#include "common/fashion_mnist.h"
#include "common/report.h"
#include "lenet.h"

namespace lenet {

// Trains from init_params(o.seed) on devices[0]; prints one line per epoch into `log` and
// returns the final parameters.
HostParams train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                 mgpu::TrainingLog& log);

}  // namespace lenet
