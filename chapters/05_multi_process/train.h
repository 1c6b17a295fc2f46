// Data-parallel training with one process per device: every rank runs this same code on its
// own device and its own block of every global batch (sampler.h); the gradients meet in one
// allreduce per step (collective.h), and every rank takes the same SGD step.
//
//   rank 0 ---- broadcast rank 0's initial parameters (Horovod's broadcast_parameters) ----
//   every rank, every step:
//     gather its block of the global batch -> forward + backward on it -> allreduce (sum)
//     -> sgd with the global batch size: the step one process with the whole batch takes
//   every epoch: the loss, hits and test hits of all ranks summed; rank 0 prints and writes
#pragma once
#include <array>
#include <string>
#include <vector>

#include "../01_lenet/lenet.h"  // chapter 01's LeNet: what every rank trains
#include "collective.h"
#include "common/cli.h"
#include "common/fashion_mnist.h"
#include "common/report.h"
#include "world.h"

namespace mp {

// For the tests and the lesson on faults: rank `rank` fails at global step `step` (counted
// from 0 over the whole run), or at the end of the run (after the last collective of training,
// where rank 0 writes the results and the others have nothing left to do), by throwing an
// error (the clean path: the rank reports and every rank stops) or by killing itself with
// SIGKILL (no handler runs: the launcher has to notice).
enum class FailHow { Error, Kill };
struct FaultInjection {
  int rank = -1;  // -1: no fault
  long step = -1;
  bool at_end = false;  // --fail-at-step end: at the end of the run instead of at `step`
  FailHow how = FailHow::Error;
};

struct Config {
  mgpu::Options o;  // the shared command line; o.devices is the number of ranks
  CollectiveKind collective = CollectiveKind::Mpi;
  bool collective_given = false;  // --collective on the command line: no fallback from nccl to mpi
  bool overlap = true;     // start each layer's allreduce during backward
  std::string checkpoint;  // rank 0 writes it after every epoch; empty: never
  std::string resume;      // start from this checkpoint; empty: from init_params(o.seed)
  int profile_steps = 20;  // after training: steps timed with overlap off and as many with it on
  FaultInjection fault;
  float init_scale = 0.01f;  // d2l's N(0, 0.01^2) weights (the tests use larger ones)
};

struct RunResult {
  lenet::HostParams params;                // the final parameters (the same on every rank)
  std::vector<mgpu::EpochRecord> history;  // every epoch, those restored from a checkpoint too
};

// Trains LeNet on `data` as rank w.rank of w.size, on device d, summing gradients with
// `allreduce`. `log` (rank 0 only; nullptr elsewhere) gets one line per epoch.
// Before the first step rank 0 checks that --checkpoint can be written and reads --resume; a
// fault there, or in writing a checkpoint after an epoch, stops every rank together (each
// throws StoppedTogether, see world.h), the failing one with the message naming the file.
RunResult train(const World& w, const mgpu::Device& d, const mgpu::FashionMnist& data, const Config& c,
                mgpu::Collective& collective, mgpu::TrainingLog* log);

// The end of a run, a step every rank takes together (together(), world.h): rank 0 writes the
// CSV, the plot and the result line (`log`; nullptr on the other ranks, which write nothing),
// the fault injected "at the end" fires, and then every rank learns whether any of them failed.
// So no rank leaves while another still fails: on a failure every rank throws StoppedTogether.
void finish_together(const World& w, const Config& c, const mgpu::TrainingLog* log);

// Where one step's time goes, in ms, averaged over the steps and over the ranks.
struct StepProfile {
  double step = 0;     // all of it
  double compute = 0;  // gather, forward, backward (with overlap: starting each layer's sum)
  double wait = 0;     // finish(): waiting for the allreduce
  double update = 0;   // the SGD step
};
// One step as one rank lived it, for the overlap timeline: spans in ms from the step's start.
// lane "device": what the rank's device stream did (forward and backward; waiting for the sum;
// the SGD step), from timestamps the stream records as it passes (mgpu::Timestamp), and a
// zero-length span "layer L complete" where backward finished layer L's gradients.
// lane "host": what the rank's thread spent in the collective's calls, from the host's clock:
// start_layer (queues that layer's sum, or for MPI its copy down and the sums whose copies are
// done, and returns without waiting) and finish (MPI: waits for the sums; NCCL: only queues the
// stream's wait). Both clocks are the host's steady clock.
struct TraceSpan {
  std::string lane, what;
  double begin_ms = 0, end_ms = 0;
};
using StepTrace = std::vector<TraceSpan>;

struct Profile {
  std::array<StepProfile, 2> phases;  // [0]: overlap off, [1]: on
  std::array<StepTrace, 2> traces;    // one traced step each (this rank's), [0] off, [1] on
};
// Times `steps` steps with overlap off and `steps` with it on, alternating, from fresh
// parameters; the device is synchronized between phases. Then traces one step of each, not
// synchronized between phases (so that the sums can overlap), from an idle device.
Profile profile_steps(const World& w, const mgpu::Device& d, const mgpu::FashionMnist& data, const Config& c,
                      mgpu::Collective& collective, int steps);

}  // namespace mp
