// d2l's train_ch13, written once: the epoch loop every chapter's training runs. The chapter
// supplies what it teaches (its step, how it reads its loss and hits, how it evaluates); the loop
// owns the rest, the same way in every chapter:
//
//   for epoch = first_epoch .. o.epochs - 1:
//     wait for the devices, start the clock          (the training loop only is timed, as in d2l)
//     draw the epoch's permutation (seeded by o.seed and the epoch: common/batches.h)
//     start_epoch(epoch, order)                      the chapter uploads it, zeroes its sums
//     for each batch b:  step({epoch, b, first, n, lr})   then the progress line, which counts
//                        the batches the devices have finished (not those queued: see devices)
//     wait for the devices, stop the clock           (epoch_seconds: between processes, the slowest)
//     train_metrics(), test_accuracy()               the epoch's loss, train and test accuracy
//     the epoch's line, CSV row and JSON             (TrainingLog; none on a rank that does not log)
//     epoch_ended(record)                            what the chapter adds: a note, a checkpoint
//   the most device memory held at once, from the loop's start (device.h's count): the result
//   line's peak_mib
//
// A chapter whose workers walk the batches themselves (chapter 08's parameter server) gives
// run_epoch instead of step: it is handed the epoch's batches and a progress function.
#pragma once
#include <functional>
#include <vector>

#include "batches.h"
#include "cli.h"
#include "device.h"
#include "report.h"

namespace mgpu {

// One step's batch: examples order[first .. first + size) of epoch `epoch`'s order, the
// `index`-th of the epoch's batches, at learning rate `lr` (learning_rate_at: warm-up included).
struct BatchOf {
  int epoch = 0, index = 0;
  int first = 0, size = 0;
  float lr = 0;
};

// An epoch's summed training loss and correct answers (over every device and process).
struct LossAndHits {
  double loss_sum = 0, hits = 0;
};

struct EpochLoop {
  // Required: the epoch's order is drawn; upload it where the step reads it, zero the sums.
  std::function<void(int epoch, const std::vector<int>& order)> start_epoch;
  // One of the two: one batch at a time, or the whole epoch (`progress(batches_done)` as it goes).
  std::function<void(const BatchOf& batch)> step;
  std::function<void(int epoch, const ShuffledBatches& batches, const std::function<void(int)>& progress)> run_epoch;
  // Required: waits until every device the step uses has done its work (SyncTimer's wait).
  std::function<void()> synchronize;
  // Required: the epoch's loss sum and hits; its test accuracy.
  std::function<LossAndHits()> train_metrics;
  std::function<double()> test_accuracy;
  // Optional: this process's epoch time made the run's (between processes: the slowest rank's).
  std::function<double(double seconds)> epoch_seconds;
  // Optional: after the epoch's line is printed and its row written.
  std::function<void(const EpochRecord& record)> epoch_ended;
  // Optional: the devices `step` queues its work on. A step returns once its work is queued, and
  // the host runs ahead of the devices by as many batches as their queues hold; given the
  // devices, the loop marks each batch's end on every one (an Event) and the progress line counts
  // the batches they have finished, so its "batch k/n" and time left are the devices'. Without
  // them it counts the steps returned, which is right only where a step waits for its work.
  std::vector<Device> devices;
};

// Trains epochs first_epoch .. o.epochs - 1 of `train_examples` examples in batches of
// `batch_size` (o.batch_size unless a chapter's step takes more: chapter 06's accumulation),
// seeded by o.seed. `log` may be null (a rank that does not write): the records are returned
// either way. Throws mgpu::Error for a loop missing a required part.
std::vector<EpochRecord> train_epochs(const Options& o, int train_examples, int batch_size, const EpochLoop& loop,
                                      TrainingLog* log, int first_epoch = 0);

}  // namespace mgpu
