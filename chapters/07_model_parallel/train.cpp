#include "train.h"

#include "common/train_loop.h"

namespace pp {

void train(Pipeline& pipeline, const mgpu::FashionMnist& data, const mgpu::Options& o, mgpu::TrainingLog& log) {
  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): the pipeline's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    pipeline.reset_metrics();
    pipeline.set_order(order);
  };
  loop.step = [&](const mgpu::BatchOf& b) { pipeline.step(b.first, b.size, b.lr); };
  loop.synchronize = [&] { pipeline.synchronize(); };
  for (int s = 0; s < pipeline.stages(); ++s) {  // the progress line counts the batches they have finished
    const std::vector<mgpu::Device>& stage = pipeline.stage_devices(s).all();
    loop.devices.insert(loop.devices.end(), stage.begin(), stage.end());
  }
  loop.train_metrics = [&] {
    const auto [loss, hits] = pipeline.read_metrics();
    return mgpu::LossAndHits{loss, hits};
  };
  loop.test_accuracy = [&] { return pipeline.evaluate(data.test, o.batch_size); };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, &log);
}

}  // namespace pp
