#include "train_loop.h"

#include "check.h"
#include "device.h"  // reset_device_memory_peaks, peak_device_bytes: the run's peak memory
#include "timer.h"  // steady_seconds

namespace mgpu {

namespace {

void check_parts(const EpochLoop& loop) {
  const char* missing = !loop.start_epoch     ? "start_epoch"
                        : !loop.synchronize   ? "synchronize"
                        : !loop.train_metrics ? "train_metrics"
                        : !loop.test_accuracy ? "test_accuracy"
                                              : nullptr;
  if (missing) throw Error(std::string("train_epochs: the loop has no ") + missing);
  if (static_cast<bool>(loop.step) == static_cast<bool>(loop.run_epoch))
    throw Error("train_epochs: give the loop either step or run_epoch, not both or neither");
}

}  // namespace

std::vector<EpochRecord> train_epochs(const Options& o, int train_examples, int batch_size, const EpochLoop& loop,
                                      TrainingLog* log, int first_epoch) {
  check_parts(loop);
  ShuffledBatches batches(train_examples, batch_size, o.seed);
  std::vector<EpochRecord> records;
  reset_device_memory_peaks();  // the run's peak counts what it holds now (its model) and all it allocates
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    const auto show_progress = [&](int batches_done) {
      if (log && batches_done > 0) log->progress(epoch + 1, batches_done - 1, batches.count());
    };
    loop.synchronize();
    const double start = steady_seconds();
    batches.start_epoch(epoch);
    loop.start_epoch(epoch, batches.order());
    if (loop.step) {
      for (int b = 0; b < batches.count(); ++b) {
        loop.step(BatchOf{epoch, b, b * batch_size, batches.size(b), learning_rate_at(o, epoch, b, batches.count())});
        show_progress(b + 1);
      }
    } else {
      loop.run_epoch(epoch, batches, show_progress);
    }
    loop.synchronize();
    double seconds = steady_seconds() - start;
    if (loop.epoch_seconds) seconds = loop.epoch_seconds(seconds);

    const LossAndHits train = loop.train_metrics();
    EpochRecord r;
    r.epoch = epoch + 1;
    r.train_loss = train.loss_sum / train_examples;
    r.train_acc = train.hits / train_examples;
    r.test_acc = loop.test_accuracy();
    r.seconds = seconds;
    records.push_back(r);
    if (log) log->end_epoch(r);
    if (loop.epoch_ended) loop.epoch_ended(r);
  }
  if (log) log->set_peak_device_bytes(peak_device_bytes());
  return records;
}

}  // namespace mgpu
