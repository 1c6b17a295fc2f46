#include "train.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>

#include "checkpoint.h"
#include "common/batches.h"  // largest_batch
#include "common/probe.h"
#include "common/timer.h"
#include "common/trace.h"
#include "common/train_loop.h"
#include "sampler.h"

namespace mp {
namespace {

std::vector<float> flatten(const lenet::HostParams& host) {
  std::vector<float> flat;
  for (const std::vector<float>& t : host) flat.insert(flat.end(), t.begin(), t.end());
  return flat;
}

// The inverse of flatten: the host vector holds the tensors back to back, without the device
// Flat layout's padding (a checkpoint holds exactly the 129,068 parameters).
lenet::HostParams unflatten(const std::vector<float>& flat) {
  lenet::HostParams host;
  auto first = flat.begin();
  for (const lenet::ParamInfo& t : lenet::kParams) {
    host.emplace_back(first, first + t.count);
    first += t.count;
  }
  return host;
}

// Examples [b.start, b.start + b.count) of a host dataset, as a dataset of their own.
mgpu::LabeledImages slice(const mgpu::LabeledImages& set, Block b) {
  const std::size_t pixels = set.pixels_per_image();
  mgpu::LabeledImages s;
  s.count = b.count;
  s.rows = set.rows;
  s.cols = set.cols;
  s.pixels.assign(set.pixels.begin() + b.start * pixels, set.pixels.begin() + (b.start + b.count) * pixels);
  s.labels.assign(set.labels.begin() + b.start, set.labels.begin() + b.start + b.count);
  return s;
}

// This rank's block of the test set: all ranks evaluate at once and their hits are summed
// (--eval device0: rank 0 evaluates all of it, as d2l evaluates on one device).
Block test_block(const World& w, const mgpu::Options& o, int test_count) {
  if (!o.eval_all_devices) return w.rank == 0 ? Block{0, test_count} : Block{0, 0};
  return block_of(test_count, w.size, w.rank);
}

// Everything one rank holds while training.
// The most examples a rank's block of a batch can hold: rank 0's blocks are the largest, of the
// largest batch an epoch can have (mgpu::largest_batch).
int largest_block(const World& w, const mgpu::FashionMnist& data, const mgpu::Options& o) {
  return block_of(mgpu::largest_batch(o.batch_size, data.train.count), w.size, 0).count;
}

struct RankState {
  RankState(const mgpu::Device& dev, const World& w, const mgpu::FashionMnist& data, const mgpu::Options& o,
            const std::vector<float>& start)
      : d(dev),
        params(lenet::upload_params(dev, unflatten(start), lenet::Layout::Flat)),
        grads(lenet::zero_params(dev, lenet::Layout::Flat)),
        train_set(dev, data.train),
        test_set(dev, slice(data.test, test_block(w, o, data.test.count))),
        order(dev, data.train.count),
        batch(dev, largest_block(w, data, o)),
        lanes(lenet::make_lanes(dev, largest_block(w, data, o))),
        metrics(dev) {}
  const mgpu::Device& d;
  lenet::Params params, grads;        // Flat: grads is the bucket the allreduce sums
  mgpu::DeviceImages train_set;      // all of it: every epoch, any example can fall in this rank's blocks
  mgpu::DeviceImages test_set;       // this rank's block of the test set
  mgpu::Buffer<std::int32_t> order;   // [examples] the epoch's permutation
  mgpu::Batch batch;                 // this rank's block of the current global batch
  lenet::Lanes lanes;
  mgpu::Metrics metrics;             // this rank's loss and hits of the epoch
};

double now_seconds() { return mgpu::steady_seconds(); }

// A step's three phases, as its probe hears of them and the overlap timeline names them.
const std::string kCompute = "forward and backward", kWait = "waiting for the sum", kUpdate = "sgd";

// A step's first phase: this rank's block of global batch `step` gathered, forward and backward
// on it, its gradients in s.grads (zeroed first). `ready`, when given, is called as backward
// completes each layer's gradients (3, then 2, 1, 0).
void compute_gradients(RankState& s, const DistributedSampler& sampler, int step, const lenet::GradientReady& ready) {
  const Block mine = sampler.block(step);
  mgpu::gather(s.d, s.train_set, s.order.data() + mine.start, mine.count, s.batch);
  s.grads.zero();
  lenet::accumulate_gradients(s.d, s.params, s.grads, s.lanes, s.batch.x.data(), s.batch.y.data(), mine.count,
                              s.metrics, ready);
}

// With overlap: the hook that starts summing each layer as soon as backward has completed it.
// Without: none (backward tells nobody, and finish() sums the whole bucket at once).
// A probe (common/probe.h) sees each layer's completion as a moment of the step.
lenet::GradientReady start_each_layer(BucketAllreduce& allreduce, lenet::Params& g, bool overlap,
                                      mgpu::StepProbe& probe) {
  if (!overlap) return {};
  return [&allreduce, &g, &probe](int layer) {
    probe.moment("layer " + std::to_string(layer) + " complete");
    allreduce.start_layer(g, layer);
  };
}

// The SGD step, dividing by the global batch's size: every rank takes the step one process would take.
void sgd_step(RankState& s, const DistributedSampler& sampler, int step, float lr) {
  lenet::sgd(s.d, s.params, s.grads, lr, sampler.global_size(step));
}

// One step, as this rank sees it: its block of global batch `step`, forward and backward on
// it, the gradients summed over all ranks, and the SGD step of the whole global batch.
// `probe` is told where each phase ends: training passes none; profile_steps a timer, then a
// tracer, so that the step it measures is this one.
void train_step(RankState& s, const DistributedSampler& sampler, int step, BucketAllreduce& allreduce, float lr,
                bool overlap, mgpu::StepProbe& probe = mgpu::no_probe()) {
  compute_gradients(s, sampler, step, start_each_layer(allreduce, s.grads, overlap, probe));
  probe.phase_done(kCompute);
  allreduce.finish(s.grads);
  probe.phase_done(kWait);
  sgd_step(s, sampler, step, lr);
  probe.phase_done(kUpdate);
}

// This rank fails now, as --fail-how says: `where` is "at step 12" or "at the end of the run".
void inject_fault(const FaultInjection& f, const World& w, const std::string& where) {
  const std::string what = "injected fault " + where + " (--fail-rank " + std::to_string(f.rank) +
                           " --fail-at-step " + (f.at_end ? std::string("end") : std::to_string(f.step)) + ")";
  if (f.how == FailHow::Error) throw mgpu::Error(what);
  std::fprintf(stderr, "05_multi_process: rank %d: %s: killing this process (SIGKILL)\n", w.rank, what.c_str());
  std::fflush(stderr);
  std::raise(SIGKILL);
}

void inject_fault_if_due(const FaultInjection& f, const World& w, long step) {
  if (f.rank == w.rank && !f.at_end && f.step == step) inject_fault(f, w, "at step " + std::to_string(step));
}

// Where training starts: epoch 0 and rank 0's init_params, or a checkpoint that rank 0 reads.
// Either way rank 0 decides and broadcasts, so every rank starts from the same numbers.
struct Start {
  int epochs_done = 0;
  std::vector<float> params;
  std::vector<mgpu::EpochRecord> history;
  std::optional<CheckpointLock> lock;  // rank 0, with --checkpoint: held until the run ends
};

// A resumed run must be the run that was saved: the same batch order and the same steps. So
// every setting that changes what a step computes is in the checkpoint and compared here: the
// seed (the batch order and the initial weights), the batch size, the learning rate and its
// warm-up, the training images. What may differ, as it changes no step's result: --epochs (the
// run's new end, beyond the saved epochs), --devices (any number of processes: the batch is the
// same, split otherwise), --collective and --overlap (how the same sum is taken; its rounding may
// differ in the last bits, as with another number of processes), --eval, --profile-steps,
// --checkpoint, --out, --run-name, --progress, --print-every, --data-dir (the data itself is
// compared across ranks), and the --fail-* test flags.
void check_same_recipe(const Checkpoint& ck, const Config& c, int train_examples) {
  auto refuse = [&](const std::string& flag, const std::string& saved, const std::string& now) {
    throw mgpu::Error(c.resume + ": the checkpoint was written by a run with " + flag + " " + saved +
                      ", this run has " + flag + " " + now + "; resume with the settings of the saved run");
  };
  if (ck.seed != c.o.seed) refuse("--seed", std::to_string(ck.seed), std::to_string(c.o.seed));
  if (ck.batch_size != c.o.batch_size)
    refuse("--batch-size", std::to_string(ck.batch_size), std::to_string(c.o.batch_size));
  if (ck.lr != c.o.lr) refuse("--lr", mgpu::exact_text(ck.lr), mgpu::exact_text(c.o.lr));
  if (ck.warmup_epochs != c.o.warmup_epochs)
    refuse("--warmup-epochs", std::to_string(ck.warmup_epochs), std::to_string(c.o.warmup_epochs));
  if (ck.train_examples != train_examples)
    refuse("training images (--limit-train)", std::to_string(ck.train_examples), std::to_string(train_examples));
  // --epochs counts the whole run, the saved epochs included: it must leave something to train.
  // (Refused rather than "nothing to do, exit 0": a run asked for fewer epochs than it already
  // has, or exactly as many, is more often a slip in the command line than a wish.)
  if (ck.epochs_done >= c.o.epochs)
    throw mgpu::Error(c.resume + ": the checkpoint holds " + std::to_string(ck.epochs_done) +
                      " finished epoch(s), and --epochs " + std::to_string(c.o.epochs) +
                      " asks for no more: nothing is left to train (--epochs counts the whole run, the saved "
                      "epochs included: give more than " + std::to_string(ck.epochs_done) + " to continue it)");
}

Start starting_point(const World& w, const Config& c, int train_examples) {
  Start s;
  s.params.resize(static_cast<std::size_t>(lenet::parameter_count()));
  // Rank 0's files, checked before the first step and together: a refusal stops every rank
  // here, in seconds, rather than after an epoch, and the others are not left waiting.
  together(w, [&] {
    if (w.rank != 0) return;
    if (!c.checkpoint.empty()) {
      s.lock.emplace(c.checkpoint);
      check_checkpoint_target(c.checkpoint);
    }
    if (c.resume.empty()) {
      s.params = flatten(lenet::init_params(c.o.seed, c.init_scale));
    } else {
      Checkpoint ck = read_checkpoint(c.resume, lenet::parameter_count());
      check_same_recipe(ck, c, train_examples);
      s.epochs_done = ck.epochs_done;
      s.params = std::move(ck.params);
      s.history = std::move(ck.history);
    }
  });
  broadcast_from_rank0(w, s.params.data(), mgpu::Elements{s.params.size()});
  broadcast_from_rank0(w, &s.epochs_done, sizeof s.epochs_done);
  // The finished epochs' records travel as 5 numbers each, so that every rank has the whole curve.
  std::vector<double> records;
  for (const mgpu::EpochRecord& r : s.history)
    records.insert(records.end(), {double(r.epoch), r.train_loss, r.train_acc, r.test_acc, r.seconds});
  records.resize(5 * std::size_t(s.epochs_done));
  broadcast_from_rank0(w, records.data(), records.size() * sizeof(double));
  s.history.clear();
  for (std::size_t i = 0; i < records.size(); i += 5)
    s.history.push_back({static_cast<int>(records[i]), records[i + 1], records[i + 2], records[i + 3], records[i + 4]});
  return s;
}

// Test images this rank classifies correctly.
double test_hits(RankState& s) {
  if (s.test_set.count == 0) return 0;  // a rank with no test images (more ranks than images)
  return std::round(lenet::evaluate_accuracy(s.d, s.params, s.lanes, s.test_set) * s.test_set.count);
}

void save_checkpoint(const Config& c, int epochs_done, int train_examples, const RankState& s,
                     const std::vector<mgpu::EpochRecord>& history) {
  Checkpoint ck;
  ck.epochs_done = epochs_done;
  ck.seed = c.o.seed;
  ck.batch_size = c.o.batch_size;
  ck.lr = c.o.lr;
  ck.warmup_epochs = c.o.warmup_epochs;
  ck.train_examples = train_examples;
  ck.history = history;
  ck.params = flatten(s.params.download());
  write_checkpoint(c.checkpoint, ck);
}

}  // namespace

RunResult train(const World& w, const mgpu::Device& d, const mgpu::FashionMnist& data, const Config& c,
                mgpu::Collective& collective, mgpu::TrainingLog* log) {
  BucketAllreduce allreduce(collective);
  const mgpu::Options& o = c.o;
  Start start = starting_point(w, c, data.train.count);
  RankState s(d, w, data, o, start.params);
  DistributedSampler sampler(data.train.count, o.batch_size, w.size, w.rank, o.seed);
  // A fault that can never fire is refused before the first step, not ignored after the last:
  // the steps are numbered from 0 over the whole run, and this run takes those of its epochs.
  const long first_step = long(start.epochs_done) * sampler.steps(), end_step = long(o.epochs) * sampler.steps();
  if (c.fault.rank >= 0 && !c.fault.at_end && (c.fault.step < first_step || c.fault.step >= end_step))
    throw mgpu::Error("--fail-at-step " + std::to_string(c.fault.step) + " is not a step of this run: it takes steps " +
                      std::to_string(first_step) + " to " + std::to_string(end_step - 1) + " (epochs " +
                      std::to_string(start.epochs_done + 1) + " to " + std::to_string(o.epochs) + ", " +
                      std::to_string(sampler.steps()) + " steps each)");
  RunResult result;
  result.history = start.history;
  if (log && start.epochs_done > 0) {
    std::printf("resumed from %s after epoch %d; its epochs, as it recorded them:\n", c.resume.c_str(),
                start.epochs_done);
    for (const mgpu::EpochRecord& r : start.history) log->end_epoch(r);
  }

  // Rank 0 alone draws the live progress line, and (--progress auto) never under mpirun or srun:
  // they give every rank a pseudo-terminal even when the run's output goes to a file.
  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): one rank's parts of it
  // The loop draws each epoch's order as the sampler would (the same ShuffledBatches, the same
  // seed: the same order on every rank); the sampler cuts this rank's block out of each batch.
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    s.metrics.reset();
    s.order.upload(order);
  };
  loop.step = [&](const mgpu::BatchOf& b) {
    inject_fault_if_due(c.fault, w, long(b.epoch) * sampler.steps() + b.index);
    train_step(s, sampler, b.index, allreduce, b.lr, c.overlap);
  };
  loop.synchronize = [&] { collective.synchronize(d); };
  loop.devices = {d};  // the progress line counts the batches d has finished
  // The slowest rank's time: the others waited for it in every allreduce.
  loop.epoch_seconds = [&](double seconds) { return max_over_ranks(w, seconds); };
  loop.train_metrics = [&] {
    const auto [loss_sum, hits] = s.metrics.read();
    double sums[2] = {loss_sum, hits};
    sum_over_ranks(w, sums, 2);
    return mgpu::LossAndHits{sums[0], sums[1]};
  };
  loop.test_accuracy = [&] {
    double hits = test_hits(s);
    sum_over_ranks(w, &hits, 1);
    return hits / data.test.count;
  };
  // Every rank waits for rank 0's checkpoint and learns whether it was written: after the last
  // epoch the others would otherwise be gone while rank 0 still fails.
  loop.epoch_ended = [&](const mgpu::EpochRecord& r) {
    result.history.push_back(r);
    if (!c.checkpoint.empty())
      together(w, [&] {
        if (w.rank == 0) save_checkpoint(c, r.epoch, data.train.count, s, result.history);
      });
  };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, log, start.epochs_done);
  result.params = s.params.download();
  return result;
}

void finish_together(const World& w, const Config& c, const mgpu::TrainingLog* log) {
  together(w, [&] {
    if (c.fault.at_end && c.fault.rank == w.rank) inject_fault(c.fault, w, "at the end of the run");
    if (log) log->finish();
  });
}

Profile profile_steps(const World& w, const mgpu::Device& d, const mgpu::FashionMnist& data, const Config& c,
                      mgpu::Collective& collective, int steps) {
  BucketAllreduce allreduce(collective);
  Config fresh = c;  // from fresh parameters, touching no file
  fresh.resume.clear();
  fresh.checkpoint.clear();
  const Start start = starting_point(w, fresh, data.train.count);
  RankState s(d, w, data, c.o, start.params);
  DistributedSampler sampler(data.train.count, c.o.batch_size, w.size, w.rank, c.o.seed);
  sampler.start_epoch(0);
  s.order.upload(sampler.order());
  // Two timers, overlap off and on: each waits for the device (through the collective, which
  // watches for a failed peer meanwhile) and reads the clock where train_step's phases end.
  const auto synchronize = [&] { collective.synchronize(d); };
  std::array<mgpu::PhaseTimer, 2> timers{mgpu::PhaseTimer(synchronize), mgpu::PhaseTimer(synchronize)};
  // Two warm-up steps (memory touched for the first time, MPI's and NCCL's first-call set-up),
  // then off and on alternate, so that whatever else the machine does hits both alike.
  for (int i = 0; i < 2 + 2 * steps; ++i) {
    const bool overlap = i % 2 == 1;
    if (i < 2) {
      train_step(s, sampler, i % sampler.steps(), allreduce, c.o.lr, overlap);
    } else {
      timers[overlap].start_step();
      train_step(s, sampler, i % sampler.steps(), allreduce, c.o.lr, overlap, timers[overlap]);
    }
  }
  Profile out;
  for (int m = 0; m < 2; ++m) {
    const mgpu::PhaseTimer& t = timers[m];
    const double n = std::max(1, steps);
    double ms[3] = {1e3 * t.seconds(kCompute) / n, 1e3 * t.seconds(kWait) / n,
                    1e3 * t.seconds(kUpdate) / n};
    sum_over_ranks(w, ms, 3);
    StepProfile& p = out.phases[m];
    p.compute = ms[0] / w.size;
    p.wait = ms[1] / w.size;
    p.update = ms[2] / w.size;
    p.step = p.compute + p.wait + p.update;
  }
  // The traced steps: every rank starts from an idle device at the same moment (a barrier), so
  // the ranks' timelines line up as well as their clocks do (one machine: exactly). The device's
  // lane comes from its stream's stamps (the probe); the host's, from what the collective and
  // BucketAllreduce trace of their own calls (mgpu::trace).
  for (int m = 0; m < 2; ++m) {
    StepTrace& trace = out.traces[m];
    collective.synchronize(d);
    MGPU_CHECK_MPI(MPI_Barrier(w.comm));
    const double start_s = now_seconds();
    const auto ms = [start_s](double seconds) { return 1e3 * (seconds - start_s); };
    StepTrace host;
    const mgpu::TraceRecording recording(
        [&](const std::string& what, double begin, double end) { host.push_back({"host", what, ms(begin), ms(end)}); });
    mgpu::StreamStamps stamps(d, start_s);
    train_step(s, sampler, m % sampler.steps(), allreduce, c.o.lr, /*overlap=*/m == 1, stamps);
    collective.synchronize(d);
    for (const mgpu::StreamStamps::Span& span : stamps.spans())
      trace.push_back({"device", span.what, ms(span.begin_s), ms(span.end_s)});
    trace.insert(trace.end(), host.begin(), host.end());
  }
  return out;
}

}  // namespace mp
