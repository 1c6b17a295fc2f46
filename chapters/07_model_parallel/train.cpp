#include "train.h"

#include "common/batches.h"
#include "common/timer.h"

namespace pp {

void train(Pipeline& pipeline, const mgpu::FashionMnist& data, const mgpu::Options& o, mgpu::TrainingLog& log) {
  mgpu::ShuffledBatches batches(data.train.count, o.batch_size, o.seed);
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    pipeline.reset_metrics();
    pipeline.synchronize();
    const double start = mgpu::steady_seconds();
    batches.start_epoch(epoch);
    pipeline.set_order(batches.order());
    for (int b = 0; b < batches.count(); ++b) {
      pipeline.step(b * o.batch_size, batches.size(b), mgpu::learning_rate_at(o, epoch, b, batches.count()));
      log.progress(epoch + 1, b, batches.count());
    }
    pipeline.synchronize();
    mgpu::EpochRecord r;
    r.seconds = mgpu::steady_seconds() - start;
    const auto [loss, hits] = pipeline.read_metrics();
    r.epoch = epoch + 1;
    r.train_loss = loss / data.train.count;
    r.train_acc = hits / data.train.count;
    r.test_acc = pipeline.evaluate(data.test, o.batch_size);
    log.end_epoch(r);
  }
}

}  // namespace pp
