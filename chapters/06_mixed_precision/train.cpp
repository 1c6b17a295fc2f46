#include "train.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "common/batches.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/gemm.h"  // set_gemm_precision
#include "common/report.h"  // write_whole_file
#include "common/train_loop.h"
#include "mixed.h"
#include "ring16.h"
#if defined(MGPU_HAVE_NCCL) && MGPU_HAVE_NCCL
#include "../04_nccl/nccl_allreduce.h"  // chapter 04's collective: --allreduce nccl in fp32
#include "nccl16.h"
#define MGPU_CHAPTER06_NCCL 1
#else
#define MGPU_CHAPTER06_NCCL 0
#endif

namespace mixed {

std::string name_of(Precision p) {
  switch (p) {
    case Precision::TF32: return "tf32";
    case Precision::BF16: return "bf16";
    case Precision::FP16: return "fp16";
    default: return "fp32";
  }
}

std::optional<Precision> precision_named(const std::string& name) {
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16, Precision::FP16})
    if (name == name_of(p)) return p;
  return std::nullopt;
}

void add_mixed_flags(CLI::App& app, MixedFlags& f) {
  MixedOptions& mo = f.options;
  app.add_option_function<std::string>(
         "--precision", [&mo](const std::string& v) { mo.precision = *precision_named(v); },
         "what the GEMMs read their inputs as; the accumulation and the master weights are fp32 in every case")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}))
      ->default_str("fp32");
  app.add_option_function<std::string>(
         "--loss-scale", [&f](const std::string& v) { f.loss_scaling = v == "dynamic"; },
         "dynamic loss scaling (default: dynamic for fp16, none otherwise)")
      ->check(CLI::IsMember({"dynamic", "none"}));
  app.add_option("--initial-scale", mo.scaler.initial_scale, "the loss scale of the first step")
      ->check(mgpu::positive_float())
      ->capture_default_str();
  app.add_option("--scale-growth-interval", mo.scaler.growth_interval, "clean steps before the scale doubles")
      ->transform(mgpu::integer(1))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--grad-bits", [&f](const std::string& v) { f.grad_bits = v == "16" ? 16 : 32; },
         "gradients exchanged in fp32 or in the precision's 16-bit format (default: 16 for bf16 and fp16, "
         "32 otherwise)")
      ->check(CLI::IsMember({"32", "16"}));
  app.add_option("--accumulate", mo.accumulate, "micro-batches of --batch-size per optimizer step")
      ->transform(mgpu::integer(1, 4096))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--allreduce", [&mo](const std::string& v) { mo.nccl = v == "nccl"; },
         "the gradient exchange: chapter 03's ring, or NCCL (cuda build with NCCL, one GPU per device)")
      ->check(CLI::IsMember({"ring", "nccl"}))
      ->default_str("ring");
  app.add_option_function<std::string>(
         "--loss", [&mo](const std::string& v) { mo.mean_loss = v == "mean"; },
         "the backward pass starts from the summed loss (d2l's) or the mean (PyTorch's): n times smaller "
         "gradients, the same step")
      ->check(CLI::IsMember({"sum", "mean"}))
      ->default_str("sum");
}

std::string resolve_defaults(MixedFlags& f) {
  MixedOptions& mo = f.options;
  const bool sixteen = sixteen_bits(mo.precision);
  mo.loss_scaling = f.loss_scaling.value_or(mo.precision == Precision::FP16);
  mo.grad_bits = f.grad_bits.value_or(sixteen ? 16 : 32);
  if (mo.grad_bits == 16 && !sixteen)
    return "--grad-bits 16 needs --precision bf16 or fp16 (the 16-bit format the gradients travel in), got " +
           name_of(mo.precision);
  if (mo.nccl && !MGPU_CHAPTER06_NCCL) return "--allreduce nccl needs a cuda build with NCCL";
  return "";
}

std::size_t bucket_bytes(const MixedOptions& mo) {
  return static_cast<std::size_t>(lenet::flat_count()) * (mo.grad_bits / 8);
}

double ring_bytes_per_device(const MixedOptions& mo, int k) {
  return 2.0 * (k - 1) / k * static_cast<double>(bucket_bytes(mo));
}

MixedTrainer::MixedTrainer(const mgpu::DeviceSet& devices, const MixedOptions& mo, int micro_batch,
                           const lenet::HostParams& init, mgpu::Collective& allreduce)
    : mo_(mo), micro_batch_(micro_batch), allreduce_(allreduce) {
  const int shard_capacity = mgpu::shard_sizes(micro_batch, devices.size())[0];  // one micro-batch's shard
  replicas_.reserve(devices.size());
  for (int i = 0; i < devices.size(); ++i) {
    replicas_.emplace_back(devices[i], init, shard_capacity, lenet::Layout::Flat);
    working_.push_back(lenet::zero_params(devices[i], lenet::Layout::Flat));
    found_inf_.emplace_back(devices[i], 1);
  }
  if (mo.loss_scaling) scaler_.emplace(mo.scaler);
  // tf32 on a GPU: cuBLAS may run its fp32 GEMMs on tensor cores, which read tf32 inputs (the
  // rounding this chapter also does itself, so the numbers are the same). For bf16 and fp16 the
  // GEMMs stay cublasSgemm on rounded inputs: the same arithmetic, not yet the tensor cores'
  // speed (README, "On a GPU"). Set both ways: it stays with the devices for later GEMMs.
  mgpu::set_gemm_precision(devices, mo.precision == Precision::TF32 ? mgpu::GemmPrecision::Tf32
                                                                    : mgpu::GemmPrecision::Fp32);
}

bool MixedTrainer::step(std::vector<mgpu::DeviceData>& data, int first, int n, float lr) {
  const Precision p = mo_.precision;
  const float scale = scaler_ ? scaler_->scale() : 1.0f;
  // What the backward pass multiplies the summed loss's gradient by: the loss scale, and 1/n
  // for a mean loss (the step's n examples, over every micro-batch and device).
  const float backward_factor = scale * (mo_.mean_loss ? 1.0f / n : 1.0f);
  const std::int64_t count = lenet::flat_count();
  // 1. The working weights: the fp32 master weights, rounded to the precision. Zeroed gradients.
  for (std::size_t i = 0; i < replicas_.size(); ++i) {
    dp::Replica& r = replicas_[i];
    copy_rounded(*r.device, p, r.params.flat(), working_[i].flat(), count);
    r.grads.zero();
  }
  // 2. Forward and backward over the micro-batches; each device's gradients add up locally.
  // BEGIN EXERCISE ex06.accumulate
  for (int start = 0; start < n; start += micro_batch_) {
    const int size = std::min(micro_batch_, n - start);
    const std::vector<int> sizes = dp::split_batch(data, first + start, size, replicas_);
    for (std::size_t i = 0; i < replicas_.size(); ++i) {
      dp::Replica& r = replicas_[i];
      accumulate_gradients(*r.device, p, backward_factor, working_[i], r.grads, r.lanes, r.shard.x.data(),
                           r.shard.y.data(), sizes[i], r.metrics);
    }
  }
  // 3. One allreduce for the whole step: the micro-batches before the last exchanged nothing.
  dp::allreduce_gradients(replicas_, allreduce_);  // the flat bucket, in one call
  // END EXERCISE ex06.accumulate
  // 4. Loss scaling: divide the scale back out (exact for a power of two) and look for
  //    inf/NaN on every device. The verdict must be one for all devices, or their weights would
  //    part ways: the host combines the flags (reading them waits for the devices).
  if (scaler_) {
    // BEGIN EXERCISE ex06.loss_scaler_update
    for (std::size_t i = 0; i < replicas_.size(); ++i)
      unscale_and_check(*replicas_[i].device, replicas_[i].grads.flat(), count, 1.0f / scale, found_inf_[i].data());
    bool found = false;
    for (const mgpu::Buffer<float>& flag : found_inf_) found = found || flag.download()[0] != 0.0f;
    if (scaler_->update(found)) return false;  // skipped: the master weights stay as they were
    // END EXERCISE ex06.loss_scaler_update
  }
  // 5. The SGD step on the fp32 master weights, the same on every device: the gradient of a
  //    summed loss is divided by n here, that of a mean loss already was.
  const int divide_by = mo_.mean_loss ? 1 : n;
  for (dp::Replica& r : replicas_)
    lenet::sgd(*r.device, r.params, r.grads, lr / allreduce_.result_scale(), divide_by);
  return true;
}

double MixedTrainer::evaluate(const mgpu::DeviceImages& test) {
  dp::Replica& r = replicas_[0];
  copy_rounded(*r.device, mo_.precision, r.params.flat(), working_[0].flat(), lenet::flat_count());
  return evaluate_accuracy(*r.device, mo_.precision, working_[0], r.lanes, test);
}

std::array<double, 2> MixedTrainer::read_metrics() {
  double loss = 0, hits = 0;
  for (const dp::Replica& r : replicas_) {
    const auto [l, h] = r.metrics.read();
    loss += l, hits += h;
  }
  return {loss, hits};
}

void MixedTrainer::reset_metrics() {
  for (dp::Replica& r : replicas_) r.metrics.reset();
}

lenet::HostParams MixedTrainer::master_params() const { return replicas_[0].params.download(); }

std::array<double, 4> MixedTrainer::flushed_to_zero(const mgpu::DeviceImages& images, int n_step) {
  dp::Replica& r = replicas_[0];
  const Device& d = *r.device;
  lenet::Workspace& ws = r.lanes.workspaces[0];
  const int n = std::min(ws.capacity, images.count);
  copy_rounded(d, mo_.precision, r.params.flat(), working_[0].flat(), lenet::flat_count());
  lenet::Params scratch = lenet::zero_params(d, lenet::Layout::Flat);  // the probe's gradients, thrown away
  forward(d, mo_.precision, working_[0], ws, images.pixels.data(), n);
  lenet::loss(d, ws, images.labels.data(), n, /*with_gradient=*/true);
  const float factor = (scaler_ ? scaler_->scale() : 1.0f) * (mo_.mean_loss ? 1.0f / n_step : 1.0f);
  backward(d, Precision::FP32, working_[0], scratch, ws, n, factor);  // nothing rounded: see what rounding would do
  std::array<double, 4> flushed{};
  const mgpu::Buffer<float>* gradients[4] = {&ws.dz4, &ws.dh3, &ws.dh2, &ws.dh1};
  const std::int64_t sizes[4] = {10, 128, 50 * 9 * 9, 20 * 26 * 26};  // per image
  for (int t = 0; t < 4; ++t) {
    const std::vector<float> v = gradients[t]->download();
    long nonzero = 0, zeroed = 0;
    for (std::int64_t i = 0; i < sizes[t] * n; ++i)
      if (v[i] != 0.0f) ++nonzero, zeroed += round_to(mo_.precision, v[i]) == 0.0f;
    flushed[t] = nonzero ? double(zeroed) / nonzero : 0.0;
  }
  return flushed;
}

void add_collectives(mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& devices, Precision format) {
  menu.add("ring16", [&devices, format](std::size_t max_elements) {
    return std::make_unique<Ring16Allreduce>(devices, format, max_elements);
  });
#if MGPU_CHAPTER06_NCCL
  menu.add("nccl16", [&devices, format](std::size_t max_elements) {
    return std::make_unique<Nccl16Allreduce>(devices, format, max_elements);
  });
#endif
}

std::string collective_name(const MixedOptions& mo) {
  return std::string(mo.nccl ? "nccl" : "ring") + (mo.grad_bits == 16 ? "16" : "");
}

std::vector<ScalerEpoch> train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                               const MixedOptions& mo, mgpu::TrainingLog& log) {
  const int k = devices.size();
  // Every micro-batch is split across the devices: the short last one of an epoch too.
  mgpu::check_batches_fit(data.train.count, o.batch_size, k);
  // The gradients' allreduce: chapter 03's ring, chapter 04's NCCL, or this chapter's 16-bit
  // versions of them, by the name the options give (resolve_defaults refused the impossible ones).
  mgpu::CollectiveMenu menu;
  ring::add_collectives(menu, devices);
  add_collectives(menu, devices, mo.precision);
#if MGPU_CHAPTER06_NCCL
  nccl::add_collectives(menu, devices);
#endif
  const std::unique_ptr<mgpu::Collective> allreduce =
      menu.make(collective_name(mo), dp::largest_gradient_sum(lenet::Layout::Flat));
  MixedTrainer trainer(devices, mo, mgpu::largest_batch(o.batch_size, data.train.count), lenet::init_params(o.seed),
                       *allreduce);

  // The images as a 16-bit GEMM reads them, rounded once (the pixels i/255 are not all exact in 16 bits).
  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);
  for (int i = 0; i < k; ++i)
    round_in_place(devices[i], mo.precision, train_data[i].images.pixels.data(),
                   static_cast<std::int64_t>(train_data[i].images.pixels.size()));
  mgpu::DeviceImages test(devices[0], data.test);
  round_in_place(devices[0], mo.precision, test.pixels.data(), static_cast<std::int64_t>(test.pixels.size()));

  const int step_examples = o.batch_size * mo.accumulate;  // one optimizer step
  std::vector<ScalerEpoch> record;
  long skipped_before = 0, steps_before = 0;
  const int steps_per_epoch = mgpu::batches_per_epoch(data.train.count, step_examples);

  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): this chapter's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    trainer.reset_metrics();
    for (mgpu::DeviceData& dd : train_data) dd.order.upload(order);
  };
  loop.step = [&](const mgpu::BatchOf& b) { trainer.step(train_data, b.first, b.size, b.lr); };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.devices = devices.all();  // the progress line counts their finished batches
  loop.train_metrics = [&] {
    const auto [loss_sum, hits] = trainer.read_metrics();
    return mgpu::LossAndHits{loss_sum, hits};
  };
  loop.test_accuracy = [&] { return trainer.evaluate(test); };
  // After the epoch's line: the loss scaler's epoch, and how many gradients 16 bits lost.
  loop.epoch_ended = [&](const mgpu::EpochRecord& r) {
    ScalerEpoch s{r.epoch, 1.0, 0, steps_per_epoch};
    if (const LossScaler* scaler = trainer.scaler()) {
      s.scale = scaler->scale();
      s.skipped = scaler->skipped() - skipped_before;
      s.steps = scaler->steps() - steps_before;
      skipped_before = scaler->skipped(), steps_before = scaler->steps();
    }
    const bool sixteen = sixteen_bits(mo.precision);
    if (sixteen) s.flushed = trainer.flushed_to_zero(test, step_examples);
    record.push_back(s);
    if (trainer.scaler())
      std::printf("  loss scale %g at the end of epoch %d; %ld of its %ld steps skipped (overflow)\n", s.scale,
                  s.epoch, s.skipped, s.steps);
    if (sixteen)
      std::printf("  nonzero activation gradients that %s rounds to 0: dz4 %.2f%%, dz3 %.2f%%, dz2 %.2f%%, "
                  "dz1 %.2f%%\n",
                  name_of(mo.precision).c_str(), 100 * s.flushed[0], 100 * s.flushed[1], 100 * s.flushed[2],
                  100 * s.flushed[3]);
  };
  mgpu::train_epochs(o, data.train.count, step_examples, loop, &log);
  return record;
}

std::string write_scaler_csv(const std::string& out, const std::string& run, const std::vector<ScalerEpoch>& epochs) {
  const std::string csv = (std::filesystem::path(out) / (run + "_scaler.csv")).string();
  std::ostringstream f;
  f << "epoch,loss_scale,skipped_steps,steps,flushed_dz4,flushed_dz3,flushed_dz2,flushed_dz1\n";
  for (const ScalerEpoch& e : epochs) {
    f << e.epoch << ',' << e.scale << ',' << e.skipped << ',' << e.steps;
    for (double x : e.flushed) f << ',' << x;
    f << '\n';
  }
  mgpu::write_whole_file(csv, f.str());
  return csv;
}

}  // namespace mixed
