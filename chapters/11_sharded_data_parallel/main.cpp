// Chapter 11: sharded data parallelism. Trains chapter 01's LeNet on k devices (--devices,
// default 2) with AdamW (or SGD with momentum), either as DDP does (--zero 0: every device holds
// the whole optimizer state and takes the whole step) or as ZeRO's stage 1 does (--zero 1: each
// device holds 1/k of the state and updates 1/k of the parameters); then prints what each
// device held and sent, counted, beside the formulas.
//   build/bin/11_sharded_data_parallel [--zero 1] [--devices 2] [--optimizer adamw] [--lr 0.001] ...
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>  // CLI::App: where the chapter declares its own flags

#include "common/cli.h"      // parse_command_line: the flags every chapter shares
#include "common/device.h"   // DeviceSet, device_memory
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"   // TrainingLog: the epoch lines, the CSV, the plot
#include "sharded.h"         // ShardedTrainer: the two stages

namespace {

struct Flags {
  zero::Settings settings;
  bool weight_decay_given = false, momentum_given = false;
  double weight_decay = 0.01, momentum = 0.9;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--zero", f.settings.stage,
                 "0: DDP (every device holds all the optimizer state and steps every parameter); "
                 "1: ZeRO stage 1 (each device holds and steps 1/k of it)")
      ->transform(mgpu::integer(0, 1))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--optimizer",
         [&f](const std::string& v) {
           f.settings.optimizer = v == "sgd" ? zero::OptimizerKind::SgdMomentum : zero::OptimizerKind::AdamW;
         },
         "adamw (torch.optim.AdamW's defaults) or sgd (SGD with momentum; give it its --lr, e.g. 0.02)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->default_str("adamw");
  app.add_option("--weight-decay", f.weight_decay, "AdamW's decoupled decay (default 0.01), SGD's coupled one (default 0)")
      ->check(mgpu::real(0, 1))
      ->each([&f](const std::string&) { f.weight_decay_given = true; });
  app.add_option("--momentum", f.momentum, "SGD's momentum (only with --optimizer sgd)")
      ->check(mgpu::real(0, 0.999))
      ->each([&f](const std::string&) { f.momentum_given = true; })
      ->capture_default_str();
  app.add_option("--clip-norm", f.settings.clip_norm,
                 "clip the gradient's global norm to this (clip_grad_norm_); 0: no clipping")
      ->check(mgpu::real(0, 1e6))
      ->capture_default_str();
}

// The checks between flags, once all are read: the reason, or "".
std::string check_flags(const Flags& f, const mgpu::Options& o) {
  if (f.momentum_given && f.settings.optimizer != zero::OptimizerKind::SgdMomentum)
    return "--momentum is SGD's; it means nothing with --optimizer adamw";
  if (f.settings.stage > 0 && o.devices == 1)
    return "--zero " + std::to_string(f.settings.stage) +
           " shards the optimizer state over the devices: with --devices 1 there is nothing to shard (use --zero 0, "
           "or --devices 2 or more)";
  return "";
}

zero::Settings settings_of(const Flags& f, const mgpu::Options& o) {
  zero::Settings s = f.settings;
  s.adamw.lr = o.lr;
  s.sgd.lr = o.lr;
  s.sgd.momentum = f.momentum;
  s.adamw.weight_decay = f.weight_decay_given ? f.weight_decay : 0.01;
  s.sgd.weight_decay = f.weight_decay_given ? f.weight_decay : 0.0;
  return s;
}

// The run's settings, for its name and its JSON: the shared flags and this chapter's own.
mgpu::RunSettings run_settings(const zero::Settings& s, const mgpu::Options& o, const mgpu::ChapterInfo& chapter) {
  const zero::Settings d;
  mgpu::RunSettings r = mgpu::shared_settings(o, chapter);
  const bool adamw = s.optimizer == zero::OptimizerKind::AdamW;
  r.insert(r.end(), {{"zero", std::to_string(s.stage), std::to_string(d.stage)},
                     {"optimizer", zero::optimizer_name(s.optimizer), zero::optimizer_name(d.optimizer)},
                     {"weight_decay", mgpu::exact_text(float(adamw ? s.adamw.weight_decay : s.sgd.weight_decay)),
                      adamw ? "0.01" : "0"},
                     {"momentum", adamw ? "none" : mgpu::exact_text(float(s.sgd.momentum)), adamw ? "none" : "0.9"},
                     {"clip_norm", mgpu::exact_text(s.clip_norm), "0"}});
  return r;
}

double mib(std::size_t bytes) { return bytes / 1048576.0; }

// What one device holds of the model's state, by stage, for this run's k and model: the
// formula (per element of the padded flat bucket), and this run's own allocations.
void print_memory(const zero::ShardedTrainer& t, const zero::Settings& s, std::size_t measured_state,
                  std::size_t peak) {
  const zero::ShardLayout& l = t.layout();
  std::printf("\nmodel state per device, %lld parameters in a flat bucket of %lld floats (padded to %lld, k = %d), "
              "%s:\n",
              static_cast<long long>(lenet::parameter_count()), static_cast<long long>(l.n),
              static_cast<long long>(l.padded), l.k, zero::optimizer_name(s.optimizer).c_str());
  std::printf("  %-8s %14s %14s %14s %14s\n", "stage", "parameters", "gradients", "optimizer", "total bytes");
  for (int stage = 0; stage <= 1; ++stage) {
    const zero::StateBytes b = zero::state_bytes(l, stage, s.optimizer);
    std::printf("  %-8d %14zu %14zu %14zu %14zu%s\n", stage, b.params, b.grads, b.optimizer, b.total(),
                stage == s.stage ? "   <- this run" : "");
  }
  const zero::StateBytes mine = zero::state_bytes(l, s.stage, s.optimizer);
  std::printf("  this run's allocations on device 0: %zu bytes of model state (%s the formula), peak of all its "
              "buffers %.2f MiB\n",
              measured_state, measured_state == mine.total() ? "equal to" : "NOT equal to", mib(peak));
  std::size_t sent = 0;
  for (std::size_t b : t.collectives().bytes_sent()) sent = std::max(sent, b);
  const double per_step = t.steps() ? double(sent) / t.steps() : 0;
  std::printf("  bytes sent per device per step: %.0f counted, 2(k-1) shards = %zu by the formula\n", per_step,
              zero::bytes_sent_per_step(l));
  std::printf("sharding: zero=%d optimizer=%s devices=%d model_state_bytes=%zu formula_bytes=%zu "
              "bytes_sent_per_step=%.0f\n",
              s.stage, zero::optimizer_name(s.optimizer).c_str(), l.k, measured_state, mine.total(), per_step);
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"11_sharded_data_parallel",
                                  "sharded data parallelism: ZeRO stage 1 beside DDP, with AdamW",
                                  /*default_devices=*/2, /*max_devices=*/1024, /*default_lr=*/0.001f,
                                  /*eval_flag=*/false};
  Flags f;
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter, [&f](CLI::App& app) { add_flags(app, f); });
  if (const std::string why = check_flags(f, o); !why.empty()) mgpu::refuse_command_line(chapter.name, why);
  return mgpu::run_or_report(chapter.name, [&] {
    const mgpu::DeviceSet devices(o.devices);
    std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, o.devices, devices.mapping().c_str(),
                mgpu::enable_peer_access(devices).c_str());
    const mgpu::FashionMnist data = mgpu::load_data(o);
    const zero::Settings s = settings_of(f, o);
    const mgpu::RunSettings settings = run_settings(s, o, chapter);
    const std::string run = mgpu::run_name(chapter.name, o.run_name, settings);
    std::printf("== zero stage %d, %s, %d devices\n", s.stage, zero::optimizer_name(s.optimizer).c_str(), o.devices);
    mgpu::TrainingLog log(chapter.name, run, o, settings, o.devices, data.train.count);
    const zero::TrainResult r = zero::train(devices, data, o, s, log);
    print_memory(*r.trainer, s, r.trainer->replicas()[0].model_state_bytes, mgpu::peak_device_bytes());
    log.finish();
    return 0;
  });
}
