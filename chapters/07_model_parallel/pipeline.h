// Chapter 07: the model split across devices. Chapter 02 copied LeNet onto every device and
// split the batch; here LeNet's four layers are cut into k stages, stage s on device s, and
// the activations travel forward from device to device and their gradients travel back.
//
//   Stage       a contiguous range of LeNet's layers, with its own parameters, gradients and
//               activation buffers on its own device (chapter 01's layer functions do the maths)
//   Schedule    the order in which a stage runs the forward and backward passes of the batch's
//               m micro-batches: naive (m = 1), GPipe (all forwards, then all backwards) or
//               1F1B (one forward, one backward, in turn, once the pipeline is full)
//   Pipeline    k stages x R data-parallel replicas; step() queues one training step on every
//               device, ordered by events only; the host never waits inside a step
//   Timeline    when each device ran which forward, backward, wait and copy, from timestamps
//               its stream recorded: the bubble, measured
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../01_lenet/lenet.h"  // chapter 01's LeNet: the model cut into stages
#include "common/collective.h"
#include "common/device.h"
#include "common/fashion_mnist.h"

namespace pp {

using mgpu::Device;

// ---- Where the model is cut ---------------------------------------------------------------
//
// LeNet's four layers with parameters (lenet.h): 0 = conv1 + pool, 1 = conv2 + pool + flatten,
// 2 = dense 800 -> 128 + ReLU, 3 = dense 128 -> 10. What flows from layer l - 1 into layer l,
// per image: the tensor a cut before layer l sends forward (and its gradient back).
inline constexpr int kLayers = lenet::kLayers;
inline constexpr std::array<int, kLayers + 1> kFeaturesInto = {
    28 * 28,       // into layer 0: the image              [1][B][28][28]
    20 * 13 * 13,  // into layer 1: conv1's pooled output  [20][B][13][13]
    800,           // into layer 2: flattened              [800][B]
    128,           // into layer 3: dense3's output        [128][B]
    10,            // out of layer 3: the logits           [10][B]
};

// The first layer of every stage, then kLayers: stage s runs layers [first[s], first[s + 1]).
// `cuts` are the first layers of stages 1..k-1 (--split), strictly increasing, each 1..3.
// Returns the reason a list is refused, or "" when it is fine.
std::string check_cuts(const std::vector<int>& cuts);
std::vector<int> stage_bounds(const std::vector<int>& cuts);
// k - 1 cuts for k stages when --split is not given: the layers dealt out as evenly as they go,
// with the convolutions first (k = 2: {2}, conv1 and conv2 on device 0, the dense layers on 1).
std::vector<int> default_cuts(int stages);

// ---- Schedules ----------------------------------------------------------------------------

enum class Schedule { Naive, GPipe, OneFOneB };
const char* name_of(Schedule s);  // "naive", "gpipe", "1f1b"

struct Op {
  enum Kind { Forward, Backward } kind;
  int micro;  // which micro-batch, 0..m-1
  bool operator==(const Op& o) const { return kind == o.kind && micro == o.micro; }
};

// What stage s of k runs in one step of m micro-batches, in order.
//   naive / GPipe: every forward, F0 F1 .. F(m-1), then every backward, B0 B1 .. B(m-1)
//         (naive is GPipe with m = 1)
//   1F1B: a warm-up of forwards, a steady state that alternates one forward and one backward,
//         and a cool-down that runs the backwards left; each backward comes as early as the
//         stages after s let it, so that stage s never holds more than k - s micro-batches
std::vector<Op> stage_ops(Schedule schedule, int stage, int stages, int micro_batches);
// The most micro-batches whose forward has run and whose backward has not, at any point of ops:
// how many sets of activations the stage must keep (m for GPipe, min(m, k - s) for 1F1B).
int peak_in_flight(const std::vector<Op>& ops);

// The idle fraction of the textbook pipeline, k equal stages and m micro-batches:
// (k - 1) / (m + k - 1).
double bubble_formula(int stages, int micro_batches);
// The same with stages of unequal cost: stage s takes stage_time[s] per micro-batch (forward
// plus backward). Each stage's idle fraction of a step in which the m micro-batches go through
// the stages as fast as the slowest stage lets them, transfers free. Equal times must give
// bubble_formula().
std::vector<double> predicted_idle(const std::vector<double>& stage_time, int micro_batches);

// ---- The pipeline -------------------------------------------------------------------------

struct PipelineConfig {
  std::vector<int> cuts = {2};  // first layer of stages 1..k-1 (k = cuts.size() + 1)
  int micro_batches = 1;
  Schedule schedule = Schedule::Naive;
  int replicas = 1;      // R data-parallel copies of the pipeline (hybrid: k x R devices)
  int cpu_threads = 0;   // cpu build: cores shared among the k x R devices (0: all)
  int stages() const { return static_cast<int>(cuts.size()) + 1; }
};

// One span of a device's timeline: what it did from begin to end (seconds, host steady clock).
struct Span {
  int step;  // counts the steps that recorded a timeline, from 0
  int replica, stage;
  char kind;  // 'F' forward, 'B' backward, 'W' waiting for another device, 'C' copy in, 'U' update
  int micro;  // -1 for an update
  double begin, end;
};

class Pipeline {
 public:
  // Makes the k x R devices (stage s of replica r is stage_devices(s)[r]) and puts init's
  // parameters of each stage's layers on its devices; batches up to batch_size examples.
  Pipeline(const PipelineConfig& config, const lenet::HostParams& init, int batch_size);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int stages() const { return config_.stages(); }
  int replicas() const { return config_.replicas; }
  const mgpu::DeviceSet& stage_devices(int s) const { return *devices_[s]; }
  std::string mapping() const;  // "stage 0 (layers 0-1): replica 0 -> cpu ..."

  // The training set, on the first stage's device of every replica (the only one that reads images).
  void set_training_data(const mgpu::LabeledImages& train);
  // This epoch's order of the training examples (on the same devices).
  void set_order(const std::vector<int>& order);
  // One training step on the n examples order[first .. first + n): the batch split across the
  // replicas, each part into min(m, part) micro-batches run through the stages by the schedule,
  // the stage's gradients summed across its replicas, one SGD step. Only queues work. With
  // `timeline`, every device's spans of this step are appended to it (that waits for the step).
  void step(int first, int n, float lr, std::vector<Span>* timeline = nullptr);
  void synchronize() const;

  void reset_metrics();
  std::array<double, 2> read_metrics() const;  // [loss sum, correct count] over the replicas
  // Forward passes only, through replica 0's pipeline: the fraction of `test` classified right.
  double evaluate(const mgpu::LabeledImages& test, int batch_size);

  lenet::HostParams download() const;  // replica 0's parameters, gathered from its stages
  // Bytes of activations stage s keeps for the backward pass (all its in-flight micro-batches).
  std::size_t activation_bytes(int stage) const;
  int slots(int stage) const;  // how many micro-batches' activations stage s keeps at once

 private:
  struct Stage;
  struct Replica;
  void queue_ops(Replica& r, const std::vector<std::vector<Op>>& ops, const std::vector<int>& sizes, int first,
                 bool training, std::vector<std::pair<Span, std::array<mgpu::Timestamp, 2>>>* marks);
  void run_op(Replica& r, int s, Op op, const std::vector<int>& sizes, int first, bool training,
              std::vector<std::pair<Span, std::array<mgpu::Timestamp, 2>>>* marks);
  void end_step_barrier();

  PipelineConfig config_;
  std::vector<int> bounds_;                               // stage s: layers [bounds_[s], bounds_[s + 1])
  std::vector<std::unique_ptr<mgpu::DeviceSet>> devices_;  // [stage]: its R replicas' devices
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::vector<std::unique_ptr<mgpu::Collective>> allreduce_;  // [stage], when R > 1: chapter 02's dp::Allreduce
  int capacity_;  // the largest micro-batch
  int timed_steps_ = 0;
};

// ---- The bubble, measured -----------------------------------------------------------------

struct Bubble {
  std::vector<double> busy, idle;  // per stage (replica 0): fraction of the step computing / not
  std::vector<double> stage_time;  // per stage: mean seconds of one micro-batch's forward + backward
  double step_seconds = 0;         // mean over the steps
};
// From the spans of whole steps (Pipeline::step's timeline): per stage, the time in forward and
// backward spans over each step's length (its first span's begin to its last span's end).
Bubble measure_bubble(const std::vector<Span>& spans, int stages, int micro_batches);

}  // namespace pp
