// Chapter 02's data-parallel training with the two speed tricks of this chapter:
//
//   mixed precision  GEMMs read 16-bit (or tf32) inputs and accumulate in fp32 (mixed.h); the
//                    weights the SGD step updates stay fp32 (the master weights), and a 16-bit
//                    working copy is rounded from them at the start of every step; with fp16,
//                    dynamic loss scaling (loss_scaler.h); gradients may cross between devices
//                    in 16 bits (ring16.h).
//   accumulation     --accumulate M: an optimizer step is M micro-batches of --batch-size, whose
//                    gradients add up on each device, then ONE allreduce and ONE step: the step
//                    of one batch of M x batch-size, with the memory of one micro-batch and the
//                    allreduce traffic of one step per M micro-batches (DDP's no_sync()).
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "../02_data_parallel/data_parallel.h"  // chapter 02's replicas and step: what this chapter makes mixed
#include "common/cli.h"
#include "common/collective.h"
#include "common/report.h"
#include "formats.h"
#include "loss_scaler.h"

namespace mixed {

// "fp32", "tf32", "bf16", "fp16" and back; nullopt for anything else.
std::string name_of(Precision p);
std::optional<Precision> precision_named(const std::string& name);

struct MixedOptions {
  Precision precision = Precision::FP32;
  bool loss_scaling = false;   // dynamic loss scaling (on by default for fp16 only)
  LossScaler::Settings scaler;
  int grad_bits = 32;          // 16: gradients exchanged in the precision's 16-bit format
  bool nccl = false;           // the exchange: chapter 03's ring (false) or NCCL (cuda build with NCCL)
  int accumulate = 1;          // micro-batches per optimizer step
  // The loss the backward pass starts from: d2l's sum over the step's examples (the SGD step
  // divides by their number), or PyTorch's mean (CrossEntropyLoss's default): the same step,
  // but every gradient of the backward pass is n times smaller, and in fp16 many underflow.
  bool mean_loss = false;
};

// This chapter's flags, declared on the program's CLI11 app (parse_command_line's own flags).
// They store into `options`; the optionals `loss_scaling` and `grad_bits` note what the user
// chose, so that resolve_defaults() fills in only the rest.
struct MixedFlags {
  MixedOptions options;
  std::optional<bool> loss_scaling;
  std::optional<int> grad_bits;
};
void add_mixed_flags(CLI::App& app, MixedFlags& f);
// The defaults that depend on the precision (loss scaling for fp16; 16-bit gradients for bf16
// and fp16), then the checks between flags. Returns why the combination is refused, or "".
std::string resolve_defaults(MixedFlags& f);

// Bytes of the gradient bucket each step allreduces (LeNet's flat bucket, 129,216 values), and
// what each device sends of it through a ring of k devices, 2 (k - 1) / k of it.
std::size_t bucket_bytes(const MixedOptions& mo);

// Adds this chapter's collectives to a program's menu (common/collective.h): "ring16" (and,
// in a cuda build with NCCL, "nccl16"), which carry the gradients in `format`'s 16 bits, on
// `devices` (which must outlive what the menu makes).
void add_collectives(mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& devices, Precision format);
// The collective a run's options name on that menu: "ring", "nccl", "ring16" or "nccl16".
std::string collective_name(const MixedOptions& mo);
double ring_bytes_per_device(const MixedOptions& mo, int k);

// Every device's state: chapter 02's replica (its fp32 master weights and gradients, Flat), the
// working copy of the weights in the run's precision, and its one-float "found inf" flag.
class MixedTrainer {
 public:
  // micro_batch: the examples of one micro-batch (--batch-size); `allreduce` sums the gradients
  // (made for the same devices, with room for the flat bucket: it is handed all of it at once).
  MixedTrainer(const mgpu::DeviceSet& devices, const MixedOptions& mo, int micro_batch, const lenet::HostParams& init,
               mgpu::Collective& allreduce);

  // One optimizer step on the n examples order[first .. first + n) of every device's data:
  // micro-batches of micro_batch examples (the last may be shorter), each split across the
  // devices, the gradients added up; one allreduce; the loss scaler's check; one SGD step with
  // the rate lr over all n examples. Returns false when the step was skipped (overflow).
  bool step(std::vector<mgpu::DeviceData>& data, int first, int n, float lr);

  // Device 0's working weights, rounded from its master weights now, on `test`.
  double evaluate(const mgpu::DeviceImages& test);
  // The training loss and correct answers summed over every device since reset_metrics().
  std::array<double, 2> read_metrics();
  void reset_metrics();
  lenet::HostParams master_params() const;  // device 0's fp32 weights
  // What 16 bits would do to the backward pass's activation gradients right now: one chunk of
  // `images` through device 0 in the run's precision, the backward pass in fp32 (scaled as a
  // step of n_step examples would be), then, for dz4, dz3, dz2 and dz1 (the gradients the GEMMs
  // read), the fraction of their nonzero values that round_to(precision) makes 0.
  std::array<double, 4> flushed_to_zero(const mgpu::DeviceImages& images, int n_step);
  const LossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  std::vector<dp::Replica>& replicas() { return replicas_; }

 private:
  MixedOptions mo_;
  int micro_batch_;
  mgpu::Collective& allreduce_;
  std::vector<dp::Replica> replicas_;
  std::vector<lenet::Params> working_;          // per device: the weights as the GEMMs read them
  std::vector<mgpu::Buffer<float>> found_inf_;  // per device: 1 when its gradients hold inf/NaN
  std::optional<LossScaler> scaler_;
};

// What the scaler did in one epoch (the scale at its end, the steps it skipped).
struct ScalerEpoch {
  int epoch = 0;
  double scale = 1;
  long skipped = 0, steps = 0;
  std::array<double, 4> flushed{};  // MixedTrainer::flushed_to_zero at the epoch's end (16-bit runs)
};

// The whole run: --epochs epochs of shuffled batches of accumulate x batch-size examples, one
// optimizer step each; one line per epoch through `log`; returns the scaler's record per epoch.
// Images are rounded to the precision once, when they are put on the devices.
std::vector<ScalerEpoch> train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                               const MixedOptions& mo, mgpu::TrainingLog& log);

// The epoch's scale, skipped steps and flushed fractions as <out>/<run>_scaler.csv.
std::string write_scaler_csv(const std::string& out, const std::string& run, const std::vector<ScalerEpoch>& epochs);

}  // namespace mixed
