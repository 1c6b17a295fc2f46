// Chapter 07's training: d2l's train() over a pipeline (pipeline.h), in the epoch loop every
// chapter shares (common/train_loop.h); what is new is inside Pipeline::step.
#pragma once
#include "common/cli.h"
#include "common/fashion_mnist.h"
#include "common/report.h"
#include "pipeline.h"

namespace pp {

// --epochs epochs of shuffled batches through `pipeline` (made for batches of up to
// --batch-size, with data.train already on its devices: set_training_data), one line per
// epoch through `log`, with the test accuracy of the pipeline's parameters.
void train(Pipeline& pipeline, const mgpu::FashionMnist& data, const mgpu::Options& o, mgpu::TrainingLog& log);

}  // namespace pp
