#include "train_loop.h"

#include <deque>
#include <memory>

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

// How many of an epoch's queued batches the devices have finished: after each step, one event
// per device marks the batch's end; finished() counts the marks passed on every device, without
// waiting. With no devices given, a batch counts as finished when its step returns.
class FinishedBatches {
 public:
  explicit FinishedBatches(std::vector<Device> devices) : devices_(std::move(devices)) {}
  void start_epoch() {
    pending_.clear();
    finished_ = 0;
  }
  void step_returned() {
    if (devices_.empty()) {
      ++finished_;
      return;
    }
    std::vector<std::unique_ptr<Event>> marks;
    for (const Device& d : devices_) {
      marks.push_back(std::make_unique<Event>(d));
      marks.back()->record(d);
    }
    pending_.push_back(std::move(marks));
  }
  int finished() {
    while (!pending_.empty() && all_done(pending_.front())) {
      pending_.pop_front();
      ++finished_;
    }
    return finished_;
  }
  // Waits for the oldest unfinished batch; false when none is left. After its last step the
  // loop waits batch by batch, so that the line goes on counting while the devices catch up.
  bool wait_for_next() {
    if (pending_.empty()) return false;
    for (const auto& m : pending_.front()) m->synchronize();
    pending_.pop_front();
    ++finished_;
    return true;
  }

 private:
  static bool all_done(const std::vector<std::unique_ptr<Event>>& marks) {
    for (const auto& m : marks)
      if (!m->done()) return false;
    return true;
  }
  std::vector<Device> devices_;
  std::deque<std::vector<std::unique_ptr<Event>>> pending_;  // one entry per unfinished batch, oldest first
  int finished_ = 0;
};

}  // namespace

std::vector<EpochRecord> train_epochs(const Options& o, int train_examples, int batch_size, const EpochLoop& loop,
                                      TrainingLog* log, int first_epoch) {
  check_parts(loop);
  ShuffledBatches batches(train_examples, batch_size, o.seed);
  std::vector<EpochRecord> records;
  reset_device_memory_peaks();  // the run's peak counts what it holds now (its model) and all it allocates
  // Marks cost an event per device and batch: made only where a progress line is shown.
  const bool shows_progress = log && log->shows_progress();
  FinishedBatches finished(shows_progress ? loop.devices : std::vector<Device>{});
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    const auto show_progress = [&](int batches_done) {
      if (shows_progress && batches_done > 0) log->progress(epoch + 1, batches_done - 1, batches.count());
    };
    finished.start_epoch();
    loop.synchronize();
    const double start = steady_seconds();
    batches.start_epoch(epoch);
    loop.start_epoch(epoch, batches.order());
    if (loop.step) {
      for (int b = 0; b < batches.count(); ++b) {
        loop.step(BatchOf{epoch, b, b * batch_size, batches.size(b), learning_rate_at(o, epoch, b, batches.count())});
        if (shows_progress) {
          finished.step_returned();
          show_progress(finished.finished());
        }
      }
      // The host may be far ahead (a GPU's queue holds most of a LeNet epoch): count on.
      while (shows_progress && finished.wait_for_next()) show_progress(finished.finished());
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
